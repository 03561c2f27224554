"""Kafka's message sets of magic 0 and 1, the record formats before v2 record batches, turned
into v2 batches on the way in and made from them on the way out, as Kafka 3.x's brokers did at
the edge (its LogValidator up-converts, its fetch path down-converts): the log keeps only v2.

Produce v0-v2 carry message sets; Fetch v0-v1 answer magic 0 and v2-v3 magic 1. Clients that
still send them: sarama at its default protocol version, segmentio/kafka-go 0.2, Burrow.
docs/format.md "Message sets (magic 0 and 1)" says what is kept and what is lost.

Wire schema (Kafka's protocol guide, "Message sets"; big-endian):

    message set   entry, repeated (no count: the set fills its bytes)
    entry         offset int64 | message_size int32 | message (message_size bytes)
    message v0    crc uint32 (CRC-32 IEEE of the rest) | magic int8 (0)
                  | attributes int8 (bits 0-2: codec 0 none, 1 gzip, 2 snappy, 3 lz4)
                  | key bytes (int32 length, -1 null) | value bytes (int32 length, -1 null)
    message v1    crc uint32 | magic int8 (1) | attributes int8 (bits 0-2 codec, bit 3 the
                  timestamp type: 0 CreateTime, 1 LogAppendTime) | timestamp int64
                  | key bytes | value bytes
    compressed    a wrapper message (null key) whose value is the codec's compression of an
                  inner message set of uncompressed messages; in magic 1 the inner offsets are
                  relative (0..n-1) and the wrapper's offset is the last inner one's, and a
                  LogAppendTime wrapper's timestamp is every inner message's

On the way in the producer's offsets are ignored (the log assigns them), the codec of a
compressed wrapper is kept for the v2 batch, and a magic 0 message, which has no timestamp,
gets the time it arrived. On the way out records keep their offsets, keys, values and (magic
1) timestamps; headers are dropped (neither magic has them) and control records left out, the
message set is written uncompressed, and it holds whole messages only.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from mqcore import compression
from mqcore._ext.batch import Message, decode_messages
from mqcore._ext.encode import encode_batch
from mqcore.errors import CorruptRecordError, InvalidRecordError

_ENTRY = struct.Struct(">qi")  # offset, message_size
_V0 = struct.Struct(">Ibb")  # crc, magic, attributes
_V1_TIME = struct.Struct(">q")
_LEN = struct.Struct(">i")
LOG_APPEND_TIME = 0x08  # attributes bit 3 in magic 1
MIN_MESSAGE = {0: 14, 1: 22}  # crc, magic, attributes, [timestamp], two lengths
MAX_DECOMPRESSED = 256 << 20  # what one compressed wrapper may inflate to
LZ4 = 3
LZ4_MAGIC = b"\x04\x22\x4d\x18"  # an LZ4 frame's magic number, little-endian 0x184D2204


@dataclass(frozen=True, slots=True)
class LegacyRecord:
    """One message of a message set: key, value, timestamp (-1 for magic 0)."""

    key: bytes | None
    value: bytes | None
    timestamp: int


def up_convert(message_set: bytes | memoryview, now_ms: int) -> bytes:
    """One v2 record batch holding the messages of a magic 0 or 1 message set, compressed
    with the codec of its wrapper (none when it has none). CorruptRecordError for a bad CRC
    or a message that runs past the set, InvalidRecordError for a set with no message, mixed
    magics or codecs, or a codec magic 0 and 1 do not have."""
    records, codec = _read_set(memoryview(message_set), nested=False)
    if not records:
        raise InvalidRecordError("a produce request's message set holds no message")
    batch = encode_batch(
        [r.value for r in records],
        [r.key for r in records],
        None,
        [now_ms if r.timestamp < 0 else r.timestamp for r in records],
        now_ms,
        codec,
        compress=compression.compress,
    )
    return batch.tobytes()


def down_convert(
    batches: bytes | memoryview, magic: int, first_offset: int, max_bytes: int
) -> bytes:
    """The records of v2 `batches` from `first_offset` on as an uncompressed message set of
    `magic` (0 or 1), whole messages up to `max_bytes` but at least one."""
    if magic not in (0, 1):
        raise InvalidRecordError(f"message sets have magic 0 or 1, not {magic}")
    out: list[Message] = []
    decode_messages(bytes(batches), 0, "", 0, first_offset, 1 << 30, out)
    written = bytearray()
    for m in out:
        entry = _message(m, magic)
        if written and len(written) + len(entry) > max_bytes:
            break
        written += entry
    return bytes(written)


def _message(m: Message, magic: int) -> bytes:
    """One entry (offset, size, message) of a message set."""
    attributes = LOG_APPEND_TIME if magic and m.timestamp_type else 0
    body = bytearray(struct.pack(">bb", magic, attributes))
    if magic == 1:
        body += _V1_TIME.pack(m.timestamp)
    for field in (m.key, m.value):
        body += _LEN.pack(-1) if field is None else _LEN.pack(len(field)) + field
    crc = struct.pack(">I", zlib.crc32(body))
    return _ENTRY.pack(m.offset, len(body) + 4) + crc + body


def _read_set(view: memoryview, nested: bool) -> tuple[list[LegacyRecord], int]:
    """The messages of a set and the codec they came compressed with (0: none)."""
    records: list[LegacyRecord] = []
    codecs: set[int] = set()
    magics: set[int] = set()
    pos = 0
    while pos < len(view):
        if len(view) - pos < _ENTRY.size:
            raise CorruptRecordError(f"a message set ends {len(view) - pos} bytes into an entry")
        _offset, size = _ENTRY.unpack_from(view, pos)
        start = pos + _ENTRY.size
        if size < MIN_MESSAGE[0] or size > len(view) - start:
            raise CorruptRecordError(f"a message of {size} bytes where {len(view) - start} are")
        magic, codec, inner = _read_message(view[start : start + size], nested)
        magics.add(magic)
        codecs.add(codec)
        records += inner
        pos = start + size
    if len(magics) > 1 or len(codecs) > 1:
        raise InvalidRecordError("a message set mixes magics or codecs")
    return records, codecs.pop() if codecs else 0


def _read_message(msg: memoryview, nested: bool) -> tuple[int, int, list[LegacyRecord]]:
    """(magic, codec, its records: itself, or a wrapper's inner messages)."""
    crc, magic, attributes = _V0.unpack_from(msg, 0)
    if magic not in (0, 1):
        raise InvalidRecordError(f"a message of magic {magic} in a message set (0 or 1)")
    if len(msg) < MIN_MESSAGE[magic]:
        raise CorruptRecordError(f"a magic {magic} message of {len(msg)} bytes")
    if zlib.crc32(msg[4:]) != crc:
        raise CorruptRecordError("a message's CRC does not match its bytes")
    pos, timestamp = _V0.size, -1
    if magic == 1:
        (timestamp,) = _V1_TIME.unpack_from(msg, pos)
        pos += _V1_TIME.size
    key, pos = _bytes_at(msg, pos)
    value, _ = _bytes_at(msg, pos)
    codec = attributes & 0x07
    if codec == 0:
        return magic, 0, [LegacyRecord(key, value, timestamp)]
    return magic, codec, _inflate(codec, value, magic, attributes, timestamp, nested)


def _inflate(
    codec: int, value: bytes | None, magic: int, attributes: int, timestamp: int, nested: bool
) -> list[LegacyRecord]:
    """The inner messages of a compressed wrapper."""
    if nested:
        raise InvalidRecordError("a compressed message inside a compressed message")
    if codec not in (1, 2, 3):
        raise InvalidRecordError(f"codec {codec} in a magic {magic} message (gzip, snappy, lz4)")
    if value is None:
        raise InvalidRecordError("a compressed message without a value")
    if magic == 0 and codec == LZ4:
        value = lz4_magic0_frame(value)
    inner, _ = _read_set(memoryview(compression.decompress(codec, value, MAX_DECOMPRESSED)), True)
    if magic == 1 and attributes & LOG_APPEND_TIME:  # the wrapper's time is every message's
        inner = [LegacyRecord(r.key, r.value, timestamp) for r in inner]
    return inner


def lz4_magic0_frame(frame: bytes) -> bytes:
    """A magic 0 LZ4 frame with its header checksum made right: Kafka before 0.10 computed it
    over the frame's magic number too (KAFKA-3160), which liblz4 refuses; Kafka's broker reads
    such frames ignoring the checksum, and so does this, by writing the right one in."""
    if len(frame) < 7 or frame[:4] != LZ4_MAGIC:
        return frame  # not a frame: the decompressor says what is wrong
    flags = frame[4]
    end = 6 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)  # content size, dict ID
    if len(frame) <= end:
        return frame
    checksum = (_xxh32_short(frame[4:end]) >> 8) & 0xFF
    return frame[:end] + bytes([checksum]) + frame[end + 1 :]


