# Hashes over raw bytes: Kafka's murmur2 (default partitioner) and xxHash64 (the query indexes).
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from "xxh64_impl.h" nogil:
    uint64_t xxh64 "mq_xxh64"(const void* data, size_t n, uint64_t seed)

# Each kind of indexed string hashes with its own seed, so a key never shares a hash with a
# unique ID or a tag of the same bytes (docs/format.md "Key index").
cdef enum:
    SEED_KEY = 0                 # record keys and the words of a `keys` header
    SEED_UID = 1                 # the 16 bytes of a unique ID
    SEED_TAG = 2                 # a `tag` header value
    SEED_RUN = 3                 # the (ms, node) of a run of generated UUIDv7s (uid_run_hash)

    KIND_KEY = 1
    KIND_UID = 2
    KIND_TAG = 3
    KIND_RUN = 4                 # a batch whose records carry consecutive generated UUIDv7s

# A run's key entry keeps its length (at most RUN_COUNT_MAX, "at least" when saturated) in the
# top 16 bits of its stored hash; probes for runs compare the low 48 (docs/format.md "Key index").
cdef enum:
    RUN_COUNT_SHIFT = 48
    RUN_COUNT_MAX = 0xFFFF
cdef extern from *:
    const uint64_t RUN_HASH_MASK "((uint64_t)0xFFFFFFFFFFFFULL)"

# One indexable string of one record, as the encoder (or a rebuild) finds it; or one run: the
# batch's records from offset_delta on carry the UUIDv7s of counters run_first, run_first + 1,
# ... (run_count of them, mod 2**32) with the ms and node of `hash` (uid_run_hash), their
# timestamps within [timestamp, ts_max].
cdef struct KeyHit:
    uint64_t hash
    int64_t timestamp
    int32_t offset_delta
    int32_t kind
    int64_t ts_max               # the largest timestamp the hit covers (= timestamp but a run's)
    uint32_t run_first
    uint32_t run_count


cdef inline bint is_uid_v7(const unsigned char* u) noexcept nogil:
    """Whether the 16 bytes at u carry a UUIDv7's version and variant bits."""
    return (u[6] >> 4) == 7 and (u[8] >> 6) == 2


cdef inline uint32_t v7_counter(const unsigned char* u) noexcept nogil:
    """The 32-bit counter of a UUIDv7 mqcore generated (layout atop encode.pyx)."""
    return ((<uint32_t>(u[6] & 0x0F) << 28) | (<uint32_t>u[7] << 20)
            | (<uint32_t>(u[8] & 0x3F) << 14) | (<uint32_t>u[9] << 6) | (<uint32_t>u[10] >> 2))


cdef inline uint64_t uid_run_hash(const unsigned char* u) noexcept nogil:
    """The low 48 bits of xxHash64 (SEED_RUN) of a UUIDv7's unix ms and 42 node bits: equal
    for every ID one process generates within one ms, whatever the counter."""
    cdef unsigned char k[12]
    memcpy(k, u, 6)
    k[6] = u[10] & 0x03
    memcpy(k + 7, u + 11, 5)
    return xxh64(k, 12, SEED_RUN) & RUN_HASH_MASK

cdef int32_t murmur2(const unsigned char* data, Py_ssize_t n) noexcept nogil


cdef inline Py_ssize_t next_word(const unsigned char* p, Py_ssize_t n, Py_ssize_t* at) noexcept nogil:
    """Length of the next space-separated word of p[:n] from *at (0: none left); *at moves past
    it and the word starts at *at - length. A `keys` header lists its keys this way."""
    cdef Py_ssize_t i = at[0], start
    while i < n and p[i] == 32:
        i += 1
    start = i
    while i < n and p[i] != 32:
        i += 1
    at[0] = i
    return i - start
