# Kafka v2 (magic 2) record batches: the leaf parsers (records.pxi), Message (message.pxi) and
# decoding whole batches (here); encoding is encode.pyx, whose names this module re-exports.
# Layout (docs/format.md "Record batch"; REFERENCE.md "Kafka record batch v2"), big-endian:
#
#    0  baseOffset            int64   assigned by the log at append (outside the CRC)
#    8  batchLength           int32   bytes after this field = total - 12
#   12  partitionLeaderEpoch  int32   -1: no leader epoch (outside the CRC)
#   16  magic                 int8    2
#   17  crc                   uint32  CRC-32C of bytes [21, end)
#   21  attributes            int16   bits 0-2 codec, 3 LogAppendTime, 4 transactional,
#                                     5 control, 6 hasDeleteHorizonMs
#   23  lastOffsetDelta       int32
#   27  baseTimestamp         int64   first record's timestamp (delete horizon when bit 6)
#   35  maxTimestamp          int64   every record's timestamp under LogAppendTime
#   43  producerId            int64   -1 when unused
#   51  producerEpoch         int16   -1
#   53  baseSequence          int32   -1
#   57  recordsCount          int32   never compressed
#   61  records...                    with a codec: one compressed stream of all records
#
# Record (zigzag varints, see varint.pyx):
#   length varint (body bytes after this field) | attributes int8 = 0 | timestampDelta varlong
#   | offsetDelta varint | keyLen varint (-1 null) | key | valueLen varint (-1 null) | value
#   | headerCount varint | per header: keyLen varint | UTF-8 key | valueLen varint (-1 null) | value
#
# The parsers and Message are included (.pxi), not separate modules: decode_messages calls the
# record cursor and make_message once per record, and inside one module the C compiler inlines
# them into its loop; across modules every call would go through a function pointer.
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport INT64_MAX, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp

from mqcore._ext.bytes_be cimport load_be16, load_be32, load_be64
from mqcore._ext.crc32c cimport crc32c_extend
from mqcore._ext.ids cimport encode_id, uid_chars
from mqcore._ext.varint cimport read_varint

from mqcore.compression import decompress
from mqcore.errors import CorruptRecordError

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

include "records.pxi"
include "message.pxi"

# ---------------------------------------------------------------------------------------------
# Decoding whole batches from a buffer
# ---------------------------------------------------------------------------------------------

cdef class BatchInfo:
    """A batch header as Python sees it (tools, tests, the storage layer's scans)."""

    cdef readonly int64_t base_offset
    cdef readonly int32_t batch_length
    cdef readonly int32_t leader_epoch
    cdef readonly int magic
    cdef readonly uint32_t crc
    cdef readonly int attributes
    cdef readonly int32_t last_offset_delta
    cdef readonly int64_t base_timestamp
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t producer_id
    cdef readonly int producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly int32_t records_count

    @property
    def last_offset(self):
        return wrap_add(self.base_offset, self.last_offset_delta)

    @property
    def size(self):
        return LOG_OVERHEAD + <int64_t>self.batch_length

    @property
    def codec(self):
        return self.attributes & ATTR_CODEC_MASK

    @property
    def is_control(self):
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self):
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def timestamp_type(self):
        return 1 if self.attributes & ATTR_LOG_APPEND_TIME else 0


cdef BatchInfo make_info(const BatchHeader* h):
    cdef BatchInfo b = BatchInfo.__new__(BatchInfo)
    b.base_offset = h.base_offset
    b.batch_length = h.batch_length
    b.leader_epoch = h.leader_epoch
    b.magic = h.magic
    b.crc = h.crc
    b.attributes = h.attributes
    b.last_offset_delta = h.last_offset_delta
    b.base_timestamp = h.base_timestamp
    b.max_timestamp = h.max_timestamp
    b.producer_id = h.producer_id
    b.producer_epoch = h.producer_epoch
    b.base_sequence = h.base_sequence
    b.records_count = h.records_count
    return b


cdef inline object corrupt(int code, object source, int64_t file_pos):
    return CorruptRecordError(error_text(code), path=source, position=file_pos)


