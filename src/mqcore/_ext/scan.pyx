# Batch-by-batch scans of a segment's .log (recovery, index rebuild, verify, offset lookups) and
# the rule that decides sparse index entries (docs/format.md "Index entries"; REFERENCE.md
# "Kafka segments"). The rule lives here once, so the entries recovery rebuilds are byte for
# byte the entries the append path wrote:
#
#   before counting a batch's bytes: max_timestamp_so_far tracks the largest batch
#   maxTimestamp and that batch's last offset; if more than index_interval_bytes were written
#   since the last entry, write .index (batch lastOffset -> batch start position) and, if
#   max_timestamp_so_far grew past the last .timeindex entry, .timeindex (max_timestamp_so_far
#   -> its offset); then add the batch's size to the running count.
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_Resize, PyByteArray_GET_SIZE
from libc.stdint cimport INT64_MIN, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc

from mqcore._ext.batch cimport (
    ATTR_CODEC_MASK, ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BATCH_HEADER_SIZE, BatchHeader,
    E_OFFSET_DELTA, E_OFFSET_ORDER, E_RECORD_LENGTH, E_SHORT, E_VARINT, LOG_OVERHEAD, OK,
    RecordCursor, RecordView, check_batch,
    cursor_finish, cursor_init, error_text, make_message, next_record, open_records, walk_batch,
    wrap_add,
)
from mqcore._ext.bytes_be cimport mq_prefetch, mq_prefetch_range, store_be32, store_be64
from mqcore._ext.varint cimport read_varint

from mqcore.errors import CorruptRecordError

END_OF_DATA = 0           # stop reasons of SegmentScanner
NEED_MORE = 1
CORRUPT = 2


cdef int rule_on_batch(IndexRule* r, int64_t position, int64_t size, int64_t last_offset,
                       int64_t max_ts) noexcept nogil:
    cdef int out = 0
    if max_ts > r.max_timestamp:
        r.max_timestamp = max_ts
        r.offset_of_max_timestamp = last_offset
    if r.bytes_since_entry > r.interval:
        if last_offset > r.last_index_offset:
            out |= 1
            r.last_index_offset = last_offset
        if r.max_timestamp > r.last_time_entry_ts:
            out |= 2
            r.last_time_entry_ts = r.max_timestamp
        r.bytes_since_entry = 0
    r.bytes_since_entry += size
    return out


cdef class IndexPolicy:
    """Kafka's sparse-index rule as state the append path carries for the active segment."""

    cdef IndexRule rule

    def __init__(self, int64_t index_interval_bytes, int64_t bytes_since_entry=0,
                 int64_t max_timestamp=-1, int64_t offset_of_max_timestamp=-1,
                 int64_t last_time_entry_ts=-1, int64_t last_index_offset=-1):
        self.rule.interval = index_interval_bytes
        self.rule.bytes_since_entry = bytes_since_entry
        self.rule.max_timestamp = max_timestamp
        self.rule.offset_of_max_timestamp = offset_of_max_timestamp
        self.rule.last_time_entry_ts = last_time_entry_ts
        self.rule.last_index_offset = last_index_offset

    def on_batch(self, int64_t position, int64_t size, int64_t last_offset, int64_t max_ts):
        """Bit set of entries to write after this batch (1: offset entry, 2: time entry)."""
        return rule_on_batch(&self.rule, position, size, last_offset, max_ts)

    def close_entry(self):
        """The .timeindex entry written at roll and close, or None when the last one is current.

        Kafka reserves the last slot for it, so a sealed segment's largest timestamp is its last
        time-index entry.
        """
        if self.rule.max_timestamp > self.rule.last_time_entry_ts:
            self.rule.last_time_entry_ts = self.rule.max_timestamp
            return (self.rule.max_timestamp, self.rule.offset_of_max_timestamp)
        return None

    @property
    def max_timestamp(self):
        return self.rule.max_timestamp

    @property
    def offset_of_max_timestamp(self):
        return self.rule.offset_of_max_timestamp


cdef inline int append_entry(bytearray out, const unsigned char* entry, Py_ssize_t n) except -1:
    cdef Py_ssize_t at = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, at + n)
    cdef unsigned char* dst = <unsigned char*>PyByteArray_AS_STRING(out) + at
    cdef Py_ssize_t i
    for i in range(n):
        dst[i] = entry[i]
    return 0


