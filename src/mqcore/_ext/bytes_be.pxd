# Big-endian loads and stores over raw pointers (every Kafka header field is big-endian), and
# prefetch hints. Callers check bounds before calling; these are leaf helpers that cannot fail.
from libc.stdint cimport int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t


cdef inline uint16_t load_be16(const unsigned char* p) noexcept nogil:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t load_be32(const unsigned char* p) noexcept nogil:
    return ((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8)
            | <uint32_t>p[3])


cdef inline uint64_t load_be64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>load_be32(p) << 32) | load_be32(p + 4)


cdef inline void store_be16(unsigned char* p, uint16_t v) noexcept nogil:
    p[0] = <unsigned char>(v >> 8)
    p[1] = <unsigned char>v


cdef inline void store_be32(unsigned char* p, uint32_t v) noexcept nogil:
    p[0] = <unsigned char>(v >> 24)
    p[1] = <unsigned char>(v >> 16)
    p[2] = <unsigned char>(v >> 8)
    p[3] = <unsigned char>v


cdef inline void store_be64(unsigned char* p, uint64_t v) noexcept nogil:
    store_be32(p, <uint32_t>(v >> 32))
    store_be32(p + 4, <uint32_t>v)


# Prefetch hints (prefetch_impl.h): let the misses of a lookup's dependent loads overlap.
cdef extern from "prefetch_impl.h" nogil:
    void mq_prefetch(const void* p) noexcept
    void mq_prefetch_range(const unsigned char* p, Py_ssize_t n) noexcept
