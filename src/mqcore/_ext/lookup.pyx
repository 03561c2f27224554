# Point lookups (docs/query.md "How a lookup runs"): a record by offset, a store ID decoded and
# fetched, and the verified key-index hits of a topic's partitions, each in one call, so a
# lookup pays for one Python frame rather than one per segment, per index probe and per hit.
#
# The kernel is the storage layer's fast path, not a second copy of its rules. It is handed a
# partition's SegmentTable (segtable.pyx: the segment list, the base offsets, the lock) and
# reads each listed segment only through the public names segtable.pyi lists (`TableSegment`):
#   base_offset, next_offset, max_timestamp, size, is_open, ensure_open(), offset_index and
#   time_index (entries, raw_buffer()), mapped and mapping(limit) (MappedFile),
#   verified_batches, log_path, key_index (table), key_table()
# It returns Messages and plain tuples; the query layer builds its results from them.
# Under the partition lock a lookup picks its segments, their sizes, the offset-index floor or
# the key-index entries, and takes a buffer of each mapping it will read (export_mapping).
# That buffer is the read's pin: a MappedFile unmaps only when its last buffer is released, so
# retention or compaction may retire and close the segment meanwhile (its files, its indexes)
# and the read still finishes on the bytes it picked. The log is then read without the lock
# (docs/architecture.md "Concurrency"); Python-level scans keep pinning segments
# (Partition.pinned_segments) because they hold more than the mapping.
# A store ID is decoded by ids.pyx.
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport INT64_MIN, int32_t, int64_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcmp, memcpy, memset

from mqcore._ext.batch cimport E_TRAILING, OK, HeaderView, Message, error_text, next_header
from mqcore._ext.bytes_be cimport load_be32
from mqcore._ext.hashing cimport KIND_KEY, KIND_UID, SEED_KEY, xxh64
from mqcore._ext.ids cimport decode_id
from mqcore._ext.index cimport OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE, floor_entry
from mqcore._ext.keyindex cimport EntryHit, HitArray, hits_free, probe_tables
from mqcore._ext.mapping cimport MappedFile
from mqcore._ext.scan cimport first_at_or_after, locate, read_at, read_memo
from mqcore._ext.segtable cimport SegmentTable

from mqcore.errors import CorruptRecordError

cdef enum:
    LOCAL_CANDIDATES = 16         # index hits a key lookup keeps on the stack (more: on the heap)

DEFAULT_MAX_DECOMPRESSED = 256 << 20
KEY_KIND = KIND_KEY
UID_KIND = KIND_UID


# ---------------------------------------------------------------------------------------------
# get: segment floor, offset-index floor, record; a store ID's record
# ---------------------------------------------------------------------------------------------

cdef int index_floor(object seg, int64_t base, int64_t offset, Py_ssize_t* position) except -1:
    """LogSegment.position_for: the position of the offset index's floor entry (0 if none)."""
    cdef Py_buffer b
    cdef Py_ssize_t entries, i
    idx = seg.offset_index
    entries = idx.entries
    position[0] = 0
    if entries <= 0:
        return 0
    PyObject_GetBuffer(idx.raw_buffer(), &b, PyBUF_SIMPLE)
    try:
        if b.len == 0:
            return 0  # not mapped: no floor to start from
        if entries > b.len // OFFSET_ENTRY_SIZE:
            raise ValueError(f"{entries} entries of {OFFSET_ENTRY_SIZE} bytes do not fit a buffer "
                             f"of {b.len} bytes")
        i = floor_entry(<const unsigned char*>b.buf, entries, OFFSET_ENTRY_SIZE, False,
                        offset - base)
        if i >= 0:
            position[0] = <int32_t>load_be32(<const unsigned char*>b.buf
                                             + i * OFFSET_ENTRY_SIZE + 4)
    finally:
        PyBuffer_Release(&b)
    return 0


