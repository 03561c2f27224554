# Encoding Kafka v2 record batches from Python lists (the layout is the comment atop batch.pyx;
# docs/format.md "Record batch"), with the UUIDv7s and key-index hits the query layer needs.
#
# Encoding gathers: the batch header and the varint "glue" live in one growable buffer; values,
# keys and header values that are immutable `bytes` of at least `gather_threshold` (16 KiB)
# bytes are referenced in place (an iovec each) instead of copied, and the CRC runs over the
# pieces. Smaller ones are copied: measured on 1000 x 1 KiB, copying and checksumming one
# contiguous run (3-way interleaved CRC) costs 121 us against 141 us for 2000 iovecs checksummed
# piece by piece. `EncodedBatch.write_to(fd)` hands the pieces to writev() without the GIL.
#
# Query support (docs/format.md "Unique IDs", "Key index"): with `uid_ms >= 0` every record
# without a producer-supplied `uid` header gets one: header key "uid", value 16 bytes, a UUIDv7
#   bytes 0-5  unix ms (big-endian) | 6: 0x70 | counter bits 31-28 | 7: counter bits 27-20
#   8: 0x80 | counter bits 19-14    | 9: counter bits 13-6 | 10: counter bits 5-0, node bits 41-40
#   11-15: node bits 39-0
# (counter: per process, +1 a record; node: 42 random bits per process, redrawn after fork).
# With `index=True` the encoder also lists the record's indexable strings as KeyHits: its key,
# its uid, each space-separated word of a `keys` header, and its `tag` header. A batch encoded
# without headers (so no producer-supplied `uid`) and with consecutive offset deltas is a run:
# record i carries the counter of record 0 plus i, all with one ms and node, so its IDs make
# one KIND_RUN hit (ms and node hashed, first counter, count) instead of one hit per record
# (docs/format.md "Key index": a run entry; the rebuild finds the same runs in stored batches).
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject
from libc.errno cimport EAGAIN, EINTR, ENOSPC, errno
from libc.stdint cimport INT32_MAX, PTRDIFF_MAX, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memmove, memset
from posix.uio cimport iovec, writev

from mqcore._ext._bufpool_c cimport mq_pool, mq_pool_give, mq_pool_take
from mqcore._ext.bytes_be cimport mq_prefetch, mq_prefetch_range, store_be16, store_be32, store_be64
from mqcore._ext.crc32c cimport crc32c_extend
from mqcore._ext.hashing cimport (KIND_KEY, KIND_RUN, KIND_TAG, KIND_UID, SEED_KEY, SEED_TAG,
                                  SEED_UID, KeyHit, next_word, uid_run_hash, v7_counter, xxh64)
from mqcore._ext.varint cimport MAX_VARINT_BYTES, varint_size, write_varint
from mqcore._ext.wire cimport (ATTR_LOG_APPEND_TIME, ATTR_TRANSACTIONAL, BATCH_HEADER_SIZE,
                               CRC_OFFSET, CRC_START, LOG_OVERHEAD, MAX_BATCH_BYTES)

from mqcore.errors import InvalidRecordError, RecordTooLargeError

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    bint bytes_exact "PyBytes_CheckExact"(PyObject* o) noexcept nogil
    Py_ssize_t object_size "Py_SIZE"(PyObject* o) noexcept nogil
    const char* bytes_data "PyBytes_AS_STRING"(PyObject* o) noexcept nogil

cdef extern from "<unistd.h>" nogil:
    int getpid()

cdef enum:
    PREFETCH_AHEAD = 2             # values whose bytes are prefetched ahead of the copy
    PREFETCH_MAX = 4096            # at most this much of each
    IOV_BATCH = 512                # iovecs handed to one writev() call (IOV_MAX is >= 1024)
    DEFAULT_GATHER_THRESHOLD = 16384  # below: copying + one contiguous CRC beats an iovec each

# Glue buffers are kept for reuse (a few, up to 8 MiB each; bufpool_impl.h says why).
cdef mq_pool glue_pool
glue_pool.slots = 4
glue_pool.max_bytes = 32 << 20
glue_pool.min_block = 0
glue_pool.max_block = 8 << 20


cdef unsigned char* take_glue(Py_ssize_t want, Py_ssize_t* cap):
    """A buffer of at least `want` bytes, preferably a warm one from the pool (NULL: no memory)."""
    cdef size_t got = 0
    cdef char* g = mq_pool_take(&glue_pool, <size_t>want, &got)
    if g != NULL:
        cap[0] = <Py_ssize_t>got
        return <unsigned char*>g
    cap[0] = want
    return <unsigned char*>malloc(want)


cdef void give_glue(unsigned char* g, Py_ssize_t cap) noexcept:
    mq_pool_give(&glue_pool, <char*>g, <size_t>cap)


cdef uint64_t uid_node = 0       # 42 random bits of this process (see the schema above)
cdef uint32_t uid_counter = 0
cdef int uid_pid = -1


cdef int reseed_uids() except -1:
    """Draw this process's node bits on first use and again in a forked child. Called once per
    batch: getpid() is a system call, too dear once per record."""
    global uid_node, uid_counter, uid_pid
    if uid_pid != getpid():
        import os
        seed = int.from_bytes(os.urandom(10), "big")
        uid_node = <uint64_t>(seed & ((1 << 42) - 1))
        uid_counter = <uint32_t>((seed >> 42) & 0xFFFFFFFF)
        uid_pid = getpid()
    return 0