cdef class SegmentScanner:
    """Validates a segment's batches in order and rebuilds its index entries as it goes.

    Feed it the .log in consecutive chunks; it consumes whole batches, checking lengths, magic,
    codec, counts, CRC and that offsets never go backwards. It stops at the first batch that is
    incomplete (NEED_MORE until the caller says the file ended) or invalid (CORRUPT, with
    `error` and `error_position`). `valid_bytes` is where a torn or corrupt tail would be cut.
    """

    cdef readonly int64_t base_offset
    cdef readonly int64_t valid_bytes
    cdef readonly int64_t next_offset
    cdef readonly int64_t batches
    cdef readonly int64_t first_batch_max_timestamp
    cdef readonly int64_t last_batch_position
    cdef readonly int stop
    cdef readonly str error
    cdef readonly int64_t error_position
    cdef readonly bytearray offset_entries
    cdef readonly bytearray time_entries
    cdef bint verify_crc
    cdef IndexRule rule

    def __init__(self, int64_t base_offset, int64_t index_interval_bytes, bint verify_crc=True):
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.first_batch_max_timestamp = -1
        self.last_batch_position = -1
        self.verify_crc = verify_crc
        self.offset_entries = bytearray()
        self.time_entries = bytearray()
        self.error = None
        self.error_position = -1
        self.stop = NEED_MORE
        self.rule.interval = index_interval_bytes
        self.rule.max_timestamp = -1
        self.rule.offset_of_max_timestamp = -1
        self.rule.last_time_entry_ts = -1
        self.rule.last_index_offset = -1

    def feed(self, const unsigned char[::1] chunk not None, int64_t chunk_position):
        """Scan whole batches of `chunk` (which starts at file position `chunk_position`, equal
        to valid_bytes); returns the bytes consumed. The caller keeps the unconsumed tail."""
        cdef BatchHeader h
        cdef Py_ssize_t pos = 0, n = chunk.shape[0]
        cdef int rc = OK, bits
        cdef unsigned char entry[12]
        if chunk_position != self.valid_bytes:
            raise ValueError(f"chunk at {chunk_position} does not follow valid bytes {self.valid_bytes}")
        if self.stop == CORRUPT:
            return 0
        while pos < n:
            with nogil:
                rc = check_batch(&chunk[pos], n - pos, &h, self.verify_crc)
                if rc == OK and h.base_offset < self.next_offset:
                    rc = E_OFFSET_ORDER
            if rc == E_SHORT:
                break
            if rc != OK:
                self.stop = CORRUPT
                self.error = error_text(rc)
                self.error_position = chunk_position + pos
                break
            if h.base_offset + h.last_offset_delta - self.base_offset > 0x7FFFFFFF:
                self.stop = CORRUPT
                self.error = "offset does not fit the segment's 32-bit relative offsets"
                self.error_position = chunk_position + pos
                break
            bits = rule_on_batch(&self.rule, chunk_position + pos, LOG_OVERHEAD + h.batch_length,
                                 h.base_offset + h.last_offset_delta, h.max_timestamp)
            if bits & 1:
                store_be32(entry, <uint32_t>(h.base_offset + h.last_offset_delta - self.base_offset))
                store_be32(entry + 4, <uint32_t>(chunk_position + pos))
                append_entry(self.offset_entries, entry, 8)
            if bits & 2:
                store_be64(entry, <uint64_t>self.rule.max_timestamp)
                store_be32(entry + 8, <uint32_t>(self.rule.offset_of_max_timestamp - self.base_offset))
                append_entry(self.time_entries, entry, 12)
            if self.batches == 0:
                self.first_batch_max_timestamp = h.max_timestamp
            self.batches += 1
            self.last_batch_position = chunk_position + pos
            self.next_offset = h.base_offset + h.last_offset_delta + 1
            pos += LOG_OVERHEAD + h.batch_length
            self.valid_bytes = chunk_position + pos
        return pos

    def skip_to(self, int64_t position):
        """Start scanning at `position` (a batch boundary) of a segment trusted up to there."""
        if self.batches:
            raise ValueError("skip_to must come before the first feed")
        self.valid_bytes = position

    def finish(self):
        """Declare the end of the file: an incomplete tail becomes END_OF_DATA (a torn write)."""
        if self.stop == NEED_MORE:
            self.stop = END_OF_DATA

    def policy(self):
        """An IndexPolicy that continues appending exactly where this scan left off."""
        return IndexPolicy(self.rule.interval, self.rule.bytes_since_entry, self.rule.max_timestamp,
                           self.rule.offset_of_max_timestamp, self.rule.last_time_entry_ts,
                           self.rule.last_index_offset)

    @property
    def max_timestamp(self):
        return self.rule.max_timestamp

    @property
    def offset_of_max_timestamp(self):
        return self.rule.offset_of_max_timestamp


def find_batch(const unsigned char[::1] buf not None, Py_ssize_t pos, int64_t target_offset,
               int64_t min_timestamp=-1, bint verify_crc=False, source=None, int64_t file_pos=0):
    """Walk batch headers from buf[pos:] to the first batch whose last offset >= target_offset
    and (when min_timestamp >= 0) whose maxTimestamp >= min_timestamp.

    Returns (position, base_offset, last_offset) of that batch, or (position, -1, -1) when the
    buffer ends first (position is then where the walk stopped: the next read starts there).
    Headers only: CRCs are not checked unless asked.
    """
    cdef BatchHeader h
    cdef int rc
    cdef Py_ssize_t n = buf.shape[0]
    if pos < 0 or pos > n:
        raise ValueError(f"position {pos} outside a buffer of {n} bytes")
    while pos < n:
        if not walk_batch(&buf[pos], n - pos, &h, verify_crc, source, file_pos + pos):
            break
        if h.base_offset < 0:
            # not an offset the log assigns, and -1 is this function's "not found"
            raise CorruptRecordError(f"negative base offset {h.base_offset}", path=source,
                                     position=file_pos + pos)
        if (h.base_offset + h.last_offset_delta >= target_offset
                and (min_timestamp < 0 or h.max_timestamp >= min_timestamp)):
            return pos, h.base_offset, h.base_offset + h.last_offset_delta
        pos += LOG_OVERHEAD + h.batch_length
    return pos, -1, -1


