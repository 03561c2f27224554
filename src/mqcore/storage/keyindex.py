"""A segment's `.keyindex`: its keys, unique IDs and tags, for the query layer.

The file (format in docs/format.md "Key index", kernel in `_ext/keyindex.pyx`) is derived data,
like Kafka's indexes. The active segment's file starts small (INITIAL_ENTRIES) and is replaced by
one GROWTH times as large when it fills, up to the topic's capacity (key_index_entries, bounded
by the segment size), past which the segment rolls: a small topic costs kilobytes, a busy one
copies each entry a third of a time more on average (fourfold steps: 1/4 + 1/16 + ...; with
doubling it was once, and appends of unique keys measured 10-30% slower). One rebuilt for a
sealed segment is sized to its entries.

An empty active segment's file is made at its first entry (or when a query or seal needs a
table), not when the segment is created: a partition that is never written with keys costs no
file, no mapping and no page cache. Writable tables are mapped with POSIX_MADV_RANDOM: inserts
touch slots at random, and without the advice each first touch of a page reads ahead around it
(up to the device's read-ahead, 8 MiB on the VM measured), zeros into the page cache.

A file is used as it is only when its header says it was sealed or closed, covers exactly the
log's bytes and its content CRC matches (KeyTable.content_valid): a page lost in a power loss
or overwritten on disk fails the CRC. Anything else is rebuilt from the log: the active
segment's at open for a writable store, a sealed segment's on first use (in memory for a
read-only store, which never writes files). Sealing and closing msync the whole file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from mqcore._ext.keyindex import (
    HEADER_BYTES,
    KEY_ENTRY_BYTES,
    TAG_ENTRY_BYTES,
    KeyTable,
    file_size,
    init_header,
)
from mqcore._ext.mapping import MappedFile
from mqcore.crashpoints import crash_point
from mqcore.errors import CorruptIndexError
from mqcore.storage import durable

KEYINDEX_SUFFIX = ".keyindex"
MIN_SLOTS = 16
INITIAL_ENTRIES = 1024  # key and tag entries of a new active table (about 42 KB of file)
GROWTH = 4  # a full active table is replaced by one this many times larger
BACK_AHEAD = 64 << 10  # entry bytes given disk blocks at a time ahead of the inserts


# (hits, first relative offset, batch position) for every batch of a segment, in log order
BatchHits = list[tuple[bytes, int, int]]


def slots_for(key_capacity: int) -> int:
    """A power of two near half the capacity: chains of about two entries when full."""
    slots = MIN_SLOTS
    while slots * 2 < key_capacity:
        slots *= 2
    return slots


class KeyIndexFile:
    """The key table of one segment and the file (or memory) holding it."""

    def __init__(self, path: str, writable: bool, capacity: int):
        self.path = path
        self.writable = writable
        self.capacity = capacity
        self.table: KeyTable | None = None
        self._map: MappedFile | None = None
        self._memory: bytearray | None = None
        self._lock = threading.Lock()  # one opening or rebuild at a time (readers race to it)
        self._dirty = False  # entries or header changed since the last seal, close or rebuild
        # written since the last msync (a seal without sync, a rebuild): close syncs it
        self._unsynced = False
        # how far the key and tag entry regions have disk blocks (durable.back_pages)
        self._backed = [0, 0]
        # an empty active segment's table not made yet: made at the first entry (make_room),
        # a query (ensure) or a seal that covers batches (flush)
        self._deferred = False

    # -- opening ------------------------------------------------------------------------------

    @property
    def mapping(self) -> MappedFile | None:
        """The `.keyindex` file's mapping (read-write for an active segment's table), or None
        for a table kept in memory or not opened yet."""
        return self._map

    def open(self, covered: int, active: bool, scan: Callable[[], BatchHits]) -> None:
        """Map the file if it vouches for exactly `covered` log bytes, else rebuild it.

        `scan` lists the log's batch hits for a rebuild. The active segment's table keeps room
        for `capacity` entries; a sealed one's is built to its size.
        """
        with self._lock:
            if self.table is not None:
                return
            if active and covered == 0 and self.writable and not os.path.lexists(self.path):
                self._deferred = True  # nothing to index yet: no file until there is
                return
            if not self._open_existing(covered):
                self.rebuild(scan(), covered, sealed=not active)

    def _make_deferred(self, covered: int) -> None:
        """Make the deferred table (caller holds _lock or the partition's): an active one
        while the segment is empty, else one sized to nothing (no batch had an entry)."""
        self._deferred = False
        self.rebuild([], covered, sealed=covered > 0)

    def _open_existing(self, covered: int) -> bool:
        try:
            fd = durable.open_file(self.path, os.O_RDWR if self.writable else os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                return False
            m = MappedFile(fd, size, self.writable)
        finally:
            os.close(fd)
        if self.writable:
            m.advise_random()
        try:
            table = KeyTable(m, self.writable)
        except CorruptIndexError:
            m.close()
            return False
        if table.covered_position != covered or not table.content_valid():
            table.release()
            m.close()
            return False
        self._map, self.table = m, table
        return True

    def ensure(self, covered: int, scan: Callable[[], BatchHits]) -> KeyTable:
        """The table, opened or built (in memory when read-only) on first use."""
        table = self.table
        if table is None:
            with self._lock:
                if self.table is None and self._deferred:
                    self._make_deferred(covered)
                elif self.table is None and not self._open_existing(covered):
                    self.rebuild(scan(), covered, sealed=True)
                table = self.table
        assert table is not None
        return table

    # -- building -----------------------------------------------------------------------------

    def rebuild(self, hits: BatchHits, covered: int, sealed: bool) -> None:
        """Build the table from a segment's batch hits; written to the file when writable."""
        self.close_map()
        keys = tags = 0
        for h, _, _ in hits:
            k, t = KeyTable.count_hits(h)
            keys, tags = keys + k, tags + t
        if sealed:
            key_cap, tag_cap = keys, tags
        else:
            key_cap, tag_cap = self._grown(0, keys), self._grown(0, tags)
        slots = slots_for(key_cap)
        size = file_size(slots, key_cap, tag_cap)
        if self.writable and self._reuse_file(size):
            assert self._map is not None
            self.table = KeyTable(self._map, True)
            self.table.clear()
        else:
            self.table = self._new_table(slots, key_cap, tag_cap)
        for h, rel, pos in hits:
            self.table.insert(h, rel, pos)
        # not msync'd: a rebuilt table is derived data the CRC vouches for; sealing and closing
        # sync what the store relies on
        self.table.store_header(True, covered)
        self._dirty = False
        self._unsynced = True

    def _grown(self, current: int, need: int) -> int:
        """Entries a region gets for `need` of them: `current` (INITIAL_ENTRIES at first) times
        GROWTH until they fit, at most the capacity unless `need` alone is more."""
        cap = max(current, min(INITIAL_ENTRIES, self.capacity), 1)
        while cap < need:
            cap *= GROWTH
        return max(min(cap, self.capacity), need)

    def _new_table(self, slots: int, key_cap: int, tag_cap: int) -> KeyTable:
        """An empty table of this geometry in a new file (replacing the old one) when
        writable, else in memory; the previous table and mapping are let go, not released."""
        size = file_size(slots, key_cap, tag_cap)
        if self.writable:
            self._create_file(size, slots)
            assert self._map is not None
            init_header(memoryview(self._map).cast("B"), slots, key_cap, tag_cap)
            return KeyTable(self._map, True)
        self._memory = bytearray(size)
        init_header(self._memory, slots, key_cap, tag_cap)
        return KeyTable(self._memory, True)

    def _reuse_file(self, size: int) -> bool:
        """Map an existing file of exactly this geometry for a rebuild in place."""
        try:
            fd = durable.open_file(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            if os.fstat(fd).st_size != size:
                return False
            m = MappedFile(fd, size, True)
        finally:
            os.close(fd)
        m.advise_random()
        try:
            KeyTable(m, False).release()  # a header of this geometry, or we start afresh
        except CorruptIndexError:
            m.close()
            return False
        self._map = m
        return True

    def _create_file(self, size: int, slots: int) -> None:
        """A new file of `size` bytes: the header and slots written (zeros) so that their
        pages have disk blocks before the mapping stores into them at random; the entries stay
        sparse and get blocks as they fill (_back_entries)."""
        tmp = self.path + ".tmp"
        fd = durable.open_file(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            os.ftruncate(fd, size)  # sparse: untouched entries take no disk
            durable.write_all(fd, bytes(min(size, HEADER_BYTES + 4 * slots)))
            self._map = MappedFile(fd, size, True)
            self._map.advise_random()
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._backed = [0, 0]

    # -- appending ----------------------------------------------------------------------------

    def has_room(self, hits: bytes) -> bool:
        """Whether the batch's entries fit within the capacity (growing the table if need
        be); a non-empty table without room rolls the segment."""
        table = self.table
        if table is None or not hits:
            return True
        keys, tags = KeyTable.count_hits(hits)
        return (
            table.key_count + keys <= max(self.capacity, table.key_capacity)
            and table.tag_count + tags <= max(self.capacity, table.tag_capacity)
        )  # fmt: skip

    def make_room(self, hits: bytes, covered: int) -> None:
        """Before a batch is written: a table too small for its entries is replaced by one
        GROWTH times as large (or more) holding the same entries; an empty one too small for a
        single batch (more entries than `capacity`) grows to the batch; a full non-empty one
        rolled already."""
        if not hits:
            return
        if self.table is None and self._deferred:
            with self._lock:
                if self.table is None and self._deferred:
                    self._make_deferred(0)
        table = self.table
        if table is None:
            return
        keys, tags = KeyTable.count_hits(hits)
        if table.room_for(keys, tags):
            return
        if table.key_count or table.tag_count:
            if not self.has_room(hits):
                raise OverflowError("the key index is full (the segment should have rolled)")
        else:
            self.capacity = max(self.capacity, keys, tags)
        key_cap = self._grown(table.key_capacity, table.key_count + keys)
        tag_cap = self._grown(table.tag_capacity, table.tag_count + tags)
        grown = self._new_table(slots_for(key_cap), key_cap, tag_cap)
        crash_point("keyindex.after_grow_file")
        if self._map is not None:  # blocks first: copying into holes faults page by page
            self._back_entries(grown, table.key_count, table.tag_count)
        grown.take_entries(table)
        crash_point("keyindex.after_grow_copy")
        # a lookup in another thread may still walk the old table: it stays valid until that
        # reference goes (drop(), not release())
        self.table = grown
        self._dirty = True

    def add(self, hits: bytes, first_rel_offset: int, position: int) -> None:
        table = self.table
        if table is not None and hits:
            self._dirty = True
            if self._map is not None:
                self._back_entries(table, *KeyTable.count_hits(hits))
            table.insert(hits, first_rel_offset, position)

    def _back_entries(self, table: KeyTable, keys: int, tags: int) -> None:
        """Disk blocks for the entry pages the next inserts write (durable.back_pages: a
        store into a hole of the mapping is a slow page fault); the slots got theirs when the
        file was made."""
        assert self._map is not None
        keys_at = HEADER_BYTES + 4 * table.slot_count
        tags_at = keys_at + KEY_ENTRY_BYTES * table.key_capacity
        for region, at, width, used, more in (
            (0, keys_at, KEY_ENTRY_BYTES, table.key_count, keys),
            (1, tags_at, TAG_ENTRY_BYTES, table.tag_count, tags),
        ):
            end = at + width * used  # written entries have their blocks
            if more and end + width * more > self._backed[region]:
                self._backed[region] = durable.back_pages(
                    self.path, self._map, max(self._backed[region], end),
                    end + max(width * more, BACK_AHEAD),
                )  # fmt: skip

    # -- flushing, sealing, closing -------------------------------------------------------------

    def flush(self, covered: int, sync: bool) -> None:
        """Record that the entries describe `covered` log bytes, with a fresh content CRC, and
        msync the file when `sync` (an unchanged table is left alone)."""
        if self.table is None and self._deferred and covered > 0 and self.writable:
            with self._lock:
                if self.table is None and self._deferred:
                    self._make_deferred(covered)  # batches without entries: an empty table
        table = self.table
        if table is None or not self.writable or self._map is None:
            return
        if not self._dirty and table.complete and table.covered_position == covered:
            if sync and self._unsynced:  # sealed unsynced (flush="os"): close syncs it now
                durable.sync_mapping(self._map, self.path)
                self._unsynced = False
            return
        table.store_header(True, covered)
        self._dirty = False
        self._unsynced = not sync
        if sync:
            durable.sync_mapping(self._map, self.path)

    def drop(self) -> None:
        """Let go of the table without releasing it (the segment is closed until its next use):
        a reader that took the table keeps a valid one, and the mapping goes with the last
        reference to it. Only for a table with nothing left to write (sealed)."""
        self.table = None
        self._map = None
        self._memory = None

    def close_map(self) -> None:
        if self.table is not None:
            self.table.release()
            self.table = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self._memory = None

    def close(self, covered: int) -> None:
        self.flush(covered, sync=True)
        self.close_map()

    def delete(self) -> None:
        self._deferred = False
        self.close_map()
        for path in (self.path, self.path + ".tmp"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
