# Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2): seed 0x9747b28c, m 0x5bd1e995,
# r 24, little-endian 4-byte words, tail bytes mixed in reverse. The default partitioner maps a
# key to (murmur2(key) & 0x7fffffff) % partitions, so keyed messages land on the partition Kafka's
# producer would pick.
#
# xxHash64 (xxh64_impl.h) hashes message keys, unique IDs and tags for the query indexes.
from libc.stdint cimport int32_t, uint32_t, uint64_t


cdef int32_t murmur2(const unsigned char* data, Py_ssize_t n) noexcept nogil:
    cdef uint32_t m = <uint32_t>0x5bd1e995
    cdef uint32_t h = (<uint32_t>0x9747b28c) ^ <uint32_t>n
    cdef uint32_t k
    cdef Py_ssize_t i, words = n // 4, tail = n & 3
    for i in range(words):
        k = (<uint32_t>data[4 * i] | (<uint32_t>data[4 * i + 1] << 8)
             | (<uint32_t>data[4 * i + 2] << 16) | (<uint32_t>data[4 * i + 3] << 24))
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
    i = words * 4
    if tail == 3:
        h ^= (<uint32_t>data[i + 2]) << 16
    if tail >= 2:
        h ^= (<uint32_t>data[i + 1]) << 8
    if tail >= 1:
        h ^= data[i]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return <int32_t>h


def murmur2_hash(const unsigned char[::1] key not None):
    """Kafka's murmur2 of `key` as a signed 32-bit int (equal to Utils.murmur2 in Java)."""
    if key.shape[0] == 0:
        return murmur2(NULL, 0)
    return murmur2(&key[0], key.shape[0])


def kafka_partition(const unsigned char[::1] key not None, int partitions):
    """The partition Kafka's default partitioner picks for a non-null key."""
    if partitions <= 0:
        raise ValueError(f"partitions must be > 0, not {partitions}")
    cdef int32_t h = murmur2(&key[0] if key.shape[0] else NULL, key.shape[0])
    return (h & 0x7FFFFFFF) % partitions

# the seeds of hashing.pxd, for the query layer's lookups
KEY_SEED = SEED_KEY
UID_SEED = SEED_UID
TAG_SEED = SEED_TAG


def xxh64_hash(const unsigned char[::1] data not None, uint64_t seed=0):
    """xxHash64 of `data` with `seed` (equal to the reference XXH64)."""
    if data.shape[0] == 0:
        return xxh64(NULL, 0, seed)
    return xxh64(&data[0], data.shape[0], seed)
