"""Tests for mqcore.compression: round trips, Kafka framing, interop, corruption and bombs.

kafka-python's codec module is the independent reference: what we compress it must read back
identically, and what it compresses we must read. python-lz4 and zstandard supply frames in
the variants other Kafka clients write (linked lz4 blocks, zstd frames without content size).
"""

from __future__ import annotations

import gzip
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
import warnings
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path

import cramjam
import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from mqcore import compression
from mqcore.compression import (
    CODEC_NAMES,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    codec_id,
    compress,
    decompress,
)
from mqcore.errors import CodecError, UnsupportedCodecError

with warnings.catch_warnings():
    # kafka/__init__.py calls importlib.resources.read_text, deprecated since Python 3.11;
    # that is kafka-python's business, and pytest turns every warning into an error.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kafka_codec

MiB = 1 << 20
LIMIT = 64 * MiB
CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
COMPRESSED = (GZIP, SNAPPY, LZ4, ZSTD)
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)

KAFKA_ENCODE: dict[int, Callable[[bytes], bytes]] = {
    GZIP: kafka_codec.gzip_encode,
    SNAPPY: lambda payload: kafka_codec.snappy_encode(payload, xerial_compatible=True),
    LZ4: kafka_codec.lz4_encode,
    ZSTD: kafka_codec.zstd_encode,
}
KAFKA_DECODE: dict[int, Callable[[bytes], bytes]] = {
    GZIP: kafka_codec.gzip_decode,
    SNAPPY: kafka_codec.snappy_decode,
    LZ4: kafka_codec.lz4_decode,
    ZSTD: kafka_codec.zstd_decode,
}


def log_text(size: int, seed: int = 7) -> bytes:
    """Nginx access-log-like lines: the realistic, moderately compressible payload."""
    rnd = random.Random(seed)
    paths = [
        "/",
        "/index.html",
        "/api/v1/users/{n}",
        "/api/v1/orders/{n}",
        "/login",
        "/static/js/app.{h}.js",
        "/img/logo.png",
        "/search?q={h}",
    ]
    agents = [
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15",
        "curl/8.4.0",
        "python-requests/2.31.0",
    ]
    lines = []
    total = 0
    while total < size:
        path = rnd.choice(paths).format(n=rnd.randint(1, 99999), h=rnd.randbytes(4).hex())
        line = (
            f"{rnd.randint(1, 254)}.{rnd.randint(0, 255)}.{rnd.randint(0, 255)}."
            f"{rnd.randint(1, 254)} - - [22/Nov/2025:15:{rnd.randint(0, 59):02d}:"
            f'{rnd.randint(0, 59):02d} +0000] "{rnd.choice(["GET", "GET", "POST"])} {path} '
            f'HTTP/1.1" {rnd.choice([200, 200, 200, 304, 404, 500])} '
            f'{rnd.randint(100, 50000)} "-" "{rnd.choice(agents)}"\n'
        )
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size]


DATASETS = {
    "empty": b"",
    "small": b"key=user-42 value={'event': 'login'}",
    "log_1mib": log_text(MiB),
    "incompressible_1mib": random.Random(1).randbytes(MiB),
    "zeros_1mib": bytes(MiB),
}
LOG_64K = DATASETS["log_1mib"][: 64 * 1024]


