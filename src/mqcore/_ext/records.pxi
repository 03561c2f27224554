# Included by batch.pyx: the leaf parsers of a record batch (the layout atop batch.pyx). Every
# length read from the bytes is checked before use; other kernels cimport these through
# batch.pxd.

# ---------------------------------------------------------------------------------------------
# Parsing (leaf kernels: every length read from the bytes is checked before use)
# ---------------------------------------------------------------------------------------------

cdef int parse_batch_header(const unsigned char* p, Py_ssize_t avail, BatchHeader* h) noexcept nogil:
    """Fill *h from the 61 header bytes; E_SHORT when fewer are available."""
    if avail < BATCH_HEADER_SIZE:
        return E_SHORT
    h.base_offset = <int64_t>load_be64(p)
    h.batch_length = <int32_t>load_be32(p + 8)
    h.leader_epoch = <int32_t>load_be32(p + 12)
    h.magic = <signed char>p[16]
    h.crc = load_be32(p + 17)
    h.attributes = <int16_t>load_be16(p + 21)
    h.last_offset_delta = <int32_t>load_be32(p + 23)
    h.base_timestamp = <int64_t>load_be64(p + 27)
    h.max_timestamp = <int64_t>load_be64(p + 35)
    h.producer_id = <int64_t>load_be64(p + 43)
    h.producer_epoch = <int16_t>load_be16(p + 51)
    h.base_sequence = <int32_t>load_be32(p + 53)
    h.records_count = <int32_t>load_be32(p + 57)
    return OK


cdef int check_batch(const unsigned char* p, Py_ssize_t avail, BatchHeader* h,
                     bint verify_crc) noexcept nogil:
    """Parse and validate the batch at p: lengths, magic, codec, counts and (optionally) CRC.

    E_SHORT means the bytes end before the batch does (a torn tail or a read that was too short);
    every other code is corruption.
    """
    cdef int rc
    if avail < LOG_OVERHEAD:
        return E_SHORT
    h.batch_length = <int32_t>load_be32(p + 8)
    if h.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD or h.batch_length > MAX_BATCH_BYTES:
        return E_LENGTH
    if avail < LOG_OVERHEAD + <Py_ssize_t>h.batch_length:
        # the magic byte is checked even on a short read, so garbage is not mistaken for a tail
        if avail > MAGIC_OFFSET and <signed char>p[MAGIC_OFFSET] != 2:
            return E_MAGIC
        return E_SHORT
    rc = parse_batch_header(p, avail, h)
    if rc != OK:
        return rc
    if h.magic != 2:
        return E_MAGIC
    if (h.attributes & ATTR_CODEC_MASK) > 4:
        return E_CODEC
    if h.records_count < 0 or h.last_offset_delta < 0:
        return E_COUNT
    if h.records_count > 0 and h.records_count - 1 > h.last_offset_delta:
        return E_COUNT
    # every offset sum the readers make (baseOffset + delta + 1) must fit int64
    if h.base_offset > INT64_MAX - 1 - h.last_offset_delta:
        return E_BASE_OFFSET
    if verify_crc:
        if crc32c_extend(0, p + CRC_START, LOG_OVERHEAD + h.batch_length - CRC_START) != h.crc:
            return E_CRC
    return OK


cdef void cursor_init(RecordCursor* c, const unsigned char* records, Py_ssize_t size,
                      const BatchHeader* h) noexcept nogil:
    c.p = records
    c.end = records + size
    c.remaining = h.records_count
    c.prev_delta = -1
    c.last_offset_delta = h.last_offset_delta


cdef inline int read_len(const unsigned char** p, const unsigned char* end,
                         Py_ssize_t* out) noexcept nogil:
    """Read a length varint (-1 = null) and check the bytes it announces are present."""
    cdef int64_t v
    cdef int n = read_varint(p[0], end - p[0], &v)
    if n < 0:
        return E_VARINT
    p[0] += n
    if v < -1 or v > end - p[0]:
        return E_FIELD_LENGTH
    out[0] = <Py_ssize_t>v
    return OK


cdef int next_record(RecordCursor* c, RecordView* r) noexcept nogil:
    """Decode the next record into *r; 1 = a record, 0 = all recordsCount records read.

    The headers are walked once here, so every decoder (Messages, Arrow with or without the
    headers column) accepts and refuses exactly the same records.
    """
    cdef int64_t v
    cdef int n, rc
    cdef Py_ssize_t i
    cdef HeaderView hv
    cdef const unsigned char* p
    cdef const unsigned char* rec_end
    if c.remaining <= 0:
        return 0
    n = read_varint(c.p, c.end - c.p, &v)
    if n < 0:
        return E_VARINT
    p = c.p + n
    if v < 1 or v > c.end - p:
        return E_RECORD_LENGTH
    rec_end = p + v
    p += 1                                   # attributes int8, unused by v2
    n = read_varint(p, rec_end - p, &r.timestamp_delta)
    if n < 0:
        return E_VARINT
    p += n
    n = read_varint(p, rec_end - p, &r.offset_delta)
    if n < 0:
        return E_VARINT
    p += n
    if r.offset_delta <= c.prev_delta or r.offset_delta > c.last_offset_delta:
        return E_OFFSET_DELTA
    rc = read_len(&p, rec_end, &r.key_len)
    if rc != OK:
        return rc
    r.key = p
    if r.key_len > 0:
        p += r.key_len
    rc = read_len(&p, rec_end, &r.value_len)
    if rc != OK:
        return rc
    r.value = p
    if r.value_len > 0:
        p += r.value_len
    n = read_varint(p, rec_end - p, &v)
    if n < 0:
        return E_VARINT
    p += n
    if v < 0 or v > rec_end - p:
        return E_HEADER_COUNT
    r.header_count = <Py_ssize_t>v
    r.headers = p
    r.headers_len = rec_end - p
    for i in range(r.header_count):
        rc = next_header(&p, rec_end, &hv)
        if rc != OK:
            return rc
    if p != rec_end:
        return E_TRAILING                    # the record is longer than its fields
    c.p = rec_end
    c.remaining -= 1
    c.prev_delta = r.offset_delta
    return 1


