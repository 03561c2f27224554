# Message search over a segment's batches: the per-record predicate other kernels may share.
from libc.stdint cimport int64_t

from mqcore._ext.batch cimport BatchHeader, RecordView

# What a record must satisfy: offset and timestamp windows (half-open), an optional substring of
# the value (and the key when in_key), an optional exact value of the header "tag".
cdef struct SearchFilter:
    int64_t min_offset
    int64_t max_offset
    int64_t min_ts
    int64_t max_ts
    const unsigned char* needle
    Py_ssize_t needle_len        # -1: no content test
    bint in_key
    const unsigned char* tag
    Py_ssize_t tag_len           # -1: no tag test

# 1 when record r of the batch with header h passes f's timestamp, content and tag tests (the
# offset window is the scan's business); 0 otherwise. r's headers were checked by next_record.
cdef int record_matches(const BatchHeader* h, const RecordView* r,
                        const SearchFilter* f) noexcept nogil