cdef void uid_header_template(unsigned char* g, int64_t ms) noexcept:
    """The 21-byte `uid` header (key "uid", a 16-byte UUIDv7 of time `ms` and this process's
    node; layout in the comment atop this module) with counter 0: put_uid_header copies it
    and writes each record's counter. reseed_uids() ran for this batch."""
    cdef unsigned char* out = g + 5
    g[0] = 6                                                      # varint(3)
    memcpy(g + 1, b"uid", 3)
    g[4] = 32                                                     # varint(16)
    store_be16(out, <uint16_t>(<uint64_t>ms >> 32))
    store_be32(out + 2, <uint32_t><uint64_t>ms)
    out[6] = 0x70
    out[7] = 0
    out[8] = 0x80
    out[9] = 0
    out[10] = <unsigned char>((uid_node >> 40) & 0x03)
    out[11] = (uid_node >> 32) & 0xFF
    store_be32(out + 12, <uint32_t>uid_node)


cdef inline void put_counter(unsigned char* out, uint32_t c) noexcept nogil:
    """Write counter `c` into the UUIDv7 at `out` whose counter bits are zero."""
    out[6] |= (c >> 28) & 0x0F
    out[7] = (c >> 20) & 0xFF
    out[8] |= (c >> 14) & 0x3F
    out[9] = (c >> 6) & 0xFF
    out[10] |= (c & 0x3F) << 2


cdef bint has_uid_header(object items) except -1:
    """Whether the producer's headers already carry a `uid` (malformed pairs are refused later)."""
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 2 and item[0] == "uid":
            return True
    return False


cdef struct Piece:
    const unsigned char* ptr      # NULL: the piece lives in the glue buffer at `off`
    Py_ssize_t off
    Py_ssize_t len


cdef inline Py_ssize_t simple_body_size(int64_t ts_delta, int64_t offset_delta, Py_ssize_t klen,
                                        Py_ssize_t vlen, bint add_uid) noexcept nogil:
    """Body bytes of a record without headers but an optional generated `uid` (21 bytes):
    attributes, the two deltas, key and value with their lengths (-1: null), header count."""
    return (1 + varint_size(ts_delta) + varint_size(offset_delta)
            + varint_size(klen) + (klen if klen > 0 else 0)
            + varint_size(vlen) + (vlen if vlen > 0 else 0) + 1 + (21 if add_uid else 0))


