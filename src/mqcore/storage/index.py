"""Sparse `.index` and `.timeindex` files: preallocated, mmap'd, searched by the Cython kernel.

Formats in docs/format.md ("Offset index", "Time index"); both are Kafka's, byte for byte.
A writable index is preallocated to `max_bytes` and mapped once; it is trimmed to its valid
entries on roll and close, so a file on disk never carries a zero tail after a clean stop. An
untrimmed file (a crash) is read up to its last valid entry and trimmed by recovery.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading

from mqcore._ext import index as _index
from mqcore._ext.mapping import MappedFile
from mqcore.crashpoints import crash_point
from mqcore.storage import durable

OFFSET_ENTRY = struct.Struct(">ii")  # relativeOffset, position
BATCH_MIN_BYTES = 61  # a record batch's header: no batch, so no index entry, is smaller
BACK_AHEAD = 64 << 10  # index bytes given disk blocks at a time ahead of the next entry
REST_CHECKED = 64 << 10  # bytes past the valid entries an open checks are zero
TIME_ENTRY = struct.Struct(">qi")  # timestamp, relativeOffset


class SparseIndex:
    """Common file handling of the two index kinds; subclasses name the entry layout."""

    entry_size = 0

    def __init__(self, path: str, max_bytes: int, writable: bool, mapped: bool = True):
        self.path = path
        self.writable = writable
        self.max_bytes = max_bytes  # the size it is preallocated to (segment_index_bytes)
        self.max_entries = max(2, max_bytes // self.entry_size)
        self.entries = 0
        self.disk_bytes = 0  # file size before _map() preallocated it: zeros past it are ours
        self._lock = threading.Lock()
        self._mm: MappedFile | None = None
        self._view: memoryview | None = None
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file mapped
        self.is_mapped = False
        self._backed = 0  # bytes of the mapping known to have disk blocks (durable.back_pages)
        if mapped:
            self.open()

    def open(self) -> None:
        """Map the file (its entries as load() or the last mapping counted them)."""
        with self._lock:
            if not self.is_mapped:
                self._map()
                self.is_mapped = True

    def unmap(self) -> None:
        """Let go of the mapping (the segment is closed until its next use); the entry count
        stays. A buffer a reader still holds keeps the file mapped until it lets go."""
        with self._lock:
            if self._mm is None and self._view is not None:
                return  # entries rebuilt in memory (read-only): they are all there is
            self._drop_mapping()
            self.is_mapped = False

    # -- file and mapping -------------------------------------------------------------------

    def _map(self, stretch_to: int = 0) -> None:
        """Open and map the file as it is (stretched to `stretch_to` bytes first, and the
        pages of the next entries given their blocks: _preallocate), then close it (the
        mapping keeps the file: an index costs no descriptor); the first append preallocates
        it, so only the active segment's indexes are ever stretched, never the sealed ones."""
        flags = os.O_RDWR | os.O_CREAT if self.writable else os.O_RDONLY
        try:
            fd = durable.open_store_file(self.path, flags)
        except FileNotFoundError:
            self.identity = None
            return
        try:
            st = os.fstat(fd)
            if st.st_size < stretch_to:
                os.ftruncate(fd, stretch_to)
                # the pages the next entries land in get blocks by the write path: a store
                # into a hole of the mapping is a slow page fault (durable.back_pages); the
                # entries already in the first of them are written back as they are
                at = self.entries * self.entry_size
                page = at - at % mmap.PAGESIZE
                end = min(stretch_to, at + BACK_AHEAD)
                if end > at:
                    kept = os.pread(fd, at - page, page)
                    os.pwrite(fd, kept + bytes(end - at), page)
                self._backed = end
                st = os.fstat(fd)
            self.identity = (st.st_dev, st.st_ino)
            size = st.st_size
            self.disk_bytes = size
            if self.writable:
                self.max_entries = max(self.max_entries, size // self.entry_size)
            if size >= self.entry_size:
                self._mm = MappedFile(fd, size, self.writable)
                self._view = memoryview(self._mm)
        finally:
            os.close(fd)

    def _unmap(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def _drop_mapping(self) -> None:
        """_unmap, or when a reader still holds a buffer of the mapping, drop our references
        and let the last buffer's release unmap it."""
        try:
            self._unmap()
        except BufferError:
            self._view = None
            self._mm = None

    @property
    def buffer(self) -> memoryview:
        """The valid entries (a view into the mapping; do not keep it across a trim)."""
        if self._view is None:
            return memoryview(b"")
        return self._view[: self.entries * self.entry_size]

    def raw_buffer(self) -> memoryview:
        """The whole mapped file, valid or not (used to count valid entries on load)."""
        return self._view if self._view is not None else memoryview(b"")

    @property
    def exists(self) -> bool:
        """Whether the file was there when it was mapped."""
        return self.identity is not None

    def plausible(self, log_size: int) -> bool:
        """False when the file is longer than both its preallocated size and what a log of
        `log_size` bytes could ever need (one entry per batch of at least 61 bytes): damage
        (a crafted sparse file), rebuilt from the log without reading a byte of it."""
        need = (log_size // BATCH_MIN_BYTES + 2) * self.entry_size
        return self.disk_bytes <= max(need, self.max_bytes)

    def is_full(self) -> bool:
        # the last slot stays free for the time entry written at roll and close (as Kafka does)
        return self.entries >= self.max_entries - 1

    def _rest_is_zero(self, raw: memoryview) -> bool:
        """Whether the entries after the valid ones are zero (an untrimmed tail), as far as
        REST_CHECKED bytes past them: entries cut off by damage lie right after the valid
        prefix. Farther garbage cannot mislead a lookup either: the valid prefix is all that
        is used, and load() rebuilds an index that does not reach the log's tail. (Reading all
        10 MiB of a preallocated index at every open made a reader beside a writer slow.)"""
        at = self.entries * self.entry_size
        stored = min(len(raw), self.disk_bytes, at + REST_CHECKED) // self.entry_size
        return self.entries >= stored or _index.all_zero(raw[at : stored * self.entry_size])

    def _preallocate(self) -> None:
        """Stretch the file to max_entries and map all of it (Kafka's preallocated index)."""
        with self._lock:
            self._unmap()
            self._backed = 0
            self._map(stretch_to=self.max_entries * self.entry_size)

    def make_room(self) -> None:
        """Preallocate now if the next entry would need it, so an append can fail (a full disk)
        before its batch is written rather than after, when the log already holds it."""
        if self.writable and (
            self._view is None or (self.entries + 1) * self.entry_size > len(self._view)
        ):
            self._preallocate()

    def _put(self, data: bytes) -> None:
        assert self.writable
        at = self.entries * self.entry_size
        if self._view is None or at + self.entry_size > len(self._view):
            self._preallocate()
        assert self._view is not None and self._mm is not None
        if at + self.entry_size > self._backed:
            self._backed = durable.back_pages(self.path, self._mm, at, at + BACK_AHEAD)
        self._view[at : at + self.entry_size] = data
        self.entries += 1

    def replace_entries(self, packed: bytes | bytearray) -> None:
        """Overwrite the index with `packed` entries (recovery's rebuilt index). A read-only
        index serves them from memory and leaves its file as it is."""
        count = len(packed) // self.entry_size
        with self._lock:
            if not self.writable:
                self._unmap()
                self.identity = None  # in memory now: no file of ours to compare
                self._view = memoryview(bytes(packed))
                self.entries = count
                return
            # the file becomes exactly the rebuilt entries; an append preallocates it again
            self._unmap()
            # written beside and renamed over: a reader in another process that has the old
            # file mapped keeps reading it and never sees a half-written or shrunk one
            durable.write_atomic(self.path, packed, sync=False)
            self.max_entries = max(self.max_entries, count)
            self._map()
            self.entries = count

    def trim(self) -> None:
        """Leave the file holding only its valid entries and remap it read-only (segment sealed
        or closing).

        A preallocated file is replaced by a new one of the valid entries (written beside and
        renamed over), never cut in place: a reader in another process may have the old file
        mapped, and touching a page that a truncate took away kills it with SIGBUS. Files of a
        store only grow in place; whatever shrinks is replaced."""
        with self._lock:
            if not self.writable or not self.is_mapped:
                return
            valid = self.entries * self.entry_size
            mapped = self._view is not None
            size = len(self._view) if self._view is not None else self.disk_bytes
            entries = bytes(self._view[:valid]) if self._view is not None else b""
            self._unmap()
            if size != valid or not mapped and self.identity is None:
                durable.write_atomic(self.path, entries, sync=False)
            crash_point("index.after_trim")
            self.writable = False
            self.max_entries = self.entries
            self._map()

    def flush(self) -> None:
        if self._mm is not None and self.writable:
            self._mm.flush()

    def close(self, trim: bool = True) -> None:
        if trim:
            self.trim()
        with self._lock:
            self._drop_mapping()
            self.is_mapped = False

    def delete(self) -> None:
        self.close(trim=False)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class OffsetIndex(SparseIndex):
    """`.index`: relative offset -> position of the batch that ends at that offset."""

    entry_size = 8

    def load(self, max_relative_offset: int, max_position: int) -> bool:
        """Count the valid leading entries; False when the file has entries that are not valid
        (they were cut off: the caller rebuilds from the log)."""
        raw = self.raw_buffer()
        self.entries = _index.count_offset_entries(raw, max_relative_offset, max_position)
        return self._rest_is_zero(raw)

    def append(self, relative_offset: int, position: int) -> None:
        self._put(OFFSET_ENTRY.pack(relative_offset, position))

    def floor(self, relative_offset: int) -> tuple[int, int] | None:
        """(relative offset, position) of the last entry at or before relative_offset."""
        with self._lock:
            if self.entries == 0:
                return None
            return _index.offset_floor(self.buffer, self.entries, relative_offset)

    def last(self) -> tuple[int, int] | None:
        with self._lock:
            if self.entries == 0:
                return None
            return _index.offset_entry(self.buffer, self.entries - 1)


class TimeIndex(SparseIndex):
    """`.timeindex`: largest timestamp so far -> the relative offset where it was seen."""

    entry_size = 12

    def load(self, max_relative_offset: int) -> bool:
        """Count valid leading entries; False when invalid ones were cut off."""
        raw = self.raw_buffer()
        self.entries = _index.count_time_entries(raw, max_relative_offset)
        return self._rest_is_zero(raw)

    def is_full(self) -> bool:
        return self.entries >= self.max_entries - 1

    def append(self, timestamp: int, relative_offset: int, *, closing: bool = False) -> None:
        """Add an entry; only `closing` (roll/close) may take the reserved last slot."""
        if self.entries >= self.max_entries - (0 if closing else 1):
            return
        self._put(TIME_ENTRY.pack(timestamp, relative_offset))

    def floor(self, timestamp: int) -> tuple[int, int] | None:
        """(timestamp, relative offset) of the last entry with timestamp <= `timestamp`."""
        with self._lock:
            if self.entries == 0:
                return None
            return _index.time_floor(self.buffer, self.entries, timestamp)

    def last(self) -> tuple[int, int] | None:
        with self._lock:
            if self.entries == 0:
                return None
            return _index.time_entry(self.buffer, self.entries - 1)
