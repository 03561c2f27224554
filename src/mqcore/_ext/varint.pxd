# Kafka's zigzag base-128 varints (REFERENCE.md "Kafka record batch v2"); what other kernels cimport.
from libc.stdint cimport int64_t

# Longest encoding of a zigzag varlong.
cdef enum:
    MAX_VARINT_BYTES = 10

# Write the zigzag varint of `value` at `buf` (room for MAX_VARINT_BYTES); returns bytes written.
cdef int write_varint(unsigned char* buf, int64_t value) noexcept nogil

# Bytes write_varint would use for `value`.
cdef int varint_size(int64_t value) noexcept nogil

# Read a zigzag varint from buf[0:avail] into *out; returns bytes consumed, or -1 when the
# bytes end before the varint does or it runs past MAX_VARINT_BYTES.
cdef int read_varint(const unsigned char* buf, Py_ssize_t avail, int64_t* out) noexcept nogil
