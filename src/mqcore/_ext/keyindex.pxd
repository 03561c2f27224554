# The per-segment key index (keyindex.pyx): the table type and its C-level probe, which the
# point-lookup kernel (lookup.pyx) drives without building Python tuples per entry.
cimport cython
from libc.stdint cimport int64_t, uint32_t, uint64_t

from mqcore._ext.hashing cimport KeyHit

# One key entry whose full hash matched: its relative offset, its batch's position, the bounds
# of its record's timestamp (equal unless the stored delta saturated) and where it was found.
cdef struct EntryHit:
    int64_t rel_offset
    int64_t position
    int64_t ts_lo
    int64_t ts_hi
    Py_ssize_t source             # which table of the probe (its index in the list)
    Py_ssize_t step               # the entry's rank among that table's matches, newest first

# A growable array of EntryHits: `items` starts as the caller's buffer (or NULL) and moves to
# PyMem memory when it grows (on_heap); hits_free releases that.
cdef struct HitArray:
    EntryHit* items
    Py_ssize_t count
    Py_ssize_t capacity
    bint on_heap

@cython.final
cdef class KeyTable:
    cdef const unsigned char[::1] view
    cdef unsigned char* base
    cdef bint writable
    cdef readonly uint32_t slot_count
    cdef readonly uint32_t key_capacity
    cdef readonly uint32_t tag_capacity
    cdef readonly uint32_t key_count
    cdef readonly uint32_t tag_count
    cdef readonly bint complete
    cdef readonly int64_t base_timestamp
    cdef readonly int64_t covered_position
    cdef readonly int64_t min_timestamp
    cdef readonly int64_t max_timestamp
    cdef unsigned char* slots
    cdef unsigned char* keys
    cdef unsigned char* tags

    cdef int check_open(self, bint write) except -1
    cpdef uint32_t content_crc(self) except? 0xFFFFFFFF
    cdef int heads_match(self) except -1
    cdef void note_time(self, int64_t ts) noexcept
    cdef int insert_hit(self, const KeyHit* h, int64_t rel_offset, int64_t position) except -1

cdef int hits_reserve(HitArray* a, Py_ssize_t more) except -1
cdef void hits_free(HitArray* a) noexcept

# Append to `out` the entries carrying this full hash in each KeyTable of `tables` (None: no
# table), newest first per table, at most max_entries per table, walking the chains side by
# side; returns how many were added. A damaged slot or chain raises CorruptIndexError.
cdef Py_ssize_t probe_tables(list tables, uint64_t hash, Py_ssize_t max_entries,
                             HitArray* out) except -1
