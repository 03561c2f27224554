# Kafka v2 record batches: header parsing and a record cursor that arrowcols.pyx also drives.
cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t

# the layout constants (wire.pxd), declared there so that encode.pyx needs no runtime import of
# this module; cimport them from here or from there
from mqcore._ext.wire cimport (ATTR_CODEC_MASK, ATTR_CONTROL, ATTR_DELETE_HORIZON,
                               ATTR_LOG_APPEND_TIME, ATTR_TRANSACTIONAL, BATCH_HEADER_SIZE,
                               CRC_OFFSET, CRC_START, LOG_OVERHEAD, MAGIC_OFFSET, MAX_BATCH_BYTES)

# Result codes of the leaf parsers; error_text() turns them into words.
cdef enum:
    OK = 0
    E_SHORT = -1                 # fewer bytes than the structure needs (end of data)
    E_LENGTH = -2                # batchLength outside [49, limit]
    E_MAGIC = -3
    E_CRC = -4
    E_CODEC = -5
    E_COUNT = -6                 # recordsCount / lastOffsetDelta inconsistent
    E_VARINT = -7
    E_RECORD_LENGTH = -8         # a record's length runs past the batch or disagrees with its body
    E_FIELD_LENGTH = -9          # key/value/header length < -1 or past the record
    E_OFFSET_DELTA = -10         # offset deltas not increasing or past lastOffsetDelta
    E_TRAILING = -11             # bytes left after recordsCount records
    E_OFFSET_ORDER = -12         # batch offsets go backwards within a segment
    E_HEADER_COUNT = -13
    E_BASE_OFFSET = -14          # baseOffset + lastOffsetDelta + 1 past INT64_MAX

cdef struct BatchHeader:
    int64_t base_offset
    int32_t batch_length
    int32_t leader_epoch
    int8_t magic
    uint32_t crc
    int16_t attributes
    int32_t last_offset_delta
    int64_t base_timestamp
    int64_t max_timestamp
    int64_t producer_id
    int16_t producer_epoch
    int32_t base_sequence
    int32_t records_count

# One record's fields as pointers into the (decompressed) records area; nothing is copied.
cdef struct RecordView:
    int64_t offset_delta
    int64_t timestamp_delta
    const unsigned char* key
    Py_ssize_t key_len           # -1: null key
    const unsigned char* value
    Py_ssize_t value_len         # -1: null value (tombstone)
    const unsigned char* headers
    Py_ssize_t headers_len
    Py_ssize_t header_count

cdef struct RecordCursor:
    const unsigned char* p
    const unsigned char* end
    Py_ssize_t remaining
    int64_t prev_delta
    int64_t last_offset_delta

cdef struct HeaderView:
    const unsigned char* key
    Py_ssize_t key_len
    const unsigned char* value
    Py_ssize_t value_len         # -1: null header value

cdef int parse_batch_header(const unsigned char* p, Py_ssize_t avail, BatchHeader* h) noexcept nogil
cdef int check_batch(const unsigned char* p, Py_ssize_t avail, BatchHeader* h,
                     bint verify_crc) noexcept nogil
cdef int walk_batch(const unsigned char* p, Py_ssize_t avail, BatchHeader* h, bint verify_crc,
                    object source, int64_t position) except -1
cdef void cursor_init(RecordCursor* c, const unsigned char* records, Py_ssize_t size,
                      const BatchHeader* h) noexcept nogil
cdef int next_record(RecordCursor* c, RecordView* r) noexcept nogil
cdef int cursor_finish(const RecordCursor* c) noexcept nogil
# Walk the records left (a reader stopped early) and check the batch whole: OK or the error.
cdef int cursor_drain(RecordCursor* c) noexcept nogil
cdef int next_header(const unsigned char** p, const unsigned char* end,
                     HeaderView* hv) noexcept nogil
cdef str error_text(int code)

@cython.final
cdef class Message:
    cdef readonly str topic
    cdef readonly int partition
    cdef readonly int64_t offset
    cdef readonly int64_t timestamp
    cdef readonly int timestamp_type
    cdef readonly object key
    cdef readonly object value
    cdef tuple _headers           # None until first read, then decoded from _raw_headers
    cdef bytes _raw_headers
    cdef Py_ssize_t _header_count
    # share groups (consume/share.py): how many times this record has been handed out, this
    # delivery included; 0 for a message that is not a share-group delivery
    cdef public int delivery_count

cdef Message make_message(str topic, int partition, const BatchHeader* h, const RecordView* r)
cdef object records_area(const unsigned char* batch, const BatchHeader* h, Py_ssize_t max_size)
cdef object open_records(const unsigned char* batch, const BatchHeader* h, Py_ssize_t max_size,
                         RecordCursor* c)


cdef inline int64_t wrap_add(int64_t a, int64_t b) noexcept nogil:
    """a + b wrapping on overflow as Kafka's Java readers do: a timestamp delta read from a file
    may be anything, and must not reach C's signed-overflow undefined behaviour."""
    return <int64_t>(<uint64_t>a + <uint64_t>b)


cdef inline int64_t wrap_mul(int64_t a, int64_t b) noexcept nogil:
    """a * b wrapping on overflow (milliseconds to microseconds of a timestamp from a file)."""
    return <int64_t>(<uint64_t>a * <uint64_t>b)
