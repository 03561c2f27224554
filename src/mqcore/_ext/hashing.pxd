# Hashes over raw bytes: Kafka's murmur2 (default partitioner) and xxHash64 (the query indexes).
from libc.stdint cimport int32_t, int64_t, uint64_t

cdef extern from "xxh64_impl.h" nogil:
    uint64_t xxh64 "mq_xxh64"(const void* data, size_t n, uint64_t seed)

# Each kind of indexed string hashes with its own seed, so a key never shares a hash with a
# unique ID or a tag of the same bytes (docs/format.md "Key index").
cdef enum:
    SEED_KEY = 0                 # record keys and the words of a `keys` header
    SEED_UID = 1                 # the 16 bytes of a unique ID
    SEED_TAG = 2                 # a `tag` header value

    KIND_KEY = 1
    KIND_UID = 2
    KIND_TAG = 3

# One indexable string of one record, as the encoder (or a rebuild) finds it.
cdef struct KeyHit:
    uint64_t hash
    int64_t timestamp
    int32_t offset_delta
    int32_t kind

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
