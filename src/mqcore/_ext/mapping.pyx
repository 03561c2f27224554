# Shared mmap of a store file: a segment's .log (read-only; docs/architecture.md "Read path"),
# or an index the writer fills in place (read-write).
#
# Python's mmap module keeps a duplicate of the file's descriptor for as long as the mapping
# lives; this one keeps none (a mapping holds its file by itself), so the descriptors a store
# holds do not grow with the files it has mapped (docs/operations.md "Limits").
#
# The mapping may be longer than the file: a writable segment is mapped to its roll size once, so
# the pages of bytes appended later become readable without remapping. Readers only touch bytes
# below a size they saw after the bytes were written, so they never touch a page past the end of
# the file (which would raise SIGBUS). Files only shrink at recovery, before any reader exists,
# or when a failed append is cut back, above every size a reader saw; a file that must shrink
# otherwise (a trimmed index) is replaced, never cut in place.
#
# Every buffer handed out is counted; close() unmaps at once if none is out, else when the last
# one is released, so a reader in another thread never reads unmapped memory.
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from libc.errno cimport errno
from posix.mman cimport (MAP_FAILED, MAP_SHARED, MS_SYNC, POSIX_MADV_RANDOM, PROT_READ,
                         PROT_WRITE, mmap, msync, munmap, posix_madvise)
from posix.unistd cimport sysconf, _SC_PAGESIZE

from mqcore.errors import StoreClosedError


cdef object os_error():
    import os
    return OSError(errno, os.strerror(errno))


cdef class MappedFile:
    """mmap(fd, length), read-only unless `writable`; a buffer over [0, length) once opened."""

    def __cinit__(self, int fd, Py_ssize_t length, bint writable=False):
        cdef void* p
        if length <= 0:
            raise ValueError(f"mapping length must be > 0, not {length}")
        p = mmap(NULL, <size_t>length, PROT_READ | (PROT_WRITE if writable else 0), MAP_SHARED,
                 fd, 0)
        if p == MAP_FAILED:
            raise os_error()
        self.base = <const unsigned char*>p
        self.length = length
        self.writable = writable

    cdef void unmap(self) noexcept:
        if self.base != NULL:
            munmap(<void*>self.base, <size_t>self.length)
            self.base = NULL

    def close(self):
        """Unmap now, or when the last buffer handed out is released."""
        self.closing = True
        if self.exports == 0:
            self.unmap()

    def flush(self, Py_ssize_t start=0, Py_ssize_t length=-1):
        """msync(MS_SYNC) [start, start + length) (all of it by default): the pages written
        through the mapping reach the file's storage."""
        cdef Py_ssize_t page = sysconf(_SC_PAGESIZE), end
        if self.base == NULL:
            raise StoreClosedError("the mapping was closed")
        end = self.length if length < 0 else min(self.length, start + length)
        start -= start % page
        if start < 0 or end <= start:
            return
        if msync(<void*>(self.base + start), <size_t>(end - start), MS_SYNC) != 0:
            raise os_error()

    def advise_random(self):
        """posix_madvise(POSIX_MADV_RANDOM): the pages are touched at random (a hash table), so
        a page fault reads that page alone, not the device's read-ahead around it (8 MiB of
        zeros on this VM's disk, read into the page cache for nothing). Best effort."""
        if self.base != NULL:
            posix_madvise(<void*>self.base, <size_t>self.length, POSIX_MADV_RANDOM)

    def __len__(self):
        return self.length

    @property
    def closed(self):
        return self.base == NULL

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE and not self.writable:
            raise BufferError("a segment mapping is read-only")
        if self.base == NULL or self.closing:
            raise StoreClosedError("the segment was closed")
        PyBuffer_FillInfo(view, self, <void*>self.base, self.length, not self.writable, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1
        if self.closing and self.exports == 0:
            self.unmap()

    def __dealloc__(self):
        self.unmap()
