# Message IDs (ids.pyx): the store ID's text both ways and the unique ID's text.
from libc.stdint cimport int64_t

# The store ID ("m1-...") of the message at (topic, partition, offset).
cdef str encode_id(str topic, int64_t partition, int64_t offset)
# (topic, partition, offset) of a canonical store ID, else None.
cdef object decode_id(object text)
# The canonical text (8-4-4-4-12 lowercase hex) of the 16 bytes at raw.
cdef str uid_chars(const unsigned char* raw)
