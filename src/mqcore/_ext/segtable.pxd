# The segment table of one partition (segtable.pyx): what the point-lookup kernels need to pick
# a segment, owned by storage.Partition and changed only through SegmentTable.splice.
from libc.stdint cimport int64_t

cdef class SegmentTable:
    cdef readonly object lock      # the partition's lock (threading.RLock)
    cdef readonly str topic
    cdef readonly int partition
    cdef readonly list segments    # the partition's segment list itself, oldest first
    cdef int64_t* base_offsets     # segments[i].base_offset, increasing
    cdef Py_ssize_t count          # len(segments)
    cdef Py_ssize_t capacity       # slots allocated in base_offsets
    # the log start offset (storage.Partition sets it; DeleteRecords moves it, inside the first
    # segment too): the kernels answer no offset below it, though its bytes are still there
    cdef public int64_t log_start

    # the index of the segment whose base offset is the floor of `offset` (0 below the first)
    cdef Py_ssize_t floor(self, int64_t offset) noexcept nogil
