# C declarations of crc32c_impl.h (CRC-32C kernels); only crc32c.pyx cimports these.
from libc.stdint cimport uint32_t

cdef extern from "crc32c_impl.h" nogil:
    # Build the tables and pick the implementation once; idempotent.
    void mq_crc32c_init()
    # Finished CRC of data[0:n] continuing from the finished CRC `crc`, best implementation.
    uint32_t mq_crc32c_extend(uint32_t crc, const unsigned char* data, size_t n)
    # Same, always with the slice-by-8 software tables.
    uint32_t mq_crc32c_extend_sw(uint32_t crc, const unsigned char* data, size_t n)
    # "sse4.2+vpclmulqdq", "sse4.2", "armv8-crc" or "software".
    const char* mq_crc32c_implementation()
    bint mq_crc32c_hardware_accelerated()
