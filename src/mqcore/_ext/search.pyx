# Message search: one pass over a segment's mapped bytes (whole Kafka v2 batches back to back
# from index 0) that returns the records passing a filter, without materialising the others.
#
# scan_records(buf, pos, ...) starts at the batch at `pos` and walks batches in order:
#   - a batch whose bytes are incomplete ends the scan (the end of valid data, reason "end");
#     any other invalid batch or record raises CorruptRecordError naming `source` and
#     `file_pos + position` of its batch;
#   - every batch reached is checked in full first (lengths, magic, codec, counts, the CRC when
#     verify_crc); one whose base offset is >= max_offset then ends the scan (reason "end");
#   - a whole batch is skipped without decoding its records when it is a control batch
#     (attribute bit 5: no user messages), when its last offset < min_offset, when its
#     maxTimestamp < min_ts (the max bounds every record's timestamp), or, under LogAppendTime
#     (bit 3, every record carries maxTimestamp), when maxTimestamp >= max_ts;
#   - otherwise its records are decoded (compressed batches are decompressed first). Records
#     below min_offset are passed over (not counted as scanned); a record at or past max_offset
#     ends the scan (reason "end"); every other record is scanned and matches when its
#     timestamp is in [min_ts, max_ts) AND (no needle, or the needle occurs in its value
#     (a null value never matches; an empty needle matches every non-null value), or in_key
#     and it occurs in its key) AND (no tag, or one of its headers has the key b"tag" and a
#     value equal to tag).
# The scan stops right after the record that makes `limit` matches (reason "limit") or uses up
# the `max_records` budget (reason "max_records"). The result says where to resume: the batch
# position `next_position` and the first offset not yet examined `next_offset`; a later call
# with pos=next_position, min_offset=next_offset continues exactly where this one stopped.
# After max_offset ended a scan, next_offset >= max_offset. records_scanned counts the records
# tested against the filter; bytes_scanned sums the sizes of the batches whose records were
# walked or passed over as below (a skipped batch is not counted: its header, and its CRC when
# verify_crc, are all that is read of it). Each batch counts once over the calls of one scan:
# a call that resumes inside a batch (its base offset below min_offset: the call before
# stopped in it and counted it) does not count it again, unless count_partial (a scan that
# starts there, at a cursor or the time index's answer, counts the batch it starts in).
#
# Content search (a non-empty needle) reads each batch once, not once per record:
#   - the batch's records area (the decompressed one for a compressed batch) is searched for
#     the needle as a whole. For an uncompressed batch this search runs in the same pass as
#     the CRC (mqs_crc_find in search_impl.h): each byte comes into cache once for both. A
#     compressed batch's CRC covers its compressed bytes and is checked before they are
#     decompressed.
#   - a record's key or value contains the needle only if the area does, so when the area
#     holds no occurrence, no record of the batch can match. Such a batch is passed over: when
#     its CRC was verified and its records all lie in [min_offset, max_offset) and within what
#     is left of the budget, its recordsCount is added to records_scanned and the scan moves on
#     without decoding a record. Otherwise (verify_crc=False, or a batch cut by the offset
#     window or the budget) its records are walked as usual, so that the offset bookkeeping and
#     the errors stay exact; none of them matches.
#   - in a batch that holds the needle, each record is decoded as before; its fields are tested
#     against the first occurrence at or after them (found by one search that goes on from
#     there), so the area is searched once in total whatever the number of records.
#   What a passed-over batch is checked for: everything check_batch checks (lengths, magic,
#   codec, counts) and its CRC. What it is not checked for: the framing of its records (record
#   and field lengths, varints, offset deltas, headers, the records area being used up exactly),
#   which next_record checks when Store.read decodes it. So a CRC-valid batch whose records are
#   malformed, which only a faulty writer makes (the CRC proves the bytes are the ones written,
#   and recovery validates batches at the same level), raises under Store.read but is passed
#   over silently by a search whose needle it does not hold. Checking the framing costs more
#   than it is worth here, measured on 47-68 MB segments of 512-record batches (CRC on, median of
#   best-of-3 runs): a walk of the record length varints alone took 12 % of the scan's speed
#   with 1 KiB values (11.0 -> 9.6 GB/s) and 40 % with ~200-byte log lines (11.0 -> 6.7 GB/s);
#   decoding every record (next_record) took 27 % and 70 %. verify_crc=False scans always walk,
#   so nothing changes there: without the CRC nothing vouches for the bytes.
#
# With `into` (an ArrowColumns), a match is appended to its columns instead of becoming a
# Message (no Python object per match: a Spark task's query option, Store.iter_arrow_matching);
# `limit` then counts the rows added by the call, and the scan also stops right after the
# record that brings the columns' data to `max_bytes`.
#
# The walk runs without the GIL; it comes back only to decompress a batch, to build the
# Message of a match (or add its row) and to raise.
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport INT32_MAX, INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp

