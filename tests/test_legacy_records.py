"""Message sets of magic 0 and 1 (mqcore.log.legacy) against kafka-python's legacy record code,
an implementation we did not write: its message sets, for every magic and codec it writes, turn
into v2 batches that kafka-python's v2 reader reads back as the same records with the same
codec; the message sets we write from v2 batches read back through its legacy reader as the
same offsets, keys, values and timestamps; damage is an mqcore error, never anything else."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from mqcore.errors import MQCoreError
from mqcore.log.legacy import down_convert, up_convert

NOW = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3}

Record = tuple[bytes | None, bytes | None, int]
records_st = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=200),
        st.integers(0, 2**41),
    ),  # fmt: skip
    min_size=1,
    max_size=30,
)


def message_set(magic: int, codec: int, records: list[Record]) -> bytes:
    """What a client of magic `magic` sends: kafka-python's legacy builder."""
    b = LegacyRecordBatchBuilder(magic, codec, 1 << 24)
    for i, (key, value, ts) in enumerate(records):
        assert b.append(i, ts if magic else None, key, value) is not None
    return bytes(b.build())


def v2_records(batch: bytes) -> tuple[int, list[Record]]:
    """(codec, records) of a v2 batch, read by kafka-python."""
    b = DefaultRecordBatch(batch)
    return b.compression_type, [(r.key, r.value, r.timestamp) for r in b]


def legacy_records(message_set: bytes) -> list[tuple[int, bytes | None, bytes | None, int | None]]:
    """(offset, key, value, timestamp) of each message, read by kafka-python."""
    out = []
    records = MemoryRecords(message_set)
    while records.has_next():
        batch = records.next_batch()
        assert isinstance(batch, LegacyRecordBatch)
        assert batch.validate_crc()
        out += [(r.offset, r.key, r.value, r.timestamp) for r in batch]
    return out


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", list(CODECS))
@settings(max_examples=25)
@given(records=records_st)
def test_up_conversion_keeps_records_and_codec(
    magic: int, codec: str, records: list[Record]
) -> None:
    got_codec, got = v2_records(up_convert(message_set(magic, CODECS[codec], records), NOW))
    assert got_codec == CODECS[codec]
    want_ts = [ts if magic else NOW for _, _, ts in records]  # magic 0: the time it arrived
    assert got == [(k, v, t) for (k, v, _), t in zip(records, want_ts, strict=True)]


@pytest.mark.parametrize("magic", [0, 1])
@settings(max_examples=40)
@given(records=records_st, start=st.integers(0, 10), codec=st.sampled_from([0, 1, 2, 3, 4]))
def test_down_conversion_reads_back_through_kafka_python(
    magic: int, records: list[Record], start: int, codec: int
) -> None:
    from mqcore import compression
    from mqcore._ext.encode import encode_batch

    batch = encode_batch([v for _, v, _ in records], [k for k, _, _ in records], None,
                         [t for _, _, t in records], NOW, codec,
                         compress=compression.compress)  # fmt: skip
    batch.set_base_offset(100)
    out = down_convert(batch.tobytes(), magic, 100 + start, 1 << 30)
    want = [(100 + i, k, v, t if magic else None) for i, (k, v, t) in enumerate(records)]
    assert legacy_records(out) == want[start:]


def test_down_conversion_stops_at_max_bytes_but_gives_one_message() -> None:
    from mqcore._ext.encode import encode_batch

    batch = encode_batch([b"x" * 100] * 10, None, None, None, NOW, 0).tobytes()
    one = len(down_convert(batch, 1, 0, 1))
    assert len(legacy_records(down_convert(batch, 1, 0, 1))) == 1
    assert len(legacy_records(down_convert(batch, 1, 0, 3 * one + 1))) == 3


def test_damage_is_an_mqcore_error() -> None:
    good = bytearray(message_set(1, 0, [(b"k", b"v", NOW)]))
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    with pytest.raises(MQCoreError, match="CRC"):
        up_convert(bytes(bad_crc), NOW)
    with pytest.raises(MQCoreError):
        up_convert(bytes(good[:-3]), NOW)
    with pytest.raises(MQCoreError, match="no message"):
        up_convert(b"", NOW)
    zstd = bytearray(good)
    zstd[17] = 4  # attributes: codec 4 (zstd) needs magic 2
    struct.pack_into(">I", zstd, 12, __import__("zlib").crc32(zstd[16:]))
    with pytest.raises(MQCoreError, match="codec 4"):
        up_convert(bytes(zstd), NOW)


def test_magic_0_lz4_frames_with_kafkas_old_header_checksum_are_read() -> None:
    """Kafka before 0.10 computed an LZ4 frame's header checksum over its magic number too
    (KAFKA-3160); kafka-python writes magic 0 frames that way, as old clients do. The
    checksum written in is XXH32's, checked against the xxhash package."""
    import xxhash

    from mqcore.log.legacy import lz4_magic0_frame

    frame = bytearray(message_set(0, CODECS["lz4"], [(b"k", b"v", 0)]))
    records = [(b"k", b"v%d" % i, 0) for i in range(30)]
    got_codec, got = v2_records(up_convert(message_set(0, CODECS["lz4"], records), NOW))
    assert (got_codec, got) == (3, [(k, v, NOW) for k, v, _ in records])
    value = bytes(frame[26:])  # the wrapper's value, after entry, crc, magic, attrs, lengths
    fixed = lz4_magic0_frame(value)
    assert fixed[6] == (xxhash.xxh32(fixed[4:6]).intdigest() >> 8) & 0xFF
    assert fixed[6] != value[6]  # the old checksum was not the right one


@settings(max_examples=300)
@given(data=st.binary(max_size=300))
def test_any_bytes_are_converted_or_refused_with_an_mqcore_error(data: bytes) -> None:
    try:
        up_convert(data, NOW)
    except MQCoreError:
        pass