def xerial_blocks(payload: bytes) -> list[bytes]:
    """The raw snappy blocks of a single xerial stream (test-side parser)."""
    assert payload[:16] == XERIAL_HEADER
    blocks, pos = [], 16
    while pos < len(payload):
        (length,) = struct.unpack_from(">i", payload, pos)
        blocks.append(payload[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == len(payload)
    return blocks


def raises_codec_error(codec: int, payload: bytes, max_size: int = LIMIT) -> CodecError:
    """Decompress and return the CodecError that must result."""
    with pytest.raises(CodecError) as info:
        decompress(codec, payload, max_size)
    return info.value


# --- constants and codec_id --------------------------------------------------------------


def test_codec_constants_match_kafka_attribute_values() -> None:
    assert (NONE, GZIP, SNAPPY, LZ4, ZSTD) == (0, 1, 2, 3, 4)
    assert CODEC_NAMES == ("none", "gzip", "snappy", "lz4", "zstd")


@pytest.mark.parametrize(
    ("given_value", "expected"),
    [
        ("none", 0),
        ("GZIP", 1),
        ("Snappy", 2),
        ("lz4", 3),
        ("ZsTd", 4),
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 4),
    ],
)
def test_codec_id_accepts_names_and_values(given_value: str | int, expected: int) -> None:
    assert codec_id(given_value) == expected


@pytest.mark.parametrize(
    "bad", [5, 6, 7, 8, -1, "brotli", "", "gzip ", "uncompressed", None, True, 1.0, b"gzip"]
)
def test_codec_id_refuses_and_names_the_value(bad: object) -> None:
    with pytest.raises(UnsupportedCodecError) as info:
        codec_id(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("attribute_codec", [5, 6, 7])
def test_undefined_attribute_codecs_are_unsupported(attribute_codec: int) -> None:
    with pytest.raises(UnsupportedCodecError, match=str(attribute_codec)):
        compress(attribute_codec, b"data")
    with pytest.raises(UnsupportedCodecError, match=str(attribute_codec)):
        decompress(attribute_codec, b"data", LIMIT)


def test_negative_max_size_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="max_size"):
        decompress(GZIP, compress(GZIP, b"x"), -1)


# --- round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_NAMES)
@pytest.mark.parametrize("name", list(DATASETS))
def test_round_trip(codec: int, name: str) -> None:
    data = DATASETS[name]
    packed = compress(codec, data)
    assert type(packed) is bytes
    out = decompress(codec, packed, LIMIT)
    assert type(out) is bytes
    assert out == data
    assert decompress(codec, packed, len(data)) == data  # exactly max_size is allowed


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_NAMES)
@pytest.mark.parametrize("name", ["small", "log_1mib", "zeros_1mib"])
def test_output_one_byte_over_max_size_is_refused(codec: int, name: str) -> None:
    data = DATASETS[name]
    error = raises_codec_error(codec, compress(codec, data), len(data) - 1)
    assert "max_size" in str(error)
    assert CODEC_NAMES[codec] in str(error)


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_NAMES)
def test_buffer_types_are_accepted_without_changing_the_bytes(codec: int) -> None:
    data = LOG_64K
    backing = bytearray(b"<prefix>" + data + b"<suffix>")
    window = memoryview(backing)[8 : 8 + len(data)]
    words = array("I", data[: len(data) // 4 * 4])  # a non-byte memoryview format
    for given_value in (bytearray(data), memoryview(data), window, memoryview(words)):
        raw = memoryview(given_value).tobytes()
        packed = compress(codec, given_value)
        assert packed == compress(codec, raw)
        assert decompress(codec, memoryview(bytearray(packed)), LIMIT) == raw
    strided = memoryview(data)[::2]  # non-contiguous: copied once, still the same bytes
    assert decompress(codec, compress(codec, strided), LIMIT) == data[::2]


@settings(max_examples=150, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=70_000))
def test_round_trip_property(codec: int, data: bytes) -> None:
    assert decompress(codec, compress(codec, data), len(data)) == data


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from(CODECS),
    unit=st.binary(min_size=1, max_size=40),
    repeat=st.integers(min_value=1, max_value=12_000),
    tail=st.binary(max_size=100),
)
def test_round_trip_property_compressible(
    codec: int, unit: bytes, repeat: int, tail: bytes
) -> None:
    data = unit * repeat + tail  # crosses the 32 KiB snappy and 64 KiB lz4 block sizes
    packed = compress(codec, data)
    assert decompress(codec, packed, len(data)) == data
    if data:
        with pytest.raises(CodecError, match="max_size"):
            decompress(codec, packed, len(data) - 1)


# --- interop with kafka-python -----------------------------------------------------------


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
@pytest.mark.parametrize("name", list(DATASETS))
def test_kafka_python_reads_what_we_write(codec: int, name: str) -> None:
    data = DATASETS[name]
    assert KAFKA_DECODE[codec](compress(codec, data)) == data


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
@pytest.mark.parametrize("name", list(DATASETS))
def test_we_read_what_kafka_python_writes(codec: int, name: str) -> None:
    data = DATASETS[name]
    assert decompress(codec, KAFKA_ENCODE[codec](data), LIMIT) == data


# --- gzip --------------------------------------------------------------------------------