from mqcore._ext.arrowcols cimport ArrowColumns
from mqcore._ext.batch cimport (
    ATTR_CODEC_MASK, ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BATCH_HEADER_SIZE, CRC_START, E_CRC,
    E_SHORT, BatchHeader, HeaderView, LOG_OVERHEAD, OK, RecordCursor, RecordView, check_batch,
    cursor_finish, cursor_init, error_text, make_message, next_header, next_record, open_records,
)

from mqcore.errors import CorruptRecordError, InvalidConfigError

cdef extern from "search_impl.h":
    const unsigned char* mqs_find(const unsigned char* p, size_t n, const unsigned char* nd,
                                  size_t m) nogil
    const unsigned char* mqs_crc_find(uint32_t* crc, const unsigned char* p, size_t n,
                                      const unsigned char* nd, size_t m) nogil
    uint32_t mq_crc32c_extend(uint32_t crc, const unsigned char* p, size_t n) nogil
    void mqs_select(int fast)
    const char* mqs_name

mqs_select(1)


# SQL92 selector programs (selector_impl.h; compiled by query/selector.py): a record matches
# only when its program is TRUE. The program runs in scan_matches, after the tag test.
cdef extern from "selector_impl.h":
    enum:
        MQSEL_FALSE
        MQSEL_TRUE
        MQSEL_UNKNOWN
        MQSEL_MAX_NAMES
        MQSEL_CONST
        MQSEL_IS_NULL
        MQSEL_CMP_STR
        MQSEL_CMP_INT
        MQSEL_CMP_FLOAT
        MQSEL_CMP_BOOL
        MQSEL_STR_TEST
        MQSEL_IN
        MQSEL_IN_STR
        MQSEL_IN_INT
        MQSEL_IN_FLOAT
        MQSEL_NOT
        MQSEL_AND
        MQSEL_OR
        MQSEL_JUMP_FALSE
        MQSEL_JUMP_TRUE
        MQSEL_EQ
        MQSEL_NE
        MQSEL_LT
        MQSEL_LE
        MQSEL_GT
        MQSEL_GE
        MQSEL_CONTAINS
        MQSEL_STARTSWITH
        MQSEL_ENDSWITH
    ctypedef struct mqsel_op:
        uint8_t op
        uint8_t cmp
        uint8_t neg
        uint8_t slot
        int32_t arg
        int64_t ival
        double fval
        const unsigned char* str
        size_t str_len
    ctypedef struct mqsel_program:
        const mqsel_op* ops
        int n_ops
        int stack_depth
        int n_names
        const unsigned char* names[64]
        size_t name_len[64]
        uint8_t never[64]
        int tags_slot
        int tag_slot
    ctypedef struct mqsel_value:
        pass
    int mqsel_run(const mqsel_program* prog, const unsigned char* h, size_t n, int64_t count,
                  mqsel_value* vals, uint8_t* stack, uint64_t* seen) noexcept nogil

