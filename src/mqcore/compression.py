"""Kafka's record-batch compression codecs, with the framing Kafka's clients write.

A v2 record batch with a codec stores everything after its `recordsCount` field as one
compressed stream; this module turns that stream into records bytes and back. We never
implement a compressor ourselves: gzip comes from the standard library's `zlib`, snappy, lz4
and zstd from `cramjam` (Rust bindings over snap, liblz4 and libzstd). What is ours is the
framing Kafka puts around them and the limits we apply when reading untrusted bytes.

`decompress` takes a `max_size` so that a few kilobytes of crafted input (a "decompression
bomb") cannot make us allocate gigabytes: each codec stops producing output once the limit is
crossed and raises `CodecError`, whose message names the codec and what was wrong.
"""

# Framing, per codec (REFERENCE.md, "Kafka record batch v2", line "Codec framing as Kafka
# writes it: gzip stream; snappy in the xerial block framing; lz4 frame format; zstd frame"):
#
# gzip (attributes codec 1)
#   An RFC 1952 gzip stream, as java.util.zip.GZIPOutputStream writes it. We write one member
#   with zlib (wbits=31 selects the gzip container) at zlib's default level 6, which is also
#   Kafka's default gzip level. On read we accept several concatenated members, as
#   GZIPInputStream does, but nothing else after them (no zero padding, no trailing garbage).
#   Bound: zlib's decompressobj with max_length yields at most max_size + 1 bytes per call.
#
# snappy (codec 2)
#   The xerial snappy-java block framing that Kafka's Java client writes:
#     header  b"\x82SNAPPY\x00" + int32 version (1) + int32 min-compatible version (1), BE
#     blocks  int32 BE compressed length + one raw snappy block, repeated
#   Like xerial we cut the input into 32 KiB blocks. On read the version fields are ignored
#   (Redpanda wrote them little-endian; kafka-python ignores them too), a header met again
#   between blocks starts a concatenated stream (snappy-java accepts that), and input without
#   the magic is decoded as one plain raw snappy block, as kafka-python does. An empty input
#   is written as the header plus one empty block, because kafka-python cannot read a stream
#   holding only the header (snappy-java and we can).
#   Bound: every raw snappy block starts with its decompressed length; we sum those lengths
#   and refuse before allocating anything when the sum exceeds max_size, then decompress each
#   block into its exact slice of one preallocated buffer.
#
# lz4 (codec 3)
#   One standard LZ4 frame (magic 0x184D2204). Kafka >= 0.10 (magic 1 and 2) uses the real
#   frame format; Kafka's Java reader rejects frames whose blocks depend on each other
#   ("Dependent block stream is unsupported") because it decompresses every block alone. So
#   we write independent 64 KiB blocks with liblz4's fast mode (Kafka's default LZ4 level uses
#   the fast compressor too); liblz4 adds a per-block checksum, which Kafka verifies. On read
#   liblz4 accepts any valid frame: linked or independent blocks, with or without content
#   size and checksums, concatenated and skippable frames.
#   Bound: see "bounded buffer" below.
#
# zstd (codec 4)
#   Standard zstd frames at level 3, Kafka's default. Java's zstd-jni writes streaming frames
#   whose header carries no content size; the decoder used here is libzstd's streaming decoder,
#   which does not need it, and it also reads concatenated frames.
#   Bound: see "bounded buffer" below.
#
# Bounded buffer (lz4, zstd): neither frame has to state its decompressed size (Java's
#   writers never do), so we decompress into a fixed-size bytearray with cramjam's
#   decompress_into. When the output does not fit, cramjam stops writing and raises Rust's
#   WriteZero error ("failed to write whole buffer") instead of growing anything; we then
#   retry with a buffer four times larger, up to max_size, and fail once max_size itself is
#   too small. The first guess is eight times the input (at least 64 KiB), which covers
#   typical log data in one pass. Growing 4x bounds the failed passes to less than 4/3 of
#   the final pass's work, at the price of a buffer up to 4x the output (never > max_size).
#   A bomb therefore costs at most about max_size of output work and memory.
#
# All cramjam calls used here take any contiguous buffer (bytes, bytearray, memoryview)
# without copying it and release the GIL while they run, except lz4.Compressor.compress:
# it accepts only `bytes` (so a bytearray or memoryview is copied once) and holds the GIL.
# It is still the only cramjam entry point that writes independent lz4 blocks:
# cramjam.lz4.compress writes linked blocks, which Kafka's Java consumers cannot read.

from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Callable
from typing import Final

import cramjam

from mqcore.errors import CodecError, UnsupportedCodecError

__all__ = [
    "NONE",
    "GZIP",
    "SNAPPY",
    "LZ4",
    "ZSTD",
    "CODEC_NAMES",
    "codec_id",
    "compress",
    "decompress",
]

