# Record batches -> Arrow column buffers with no Python object per record.
#
# Columns follow Spark's Kafka source (docs/format.md "Arrow columns"):
#   key binary, value binary          validity bitmap (bit i set = not null), int32 offsets, data
#   offset int64, timestamp int64     (microseconds since the epoch, UTC), timestampType int32
#   headers list<struct<key: string, value: binary>>   list offsets int32; struct children:
#                                     key offsets + data, value validity + offsets + data
# topic and partition are constant per partition read; mqcore.arrow builds them.
#
# Every buffer is malloc'd, grown geometrically and handed to pyarrow as an OwnedBuffer (buffer
# protocol, released when the last Arrow array referencing it goes), so finishing copies nothing.
# Buffers of POOL_MIN bytes or more go back to a pool of warm blocks (bufpool_impl.h), and each
# column starts at about the size its kind needed in the last batch, so a scan of many batches
# writes into memory already faulted in instead of new pages (bench/README.md, "Scans").
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport INT32_MAX, INT64_MAX, int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy, memset

from mqcore._ext._bufpool_c cimport mq_pool, mq_pool_give, mq_pool_take
from mqcore._ext.batch cimport (
    ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BATCH_HEADER_SIZE, E_SHORT, LOG_OVERHEAD, OK, BatchHeader,
    HeaderView, RecordCursor, RecordView, check_batch, cursor_drain, cursor_finish, cursor_init,
    error_text,
    next_header, next_record, open_records, walk_batch, wrap_add, wrap_mul,
)

from mqcore.errors import CorruptRecordError


cdef enum:
    POOL_MIN = 64 << 10
    N_KINDS = 16            # the column buffers a batch has (Grow.kind), 0: none

cdef mq_pool arrow_pool
arrow_pool.slots = 16
arrow_pool.max_bytes = 128 << 20
arrow_pool.min_block = POOL_MIN
arrow_pool.max_block = 128 << 20

# bytes each kind of buffer held in recent batches (halving when unused): its starting size
cdef Py_ssize_t kind_hint[N_KINDS]


cdef void release_block(char* data, Py_ssize_t cap) noexcept:
    mq_pool_give(&arrow_pool, data, <size_t>cap)


cdef class OwnedBuffer:
    """Read-only bytes owned by C memory; pyarrow wraps it without copying."""

    cdef char* data
    cdef Py_ssize_t size
    cdef Py_ssize_t cap

    def __dealloc__(self):
        release_block(self.data, self.cap)

    def __getbuffer__(self, Py_buffer* view, int flags):
        if flags & PyBUF_WRITABLE:
            raise BufferError("OwnedBuffer is read-only")
        PyBuffer_FillInfo(view, self, self.data, self.size, 1, flags)

    def __len__(self):
        return self.size