cdef int export_mapping(object seg, Py_ssize_t limit, Py_buffer* b) except -1:
    """Take a buffer of the segment's mapping covering [0, limit) into *b (call with the
    partition lock held, while the segment is still listed and open). Until it is released, the
    buffer keeps the mapping alive whatever retention, compaction or a remap does meanwhile
    (MappedFile unmaps when its last buffer goes): it is a point read's pin."""
    mapped = seg.mapped
    if mapped is None or (<MappedFile?>mapped).length < limit:
        mapped = seg.mapping(limit)  # maps (or remaps) the segment
    PyObject_GetBuffer(mapped, b, PyBUF_SIMPLE)
    if b.len < limit:
        PyBuffer_Release(b)
        b.buf = NULL
        raise ValueError(f"the mapping of {b.len} bytes is shorter than the {limit} read")
    return 0


cdef object read_exported(const unsigned char* buf, Py_ssize_t limit, object verified,
                          object source, Py_ssize_t position, int64_t offset, object memo,
                          Py_ssize_t batch_pos, str topic, int partition, bint verify_crc,
                          Py_ssize_t max_decompressed):
    """The record at `offset` in a segment's bytes buf[0:limit]: read_memo at batch_pos when
    locate found the batch's memo, else read_at from `position`; `verified` is the segment's
    verified_batches, `source` its log path."""
    if memo is not None:
        return read_memo(buf, limit, batch_pos, memo, offset, topic, partition, source, False)
    return read_at(buf, limit, position, offset, topic, partition, verify_crc, <dict?>verified,
                   source, max_decompressed)


cdef SegmentTable table_of(object part):
    """A SegmentTable as is, else the public `table` of a partition (storage.Partition)."""
    if type(part) is SegmentTable:
        return <SegmentTable>part
    return <SegmentTable?>part.table


cdef object get_in(SegmentTable table, object offset_obj, bint verify_crc,
                   Py_ssize_t max_decompressed):
    cdef int64_t offset
    cdef Py_ssize_t position = 0, limit, batch_pos = 0, i
    cdef list segments
    cdef Py_buffer b
    try:
        offset = offset_obj
    except OverflowError:
        return None  # past any offset a log can hold
    memset(&b, 0, sizeof(b))  # b.buf stays NULL until export_mapping fills b
    lock = table.lock
    try:
        lock.acquire()
        try:
            segments = table.segments
            if (table.count == 0 or offset < table.base_offsets[0] or offset < table.log_start
                    or offset >= <int64_t>segments[table.count - 1].next_offset):
                return None
            i = table.floor(offset)
            seg = segments[i]
            if not seg.is_open:
                seg.ensure_open()  # first use, or closed by the store's segment cache
            index_floor(seg, table.base_offsets[i], offset, &position)
            limit = seg.size
            export_mapping(seg, limit, &b)
            verified = seg.verified_batches
            memo = locate(<const unsigned char*>b.buf, limit, position, offset, <dict?>verified,
                          &batch_pos)
        finally:
            lock.release()
        return read_exported(<const unsigned char*>b.buf, limit, verified, seg.log_path,
                             position, offset, memo, batch_pos, table.topic, table.partition,
                             verify_crc, max_decompressed)
    finally:
        if b.buf != NULL:
            PyBuffer_Release(&b)


def get_record(SegmentTable table not None, offset, bint verify_crc=True,
               Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED):
    """Partition.get: the Message at `offset` of the partition whose table is `table`, or None (outside the log, a
    compacted gap, a control record).

    Under the partition lock: the segment whose base is the floor of the offset, its offset
    index floor, its size and a buffer of its mapping (export_mapping: the read's pin). Then,
    without the lock, the batch's memo (scan.locate, read_memo) or the headers from the floor
    (scan.read_at: the batch's CRC is checked the first time a get lands in it, as the segment's
    `verified_batches` memo records), and the buffer is released.
    """
    return get_in(table, offset, verify_crc, max_decompressed)


# ---------------------------------------------------------------------------------------------
# offset_for_time: the first segment that reaches the timestamp, its time-index floor, the walk
# ---------------------------------------------------------------------------------------------

