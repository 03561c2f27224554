# CRC-32C (Castagnoli) over raw buffers; what other kernels cimport.
from libc.stdint cimport uint32_t

# Extend a finished CRC with more bytes, zlib-style: crc32c_extend(crc32c_extend(0, a), b) equals
# the CRC of a + b. Pre/post inversion happens inside. Leaf kernel: never fails.
cdef uint32_t crc32c_extend(uint32_t crc, const unsigned char* data, size_t n) noexcept nogil

# The CRC of a + b from crc(a), crc(b) and len(b): a checksum computed piece by piece in any
# order (the batch header's CRC part is known only after the records were checksummed).
cdef uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) noexcept nogil