def test_gzip_writes_one_standard_gzip_member() -> None:
    packed = compress(GZIP, LOG_64K)
    assert packed[:3] == b"\x1f\x8b\x08"  # gzip magic, deflate
    assert gzip.decompress(packed) == LOG_64K
    assert zlib.decompress(packed, 31) == LOG_64K


def test_gzip_reads_concatenated_members() -> None:
    parts = [b"first member ", b"", LOG_64K, b"last"]
    stream = compress(GZIP, parts[0]) + kafka_codec.gzip_encode(parts[1])
    stream += gzip.compress(parts[2]) + compress(GZIP, parts[3])
    assert decompress(GZIP, stream, LIMIT) == b"".join(parts)
    with pytest.raises(CodecError, match="max_size"):
        decompress(GZIP, stream, len(b"".join(parts)) - 1)


@pytest.mark.parametrize(
    "payload",
    [
        zlib.compress(b"zlib container, not gzip"),
        compress(GZIP, b"valid member") + b"trailing garbage",
        compress(GZIP, b"valid member") + b"\x00" * 8,
    ],
    ids=["zlib-container", "trailing-garbage", "zero-padding"],
)
def test_gzip_refuses_what_is_not_exactly_gzip_members(payload: bytes) -> None:
    error = raises_codec_error(GZIP, payload)
    assert "gzip" in str(error)
    assert isinstance(error.__cause__, zlib.error)


# --- snappy (xerial framing) -------------------------------------------------------------


def test_snappy_writes_xerial_header_and_32k_blocks() -> None:
    data = DATASETS["log_1mib"] + b"tail"
    packed = compress(SNAPPY, data)
    assert packed[:16] == XERIAL_HEADER
    blocks = xerial_blocks(packed)
    assert len(blocks) == len(data) // 32768 + 1
    sizes = [cramjam.snappy.decompress_raw_len(block) for block in blocks]
    assert sizes == [32768] * (len(blocks) - 1) + [4]
    assert b"".join(snappy.decompress(block) for block in blocks) == data  # raw blocks


def test_snappy_empty_input_is_a_header_and_one_empty_block() -> None:
    # kafka-python cannot read a header-only stream, so we add one empty raw block
    assert compress(SNAPPY, b"") == XERIAL_HEADER + struct.pack(">i", 1) + b"\x00"
    assert decompress(SNAPPY, XERIAL_HEADER, LIMIT) == b""  # header only (snappy-java's)


@pytest.mark.parametrize("data", [b"raw snappy", LOG_64K, DATASETS["zeros_1mib"]])
def test_snappy_reads_a_plain_raw_block(data: bytes) -> None:
    assert decompress(SNAPPY, snappy.compress(data), LIMIT) == data
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(data)), LIMIT) == data
    assert (
        decompress(SNAPPY, kafka_codec.snappy_encode(data, xerial_compatible=False), LIMIT) == data
    )
    with pytest.raises(CodecError, match="max_size"):
        decompress(SNAPPY, snappy.compress(data), len(data) - 1)


def test_snappy_ignores_xerial_version_fields() -> None:
    # Redpanda wrote version/compat little-endian (kafka-python issue #2414)
    packed = compress(SNAPPY, LOG_64K)
    odd_header = b"\x82SNAPPY\x00" + struct.pack("<ii", 1, 1)
    assert decompress(SNAPPY, odd_header + packed[16:], LIMIT) == LOG_64K


def test_snappy_reads_concatenated_xerial_streams() -> None:
    stream = compress(SNAPPY, b"one ") + kafka_codec.snappy_encode(LOG_64K) + XERIAL_HEADER
    assert decompress(SNAPPY, stream, LIMIT) == b"one " + LOG_64K


def test_snappy_bomb_is_refused_from_block_headers_alone() -> None:
    packed = compress(SNAPPY, bytes(8 * MiB))
    start = time.perf_counter()
    with pytest.raises(CodecError, match="max_size"):
        decompress(SNAPPY, packed, MiB)
    assert time.perf_counter() - start < 0.5


# --- lz4 (frame format) ------------------------------------------------------------------