cdef int time_floor(object seg, int64_t base, int64_t timestamp, Py_ssize_t* position) except -1:
    """LogSegment.position_for_time: the position of the batch the offset index gives for the
    time index's floor entry (0 if none), at or before the first batch that may reach
    `timestamp` (an entry says no record before its offset has a larger timestamp)."""
    cdef Py_buffer b
    cdef Py_ssize_t entries, i
    cdef int64_t relative = -1
    idx = seg.time_index
    entries = idx.entries
    position[0] = 0
    if entries <= 0:
        return 0
    PyObject_GetBuffer(idx.raw_buffer(), &b, PyBUF_SIMPLE)
    try:
        if b.len == 0:
            return 0
        if entries > b.len // TIME_ENTRY_SIZE:
            raise ValueError(f"{entries} entries of {TIME_ENTRY_SIZE} bytes do not fit a buffer "
                             f"of {b.len} bytes")
        i = floor_entry(<const unsigned char*>b.buf, entries, TIME_ENTRY_SIZE, True, timestamp)
        if i >= 0:
            relative = <int32_t>load_be32(<const unsigned char*>b.buf + i * TIME_ENTRY_SIZE + 8)
    finally:
        PyBuffer_Release(&b)
    if relative >= 0:
        index_floor(seg, base, base + relative, position)
    return 0


cdef Py_ssize_t first_reaching_segment(SegmentTable table, int64_t from_offset,
                                       int64_t timestamp) except -2:
    """Index of the first listed segment holding offsets >= from_offset whose largest
    timestamp reaches `timestamp`, or -1 (call with the lock held)."""
    cdef list segments = table.segments
    cdef Py_ssize_t i
    for i in range(table.floor(from_offset), table.count):
        seg = segments[i]
        if <int64_t>seg.next_offset > from_offset and <int64_t>seg.max_timestamp >= timestamp:
            return i
    return -1


cdef object time_in(SegmentTable table, object timestamp_obj, bint verify_crc,
                    Py_ssize_t max_decompressed):
    cdef int64_t timestamp, start = table.log_start, from_offset = start, found
    cdef Py_ssize_t position, limit, i
    cdef Py_buffer b
    try:
        timestamp = timestamp_obj
    except OverflowError:
        if timestamp_obj > 0:
            return None  # past any timestamp a record can hold
        timestamp = INT64_MIN
    lock = table.lock
    while True:
        memset(&b, 0, sizeof(b))  # b.buf stays NULL until export_mapping fills b
        try:
            lock.acquire()
            try:
                i = first_reaching_segment(table, from_offset, timestamp)
                if i < 0:
                    return None
                seg = table.segments[i]
                if not seg.is_open:
                    seg.ensure_open()  # first use, or closed by the store's segment cache
                time_floor(seg, table.base_offsets[i], timestamp, &position)
                limit = seg.size
                from_offset = seg.next_offset  # where a further pass would go on
                if limit > 0:
                    export_mapping(seg, limit, &b)
                verified = seg.verified_batches
            finally:
                lock.release()
            if limit <= 0:
                continue
            found = first_at_or_after(<const unsigned char*>b.buf, limit, position, timestamp,
                                      start, verify_crc, <dict?>verified, seg.log_path,
                                      max_decompressed)
        finally:
            if b.buf != NULL:
                PyBuffer_Release(&b)
        if found >= 0:
            return found


def offset_for_time(SegmentTable table not None, timestamp, bint verify_crc=True,
                    Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED):
    """Partition.offset_for_time: Kafka's rule, the earliest offset of the partition whose
    record timestamp is >= `timestamp`, or None. Offsets below the table's log start (which
    DeleteRecords moves inside a segment, even inside a batch) are not in the partition.

    Under the partition lock: the first segment whose largest timestamp reaches it, its time
    index floor (and the offset index's position for it), its size and a buffer of its mapping
    (the read's pin). Then, without the lock, scan.first_at_or_after: batch memos or headers up
    to the first batch that reaches it, then that batch's record timestamps. Almost always the
    answer is in that segment; when it is not (only control records reach the timestamp there),
    the next pass takes the next segment that reaches it, under the lock again.
    """
    return time_in(table, timestamp, verify_crc, max_decompressed)


