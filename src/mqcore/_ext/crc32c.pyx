# CRC-32C (Castagnoli), the checksum of Kafka's v2 record batches; C kernels in crc32c_impl.h.
#
#   reflected polynomial 0x82F63B78, initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF; chaining is
#   zlib-style: crc32c(b, crc32c(a)) == crc32c(a + b).
#   software: slice-by-8 tables. Hardware: SSE4.2 CRC32 (x86_64) or ARMv8 CRC32C (aarch64),
#   picked at import; long buffers run three independent CRC chains over adjacent blocks and
#   join them with "append N zero bytes" shift tables. x86_64 CPUs with AVX2 + VPCLMULQDQ also
#   fold part of each 16 KiB block with carry-less multiplies, alongside the chains.
#   MQCORE_CRC32C=software|sse4.2|armv8-crc picks a slower kernel (tests, benchmarks).
#
# Test vectors:
#   b""                  -> 0
#   b"123456789"         -> 0xE3069283
#   b"Some String"       -> 608512271 (0x2445D70F, Kafka's Crc32CTest)
#   32 zero bytes        -> 0x8A9136AA
#   32 0xFF bytes        -> 0x62A8AB43
cimport cython
from libc.stdint cimport uint32_t

from mqcore._ext._crc32c_c cimport (
    mq_crc32c_extend,
    mq_crc32c_extend_sw,
    mq_crc32c_hardware_accelerated,
    mq_crc32c_implementation,
    mq_crc32c_init,
)

# Buffers at least this long are checksummed without the GIL; below it the release costs more
# than it lets other threads do.
cdef enum:
    NOGIL_MIN_BYTES = 64 * 1024

mq_crc32c_init()


cdef uint32_t crc32c_extend(uint32_t crc, const unsigned char* data, size_t n) noexcept nogil:
    return mq_crc32c_extend(crc, data, n)


@cython.boundscheck(False)
def crc32c(const unsigned char[::1] data not None, uint32_t crc=0):
    """CRC-32C of `data` (any C-contiguous byte buffer), continuing from the CRC `crc`.

    Uses the CPU's CRC instruction when it has one; releases the GIL for buffers of 64 KiB or
    more.
    """
    cdef size_t n = <size_t>data.shape[0]
    if n == 0:
        return crc
    if n >= NOGIL_MIN_BYTES:
        with nogil:
            crc = mq_crc32c_extend(crc, &data[0], n)
        return crc
    return mq_crc32c_extend(crc, &data[0], n)


@cython.boundscheck(False)
def crc32c_software(const unsigned char[::1] data not None, uint32_t crc=0):
    """CRC-32C of `data` with the portable table code: the reference the hardware path is
    tested against."""
    cdef size_t n = <size_t>data.shape[0]
    if n == 0:
        return crc
    if n >= NOGIL_MIN_BYTES:
        with nogil:
            crc = mq_crc32c_extend_sw(crc, &data[0], n)
        return crc
    return mq_crc32c_extend_sw(crc, &data[0], n)


def hardware_accelerated():
    """Whether crc32c() uses a CPU CRC instruction on this machine."""
    return <bint>mq_crc32c_hardware_accelerated()


def implementation():
    """Which kernel crc32c() runs: "sse4.2+vpclmulqdq", "sse4.2", "armv8-crc" or "software"."""
    return mq_crc32c_implementation().decode("ascii")
