# A shared mapping of a store file that owns its memory for its whole life and keeps no
# descriptor (read-only .log mappings; read-write index mappings).

cdef class MappedFile:
    cdef const unsigned char* base
    cdef readonly Py_ssize_t length
    cdef readonly bint writable
    cdef Py_ssize_t exports
    cdef bint closing
    cdef void unmap(self) noexcept