@cython.final
cdef class EncodedBatch:
    """An encoded batch as a list of pieces (glue buffer + referenced `bytes`), ready for writev.

    The base offset is patched in last (`set_base_offset`): it lies outside the CRC, so the log
    assigns it under its lock without re-checksumming.
    """

    cdef unsigned char* glue
    cdef Py_ssize_t glue_len
    cdef Py_ssize_t glue_cap
    cdef Piece* pieces
    cdef Py_ssize_t n_pieces
    cdef Py_ssize_t pieces_cap
    cdef list refs                  # keeps referenced bytes alive while pieces point into them
    cdef readonly Py_ssize_t size
    cdef readonly int32_t count
    cdef readonly int64_t base_timestamp
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t min_timestamp  # not in the format: for the log's timestamp bounds
    cdef readonly int32_t last_offset_delta
    cdef readonly int64_t base_offset
    cdef readonly uint32_t crc
    cdef readonly int attributes
    cdef KeyHit* hits               # indexable strings of the records (index=True)
    cdef Py_ssize_t n_hits
    cdef Py_ssize_t hits_cap
    cdef bint collect_hits
    cdef bint uid_run               # generated IDs are one run: no per-record uid hits
    cdef unsigned char uid_template[21]  # the `uid` header of this batch's IDs, counter 0
    cdef int64_t record_ts          # the record being encoded: its timestamp and offset delta
    cdef int64_t uid_ms             # the time generated unique IDs carry
    cdef bytes uid_bytes            # 16 bytes a record: its unique ID (zeros: none or not 16 bytes)
    cdef bytes packed_hits          # key_hits, made once
    cdef int32_t record_delta
    cdef Py_ssize_t record_index    # its position in the batch (its slot in uid_bytes)
    cdef Py_ssize_t ref_bytes       # bytes in referenced pieces (the glue holds the rest)

    def __cinit__(self):
        self.refs = []
        self.glue = take_glue(256, &self.glue_cap)
        self.pieces_cap = 16
        self.pieces = <Piece*>PyMem_Malloc(self.pieces_cap * sizeof(Piece))
        if self.glue == NULL or self.pieces == NULL:
            raise MemoryError()
        self.base_offset = -1

    def __dealloc__(self):
        give_glue(self.glue, self.glue_cap)
        PyMem_Free(self.pieces)
        PyMem_Free(self.hits)

    cdef int add_hit(self, const void* p, Py_ssize_t n, int kind) except -1:
        """Note one indexable string (key, uid word or tag) of the current record."""
        cdef KeyHit* grown
        cdef uint64_t seed = SEED_KEY if kind == KIND_KEY else (SEED_UID if kind == KIND_UID
                                                                 else SEED_TAG)
        if self.n_hits == self.hits_cap:
            self.hits_cap = 64 if self.hits_cap == 0 else 2 * self.hits_cap
            grown = <KeyHit*>PyMem_Realloc(self.hits, self.hits_cap * sizeof(KeyHit))
            if grown == NULL:
                raise MemoryError()
            self.hits = grown
        self.hits[self.n_hits].hash = xxh64(p, n, seed)
        self.hits[self.n_hits].timestamp = self.record_ts
        self.hits[self.n_hits].offset_delta = self.record_delta
        self.hits[self.n_hits].kind = kind
        self.hits[self.n_hits].ts_max = self.record_ts
        self.hits[self.n_hits].run_first = 0
        self.hits[self.n_hits].run_count = 0
        self.n_hits += 1
        return 0

    cdef int add_run_hit(self) except -1:
        """The one KIND_RUN hit of a run's generated IDs (after the last record)."""
        cdef const unsigned char* first = <const unsigned char*>PyBytes_AS_STRING(self.uid_bytes)
        cdef KeyHit* h
        self.add_hit(first, 0, KIND_RUN)              # grows the array; its fields set below
        h = &self.hits[self.n_hits - 1]
        h.hash = uid_run_hash(first)
        h.timestamp = self.min_timestamp
        h.ts_max = self.max_timestamp
        h.offset_delta = 0
        h.run_first = v7_counter(first)
        h.run_count = <uint32_t>self.count
        return 0

    cdef int add_key_words(self, const unsigned char* p, Py_ssize_t n) except -1:
        """A `keys` header: every space-separated word is a key."""
        cdef Py_ssize_t at = 0, w
        while True:
            w = next_word(p, n, &at)
            if w == 0:
                return 0
            self.add_hit(p + at - w, w, KIND_KEY)

    cdef int note_header(self, const char* kp, Py_ssize_t klen, object hv) except -1:
        """Index the value of a `tag`, `keys` or `uid` header (others are not indexed)."""
        cdef const unsigned char* vp
        cdef Py_ssize_t vlen
        if hv is None or klen < 3 or klen > 4:
            return 0
        view = hv if type(hv) is bytes else bytes(hv)
        vp = <const unsigned char*>PyBytes_AS_STRING(view)
        vlen = PyBytes_GET_SIZE(view)
        if klen == 3 and memcmp(kp, b"uid", 3) == 0:
            self.keep_uid(vp, vlen)
            return self.add_hit(vp, vlen, KIND_UID) if self.collect_hits else 0
        if not self.collect_hits:
            return 0
        if klen == 3 and memcmp(kp, b"tag", 3) == 0:
            return self.add_hit(vp, vlen, KIND_TAG)
        if klen == 4 and memcmp(kp, b"keys", 4) == 0:
            return self.add_key_words(vp, vlen)
        return 0

    cdef void keep_uid(self, const unsigned char* p, Py_ssize_t n) noexcept:
        """Remember the current record's unique ID for the append's metadata."""
        if self.uid_bytes is not None and n == 16:
            memcpy(PyBytes_AS_STRING(self.uid_bytes) + 16 * self.record_index, p, 16)

    @property
    def uids(self):
        """16 bytes per record, its unique ID (zeros: none); None unless IDs were generated."""
        return self.uid_bytes

    @property
    def key_hits(self):
        """The KeyHits (hashing.pxd) of every record, packed in native order, for the index."""
        if self.packed_hits is None:
            self.packed_hits = PyBytes_FromStringAndSize(<const char*>self.hits,
                                                         self.n_hits * sizeof(KeyHit))
        return self.packed_hits

    cdef int reserve(self, Py_ssize_t extra) except -1:
        """Room for `extra` more glue bytes."""
        cdef Py_ssize_t need = self.glue_len + extra
        cdef Py_ssize_t cap = self.glue_cap
        cdef unsigned char* g
        if need <= cap:
            return 0
        while cap < need:
            cap *= 2
        g = <unsigned char*>realloc(self.glue, cap)
        if g == NULL:
            raise MemoryError()
        self.glue = g
        self.glue_cap = cap
        return 0

    cdef int add_piece(self, const unsigned char* ptr, Py_ssize_t off, Py_ssize_t n) except -1:
        cdef Piece* p
        if n == 0:
            return 0
        if ptr == NULL and self.n_pieces and self.pieces[self.n_pieces - 1].ptr == NULL:
            self.pieces[self.n_pieces - 1].len += n           # extend the open glue piece
            return 0
        if self.n_pieces == self.pieces_cap:
            p = <Piece*>PyMem_Realloc(self.pieces, 2 * self.pieces_cap * sizeof(Piece))
            if p == NULL:
                raise MemoryError()
            self.pieces = p
            self.pieces_cap *= 2
        self.pieces[self.n_pieces].ptr = ptr
        self.pieces[self.n_pieces].off = off
        self.pieces[self.n_pieces].len = n
        self.n_pieces += 1
        if ptr != NULL:
            self.ref_bytes += n
        return 0

    cdef inline int put_varint(self, int64_t v) except -1:
        self.reserve(MAX_VARINT_BYTES)
        cdef int n = write_varint(self.glue + self.glue_len, v)
        self.add_piece(NULL, self.glue_len, n)
        self.glue_len += n
        return 0

    cdef int put_raw(self, const unsigned char* p, Py_ssize_t n) except -1:
        self.reserve(n)
        if n:
            memcpy(self.glue + self.glue_len, p, n)
        self.add_piece(NULL, self.glue_len, n)
        self.glue_len += n
        return 0

    cdef int put_field(self, object obj, Py_ssize_t gather_threshold) except -1:
        """Length varint + bytes of a key/value/header value; None is length -1."""
        cdef Py_ssize_t n
        if obj is None:
            return self.put_varint(-1)
        if type(obj) is bytes:
            n = PyBytes_GET_SIZE(obj)
            self.put_varint(n)
            if n >= gather_threshold:
                self.refs.append(obj)
                return self.add_piece(<const unsigned char*>PyBytes_AS_STRING(obj), 0, n)
            return self.put_raw(<const unsigned char*>PyBytes_AS_STRING(obj), n)
        if isinstance(obj, bytearray):
            # copied, never referenced: a bytearray can be resized while writev runs
            n = PyByteArray_GET_SIZE(obj)
            self.put_varint(n)
            return self.put_raw(<const unsigned char*>PyByteArray_AS_STRING(obj), n)
        if isinstance(obj, str):
            raise InvalidRecordError(
                "keys, values and header values must be bytes-like or None, not str "
                "(encode it first, e.g. s.encode())")
        try:
            copy = bytes(memoryview(obj))
        except TypeError:
            raise InvalidRecordError(
                f"keys, values and header values must be bytes-like or None, "
                f"not {type(obj).__name__}") from None
        return self.put_field(copy, gather_threshold)

    cdef Py_ssize_t glue_size_since(self, Py_ssize_t piece_index, Py_ssize_t glue_mark):
        """Bytes appended since (piece_index, glue_mark): glue plus referenced pieces."""
        cdef Py_ssize_t total = self.glue_len - glue_mark
        cdef Py_ssize_t i
        for i in range(piece_index, self.n_pieces):
            if self.pieces[i].ptr != NULL:
                total += self.pieces[i].len
        return total

    cdef int put_header(self, object hk, object hv, Py_ssize_t gather_threshold) except -1:
        """keyLen varint + UTF-8 key + the value field of one header."""
        cdef Py_ssize_t klen
        cdef const char* kp
        if type(hk) is str:
            try:
                kp = PyUnicode_AsUTF8AndSize(hk, &klen)     # cached in the str: no copy
            except UnicodeEncodeError:
                try:
                    hk = (<str>hk).encode("utf-8", "surrogateescape")
                except UnicodeEncodeError:
                    raise InvalidRecordError(
                        f"header key {hk!r} is not encodable as UTF-8") from None
                kp = PyBytes_AS_STRING(hk)
                klen = PyBytes_GET_SIZE(hk)
        elif isinstance(hk, bytes):
            kp = PyBytes_AS_STRING(hk)
            klen = PyBytes_GET_SIZE(hk)
        else:
            raise InvalidRecordError(f"header keys must be str, not {type(hk).__name__}")
        self.put_varint(klen)
        self.put_raw(<const unsigned char*>kp, klen)
        self.put_field(hv, gather_threshold)          # validates hv before it is indexed
        if self.collect_hits or self.uid_bytes is not None:
            self.note_header(kp, klen, hv)
        return 0

    cdef int put_uid_header(self, unsigned char* g) except -1:
        """Write the 21-byte `uid` header (key "uid", a fresh 16-byte UUIDv7) at g."""
        global uid_counter
        uid_counter += 1
        memcpy(g, self.uid_template, 21)
        put_counter(g + 5, uid_counter)
        if self.uid_bytes is not None:
            memcpy(PyBytes_AS_STRING(self.uid_bytes) + 16 * self.record_index, g + 5, 16)
        if self.collect_hits and not self.uid_run:
            self.add_hit(g + 5, 16, KIND_UID)
        return 0

    cdef int put_headers(self, object hdrs, Py_ssize_t gather_threshold, bint add_uid) except -1:
        """The header count and headers; `add_uid` appends a fresh `uid` header unless the
        producer already supplied one."""
        cdef object items = ()
        if type(hdrs) is dict:
            items = (<dict>hdrs).items()
        elif hdrs is not None:
            try:
                items = list(hdrs.items()) if isinstance(hdrs, dict) else list(hdrs)
            except (TypeError, AttributeError):
                raise InvalidRecordError(
                    f"headers must be a dict or (str, bytes|None) pairs, not {hdrs!r}") from None
        if add_uid and has_uid_header(items):
            add_uid = False
        self.put_varint(len(items) + (1 if add_uid else 0))
        for item in items:
            try:
                hk, hv = item
            except (TypeError, ValueError):
                raise InvalidRecordError(
                    f"a header must be a (str, bytes|None) pair, not {item!r}") from None
            self.put_header(hk, hv, gather_threshold)
        if add_uid:
            self.reserve(21)
            self.put_uid_header(self.glue + self.glue_len)
            self.add_piece(NULL, self.glue_len, 21)
            self.glue_len += 21
        return 0

    cdef int put_simple_record(self, int64_t ts_delta, int64_t offset_delta, object key,
                               object value, Py_ssize_t gather_threshold, bint add_uid) except -1:
        """The common shape, written in one pass: key and value `bytes` or None, no headers
        but an optional generated `uid`.

        The body size is known up front, so the length prefix goes first and nothing moves.
        """
        cdef Py_ssize_t klen = -1 if key is None else PyBytes_GET_SIZE(key)
        cdef Py_ssize_t vlen = -1 if value is None else PyBytes_GET_SIZE(value)
        cdef Py_ssize_t body = simple_body_size(ts_delta, offset_delta, klen, vlen, add_uid)
        cdef unsigned char* g
        cdef Py_ssize_t at
        self.reserve(body + MAX_VARINT_BYTES)
        g = self.glue + self.glue_len
        at = write_varint(g, body)
        g[at] = 0                                                 # attributes
        at += 1
        at += write_varint(g + at, ts_delta)
        at += write_varint(g + at, offset_delta)
        if self.collect_hits and klen >= 0:
            self.add_hit(PyBytes_AS_STRING(key), klen, KIND_KEY)
        at = self.put_pending_field(at, key, klen, gather_threshold)
        at = self.put_pending_field(at, value, vlen, gather_threshold)
        (self.glue + self.glue_len)[at] = 2 if add_uid else 0     # header count (varint 1 / 0)
        at += 1
        if add_uid:
            self.put_uid_header(self.glue + self.glue_len + at)
            at += 21
        self.add_piece(NULL, self.glue_len, at)
        self.glue_len += at
        return 0

    cdef Py_ssize_t put_plain_records(self, list values, list keys, Py_ssize_t n,
                                      Py_ssize_t gather_threshold, bint add_uid,
                                      Py_ssize_t limit) except -1:
        """All n records in one pass when they have the common shape: `bytes` (or None) values
        and keys below the gather threshold, no headers, one timestamp (delta 0), offset deltas
        0..n-1; returns how many were written: fewer than n when the next record would take
        the batch past `limit` bytes (at least one is always written). At the first item of
        another shape everything written is taken back and 0 returned (the caller encodes
        record by record).

        No call per record but memcpy (and the ID and hash ones the records ask for), and no
        Python code runs meanwhile, so the list items stay as they were checked.
        """
        cdef Py_ssize_t i, klen, vlen, body, need, used, at
        cdef Py_ssize_t start = self.glue_len, start_hits = self.n_hits
        cdef PyObject* o
        cdef PyObject* k
        cdef unsigned char* g
        cdef bint odd = False
        self.reserve(32 * n)
        g = self.glue + start
        for i in range(n):
            prefetch_values(values, i)
            o = PyList_GET_ITEM(values, i)
            if <object>o is None:
                vlen = -1
            elif bytes_exact(o) and object_size(o) < gather_threshold:
                vlen = object_size(o)
            else:
                odd = True
                break
            klen = -1
            k = NULL
            if keys is not None:
                k = PyList_GET_ITEM(keys, i)
                if <object>k is not None:
                    if not bytes_exact(k) or object_size(k) >= gather_threshold:
                        odd = True
                        break
                    klen = object_size(k)
            body = simple_body_size(0, i, klen, vlen, add_uid)
            need = varint_size(body) + body
            used = g - self.glue
            if used + need > limit and i > 0:
                n = i                                             # full: the rest is the caller's
                break
            if used + need > self.glue_cap:
                self.glue_len = used
                self.reserve(need)                                # may move the glue
                g = self.glue + used
            at = write_varint(g, body)
            g[at] = 0                                             # attributes
            g[at + 1] = 0                                         # timestampDelta 0
            at += 2
            at += write_varint(g + at, i)                         # offsetDelta
            at += write_varint(g + at, klen)
            if klen > 0:
                memcpy(g + at, bytes_data(k), klen)
                at += klen
            self.record_delta = <int32_t>i
            self.record_index = i
            if self.collect_hits and klen >= 0:
                self.add_hit(bytes_data(k), klen, KIND_KEY)
            at += write_varint(g + at, vlen)
            if vlen > 0:
                memcpy(g + at, bytes_data(o), vlen)
                at += vlen
            g[at] = 2 if add_uid else 0                           # header count (varint 1 / 0)
            at += 1
            if add_uid:
                self.put_uid_header(g + at)
                at += 21
            g += at
        if odd:
            self.glue_len = start                                 # take it all back
            self.n_hits = start_hits
            return 0
        self.add_piece(NULL, start, (g - self.glue) - start)
        self.glue_len = g - self.glue
        return n

    cdef Py_ssize_t put_pending_field(self, Py_ssize_t at, object field, Py_ssize_t n,
                                      Py_ssize_t gather_threshold) except -1:
        """keyLen/valueLen varint + bytes of a `bytes` (or None, n = -1) field, written after the
        `at` pending glue bytes (room reserved by the caller); returns the new pending count."""
        cdef unsigned char* g = self.glue + self.glue_len
        at += write_varint(g + at, n)
        if n <= 0:
            return at
        if n >= gather_threshold:
            return self.flush_glue(at, field, n)
        memcpy(g + at, PyBytes_AS_STRING(field), n)
        return at + n

    cdef Py_ssize_t flush_glue(self, Py_ssize_t pending, object ref, Py_ssize_t n) except -1:
        """Close the `pending` glue bytes written at glue_len as a piece, then reference `ref`."""
        self.add_piece(NULL, self.glue_len, pending)
        self.glue_len += pending
        self.refs.append(ref)
        self.add_piece(<const unsigned char*>PyBytes_AS_STRING(ref), 0, n)
        return 0

    cdef int put_record(self, int64_t ts_delta, int64_t offset_delta, object key, object value,
                        object hdrs, Py_ssize_t gather_threshold, bint add_uid) except -1:
        """Encode one record; its length prefix is written once the body size is known."""
        cdef Py_ssize_t len_at, piece_at, body, gap, j
        cdef int lsize
        # reserve the longest length prefix, encode the body, then close the gap: only this
        # record's glue bytes move (referenced pieces never do)
        self.reserve(MAX_VARINT_BYTES)
        len_at = self.glue_len
        self.add_piece(NULL, len_at, MAX_VARINT_BYTES)
        self.glue_len += MAX_VARINT_BYTES
        piece_at = self.n_pieces - 1
        self.put_raw(<const unsigned char*>b"\x00", 1)             # attributes
        self.put_varint(ts_delta)
        self.put_varint(offset_delta)
        self.put_field(key, gather_threshold)
        if self.collect_hits and key is not None:
            kb = key if type(key) is bytes else bytes(key)
            self.add_hit(PyBytes_AS_STRING(kb), PyBytes_GET_SIZE(kb), KIND_KEY)
        self.put_field(value, gather_threshold)
        self.put_headers(hdrs, gather_threshold, add_uid)
        body = self.glue_size_since(piece_at, len_at) - MAX_VARINT_BYTES
        lsize = write_varint(self.glue + len_at, body)
        gap = MAX_VARINT_BYTES - lsize
        memmove(self.glue + len_at + lsize, self.glue + len_at + MAX_VARINT_BYTES,
                self.glue_len - len_at - MAX_VARINT_BYTES)
        self.glue_len -= gap
        self.pieces[piece_at].len -= gap
        for j in range(piece_at + 1, self.n_pieces):
            if self.pieces[j].ptr == NULL:
                self.pieces[j].off -= gap
        return 0

    cdef int finish(self, int attributes, int64_t log_append_time, int64_t producer_id,
                    int producer_epoch, int32_t base_sequence, int32_t leader_epoch) except -1:
        """Fill the 61-byte header (glue bytes 0..60) and the CRC over all pieces."""
        cdef unsigned char* h = self.glue
        cdef Py_ssize_t i, total = 0
        cdef uint32_t crc
        cdef const unsigned char* ptr
        for i in range(self.n_pieces):
            total += self.pieces[i].len
        if total > MAX_BATCH_BYTES:
            raise RecordTooLargeError(f"record batch of {total} bytes exceeds the 2 GiB format limit")
        self.size = total
        if log_append_time >= 0:
            attributes |= ATTR_LOG_APPEND_TIME
            self.max_timestamp = self.min_timestamp = log_append_time
        self.attributes = attributes
        store_be64(h, <uint64_t>self.base_offset)
        store_be32(h + 8, <uint32_t>(total - LOG_OVERHEAD))
        store_be32(h + 12, <uint32_t>leader_epoch)
        h[16] = 2
        store_be16(h + 21, <uint16_t>attributes)
        store_be32(h + 23, <uint32_t>self.last_offset_delta)
        store_be64(h + 27, <uint64_t>self.base_timestamp)
        store_be64(h + 35, <uint64_t>self.max_timestamp)
        store_be64(h + 43, <uint64_t>producer_id)
        store_be16(h + 51, <uint16_t>producer_epoch)
        store_be32(h + 53, <uint32_t>base_sequence)
        store_be32(h + 57, <uint32_t>self.count)
        # piece 0 is glue starting at byte 0 (the header): CRC from byte 21 of it, then the rest
        crc = crc32c_extend(0, h + CRC_START, self.pieces[0].len - CRC_START)
        with nogil:
            for i in range(1, self.n_pieces):
                ptr = self.pieces[i].ptr
                if ptr == NULL:
                    ptr = self.glue + self.pieces[i].off
                crc = crc32c_extend(crc, ptr, self.pieces[i].len)
        store_be32(h + CRC_OFFSET, crc)
        self.crc = crc
        return 0

    def set_base_offset(self, int64_t base_offset):
        """Assign the batch's base offset (bytes 0..7, outside the CRC)."""
        if base_offset < 0:
            raise ValueError(f"base offset must be >= 0, not {base_offset}")
        self.base_offset = base_offset
        store_be64(self.glue, <uint64_t>base_offset)

    def set_leader_epoch(self, int32_t leader_epoch):
        """Stamp the partitionLeaderEpoch (bytes 12..15, outside the CRC): the epoch the
        appending broker leads the partition at, as Kafka's leaders stamp every batch."""
        if leader_epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, not {leader_epoch}")
        store_be32(self.glue + 12, <uint32_t>leader_epoch)

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    def write_to(self, int fd):
        """Write every piece to `fd` at its current position (writev, GIL released).

        Retries short writes and EINTR. Raises OSError on failure; the caller truncates the file
        back, since part of the batch may have reached it.
        """
        cdef iovec iov[IOV_BATCH]
        cdef Py_ssize_t i = 0, k, done
        cdef ssize_t w
        cdef int err = 0
        with nogil:
            while i < self.n_pieces and err == 0:
                k = 0
                while k < IOV_BATCH and i + k < self.n_pieces:
                    iov[k].iov_base = <void*>(self.pieces[i + k].ptr if self.pieces[i + k].ptr != NULL
                                               else self.glue + self.pieces[i + k].off)
                    iov[k].iov_len = self.pieces[i + k].len
                    k += 1
                done = 0
                while done < k:
                    w = writev(fd, &iov[done], <int>(k - done))
                    if w < 0:
                        if errno == EINTR or errno == EAGAIN:
                            continue
                        err = errno
                        break
                    if w == 0:
                        err = ENOSPC    # a zero-byte write makes no progress
                        break
                    while done < k and <size_t>w >= iov[done].iov_len:
                        w -= iov[done].iov_len
                        done += 1
                    if done < k and w > 0:
                        iov[done].iov_base = <void*>(<char*>iov[done].iov_base + w)
                        iov[done].iov_len -= w
                i += k
        if err:
            import os
            raise OSError(err, os.strerror(err))
        return self.size

    def tobytes(self):
        """The whole batch as one bytes object (tests, tools, the raw-write baseline)."""
        out = PyBytes_FromStringAndSize(NULL, self.size)
        cdef char* dst = PyBytes_AS_STRING(out)
        cdef Py_ssize_t i, at = 0
        cdef const unsigned char* ptr
        for i in range(self.n_pieces):
            ptr = self.pieces[i].ptr
            if ptr == NULL:
                ptr = self.glue + self.pieces[i].off
            memcpy(dst + at, ptr, self.pieces[i].len)
            at += self.pieces[i].len
        return out

    @property
    def piece_count(self):
        return self.n_pieces


