# Segment scans and Kafka's sparse-index rule, shared by append and recovery.
from libc.stdint cimport int64_t

cdef struct IndexRule:
    int64_t interval               # index_interval_bytes
    int64_t bytes_since_entry
    int64_t max_timestamp          # largest batch maxTimestamp so far (-1: none)
    int64_t offset_of_max_timestamp
    int64_t last_time_entry_ts     # timestamp of the last .timeindex entry (-1: none)
    int64_t last_index_offset      # offset of the last .index entry (-1: none)

# After a batch [position, position+size) ending at last_offset with max_ts: decides the index
# entries Kafka would write; returns a bit set: 1 = offset entry (last_offset -> position),
# 2 = time entry (max_timestamp -> offset_of_max_timestamp).
cdef int rule_on_batch(IndexRule* r, int64_t position, int64_t size, int64_t last_offset,
                       int64_t max_ts) noexcept nogil

# The get kernel over a segment's mapped bytes buf[0:n] (scan.read_record is its Python face):
# the Message at `offset`, walking batch headers from `position` (a batch boundary at or before
# it), or None. `verified` is the segment's memo of CRC-checked batches (None: no memo).
cdef object read_at(const unsigned char* buf, Py_ssize_t n, Py_ssize_t position, int64_t offset,
                    str topic, int partition, bint verify_crc, dict verified, object source,
                    Py_ssize_t max_decompressed)

# Before read_at(buf, n, pos, offset, ...): the memo of the batch holding `offset` when the
# memos of the batches from `pos` on lead there (*batch_pos: its position), with the records
# the read will touch prefetched, for read_memo; else None (read_at then walks the headers;
# the first one is prefetched). Reads nothing from buf.
cdef object locate(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos, int64_t offset,
                   dict verified, Py_ssize_t* batch_pos)
# The Message at `offset` (or None) in the batch at buf[pos] whose memo (from locate) holds it;
# `prefetch`: load the records the walk reads (locate did already).
cdef object read_memo(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos, object memo,
                      int64_t offset, str topic, int partition, object source, bint prefetch)

# The time-lookup kernel over a segment's mapped bytes buf[0:n] (scan.first_offset_at_or_after
# is its Python face): the first offset at or after the batch at `pos` whose record timestamp
# is >= `timestamp` and whose offset is >= `min_offset`, or -1; `verified` as read_at's (None:
# no memo, every batch walked is checked at each visit).
cdef int64_t first_at_or_after(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos,
                               int64_t timestamp, int64_t min_offset, bint verify_crc,
                               dict verified, object source,
                               Py_ssize_t max_decompressed) except -2