# What advance() stops for. EV_NEXT (keep walking) is 0 like OK, so a helper that returns OK
# or an error code can be returned as an event; error codes (E_*) are negative.
cdef enum:
    EV_NEXT = 0
    EV_END = 1          # end of the data, or an offset >= max_offset
    EV_MATCH = 2        # the RecordView holds a match
    EV_BUDGET = 3       # max_records records scanned; the last one did not match
    EV_OPEN = 4         # a compressed batch at pos: decompress it (needs the GIL)

cdef struct ScanState:
    const unsigned char* buf
    Py_ssize_t n
    Py_ssize_t pos                # position of the current batch
    bint in_batch                 # the cursor walks the records of the batch at pos
    bint fresh                    # ... and has not read any of them yet
    bint verify_crc
    BatchHeader h
    RecordCursor c
    int64_t next_offset
    int64_t scanned
    int64_t budget
    int64_t bytes
    bint count_partial            # count a batch entered below min_offset (module comment)
    # The needle's first occurrence at or after hit_from in the records area the cursor walks
    # (NULL: none before area_end); set by the batch's search, moved on by occurs_in.
    const unsigned char* area_end
    const unsigned char* hit_from
    const unsigned char* hit
    # The selector program (NULL: none), its per-record scratch, and the bit of every name a
    # record the program ran on carried.
    const mqsel_program* sel
    mqsel_value* sel_vals
    uint8_t* sel_stack
    uint64_t seen
    int64_t sel_runs


cdef inline int64_t wrap_add(int64_t a, int64_t b) noexcept nogil:
    """a + b wrapping on overflow (lying headers must not reach signed-overflow UB)."""
    return <int64_t>(<uint64_t>a + <uint64_t>b)


cdef inline int64_t max64(int64_t a, int64_t b) noexcept nogil:
    return a if a > b else b


cdef inline int64_t last_offset(const BatchHeader* h) noexcept nogil:
    return wrap_add(h.base_offset, h.last_offset_delta)


cdef inline bint contains(const unsigned char* hay, Py_ssize_t n, const unsigned char* needle,
                          Py_ssize_t m) noexcept nogil:
    """needle occurs in hay[:n]; never in a null field (n == -1)."""
    if n < 0:
        return False
    if m == 0:
        return True
    return mqs_find(hay, <size_t>n, needle, <size_t>m) != NULL


cdef inline bint occurs_in(ScanState* s, const SearchFilter* f, const unsigned char* field,
                           Py_ssize_t n) noexcept nogil:
    """contains() for a field of the record the cursor just read, from the area's hit cache:
    the fields come in increasing order, so every byte is searched at most once per batch."""
    if n < 0:
        return False
    if f.needle_len == 0:
        return True
    if field < s.hit_from or (s.hit != NULL and s.hit < field):
        s.hit = mqs_find(field, <size_t>(s.area_end - field), f.needle, <size_t>f.needle_len)
        s.hit_from = field
    return s.hit != NULL and s.hit + f.needle_len <= field + n


cdef bint has_tag(const RecordView* r, const unsigned char* tag, Py_ssize_t tag_len) noexcept nogil:
    """One of r's headers is ("tag", tag) exactly."""
    cdef const unsigned char* p = r.headers
    cdef const unsigned char* end = r.headers + r.headers_len
    cdef HeaderView hv
    cdef Py_ssize_t i
    for i in range(r.header_count):
        if next_header(&p, end, &hv) != OK:
            return False
        if (hv.key_len == 3 and memcmp(hv.key, b"tag", 3) == 0 and hv.value_len == tag_len
                and memcmp(hv.value, tag, <size_t>tag_len) == 0):
            return True
    return False


cdef inline bint in_time(const BatchHeader* h, const RecordView* r,
                         const SearchFilter* f) noexcept nogil:
    cdef int64_t ts
    if h.attributes & ATTR_LOG_APPEND_TIME:
        ts = h.max_timestamp
    else:
        ts = wrap_add(h.base_timestamp, r.timestamp_delta)
    return f.min_ts <= ts < f.max_ts