cdef Py_ssize_t estimate_glue(list values, object keys, Py_ssize_t gather_threshold):
    """Glue bytes the records will need (copied bytes plus ~24 bytes of varints a record), so
    the buffer is sized once instead of growing by doubling and copying."""
    cdef Py_ssize_t total = 0, n
    cdef object v
    for v in values:
        if type(v) is bytes:
            n = PyBytes_GET_SIZE(v)
            if n < gather_threshold:
                total += n
        total += 24
    if type(keys) is list:
        for v in <list>keys:
            if type(v) is bytes:
                n = PyBytes_GET_SIZE(v)
                if n < gather_threshold:
                    total += n
    return total


cdef inline int64_t as_timestamp(object ts) except? -2:
    cdef int64_t v
    try:
        v = PyNumber_Index(ts)
    except (TypeError, OverflowError):
        raise InvalidRecordError(f"timestamps must be integers of milliseconds, not {ts!r}") from None
    if v < 0:
        raise InvalidRecordError(f"timestamps must be >= 0 ms, not {v}")
    return v


cdef Py_ssize_t sequence_length(object seq, str what) except -1:
    """len(seq), or InvalidRecordError when `seq` is not a sequence at all."""
    try:
        return len(seq)
    except TypeError:
        raise InvalidRecordError(
            f"{what} must be a sequence with one entry per value, not {type(seq).__name__}"
        ) from None