def get_by_id(dict partitions not None, msg_id, decode not None,
              Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED):
    """Store.get_by_id: the message a store ID names, or None when its topic, partition or
    offset is not (or no longer) in the store. `partitions` maps topic -> {partition number:
    an object whose public `table` is its SegmentTable (storage.Partition)}; `decode` (ids.decode_msg_id) handles the texts the fast decoder refuses, which
    means raising InvalidMessageIdError for them."""
    cdef PyObject* parts
    cdef PyObject* part
    where = decode_id(msg_id)
    if where is None:
        where = decode(msg_id)
    topic, partition, offset = where
    parts = PyDict_GetItem(partitions, topic)
    if parts == NULL:
        return None
    part = PyDict_GetItem(<dict?><object>parts, partition)
    if part == NULL:
        return None
    return get_in(table_of(<object>part), offset, True, max_decompressed)


# ---------------------------------------------------------------------------------------------
# Key-index lookups: probe every segment, read and verify every candidate
# ---------------------------------------------------------------------------------------------

cdef struct Candidate:
    int64_t offset
    int64_t order                 # probe order: of two entries for one offset the later wins
    Py_ssize_t segment            # index in the segment list (-1: a duplicate, skipped)
    int64_t position              # the entry's batch position
    Py_ssize_t batch_pos          # where locate found the batch holding the offset


cdef int by_offset_then_order(const void* a, const void* b) noexcept nogil:
    cdef const Candidate* x = <const Candidate*>a
    cdef const Candidate* y = <const Candidate*>b
    if x.offset != y.offset:
        return -1 if x.offset < y.offset else 1
    return -1 if x.order < y.order else (1 if x.order > y.order else 0)


cdef int last_header(Message m, str name_text, const char* name, Py_ssize_t name_len,
                     const unsigned char** value, Py_ssize_t* value_len) except -1:
    """Message.header(name) without building the headers: 1 and the value of the last header
    called `name` (value_len -1 for a null value), or 0 when there is none."""
    cdef HeaderView hv
    cdef const unsigned char* p
    cdef const unsigned char* end
    cdef Py_ssize_t i
    cdef int rc, found = 0
    cdef tuple pair
    if m._headers is not None:
        for i in range(len(m._headers) - 1, -1, -1):
            pair = <tuple?>m._headers[i]
            if pair[0] == name_text:
                v = pair[1]
                if v is None:
                    value_len[0] = -1
                else:
                    value[0] = <const unsigned char*>PyBytes_AS_STRING(<bytes?>v)
                    value_len[0] = PyBytes_GET_SIZE(v)
                return 1
        return 0
    if m._raw_headers is None:
        return 0
    p = <const unsigned char*>PyBytes_AS_STRING(m._raw_headers)
    end = p + PyBytes_GET_SIZE(m._raw_headers)
    for i in range(m._header_count):
        rc = next_header(&p, end, &hv)
        if rc != OK:
            raise CorruptRecordError(error_text(rc) + " (record header)")
        if hv.key_len == name_len and memcmp(hv.key, name, name_len) == 0:
            found = 1
            value[0] = hv.value
            value_len[0] = hv.value_len
    if p != end:
        raise CorruptRecordError(error_text(E_TRAILING) + " (record headers)")
    return found


cdef bint among_words(const unsigned char* v, Py_ssize_t n, const unsigned char* key,
                      Py_ssize_t k) noexcept nogil:
    """key in v.split(b" "): the pieces between single spaces, empty ones included."""
    cdef Py_ssize_t i, start = 0
    for i in range(n + 1):
        if i == n or v[i] == 32:
            if i - start == k and memcmp(v + start, key, k) == 0:
                return True
            start = i + 1
    return False