cdef int record_matches(const BatchHeader* h, const RecordView* r,
                        const SearchFilter* f) noexcept nogil:
    if not in_time(h, r, f):
        return 0
    if f.needle_len >= 0 and not (
            contains(r.value, r.value_len, f.needle, f.needle_len)
            or (f.in_key and contains(r.key, r.key_len, f.needle, f.needle_len))):
        return 0
    if f.tag_len >= 0 and not has_tag(r, f.tag, f.tag_len):
        return 0
    return 1


cdef inline bint scan_matches(ScanState* s, const RecordView* r,
                              const SearchFilter* f) noexcept nogil:
    """record_matches() for the record the cursor just read, with the hit cache (asked for
    the key before the value: the order of the bytes)."""
    if not in_time(&s.h, r, f):
        return False
    if f.needle_len >= 0 and not (
            (f.in_key and occurs_in(s, f, r.key, r.key_len))
            or occurs_in(s, f, r.value, r.value_len)):
        return False
    if f.tag_len >= 0 and not has_tag(r, f.tag, f.tag_len):
        return False
    if s.sel == NULL:
        return True
    s.sel_runs += 1
    return mqsel_run(
        s.sel, r.headers, <size_t>r.headers_len, r.header_count, s.sel_vals, s.sel_stack,
        &s.seen) == MQSEL_TRUE


cdef inline bint skip_batch(const BatchHeader* h, const SearchFilter* f) noexcept nogil:
    """No record of the batch can match: control, below min_offset or outside the time window."""
    if h.attributes & ATTR_CONTROL or last_offset(h) < f.min_offset or h.max_timestamp < f.min_ts:
        return True
    return h.attributes & ATTR_LOG_APPEND_TIME and h.max_timestamp >= f.max_ts


cdef inline int past_window(ScanState* s, const SearchFilter* f) noexcept nogil:
    """An offset >= max_offset: the scan ends at the batch holding it."""
    s.next_offset = max64(s.next_offset, f.max_offset)
    return EV_END


cdef inline void leave_batch(ScanState* s) noexcept nogil:
    s.next_offset = max64(s.next_offset, wrap_add(last_offset(&s.h), 1))
    s.pos += LOG_OVERHEAD + s.h.batch_length
    s.in_batch = False


cdef int finish_batch(ScanState* s) noexcept nogil:
    """After the batch's last record: its records area must be used up exactly; move past it."""
    cdef int rc = cursor_finish(&s.c)
    if rc != OK:
        return rc
    leave_batch(s)
    return OK


cdef int check_crc_and_find(ScanState* s, const SearchFilter* f, bint search) noexcept nogil:
    """The batch's CRC when verify_crc, and when `search` the needle's first occurrence in its
    (uncompressed) records area into the hit cache, in one pass over the bytes."""
    cdef const unsigned char* batch = s.buf + s.pos
    cdef const unsigned char* records = batch + BATCH_HEADER_SIZE
    cdef size_t size = LOG_OVERHEAD + s.h.batch_length - BATCH_HEADER_SIZE
    cdef uint32_t crc
    if search:
        s.area_end = records + size
        s.hit_from = records
        if not s.verify_crc:
            s.hit = mqs_find(records, size, f.needle, <size_t>f.needle_len)
            return OK
        crc = mq_crc32c_extend(0, batch + CRC_START, BATCH_HEADER_SIZE - CRC_START)
        s.hit = mqs_crc_find(&crc, records, size, f.needle, <size_t>f.needle_len)
    elif s.verify_crc:
        crc = mq_crc32c_extend(0, batch + CRC_START, LOG_OVERHEAD + s.h.batch_length - CRC_START)
    else:
        return OK
    return OK if crc == s.h.crc else E_CRC