cdef list check_offset_deltas(object offset_deltas, Py_ssize_t n, int64_t last_offset_delta):
    """encode_batch's explicit offset deltas as a list of ints, checked (None: consecutive)."""
    cdef list out
    cdef Py_ssize_t i
    cdef int64_t d, prev = -1
    if offset_deltas is None:
        if last_offset_delta != -1:
            raise InvalidRecordError("last_offset_delta needs offset_deltas")
        return None
    try:
        out = list(offset_deltas)
    except TypeError:
        raise InvalidRecordError(
            f"offset_deltas must be a sequence, not {type(offset_deltas).__name__}") from None
    if len(out) != n:
        raise InvalidRecordError(f"{len(out)} offset_deltas for {n} values")
    for i in range(n):
        if isinstance(out[i], bool) or not isinstance(out[i], int):
            raise InvalidRecordError(f"offset_deltas[{i}] must be an int, not {out[i]!r}")
        if not prev < out[i] <= INT32_MAX:
            raise InvalidRecordError(
                f"offset_deltas[{i}]={out[i]} must be above {prev} and at most {INT32_MAX}")
        d = out[i]
        prev = d
    if last_offset_delta > INT32_MAX or (last_offset_delta != -1 and last_offset_delta < prev):
        raise InvalidRecordError(
            f"last_offset_delta={last_offset_delta} is below the last record's delta {prev} "
            f"or above {INT32_MAX}")
    return out


