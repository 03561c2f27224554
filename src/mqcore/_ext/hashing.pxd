# Hashes over raw bytes: Kafka's murmur2 (default partitioner).
from libc.stdint cimport int32_t

cdef int32_t murmur2(const unsigned char* data, Py_ssize_t n) noexcept nogil