cdef int enter_batch(ScanState* s, const SearchFilter* f) noexcept nogil:
    """Check the batch at pos and skip it, end the scan, or point the cursor at its records."""
    cdef int rc
    cdef bint walk, compressed
    if s.pos >= s.n:
        return EV_END
    rc = check_batch(s.buf + s.pos, s.n - s.pos, &s.h, False)
    if rc == E_SHORT:
        return EV_END
    if rc != OK:
        return rc
    walk = s.h.base_offset < f.max_offset and not skip_batch(&s.h, f)
    compressed = s.h.attributes & ATTR_CODEC_MASK
    rc = check_crc_and_find(s, f, walk and not compressed and f.needle_len > 0)
    if rc != OK:
        return rc
    if s.h.base_offset >= f.max_offset:
        return past_window(s, f)
    if not walk:
        if last_offset(&s.h) >= f.max_offset:
            return past_window(s, f)
        leave_batch(s)
        return EV_NEXT
    s.in_batch = True
    s.fresh = True
    if s.count_partial or s.h.base_offset >= f.min_offset:
        s.bytes += LOG_OVERHEAD + s.h.batch_length
    if compressed:
        return EV_OPEN
    cursor_init(&s.c, s.buf + s.pos + BATCH_HEADER_SIZE,
                LOG_OVERHEAD + s.h.batch_length - BATCH_HEADER_SIZE, &s.h)
    return EV_NEXT


cdef int pass_batch(ScanState* s, const SearchFilter* f) noexcept nogil:
    """The needle occurs nowhere in the batch's records: when its CRC was checked and all of
    them are in the offset window and the budget, count them as scanned and leave the batch
    without decoding them. Otherwise the walk decodes them as usual (none can match)."""
    if (not s.verify_crc or s.h.base_offset < f.min_offset or last_offset(&s.h) >= f.max_offset
            or s.h.records_count > s.budget - s.scanned):
        return EV_NEXT
    s.scanned += s.h.records_count
    leave_batch(s)
    return EV_BUDGET if s.scanned >= s.budget else EV_NEXT


cdef int scan_batch(ScanState* s, const SearchFilter* f, RecordView* r) noexcept nogil:
    """Walk the current batch's records to the next match, the budget's end or the batch's end."""
    cdef int rc
    cdef int64_t offset
    if s.fresh:
        s.fresh = False
        if f.needle_len > 0 and s.hit == NULL:
            rc = pass_batch(s, f)
            if rc != EV_NEXT or not s.in_batch:
                return rc
    while True:
        rc = next_record(&s.c, r)
        if rc == 0:
            return finish_batch(s)
        if rc < 0:
            return rc
        offset = wrap_add(s.h.base_offset, r.offset_delta)
        if offset < f.min_offset:
            continue
        if offset >= f.max_offset:
            return past_window(s, f)
        s.scanned += 1
        s.next_offset = max64(s.next_offset, wrap_add(offset, 1))
        if scan_matches(s, r, f):
            return EV_MATCH
        if s.scanned >= s.budget:
            return EV_BUDGET


cdef int advance(ScanState* s, const SearchFilter* f, RecordView* r) noexcept nogil:
    """Walk to the next event (EV_*) or error code."""
    cdef int ev
    while True:
        ev = scan_batch(s, f, r) if s.in_batch else enter_batch(s, f)
        if ev != EV_NEXT:
            return ev


cdef void search_area(ScanState* s, const SearchFilter* f) noexcept nogil:
    """Point the hit cache at the decompressed records area the cursor was just given."""
    s.area_end = s.c.end
    s.hit_from = s.c.p
    s.hit = mqs_find(s.c.p, <size_t>(s.c.end - s.c.p), f.needle, <size_t>f.needle_len)


cdef int settle(ScanState* s) noexcept nogil:
    """After stopping on a record: when it was its batch's last, resume past the batch."""
    if s.in_batch and s.c.remaining == 0:
        return finish_batch(s)
    return OK