NONE: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
CODEC_NAMES: Final = ("none", "gzip", "snappy", "lz4", "zstd")

BytesLike = bytes | bytearray | memoryview

_GZIP_WBITS: Final = 31  # 16 + zlib.MAX_WBITS: gzip header and trailer around deflate
_GZIP_LEVEL: Final = 6
_LZ4_LEVEL: Final = 0  # liblz4 fast mode
_ZSTD_LEVEL: Final = 3

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16
_XERIAL_HEADER: Final = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_SIZE: Final = 32 * 1024
_INT32: Final = struct.Struct(">i")

_FIRST_GUESS_MIN: Final = 64 * 1024
_FIRST_GUESS_RATIO: Final = 8
_GROWTH: Final = 4
_OUTPUT_FULL: Final = "failed to write whole buffer"  # Rust std, io::ErrorKind::WriteZero


def codec_id(name_or_id: str | int) -> int:
    """Return the attribute value (0..4) of a codec given by name or by value.

    Names are the producer's `compression.type` values, case-insensitive; anything else, including
    the attribute values 5..7 that Kafka leaves undefined, raises UnsupportedCodecError.
    """
    if isinstance(name_or_id, int) and not isinstance(name_or_id, bool):
        if 0 <= name_or_id < len(CODEC_NAMES):
            return name_or_id
    elif isinstance(name_or_id, str):
        name = name_or_id.lower()
        if name in CODEC_NAMES:
            return CODEC_NAMES.index(name)
    raise UnsupportedCodecError(
        f"unsupported compression codec {name_or_id!r}: Kafka v2 defines "
        + ", ".join(f"{i} {n}" for i, n in enumerate(CODEC_NAMES))
    )


def compress(codec: int, data: BytesLike) -> bytes:
    """Compress a batch's records section with `codec`, framed as Kafka's clients write it."""
    codec = _checked_codec(codec)
    view = _byte_view(data)
    try:
        if codec == GZIP:
            return _gzip_compress(view)
        if codec == SNAPPY:
            return _snappy_compress(view)
        if codec == LZ4:
            return _lz4_compress(view)
        if codec == ZSTD:
            return bytes(cramjam.zstd.compress(view, level=_ZSTD_LEVEL))
    except (zlib.error, cramjam.CompressionError) as exc:
        raise CodecError(f"{CODEC_NAMES[codec]}: compression failed: {exc}") from exc
    return bytes(view)


def decompress(codec: int, data: BytesLike, max_size: int) -> bytes:
    """Decompress a records section written with `codec`, refusing more than max_size bytes.

    Raises CodecError when the input is empty, corrupt or truncated, or when its output would
    exceed max_size; the output is bounded while decompressing, never checked afterwards.
    """
    codec = _checked_codec(codec)
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 0:
        raise ValueError(f"max_size must be a non-negative int, got {max_size!r}")
    view = _byte_view(data)
    name = CODEC_NAMES[codec]
    if codec == NONE:
        if len(view) > max_size:
            raise _too_large(name, max_size)
        return bytes(view)
    if not view:
        raise CodecError(f"{name}: empty input is not a compressed stream")
    if codec == GZIP:
        return _gzip_decompress(view, max_size)
    if codec == SNAPPY:
        return _snappy_decompress(view, max_size)
    if codec == LZ4:
        return _bounded_decompress(name, cramjam.lz4.decompress_into, view, max_size)
    return _bounded_decompress(name, cramjam.zstd.decompress_into, view, max_size)


def _checked_codec(codec: int) -> int:
    """Refuse anything but the int attribute values 0..4 (5..7 are undefined in Kafka)."""
    if isinstance(codec, bool) or not isinstance(codec, int) or not 0 <= codec < len(CODEC_NAMES):
        raise UnsupportedCodecError(
            f"unsupported compression codec {codec!r}: the attribute codec must be 0..4 "
            f"({', '.join(CODEC_NAMES)})"
        )
    return codec


def _byte_view(data: BytesLike) -> memoryview:
    """View `data` as flat unsigned bytes without copying, whatever its item format."""
    view = memoryview(data)
    if not view.c_contiguous:
        return memoryview(view.tobytes())
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B")


def _too_large(name: str, max_size: int) -> CodecError:
    """The error for output that would exceed max_size (a likely decompression bomb)."""
    return CodecError(f"{name}: decompressed data would exceed max_size ({max_size} bytes)")


def _corrupt(name: str, what: object) -> CodecError:
    """The error for input the codec cannot decode."""
    return CodecError(f"{name}: corrupt or truncated input: {what}")


