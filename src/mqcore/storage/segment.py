"""One log segment: a `.log` of record batches and its `.index` / `.timeindex`.

Files are named by the segment's base offset, zero-padded to 20 digits, as Kafka names them
(docs/format.md "Segment files"). Positions are int32, so a segment stays below 2 GiB.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mqcore._ext.batch import peek_batch_header, read_batch_info
from mqcore._ext.filespace import reserve
from mqcore._ext.keyindex import KeyTable, batch_hits
from mqcore._ext.mapping import MappedFile
from mqcore._ext.scan import CORRUPT, IndexPolicy, SegmentScanner
from mqcore.crashpoints import crash_point
from mqcore.errors import CorruptRecordError, StoreChangedError, StoreClosedError, StoreError
from mqcore.storage import durable
from mqcore.storage.index import OffsetIndex, TimeIndex
from mqcore.storage.keyindex import KEYINDEX_SUFFIX, BatchHits, KeyIndexFile

if TYPE_CHECKING:
    from mqcore.storage.cache import SegmentCache

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
SCAN_CHUNK = 8 << 20
HEADER_BYTES = 61
PAGE = 4096
MAX_DECOMPRESSED = 256 << 20  # a compressed batch may inflate to at most this many bytes
# Reserved space past the active .log (docs/format.md "Reserved space"): each reservation
# covers RESERVE_SECONDS of the segment's writes at the rate since the previous one, between
# RESERVE_MIN and the topic's preallocate_bytes; all of a store's reservations together stay
# within STORE_RESERVE_BYTES (ReserveBudget).
RESERVE_MIN = 64 << 10
RESERVE_SECONDS = 1.0
STORE_RESERVE_BYTES = 256 << 20


class ReserveBudget:
    """The disk space a store's active segments may hold reserved ahead of their writes, all
    together: a partition written at 100 B/s holds RESERVE_MIN, not 16 MiB, and a thousand
    busy ones share `limit` rather than each taking preallocate_bytes."""

    def __init__(self, limit: int | None = None):
        self.limit = STORE_RESERVE_BYTES if limit is None else limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, want: int) -> int:
        """Up to `want` bytes of the budget (0 when it is spent)."""
        with self._lock:
            got = max(0, min(want, self.limit - self.held))
            self.held += got
            return got

    def give(self, amount: int) -> None:
        with self._lock:
            self.held = max(0, self.held - amount)


class AppendableBatch(Protocol):
    """What an append reads of a batch: an encoded one (_ext.batch.EncodedBatch) or a
    client-built one handed over as bytes (mqcore.log's embedding API)."""

    size: int
    count: int
    base_offset: int
    attributes: int
    min_timestamp: int
    max_timestamp: int

    @property
    def last_offset(self) -> int: ...

    @property
    def key_hits(self) -> bytes: ...

    def set_base_offset(self, base_offset: int) -> None: ...

    def write_to(self, fd: int) -> int: ...


def segment_name(base_offset: int) -> str:
    """Kafka's file stem: the base offset as 20 zero-padded digits."""
    return f"{base_offset:020d}"


@dataclass
class ScanOutcome:
    """What a recovery scan of one segment found."""

    valid_bytes: int
    file_bytes: int
    error: str | None = None
    error_position: int = -1

    @property
    def truncated(self) -> int:
        return self.file_bytes - self.valid_bytes


class _Loaded:
    """A field of LogSegment that load() (or a recovery scan) sets. A non-data descriptor: once
    the segment has set the field, its own attribute answers every read with no call (appends
    read several of them); until then (a segment only stat'ed) reading it opens and loads the
    segment, which sets it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, seg: LogSegment | None, owner: type | None = None) -> Any:
        if seg is None:
            return self
        seg.ensure_open()
        return seg.__dict__[self.name]


# the lazy fields and their values before anything is known (base_offset for next_offset)
_LAZY_DEFAULTS = {"max_timestamp": -1, "offset_of_max_timestamp": -1, "first_batch_timestamp": -1}


class LogSegment:
    """Appends to and reads from one segment; the partition above decides when to roll."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        writable: bool,
        index_interval_bytes: int,
        max_index_bytes: int,
        map_reserve: int = 0,
        key_index_capacity: int = 0,
        preallocate_bytes: int = 0,
        reserve_budget: ReserveBudget | None = None,
        paths: dict[str, str] | None = None,
        cache: SegmentCache | None = None,
        owner_lock: Any = None,
        lazy: bool = False,
    ):
        self.directory = directory
        self.base_offset = base_offset
        self.writable = writable
        self.index_interval_bytes = index_interval_bytes
        stem = os.path.join(directory, segment_name(base_offset))
        # each file's path: its final name, or the one a read-only open found mid-swap
        paths = paths or {}
        self.log_path = paths.get(LOG_SUFFIX, stem + LOG_SUFFIX)
        # Open or not (docs/operations.md "Limits"): a sealed segment of a clean log is only
        # stat'ed at open and opened on first use; once loaded it keeps no descriptor (its log
        # and indexes are mapped) and the cache may close it again; what load() learned stays.
        self.cache = cache
        self.owner_lock = owner_lock  # the partition's lock: held while the cache closes it
        self.is_open = False
        self.sealed = lazy  # no more appends: the partition rolled past it (or it was found so)
        self.retired = False  # out of the log: never closed by the cache, never writes a file
        self.closed = False  # for good
        self.fd = -1
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the .log
        self._state = threading.RLock()
        self.preallocate_bytes = preallocate_bytes if writable else 0
        self.reserve_budget = reserve_budget
        self._reserve_held = 0  # bytes of reserve_budget the current reservation holds
        self._reserve_mark: tuple[float, int] | None = None  # (when, position) of the last one
        self.offset_index = OffsetIndex(
            paths.get(INDEX_SUFFIX, stem + INDEX_SUFFIX), max_index_bytes, writable, mapped=False
        )
        self.time_index = TimeIndex(
            paths.get(TIMEINDEX_SUFFIX, stem + TIMEINDEX_SUFFIX),
            max_index_bytes,
            writable,
            mapped=False,
        )
        # keys, unique IDs and tags for queries (storage/keyindex.py); None when turned off
        self.key_index = (
            KeyIndexFile(
                paths.get(KEYINDEX_SUFFIX, stem + KEYINDEX_SUFFIX), writable, key_index_capacity
            )  # fmt: skip
            if key_index_capacity > 0
            else None
        )
        # whether load() or a scan has run (next_offset and the timestamps are known)
        self.loaded = not lazy  # a new or opened segment: the caller loads or recovers it
        if not lazy:
            self._set_unknown_fields()
        self.policy = IndexPolicy(index_interval_bytes)
        # batches whose CRC a get() already checked: position -> sampled record positions
        # (gets in them skip the CRC and start near their record; scan.read_record)
        self.verified_batches: dict[int, bytes] = {}
        # reads go through one read-only mapping, reserved to the roll size when writable
        self.map_reserve = map_reserve if writable else 0
        # the .log mapping (read it, never assign it: _remap and _unmap do; the lookup kernels
        # take a buffer of it, and call mapping() when it is missing or too short)
        self.mapped: MappedFile | None = None
        self._view: memoryview | None = None
        self._map_lock = threading.Lock()
        if lazy:
            st = os.lstat(self.log_path)
            if stat.S_ISLNK(st.st_mode):
                raise StoreError(
                    f"{self.log_path} is a symbolic link: a store's files are never links "
                    "(remove it)"
                )
            self.size = st.st_size
            self.identity = (st.st_dev, st.st_ino)
        else:
            self.size = 0
            self._open_files()
        self.reserved_end = self.size
        self.flushed_size = self.size

    # what load() learned: read on demand, so a segment nobody asks about is never opened
    next_offset = _Loaded()
    max_timestamp = _Loaded()
    offset_of_max_timestamp = _Loaded()
    first_batch_timestamp = _Loaded()

    # -- opening and closing the files ----------------------------------------------------------

    def _open_files(self) -> None:
        """Open the `.log` (for appends too when writable and not sealed) and map the indexes.
        A reopened segment must find the very file it loaded: a read-only store whose writer
        replaced or removed it since is told so (StoreChangedError), never reads other bytes."""
        appending = self.writable and not self.sealed
        flags = (os.O_RDWR | os.O_CREAT | os.O_APPEND) if appending else os.O_RDONLY
        try:
            fd = durable.open_store_file(self.log_path, flags)
        except FileNotFoundError:
            if self.identity is None:
                raise
            raise self._changed("removed") from None
        st = os.fstat(fd)
        if self.identity is not None and (st.st_dev, st.st_ino) != self.identity:
            os.close(fd)
            raise self._changed("replaced")
        self.identity = (st.st_dev, st.st_ino)
        self.fd = fd
        if not self.loaded or self.size == 0:
            self.size = st.st_size
        try:
            if appending and _holds_reserve(st):
                # a reserve left by a process that died is handed back before anything else
                os.ftruncate(fd, st.st_size)
            self.offset_index.open()
            self.time_index.open()
        except BaseException:  # EMFILE at an index, say: the .log's descriptor goes too
            self.offset_index.unmap()
            self.time_index.unmap()
            os.close(fd)
            self.fd = -1
            raise
        self.is_open = True

    def _changed(self, how: str) -> StoreChangedError:
        return StoreChangedError(
            f"{self.log_path} was {how} by the store's writer after this read-only store opened "
            "(retention or compaction); reopen the store to read the log as it is now"
        )

    def open_for_scan(self) -> None:
        """Open the files for recovery's scan, which sets what load() would (unsynced: what a
        killed writer left may never have reached the disk)."""
        with self._state:
            self.sealed = False  # recovery may cut it, or make it the active one
            if not self.is_open:
                self._open_files()
            self.flushed_size = 0

    def ensure_open(self) -> None:
        """Open and load the segment if it is not (first use, or closed by the cache)."""
        if self.is_open and self.loaded:
            return
        with self._state:
            if self.closed:
                raise StoreClosedError(f"segment {self.log_path} is closed")
            if not self.is_open:
                self._open_files()
            if not self.loaded:
                self._load_opened()
            if self.sealed:
                self.park()
        if self.cache is not None and self.sealed:
            self.cache.admit(self)

    def _load_opened(self) -> None:
        """load() a segment ensure_open just opened (sealing it again when writable). When it
        fails (damage), its files are let go: every later use opens and loads it again and
        meets the same error, never reads a log that was not loaded."""
        try:
            self.load()
            if self.sealed and self.writable:
                self.seal()
        except BaseException:
            self._drop_files()
            raise

    def park(self) -> None:
        """A sealed segment keeps no descriptor: map the whole log for reads, close the file."""
        with self._state:
            if self.fd < 0 or not self.sealed:
                return
            if self.size > 0 and (self._view is None or len(self._view) < self.size):
                self._remap(self.size)
            os.close(self.fd)
            self.fd = -1

    def release(self) -> bool:
        """The cache closes this segment: mappings and descriptors go, what load() learned
        stays, and the next use opens it again. Buffers readers took stay valid (a mapping is
        unmapped when its last one is released; a key table held elsewhere keeps its own).
        Never the active segment, nor one retention or compaction retired."""
        with self._state:
            if not self.is_open or not self.sealed or self.retired or self.closed:
                return False
            self._drop_files()
            return True

    def _drop_files(self) -> None:
        """Unmap and close every file of the segment (call with _state held)."""
        self._unmap()
        self.offset_index.unmap()
        self.time_index.unmap()
        if self.key_index is not None:
            self.key_index.drop()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.is_open = False

    # -- loading ------------------------------------------------------------------------------

    def load(self) -> None:
        """Load a segment trusted to be whole (below the recovery point, or after a clean stop).

        The indexes are checked against the log; one that is missing, short or inconsistent is
        rebuilt by a header scan. The tail after the last index entry is scanned for the next
        offset and largest timestamp.
        """
        self.loaded = True  # its fields are being set: reading them must not load again
        self._set_unknown_fields()
        try:
            self._load()
        except BaseException:
            self.loaded = False
            for name in ("next_offset", *_LAZY_DEFAULTS):  # the next read loads again
                self.__dict__.pop(name, None)
            raise

    def _set_unknown_fields(self) -> None:
        """The lazy fields' values before the log is read, where none is set yet."""
        fields = self.__dict__
        fields.setdefault("next_offset", self.base_offset)
        for name, value in _LAZY_DEFAULTS.items():
            fields.setdefault(name, value)

    def _load(self) -> None:
        if self.size == 0:
            # a new or empty segment: a preallocated index reads as zero entries, not as (0, 0)
            self.offset_index.entries = self.time_index.entries = 0
            if self.writable or (self.offset_index.exists and self.time_index.exists):
                return
        ok = (
            self.offset_index.exists
            and self.time_index.exists
            and self.offset_index.plausible(self.size)
            and self.time_index.plausible(self.size)
            and self.offset_index.load(0x7FFFFFFF, max(self.size, 1))
            and self.time_index.load(0x7FFFFFFF)
        )
        last = self.offset_index.last() if ok else None
        if ok and last is not None and not self._entry_points_at_batch(*last):
            ok = False
        if ok:
            start = last[1] if last is not None else 0
            scanner = SegmentScanner(self.base_offset, self.index_interval_bytes, False)
            self._refuse_damage(scanner, self._scan(scanner, start))
            ok = self._indexes_cover_tail(scanner)
        if not ok:
            self.rebuild(verify_crc=False)
            self._append_closing_time_entry()  # it was sealed: give it back its closing entry
            return
        self.size = scanner.valid_bytes
        self.next_offset = max(scanner.next_offset, self.base_offset)
        if last is not None:
            self.next_offset = max(self.next_offset, self.base_offset + last[0] + 1)
        time_last = self.time_index.last()
        max_ts, max_off = scanner.max_timestamp, scanner.offset_of_max_timestamp
        if time_last is not None and time_last[0] >= max_ts:
            max_ts, max_off = time_last[0], self.base_offset + time_last[1]
        self.max_timestamp, self.offset_of_max_timestamp = max_ts, max_off
        self.first_batch_timestamp = self._read_first_batch_timestamp()
        last_index_offset = self.base_offset + last[0] if last is not None else -1
        self.policy = IndexPolicy(
            self.index_interval_bytes,
            self.size - start if last is not None else self.size,
            max_ts,
            max_off,
            time_last[0] if time_last is not None else -1,
            last_index_offset,
        )

    def _indexes_cover_tail(self, scanner: SegmentScanner) -> bool:
        """Whether the indexes of this sealed segment are complete, judged from the scan of
        the log after the last offset entry (the scanner started there with a fresh rule).

        The rule, restarted at the last entry's batch, is in the state the append path was in:
        if it asks for an offset entry in the tail, entries are missing (a short or emptied
        .index). Sealing wrote a closing time entry holding the segment's largest timestamp:
        the last time entry must reach the tail's largest one and match the batch it names
        (a short, emptied or garbage .timeindex fails one of the two).
        """
        if scanner.offset_entries:
            return False
        time_last = self.time_index.last()
        if time_last is None:
            return scanner.max_timestamp < 0
        return time_last[0] >= scanner.max_timestamp and self._time_entry_matches_batch(*time_last)

    def _time_entry_matches_batch(self, timestamp: int, relative_offset: int) -> bool:
        """A time entry names the last offset of the first batch that reached its timestamp."""
        target = self.base_offset + relative_offset
        pos = self.position_for(target)
        while pos < self.size:
            info = peek_batch_header(os.pread(self.fd, HEADER_BYTES, pos), 0)
            if info is None or info.last_offset > target:
                return False
            if info.last_offset == target:
                return bool(info.max_timestamp == timestamp)
            pos += info.size
        return False

    def _entry_points_at_batch(self, relative_offset: int, position: int) -> bool:
        """An index entry is consistent when a batch starts at `position` and ends at its offset."""
        info = peek_batch_header(os.pread(self.fd, HEADER_BYTES, position), 0)
        return info is not None and info.last_offset == self.base_offset + relative_offset

    def _read_first_batch_timestamp(self) -> int:
        head = os.pread(self.fd, HEADER_BYTES, 0)
        if len(head) < HEADER_BYTES:
            return -1
        return int.from_bytes(head[35:43], "big", signed=True)

    def _refuse_damage(self, scanner: SegmentScanner, file_size: int) -> None:
        """A trusted load's scan (no CRC check) met bytes that are not whole batches: raise
        CorruptRecordError where they start, before anything is changed. A load never cuts the
        log: recovery alone decides what is cut (docs/operations.md "Recovery"). Bytes after
        the last whole batch are damage in a sealed segment (sealing leaves it ending at a
        batch); in the active one they are a torn tail, which the partition has recovery scan.
        """
        if scanner.stop == CORRUPT:
            raise CorruptRecordError(
                scanner.error or "invalid batch",
                path=self.log_path,
                position=scanner.error_position,
            )
        if self.sealed and scanner.valid_bytes < file_size:
            raise CorruptRecordError(
                f"sealed segment holds {file_size - scanner.valid_bytes} bytes after its last "
                "whole batch (a batch cut short or bytes that are not one; only recovery cuts "
                "a log: mqcore verify --repair)",
                path=self.log_path,
                position=scanner.valid_bytes,
            )

    def _scan(self, scanner: SegmentScanner, start: int) -> int:
        """Feed the log from `start` to its end into `scanner` in bounded chunks; returns the
        file's size (what was there to scan)."""
        file_size = os.fstat(self.fd).st_size
        scanner_pos = start
        # the scanner counts positions from the segment start; prime it at `start`
        if start:
            scanner.skip_to(start)
        while scanner_pos < file_size:
            want = min(SCAN_CHUNK, file_size - scanner_pos)
            chunk = os.pread(self.fd, want, scanner_pos)
            if not chunk:
                break
            used = scanner.feed(chunk, scanner_pos)
            if scanner.stop == CORRUPT:
                break
            if used == 0:
                need = _batch_size_at(chunk)
                if need <= len(chunk) or scanner_pos + need > file_size:
                    break  # a torn tail: the batch ends past the file
                chunk = os.pread(self.fd, need, scanner_pos)
                used = scanner.feed(chunk, scanner_pos)
                if used == 0:
                    break
            scanner_pos += used
        scanner.finish()
        return file_size

    def rebuild(self, verify_crc: bool) -> ScanOutcome:
        """Scan the whole log, rebuild both indexes from it, and cut nothing (see recover)."""
        self.loaded = True  # the scan sets what load() would
        self._set_unknown_fields()
        scanner = SegmentScanner(self.base_offset, self.index_interval_bytes, verify_crc)
        file_size = self._scan(scanner, 0)
        outcome = ScanOutcome(scanner.valid_bytes, file_size, scanner.error, scanner.error_position)
        if not verify_crc:  # a trusted load's rebuild (recovery's scan checks CRCs and cuts)
            self._refuse_damage(scanner, file_size)
        self.size = scanner.valid_bytes
        self.next_offset = max(scanner.next_offset, self.base_offset)
        self.max_timestamp = scanner.max_timestamp
        self.offset_of_max_timestamp = scanner.offset_of_max_timestamp
        self.first_batch_timestamp = scanner.first_batch_max_timestamp
        self.policy = scanner.policy()
        self.offset_index.replace_entries(scanner.offset_entries)
        self.time_index.replace_entries(scanner.time_entries)
        return outcome

    def recover(self) -> ScanOutcome:
        """Validate every batch (length, CRC, offsets) and rebuild the indexes from them.

        Returns where the valid data ends; the partition decides whether the bytes after it are
        a torn tail (cut) or damage followed by good data (raised).
        """
        return self.rebuild(verify_crc=True)

    def first_valid_batch_after(self, position: int, min_offset: int) -> int | None:
        """Position of the first whole, CRC-valid batch with offset >= min_offset that starts
        after `position`, or None: tells damage followed by good data from a torn tail."""
        file_size = os.fstat(self.fd).st_size
        at = position + 1
        while at < file_size:
            chunk = os.pread(self.fd, min(SCAN_CHUNK, file_size - at) + HEADER_BYTES, at)
            i = chunk.find(b"\x02", 16)
            while i >= 0:
                start = i - 16
                if self._valid_batch_at(at + start, min_offset, file_size):
                    return at + start
                i = chunk.find(b"\x02", i + 1)
            at += SCAN_CHUNK
        return None

    def has_zero_hole(self, start: int, end: int) -> bool:
        """Whether [start, end) holds a whole page-aligned 4 KiB page of zeros.

        That is what a power loss leaves where written pages never reached the disk while later
        ones did (page-cache writeback is page by page); a flipped bit or overwritten bytes never
        look like it. Data that itself holds a zero page can still look like it: the caller only
        asks past the recovery point, where nothing was known flushed.
        """
        data = os.pread(self.fd, max(0, end - start), start)
        first = -start % PAGE
        zeros = bytes(PAGE)
        return any(data[i : i + PAGE] == zeros for i in range(first, len(data) - PAGE + 1, PAGE))

    def has_valid_batch_at(self, position: int) -> bool:
        """Whether a whole, CRC-valid batch starts at `position`, whatever its offsets: a torn
        write cannot leave one, so a scan that stopped there (offsets going backwards after a
        damaged base offset, which the CRC does not cover) met damage, not a tail."""
        return self._valid_batch_at(position, -(1 << 63), os.fstat(self.fd).st_size)

    def _valid_batch_at(self, position: int, min_offset: int, file_size: int) -> bool:
        head = os.pread(self.fd, 12, position)
        if len(head) < 12:
            return False
        length = int.from_bytes(head[8:12], "big", signed=True)
        if length < HEADER_BYTES - 12 or length > 0x7FFFFFF0:
            return False
        if position + 12 + length > file_size:
            # not whole; and the length is unchecked bytes: reading it would allocate up to 2 GiB
            return False
        data = os.pread(self.fd, 12 + length, position)
        try:
            info = read_batch_info(data, 0, True)
        except CorruptRecordError:
            return False
        return info is not None and info.base_offset >= min_offset

    def truncate_to(self, size: int) -> None:
        """Cut the log at `size` (a torn tail, or the bytes of a failed append)."""
        os.ftruncate(self.fd, size)  # also hands back any reserved space
        self._give_back_reserve()
        self.reserved_end = size
        self.verified_batches = {p: m for p, m in self.verified_batches.items() if p < size}
        self.size = size
        self.flushed_size = min(self.flushed_size, size)

    # -- appending ----------------------------------------------------------------------------

    def append(self, batch: AppendableBatch) -> int:
        """Write an encoded batch (its base offset already set) at the end; returns its position.

        On a failed write the file is cut back, so no partial batch stays behind.
        """
        position = self.size
        if position + batch.size > self.reserved_end and self.preallocate_bytes:
            self._reserve(position, batch.size)
        if self.key_index is not None:
            self.key_index.make_room(batch.key_hits, position)
        self.offset_index.make_room()
        self.time_index.make_room()
        crash_point("append.before_write")
        try:
            batch.write_to(self.fd)
        except BaseException:
            self.truncate_to(position)
            raise
        crash_point("append.after_write")
        # the batch is in the log: its offsets are taken whatever happens to the derived
        # indexes below (an error there must never let the next append reuse them)
        self.size = position + batch.size
        self.next_offset = batch.last_offset + 1
        if self.key_index is not None:
            self.key_index.add(batch.key_hits, batch.base_offset - self.base_offset, position)
        last_offset = batch.last_offset
        if self.first_batch_timestamp < 0 and position == 0:
            self.first_batch_timestamp = batch.max_timestamp
        if batch.max_timestamp > self.max_timestamp:
            self.max_timestamp = batch.max_timestamp
            self.offset_of_max_timestamp = last_offset
        bits = self.policy.on_batch(position, batch.size, last_offset, batch.max_timestamp)
        if bits & 1:
            self.offset_index.append(last_offset - self.base_offset, position)
        if bits & 2:
            self.time_index.append(
                self.policy.max_timestamp, self.policy.offset_of_max_timestamp - self.base_offset
            )
        crash_point("append.after_index")
        return position

    def _reserve(self, position: int, need: int) -> None:
        """Reserve the space the next RESERVE_SECONDS of writes take at the rate since the last
        reservation (the first: RESERVE_MIN), at most preallocate_bytes, at least `need`, at
        most up to the roll size, within the store's ReserveBudget (none when it is spent).

        Best effort: without support for it the segment stops asking; when the disk is full the
        write that follows reports it (ENOSPC, EFBIG) with the log untouched.
        """
        now = time.monotonic()
        length = RESERVE_MIN
        if self._reserve_mark is not None:
            since, at = self._reserve_mark
            length = int((position - at) / max(now - since, 1e-6) * RESERVE_SECONDS)
        length = max(min(max(length, RESERVE_MIN), self.preallocate_bytes), need)
        if self.map_reserve:
            length = max(min(length, self.map_reserve - position), need)
        self._give_back_reserve()  # the previous reservation is used up
        if self.reserve_budget is not None:
            granted = self.reserve_budget.take(length)
            if granted < need:
                self.reserve_budget.give(granted)
                return  # the store's budget is spent: this write allocates its own blocks
            length = granted
        err = reserve(self.fd, position, length)
        if err == 0:
            self.reserved_end = position + length
            self._reserve_held = length
            self._reserve_mark = (now, position)
            return
        if self.reserve_budget is not None:
            self.reserve_budget.give(length)
        if err not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EINTR):
            self.preallocate_bytes = 0

    def _give_back_reserve(self) -> None:
        """Return the current reservation's share of the store's budget."""
        if self._reserve_held and self.reserve_budget is not None:
            self.reserve_budget.give(self._reserve_held)
        self._reserve_held = 0

    def _release_reserve(self) -> None:
        """Hand back the blocks this process reserved past the end (truncating to the size
        frees them). Only a reservation made here: a size read from the files on disk never
        cuts one (a wrong one would cut valid data silently; recovery alone cuts a log)."""
        reserved = self._reserve_mark is not None and self.reserved_end > self.size
        self._give_back_reserve()
        if reserved:
            os.ftruncate(self.fd, self.size)
        self.reserved_end = self.size

    def indexes_full(self) -> bool:
        return self.offset_index.is_full() or self.time_index.is_full()

    def key_index_has_room(self, batch: AppendableBatch) -> bool:
        return self.key_index is None or self.key_index.has_room(batch.key_hits)

    # -- the key index ------------------------------------------------------------------------

    def attach_key_index(self, active: bool) -> None:
        """Open the writable store's key index now, rebuilding it unless it vouches for the
        log (the active segment's, which appends extend; a sealed one's opens on first use)."""
        if self.key_index is not None and self.writable:
            self.key_index.open(self.size, active, self._all_batch_hits)

    def key_table(self) -> KeyTable | None:
        """The key index's table, built in memory on first use when the store is read-only."""
        if self.key_index is None:
            return None
        table = self.key_index.table
        if table is not None:
            return table
        self.ensure_open()
        return self.key_index.ensure(self.size, self._all_batch_hits)

    def _all_batch_hits(self) -> BatchHits:
        """Every batch's key hits, for a rebuild (the log was validated when it was opened)."""
        out: BatchHits = []
        size = self.size
        if size == 0:
            return out
        view = self.view(0, size)
        try:
            pos = 0
            while pos < size:
                hits, base, n = batch_hits(view, pos, MAX_DECOMPRESSED, self.log_path)
                out.append((hits, base - self.base_offset, pos))
                pos += n
        finally:
            view.release()
        return out

    # -- reading ------------------------------------------------------------------------------

    def position_for(self, offset: int) -> int:
        """Start position of the batch holding `offset`, or of a batch before it (index floor)."""
        if not self.is_open:
            self.ensure_open()
        entry = self.offset_index.floor(offset - self.base_offset)
        return entry[1] if entry is not None else 0

    def position_for_time(self, timestamp: int) -> int:
        """A position at or before the first batch whose records may reach `timestamp`."""
        if not self.is_open:
            self.ensure_open()
        entry = self.time_index.floor(timestamp)
        if entry is None:
            return 0
        return self.position_for(self.base_offset + entry[1])

    def view(self, start: int, limit: int) -> memoryview:
        """Zero-copy bytes [start, limit) of the log; `limit` must be a size this process saw
        after the bytes were written (so every byte is inside the file)."""
        mapped = self._view
        if mapped is None or limit > len(mapped):
            if limit <= 0:
                return memoryview(b"")  # an empty sealed segment has no mapping
            mapped = self._remap(limit)
        return mapped[start:limit]

    def mapping(self, limit: int) -> MappedFile:
        """The mapping of the `.log` covering [0, limit), mapped or remapped if need be (same
        rule for `limit` as view()). The lookup kernels take a buffer of it as a point read's
        pin (_ext/lookup.pyx): the mapping outlives a remap or close until it is released."""
        mapped = self.mapped
        if mapped is None or mapped.length < limit:
            self._remap(limit)
            mapped = self.mapped
            assert mapped is not None  # _remap maps or raises
        return mapped

    def _remap(self, limit: int) -> memoryview:
        if self.fd < 0:
            self.ensure_open()  # first use, or closed by the cache (raises once closed for good)
            if self._view is not None and limit <= len(self._view):
                return self._view
        with self._map_lock:
            if self._view is not None and limit <= len(self._view):
                return self._view
            if self.fd < 0:
                raise StoreClosedError(f"segment {self.log_path} is closed")
            old, old_view = self.mapped, self._view
            # the active segment's mapping reaches its roll size, so appends need no remap
            reserve = 0 if self.sealed else self.map_reserve
            self.mapped = MappedFile(self.fd, max(limit, reserve, 1))
            self._view = memoryview(self.mapped)
            if old is not None and old_view is not None:
                old_view.release()
                old.close()  # unmapped once readers of the old mapping let go
            return self._view

    def _unmap(self) -> None:
        with self._map_lock:
            if self.mapped is not None and self._view is not None:
                self._view.release()
                self.mapped.close()
            self.mapped = self._view = None

    # -- sealing, flushing, closing -----------------------------------------------------------

    def seal(self, sync: bool = False) -> None:
        """Roll or close: write the closing time entry and trim both indexes to their entries;
        the key index's header records the log bytes it covers and its CRC (msync'd when
        `sync`)."""
        self.sealed = True
        if not self.writable:
            return
        self._append_closing_time_entry()
        self.offset_index.trim()
        self.time_index.trim()
        self._release_reserve()
        if self.key_index is not None:
            self.key_index.flush(self.size, sync)

    def _append_closing_time_entry(self) -> None:
        """The .timeindex entry of a sealed segment: its largest timestamp (Kafka's rule)."""
        if not self.writable:
            return
        entry = self.policy.close_entry()
        if entry is not None:
            self.time_index.append(entry[0], entry[1] - self.base_offset, closing=True)

    def flush(self, upto: int | None = None) -> None:
        """fdatasync the log (indexes are derived data: recovery rebuilds them); a sealed
        segment that keeps no descriptor opens its file for the sync. With `upto`, nothing is
        done when a sync already covered the file's first `upto` bytes."""
        size = self.size
        if not self.writable or self.flushed_size >= (size if upto is None else upto):
            return
        with self._state:
            if self.fd >= 0:
                durable.sync_data(self.fd)
            elif not self.closed:
                fd = durable.open_store_file(self.log_path, os.O_RDONLY)
                try:
                    durable.sync_data(fd)
                finally:
                    os.close(fd)
            self.flushed_size = size

    def retire(self, keep_open: bool) -> None:
        """Retention or compaction took this segment out of the log: its files are about to be
        removed or replaced, so from now on it only reads what it has open and never writes a
        file (a key index first asked for now is built in memory). `keep_open` (readers still
        hold it): open it now, so it keeps the files it reads whatever is done to their names."""
        if keep_open:
            self.ensure_open()
        with self._state:
            self.retired = True
            self.writable = False
            if self.key_index is not None:
                self.key_index.writable = False
        if self.cache is not None:
            self.cache.forget(self)

    def same_log(self) -> bool:
        """Whether the `.log` this segment opened (or stat'ed) is still the file at its path."""
        try:
            here = os.stat(self.log_path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == self.identity

    def close(self) -> None:
        with self._state:
            if self.closed:
                return
            self.closed = True
            self._unmap()
            if self.is_open and self.writable and not self.sealed:
                self._release_reserve()
            trim = self.writable and self.is_open
            self.offset_index.close(trim=trim)
            self.time_index.close(trim=trim)
            if self.key_index is not None:
                if self.writable:
                    self.key_index.close(self.size)
                else:
                    self.key_index.close_map()
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            self.is_open = False
        if self.cache is not None:
            self.cache.forget(self)

    def delete(self) -> None:
        """Remove the segment's files (recovery dropping an empty trailing segment)."""
        self._give_back_reserve()
        self._unmap()
        self.offset_index.delete()
        self.time_index.delete()
        if self.key_index is not None:
            self.key_index.delete()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.log_path)
        except FileNotFoundError:
            pass


def _holds_reserve(st: os.stat_result) -> bool:
    """Whether the file owns more blocks than its bytes need: space a writer reserved and
    did not hand back (it was killed). The slack covers the filesystem's own extent blocks."""
    blocks = getattr(st, "st_blocks", 0) * 512
    return blocks > st.st_size + _RESERVE_SLACK


_RESERVE_SLACK = 1 << 20


def _batch_size_at(chunk: bytes) -> int:
    """Total size of the batch starting at chunk[0] from its length field (0 if unreadable)."""
    if len(chunk) < 12:
        return 0
    return 12 + int.from_bytes(chunk[8:12], "big", signed=True)
