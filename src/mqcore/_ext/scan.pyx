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
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

from mqcore._ext.batch cimport (
    ATTR_CODEC_MASK, ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BATCH_HEADER_SIZE, BatchHeader,
    E_OFFSET_ORDER, E_SHORT, LOG_OVERHEAD, OK, RecordCursor, RecordView, check_batch,
    cursor_init, error_text, make_message, next_record, open_records, walk_batch, wrap_add,
)
from mqcore._ext.bytes_be cimport store_be32, store_be64

from mqcore._ext.batch import decode_messages

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
    SAMPLE_EVERY = 32             # one remembered record position per 32 records
    SAMPLED_MIN_RECORDS = 64      # smaller batches are walked from their start
    VERIFIED_MAX = 65536          # memo entries per segment before it starts over


cdef bytes sample_positions(const unsigned char* records, Py_ssize_t size, const BatchHeader* h):
    """(offsetDelta int32, position int32) of every SAMPLE_EVERY-th record, native order."""
    cdef RecordCursor c
    cdef RecordView r
    cdef const unsigned char* at
    cdef Py_ssize_t i = 0
    cdef int32_t entry[2]
    out = bytearray()
    cursor_init(&c, records, size, h)
    while True:
        at = c.p
        if next_record(&c, &r) != 1:
            break
        if i % SAMPLE_EVERY == 0:
            entry[0] = <int32_t>r.offset_delta
            entry[1] = <int32_t>(at - records)
            out += (<char*>entry)[:8]
        i += 1
    return bytes(out)


def read_record(const unsigned char[::1] buf not None, Py_ssize_t position, int64_t offset,
                str topic, int partition, bint verify_crc=True, dict verified=None, source=None,
                Py_ssize_t max_decompressed=256 << 20):
    """The Message at `offset` in buf (a segment's bytes from position 0), or None.

    Walks batch headers from `position` (a batch boundary at or before the offset: the index
    floor) to the batch holding the offset, then its records. The first get in a batch checks
    its CRC and remembers it in `verified` (batch position -> sampled record positions), so a
    later get skips the CRC and starts its walk at most SAMPLE_EVERY records before the target.
    """
    cdef BatchHeader h
    cdef RecordCursor c
    cdef RecordView r
    cdef Py_ssize_t pos, n = buf.shape[0], records_size, k, best
    cdef int64_t base, target_delta
    cdef int rc
    cdef bint check
    cdef const unsigned char* records
    cdef const int32_t* samples
    pos, base, _last = find_batch(buf, position, offset, -1, False, source, 0)
    if base < 0 or base > offset:
        return None
    memo = None if verified is None else verified.get(pos)
    check = verify_crc and memo is None
    walk_batch(&buf[pos], n - pos, &h, check, source, pos)  # whole: find_batch found it
    if h.attributes & ATTR_CODEC_MASK or h.attributes & ATTR_CONTROL:
        out = []
        decode_messages(buf, pos, topic, partition, offset, 1, out, False, max_decompressed,
                        source, 0, offset)
        if verified is not None and memo is None:
            remember(verified, pos, b"")
        return out[0] if out and out[0].offset == offset else None
    records = &buf[pos] + BATCH_HEADER_SIZE
    records_size = LOG_OVERHEAD + h.batch_length - BATCH_HEADER_SIZE
    if memo is None:
        memo = (sample_positions(records, records_size, &h)
                if h.records_count >= SAMPLED_MIN_RECORDS else b"")
        if verified is not None:
            remember(verified, pos, memo)
    cursor_init(&c, records, records_size, &h)
    target_delta = offset - h.base_offset
    samples = <const int32_t*>PyBytes_AS_STRING(memo)
    best = -1
    for k in range(PyBytes_GET_SIZE(memo) // 8):
        if samples[2 * k] > target_delta:
            break
        best = k
    if best >= 0:
        c.p = records + samples[2 * best + 1]
        c.remaining = h.records_count - best * SAMPLE_EVERY
        c.prev_delta = samples[2 * best] - 1
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            return None
        if rc < 0:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        if r.offset_delta == target_delta:
            return make_message(topic, partition, &h, &r)
        if r.offset_delta > target_delta:
            return None


cdef int remember(dict verified, Py_ssize_t pos, bytes memo) except -1:
    if len(verified) >= VERIFIED_MAX:
        verified.clear()
    verified[pos] = memo
    return 0


def first_offset_at_or_after(const unsigned char[::1] buf not None, Py_ssize_t pos,
                             int64_t timestamp, bint verify_crc=True, source=None,
                             Py_ssize_t max_decompressed=256 << 20):
    """Offset of the first record at or after buf[pos] whose timestamp is >= `timestamp`, or -1.

    Skips whole batches whose maxTimestamp is below it (headers only), then walks the record
    timestamps of the first batch that reaches it; no record is materialised. Control batches
    hold no user records and are skipped; under LogAppendTime every record has the batch's
    maxTimestamp.
    """
    cdef BatchHeader h
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    cdef Py_ssize_t n = buf.shape[0]
    if pos < 0 or pos > n:
        raise ValueError(f"position {pos} outside a buffer of {n} bytes")
    while pos < n:
        if not walk_batch(&buf[pos], n - pos, &h, verify_crc, source, pos):
            break
        if h.max_timestamp >= timestamp and not h.attributes & ATTR_CONTROL:
            area = open_records(&buf[pos], &h, max_decompressed, &c)
            while True:
                rc = next_record(&c, &r)
                if rc == 0:
                    break
                if rc < 0:
                    raise CorruptRecordError(error_text(rc), path=source, position=pos)
                if (h.attributes & ATTR_LOG_APPEND_TIME
                        or wrap_add(h.base_timestamp, r.timestamp_delta) >= timestamp):
                    return h.base_offset + r.offset_delta
        pos += LOG_OVERHEAD + h.batch_length
    return -1