def test_lz4_writes_a_frame_kafka_java_can_read() -> None:
    packed = compress(LZ4, DATASETS["log_1mib"])
    assert packed[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic 0x184D2204, little-endian
    flg, bd = packed[4], packed[5]
    assert flg >> 6 == 0b01  # frame version 1
    assert flg & 0b0010_0000  # independent blocks: Kafka's Java reader refuses linked ones
    assert bd == 0x40  # 64 KiB maximum block size, as Kafka's Lz4BlockOutputStream
    info = lz4.frame.get_frame_info(packed)
    assert info["block_linked"] is False
    assert lz4.frame.decompress(packed) == DATASETS["log_1mib"]


@pytest.mark.parametrize(
    "options",
    [
        {"block_linked": False, "store_size": False},  # like Kafka's Java client
        {"block_linked": True, "content_checksum": True, "store_size": True},
        {"block_linked": True, "block_size": lz4.frame.BLOCKSIZE_MAX4MB},
        {"block_checksum": True, "compression_level": lz4.frame.COMPRESSIONLEVEL_MINHC},
    ],
    ids=["java-style", "linked-checksummed-sized", "linked-4mb", "hc-block-checksum"],
)
def test_lz4_reads_frame_variants(options: dict[str, object]) -> None:
    data = DATASETS["log_1mib"]
    assert decompress(LZ4, lz4.frame.compress(data, **options), LIMIT) == data


def test_lz4_reads_concatenated_frames() -> None:
    stream = compress(LZ4, b"first ") + lz4.frame.compress(LOG_64K)
    assert decompress(LZ4, stream, LIMIT) == b"first " + LOG_64K


# --- zstd --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["small", "log_1mib", "zeros_1mib", "incompressible_1mib"])
def test_zstd_reads_streaming_frames_without_content_size(name: str) -> None:
    # what Java's zstd-jni ZstdOutputStream writes: no Frame_Content_Size in the header
    data = DATASETS[name]
    compressor = zstandard.ZstdCompressor().compressobj()
    chunks = [compressor.compress(data[i : i + 8192]) for i in range(0, len(data), 8192)]
    frame = b"".join(chunks) + compressor.flush()
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(ZSTD, frame, LIMIT) == data
    assert decompress(ZSTD, frame, len(data)) == data
    with pytest.raises(CodecError, match="max_size"):
        decompress(ZSTD, frame, len(data) - 1)


def test_zstd_reads_concatenated_frames() -> None:
    stream = compress(ZSTD, b"first ") + zstandard.ZstdCompressor().compress(LOG_64K)
    assert decompress(ZSTD, stream, LIMIT) == b"first " + LOG_64K


def test_zstd_checksummed_frame_detects_flipped_byte() -> None:
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(LOG_64K))
    frame[-1] ^= 0xFF  # the content checksum itself
    assert "zstd" in str(raises_codec_error(ZSTD, bytes(frame)))


# --- corrupt, truncated and garbage input ------------------------------------------------


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
def test_empty_input_is_not_a_stream(codec: int) -> None:
    assert CODEC_NAMES[codec] in str(raises_codec_error(codec, b""))