cdef int grow_reserve(Grow* g, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = g.cap if g.cap else 64
    cdef size_t got = 0
    cdef char* d
    if g.len + extra <= g.cap:
        return 0
    while cap < g.len + extra:
        cap *= 2
    if cap >= POOL_MIN:
        d = mq_pool_take(&arrow_pool, <size_t>cap, &got)
        if d != NULL:
            if g.len:
                memcpy(d, g.data, g.len)
            release_block(g.data, g.cap)
            g.data = d
            g.cap = <Py_ssize_t>got
            return 0
    d = <char*>realloc(g.data, cap)
    if d == NULL:
        raise MemoryError()
    g.data = d
    g.cap = cap
    return 0


cdef inline int grow_put(Grow* g, const void* p, Py_ssize_t n) except -1:
    if g.len + n > g.cap:
        grow_reserve(g, n)
    if n:
        memcpy(g.data + g.len, p, n)
    g.len += n
    return 0


cdef inline int put_i32(Grow* g, int32_t v) except -1:
    return grow_put(g, &v, 4)


cdef inline int put_i64(Grow* g, int64_t v) except -1:
    return grow_put(g, &v, 8)


cdef int grow_start(Grow* g, int kind) except -1:
    """An empty buffer of this kind, at the size its kind needed lately."""
    memset(g, 0, sizeof(Grow))
    g.kind = kind
    if kind_hint[kind] >= POOL_MIN:
        grow_reserve(g, kind_hint[kind])
    return 0


cdef void grow_free(Grow* g) noexcept:
    release_block(g.data, g.cap)
    memset(g, 0, sizeof(Grow))


cdef OwnedBuffer detach(Grow* g):
    """Move the grown bytes into an OwnedBuffer and reset g (its kind stays)."""
    cdef OwnedBuffer b = OwnedBuffer.__new__(OwnedBuffer)
    cdef char* d
    if g.data == NULL:
        g.data = <char*>malloc(8)
        if g.data == NULL:
            raise MemoryError()
        g.cap = 8
    if g.kind:
        kind_hint[g.kind] = max(g.len, kind_hint[g.kind] // 2)
    if g.cap >= POOL_MIN and g.len < g.cap // 4:
        # a small batch in a large pooled block: keep a copy, the block goes back to the pool
        d = <char*>malloc(g.len if g.len else 8)
        if d == NULL:
            raise MemoryError()
        memcpy(d, g.data, g.len)
        release_block(g.data, g.cap)
        g.data = d
        g.cap = g.len if g.len else 8
    b.data = g.data
    b.size = g.len
    b.cap = g.cap
    g.data = NULL
    g.len = g.cap = 0
    return b


cdef int column_init(Column* c, int first_kind) except -1:
    """An empty column; its three buffers are kinds first_kind .. first_kind + 2."""
    memset(c, 0, sizeof(Column))
    grow_start(&c.validity, first_kind)
    grow_start(&c.offsets, first_kind + 1)
    grow_start(&c.data, first_kind + 2)
    return put_i32(&c.offsets, 0)


cdef int validity_put(Column* c, Py_ssize_t row, bint valid) except -1:
    """Row `row`'s bit in the validity bitmap, which is only kept once the column has a null:
    at the first null every row before it is set valid at once."""
    cdef Py_ssize_t need = row // 8 + 1
    if c.validity.len < need:
        grow_reserve(&c.validity, need - c.validity.len)
        memset(c.validity.data + c.validity.len, 0, need - c.validity.len)
        c.validity.len = need
    if c.nulls == 0 and not valid:            # the first null: rows 0 .. row - 1 are valid
        memset(c.validity.data, 0xFF, row // 8)
        (<uint8_t*>c.validity.data)[row // 8] = <uint8_t>((1 << (row % 8)) - 1)
    elif valid:
        (<uint8_t*>c.validity.data)[row // 8] |= <uint8_t>(1 << (row % 8))
    return 0


cdef inline int column_put(Column* c, Py_ssize_t row, const unsigned char* p,
                           Py_ssize_t n) except -1:
    """Append one value (n < 0: null) as row `row`. A column without nulls writes no bitmap
    (finish hands none to Arrow then)."""
    if n < 0:
        validity_put(c, row, False)
        c.nulls += 1
    else:
        if c.nulls:
            validity_put(c, row, True)
        grow_put(&c.data, p, n)
    return put_i32(&c.offsets, <int32_t>c.data.len)


cdef void column_free(Column* c) noexcept:
    grow_free(&c.validity)
    grow_free(&c.offsets)
    grow_free(&c.data)
    memset(c, 0, sizeof(Column))


cdef bint utf8_valid(const unsigned char* s, Py_ssize_t n) noexcept nogil:
    """Well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF), as Arrow
    validates string columns."""
    cdef Py_ssize_t i = 0, k, more
    cdef unsigned char c, lo, hi
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        lo, hi = 0x80, 0xBF
        if 0xC2 <= c <= 0xDF:
            more = 1
        elif 0xE0 <= c <= 0xEF:
            more = 2
            if c == 0xE0:
                lo = 0xA0
            elif c == 0xED:
                hi = 0x9F
        elif 0xF0 <= c <= 0xF4:
            more = 3
            if c == 0xF0:
                lo = 0x90
            elif c == 0xF4:
                hi = 0x8F
        else:
            return False
        if i + more >= n:
            return False
        if not lo <= s[i + 1] <= hi:
            return False
        for k in range(2, more + 1):
            if not 0x80 <= s[i + k] <= 0xBF:
                return False
        i += more + 1
    return True


cdef inline Py_ssize_t record_bytes(const RecordView* r) noexcept:
    """The data bytes a record adds to the columns: key, value and headers."""
    return (r.key_len if r.key_len > 0 else 0) + (r.value_len if r.value_len > 0 else 0) \
        + r.headers_len


cdef class ArrowColumns:
    """Accumulates decoded records as Arrow buffers, bounded by rows and data bytes (its
    fields: arrowcols.pxd)."""

    def __cinit__(self, bint include_headers=False, Py_ssize_t max_decompressed=256 << 20):
        self.include_headers = include_headers
        self.max_decompressed = max_decompressed
        self.start()

    def __dealloc__(self):
        self.free_buffers()

    cdef int start(self) except -1:
        """Empty buffers for the next batch (kinds 1..15, see kind_hint)."""
        column_init(&self.keys, 1)
        column_init(&self.values, 4)
        column_init(&self.header_values, 7)
        grow_start(&self.offsets, 10)
        grow_start(&self.timestamps, 11)
        grow_start(&self.ts_types, 12)
        grow_start(&self.header_lists, 13)
        grow_start(&self.header_key_offsets, 14)
        grow_start(&self.header_key_data, 15)
        put_i32(&self.header_lists, 0)
        put_i32(&self.header_key_offsets, 0)
        return 0

    cdef void free_buffers(self) noexcept:
        column_free(&self.keys)
        column_free(&self.values)
        column_free(&self.header_values)
        grow_free(&self.offsets)
        grow_free(&self.timestamps)
        grow_free(&self.ts_types)
        grow_free(&self.header_lists)
        grow_free(&self.header_key_offsets)
        grow_free(&self.header_key_data)

    @property
    def data_bytes(self):
        """Key, value and header bytes held so far."""
        return self.held_bytes()

    cdef Py_ssize_t held_bytes(self) noexcept:
        return self.keys.data.len + self.values.data.len + self.header_values.data.len \
            + self.header_key_data.len

    cdef int add_headers(self, const RecordView* r, object source, int64_t file_pos) except -1:
        cdef HeaderView hv
        cdef const unsigned char* p = r.headers
        cdef const unsigned char* end = r.headers + r.headers_len
        cdef Py_ssize_t i
        cdef int rc
        for i in range(r.header_count):
            rc = next_header(&p, end, &hv)
            if rc != OK:
                raise CorruptRecordError(error_text(rc) + " (record header)", path=source,
                                         position=file_pos)
            if utf8_valid(hv.key, hv.key_len):
                grow_put(&self.header_key_data, hv.key, hv.key_len)
            else:
                # Arrow strings must be UTF-8: replace bad sequences with U+FFFD, as Java's
                # String decoding (and so Spark's own Kafka source) shows such a key
                fixed = (<bytes>(<const char*>hv.key)[:hv.key_len]).decode(
                    "utf-8", "replace").encode("utf-8")
                grow_put(&self.header_key_data, PyBytes_AS_STRING(fixed), PyBytes_GET_SIZE(fixed))
            put_i32(&self.header_key_offsets, <int32_t>self.header_key_data.len)
            column_put(&self.header_values, self.num_headers, hv.value, hv.value_len)
            self.num_headers += 1
        if p != end:
            raise CorruptRecordError(error_text(-11) + " (record headers)", path=source,
                                     position=file_pos)
        return put_i32(&self.header_lists, <int32_t>self.num_headers)

    cdef int put_record(self, const BatchHeader* h, const RecordView* r, int64_t offset,
                        object source, int64_t file_pos) except -1:
        cdef int32_t ts_type = 1 if h.attributes & ATTR_LOG_APPEND_TIME else 0
        if self.held_bytes() + record_bytes(r) > INT32_MAX - 1:
            raise ValueError(f"the record at offset {offset} takes the batch past Arrow's 2 GiB "
                             f"binary column limit")
        column_put(&self.keys, self.num_rows, r.key, r.key_len)
        column_put(&self.values, self.num_rows, r.value, r.value_len)
        put_i64(&self.offsets, offset)
        put_i64(&self.timestamps, wrap_mul(
            h.max_timestamp if ts_type else wrap_add(h.base_timestamp, r.timestamp_delta), 1000))
        put_i32(&self.ts_types, ts_type)
        if self.include_headers:
            self.add_headers(r, source, file_pos)
        self.num_rows += 1
        return 0

    def add(self, const unsigned char[::1] buf not None, Py_ssize_t pos, int64_t min_offset,
            int64_t max_offset=INT64_MAX, Py_ssize_t max_rows=INT32_MAX,
            Py_ssize_t max_bytes=1 << 30, bint verify_crc=True, source=None,
            int64_t file_pos=0):
        """Decode the complete batches of buf[pos:] into the columns.

        Same contract as batch.decode_messages: records outside [min_offset, max_offset] and
        control batches are skipped; stops at max_rows rows, once data_bytes reaches max_bytes
        (after at least one row), at an incomplete batch or past max_offset. Returns
        (next_pos, next_offset, done, full): done means max_offset was passed, full that a row
        or byte bound stopped it.
        """
        cdef BatchHeader h
        cdef RecordCursor c
        cdef RecordView r
        cdef int rc
        cdef Py_ssize_t n = buf.shape[0]
        cdef const unsigned char* batch
        cdef int64_t offset, next_offset = min_offset
        cdef bint stop = False, done = False, full = False
        if pos < 0 or pos > n:
            raise ValueError(f"position {pos} outside a buffer of {n} bytes")
        if max_bytes > INT32_MAX - 1:
            max_bytes = INT32_MAX - 1                  # int32 Arrow offsets
        while pos < n and not stop:
            batch = &buf[pos]
            if not walk_batch(batch, n - pos, &h, verify_crc, source, file_pos + pos):
                break
            if h.base_offset > max_offset:
                done = True
                break
            if h.base_offset + h.last_offset_delta < min_offset or h.attributes & ATTR_CONTROL:
                pos += LOG_OVERHEAD + h.batch_length
                if h.base_offset + h.last_offset_delta + 1 > next_offset:
                    next_offset = h.base_offset + h.last_offset_delta + 1
                continue
            area = open_records(batch, &h, self.max_decompressed, &c)
            while True:
                rc = next_record(&c, &r)
                if rc == 0:
                    rc = cursor_finish(&c)
                    if rc != OK:
                        raise CorruptRecordError(error_text(rc), path=source, position=file_pos + pos)
                    break
                if rc < 0:
                    raise CorruptRecordError(error_text(rc), path=source, position=file_pos + pos)
                offset = h.base_offset + r.offset_delta
                if offset < min_offset:
                    continue
                if offset > max_offset:
                    stop = done = True
                    break
                if self.num_rows >= max_rows or (
                        self.num_rows > 0 and self.held_bytes() + record_bytes(&r) > max_bytes):
                    stop = full = True
                    break
                self.put_record(&h, &r, offset, source, file_pos + pos)
                next_offset = offset + 1
            if stop:
                rc = cursor_drain(&c)  # the rest is checked, not returned (batch.pyx)
                if rc != OK:
                    raise CorruptRecordError(error_text(rc), path=source, position=file_pos + pos)
                break
            if h.base_offset + h.last_offset_delta + 1 > next_offset:
                next_offset = h.base_offset + h.last_offset_delta + 1
            pos += LOG_OVERHEAD + h.batch_length
        return pos, next_offset, done, full

    def finish(self):
        """Hand the buffers over (the builder is empty afterwards) as a dict of OwnedBuffers
        plus null counts, for mqcore.arrow to wrap in pyarrow arrays."""
        out = {
            "num_rows": self.num_rows,
            "key_nulls": self.keys.nulls,
            "value_nulls": self.values.nulls,
            "key_validity": detach(&self.keys.validity),
            "key_offsets": detach(&self.keys.offsets),
            "key_data": detach(&self.keys.data),
            "value_validity": detach(&self.values.validity),
            "value_offsets": detach(&self.values.offsets),
            "value_data": detach(&self.values.data),
            "offset": detach(&self.offsets),
            "timestamp": detach(&self.timestamps),
            "timestamp_type": detach(&self.ts_types),
        }
        if self.include_headers:
            out.update({
                "num_headers": self.num_headers,
                "header_value_nulls": self.header_values.nulls,
                "header_lists": detach(&self.header_lists),
                "header_key_offsets": detach(&self.header_key_offsets),
                "header_key_data": detach(&self.header_key_data),
                "header_value_validity": detach(&self.header_values.validity),
                "header_value_offsets": detach(&self.header_values.offsets),
                "header_value_data": detach(&self.header_values.data),
            })
        self.free_buffers()
        self.start()
        self.num_rows = 0
        self.num_headers = 0
        return out


def repeated_string(bytes text not None, Py_ssize_t n):
    """(offsets, data) buffers of a string column holding `text` n times (topic column)."""
    cdef Grow offs
    cdef Grow data
    cdef Py_ssize_t i, k = PyBytes_GET_SIZE(text)
    memset(&offs, 0, sizeof(Grow))
    memset(&data, 0, sizeof(Grow))
    if n * k > INT32_MAX - 1:
        raise ValueError("string column exceeds Arrow's 2 GiB limit")
    grow_reserve(&offs, 4 * (n + 1))
    grow_reserve(&data, n * k)
    for i in range(n + 1):
        (<int32_t*>offs.data)[i] = <int32_t>(i * k)
    for i in range(n):
        memcpy(data.data + i * k, PyBytes_AS_STRING(text), k)
    offs.len = 4 * (n + 1)
    data.len = n * k
    return detach(&offs), detach(&data)


def repeated_int32(int32_t value, Py_ssize_t n):
    """A buffer of n int32 copies of value (partition column)."""
    cdef Grow g
    cdef Py_ssize_t i
    memset(&g, 0, sizeof(Grow))
    grow_reserve(&g, 4 * n)
    for i in range(n):
        (<int32_t*>g.data)[i] = value
    g.len = 4 * n
    return detach(&g)
