# The fixed layout of a Kafka v2 record batch header (the schema atop batch.pyx): a declarations
# -only .pxd (no module), cimported by batch and encode alike.

cdef enum:
    LOG_OVERHEAD = 12            # baseOffset int64 + batchLength int32
    BATCH_HEADER_SIZE = 61       # through recordsCount
    CRC_OFFSET = 17
    CRC_START = 21               # the CRC covers [attributes, end of batch)
    MAGIC_OFFSET = 16
    ATTR_CODEC_MASK = 0x07
    ATTR_LOG_APPEND_TIME = 0x08
    ATTR_TRANSACTIONAL = 0x10
    ATTR_CONTROL = 0x20
    ATTR_DELETE_HORIZON = 0x40
    MAX_BATCH_BYTES = 0x7FFFFFF0   # a batch must fit int32 positions
