# Kafka's zigzag base-128 varints (REFERENCE.md "Kafka record batch v2"): the leaf kernels,
# inline here so every kernel that cimports them compiles them in place.
from libc.stdint cimport int64_t, uint64_t

# Longest encoding of a zigzag varlong.
cdef enum:
    MAX_VARINT_BYTES = 10


# Write the zigzag varint of `value` at `buf` (room for MAX_VARINT_BYTES); returns bytes written.
cdef inline int write_varint(unsigned char* buf, int64_t value) noexcept nogil:
    cdef uint64_t z = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef int n = 0
    while z >= 0x80:
        buf[n] = <unsigned char>((z & 0x7F) | 0x80)
        z >>= 7
        n += 1
    buf[n] = <unsigned char>z
    return n + 1


# Bytes write_varint would use for `value`.
cdef inline int varint_size(int64_t value) noexcept nogil:
    cdef uint64_t z = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef int n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


# Read a zigzag varint from buf[0:avail] into *out; returns bytes consumed, or -1 when the
# bytes end before the varint does or it runs past MAX_VARINT_BYTES.
cdef inline int read_varint(const unsigned char* buf, Py_ssize_t avail, int64_t* out) noexcept nogil:
    cdef uint64_t z = 0
    cdef int shift = 0
    cdef int i = 0
    cdef unsigned char b
    if avail > 0 and buf[0] < 0x80:                  # most record fields fit one byte
        out[0] = <int64_t>(buf[0] >> 1) ^ -(<int64_t>(buf[0] & 1))
        return 1
    if avail > 1 and buf[1] < 0x80:                  # the rest mostly two (lengths of 64-8191)
        z = (buf[0] & 0x7F) | (<uint64_t>buf[1] << 7)
        out[0] = <int64_t>(z >> 1) ^ -(<int64_t>(z & 1))
        return 2
    while True:
        if i >= avail or i >= MAX_VARINT_BYTES:
            return -1
        b = buf[i]
        z |= (<uint64_t>(b & 0x7F)) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    out[0] = <int64_t>(z >> 1) ^ -(<int64_t>(z & 1))
    return i