def read_batch_info(const unsigned char[::1] buf not None, Py_ssize_t pos=0, bint verify_crc=True,
                    source=None, int64_t file_pos=0):
    """Validate the batch at buf[pos:] and return its BatchInfo.

    Returns None when the buffer ends before the batch does (the caller reads more or treats it as
    the end of data); raises CorruptRecordError for anything else that is wrong.
    """
    cdef BatchHeader h
    cdef int rc
    if pos < 0 or pos > buf.shape[0]:
        raise ValueError(f"position {pos} outside a buffer of {buf.shape[0]} bytes")
    if pos == buf.shape[0]:
        return None
    if not walk_batch(&buf[pos], buf.shape[0] - pos, &h, verify_crc, source, file_pos + pos):
        return None
    return make_info(&h)


def peek_batch_header(const unsigned char[::1] buf not None, Py_ssize_t pos=0):
    """Parse the 61 header bytes at buf[pos:] without needing the rest of the batch.

    Returns None when fewer than 61 bytes are there or the magic byte is not 2. Nothing past the
    header is checked (no CRC): for index sanity checks and tools, never for returning records.
    """
    cdef BatchHeader h
    if pos < 0 or pos > buf.shape[0]:
        raise ValueError(f"position {pos} outside a buffer of {buf.shape[0]} bytes")
    if buf.shape[0] - pos < BATCH_HEADER_SIZE:
        return None
    parse_batch_header(&buf[pos], buf.shape[0] - pos, &h)
    if h.magic != 2 or h.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        return None
    return make_info(&h)


def decode_messages(const unsigned char[::1] buf not None, Py_ssize_t pos, str topic,
                    int partition, int64_t min_offset, Py_ssize_t max_records, list out,
                    bint verify_crc=True, Py_ssize_t max_decompressed=256 << 20,
                    source=None, int64_t file_pos=0, int64_t max_offset=INT64_MAX,
                    bint include_control=False):
    """Append to `out` the Messages of the complete batches in buf[pos:].

    Records below `min_offset` or above `max_offset` are skipped; control batches are skipped
    unless asked for. Stops after `max_records` messages, at the first incomplete batch, or at a
    batch starting past `max_offset`. Returns (next_pos, next_offset): the position after the
    last batch looked at, and the offset after the last record returned or skipped.
    """
    cdef BatchHeader h
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    cdef Py_ssize_t n = buf.shape[0]
    cdef const unsigned char* batch
    cdef int64_t offset, next_offset = min_offset
    cdef Py_ssize_t produced = 0
    cdef bint stop = False
    cdef Message m
    if pos < 0 or pos > n:
        raise ValueError(f"position {pos} outside a buffer of {n} bytes")
    while pos < n and produced < max_records:
        batch = &buf[pos]
        if not walk_batch(batch, n - pos, &h, verify_crc, source, file_pos + pos):
            break
        if h.base_offset > max_offset:
            break
        if (h.base_offset + h.last_offset_delta < min_offset
                or (h.attributes & ATTR_CONTROL and not include_control)):
            pos += LOG_OVERHEAD + h.batch_length
            next_offset = max(next_offset, h.base_offset + h.last_offset_delta + 1)
            continue
        area = open_records(batch, &h, max_decompressed, &c)
        while True:
            rc = next_record(&c, &r)
            if rc == 0:
                rc = cursor_finish(&c)
                if rc != OK:
                    raise corrupt(rc, source, file_pos + pos)
                break
            if rc < 0:
                raise corrupt(rc, source, file_pos + pos)
            offset = h.base_offset + r.offset_delta
            if offset < min_offset:
                continue
            if offset > max_offset or produced >= max_records:
                stop = True
                break
            out.append(make_message(topic, partition, &h, &r))
            produced += 1
            next_offset = offset + 1
        if stop:
            # the batch holds more records than were wanted: the next read starts at
            # next_offset. A batch that is read is checked whole all the same (as get() checks
            # it), however little of it a caller wanted
            rc = cursor_drain(&c)
            if rc != OK:
                raise corrupt(rc, source, file_pos + pos)
            break
        next_offset = max(next_offset, h.base_offset + h.last_offset_delta + 1)
        pos += LOG_OVERHEAD + h.batch_length
    return pos, next_offset


# encoding lives in encode.pyx; its names stay importable from here
from mqcore._ext.encode import EncodedBatch, encode_batch  # noqa: E402