cdef inline void prefetch_values(list values, Py_ssize_t i) noexcept:
    """Let the copy of the values overlap their cache misses: the object header of value
    i + 2*AHEAD, and the bytes of value i + AHEAD (its header arrived two records ago). Bounds
    come from the list as it is now: a timestamp's __index__ may have shortened it."""
    cdef PyObject* o
    cdef Py_ssize_t n = PyList_GET_SIZE(values)
    if i + 2 * PREFETCH_AHEAD < n:
        mq_prefetch(PyList_GET_ITEM(values, i + 2 * PREFETCH_AHEAD))
    if i + PREFETCH_AHEAD < n:
        o = PyList_GET_ITEM(values, i + PREFETCH_AHEAD)
        if bytes_exact(o):
            mq_prefetch_range(<const unsigned char*>bytes_data(o),
                              min(object_size(o), <Py_ssize_t>PREFETCH_MAX))


def encode_batch(values, keys=None, headers=None, timestamps=None, int64_t now_ms=0,
                 int codec=0, int64_t log_append_time=-1, int64_t producer_id=-1,
                 int producer_epoch=-1, int32_t base_sequence=-1, bint transactional=False,
                 int32_t leader_epoch=-1, Py_ssize_t gather_threshold=DEFAULT_GATHER_THRESHOLD,
                 compress=None, int64_t uid_ms=-1, bint index=False, offset_deltas=None,
                 int64_t last_offset_delta=-1, Py_ssize_t max_bytes=0):
    """Encode one v2 batch from parallel sequences; returns an EncodedBatch (base offset -1).

    `timestamps` None stamps every record with `now_ms`. With a codec, the records are built in
    the glue buffer and `compress(codec, records) -> bytes` makes the one compressed stream.
    `uid_ms >= 0` gives every record without a `uid` header a generated one of that time;
    `index` collects the records' KeyHits (`key_hits`) for the segment's key index.
    `offset_deltas` (strictly increasing ints in [0, 2**31)) gives each record its offset delta
    instead of 0, 1, 2, ...; `last_offset_delta` (default: the last record's delta, never less)
    keeps a rewritten batch's offset range (the cleaner keeps records' offsets, gaps and all).
    `max_bytes > 0` (uncompressed, no offset_deltas) makes the batch the longest run of records
    from the first that fits in `max_bytes` (at least one record): `count` says how many, and
    the caller encodes the rest into the next batch, so no record is encoded twice.
    """
    cdef EncodedBatch eb = EncodedBatch.__new__(EncodedBatch)
    cdef Py_ssize_t n, i, done, limit
    cdef Py_ssize_t saved_glue, saved_pieces, saved_len, saved_hits, saved_refs, saved_ref_bytes
    cdef int64_t ts, base_ts, max_ts, saved_max_ts, min_ts, saved_min_ts
    cdef list values_list
    try:
        values_list = values if type(values) is list else list(values)
    except TypeError:
        raise InvalidRecordError(f"values must be a sequence, not {type(values).__name__}") from None
    values = values_list
    n = len(values)
    if n == 0:
        raise InvalidRecordError("a batch needs at least one record")
    if n > INT32_MAX:
        raise InvalidRecordError(f"a batch holds at most {INT32_MAX} records, not {n}")
    if keys is not None and sequence_length(keys, "keys") != n:
        raise InvalidRecordError(f"{len(keys)} keys for {n} values")
    if headers is not None and sequence_length(headers, "headers") != n:
        raise InvalidRecordError(f"{len(headers)} header sets for {n} values")
    if timestamps is not None and sequence_length(timestamps, "timestamps") != n:
        raise InvalidRecordError(f"{len(timestamps)} timestamps for {n} values")
    deltas = check_offset_deltas(offset_deltas, n, last_offset_delta)
    if timestamps is None:
        if now_ms < 0:
            raise InvalidRecordError(f"timestamps must be >= 0 ms, not {now_ms}")
        base_ts = max_ts = min_ts = now_ms
    else:
        base_ts = as_timestamp(timestamps[0])
        max_ts = min_ts = base_ts
    if codec != 0:
        gather_threshold = MAX_BATCH_BYTES              # compressors need one contiguous stream
    # a compressed size is known only at the end, and a rewrite keeps its offsets: no limit
    # there; without max_bytes every record goes in (finish() refuses a batch past 2 GiB)
    if max_bytes > 0 and codec == 0 and deltas is None:
        limit = min(max_bytes, <Py_ssize_t>MAX_BATCH_BYTES)
    else:
        limit = PTRDIFF_MAX
    eb.collect_hits = index
    eb.uid_ms = uid_ms
    eb.uid_run = uid_ms >= 0 and headers is None and deltas is None
    if uid_ms >= 0:
        reseed_uids()
        uid_header_template(eb.uid_template, uid_ms)
        eb.uid_bytes = PyBytes_FromStringAndSize(NULL, 16 * n)   # filled record by record
        if not eb.uid_run:                                       # a run fills every record's
            memset(PyBytes_AS_STRING(eb.uid_bytes), 0, 16 * n)
    eb.add_piece(NULL, 0, BATCH_HEADER_SIZE)                # the header, filled by finish()
    eb.glue_len = BATCH_HEADER_SIZE
    eb.record_ts = base_ts if log_append_time < 0 else log_append_time
    done = 0
    if (timestamps is None and headers is None and deltas is None
            and (keys is None or type(keys) is list)):
        done = eb.put_plain_records(values_list, keys, n, gather_threshold, uid_ms >= 0, limit)
    if done == 0:
        done = n
        eb.reserve(estimate_glue(values_list, keys, gather_threshold)
                   + (21 * n if uid_ms >= 0 else 0))
        saved_max_ts, saved_min_ts = max_ts, min_ts
        for i in range(n):
            prefetch_values(values_list, i)
            if timestamps is None:
                ts = base_ts
            else:
                ts = as_timestamp(timestamps[i])
                if ts > max_ts:
                    max_ts = ts
                if ts < min_ts:
                    min_ts = ts
            key = None if keys is None else keys[i]
            value = values[i]
            hdrs = None if headers is None else headers[i]
            eb.record_ts = ts if log_append_time < 0 else log_append_time
            eb.record_delta = <int32_t>i if deltas is None else <int32_t>deltas[i]
            eb.record_index = i
            saved_glue, saved_pieces, saved_hits = eb.glue_len, eb.n_pieces, eb.n_hits
            saved_len, saved_ref_bytes = eb.pieces[eb.n_pieces - 1].len, eb.ref_bytes
            saved_refs = len(eb.refs)
            if ((hdrs is None or (type(hdrs) is list and not hdrs))
                    and (key is None or type(key) is bytes)
                    and (value is None or type(value) is bytes)):
                eb.put_simple_record(ts - base_ts, eb.record_delta, key, value, gather_threshold,
                                     uid_ms >= 0)
            else:
                eb.put_record(ts - base_ts, eb.record_delta, key, value, hdrs, gather_threshold,
                              uid_ms >= 0)
            if i > 0 and eb.glue_len + eb.ref_bytes > limit:
                # full: this record goes into the caller's next batch
                eb.glue_len, eb.n_pieces, eb.n_hits = saved_glue, saved_pieces, saved_hits
                eb.pieces[saved_pieces - 1].len = saved_len
                eb.ref_bytes = saved_ref_bytes
                del eb.refs[saved_refs:]
                max_ts, min_ts = saved_max_ts, saved_min_ts
                done = i
                break
            saved_max_ts, saved_min_ts = max_ts, min_ts
    n = done
    if eb.uid_bytes is not None and PyBytes_GET_SIZE(eb.uid_bytes) != 16 * n:
        eb.uid_bytes = eb.uid_bytes[:16 * n]
    eb.count = <int32_t>n
    if deltas is None:
        eb.last_offset_delta = <int32_t>(n - 1)
    else:
        eb.last_offset_delta = <int32_t>max(last_offset_delta, <int64_t>deltas[n - 1])
    eb.base_timestamp = base_ts
    eb.max_timestamp = max_ts
    eb.min_timestamp = min_ts
    if log_append_time >= 0:
        eb.max_timestamp = eb.min_timestamp = log_append_time   # as finish() sets them
    if eb.uid_run and index:
        eb.add_run_hit()
    if codec != 0:
        compressed = compress(codec, PyBytes_FromStringAndSize(
            <const char*>eb.glue + BATCH_HEADER_SIZE, eb.glue_len - BATCH_HEADER_SIZE))
        eb.glue_len = BATCH_HEADER_SIZE
        eb.n_pieces = 1
        eb.pieces[0].len = BATCH_HEADER_SIZE
        eb.refs.append(compressed)
        eb.add_piece(<const unsigned char*>PyBytes_AS_STRING(compressed), 0,
                     PyBytes_GET_SIZE(compressed))
    eb.finish(codec | (ATTR_TRANSACTIONAL if transactional else 0), log_append_time,
              producer_id, producer_epoch, base_sequence, leader_epoch)
    return eb