cdef bint message_matches(Message m, int kind, bytes raw) except -1:
    """The stored record really carries `raw`: as its key or a word of its `keys` header
    (KIND_KEY), or as its `uid` header (KIND_UID)."""
    cdef const unsigned char* v = NULL
    cdef Py_ssize_t n = -1
    cdef const unsigned char* r = <const unsigned char*>PyBytes_AS_STRING(raw)
    cdef Py_ssize_t k = PyBytes_GET_SIZE(raw)
    if kind == KIND_KEY:
        key = m.key
        if key is not None and PyBytes_GET_SIZE(key) == k \
                and memcmp(PyBytes_AS_STRING(key), r, k) == 0:
            return True
        if not last_header(m, "keys", b"keys", 4, &v, &n) or n < 0:
            return False
        return among_words(v, n, r, k)
    if not last_header(m, "uid", b"uid", 3, &v, &n) or n < 0:
        return False
    return n == k and memcmp(v, r, k) == 0


cdef object key_table_of(object seg):
    """The segment's key table (built on first use in a read-only store), or None."""
    ki = seg.key_index
    if ki is None:
        return None
    table = ki.table
    return table if table is not None else seg.key_table()


cdef uint64_t hash_of(bytes raw, int kind) except? 0:
    """xxHash64 of `raw` with the seed of its kind (hashing.pxd)."""
    if kind == KIND_KEY:
        return xxh64(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), SEED_KEY)
    if kind == KIND_UID:
        # generated IDs have one run entry per batch, not an entry each: KeyTable.probe_uid
        raise ValueError("unique IDs are found by KeyTable.probe_uid (query.engine.find_unique)")
    raise ValueError(f"unknown lookup kind {kind}")


