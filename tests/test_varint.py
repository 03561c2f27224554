"""Zigzag varints (mqcore._ext.varint): golden vectors from REFERENCE.md, round trips over the whole
int64 range, truncated and over-long input, decoding at offsets inside a buffer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqcore._ext.varint import decode_varint, encode_varint, size_of_varint
from mqcore.errors import CorruptRecordError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)

# REFERENCE.md "Kafka record batch v2": the varint examples, plus the int64 extremes and the
# boundaries where the encoding gains a byte (zigzag 2**(7k) - 1 -> 2**(7k)).
GOLDEN = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (8191, "fe7f"),
    (8192, "808001"),
    (-8193, "818001"),
    (2147483647, "feffffff0f"),
    (-2147483648, "ffffffff0f"),
    (INT64_MAX, "feffffffffffffffff01"),
    (INT64_MIN, "ffffffffffffffffff01"),
]


def zigzag_reference(value: int) -> bytes:
    """Zigzag then base-128 little-endian groups, written from the definition with Python ints."""
    z = (value << 1) if value >= 0 else ((-value) << 1) - 1
    out = bytearray()
    while True:
        group = z & 0x7F
        z >>= 7
        if z:
            out.append(group | 0x80)
        else:
            out.append(group)
            return bytes(out)


@pytest.mark.parametrize(("value", "hex_bytes"), GOLDEN)
def test_golden_encode(value: int, hex_bytes: str) -> None:
    assert encode_varint(value).hex() == hex_bytes
    assert size_of_varint(value) == len(hex_bytes) // 2


@pytest.mark.parametrize(("value", "hex_bytes"), GOLDEN)
def test_golden_decode(value: int, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes)
    assert decode_varint(data) == (value, len(data))


@pytest.mark.parametrize(("value", "hex_bytes"), GOLDEN)
def test_reference_agrees_with_golden(value: int, hex_bytes: str) -> None:
    assert zigzag_reference(value).hex() == hex_bytes


@given(int64s)
def test_round_trip_int64(value: int) -> None:
    data = encode_varint(value)
    assert data == zigzag_reference(value)
    assert len(data) == size_of_varint(value)
    assert decode_varint(data) == (value, len(data))


@given(int64s, st.binary(max_size=16), st.binary(max_size=16))
def test_decode_at_offset(value: int, prefix: bytes, suffix: bytes) -> None:
    """A varint in the middle of a buffer decodes from its position and reports where it ends."""
    data = prefix + encode_varint(value) + suffix
    assert decode_varint(data, len(prefix)) == (value, len(data) - len(suffix))


@given(st.lists(int64s, min_size=1, max_size=20))
def test_decode_sequence(values: list[int]) -> None:
    """Consecutive varints decode one after another by chaining next_pos."""
    data = b"".join(encode_varint(v) for v in values)
    pos = 0
    decoded = []
    for _ in values:
        v, pos = decode_varint(data, pos)
        decoded.append(v)
    assert decoded == values
    assert pos == len(data)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_buffer_kinds(kind: type) -> None:
    data = b"\x00" + encode_varint(-8193)
    assert decode_varint(kind(data), 1) == (-8193, 4)


@given(int64s)
def test_every_truncation_raises(value: int) -> None:
    """Every proper prefix of an encoding ends inside the varint: CorruptRecordError."""
    data = encode_varint(value)
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            decode_varint(data[:cut])


def test_empty_buffer_raises() -> None:
    with pytest.raises(CorruptRecordError):
        decode_varint(b"")


def test_position_at_end_raises() -> None:
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\x02", 1)


@pytest.mark.parametrize("pos", [-1, 3, 100])
def test_position_outside_buffer_raises(pos: int) -> None:
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\x02\x04", pos)


@pytest.mark.parametrize("length", [11, 12, 64])
def test_over_long_raises(length: int) -> None:
    """More than ten bytes with the continuation bit cannot be a 64-bit varint."""
    data = b"\x80" * (length - 1) + b"\x00"
    with pytest.raises(CorruptRecordError):
        decode_varint(data)


def test_ten_continuation_bytes_raise() -> None:
    """Ten bytes that all continue: the varint would need an eleventh byte."""
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\xff" * 10 + b"\x01")
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\xff" * 10)


def test_non_minimal_encoding_within_ten_bytes_decodes() -> None:
    """Redundant zero groups are accepted (as Kafka's ByteUtils does) and consumed fully."""
    assert decode_varint(b"\x80\x00") == (0, 2)
    assert decode_varint(b"\x82\x80\x80\x00\xaa", 0) == (1, 4)


@given(int64s, st.integers(min_value=0, max_value=8))
def test_truncated_at_offset_raises(value: int, prefix_len: int) -> None:
    data = bytes(prefix_len) + encode_varint(value)
    if len(data) - prefix_len > 1:
        with pytest.raises(CorruptRecordError):
            decode_varint(data[:-1], prefix_len)


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 2**70])
def test_encode_out_of_range_raises_overflow(value: int) -> None:
    with pytest.raises(OverflowError):
        encode_varint(value)