cdef enum:
    SAMPLE_EVERY = 8              # one remembered record position per 8 records
    SAMPLED_MIN_RECORDS = 64      # smaller batches are walked from their start
    VERIFIED_MAX = 65536          # memo entries per segment before it starts over
    MEMO_WHOLE = 1                # every record decoded and checked, the area used up exactly
    MEMO_DENSE = 2                # record i has offset delta i: samples hold positions only
    MEMO_TIMES = 4                # the samples are followed by each group's largest timestamp
    PREFETCH_MAX = 4096           # bytes of records a get prefetches ahead of its walk


# A batch's memo (the value of `verified[position]`), made by the first get in it; it lives in
# memory only, in native byte order: this header, then one sample per SAMPLE_EVERY-th record,
# its int32 position in the records area (MEMO_DENSE: its offset delta is its index) or
# (int32 offset delta, int32 position); then (MEMO_TIMES) one int64 per sample, the largest
# record timestamp of its group (the SAMPLE_EVERY records from it), for offset_for_time's walk.
# A batch of fewer than SAMPLED_MIN_RECORDS records gets the header alone (no samples); a
# compressed or control batch gets b"".
# The header repeats the batch header fields a read needs, so a read that starts at a batch
# with a memo plans its walk (and makes its Message) without touching the batch header again.
cdef struct MemoHeader:
    int32_t flags                 # MEMO_WHOLE | MEMO_DENSE
    int32_t count                 # samples
    int64_t base_offset
    int64_t base_timestamp
    int64_t max_timestamp
    int32_t records_count
    int32_t records_size          # bytes of the records area
    int32_t last_offset_delta
    int32_t attributes


# Where a walk to one record starts: from sample k (-1: the first record), whose offset delta
# and position are first_delta and start; the walk stays before span_end (the next sample or
# the area's end) and is likely to read `ahead` bytes from start.
cdef struct WalkPlan:
    Py_ssize_t k
    int64_t first_delta
    Py_ssize_t start
    Py_ssize_t span_end
    Py_ssize_t ahead


