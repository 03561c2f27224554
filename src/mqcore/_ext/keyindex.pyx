# The per-segment query index (.keyindex; docs/format.md "Key index"): a chained hash table of
# the segment's keys and unique IDs, plus the tag column. Big-endian, like Kafka's indexes.
#
#   header, 64 bytes:
#      0  magic "MQKI"            4
#      4  version                 u16   3 (2: no run entries; read as well, made 3 by the
#                                     first insert; 1: rebuilt)
#      6  flags                   u16   bit 0: complete (sealed or closed: the counts,
#                                     covered_position and content_crc are final)
#      8  slot_count              u32   a power of two
#     12  key_capacity            u32   key entries the file has room for
#     16  tag_capacity            u32   tag entries the file has room for
#     20  key_count               u32
#     24  tag_count               u32
#     28  content_crc             u32   CRC-32C of header bytes 8-27 and 32-63, the key
#                                     entries and the tag entries in use (valid only when
#                                     complete); the slots are checked against the entries
#     32  base_timestamp          i64   origin of the entries' timestamp deltas (-1: none yet)
#     40  covered_position        i64   .log bytes the entries describe
#     48  min_timestamp           i64   smallest record timestamp in the segment (-1: none)
#     56  max_timestamp           i64   largest (-1: none)
#   slots at 64: slot_count x u32     newest entry of the chain + 1 (0: empty chain)
#   key entries: key_capacity x 24    hash u64 | relative offset u32 | batch position u32
#                                     | timestamp delta i32 | previous entry + 1 u32
#                a run entry (a batch's generated UUIDv7s, hashing.pxd KIND_RUN):
#                                     run count u16 (saturated) | uid_run_hash u48 | its first
#                                     relative offset | position | first counter u32 | link
#   tag entries: tag_capacity x 16    relative offset u32 | batch position u32 | tag hash u64
#
# A hash goes to slot hash & (slot_count - 1); chains run newest first and every link points to
# an older entry, so a walk ends after at most key_count steps even on damaged bytes. Deltas
# outside int32 are stored as INT32_MIN/INT32_MAX ("at most"/"at least"), never wrapped. Tag
# entries are in offset order (appends only), so a tag read binary-searches its start.
# A table is trusted only while complete with a matching content_crc and every used chain's
# slot naming the chain's newest entry (content_valid): the first insert after an open clears
# the flag, sealing or closing sets it again with a fresh CRC. The CRC leaves the slots out so
# that sealing reads only what was written (the slot array is mostly untouched sparse pages).
cimport cython
from libc.stdint cimport INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc

from mqcore._ext.batch cimport (ATTR_CONTROL, ATTR_LOG_APPEND_TIME, BatchHeader, HeaderView,
                                 RecordCursor, RecordView, OK, check_batch,
                                 cursor_finish, error_text, next_header, next_record,
                                 open_records, wrap_add)
from mqcore._ext.crc32c cimport crc32c_extend
from mqcore._ext.bytes_be cimport (load_be16, load_be32, load_be64, mq_prefetch, store_be16,
                                   store_be32, store_be64)
from mqcore._ext.hashing cimport (KIND_KEY, KIND_RUN, KIND_TAG, KIND_UID, RUN_COUNT_MAX,
                                  RUN_COUNT_SHIFT, RUN_HASH_MASK, SEED_KEY, SEED_TAG, SEED_UID,
                                  KeyHit, is_uid_v7, next_word, uid_run_hash, v7_counter,
                                  xxh64)

from mqcore.errors import CorruptIndexError, CorruptRecordError

cdef enum:
    HEADER_SIZE = 64
    KEY_ENTRY = 24
    TAG_ENTRY = 16
    VERSION = 3
    OLD_VERSION = 2               # no run entries: read (probe_uid finds its per-record IDs)
    PROBE_LOCAL = 32              # tables a probe tracks on the stack (more: on the heap)
    INSERT_AHEAD = 8              # hits whose slot is prefetched ahead of the insert

HEADER_BYTES = HEADER_SIZE
KEY_ENTRY_BYTES = KEY_ENTRY
TAG_ENTRY_BYTES = TAG_ENTRY
HIT_BYTES = sizeof(KeyHit)


def file_size(uint32_t slot_count, uint32_t key_capacity, uint32_t tag_capacity):
    """Bytes of a key index file with this geometry."""
    return HEADER_SIZE + 4 * <int64_t>slot_count + KEY_ENTRY * <int64_t>key_capacity \
        + TAG_ENTRY * <int64_t>tag_capacity