cdef list find_part(SegmentTable table, uint64_t hashed, bytes raw, int kind, int64_t lo, int64_t hi,
                    int64_t from_offset, Py_ssize_t max_probe, Py_ssize_t max_decompressed,
                    Py_ssize_t want, Py_ssize_t* candidates):
    """The verified messages of one partition whose key-index entries carry `hashed`, in
    offset order, the first `want` of them; *candidates: how many were read.

    Under the partition lock: probe every segment's table (the chains side by side), keep the
    entries in the offset and time windows, and take a buffer of the mapping of each segment
    they fall in (export_mapping), with its size. Then, without the lock, in offset order:
    start loading the records of as many candidates as messages are still wanted (locate),
    read and verify them one by one; again until `want` messages or no candidate is left
    (a limit of 1 reads one or two records of a key with thousands). Release the buffers."""
    cdef EntryHit hits_here[LOCAL_CANDIDATES]
    cdef Candidate cands_here[LOCAL_CANDIDATES]
    cdef HitArray hits
    cdef Candidate* cands = cands_here
    cdef Candidate* grown
    cdef Py_buffer* bufs = NULL  # per segment: its mapping (buf != NULL once taken)
    cdef Py_ssize_t ncand = 0, cap = LOCAL_CANDIDATES, n = 0, j, i, kept = 0, located = 0
    cdef Py_ssize_t still, k
    cdef int64_t off
    cdef list segments, refs = None, memos, out = []
    cdef tuple ref
    cdef Message m
    hits.items = hits_here
    hits.count = 0
    hits.capacity = LOCAL_CANDIDATES
    hits.on_heap = False
    lock = table.lock
    try:
        lock.acquire()
        try:
            segments = table.segments
            if from_offset < table.log_start:
                from_offset = table.log_start  # nothing below the log start is an answer
            probe_tables([key_table_of(seg) for seg in segments], hashed, max_probe, &hits)
            if hits.count:
                n = len(segments)
                bufs = <Py_buffer*>PyMem_Calloc(n, sizeof(Py_buffer))
                if bufs == NULL:
                    n = 0
                    raise MemoryError()
                # per segment with hits: (base offset, segment, size, memos, log path)
                refs = [None] * n
            for i in range(hits.count):
                j = hits.items[i].source
                ref = <tuple>refs[j]
                if ref is None:
                    seg = segments[j]
                    ref = refs[j] = (table.base_offsets[j], seg, seg.size,
                                     seg.verified_batches, seg.log_path)
                off = <int64_t>ref[0] + hits.items[i].rel_offset
                if off < from_offset or hits.items[i].ts_hi < lo or hits.items[i].ts_lo >= hi:
                    continue
                if ncand == cap:
                    cap *= 2
                    if cands == cands_here:
                        grown = <Candidate*>PyMem_Malloc(cap * sizeof(Candidate))
                        if grown != NULL:
                            memcpy(grown, cands, ncand * sizeof(Candidate))
                    else:
                        grown = <Candidate*>PyMem_Realloc(cands, cap * sizeof(Candidate))
                    if grown == NULL:
                        raise MemoryError()
                    cands = grown
                cands[ncand].offset = off
                # ties between entries for one offset go as if the segments were probed one
                # after the other, each newest first: the later entry wins (a dict's rule)
                cands[ncand].order = (<int64_t>j << 32) | hits.items[i].step
                cands[ncand].segment = j
                cands[ncand].position = hits.items[i].position
                cands[ncand].batch_pos = 0
                ncand += 1
                if bufs[j].buf == NULL:
                    export_mapping(ref[1], ref[2], &bufs[j])
        finally:
            lock.release()
        candidates[0] = 0
        if ncand == 0:
            return out
        if ncand > 1:
            qsort(cands, ncand, sizeof(Candidate), by_offset_then_order)
        for i in range(ncand - 1):
            if cands[i + 1].offset == cands[i].offset:
                cands[i].segment = -1  # a later entry names the same record
        memos = [None] * ncand
        topic, partition = table.topic, table.partition
        for i in range(ncand):
            if len(out) >= want:
                break
            j = cands[i].segment
            if j < 0:
                continue
            if located <= i:
                # the records of the next candidates (as many as messages still wanted) start
                # loading before the first of them is read
                still = want - len(out)
                while located < ncand and still > 0:
                    k = cands[located].segment
                    if k >= 0:
                        ref = <tuple>refs[k]
                        memos[located] = locate(<const unsigned char*>bufs[k].buf,
                                                <Py_ssize_t>ref[2], cands[located].position,
                                                cands[located].offset, <dict?>ref[3],
                                                &cands[located].batch_pos)
                        still -= 1
                    located += 1
            kept += 1
            ref = <tuple>refs[j]
            found = None
            if cands[i].position < <Py_ssize_t>ref[2]:
                try:
                    found = read_exported(<const unsigned char*>bufs[j].buf, ref[2], ref[3],
                                          ref[4], cands[i].position, cands[i].offset,
                                          memos[i], cands[i].batch_pos, topic, partition, True,
                                          max_decompressed)
                except CorruptRecordError:
                    found = None
            if found is None:
                # the entry's position may be damaged (the offset is what counts): the offset
                # index decides, and raises if the log itself is damaged there
                found = get_in(table, cands[i].offset, True, max_decompressed)
            if found is None:
                continue
            m = <Message>found
            if lo <= m.timestamp < hi and message_matches(m, kind, raw):
                out.append(m)
        candidates[0] = kept
        return out
    finally:
        hits_free(&hits)
        if cands != cands_here:
            PyMem_Free(cands)
        for j in range(n):
            if bufs[j].buf != NULL:
                PyBuffer_Release(&bufs[j])
        PyMem_Free(bufs)


def find_hashed(SegmentTable table not None, bytes raw not None, int kind, int64_t lo, int64_t hi, int64_t from_offset,
                Py_ssize_t max_probe, Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED):
    """The messages of the partition whose table is `table` that carry `raw` (KEY_KIND: as key or `keys` word;
    UID_KIND raises ValueError: unique IDs go through KeyTable.probe_uid) by its key index,
    with timestamps in [lo, hi) and offsets >= from_offset, in offset order; and how many
    candidates were read.

    The tables are probed under the partition lock (xxHash64 of `raw` with the kind's seed;
    each probe walks at most max_probe matching entries), where the mappings of the segments
    with candidates are taken (a buffer each: the read's pin). A candidate is read from its entry's batch position; when that fails (a
    damaged position), through the offset index (get_record), which raises if the log itself
    is damaged there. It counts only if its record carries `raw` and its timestamp is in the
    window.
    """
    cdef Py_ssize_t candidates = 0
    found = find_part(table, hash_of(raw, kind), raw, kind, lo, hi, from_offset, max_probe,
                      max_decompressed, PY_SSIZE_T_MAX, &candidates)
    return found, candidates


