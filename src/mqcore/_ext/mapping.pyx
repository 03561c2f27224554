# Read-only, shared mmap of a segment's .log (docs/architecture.md "Read path").
#
# The mapping may be longer than the file: a writable segment is mapped to its roll size once, so
# the pages of bytes appended later become readable without remapping. Readers only touch bytes
# below a size they saw after the bytes were written, so they never touch a page past the end of
# the file (which would raise SIGBUS). Files only shrink at recovery, before any reader exists,
# or when a failed append is cut back, above every size a reader saw.
#
# Every buffer handed out is counted; close() unmaps at once if none is out, else when the last
# one is released, so a reader in another thread never reads unmapped memory.
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from libc.errno cimport errno
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, mmap, munmap

from mqcore.errors import StoreClosedError


cdef class MappedFile:
    """mmap(fd, length) read-only; a buffer over [0, length) once opened."""

    def __cinit__(self, int fd, Py_ssize_t length):
        cdef void* p
        if length <= 0:
            raise ValueError(f"mapping length must be > 0, not {length}")
        p = mmap(NULL, <size_t>length, PROT_READ, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            import os
            raise OSError(errno, os.strerror(errno))
        self.base = <const unsigned char*>p
        self.length = length

    cdef void unmap(self) noexcept:
        if self.base != NULL:
            munmap(<void*>self.base, <size_t>self.length)
            self.base = NULL

    def close(self):
        """Unmap now, or when the last buffer handed out is released."""
        self.closing = True
        if self.exports == 0:
            self.unmap()

    @property
    def closed(self):
        return self.base == NULL

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("a segment mapping is read-only")
        if self.base == NULL or self.closing:
            raise StoreClosedError("the segment was closed")
        PyBuffer_FillInfo(view, self, <void*>self.base, self.length, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1
        if self.closing and self.exports == 0:
            self.unmap()

    def __dealloc__(self):
        self.unmap()