def init_header(unsigned char[::1] buf not None, uint32_t slot_count, uint32_t key_capacity,
                uint32_t tag_capacity):
    """Write an empty index's header into a zeroed buffer of file_size(...) bytes."""
    if slot_count == 0 or slot_count & (slot_count - 1):
        raise ValueError(f"slot_count must be a power of two, not {slot_count}")
    if buf.shape[0] != file_size(slot_count, key_capacity, tag_capacity):
        raise ValueError("buffer size does not match the index geometry")
    cdef unsigned char* p = &buf[0]
    memcpy(p, b"MQKI", 4)
    store_be16(p + 4, VERSION)
    store_be16(p + 6, 0)
    store_be32(p + 8, slot_count)
    store_be32(p + 12, key_capacity)
    store_be32(p + 16, tag_capacity)
    store_be32(p + 20, 0)
    store_be32(p + 24, 0)
    store_be32(p + 28, 0)
    store_be64(p + 32, <uint64_t>-1)
    store_be64(p + 40, 0)
    store_be64(p + 48, <uint64_t>-1)
    store_be64(p + 56, <uint64_t>-1)


cdef inline int64_t sat_delta(int64_t ts, int64_t base) noexcept nogil:
    """ts - base clamped to int32 (an entry's timestamp hint), without signed overflow when a
    timestamp read from the log is far from the table's base."""
    cdef int64_t d
    if base > 0 and ts < INT64_MIN + base:
        return INT32_MIN
    if base < 0 and ts > INT64_MAX + base:
        return INT32_MAX
    d = ts - base
    return INT32_MIN if d < INT32_MIN else (INT32_MAX if d > INT32_MAX else d)


cdef int hits_reserve(HitArray* a, Py_ssize_t more) except -1:
    """Room for `more` entries in `a` (grows by doubling, onto the heap)."""
    cdef Py_ssize_t want = a.count + more, cap = a.capacity if a.capacity else 8
    cdef EntryHit* grown
    if want <= a.capacity:
        return 0
    while cap < want:
        cap *= 2
    if a.on_heap:
        grown = <EntryHit*>PyMem_Realloc(a.items, cap * sizeof(EntryHit))
    else:
        grown = <EntryHit*>PyMem_Malloc(cap * sizeof(EntryHit))
        if grown != NULL and a.count:
            memcpy(grown, a.items, a.count * sizeof(EntryHit))
    if grown == NULL:
        raise MemoryError()
    a.items = grown
    a.capacity = cap
    a.on_heap = True
    return 0


cdef void hits_free(HitArray* a) noexcept:
    if a.on_heap:
        PyMem_Free(a.items)
    a.items = NULL
    a.count = a.capacity = 0
    a.on_heap = False


cdef Py_ssize_t probe_tables(list tables, uint64_t hash, Py_ssize_t max_entries,
                             HitArray* out) except -1:
    """Append to `out` the entries with this full hash of every KeyTable in `tables` (None:
    skipped), each table's newest first, at most max_entries per table; returns how many.

    The chains are walked side by side, one entry of each per round, with the next entry of
    each prefetched: a lookup over several segments waits for one miss per round, not one per
    entry. Every link must go to an older entry and every slot below the entry count, so a walk
    ends after key_count steps whatever the bytes; else CorruptIndexError.
    """
    cdef Py_ssize_t n = len(tables), i, active = 0, before = out.count
    cdef uint32_t cur_here[PROBE_LOCAL]
    cdef Py_ssize_t found_here[PROBE_LOCAL]
    cdef uint32_t* cur = cur_here             # each chain's next entry + 1 (0: done)
    cdef Py_ssize_t* found = found_here       # matches taken from each table so far
    cdef uint32_t prev
    cdef const unsigned char* e
    cdef int32_t d
    cdef EntryHit* hit
    cdef KeyTable t
    if n == 0:
        return 0
    if n > PROBE_LOCAL:
        found = <Py_ssize_t*>PyMem_Malloc(n * sizeof(Py_ssize_t))
        cur = <uint32_t*>PyMem_Malloc(n * sizeof(uint32_t))
        if found == NULL or cur == NULL:
            PyMem_Free(found)
            PyMem_Free(cur)
            raise MemoryError()
    try:
        for i in range(n):
            cur[i] = 0
            found[i] = 0
            if tables[i] is not None:
                t = <KeyTable?>tables[i]
                t.check_open(False)
                mq_prefetch(t.slots + 4 * <Py_ssize_t>(hash & (t.slot_count - 1)))
        for i in range(n):
            if tables[i] is None:
                continue
            t = <KeyTable>tables[i]
            cur[i] = load_be32(t.slots + 4 * <Py_ssize_t>(hash & (t.slot_count - 1)))
            if cur[i] > t.key_count:
                raise CorruptIndexError("a key index slot points past its entries")
            if cur[i] != 0 and max_entries > 0:
                mq_prefetch(t.keys + KEY_ENTRY * <Py_ssize_t>(cur[i] - 1))
                active += 1
            else:
                cur[i] = 0
        while active:
            active = 0
            for i in range(n):
                if cur[i] == 0:
                    continue
                t = <KeyTable>tables[i]
                e = t.keys + KEY_ENTRY * <Py_ssize_t>(cur[i] - 1)
                prev = load_be32(e + 20)
                if prev >= cur[i]:
                    raise CorruptIndexError("a key index chain does not go to older entries")
                if prev != 0:
                    mq_prefetch(t.keys + KEY_ENTRY * <Py_ssize_t>(prev - 1))
                if load_be64(e) == hash:
                    hits_reserve(out, 1)
                    hit = &out.items[out.count]
                    d = <int32_t>load_be32(e + 16)
                    hit.rel_offset = load_be32(e + 8)
                    hit.position = load_be32(e + 12)
                    hit.ts_lo = wrap_add(t.base_timestamp, d)
                    hit.ts_hi = hit.ts_lo
                    if d == INT32_MIN:
                        hit.ts_lo = -1
                    elif d == INT32_MAX:
                        hit.ts_hi = 0x7FFFFFFFFFFFFFFF
                    hit.source = i
                    hit.step = found[i]
                    out.count += 1
                    found[i] += 1
                cur[i] = prev if found[i] < max_entries else 0
                if cur[i] != 0:
                    active += 1
    finally:
        if n > PROBE_LOCAL:
            PyMem_Free(cur)
            PyMem_Free(found)
    return out.count - before


