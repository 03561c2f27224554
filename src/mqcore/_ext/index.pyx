# Floor search over Kafka's sparse index files (docs/format.md "Offset index", "Time index").
#
#   .index      entries of 8 bytes:  int32 relativeOffset | int32 position       (big-endian)
#   .timeindex  entries of 12 bytes: int64 timestamp      | int32 relativeOffset (big-endian)
#
# Keys increase strictly along a file. A lookup finds the last entry whose key is <= target
# ("floor"), searching the last 8 KiB (Kafka's warm section) first: appends and tailing reads hit
# the end of the index, so those pages stay resident and a lookup near the end never faults in
# cold pages from the middle of a large index.
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memcpy

from mqcore._ext.bytes_be cimport load_be32, load_be64


cdef inline int64_t key_at(const unsigned char* base, Py_ssize_t i, Py_ssize_t entry_size,
                           bint key_is_64bit) noexcept nogil:
    if key_is_64bit:
        return <int64_t>load_be64(base + i * entry_size)
    return <int32_t>load_be32(base + i * entry_size)


cdef inline Py_ssize_t floor_in(const unsigned char* base, Py_ssize_t lo, Py_ssize_t hi,
                                Py_ssize_t entry_size, bint key_is_64bit,
                                int64_t target) noexcept nogil:
    """Largest i in [lo, hi] with key(i) <= target, given key(lo) <= target; binary search."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        if key_at(base, mid, entry_size, key_is_64bit) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


cdef Py_ssize_t floor_entry(const unsigned char* base, Py_ssize_t entries, Py_ssize_t entry_size,
                            bint key_is_64bit, int64_t target) noexcept nogil:
    """Index of the last entry with key <= target, or -1 when there is none."""
    cdef Py_ssize_t warm_first
    if entries <= 0 or key_at(base, 0, entry_size, key_is_64bit) > target:
        return -1
    warm_first = entries - WARM_SECTION_BYTES // entry_size
    if warm_first < 0:
        warm_first = 0
    if key_at(base, warm_first, entry_size, key_is_64bit) <= target:
        return floor_in(base, warm_first, entries - 1, entry_size, key_is_64bit, target)
    return floor_in(base, 0, warm_first, entry_size, key_is_64bit, target)


cdef Py_ssize_t checked_entries(const unsigned char[::1] buf, Py_ssize_t entries,
                                Py_ssize_t entry_size) except -1:
    if entries < 0 or entries * entry_size > buf.shape[0]:
        raise ValueError(f"{entries} entries of {entry_size} bytes do not fit a buffer of "
                         f"{buf.shape[0]} bytes")
    return entries


def offset_floor(const unsigned char[::1] buf not None, Py_ssize_t entries, int64_t relative_offset):
    """(relativeOffset, position) of the last .index entry with offset <= target, else None."""
    cdef Py_ssize_t i
    checked_entries(buf, entries, OFFSET_ENTRY_SIZE)
    if entries == 0:
        return None
    with nogil:
        i = floor_entry(&buf[0], entries, OFFSET_ENTRY_SIZE, False, relative_offset)
    if i < 0:
        return None
    return (<int32_t>load_be32(&buf[i * OFFSET_ENTRY_SIZE]),
            <int32_t>load_be32(&buf[i * OFFSET_ENTRY_SIZE + 4]))


def time_floor(const unsigned char[::1] buf not None, Py_ssize_t entries, int64_t timestamp):
    """(timestamp, relativeOffset) of the last .timeindex entry with timestamp <= target, else None."""
    cdef Py_ssize_t i
    checked_entries(buf, entries, TIME_ENTRY_SIZE)
    if entries == 0:
        return None
    with nogil:
        i = floor_entry(&buf[0], entries, TIME_ENTRY_SIZE, True, timestamp)
    if i < 0:
        return None
    return (<int64_t>load_be64(&buf[i * TIME_ENTRY_SIZE]),
            <int32_t>load_be32(&buf[i * TIME_ENTRY_SIZE + 8]))


def offset_entry(const unsigned char[::1] buf not None, Py_ssize_t i):
    """(relativeOffset, position) of entry i."""
    if i < 0 or (i + 1) * OFFSET_ENTRY_SIZE > buf.shape[0]:
        raise IndexError(f"offset index entry {i} out of range")
    return (<int32_t>load_be32(&buf[i * OFFSET_ENTRY_SIZE]),
            <int32_t>load_be32(&buf[i * OFFSET_ENTRY_SIZE + 4]))


def time_entry(const unsigned char[::1] buf not None, Py_ssize_t i):
    """(timestamp, relativeOffset) of entry i."""
    if i < 0 or (i + 1) * TIME_ENTRY_SIZE > buf.shape[0]:
        raise IndexError(f"time index entry {i} out of range")
    return (<int64_t>load_be64(&buf[i * TIME_ENTRY_SIZE]),
            <int32_t>load_be32(&buf[i * TIME_ENTRY_SIZE + 8]))


def count_offset_entries(const unsigned char[::1] buf not None, int64_t max_relative_offset,
                         int64_t max_position):
    """Number of leading .index entries that are valid: offsets strictly increasing and within
    [0, max_relative_offset], positions strictly increasing, above 0 (the first entry always
    follows at least index_interval_bytes of data) and below max_position.

    A preallocated file that was never trimmed reads as a run of zero entries after the real
    ones; the first entry that breaks the order ends the count (KAFKA-12734's trap).
    """
    cdef Py_ssize_t n = buf.shape[0] // OFFSET_ENTRY_SIZE
    if n == 0:
        return 0
    with nogil:
        n = valid_offset_prefix(&buf[0], n, max_relative_offset, max_position)
    return n


def count_time_entries(const unsigned char[::1] buf not None, int64_t max_relative_offset):
    """Number of leading .timeindex entries that are valid: timestamps strictly increasing and
    >= 0, relative offsets non-decreasing within [0, max_relative_offset]."""
    cdef Py_ssize_t n = buf.shape[0] // TIME_ENTRY_SIZE
    if n == 0:
        return 0
    with nogil:
        n = valid_time_prefix(&buf[0], n, max_relative_offset)
    return n


cdef Py_ssize_t valid_offset_prefix(const unsigned char* b, Py_ssize_t n, int64_t max_rel,
                                    int64_t max_position) noexcept nogil:
    cdef Py_ssize_t i
    cdef int64_t rel, pos, prev_rel = -1, prev_pos = 0
    for i in range(n):
        rel = <int32_t>load_be32(b + i * OFFSET_ENTRY_SIZE)
        pos = <int32_t>load_be32(b + i * OFFSET_ENTRY_SIZE + 4)
        if rel <= prev_rel or pos <= prev_pos or rel > max_rel or pos >= max_position:
            return i
        prev_rel = rel
        prev_pos = pos
    return n


cdef Py_ssize_t valid_time_prefix(const unsigned char* b, Py_ssize_t n,
                                  int64_t max_rel) noexcept nogil:
    cdef Py_ssize_t i
    cdef int64_t ts, rel, prev_ts = -1, prev_rel = -1
    for i in range(n):
        ts = <int64_t>load_be64(b + i * TIME_ENTRY_SIZE)
        rel = <int32_t>load_be32(b + i * TIME_ENTRY_SIZE + 8)
        if ts <= prev_ts or rel < prev_rel or rel < 0 or rel > max_rel:
            return i
        prev_ts = ts
        prev_rel = rel
    return n


def all_zero(const unsigned char[::1] buf not None):
    """Whether every byte of `buf` is zero (the untouched tail of a preallocated index),
    without copying it: a word at a time, nogil."""
    cdef Py_ssize_t n = buf.shape[0], i = 0
    cdef const unsigned char* p = &buf[0] if n else NULL
    cdef uint64_t acc = 0, w
    with nogil:
        while i + 8 <= n:
            memcpy(&w, p + i, 8)
            acc |= w
            i += 8
            if (i & 4095) == 0 and acc:
                break
        while i < n and acc == 0:
            acc |= p[i]
            i += 1
    return acc == 0