def test_none_codec_passes_bytes_through() -> None:
    assert compress(NONE, b"") == b""
    assert decompress(NONE, b"", 0) == b""
    assert decompress(NONE, memoryview(b"abc"), 3) == b"abc"


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
@pytest.mark.parametrize("name", ["small", "log_1mib", "incompressible_1mib"])
def test_truncated_input_is_refused(codec: int, name: str) -> None:
    packed = compress(codec, DATASETS[name])
    # xerial snappy has no end mark: a cut exactly between blocks leaves a valid shorter
    # stream (Kafka's batch CRC catches that); every other cut must fail
    boundaries = set()
    if codec == SNAPPY:
        pos = 16
        for block in xerial_blocks(packed):
            pos += 4 + len(block)
            boundaries.add(pos)
    for keep in {len(packed) - 1, len(packed) - 5, len(packed) // 2, len(packed) // 3, 3}:
        if keep in boundaries:
            continue
        error = raises_codec_error(codec, packed[:keep])
        assert CODEC_NAMES[codec] in str(error)


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
@pytest.mark.parametrize("seed", range(5))
def test_garbage_is_refused(codec: int, seed: int) -> None:
    garbage = random.Random(seed).randbytes(1000)
    error = raises_codec_error(codec, garbage)
    assert CODEC_NAMES[codec] in str(error)


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
def test_broken_magic_is_refused(codec: int) -> None:
    packed = bytearray(compress(codec, LOG_64K))
    packed[1] ^= 0x55
    assert CODEC_NAMES[codec] in str(raises_codec_error(codec, bytes(packed)))


@pytest.mark.parametrize("codec", [GZIP, LZ4], ids=["gzip", "lz4"])
def test_any_flipped_byte_is_detected_by_checksummed_codecs(codec: int) -> None:
    # gzip has CRC-32 + ISIZE; our lz4 frames carry a header checksum and block checksums.
    # gzip header bytes 4..9 (MTIME, XFL, OS) are informational and not checked by anyone.
    packed = compress(codec, LOG_64K[:3000])
    skipped = range(4, 10) if codec == GZIP else range(0)
    for pos in range(len(packed)):
        if pos in skipped:
            continue
        broken = bytearray(packed)
        broken[pos] ^= 0x01 << (pos % 8)
        with pytest.raises(CodecError):
            decompress(codec, bytes(broken), LIMIT)


@pytest.mark.parametrize(
    ("codec", "payload", "cause"),
    [
        (GZIP, compress(GZIP, LOG_64K)[:10] + b"\xff" * 50, zlib.error),
        (SNAPPY, b"\x05abc", cramjam.DecompressionError),  # raw block, bad copy offset
        (SNAPPY, compress(SNAPPY, b"x" * 100)[:-2] + b"\xff\xff", cramjam.DecompressionError),
        (LZ4, compress(LZ4, LOG_64K)[:-1], cramjam.DecompressionError),
        (ZSTD, compress(ZSTD, LOG_64K)[:-1], cramjam.DecompressionError),
    ],
    ids=["gzip", "snappy-raw", "snappy-xerial", "lz4", "zstd"],
)
def test_library_errors_are_wrapped_with_their_cause(
    codec: int, payload: bytes, cause: type[BaseException]
) -> None:
    error = raises_codec_error(codec, payload)
    assert type(error) is CodecError
    assert isinstance(error.__cause__, cause)
    assert CODEC_NAMES[codec] in str(error)


@settings(max_examples=300, deadline=None)
@given(
    codec=st.sampled_from(COMPRESSED),
    data=st.binary(max_size=5000),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), max_size=4),
    cut=st.integers(min_value=0, max_value=64),
)
def test_mutated_input_raises_only_codec_error(
    codec: int, data: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    packed = bytearray(compress(codec, data))
    for pos, mask in flips:
        packed[pos % len(packed)] ^= mask
    payload = bytes(packed[: max(0, len(packed) - cut)])
    try:
        out = decompress(codec, payload, 10_000)
    except CodecError:
        return
    assert type(out) is bytes
    assert len(out) <= 10_000


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), payload=st.binary(max_size=2000))
def test_arbitrary_bytes_raise_only_codec_error(codec: int, payload: bytes) -> None:
    try:
        out = decompress(codec, payload, 10_000)
    except CodecError:
        return
    assert len(out) <= 10_000


# --- decompression bombs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def bombs() -> dict[int, bytes]:
    """100 MiB of zeros compressed by each codec (gzip ~100 KB, zstd ~3 KB)."""
    zeros = bytes(100 * MiB)
    return {codec: compress(codec, zeros) for codec in COMPRESSED}


@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
def test_bomb_is_refused_quickly_without_python_allocations(
    codec: int, bombs: dict[int, bytes]
) -> None:
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(CodecError, match="max_size"):
            decompress(codec, bombs[codec], MiB)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 8 * MiB  # output buffers are bounded by max_size, never 100 MiB


_RSS_PROBE = """
import resource, sys
from mqcore.compression import decompress
from mqcore.errors import CodecError
codec, path = int(sys.argv[1]), sys.argv[2]
with open(path, "rb") as f:
    payload = f.read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    decompress(codec, payload, 1 << 20)
except CodecError:
    pass
else:
    raise SystemExit("bomb was not refused")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
@pytest.mark.parametrize("codec", COMPRESSED, ids=CODEC_NAMES[1:])
def test_bomb_does_not_grow_peak_rss(codec: int, bombs: dict[int, bytes], tmp_path: Path) -> None:
    # a fresh process sees native (Rust/C) allocations too, which tracemalloc does not
    path = tmp_path / f"bomb-{codec}"
    path.write_bytes(bombs[codec])
    package_root = str(Path(compression.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(codec), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    grown_kib = int(result.stdout.strip())
    assert grown_kib < 24 * 1024, f"peak RSS grew by {grown_kib} KiB"
