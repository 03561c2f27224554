# The segment table of one partition: the list of its segments with their base offsets in a C
# array and the partition lock, which the point-lookup kernels (lookup.pyx) are handed instead
# of the storage layer's Partition object (docs/architecture.md "Who imports whom").
#
# storage.Partition owns one and changes its segment list only through splice(), under the
# partition lock, so the kernels read the list, the base offsets and the lock without reaching
# into the partition's fields. What changes inside a listed segment (its size and next offset
# as appends land, its mapping when it is remapped, its offset index as it grows, its key table
# when first built) is read from the segment itself, through the public names listed in
# segtable.pyi (`TableSegment`), under the same lock: copying those here would be a second copy
# of state the segment updates on every append, which could go stale.
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int64_t
from libc.string cimport memmove


cdef class SegmentTable:
    """The segments of one partition in base-offset order, and the partition's lock.

    `segments` is the partition's list itself; change it only with splice() (with the lock
    held), which keeps the base offsets beside it."""

    def __cinit__(self, lock not None, str topic not None, int partition):
        self.lock = lock
        self.topic = topic
        self.partition = partition
        self.segments = []
        self.base_offsets = NULL
        self.count = 0
        self.capacity = 0
        self.log_start = 0

    def __dealloc__(self):
        PyMem_Free(self.base_offsets)

    cdef Py_ssize_t floor(self, int64_t offset) noexcept nogil:
        cdef Py_ssize_t lo = 0, hi = self.count, mid
        while lo < hi:
            mid = (lo + hi) // 2
            if offset < self.base_offsets[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo - 1 if lo > 0 else 0

    def splice(self, Py_ssize_t start, Py_ssize_t stop, list new not None):
        """segments[start:stop] = new, and the same for the base offsets (call with the lock
        held). The bases must stay strictly increasing: a list that breaks that is refused
        before anything changes."""
        cdef Py_ssize_t k = len(new), i, n
        cdef int64_t* grown
        if not 0 <= start <= stop <= self.count:
            raise IndexError(f"splice [{start}, {stop}) outside the {self.count} segments")
        n = self.count - (stop - start) + k
        bases = [seg.base_offset for seg in new]
        for i in range(k):
            if (i and bases[i] <= bases[i - 1]) or (i == 0 and start and
                                                   bases[0] <= self.base_offsets[start - 1]):
                raise ValueError(f"segment base offsets must increase ({bases[i]} out of order)")
        if k and stop < self.count and bases[k - 1] >= self.base_offsets[stop]:
            raise ValueError(f"segment base offsets must increase ({bases[k - 1]} out of order)")
        if n > self.capacity:
            grown = <int64_t*>PyMem_Realloc(self.base_offsets, max(n, 2 * self.capacity, 8)
                                            * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError()
            self.base_offsets = grown
            self.capacity = max(n, 2 * self.capacity, 8)
        memmove(self.base_offsets + start + k, self.base_offsets + stop,
                (self.count - stop) * sizeof(int64_t))
        for i in range(k):
            self.base_offsets[start + i] = bases[i]
        self.segments[start:stop] = new
        self.count = n

    def floor_index(self, int64_t offset):
        """The index of the segment whose base offset is the floor of `offset` (0 below the
        first segment)."""
        return self.floor(offset)

    def bases(self):
        """The base offsets, oldest segment first."""
        return [self.base_offsets[i] for i in range(self.count)]

    def __len__(self):
        return self.count
