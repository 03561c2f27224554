# Point lookups (lookup.pyx): a record by offset, a store ID, the key-index hits of a topic,
# over a partition's SegmentTable (segtable.pyx).
from libc.stdint cimport int64_t

from mqcore._ext.segtable cimport SegmentTable

# Partition.get: the Message at `offset` of the partition whose table is `table`, or None.
cdef object get_in(SegmentTable table, object offset_obj, bint verify_crc,
                   Py_ssize_t max_decompressed)

# A topic's partitions as find_in_partitions takes them (a list in number order).
cdef list in_order(object parts)

# The key lookup over `parts` from (resume_partition, resume_offset) until `limit` messages:
# query/keyed.pyx (the query layer's find_indexed) calls it without a Python frame.
cdef list find_in_partitions(list parts, bytes raw, int kind, int64_t lo, int64_t hi,
                             Py_ssize_t limit, Py_ssize_t resume_partition,
                             int64_t resume_offset, Py_ssize_t max_probe,
                             Py_ssize_t max_decompressed, Py_ssize_t* scanned,
                             Py_ssize_t* stop_partition, int64_t* stop_offset)