_P1, _P3, _P4, _P5 = 2654435761, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _xxh32_short(data: bytes) -> int:
    """XXH32 with seed 0 of fewer than 16 bytes (an LZ4 frame descriptor: at most 14)."""
    assert len(data) < 16
    acc = (_P5 + len(data)) & _M32
    i = 0
    while i + 4 <= len(data):
        acc = _rotl((acc + int.from_bytes(data[i : i + 4], "little") * _P3) & _M32, 17)
        acc = (acc * _P4) & _M32
        i += 4
    for byte in data[i:]:
        acc = (_rotl((acc + byte * _P5) & _M32, 11) * _P1) & _M32
    acc ^= acc >> 15
    acc = (acc * 2246822519) & _M32
    acc ^= acc >> 13
    acc = (acc * _P3) & _M32
    return acc ^ (acc >> 16)


def _bytes_at(msg: memoryview, pos: int) -> tuple[bytes | None, int]:
    if len(msg) - pos < _LEN.size:
        raise CorruptRecordError("a message ends inside a length")
    (n,) = _LEN.unpack_from(msg, pos)
    pos += _LEN.size
    if n == -1:
        return None, pos
    if n < 0 or n > len(msg) - pos:
        raise CorruptRecordError(f"a key or value of {n} bytes where {len(msg) - pos} are")
    return bytes(msg[pos : pos + n]), pos + n


__all__ = ["LegacyRecord", "down_convert", "up_convert"]