def _gzip_compress(view: memoryview) -> bytes:
    """One gzip member at Kafka's default level (compressobj: 3.10's zlib.compress has no wbits)."""
    compressor = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
    return b"".join((compressor.compress(view), compressor.flush()))


def _gzip_decompress(view: memoryview, max_size: int) -> bytes:
    """Inflate concatenated gzip members, asking zlib for at most max_size + 1 bytes."""
    chunks: list[bytes] = []
    produced = 0
    pending: BytesLike = view
    decompressor = zlib.decompressobj(_GZIP_WBITS)
    try:
        while True:
            chunk = decompressor.decompress(pending, min(max_size - produced + 1, sys.maxsize))
            produced += len(chunk)
            if produced > max_size:
                raise _too_large("gzip", max_size)
            chunks.append(chunk)
            if decompressor.eof:
                pending = decompressor.unused_data
                if not pending:
                    break
                decompressor = zlib.decompressobj(_GZIP_WBITS)
            elif decompressor.unconsumed_tail:
                pending = decompressor.unconsumed_tail
            else:
                raise _corrupt("gzip", "the stream ends before its last member is complete")
    except zlib.error as exc:
        raise _corrupt("gzip", exc) from exc
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _snappy_compress(view: memoryview) -> bytes:
    """Xerial framing: the 16-byte header, then one raw block per 32 KiB of input."""
    parts: list[BytesLike | cramjam.Buffer] = [_XERIAL_HEADER]
    for start in range(0, max(len(view), 1), _XERIAL_BLOCK_SIZE):
        block = cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK_SIZE])
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_blocks(view: memoryview) -> list[memoryview]:
    """Split a snappy payload into its raw blocks: xerial-framed, or one plain raw block."""
    if view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return [view]
    blocks: list[memoryview] = []
    pos = 0
    end = len(view)
    while pos < end:
        if view[pos : pos + len(_XERIAL_MAGIC)] == _XERIAL_MAGIC:
            if end - pos < _XERIAL_HEADER_SIZE:
                raise _corrupt("snappy", f"xerial header at offset {pos} is cut short")
            pos += _XERIAL_HEADER_SIZE
            continue
        if end - pos < _INT32.size:
            raise _corrupt("snappy", f"xerial block length at offset {pos} is cut short")
        (length,) = _INT32.unpack_from(view, pos)
        pos += _INT32.size
        if length < 0 or length > end - pos:
            raise _corrupt(
                "snappy",
                f"xerial block length {length} at offset {pos - 4} does not fit in the "
                f"remaining {end - pos} bytes",
            )
        blocks.append(view[pos : pos + length])
        pos += length
    return blocks


def _snappy_decompress(view: memoryview, max_size: int) -> bytes:
    """Check the blocks' stated sizes against max_size, then decode into one exact buffer."""
    blocks = _snappy_blocks(view)
    try:
        sizes = []
        total = 0
        for block in blocks:
            size = cramjam.snappy.decompress_raw_len(block)
            total += size
            if total > max_size:
                raise _too_large("snappy", max_size)
            sizes.append(size)
        out = bytearray(total)
        target = memoryview(out)
        pos = 0
        for block, size in zip(blocks, sizes, strict=True):
            written = cramjam.snappy.decompress_raw_into(block, target[pos : pos + size])
            if written != size:
                raise _corrupt("snappy", f"a block stated {size} bytes but held {written}")
            pos += size
    except cramjam.DecompressionError as exc:
        raise _corrupt("snappy", exc) from exc
    return bytes(out)


def _lz4_compress(view: memoryview) -> bytes:
    """One LZ4 frame of independent 64 KiB blocks (Kafka's Java reader needs independence)."""
    compressor = cramjam.lz4.Compressor(
        level=_LZ4_LEVEL, content_checksum=False, block_linked=False
    )
    data = view.obj if type(view.obj) is bytes and len(view) == len(view.obj) else view.tobytes()
    compressor.compress(data)
    return bytes(compressor.finish())


def _bounded_decompress(
    name: str,
    decompress_into: Callable[[memoryview, bytearray], int],
    view: memoryview,
    max_size: int,
) -> bytes:
    """Decompress into fixed buffers growing 4x up to max_size (see "Bounded buffer" above)."""
    size = min(max_size, max(_FIRST_GUESS_MIN, _FIRST_GUESS_RATIO * len(view)))
    while True:
        out = bytearray(size)
        try:
            written = decompress_into(view, out)
        except cramjam.DecompressionError as exc:
            if _OUTPUT_FULL not in str(exc):
                raise _corrupt(name, exc) from exc
            if size >= max_size:
                raise _too_large(name, max_size) from exc
            size = min(max_size, size * _GROWTH)
            continue
        if written == size:
            return bytes(out)
        with memoryview(out) as filled:
            return bytes(filled[:written])
