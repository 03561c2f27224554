# Included by batch.pyx: Message, what reads return, and the helpers that build one from a
# record (fields declared in batch.pxd).

# ---------------------------------------------------------------------------------------------
# Message: what reads return
# ---------------------------------------------------------------------------------------------

@cython.final
@cython.no_gc
@cython.freelist(256)
cdef class Message:
    """One stored record. `value is None` is a tombstone (Kafka's null), distinct from b"".

    Final and untracked by the garbage collector: it holds only str, int, bytes and tuples of
    them, so it can never be part of a reference cycle (a third of decode time went to the GC).
    Its fields are declared in batch.pxd.
    """

    def __init__(self, str topic, int partition, int64_t offset, int64_t timestamp,
                 int timestamp_type=0, key=None, value=None, headers=()):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.timestamp_type = timestamp_type
        self.key = key
        self.value = value
        self._headers = tuple(headers)

    @property
    def headers(self):
        """((key, value), ...) in record order. Decoded on first use: the record cursor already
        checked their structure, and many readers never look at them."""
        if self._headers is None:
            self._headers = decode_header_bytes(
                <const unsigned char*>PyBytes_AS_STRING(self._raw_headers),
                PyBytes_GET_SIZE(self._raw_headers), self._header_count)
            self._raw_headers = None
        return self._headers

    def header(self, str name, default=None):
        """Value of the last header called `name` (Kafka allows repeats), else `default`."""
        for k, v in reversed(self.headers):
            if k == name:
                return v
        return default

    @property
    def msg_id(self):
        """The store ID: where this message lives (ids.pyx; mqcore.query.ids)."""
        return encode_id(self.topic, self.partition, self.offset)

    @property
    def unique_id(self):
        """The unique ID from the `uid` header as a UUID string, or None."""
        raw = self.header("uid")
        if raw is None or len(raw) != 16:
            return None
        if type(raw) is not bytes:
            raw = bytes(raw)  # a Message built by hand may carry any bytes-like value
        return uid_chars(<const unsigned char*>PyBytes_AS_STRING(raw))

    @property
    def tag(self):
        """The `tag` header as text, or None."""
        raw = self.header("tag")
        return None if raw is None else raw.decode("utf-8", "replace")

    @property
    def properties(self):
        """Headers whose values are UTF-8 text, as {name: value} (the last one of a name
        wins); the binary `uid` header is left out. SQL92 selectors match these."""
        out = {}
        for k, v in self.headers:
            if v is None or k == "uid":
                continue
            try:
                out[k] = v.decode("utf-8")
            except UnicodeDecodeError:
                pass
        return out

    def __eq__(self, other):
        if not isinstance(other, Message):
            return NotImplemented
        cdef Message o = <Message>other
        return (self.topic == o.topic and self.partition == o.partition
                and self.offset == o.offset and self.timestamp == o.timestamp
                and self.timestamp_type == o.timestamp_type and self.key == o.key
                and self.value == o.value and self.headers == o.headers)

    def __hash__(self):
        return hash((self.topic, self.partition, self.offset))

    def __reduce__(self):
        return (Message, (self.topic, self.partition, self.offset, self.timestamp,
                          self.timestamp_type, self.key, self.value, self.headers))

    def __repr__(self):
        def short(b):
            if b is None:
                return "None"
            return repr(b[:40] + b"...") if len(b) > 40 else repr(b)
        return (f"Message(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, "
                f"timestamp={self.timestamp}, key={short(self.key)}, value={short(self.value)}, "
                f"headers={len(self.headers)})")


cdef inline object bytes_or_none(const unsigned char* p, Py_ssize_t n):
    if n < 0:
        return None
    return PyBytes_FromStringAndSize(<const char*>p, n)


cdef object _last_key_bytes = b""
cdef str _last_key_str = ""


cdef inline str header_key(const unsigned char* p, Py_ssize_t n):
    """The header key as str, reusing the previous one when the bytes repeat (they usually do:
    every record of a batch tends to carry the same header names). Runs with the GIL."""
    global _last_key_bytes, _last_key_str
    if n == PyBytes_GET_SIZE(_last_key_bytes) and memcmp(p, PyBytes_AS_STRING(_last_key_bytes), n) == 0:
        return _last_key_str
    key = PyUnicode_DecodeUTF8(<const char*>p, n, "surrogateescape")
    _last_key_bytes = PyBytes_FromStringAndSize(<const char*>p, n)
    _last_key_str = key
    return key


cdef tuple decode_header_bytes(const unsigned char* p, Py_ssize_t n, Py_ssize_t count):
    """The headers of a record from its encoded header area (count headers in n bytes)."""
    cdef HeaderView hv
    cdef const unsigned char* end = p + n
    cdef Py_ssize_t i
    cdef int rc
    cdef tuple out, pair
    if count == 0:
        return ()
    out = PyTuple_New(count)
    for i in range(count):
        rc = next_header(&p, end, &hv)
        if rc != OK:
            raise CorruptRecordError(error_text(rc) + " (record header)")
        pair = (header_key(hv.key, hv.key_len), bytes_or_none(hv.value, hv.value_len))
        Py_INCREF(pair)
        PyTuple_SET_ITEM(out, i, pair)
    if p != end:
        raise CorruptRecordError(error_text(E_TRAILING) + " (record headers)")
    return out


cdef Message make_message(str topic, int partition, const BatchHeader* h, const RecordView* r):
    """A Message for record r of the batch with header h."""
    cdef Message m = Message.__new__(Message)
    m.topic = topic
    m.partition = partition
    m.offset = h.base_offset + r.offset_delta
    if h.attributes & ATTR_LOG_APPEND_TIME:
        m.timestamp = h.max_timestamp
        m.timestamp_type = 1
    else:
        m.timestamp = wrap_add(h.base_timestamp, r.timestamp_delta)
        m.timestamp_type = 0
    m.key = bytes_or_none(r.key, r.key_len)
    m.value = bytes_or_none(r.value, r.value_len)
    if r.header_count == 0:
        m._headers = ()
    else:
        m._raw_headers = PyBytes_FromStringAndSize(<const char*>r.headers, r.headers_len)
        m._header_count = r.header_count
    return m
