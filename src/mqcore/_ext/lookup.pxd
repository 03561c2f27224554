# Point lookups (lookup.pyx): a record by offset, a store ID, the key-index hits of a topic,
# over a partition's SegmentTable (segtable.pyx).
from mqcore._ext.segtable cimport SegmentTable

# Partition.get: the Message at `offset` of the partition whose table is `table`, or None.
cdef object get_in(SegmentTable table, object offset_obj, bint verify_crc,
                   Py_ssize_t max_decompressed)