@cython.final
cdef class KeyTable:
    """The hash table and tag column over one index buffer (an mmap or a bytearray).

    Holds a buffer export until release(). The header is checked against the buffer's size on
    open; counts are kept here and written back by store_header().
    Its fields are declared in keyindex.pxd.
    """

    def __init__(self, buf, bint writable):
        cdef const unsigned char[::1] v = buf
        cdef const unsigned char* p
        self.view = v
        self.writable = writable
        if v.shape[0] < HEADER_SIZE:
            raise CorruptIndexError(f"key index of {v.shape[0]} bytes is shorter than its header")
        p = &v[0]
        self.base = <unsigned char*>p
        if memcmp(p, b"MQKI", 4) != 0 or (load_be16(p + 4) != VERSION
                                           and load_be16(p + 4) != OLD_VERSION):
            raise CorruptIndexError("not a version 2 or 3 key index (bad magic or version)")
        self.complete = load_be16(p + 6) & 1
        self.slot_count = load_be32(p + 8)
        self.key_capacity = load_be32(p + 12)
        self.tag_capacity = load_be32(p + 16)
        self.key_count = load_be32(p + 20)
        self.tag_count = load_be32(p + 24)
        self.base_timestamp = <int64_t>load_be64(p + 32)
        self.covered_position = <int64_t>load_be64(p + 40)
        self.min_timestamp = <int64_t>load_be64(p + 48)
        self.max_timestamp = <int64_t>load_be64(p + 56)
        if self.slot_count == 0 or self.slot_count & (self.slot_count - 1):
            raise CorruptIndexError(f"key index slot count {self.slot_count} is not a power of two")
        if v.shape[0] != file_size(self.slot_count, self.key_capacity, self.tag_capacity):
            raise CorruptIndexError(f"key index of {v.shape[0]} bytes does not match its header")
        if self.key_count > self.key_capacity or self.tag_count > self.tag_capacity:
            raise CorruptIndexError("key index counts exceed its capacity")
        self.slots = self.base + HEADER_SIZE
        self.keys = self.slots + 4 * <Py_ssize_t>self.slot_count
        self.tags = self.keys + KEY_ENTRY * <Py_ssize_t>self.key_capacity

    def release(self):
        """Drop the buffer export (before the mmap under it is closed)."""
        self.view = None
        self.base = NULL

    cdef int check_open(self, bint write) except -1:
        if self.base == NULL:
            raise ValueError("the key index was released")
        if write and not self.writable:
            raise ValueError("the key index is read-only")
        return 0

    def store_header(self, bint complete, int64_t covered_position):
        """Write the counts, bounds and `complete` flag back into the header; a complete
        header also gets the content CRC of what it describes."""
        self.check_open(True)
        self.complete = complete
        self.covered_position = covered_position
        store_be32(self.base + 20, self.key_count)
        store_be32(self.base + 24, self.tag_count)
        store_be64(self.base + 32, <uint64_t>self.base_timestamp)
        store_be64(self.base + 40, <uint64_t>covered_position)
        store_be64(self.base + 48, <uint64_t>self.min_timestamp)
        store_be64(self.base + 56, <uint64_t>self.max_timestamp)
        store_be32(self.base + 28, self.content_crc() if complete else 0)
        store_be16(self.base + 6, 1 if complete else 0)

    cpdef uint32_t content_crc(self) except? 0xFFFFFFFF:
        """CRC-32C of the header fields after the flags (but the CRC itself) and the entries
        in use: what a complete header vouches for, with heads_match for the slots."""
        self.check_open(False)
        cdef uint32_t crc
        with nogil:
            crc = crc32c_extend(0, self.base + 8, 20)
            crc = crc32c_extend(crc, self.base + 32, HEADER_SIZE - 32)
            crc = crc32c_extend(crc, self.keys, KEY_ENTRY * <size_t>self.key_count)
            crc = crc32c_extend(crc, self.tags, TAG_ENTRY * <size_t>self.tag_count)
        return crc

    cdef int heads_match(self) except -1:
        """1 when the slot of every chain that has entries names its newest entry (0 if not).
        With the entries' CRC (their links included) that makes every entry reachable from its
        slot; a slot no entry hashes to is never read here, and a lookup that follows a stray
        one only meets entries it verifies. Reads the entries and the slots they use only."""
        cdef uint64_t mask = self.slot_count - 1, b
        cdef uint32_t i
        cdef int ok = 1
        cdef unsigned char* seen = <unsigned char*>PyMem_Malloc((self.slot_count + 7) // 8)
        if seen == NULL:
            raise MemoryError()
        memset(seen, 0, (self.slot_count + 7) // 8)
        with nogil:
            i = self.key_count
            while i > 0:
                i -= 1
                b = load_be64(self.keys + KEY_ENTRY * <Py_ssize_t>i) & mask
                if seen[b >> 3] & (1 << (b & 7)):
                    continue
                seen[b >> 3] |= <unsigned char>(1 << (b & 7))
                if load_be32(self.slots + 4 * <Py_ssize_t>b) != i + 1:
                    ok = 0
                    break
        PyMem_Free(seen)
        return ok

    def content_valid(self):
        """Whether the table was sealed or closed and is still what it was then (the stored
        content CRC matches and the slots name the chains' heads): what an open may trust
        without a rebuild."""
        self.check_open(False)
        return (bool(self.complete) and load_be32(self.base + 28) == self.content_crc()
                and self.heads_match() == 1)

    def chain_problem(self):
        """Walk every chain: None when each slot's chain runs from newest to older entries of
        that slot only and every entry is reached exactly once, else what is wrong (for
        `mqcore verify`; a lookup checks only the chains it walks)."""
        self.check_open(False)
        cdef uint64_t mask = self.slot_count - 1
        cdef uint32_t i, cur, prev
        cdef int64_t reached = 0
        cdef const unsigned char* e
        for i in range(self.slot_count):
            cur = load_be32(self.slots + 4 * <Py_ssize_t>i)
            if cur > self.key_count:
                return f"slot {i} points past the {self.key_count} entries"
            while cur != 0:
                e = self.keys + KEY_ENTRY * <Py_ssize_t>(cur - 1)
                if (load_be64(e) & mask) != i:
                    return f"entry {cur - 1} is in the chain of slot {i} but hashes elsewhere"
                prev = load_be32(e + 20)
                if prev >= cur:
                    return f"entry {cur - 1} links to entry {prev - 1}, not an older one"
                reached += 1
                cur = prev
        if reached != self.key_count:
            return f"the chains reach {reached} of the {self.key_count} key entries"
        return None

    def chains_valid(self):
        """Every slot and link points below key_count and links go to older entries.

        False means entries were written after the header's counts (an unclean stop): rebuild.
        """
        self.check_open(False)
        cdef uint32_t i, head, prev
        for i in range(self.slot_count):
            head = load_be32(self.slots + 4 * <Py_ssize_t>i)
            if head > self.key_count:
                return False
        for i in range(self.key_count):
            prev = load_be32(self.keys + KEY_ENTRY * <Py_ssize_t>i + 20)
            if prev > i:
                return False
        return True

    def first_unresolved(self, const int64_t[::1] starts not None,
                         const int64_t[::1] first_rel not None,
                         const int64_t[::1] last_rel not None):
        """The first key or tag entry that does not point into a batch of the segment, as
        (kind "key"/"tag", entry number, its relative offset, its position), or None.

        `starts` are the positions of the segment's batches, ascending; `first_rel`/`last_rel`
        their first and last offsets relative to the segment base. An entry resolves when its
        position is one of the starts and its relative offset lies inside that batch (tag
        entries also go in offset order). Used by `mqcore verify`.
        """
        self.check_open(False)
        cdef Py_ssize_t n = starts.shape[0], i, at
        cdef int64_t rel, pos, prev_rel = -1
        if first_rel.shape[0] != n or last_rel.shape[0] != n:
            raise ValueError("starts, first_rel and last_rel must have the same length")
        for i in range(self.key_count):
            rel = load_be32(self.keys + KEY_ENTRY * i + 8)
            pos = load_be32(self.keys + KEY_ENTRY * i + 12)
            at = _find_start(&starts[0] if n else NULL, n, pos)
            if at < 0 or not first_rel[at] <= rel <= last_rel[at]:
                return ("key", i, rel, pos)
        for i in range(self.tag_count):
            rel = load_be32(self.tags + TAG_ENTRY * i)
            pos = load_be32(self.tags + TAG_ENTRY * i + 4)
            at = _find_start(&starts[0] if n else NULL, n, pos)
            if at < 0 or not first_rel[at] <= rel <= last_rel[at] or rel < prev_rel:
                return ("tag", i, rel, pos)
            prev_rel = rel
        return None

    def room_for(self, Py_ssize_t key_entries, Py_ssize_t tag_entries):
        """Whether that many more entries fit (a full index rolls the segment)."""
        return (self.key_count + key_entries <= self.key_capacity
                and self.tag_count + tag_entries <= self.tag_capacity)

    @staticmethod
    def count_hits(const unsigned char[::1] hits not None):
        """(key entries, tag entries) a packed KeyHit array will add."""
        cdef const KeyHit* h = <const KeyHit*>&hits[0] if hits.shape[0] else NULL
        cdef Py_ssize_t i, n = hits.shape[0] // sizeof(KeyHit), tags = 0
        for i in range(n):
            if h[i].kind == KIND_TAG:
                tags += 1
        return n - tags, tags

    cdef void note_time(self, int64_t ts) noexcept:
        if self.base_timestamp < 0:
            self.base_timestamp = ts
        if self.min_timestamp < 0 or ts < self.min_timestamp:
            self.min_timestamp = ts
        if ts > self.max_timestamp:
            self.max_timestamp = ts

    cdef int insert_hit(self, const KeyHit* h, int64_t rel_offset, int64_t position) except -1:
        cdef unsigned char* e
        cdef unsigned char* slot
        cdef int64_t delta
        if rel_offset < 0 or rel_offset > 0xFFFFFFFF or position < 0 or position > 0xFFFFFFFF:
            raise ValueError(f"offset {rel_offset} or position {position} outside the index range")
        self.note_time(h.timestamp)
        if h.kind == KIND_TAG:
            if self.tag_count >= self.tag_capacity:
                raise OverflowError("the key index's tag column is full")
            e = self.tags + TAG_ENTRY * <Py_ssize_t>self.tag_count
            store_be32(e, <uint32_t>rel_offset)
            store_be32(e + 4, <uint32_t>position)
            store_be64(e + 8, h.hash)
            self.tag_count += 1
            return 0
        if self.key_count >= self.key_capacity:
            raise OverflowError("the key index is full")
        e = self.keys + KEY_ENTRY * <Py_ssize_t>self.key_count
        slot = self.slots + 4 * <Py_ssize_t>(h.hash & (self.slot_count - 1))
        if h.kind == KIND_RUN:
            # the count in the top bits, the first counter where a record's time delta goes;
            # the table's time bounds cover every record of the run
            self.note_time(h.ts_max)
            store_be64(e, (h.hash & RUN_HASH_MASK) | (<uint64_t>min(h.run_count, RUN_COUNT_MAX)
                                                      << RUN_COUNT_SHIFT))
            store_be32(e + 16, h.run_first)
        else:
            delta = sat_delta(h.timestamp, self.base_timestamp)
            store_be64(e, h.hash)
            store_be32(e + 16, <uint32_t><int32_t>delta)
        store_be32(e + 8, <uint32_t>rel_offset)
        store_be32(e + 12, <uint32_t>position)
        store_be32(e + 20, load_be32(slot))
        self.key_count += 1
        store_be32(slot, self.key_count)
        return 0

    def insert(self, const unsigned char[::1] hits not None, int64_t first_rel_offset,
               int64_t position):
        """Add a batch's packed KeyHits: the batch starts at `position`, its first record at
        relative offset `first_rel_offset`. Check room_for() first."""
        self.check_open(True)
        cdef const KeyHit* h = <const KeyHit*>&hits[0] if hits.shape[0] else NULL
        cdef Py_ssize_t i, n = hits.shape[0] // sizeof(KeyHit)
        cdef uint64_t mask = self.slot_count - 1
        if self.complete and n:
            # the file stops vouching for itself until the next seal or close; a version 2
            # table gets run entries from now on, which older readers must not trust
            self.complete = False
            store_be16(self.base + 6, 0)
            store_be16(self.base + 4, VERSION)
        for i in range(n):
            # the slots are spread over the whole table: start the miss of a later hit's slot
            # now, so the inserts' misses overlap instead of queueing one after the other
            if i + INSERT_AHEAD < n:
                mq_prefetch(self.slots + 4 * <Py_ssize_t>(h[i + INSERT_AHEAD].hash & mask))
            self.insert_hit(&h[i], first_rel_offset + h[i].offset_delta, position)

    def probe(self, uint64_t hash, Py_ssize_t max_entries):
        """Entries with this full hash, newest first: [(relative offset, position, ts_lo, ts_hi)]
        where the record's timestamp lies in [ts_lo, ts_hi] (equal unless the delta saturated).
        Stops after walking max_entries matches; a link that does not go to an older entry
        raises CorruptIndexError."""
        cdef HitArray a
        cdef Py_ssize_t i
        a.items = NULL
        a.count = a.capacity = 0
        a.on_heap = False
        try:
            probe_tables([self], hash, max_entries, &a)
            return [(a.items[i].rel_offset, a.items[i].position, a.items[i].ts_lo,
                     a.items[i].ts_hi) for i in range(a.count)]
        finally:
            hits_free(&a)

    def probe_uid(self, const unsigned char[::1] uid not None, Py_ssize_t max_entries):
        """Candidates for the records carrying unique ID `uid`, as probe() lists them: the
        entries of the ID itself (producer-supplied IDs, batches that were no run, version 2
        tables), then for a UUIDv7 the records the run entries of its ms and node name: the
        record `counter - first counter` (mod 2**32) after the run's first, when the run is
        that long, with the table's time bounds (a run entry keeps no record time). At most
        max_entries of each kind; the caller reads and compares every candidate."""
        cdef Py_ssize_t n = uid.shape[0], taken = 0
        cdef const unsigned char* u = &uid[0] if n else NULL
        cdef uint64_t rh, stored
        cdef uint32_t cur, prev, first, count
        cdef uint32_t c
        cdef uint32_t d
        cdef const unsigned char* e
        out = self.probe(xxh64(u, n, SEED_UID), max_entries)
        if n != 16 or not is_uid_v7(u) or max_entries <= 0:
            return out
        rh = uid_run_hash(u)
        c = v7_counter(u)
        cur = load_be32(self.slots + 4 * <Py_ssize_t>(rh & (self.slot_count - 1)))
        if cur > self.key_count:
            raise CorruptIndexError("a key index slot points past its entries")
        while cur != 0:
            e = self.keys + KEY_ENTRY * <Py_ssize_t>(cur - 1)
            prev = load_be32(e + 20)
            if prev >= cur:
                raise CorruptIndexError("a key index chain does not go to older entries")
            stored = load_be64(e)
            if stored & RUN_HASH_MASK == rh:
                count = <uint32_t>(stored >> RUN_COUNT_SHIFT)
                first = load_be32(e + 16)
                d = c - first                                     # mod 2**32: wraps too
                # a saturated count says "at least": the record read decides
                if d < count or count == RUN_COUNT_MAX:
                    out.append((<int64_t>load_be32(e + 8) + d, <int64_t>load_be32(e + 12),
                                self.min_timestamp, self.max_timestamp))
                    taken += 1
                    if taken >= max_entries:
                        break
            cur = prev
        return out

    def tag_entries(self, uint64_t tag_hash, int64_t from_rel_offset, Py_ssize_t max_entries):
        """Tag entries with this hash at relative offsets >= from_rel_offset, in offset order,
        at most max_entries: ([(relative offset, position)], entries examined)."""
        self.check_open(False)
        cdef Py_ssize_t lo = 0, hi = self.tag_count, mid, i, examined = 0
        cdef const unsigned char* e
        cdef list out = []
        while lo < hi:
            mid = (lo + hi) // 2
            if <int64_t>load_be32(self.tags + TAG_ENTRY * mid) < from_rel_offset:
                lo = mid + 1
            else:
                hi = mid
        i = lo
        while i < self.tag_count and len(out) < max_entries:
            e = self.tags + TAG_ENTRY * i
            examined += 1
            if load_be64(e + 8) == tag_hash:
                out.append((load_be32(e), load_be32(e + 4)))
            i += 1
        return out, examined

    def take_entries(self, KeyTable src not None):
        """Copy every entry of `src` into this empty table (a larger one replacing it) and thread
        the key chains anew for this table's slot count; the time bounds come along. Entries
        keep their order, so each chain still runs newest first."""
        cdef uint64_t mask = self.slot_count - 1
        cdef uint32_t i, n
        cdef unsigned char* e
        cdef unsigned char* slot
        self.check_open(True)
        src.check_open(False)
        if self.key_count or self.tag_count:
            raise ValueError("take_entries needs an empty table")
        if src.key_count > self.key_capacity or src.tag_count > self.tag_capacity:
            raise OverflowError("the key index is too small for the entries it takes")
        n = src.key_count
        with nogil:
            memcpy(self.keys, src.keys, KEY_ENTRY * <size_t>n)
            memcpy(self.tags, src.tags, TAG_ENTRY * <size_t>src.tag_count)
            for i in range(n):
                e = self.keys + KEY_ENTRY * <Py_ssize_t>i
                if i + INSERT_AHEAD < n:  # the slots' misses overlap, as in insert()
                    mq_prefetch(self.slots + 4 * <Py_ssize_t>(
                        load_be64(e + KEY_ENTRY * INSERT_AHEAD) & mask))
                slot = self.slots + 4 * <Py_ssize_t>(load_be64(e) & mask)
                store_be32(e + 20, load_be32(slot))
                store_be32(slot, i + 1)
        self.key_count = n
        self.tag_count = src.tag_count
        self.base_timestamp = src.base_timestamp
        self.min_timestamp = src.min_timestamp
        self.max_timestamp = src.max_timestamp

    def clear(self):
        """Forget every entry (before a rebuild)."""
        self.check_open(True)
        self.complete = False
        store_be16(self.base + 6, 0)
        memset(self.slots, 0, 4 * <Py_ssize_t>self.slot_count)
        self.key_count = 0
        self.tag_count = 0
        self.base_timestamp = -1
        self.min_timestamp = -1
        self.max_timestamp = -1


# ---------------------------------------------------------------------------------------------
# Rebuild: the same KeyHits the encoder lists, found in stored batches
# ---------------------------------------------------------------------------------------------

cdef Py_ssize_t _find_start(const int64_t* starts, Py_ssize_t n, int64_t pos) noexcept nogil:
    """Index of `pos` in the ascending array `starts`, or -1."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[mid] < pos:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < n and starts[lo] == pos else -1


cdef int hit_append(bytearray out, uint64_t hash, int64_t ts, int32_t delta, int32_t kind) except -1:
    cdef KeyHit h
    memset(&h, 0, sizeof(KeyHit))
    h.hash = hash
    h.timestamp = ts
    h.ts_max = ts
    h.offset_delta = delta
    h.kind = kind
    out.extend((<unsigned char*>&h)[:sizeof(KeyHit)])
    return 0


cdef inline bint same_run_key(const unsigned char* u, const unsigned char* first) noexcept nogil:
    """Whether two UUIDv7s carry the same ms and node (uid_run_hash's bytes)."""
    return (memcmp(u, first, 6) == 0 and (u[10] & 0x03) == (first[10] & 0x03)
            and memcmp(u + 11, first + 11, 5) == 0)


cdef int record_hits(bytearray every, bytearray no_uid, const RecordView* r, int64_t ts,
                     int32_t delta, const unsigned char** uid_value,
                     Py_ssize_t* uid_headers) except -1:
    """The KeyHits of one stored record: key, uid, `keys` words, tag (as the encoder lists)
    into `every`, and all but the uid's into `no_uid` too (for a batch that turns out to be a
    run); *uid_headers counts its `uid` headers, *uid_value is the last one's 16 bytes (NULL:
    another length)."""
    cdef const unsigned char* p = r.headers
    cdef const unsigned char* end = r.headers + r.headers_len
    cdef HeaderView hv
    cdef Py_ssize_t i, at, w
    if r.key_len >= 0:
        hit_append(every, xxh64(r.key, r.key_len, SEED_KEY), ts, delta, KIND_KEY)
        hit_append(no_uid, xxh64(r.key, r.key_len, SEED_KEY), ts, delta, KIND_KEY)
    for i in range(r.header_count):
        if next_header(&p, end, &hv) != OK:
            raise CorruptRecordError("bad record header while indexing")
        if hv.value_len < 0:
            continue
        if hv.key_len == 3 and memcmp(hv.key, b"tag", 3) == 0:
            hit_append(every, xxh64(hv.value, hv.value_len, SEED_TAG), ts, delta, KIND_TAG)
            hit_append(no_uid, xxh64(hv.value, hv.value_len, SEED_TAG), ts, delta, KIND_TAG)
        elif hv.key_len == 3 and memcmp(hv.key, b"uid", 3) == 0:
            hit_append(every, xxh64(hv.value, hv.value_len, SEED_UID), ts, delta, KIND_UID)
            uid_headers[0] += 1
            uid_value[0] = hv.value if hv.value_len == 16 else NULL
        elif hv.key_len == 4 and memcmp(hv.key, b"keys", 4) == 0:
            at = 0
            while True:
                w = next_word(hv.value, hv.value_len, &at)
                if w == 0:
                    break
                hit_append(every, xxh64(hv.value + at - w, w, SEED_KEY), ts, delta, KIND_KEY)
                hit_append(no_uid, xxh64(hv.value + at - w, w, SEED_KEY), ts, delta, KIND_KEY)
    return 0


def batch_hits(const unsigned char[::1] buf not None, Py_ssize_t pos, Py_ssize_t max_decompressed,
               object source=None):
    """(packed KeyHits of the batch at `pos`, its base offset, its size) for a rebuild; the
    batch must be whole and valid (the caller scanned the segment already).

    A batch whose records each carry one `uid`, UUIDv7s of one ms and node with counters
    rising by one from record to record (offset deltas 0, 1, 2, ...: what the encoder makes
    without headers), gets one run hit for them, as the encoder gives it; any other batch a
    hit per ID."""
    cdef BatchHeader h
    cdef RecordCursor c
    cdef RecordView r
    cdef int rc
    cdef int64_t ts, run_min = 0, run_max = 0
    cdef bytearray out = bytearray(), no_uid = bytearray()
    cdef const unsigned char* uid
    cdef Py_ssize_t uid_headers, i = 0
    cdef unsigned char first[16]
    cdef uint32_t first_counter = 0
    cdef bint run = True
    cdef KeyHit run_hit
    if pos < 0 or pos > buf.shape[0]:
        raise ValueError(f"position {pos} outside the buffer")
    rc = check_batch(&buf[0] + pos if buf.shape[0] else NULL, buf.shape[0] - pos, &h, False)
    if rc != OK:
        raise CorruptRecordError(error_text(rc), path=source, position=pos)
    size = 12 + h.batch_length
    if h.attributes & ATTR_CONTROL:
        return bytes(out), h.base_offset, size
    owner = open_records(&buf[0] + pos, &h, max_decompressed, &c)
    while True:
        rc = next_record(&c, &r)
        if rc == 0:
            break
        if rc < 0:
            raise CorruptRecordError(error_text(rc), path=source, position=pos)
        if h.attributes & ATTR_LOG_APPEND_TIME:
            ts = h.max_timestamp
        else:
            ts = wrap_add(h.base_timestamp, r.timestamp_delta)
        uid = NULL
        uid_headers = 0
        record_hits(out, no_uid, &r, ts, <int32_t>r.offset_delta, &uid, &uid_headers)
        if run:
            if uid_headers != 1 or uid == NULL or r.offset_delta != i or not is_uid_v7(uid):
                run = False
            elif i == 0:
                memcpy(first, uid, 16)
                first_counter = v7_counter(uid)
                run_min = run_max = ts
            elif not same_run_key(uid, first) or v7_counter(uid) != <uint32_t>(first_counter + i):
                run = False
            else:
                run_min = min(run_min, ts)
                run_max = max(run_max, ts)
        i += 1
    rc = cursor_finish(&c)
    if rc != OK:
        raise CorruptRecordError(error_text(rc), path=source, position=pos)
    del owner
    if run and i > 0:
        memset(&run_hit, 0, sizeof(KeyHit))
        run_hit.hash = uid_run_hash(first)
        run_hit.timestamp = run_min
        run_hit.ts_max = run_max
        run_hit.kind = KIND_RUN
        run_hit.run_first = first_counter
        run_hit.run_count = <uint32_t>i
        no_uid.extend((<unsigned char*>&run_hit)[:sizeof(KeyHit)])
        return bytes(no_uid), h.base_offset, size
    return bytes(out), h.base_offset, size