cdef bytes sample_positions(const unsigned char* records, Py_ssize_t size, const BatchHeader* h):
    """The memo of the batch with header h (see MemoHeader). The samples and group maxima are
    gathered in C arrays and copied into the memo once: a first read of a batch of 1000
    records used to spend a third of its time growing bytearrays sample by sample."""
    cdef RecordCursor c
    cdef RecordView r
    cdef const unsigned char* at
    cdef Py_ssize_t i = 0, k, count, cap, width
    cdef int32_t* pairs                 # per sample: offset delta, position
    cdef int64_t* maxima                # per sample: its group's largest timestamp
    cdef int64_t ts
    cdef MemoHeader head
    cdef unsigned char* out
    cdef int rc
    cdef bint dense = True
    memset(&head, 0, sizeof(head))
    # a record takes at least two bytes (its length and attributes), so neither a lying
    # recordsCount nor a short area makes more samples than this
    cap = (min(<Py_ssize_t>max(h.records_count, 0), size // 2 + 1) + SAMPLE_EVERY - 1) // SAMPLE_EVERY
    pairs = <int32_t*>PyMem_Malloc(max(cap, 1) * (2 * sizeof(int32_t) + sizeof(int64_t)))
    if pairs == NULL:
        raise MemoryError()
    maxima = <int64_t*>(pairs + 2 * max(cap, 1))
    try:
        cursor_init(&c, records, size, h)
        while True:
            at = c.p
            rc = next_record(&c, &r)
            if rc != 1:
                break
            if r.offset_delta != i:
                dense = False
            ts = record_timestamp(h, r.timestamp_delta)
            k = i // SAMPLE_EVERY
            if i % SAMPLE_EVERY == 0:
                if k >= cap:  # cannot be (see cap): stop sampling, the check below decides
                    rc = E_SHORT
                    break
                pairs[2 * k] = <int32_t>r.offset_delta
                pairs[2 * k + 1] = <int32_t>(at - records)
                maxima[k] = ts
            elif ts > maxima[k]:
                maxima[k] = ts
            i += 1
        head.flags = MEMO_WHOLE if rc == 0 and cursor_finish(&c) == OK else 0
        if head.flags and dense:
            head.flags |= MEMO_DENSE
        if head.flags:
            head.flags |= MEMO_TIMES
        count = (i + SAMPLE_EVERY - 1) // SAMPLE_EVERY
        head.count = <int32_t>count
        copy_header_fields(&head, size, h)
        width = 4 if head.flags & MEMO_DENSE else 8
        memo = PyBytes_FromStringAndSize(
            NULL, sizeof(MemoHeader) + count * (width + (8 if head.flags & MEMO_TIMES else 0)))
        out = <unsigned char*>PyBytes_AS_STRING(memo)
        memcpy(out, &head, sizeof(MemoHeader))
        out += sizeof(MemoHeader)
        for k in range(count):
            if width == 4:
                memcpy(out + 4 * k, &pairs[2 * k + 1], 4)
            else:
                memcpy(out + 8 * k, &pairs[2 * k], 8)
        if head.flags & MEMO_TIMES:
            memcpy(out + count * width, maxima, count * 8)
        return memo
    finally:
        PyMem_Free(pairs)


cdef inline int64_t record_timestamp(const BatchHeader* h, int64_t timestamp_delta) noexcept nogil:
    """A record's timestamp: baseTimestamp + timestampDelta, or the batch's maxTimestamp under
    LogAppendTime (the broker's time, for every record)."""
    if h.attributes & ATTR_LOG_APPEND_TIME:
        return h.max_timestamp
    return wrap_add(h.base_timestamp, timestamp_delta)


cdef bytes header_memo(Py_ssize_t size, const BatchHeader* h):
    """The memo of a batch too small to sample: its header fields only, no samples."""
    cdef MemoHeader head
    memset(&head, 0, sizeof(head))
    copy_header_fields(&head, size, h)
    return (<char*>&head)[:sizeof(MemoHeader)]


cdef inline void copy_header_fields(MemoHeader* head, Py_ssize_t size,
                                    const BatchHeader* h) noexcept nogil:
    """The batch header fields a memo repeats, so later reads need not touch the header."""
    head.base_offset = h.base_offset
    head.base_timestamp = h.base_timestamp
    head.max_timestamp = h.max_timestamp
    head.records_count = h.records_count
    head.records_size = <int32_t>size
    head.last_offset_delta = h.last_offset_delta
    head.attributes = h.attributes


cdef bint plan_walk(bytes memo, int64_t target_delta, WalkPlan* w) noexcept:
    """Plan the walk to the record at target_delta from the memo's samples; False when the
    memo has none (or is not one: the walk then starts at the first record)."""
    cdef const MemoHeader* head = <const MemoHeader*>PyBytes_AS_STRING(memo)
    cdef const int32_t* m = <const int32_t*>(PyBytes_AS_STRING(memo) + sizeof(MemoHeader))
    cdef Py_ssize_t count, lo, hi, mid, room = PyBytes_GET_SIZE(memo) - <Py_ssize_t>sizeof(MemoHeader)
    cdef int64_t group, ahead
    if room < 0 or target_delta < 0:
        return False
    count = head.count
    w.k = -1
    w.first_delta = 0
    w.start = 0
    w.span_end = head.records_size
    w.ahead = -1
    if head.flags & MEMO_DENSE:
        if count <= 0 or count > room // 4:
            return False
        w.k = min(target_delta // SAMPLE_EVERY, count - 1)
        w.start = m[w.k]
        if w.k + 1 < count:
            w.span_end = m[w.k + 1]
        w.first_delta = w.k * SAMPLE_EVERY
        group = min(<int64_t>SAMPLE_EVERY, head.records_count - w.first_delta)
        ahead = target_delta - w.first_delta
        if group > 0 and ahead >= 0:
            # records of a group are about the same size: the lines up to the target, and a few
            w.ahead = (w.span_end - w.start) * (ahead + 1) // group + 256
    else:
        if count < 0 or count > room // 8:
            return False
        lo, hi = 0, count            # the last sample whose delta is <= the target
        while lo < hi:
            mid = (lo + hi) // 2
            if m[2 * mid] <= target_delta:
                lo = mid + 1
            else:
                hi = mid
        w.k = lo - 1
        if lo < count:
            w.span_end = m[2 * lo + 1]
        if w.k >= 0:
            w.start = m[2 * w.k + 1]
            w.first_delta = m[2 * w.k]
    if not 0 <= w.start <= w.span_end <= head.records_size:
        return False
    if w.ahead < 0 or w.ahead > w.span_end - w.start:
        w.ahead = w.span_end - w.start
    if w.ahead > PREFETCH_MAX:
        w.ahead = PREFETCH_MAX
    return True


cdef const MemoHeader* memo_header(object memo, Py_ssize_t pos, Py_ssize_t n) noexcept:
    """The header of `memo` (a memo of the batch at buf[pos] of a buffer of n bytes), or NULL
    when it has none (b"", or no memo) or the batch does not end inside the buffer."""
    cdef const MemoHeader* head
    if type(memo) is not bytes or PyBytes_GET_SIZE(memo) < <Py_ssize_t>sizeof(MemoHeader):
        return NULL
    head = <const MemoHeader*>PyBytes_AS_STRING(memo)
    if (head.records_size < 0 or head.base_offset < 0
            or pos + BATCH_HEADER_SIZE + <Py_ssize_t>head.records_size > n):
        return NULL
    return head


cdef enum:
    MEMO_HOLDS = 0                # the batch at the position holds the offset: its memo
    MEMO_WALK = 1                 # no memo there: walk batch headers from the position
    MEMO_ABSENT = 2               # no record at the offset from here (None)
    MEMO_FOLLOW_MAX = 256         # memos followed before the header walk takes over


cdef object follow_memos(dict verified, Py_ssize_t* pos, Py_ssize_t n, int64_t offset,
                         int* status):
    """From the batch at *pos, step over batches by their memos (the sizes an earlier get
    found) to the one holding `offset`, touching no batch header. Sets *status: MEMO_HOLDS
    (returns that batch's memo, *pos its position), MEMO_WALK (no memo at *pos) or MEMO_ABSENT
    (the batch at *pos starts past the offset, or the data ends)."""
    cdef const MemoHeader* head
    cdef int steps
    for steps in range(MEMO_FOLLOW_MAX):
        if pos[0] >= n:
            status[0] = MEMO_ABSENT
            return None
        memo = verified.get(pos[0]) if verified is not None else None
        head = memo_header(memo, pos[0], n)
        if head == NULL:
            break
        if offset < head.base_offset:
            status[0] = MEMO_ABSENT
            return None
        if offset - head.base_offset <= head.last_offset_delta:
            status[0] = MEMO_HOLDS
            return memo
        pos[0] += BATCH_HEADER_SIZE + <Py_ssize_t>head.records_size
    status[0] = MEMO_WALK
    return None


cdef object locate(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos, int64_t offset,
                   dict verified, Py_ssize_t* batch_pos):
    """Where a read of `offset` from the batch at buf[pos] goes, as far as memos tell without
    reading the log: the memo of the batch holding the offset (its position in *batch_pos),
    with the records up to the target prefetched; or None, with the first batch header the
    read will walk prefetched (and None when the memos say there is no such record). Nothing
    is read from buf here: a hint for read_memo or read_at."""
    cdef WalkPlan w
    cdef const MemoHeader* head
    cdef int status
    if pos < 0 or pos >= n:
        return None
    memo = follow_memos(verified, &pos, n, offset, &status)
    if status == MEMO_HOLDS:
        head = <const MemoHeader*>PyBytes_AS_STRING(memo)
        if plan_walk(memo, offset - head.base_offset, &w):
            mq_prefetch_range(buf + pos + BATCH_HEADER_SIZE + w.start, w.ahead)
        batch_pos[0] = pos
        return memo
    if status == MEMO_WALK:
        mq_prefetch(buf + pos)
    return None


cdef inline void header_of_memo(const MemoHeader* head, BatchHeader* h) noexcept nogil:
    """The header fields a read takes from a memo (read_memo's and the time walk's)."""
    memset(h, 0, sizeof(BatchHeader))
    h.magic = 2
    h.base_offset = head.base_offset
    h.base_timestamp = head.base_timestamp
    h.max_timestamp = head.max_timestamp
    h.records_count = head.records_count
    h.last_offset_delta = head.last_offset_delta
    h.attributes = <int16_t>head.attributes
    h.batch_length = head.records_size + BATCH_HEADER_SIZE - LOG_OVERHEAD


cdef object read_memo(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos, object memo,
                      int64_t offset, str topic, int partition, object source, bint prefetch):
    """The Message at `offset` in the batch at buf[pos], whose memo (from locate) holds it, or
    None; the memo stands in for the batch header. `prefetch`: unless locate did."""
    cdef BatchHeader h
    cdef const MemoHeader* head = memo_header(memo, pos, n)
    if (head == NULL or offset < head.base_offset
            or offset - head.base_offset > head.last_offset_delta):
        raise ValueError(f"the memo at position {pos} does not hold offset {offset}")
    header_of_memo(head, &h)
    return read_in_batch(buf + pos + BATCH_HEADER_SIZE, head.records_size, &h, memo, offset,
                         topic, partition, source, pos, prefetch)


cdef void start_walk(bytes memo, const unsigned char* records, Py_ssize_t records_size,
                     const BatchHeader* h, int64_t target_delta, RecordCursor* c,
                     bint prefetch) noexcept:
    """Point cursor c (fresh from cursor_init) at the sampled record nearest before the target,
    prefetch the lines the walk to it will read (unless locate did), and skip the records
    before it when the memo says the batch was checked whole."""
    cdef WalkPlan w
    cdef const MemoHeader* head
    if PyBytes_GET_SIZE(memo) < <Py_ssize_t>sizeof(MemoHeader):
        if prefetch:
            mq_prefetch_range(records, min(records_size, PREFETCH_MAX))
        return
    head = <const MemoHeader*>PyBytes_AS_STRING(memo)
    if (head.base_offset != h.base_offset or head.records_size != records_size
            or head.records_count != h.records_count or not plan_walk(memo, target_delta, &w)):
        return  # not this batch's memo (a caller's own dict): walk from the first record
    if w.k >= 0:
        c.p = records + w.start
        c.remaining = h.records_count - w.k * SAMPLE_EVERY
        c.prev_delta = w.first_delta - 1
    if prefetch:
        mq_prefetch_range(records + w.start, w.ahead)
    if head.flags & MEMO_WHOLE:
        skip_below(c, target_delta)


cdef void skip_below(RecordCursor* c, int64_t target_delta) noexcept nogil:
    """Move c past the records whose offset delta is below target_delta, reading only each
    one's length and offset delta: for batches whose memo says every record was decoded and
    checked already. Anything unexpected stops the skip where it is, and next_record takes over
    from there (and names the problem)."""
    cdef int64_t length, v
    cdef const unsigned char* p
    cdef const unsigned char* rec_end
    cdef int n
    while c.remaining > 0:
        n = read_varint(c.p, c.end - c.p, &length)
        if n < 0 or length < 2 or length > c.end - c.p - n:
            return
        p = c.p + n + 1                      # past the length and the attributes byte
        rec_end = c.p + n + length
        n = read_varint(p, rec_end - p, &v)  # timestampDelta
        if n < 0:
            return
        p += n
        n = read_varint(p, rec_end - p, &v)  # offsetDelta
        if n < 0 or v >= target_delta or v <= c.prev_delta:
            return
        c.p = rec_end
        c.remaining -= 1
        c.prev_delta = v


def read_record(const unsigned char[::1] buf not None, Py_ssize_t position, int64_t offset,
                str topic, int partition, bint verify_crc=True, dict verified=None, source=None,
                Py_ssize_t max_decompressed=256 << 20):
    """The Message at `offset` in buf (a segment's bytes from position 0), or None.

    Walks batch headers from `position` (a batch boundary at or before the offset: the index
    floor) to the batch holding the offset, then its records. The first get in a batch checks
    its CRC and remembers it in `verified` (batch position -> sampled record positions), so a
    later get skips the CRC and starts its walk at most SAMPLE_EVERY records before the target,
    skipping over records by their lengths when that first get decoded the whole batch.
    """
    return read_at(&buf[0] if buf.shape[0] else NULL, buf.shape[0], position, offset, topic,
                   partition, verify_crc, verified, source, max_decompressed)


cdef object read_at(const unsigned char* buf, Py_ssize_t n, Py_ssize_t position, int64_t offset,
                    str topic, int partition, bint verify_crc, dict verified, object source,
                    Py_ssize_t max_decompressed):
    cdef BatchHeader h
    cdef Py_ssize_t pos = position
    cdef int rc, status
    if position < 0 or position > n:
        raise ValueError(f"position {position} outside a buffer of {n} bytes")
    memo = follow_memos(verified, &pos, n, offset, &status)
    if status == MEMO_ABSENT:
        return None
    if status == MEMO_HOLDS:
        # batches an earlier get checked (CRC, records) lead to the one holding the offset:
        # their memos have what the read needs from the headers
        return read_memo(buf, n, pos, memo, offset, topic, partition, source, True)
    # the batch holding the offset: headers only, as find_batch walks them (a header check is
    # too short to be worth releasing the GIL, unlike the CRC below)
    while True:
        if pos >= n:
            return None
        rc = check_batch(buf + pos, n - pos, &h, False)
        if rc == E_SHORT:
            return None
        if rc != OK:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        if h.base_offset < 0:
            raise CorruptRecordError(f"negative base offset {h.base_offset}", path=source,
                                     position=pos)
        if h.base_offset + h.last_offset_delta >= offset:
            break
        pos += LOG_OVERHEAD + h.batch_length
    if h.base_offset > offset:
        return None
    memo = None if verified is None else verified.get(pos)
    if h.attributes & ATTR_CODEC_MASK or h.attributes & ATTR_CONTROL:
        if verify_crc and memo is None:
            walk_batch(buf + pos, n - pos, &h, True, source, pos)  # whole: the walk found it
        return read_decoded(buf + pos, &h, offset, topic, partition, verified, memo is None,
                            source, pos, max_decompressed)
    if memo is None:
        memo = check_first_read(buf, n, pos, &h, verify_crc, verified, source)
    return read_in_batch(buf + pos + BATCH_HEADER_SIZE,
                         LOG_OVERHEAD + h.batch_length - BATCH_HEADER_SIZE, &h, memo, offset,
                         topic, partition, source, pos, True)


cdef bytes check_first_read(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos,
                            const BatchHeader* h, bint verify_crc, dict verified, object source):
    """The first read of the uncompressed, non-control batch at buf[pos] (header h, whole
    inside buf): its CRC (when verify_crc), then every record decoded, as Store.read does (a
    batch whose recordsCount disagrees with the records it holds raises, CRC or not); then
    its memo, remembered in `verified`. Every memo a read finds was made here (or by
    read_decoded): a memo means "checked", whichever read (get or offset_for_time) made it."""
    cdef BatchHeader whole_h
    cdef const unsigned char* records = buf + pos + BATCH_HEADER_SIZE
    cdef Py_ssize_t records_size = LOG_OVERHEAD + h.batch_length - BATCH_HEADER_SIZE
    cdef bint whole = False
    cdef int rc
    if verify_crc:
        walk_batch(buf + pos, n - pos, &whole_h, True, source, pos)
    if h.records_count >= SAMPLED_MIN_RECORDS:  # the samples walk every record already
        memo = sample_positions(records, records_size, h)
        whole = (<const MemoHeader*>PyBytes_AS_STRING(memo)).flags & MEMO_WHOLE
    else:
        memo = header_memo(records_size, h)
    rc = OK if whole else check_records(records, records_size, h)
    if rc != OK:
        raise CorruptRecordError(error_text(rc), path=source, position=pos)
    if verified is not None:
        remember(verified, pos, memo)
    return memo


cdef int check_records(const unsigned char* records, Py_ssize_t size,
                       const BatchHeader* h) noexcept nogil:
    """OK when the records area holds exactly recordsCount well-formed records (what
    decode_messages requires of a batch it reads to the end), else the first error."""
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    cursor_init(&c, records, size, h)
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            return cursor_finish(&c)
        if rc < 0:
            return rc


cdef object read_in_batch(const unsigned char* records, Py_ssize_t records_size,
                          const BatchHeader* h, object memo, int64_t offset, str topic,
                          int partition, object source, Py_ssize_t pos, bint prefetch):
    """The record at `offset` in an uncompressed batch's records area (walked from the memo's
    nearest sample), or None when the batch has no record there."""
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    cdef int64_t target_delta = offset - h.base_offset
    cursor_init(&c, records, records_size, h)
    start_walk(<bytes?>memo, records, records_size, h, target_delta, &c, prefetch)
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            return None
        if rc < 0:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        if r.offset_delta == target_delta:
            return make_message(topic, partition, h, &r)
        if r.offset_delta > target_delta:
            return None


cdef object read_decoded(const unsigned char* batch, const BatchHeader* h, int64_t offset,
                         str topic, int partition, dict verified, bint first, object source,
                         Py_ssize_t pos, Py_ssize_t max_decompressed):
    """A compressed or control batch at `pos`: its records (decompressed) are decoded and
    checked to the last one, the one at `offset` kept (control batches hold no user records);
    then remember that its CRC was checked."""
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    found = None
    area = open_records(batch, h, max_decompressed, &c)  # owns the cursor's bytes
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            rc = cursor_finish(&c)
        if rc < 0:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        if rc == OK:
            break
        if h.base_offset + r.offset_delta == offset and not h.attributes & ATTR_CONTROL:
            found = make_message(topic, partition, h, &r)
    del area
    if verified is not None and first:
        remember(verified, pos, b"")
    return found


cdef int remember(dict verified, Py_ssize_t pos, bytes memo) except -1:
    if len(verified) >= VERIFIED_MAX:
        verified.clear()
    verified[pos] = memo
    return 0


# ---------------------------------------------------------------------------------------------
# offset_for_time: the earliest offset whose timestamp is >= T (Kafka's ListOffsets rule)
# ---------------------------------------------------------------------------------------------

def first_offset_at_or_after(const unsigned char[::1] buf not None, Py_ssize_t pos,
                             int64_t timestamp, bint verify_crc=True, source=None,
                             Py_ssize_t max_decompressed=256 << 20, dict verified=None,
                             int64_t min_offset=INT64_MIN):
    """Offset of the first record at or after buf[pos] whose timestamp is >= `timestamp` and
    whose offset is >= `min_offset`, or -1 (first_at_or_after's Python face; `verified` as
    read_record's)."""
    return first_at_or_after(&buf[0] if buf.shape[0] else NULL, buf.shape[0], pos, timestamp,
                             min_offset, verify_crc, verified, source, max_decompressed)


cdef int64_t first_at_or_after(const unsigned char* buf, Py_ssize_t n, Py_ssize_t pos,
                               int64_t timestamp, int64_t min_offset, bint verify_crc,
                               dict verified, object source,
                               Py_ssize_t max_decompressed) except -2:
    """Offset of the first record at or after buf[pos] whose timestamp is >= `timestamp`, or -1.
    Records below `min_offset` (the partition's log start, which DeleteRecords may move inside
    a batch) do not count: a batch that ends below it is skipped like one whose timestamps are
    all below `timestamp`, and inside a batch the walk passes over them.

    Batches whose maxTimestamp is below it are skipped by their memo or header (no record is
    read); in the first batch that reaches it, the memo's group maxima lead to the first group
    of SAMPLE_EVERY records that reaches it, and only those records' timestamp deltas are read
    (first_reaching) up to the first one at or past `timestamp`. Record timestamps need not
    rise, so that is the earliest such offset, and the walk never stops at a smaller one. No
    record is materialised. Control batches hold no user records and are skipped; under
    LogAppendTime every record has the batch's maxTimestamp.

    Checks, as get's (read_at): a batch with a memo in `verified` was checked by an earlier
    read (CRC and every record) and is trusted; an uncompressed batch without one is checked
    whole the first time (check_first_read) and gets one, whether the lookup skips it or
    looks inside; a compressed or control batch without one has its CRC checked at each visit
    and its records decoded and checked up to the answer (`verified` None: every batch walked
    is checked so at each visit).
    """
    cdef BatchHeader h
    cdef const MemoHeader* head
    cdef int64_t found
    cdef int rc
    if pos < 0 or pos > n:
        raise ValueError(f"position {pos} outside a buffer of {n} bytes")
    while pos < n:
        memo = verified.get(pos) if verified is not None else None
        head = memo_header(memo, pos, n)
        if head == NULL:
            rc = check_batch(buf + pos, n - pos, &h, False)
            if rc == E_SHORT:
                break
            if rc != OK:
                raise CorruptRecordError(error_text(rc), path=source, position=pos)
            if h.base_offset < 0:  # as read_at: no offset of a log is negative
                raise CorruptRecordError(f"negative base offset {h.base_offset}", path=source,
                                         position=pos)
            # a memo that is not one (b"", or another caller's value) counts as "checked":
            # the records are then decoded and checked up to the answer, as without memos
            if (h.attributes & ATTR_CODEC_MASK or h.attributes & ATTR_CONTROL or verified is None
                    or memo is not None):
                if verify_crc and memo is None:
                    walk_batch(buf + pos, n - pos, &h, True, source, pos)
                if (h.max_timestamp >= timestamp and not h.attributes & ATTR_CONTROL
                        and h.base_offset + h.last_offset_delta >= min_offset):
                    found = in_decoded_batch(buf + pos, &h, timestamp, min_offset, source, pos,
                                             max_decompressed)
                    if found >= 0:
                        return found
                pos += LOG_OVERHEAD + h.batch_length
                continue
            memo = check_first_read(buf, n, pos, &h, verify_crc, verified, source)
            head = memo_header(memo, pos, n)
            if head == NULL:  # cannot be: the batch is whole inside buf
                raise ValueError(f"no memo for the batch at position {pos}")
        if (head.max_timestamp >= timestamp
                and head.base_offset + head.last_offset_delta >= min_offset):
            found = in_memo_batch(buf + pos + BATCH_HEADER_SIZE, <bytes>memo, timestamp,
                                  min_offset, source, pos)
            if found >= 0:
                return found
        pos += BATCH_HEADER_SIZE + <Py_ssize_t>head.records_size
    return -1


cdef int64_t in_memo_batch(const unsigned char* records, bytes memo, int64_t timestamp,
                           int64_t min_offset, object source, Py_ssize_t pos) except -2:
    """The first offset >= min_offset reaching `timestamp` in a checked, uncompressed batch (its
    records area at `records`, its memo from memo_header), or -1: from the first group whose
    largest timestamp reaches it (all groups when the memo keeps no maxima)."""
    cdef const MemoHeader* head = <const MemoHeader*>PyBytes_AS_STRING(memo)
    cdef BatchHeader h
    cdef Py_ssize_t start = 0, group
    cdef int64_t delta = -1
    cdef int rc
    header_of_memo(head, &h)
    group = first_group_reaching(memo, timestamp, &start)
    if group == -1:
        return -1
    if group < 0:
        group = 0
    rc = first_reaching(records + start, head.records_size - start,
                        head.records_count - group * SAMPLE_EVERY, &h, timestamp,
                        min_offset - h.base_offset if min_offset > h.base_offset else 0, &delta)
    if rc < 0:
        raise CorruptRecordError(error_text(rc), path=source, position=pos)
    return h.base_offset + delta if rc == 1 else -1


cdef Py_ssize_t first_group_reaching(bytes memo, int64_t timestamp,
                                     Py_ssize_t* start) noexcept:
    """With the memo's group maxima (MEMO_TIMES): the index of the first group whose largest
    timestamp is >= timestamp (*start: its first record's position in the records area), or
    -1 when none is; -2 when the memo keeps no (usable) maxima: walk from the first record."""
    cdef const MemoHeader* head = <const MemoHeader*>PyBytes_AS_STRING(memo)
    cdef const unsigned char* samples = (<const unsigned char*>PyBytes_AS_STRING(memo)
                                         + sizeof(MemoHeader))
    cdef Py_ssize_t count = head.count, width, k
    cdef int32_t at
    cdef int64_t group_max
    if not head.flags & MEMO_TIMES or count <= 0:
        return -2
    width = 4 if head.flags & MEMO_DENSE else 8
    if PyBytes_GET_SIZE(memo) - <Py_ssize_t>sizeof(MemoHeader) < count * (width + 8):
        return -2
    for k in range(count):
        memcpy(&group_max, samples + count * width + k * 8, 8)
        if group_max >= timestamp:
            memcpy(&at, samples + k * width + width - 4, 4)
            if not 0 <= at <= head.records_size:
                return -2
            start[0] = at
            return k
    return -1


cdef int first_reaching(const unsigned char* records, Py_ssize_t size, Py_ssize_t count,
                        const BatchHeader* h, int64_t timestamp, int64_t min_delta,
                        int64_t* delta) noexcept nogil:
    """Over `count` records from `records` (size bytes): 1 with *delta the offset delta of the
    first record whose timestamp (record_timestamp) is >= timestamp and whose offset delta is
    >= min_delta, 0 when none is, or an E_ code.

    Reads each record's length and timestampDelta only (the offsetDelta of the one found), so
    it is for a records area checked whole before; every read is still bounds-checked, and the
    delta found must lie in [0, lastOffsetDelta], so bytes that changed since the check give an
    error or an offset of this batch, never a read outside the area.
    """
    cdef const unsigned char* p = records
    cdef const unsigned char* end = records + size
    cdef const unsigned char* q
    cdef const unsigned char* rec_end
    cdef int64_t length, ts_delta
    cdef int n
    while count > 0:
        n = read_varint(p, end - p, &length)
        if n < 0:
            return E_VARINT
        if length < 1 or length > end - p - n:
            return E_RECORD_LENGTH
        q = p + n + 1                        # past the length and the attributes byte
        rec_end = p + n + length
        n = read_varint(q, rec_end - q, &ts_delta)
        if n < 0:
            return E_VARINT
        if record_timestamp(h, ts_delta) >= timestamp:
            q += n
            n = read_varint(q, rec_end - q, delta)
            if n < 0:
                return E_VARINT
            if delta[0] < 0 or delta[0] > h.last_offset_delta:
                return E_OFFSET_DELTA
            if delta[0] >= min_delta:
                return 1
        p = rec_end
        count -= 1
    return 0


cdef int64_t in_decoded_batch(const unsigned char* batch, const BatchHeader* h, int64_t timestamp,
                              int64_t min_offset, object source, Py_ssize_t pos,
                              Py_ssize_t max_decompressed) except -2:
    """The first offset reaching `timestamp` in a batch read through next_record (a compressed
    one decompressed; each record decoded and checked up to the one found), or -1."""
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    area = open_records(batch, h, max_decompressed, &c)  # owns the cursor's bytes
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            return -1
        if rc < 0:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        if (record_timestamp(h, r.timestamp_delta) >= timestamp
                and h.base_offset + r.offset_delta >= min_offset):
            return h.base_offset + r.offset_delta