cdef class ScanResult:
    """What one scan_records call found, how much it read, and where the next call resumes."""

    cdef readonly list messages
    cdef readonly Py_ssize_t next_position
    cdef readonly int64_t next_offset
    cdef readonly int64_t records_scanned
    cdef readonly int64_t bytes_scanned
    cdef readonly str reason
    cdef readonly uint64_t properties_seen  # bit k: a record scanned carried the program's name k
    cdef readonly int64_t selector_runs     # records the selector program ran on

    def __repr__(self):
        return (f"ScanResult({len(self.messages)} messages, reason={self.reason!r}, "
                f"next_position={self.next_position}, next_offset={self.next_offset}, "
                f"records_scanned={self.records_scanned}, bytes_scanned={self.bytes_scanned})")


cdef int set_filter(SearchFilter* f, int64_t min_offset, int64_t max_offset, int64_t min_ts,
                    int64_t max_ts, bytes needle, bint in_key, bytes tag) except -1:
    """Fill f; its pointers borrow needle's and tag's bytes (the caller keeps them alive)."""
    f.min_offset = min_offset
    f.max_offset = max_offset
    f.min_ts = min_ts
    f.max_ts = max_ts
    f.in_key = in_key
    f.needle = NULL
    f.needle_len = -1
    f.tag = NULL
    f.tag_len = -1
    if needle is not None:
        f.needle = <const unsigned char*>PyBytes_AS_STRING(needle)
        f.needle_len = PyBytes_GET_SIZE(needle)
    if tag is not None:
        f.tag = <const unsigned char*>PyBytes_AS_STRING(tag)
        f.tag_len = PyBytes_GET_SIZE(tag)
    return 0


cdef ScanResult make_result(const ScanState* s, list messages, str reason):
    cdef ScanResult out = ScanResult.__new__(ScanResult)
    out.messages = messages
    out.next_position = s.pos
    out.next_offset = s.next_offset
    out.records_scanned = s.scanned
    out.bytes_scanned = s.bytes
    out.reason = reason
    out.properties_seen = s.seen
    out.selector_runs = s.sel_runs
    return out


def scan_records(const unsigned char[::1] buf not None, Py_ssize_t pos, str topic not None,
                 int partition, int64_t min_offset, int64_t max_offset, int64_t min_ts,
                 int64_t max_ts, bytes needle=None, bint in_key=False, bytes tag=None,
                 Py_ssize_t limit=1000, int64_t max_records=INT64_MAX, bint verify_crc=True,
                 Py_ssize_t max_decompressed=256 << 20, object source=None, int64_t file_pos=0,
                 SelectorProgram selector=None, bint count_partial=True,
                 ArrowColumns into=None, Py_ssize_t max_bytes=INT32_MAX):
    """The Messages of buf[pos:] (whole batches from a batch boundary) that match, in offset
    order, with offsets in [min_offset, max_offset) and timestamps in [min_ts, max_ts): see the
    module comment for the rules; with `selector`, only those its program finds TRUE; with
    `into`, added to its columns instead (messages then stays empty). Returns a ScanResult;
    resume with pos=next_position, min_offset=next_offset unless its reason is "end" (and
    count_partial=False: the batch it resumes in was counted)."""
    cdef ScanState s
    cdef SearchFilter f
    if limit < 1:
        raise InvalidConfigError(f"limit must be >= 1, not {limit}")
    if max_records < 1:
        raise InvalidConfigError(f"max_records must be >= 1, not {max_records}")
    if pos < 0 or pos > buf.shape[0]:
        raise ValueError(f"position {pos} outside a buffer of {buf.shape[0]} bytes")
    set_filter(&f, min_offset, max_offset, min_ts, max_ts, needle, in_key, tag)
    s.buf = &buf[0] if buf.shape[0] else NULL
    s.n = buf.shape[0]
    s.pos = pos
    s.in_batch = False
    s.fresh = False
    s.verify_crc = verify_crc
    s.next_offset = min_offset
    s.scanned = 0
    s.budget = max_records
    s.bytes = 0
    s.count_partial = count_partial
    s.area_end = s.hit_from = s.hit = NULL
    s.seen = 0
    s.sel_runs = 0
    s.sel = NULL
    s.sel_vals = NULL
    s.sel_stack = NULL
    if selector is not None:
        # per call, not per program: two threads may scan with one program
        s.sel_vals = <mqsel_value*>malloc(selector.scratch_size)
        if s.sel_vals == NULL:
            raise MemoryError()
        s.sel_stack = <uint8_t*>s.sel_vals + selector.vals_size
        s.sel = &selector.prog
    try:
        return scan_loop(&s, &f, topic, partition, limit, max_decompressed, source, file_pos,
                         into, max_bytes)
    finally:
        free(s.sel_vals)


