# Zigzag varints as Kafka's v2 records use them (docs/format.md "Varints").
#
#   zigzag:  n -> (n << 1) ^ (n >> 63)        0->0, -1->1, 1->2, -2->3 ...
#   base-128 little-endian groups, high bit set on every byte but the last:
#     0 -> 00, -1 -> 01, 1 -> 02, 63 -> 7E, -64 -> 7F, 64 -> 80 01, 8192 -> 80 80 01
#
# Lengths (varint) and timestamp deltas (varlong) share this encoding; callers range-check
# int32 fields after reading. The kernels are `cdef inline` in varint.pxd so every module that
# cimports them inlines them (a cross-module call per varint cost ~25 instructions each).
from libc.stdint cimport int64_t

from mqcore.errors import CorruptRecordError


def encode_varint(int64_t value):
    """Zigzag varint bytes of `value` (a signed 64-bit integer)."""
    cdef unsigned char buf[MAX_VARINT_BYTES]
    cdef int n = write_varint(buf, value)
    return bytes(buf[:n])


def decode_varint(const unsigned char[::1] data not None, Py_ssize_t pos=0):
    """Decode the varint at `data[pos:]`; returns (value, next_pos).

    Raises CorruptRecordError when the bytes end inside the varint or it is over-long.
    """
    cdef int64_t value = 0
    cdef int n
    if pos < 0 or pos > data.shape[0]:
        raise CorruptRecordError(f"varint position {pos} outside a buffer of {data.shape[0]} bytes")
    n = read_varint(&data[0] + pos if data.shape[0] else NULL, data.shape[0] - pos, &value)
    if n < 0:
        raise CorruptRecordError(f"truncated or over-long varint at position {pos}")
    return value, pos + n


def size_of_varint(int64_t value):
    """Number of bytes the zigzag varint of `value` takes."""
    return varint_size(value)
