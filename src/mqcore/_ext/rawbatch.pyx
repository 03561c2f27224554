# Client-built v2 record batches handed to the log as bytes (mqcore.log's embedding API): check a
# batch whole (header, CRC, every record's framing) and stamp the fields the log assigns in
# place, without re-encoding. Layout: batch.pyx's schema comment; docs/format.md "Record batch".
#
#    0  baseOffset            int64   stamped: outside the CRC
#   12  partitionLeaderEpoch  int32   stamped: outside the CRC
#   17  crc                   uint32  recomputed only when attributes or maxTimestamp change
#   21  attributes            int16   bit 3 (LogAppendTime) set or cleared per the topic
#   35  maxTimestamp          int64   the log's clock under LogAppendTime, else the records' max
cimport cython
from libc.stdint cimport INT64_MAX, INT64_MIN, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t

from mqcore._ext.batch cimport (ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BATCH_HEADER_SIZE, CRC_OFFSET,
                                CRC_START, LOG_OVERHEAD, OK, E_SHORT, BatchHeader, RecordCursor,
                                RecordView, check_batch, cursor_finish, error_text, next_record,
                                open_records, wrap_add)
from mqcore._ext.bytes_be cimport load_be32, store_be16, store_be32, store_be64
from mqcore._ext.crc32c cimport crc32c_extend

from mqcore.errors import CorruptRecordError


cdef object short_error(const unsigned char* p, Py_ssize_t avail, object source, Py_ssize_t pos):
    if avail < LOG_OVERHEAD:
        return CorruptRecordError(
            f"{avail} bytes cannot hold a record batch header (truncated buffer)",
            path=source, position=pos)
    return CorruptRecordError(
        f"the batch announces {LOG_OVERHEAD + <int32_t>load_be32(p + 8)} "
        f"bytes but only {avail} are present (truncated buffer)", path=source, position=pos)


def check_whole_batch(const unsigned char[::1] buf not None, Py_ssize_t pos,
                      Py_ssize_t max_decompressed, source=None):
    """Validate the batch at buf[pos:] whole: length against the buffer, magic, codec, counts,
    CRC-32C (without the GIL), then every record (framing, offset deltas, recordsCount).

    Returns (size, records, min record timestamp, max record timestamp, dense): `dense` is
    whether the offset deltas are exactly 0..records-1 and lastOffsetDelta is records-1 (what a
    producer builds). Raises CorruptRecordError naming `source` and the position otherwise."""
    cdef BatchHeader h
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    cdef int64_t ts, lo = INT64_MAX, hi = INT64_MIN, i = 0
    cdef bint dense = True
    cdef Py_ssize_t avail
    cdef const unsigned char* p
    if pos < 0 or pos >= buf.shape[0]:
        raise ValueError(f"position {pos} outside a buffer of {buf.shape[0]} bytes")
    p = &buf[pos]
    avail = buf.shape[0] - pos
    with nogil:
        rc = check_batch(p, avail, &h, True)
    if rc == E_SHORT:
        raise short_error(p, avail, source, pos)
    if rc != OK:
        raise CorruptRecordError(error_text(rc), path=source, position=pos)
    if h.attributes & ATTR_CONTROL:
        return LOG_OVERHEAD + h.batch_length, h.records_count, h.max_timestamp, h.max_timestamp, False
    owner = open_records(p, &h, max_decompressed, &c)
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            break
        if rc < 0:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        ts = wrap_add(h.base_timestamp, r.timestamp_delta)
        if ts < lo:
            lo = ts
        if ts > hi:
            hi = ts
        if r.offset_delta != i:
            dense = False
        i += 1
    rc = cursor_finish(&c)
    if rc != OK:
        raise CorruptRecordError(error_text(rc), path=source, position=pos)
    del owner
    if h.records_count == 0:
        lo = hi = -1
    dense = dense and h.last_offset_delta == h.records_count - 1
    return LOG_OVERHEAD + h.batch_length, h.records_count, lo, hi, dense


@cython.boundscheck(False)
def stamp_batch(unsigned char[::1] buf not None, Py_ssize_t pos, int64_t base_offset,
                int32_t leader_epoch, int attributes=-1, int64_t max_timestamp=INT64_MIN):
    """Write baseOffset and partitionLeaderEpoch of the (already validated) batch at buf[pos:]
    in place; with `attributes` >= 0 also write attributes and maxTimestamp and recompute the
    CRC (they are inside it). The caller validated the batch, so its length is trusted here
    but still checked against the buffer."""
    cdef Py_ssize_t avail
    cdef int32_t length
    cdef unsigned char* p
    cdef uint32_t crc
    if pos < 0 or buf.shape[0] - pos < BATCH_HEADER_SIZE:
        raise ValueError(f"no batch header at position {pos} of {buf.shape[0]} bytes")
    p = &buf[pos]
    avail = buf.shape[0] - pos
    length = <int32_t>load_be32(p + 8)
    if length < BATCH_HEADER_SIZE - LOG_OVERHEAD or LOG_OVERHEAD + <Py_ssize_t>length > avail:
        raise ValueError(f"batch length {length} does not fit the buffer")
    store_be64(p, <uint64_t>base_offset)
    store_be32(p + 12, <uint32_t>leader_epoch)
    if attributes < 0:
        return
    store_be16(p + 21, <uint16_t>attributes)
    store_be64(p + 35, <uint64_t>max_timestamp)
    with nogil:
        crc = crc32c_extend(0, p + CRC_START, LOG_OVERHEAD + length - CRC_START)
    store_be32(p + CRC_OFFSET, crc)