cdef ScanResult scan_loop(ScanState* ps, SearchFilter* pf, str topic, int partition,
                          Py_ssize_t limit, Py_ssize_t max_decompressed, object source,
                          int64_t file_pos, ArrowColumns into, Py_ssize_t max_bytes):
    """scan_records' walk over the prepared state: events, decompression, Messages (or rows
    of `into`), errors."""
    cdef ScanState s = ps[0]
    cdef SearchFilter f = pf[0]
    cdef RecordView r
    cdef int ev = EV_NEXT, rc
    cdef list found = []
    cdef Py_ssize_t taken = 0           # matches of this call
    cdef bint full = False
    area = None                        # owns the decompressed records the cursor walks
    while True:
        with nogil:
            ev = advance(&s, &f, &r)
        if ev == EV_OPEN:
            area = open_records(s.buf + s.pos, &s.h, max_decompressed, &s.c)
            if f.needle_len > 0:
                with nogil:
                    search_area(&s, &f)
            continue
        if ev < 0:
            raise CorruptRecordError(error_text(ev), path=source, position=file_pos + s.pos)
        if ev != EV_MATCH:
            break
        if into is None:
            found.append(make_message(topic, partition, &s.h, &r))
        else:
            into.put_record(&s.h, &r, s.h.base_offset + r.offset_delta, source, file_pos + s.pos)
            full = into.held_bytes() >= max_bytes
        taken += 1
        if taken >= limit or full or s.scanned >= s.budget:
            break
    if ev == EV_END:
        return make_result(&s, found, "end")
    with nogil:
        rc = settle(&s)
    if rc != OK:
        raise CorruptRecordError(error_text(rc), path=source, position=file_pos + s.pos)
    return make_result(&s, found, "limit" if taken >= limit or full else "max_records")


