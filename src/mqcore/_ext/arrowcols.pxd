# Arrow column builders (arrowcols.pyx): declared for the kernels that fill them directly (the
# search kernel hands the records it matches over with no Python object per record).
cimport cython
from libc.stdint cimport int32_t, int64_t

from mqcore._ext.batch cimport BatchHeader, RecordView


cdef struct Grow:
    char* data
    Py_ssize_t len
    Py_ssize_t cap
    int kind                # which column buffer (kind_hint), 0: none


cdef struct Column:        # one nullable binary column
    Grow validity
    Grow offsets
    Grow data
    Py_ssize_t nulls


@cython.final  # never subclassed: its cdef methods are called directly, not through a vtable
cdef class ArrowColumns:
    cdef Column keys
    cdef Column values
    cdef Grow offsets
    cdef Grow timestamps
    cdef Grow ts_types
    cdef Grow header_lists
    cdef Grow header_key_offsets
    cdef Grow header_key_data
    cdef Column header_values
    cdef readonly Py_ssize_t num_rows
    cdef readonly Py_ssize_t num_headers
    cdef readonly bint include_headers
    cdef Py_ssize_t max_decompressed

    cdef int start(self) except -1
    cdef void free_buffers(self) noexcept
    cdef Py_ssize_t held_bytes(self) noexcept
    cdef int add_headers(self, const RecordView* r, object source, int64_t file_pos) except -1
    # Append record r of the batch with header h as the next row (its offset `offset`);
    # ValueError when the data would pass Arrow's int32 offsets.
    cdef int put_record(self, const BatchHeader* h, const RecordView* r, int64_t offset,
                        object source, int64_t file_pos) except -1
