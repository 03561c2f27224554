# Point lookups (lookup.pyx): a record by offset, a store ID, the key-index hits of a topic,
# driven from the storage layer's Partition and LogSegment objects.

# Partition.get: the Message at `offset` of partition `part`, or None.
cdef object get_in(object part, object offset_obj, bint verify_crc, Py_ssize_t max_decompressed)

# (topic, partition, offset) of a canonical store ID, else None.
cdef object decode_id(object text)