cdef class SelectorProgram:
    """A compiled selector in the kernel's form (query/selector.py builds it: `ops` as
    (op, cmp, neg, slot, arg, ival, fval, text) tuples, `names` the interned property names as
    bytes, None for a name that is never a property). Immutable once built."""

    cdef mqsel_program prog
    cdef mqsel_op* ops
    cdef list keep                     # the bytes the ops' and names' pointers borrow
    cdef readonly size_t vals_size
    cdef readonly size_t scratch_size

    def __cinit__(self, list ops not None, list names not None, int stack_depth,
                  int tags_slot=-1, int tag_slot=-1):
        cdef Py_ssize_t i, n = len(ops)
        cdef bytes text
        if len(names) > MQSEL_MAX_NAMES:
            raise ValueError(f"a selector program names at most {MQSEL_MAX_NAMES} properties")
        if n == 0 or stack_depth < 1 or stack_depth > n:
            raise ValueError("a selector program needs at least one op and a valid depth")
        self.keep = []
        self.ops = <mqsel_op*>malloc(n * sizeof(mqsel_op))
        if self.ops == NULL:
            raise MemoryError()
        for i in range(n):
            op, cmp, neg, slot, arg, ival, fval, text = ops[i]
            self.ops[i].op = op
            self.ops[i].cmp = cmp
            self.ops[i].neg = neg
            self.ops[i].slot = slot
            self.ops[i].arg = arg
            self.ops[i].ival = ival
            self.ops[i].fval = fval
            self.ops[i].str = NULL
            self.ops[i].str_len = 0
            if slot >= len(names) and op not in (MQSEL_CONST, MQSEL_NOT, MQSEL_AND, MQSEL_OR,
                                                 MQSEL_JUMP_FALSE, MQSEL_JUMP_TRUE,
                                                 MQSEL_IN_STR, MQSEL_IN_INT, MQSEL_IN_FLOAT):
                raise ValueError(f"op {i} names property slot {slot} of {len(names)}")
            if text is not None:
                self.keep.append(text)
                self.ops[i].str = <const unsigned char*>PyBytes_AS_STRING(text)
                self.ops[i].str_len = <size_t>PyBytes_GET_SIZE(text)
        self.prog.ops = self.ops
        self.prog.n_ops = <int>n
        self.prog.stack_depth = stack_depth
        self.prog.n_names = <int>len(names)
        for i, name in enumerate(names):
            self.prog.never[i] = name is None
            text = b"" if name is None else name
            self.keep.append(text)
            self.prog.names[i] = <const unsigned char*>PyBytes_AS_STRING(text)
            self.prog.name_len[i] = <size_t>PyBytes_GET_SIZE(text)
        self.prog.tags_slot = tags_slot
        self.prog.tag_slot = tag_slot
        self.vals_size = (<size_t>len(names) + 1) * sizeof(mqsel_value)
        self.scratch_size = self.vals_size + <size_t>stack_depth

    def __dealloc__(self):
        free(self.ops)

    def evaluate(self, bytes headers not None, int64_t count):
        """The program's value for one record's encoded header area (`count` headers in
        Kafka's record encoding): True, False or None (UNKNOWN). For tests and fuzzing."""
        cdef bytearray scratch = bytearray(self.scratch_size)
        cdef unsigned char* base = <unsigned char*>(<char*>scratch)
        cdef uint64_t seen = 0
        cdef int result
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(headers)
        cdef size_t n = <size_t>PyBytes_GET_SIZE(headers)
        with nogil:
            result = mqsel_run(&self.prog, p, n, count, <mqsel_value*>base,
                               base + self.vals_size, &seen)
        return None if result == MQSEL_UNKNOWN else result == MQSEL_TRUE


# The opcodes and operand codes of selector programs, for query/selector.py's compiler.
SELECTOR_CODES = {
    "const": MQSEL_CONST, "is_null": MQSEL_IS_NULL, "cmp_str": MQSEL_CMP_STR,
    "cmp_int": MQSEL_CMP_INT, "cmp_float": MQSEL_CMP_FLOAT, "cmp_bool": MQSEL_CMP_BOOL,
    "str_test": MQSEL_STR_TEST, "in": MQSEL_IN, "in_str": MQSEL_IN_STR, "in_int": MQSEL_IN_INT,
    "in_float": MQSEL_IN_FLOAT, "not": MQSEL_NOT, "and": MQSEL_AND, "or": MQSEL_OR,
    "jump_false": MQSEL_JUMP_FALSE, "jump_true": MQSEL_JUMP_TRUE,
    "=": MQSEL_EQ, "<>": MQSEL_NE, "<": MQSEL_LT, "<=": MQSEL_LE, ">": MQSEL_GT, ">=": MQSEL_GE,
    "CONTAINS": MQSEL_CONTAINS, "STARTSWITH": MQSEL_STARTSWITH, "ENDSWITH": MQSEL_ENDSWITH,
    "false": MQSEL_FALSE, "true": MQSEL_TRUE, "unknown": MQSEL_UNKNOWN,
    "max_names": MQSEL_MAX_NAMES,
}


def implementation():
    """Which needle search scan_records runs: "avx2" or "generic" (memmem)."""
    return mqs_name.decode("ascii")


def select_implementation(bint fast):
    """Use the generic search (fast=False) or the CPU's best (True); returns the name now in
    use. For tests that run each path on one machine; not safe while another thread scans."""
    mqs_select(fast)
    return implementation()