cdef int cursor_finish(const RecordCursor* c) noexcept nogil:
    """After the last record: the records area must be used up exactly."""
    if c.remaining > 0:
        return E_COUNT
    if c.p != c.end:
        return E_TRAILING
    return OK


cdef int cursor_drain(RecordCursor* c) noexcept nogil:
    """Walk the records a reader does not want (it stopped early) and check the batch as a
    whole, recordsCount and framing included, as when every record is read: OK or the error."""
    cdef RecordView r
    cdef int rc
    while True:
        rc = next_record(c, &r)
        if rc == 0:
            return cursor_finish(c)
        if rc < 0:
            return rc


cdef int next_header(const unsigned char** p, const unsigned char* end,
                     HeaderView* hv) noexcept nogil:
    """Decode one header at *p (bounded by the record's end) and advance *p."""
    cdef int rc = read_len(p, end, &hv.key_len)
    if rc != OK:
        return rc
    if hv.key_len < 0:
        return E_FIELD_LENGTH               # header keys are never null
    hv.key = p[0]
    p[0] += hv.key_len
    rc = read_len(p, end, &hv.value_len)
    if rc != OK:
        return rc
    hv.value = p[0]
    if hv.value_len > 0:
        p[0] += hv.value_len
    return OK


cdef str error_text(int code):
    if code == E_SHORT:
        return "batch ends past the end of the data (torn write)"
    if code == E_LENGTH:
        return "batch length out of range"
    if code == E_MAGIC:
        return "magic byte is not 2 (not a v2 record batch)"
    if code == E_CRC:
        return "CRC-32C mismatch"
    if code == E_CODEC:
        return "unknown compression codec in attributes"
    if code == E_COUNT:
        return "recordsCount disagrees with lastOffsetDelta or the records present"
    if code == E_VARINT:
        return "truncated or over-long varint in a record"
    if code == E_RECORD_LENGTH:
        return "record length runs past the batch"
    if code == E_FIELD_LENGTH:
        return "key, value or header length out of range"
    if code == E_OFFSET_DELTA:
        return "record offset deltas not increasing or past lastOffsetDelta"
    if code == E_TRAILING:
        return "bytes left over after the last record"
    if code == E_OFFSET_ORDER:
        return "batch offsets go backwards"
    if code == E_HEADER_COUNT:
        return "header count out of range"
    if code == E_BASE_OFFSET:
        return "baseOffset + lastOffsetDelta overflows the 64-bit offset range"
    return f"error {code}"


cdef int walk_batch(const unsigned char* p, Py_ssize_t avail, BatchHeader* h, bint verify_crc,
                    object source, int64_t position) except -1:
    """Check the batch at p (without the GIL): 1 when it is whole and valid, 0 when the bytes end
    first (the end of the data); anything else raises CorruptRecordError naming `source` and
    `position`, the batch's place in its file."""
    cdef int rc
    with nogil:
        rc = check_batch(p, avail, h, verify_crc)
    if rc == OK:
        return 1
    if rc == E_SHORT:
        return 0
    raise CorruptRecordError(error_text(rc), path=source, position=position)


cdef object open_records(const unsigned char* batch, const BatchHeader* h, Py_ssize_t max_size,
                         RecordCursor* c):
    """Point cursor c at the batch's records, decompressing them if the batch is compressed.

    Returns the object that owns the decompressed bytes (None when the cursor points into the
    batch itself); the caller keeps it alive while it uses the cursor.
    """
    area = records_area(batch, h, max_size)
    if area is None:
        cursor_init(c, batch + BATCH_HEADER_SIZE, LOG_OVERHEAD + h.batch_length - BATCH_HEADER_SIZE,
                    h)
    else:
        cursor_init(c, <const unsigned char*>PyBytes_AS_STRING(area), PyBytes_GET_SIZE(area), h)
    return area


cdef object records_area(const unsigned char* batch, const BatchHeader* h, Py_ssize_t max_size):
    """The decompressed records stream of a compressed batch, or None when uncompressed."""
    cdef int codec = h.attributes & ATTR_CODEC_MASK
    if codec == 0:
        return None
    cdef Py_ssize_t n = LOG_OVERHEAD + h.batch_length - BATCH_HEADER_SIZE
    return decompress(codec, PyBytes_FromStringAndSize(<const char*>batch + BATCH_HEADER_SIZE, n),
                       max_size)