cdef list in_order(object parts):
    """`parts` as find_in_partitions takes them: a list as it is (in partition-number order
    already), a topic's dict of partitions by number in number order, any other iterable as a
    list."""
    if type(parts) is list:
        return <list>parts
    if type(parts) is dict:
        if len(<dict>parts) == 1:
            return list((<dict>parts).values())
        return [(<dict>parts)[p] for p in sorted(<dict>parts)]
    return list(parts)


cdef list find_in_partitions(list parts, bytes raw, int kind, int64_t lo, int64_t hi,
                             Py_ssize_t limit, Py_ssize_t resume_partition,
                             int64_t resume_offset, Py_ssize_t max_probe,
                             Py_ssize_t max_decompressed, Py_ssize_t* scanned,
                             Py_ssize_t* stop_partition, int64_t* stop_offset):
    """find_part over `parts` (table_of each) in order, from (resume_partition,
    resume_offset) on (-1: from the start), until `limit` messages; *scanned: the candidates
    read; *stop_partition and *stop_offset: where to resume when the limit cut the answer
    short, else -1 and 0."""
    cdef uint64_t hashed = hash_of(raw, kind)
    cdef list messages = None, found
    cdef Py_ssize_t room, p, read
    cdef int64_t from_offset
    cdef SegmentTable table
    scanned[0] = 0
    stop_partition[0] = -1
    stop_offset[0] = 0
    for part in parts:
        table = table_of(part)
        p = table.partition
        if p < resume_partition:
            continue
        from_offset = resume_offset if p == resume_partition else 0
        read = 0
        room = limit - (len(messages) if messages is not None else 0)
        # one more than there is room for: whether the limit cuts the answer here
        found = find_part(table, hashed, raw, kind, lo, hi, from_offset, max_probe,
                          max_decompressed, room + 1, &read)
        scanned[0] += read
        if len(found) > room:
            if messages is None:
                messages = []
            messages.extend(found[:room])
            # resume after the last message returned, or at this partition's start
            stop_partition[0] = p
            stop_offset[0] = (<Message>found[room - 1]).offset + 1 if room else from_offset
            return messages
        if messages is None:
            messages = found
        else:
            messages.extend(found)
    return messages if messages is not None else []


def find_keyed(object parts not None, bytes raw not None, int kind, int64_t lo, int64_t hi,
               Py_ssize_t limit, Py_ssize_t resume_partition, int64_t resume_offset,
               Py_ssize_t max_probe, Py_ssize_t max_decompressed=DEFAULT_MAX_DECOMPRESSED):
    """find_hashed over `parts` (partitions, each with its public `table`, or SegmentTables: a
    list in partition-number order, or a dict of them by number, ordered here) from
    (resume_partition, resume_offset) on (-1: from the start), until `limit` messages.

    Returns (messages, candidates read, stop partition, stop offset): the stop is where to
    resume when `limit` cut the answer short, else (-1, 0). The arguments are the query
    layer's, already checked (query/keyed.pyx find_indexed makes the same call in C)."""
    cdef Py_ssize_t scanned = 0, stop_p = -1
    cdef int64_t stop_o = 0
    if limit < 1:
        raise ValueError(f"limit must be >= 1, not {limit}")
    messages = find_in_partitions(in_order(parts), raw, kind, lo, hi, limit, resume_partition,
                                  resume_offset, max_probe, max_decompressed, &scanned, &stop_p,
                                  &stop_o)
    return messages, scanned, stop_p, stop_o
