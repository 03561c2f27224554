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
