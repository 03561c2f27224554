# CRC-32C (Castagnoli) over raw buffers; what other kernels cimport.
from libc.stdint cimport uint32_t

# Extend a finished CRC with more bytes, zlib-style: crc32c_extend(crc32c_extend(0, a), b) equals
# the CRC of a + b. Pre/post inversion happens inside. Leaf kernel: never fails.
cdef uint32_t crc32c_extend(uint32_t crc, const unsigned char* data, size_t n) noexcept nogil
