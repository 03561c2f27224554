# Sparse index searches over mmap'd big-endian entries (docs/format.md "Offset index", "Time index").
from libc.stdint cimport int64_t

cdef enum:
    OFFSET_ENTRY_SIZE = 8          # int32 relativeOffset, int32 position
    TIME_ENTRY_SIZE = 12           # int64 timestamp, int32 relativeOffset
    WARM_SECTION_BYTES = 8192      # Kafka's hot tail, searched first

cdef Py_ssize_t floor_entry(const unsigned char* base, Py_ssize_t entries, Py_ssize_t entry_size,
                            bint key_is_64bit, int64_t target) noexcept nogil
