# A read-only mapping of a segment's .log that owns its memory for its whole life.

cdef class MappedFile:
    cdef const unsigned char* base
    cdef readonly Py_ssize_t length
    cdef Py_ssize_t exports
    cdef bint closing
    cdef void unmap(self) noexcept
