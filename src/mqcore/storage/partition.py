"""One topic-partition: an ordered list of segments, the active one last.

The partition assigns offsets, rolls segments, applies the flush policy, recovers after an
unclean stop and serves reads. Appends hold the partition lock while they write; reads hold it
only to pick a segment, a position and a size, then decode from the segment's read-only mapping
outside it, never past the size they saw, so they never meet a partial batch
(docs/architecture.md "Concurrency").
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mqcore._ext.batch import Message, decode_messages, peek_batch_header
from mqcore._ext.lookup import get_record, offset_for_time
from mqcore._ext.segtable import SegmentTable
from mqcore.clock import Clock, now_ms
from mqcore.config import FlushPolicy, TopicConfig
from mqcore.crashpoints import crash_point
from mqcore.errors import (
    CorruptRecordError,
    InvalidTimestampError,
    OffsetOutOfRangeError,
    StoreChangedError,
    StoreClosedError,
    StoreError,
    UnknownTopicError,
)
from mqcore.storage import durable, producer_state
from mqcore.storage.cache import SegmentCache
from mqcore.storage.loader import (
    SEGMENT_FILE_SUFFIXES,
    RecoveryReport,
    finish_swap,
    first_to_recover,
    has_segments,
    recover_segment,
    segment_layout,
    tidy_directory,
)
from mqcore.storage.logstart import read_log_start, write_log_start
from mqcore.storage.producer_state import ProducerStateManager
from mqcore.storage.segment import (
    LOG_SUFFIX,
    MAX_DECOMPRESSED,
    AppendableBatch,
    LogSegment,
    ReserveBudget,
    segment_name,
)
from mqcore.storage.txnindex import (
    ATTR_TRANSACTIONAL,
    AbortedTxn,
    append_entry,
    batch_headers,
    collect,
    read_entries,
    txnindex_path,
    write_entries,
)

MIN_KEY_INDEX_ENTRIES = 16  # TopicConfig's lower bound of key_index_entries
ATTR_LOG_APPEND_TIME = 0x08  # batch attributes bit 3: timestamps are the log's (format.md)

# Decoders driven by Partition.scan(): (view, file position, segment) -> (bytes used, stop)
Decoder = Callable[[memoryview, int, LogSegment], tuple[int, bool]]


@dataclass
class DeletedPrefix:
    """What Partition.delete_oldest took out: (segment, size) of each, the disposers the caller
    runs once the directory is synced, and the log start offset after it."""

    victims: list[tuple[LogSegment, int]] = field(default_factory=list)
    dispose_now: list[Callable[[], None]] = field(default_factory=list)
    start_offset: int = 0


NOT_LEADING = -2  # Partition.leader_epoch of a replica another broker leads


class Partition:
    """Segments of `<topic>-<partition>/` and the rules that tie them into one log."""

    def __init__(
        self,
        topic: str,
        partition: int,
        directory: str,
        config: TopicConfig,
        flush: FlushPolicy,
        writable: bool,
        cache: SegmentCache | None = None,
        clock: Clock = now_ms,
        reserve_budget: ReserveBudget | None = None,
    ):
        self.clock = clock  # the log's ms clock: the CreateTime bounds of appends
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self.config = config
        self.store_flush = flush  # the store's policy; flush_policy is the one this topic gets
        self.flush_policy = flush.for_topic(config)
        self.writable = writable
        # the leader epoch this broker leads the partition at (a cluster's replica manager
        # sets it through ReplicaLog.lead): the store's own appends carry it, as a Kafka
        # leader's batches do, so followers' epoch caches know where it starts; -1: none (a
        # node of one); NOT_LEADING: a replica another broker leads (ReplicaLog.follow),
        # where the store's own appends are refused
        self.leader_epoch = -1
        self.cache = cache  # the store's open sealed segments (storage/cache.py)
        # the store's space reserved past active segments (one of its own when alone)
        self.reserve_budget = reserve_budget if reserve_budget is not None else ReserveBudget()
        self._lock = threading.RLock()
        # the segment list, its base offsets and the lock, as the lookup kernels read them
        # (_ext/segtable.pyx); the list changes only through _set_segments
        self.table: SegmentTable[LogSegment] = SegmentTable(self._lock, topic, partition)
        # the table's list itself (splice changes it in place): the hot paths read it without
        # the property's call
        self._segs: list[LogSegment] = self.table.segments
        self._sync_lock = threading.Lock()
        self.unflushed_messages = 0
        self.dirty_since = 0.0  # time.monotonic() of the first append not yet flushed
        self.recovery_point = 0
        # directories whose entries changed (a segment or the partition directory created)
        # since they were last fsync'd: flush() syncs them with the data (flush="os" defers it)
        self._unsynced_dirs: list[str] = []
        self._opened_paths: dict[int, dict[str, str]] = {}  # the layout the open read
        self.closed = False
        self.deleted = False  # closed because its topic was deleted (close(deleted=True))
        self.producer_state: ProducerStateManager | None = None  # writable partitions only
        # readers pin the segments they picked; retention and compaction take a segment out of
        # the list at once but close its files only when the last reader unpins it
        self._pins: dict[LogSegment, int] = {}
        self._retired: dict[LogSegment, Callable[[], None]] = {}
        self.maintenance = threading.Lock()  # one retention or compaction pass at a time
        # the log start offset when DeleteRecords moved it inside the first segment
        # (storage/logstart.py); start_offset is the larger of it and the first base offset
        self.table.log_start = -1

    # -- opening and recovery -----------------------------------------------------------------

    def open(
        self, recovery_point: int | None, clean: bool, live: bool = False, scan_all: bool = False
    ) -> RecoveryReport:
        """Load the segments; recover those at or after the recovery point unless clean.

        `live` (read-only stores only): a writer holds the store open. Its log is whole (it
        recovered it when it opened) but for the batch it may be writing now, so every segment
        is trusted and the visible log ends at the last whole batch: nothing is recovered.
        `scan_all` (a repair): every segment is scanned; the recovery point still bounds where
        damage may be read as a power-loss hole."""
        try:
            return self._open(recovery_point, clean, live and not self.writable, scan_all)
        except BaseException:
            self.abandon()
            raise

    def create(self) -> RecoveryReport:
        """Start a new partition in the empty directory its creator just made: the first
        segment, nothing to tidy, recover or load (a fraction of `open`'s work). The names in
        the directory are synced by the creator, for all its new partitions at once
        (durable.sync_dirs), or under flush="os" by the partition's next flush."""
        try:
            seg = self._segment(0)
            self._set_segments(0, 0, [seg])
            seg.ensure_open()
            seg.attach_key_index(active=True)
            if self.flush_policy.mode == "os":
                self._unsynced_dirs.append(self.directory)
            self.producer_state = producer_state.empty(self)
        except BaseException:
            self.abandon()
            raise
        return RecoveryReport(segments=1)

    @property
    def segments(self) -> list[LogSegment]:
        """The segments, oldest first, the active one last (do not change the list: only
        _set_segments does, keeping the table's base offsets beside it)."""
        return self._segs

    def _set_segments(self, start: int, stop: int, new: list[LogSegment]) -> None:
        """segments[start:stop] = new: the one place the segment list changes (open, recovery,
        roll, compaction's swap, retention), which keeps the kernels' table true. Call with the
        lock held (or before any reader exists: open)."""
        self.table.splice(start, stop, new)

    def _park(self, seg: LogSegment) -> None:
        """A sealed segment gives back its descriptor and joins the store's open segments."""
        seg.park()
        if self.cache is not None:
            self.cache.admit(seg)

    def is_pinned(self, seg: LogSegment) -> bool:
        """Whether a reader holds `seg` (call with the lock held)."""
        return seg in self._pins

    def same_files(self) -> bool:
        """Whether the files this open read are still the log as it stands (a read-only open
        beside a writer checks that its view did not straddle a change): every segment it
        opened is still named by the same files and its `.log` is the same file, but for
        segments retention removed from the start (its open files still hold them whole).
        A roll adding segments, or an index replaced by a trim, changes nothing it saw."""
        try:
            now = dict(segment_layout(self.directory))
        except FileNotFoundError:
            return False
        segs = list(self._segs)
        while segs and segs[0].base_offset not in now and len(segs) > 1:
            segs.pop(0)  # retention took it after it was opened
        for seg in segs:
            opened = self._opened_paths.get(seg.base_offset, {}).get(LOG_SUFFIX)
            if now.get(seg.base_offset, {}).get(LOG_SUFFIX) != opened or not seg.same_log():
                return False
        return True

    def abandon(self) -> None:
        """Close every file without sealing or trimming anything: a failed open leaves the
        partition as it found it (still unclean), and leaks no descriptors."""
        self.closed = True
        for seg in self._segs:
            seg.writable = False
            seg.close()

    def _open(
        self, recovery_point: int | None, clean: bool, live: bool, scan_all: bool = False
    ) -> RecoveryReport:
        report = RecoveryReport()
        if os.path.islink(self.directory):
            raise StoreError(
                f"{self.directory} is a symbolic link: a store's partition directories and "
                "files are never links"
            )
        if self.writable:
            if not os.path.isdir(self.directory):
                os.makedirs(self.directory)
                self._dir_changed(os.path.dirname(self.directory))
            tidy_directory(self.directory)
        layout = segment_layout(self.directory)
        created = not layout
        if created:
            if not self.writable:
                raise StoreError(f"no segments in {self.directory}")
            layout = [(0, {})]
        last = len(layout) - 1
        # Every segment but the active one is only stat'ed here: one the log trusts is opened
        # on first use, one recovery scans is opened for the scan and given back after it
        # (sealed segments keep no descriptor: storage/cache.py), so opening a partition never
        # holds more than a few descriptors whatever its segment count.
        self._set_segments(
            0,
            len(self._segs),
            [self._segment(base, paths, lazy=i < last) for i, (base, paths) in enumerate(layout)],
        )
        if live:
            start_recovery = len(layout)
        else:
            start_recovery = 0 if scan_all else self._first_to_recover(recovery_point, clean)
        self._opened_paths = dict(layout)
        if created:
            self._dir_changed(self.directory)
        i = 0
        while i < len(self._segs):
            seg = self._segs[i]
            if i < start_recovery and i < last:
                i += 1  # trusted and sealed: loaded on first use
                continue
            if i < start_recovery:
                seg.load()
            if i >= start_recovery or (not live and seg.size < os.fstat(seg.fd).st_size):
                # a trusted segment whose file goes on past its last whole batch gets the full
                # check too: appends (O_APPEND) would land after those bytes, unreadable
                seg.open_for_scan()
                self._recover_segment(i, report, recovery_point or 0)
            prev = self._segs[i - 1] if i else None
            if prev is not None and prev.loaded and seg.base_offset < prev.next_offset:
                raise CorruptRecordError(
                    f"segment base offset {seg.base_offset} overlaps the previous segment, "
                    f"which ends at offset {prev.next_offset - 1}",
                    path=seg.log_path,
                )
            if seg is not self._segs[-1] or not self.writable:
                # a scanned sealed segment: a rebuilt time index gets back its closing entry,
                # its indexes go back to their trimmed size, what recovery kept is synced, and
                # it gives back its descriptor (a read-only store appends nothing: all sealed)
                seg.seal()
                if self.writable:
                    seg.flush()
                self._park(seg)
            i += 1
        self.active.attach_key_index(active=True)
        if not self.writable:
            self._hold_for_reading()
        report.segments = len(self._segs)
        if self.writable and report.recovered_segments:
            self._sync_recovered(report)
        if self.writable:
            self.producer_state = producer_state.load(self)
        # all of the log is durable now: a clean stop synced it, _sync_recovered the rest
        self.recovery_point = self.end_offset
        # a crash between a truncation's steps may leave the file past the log end: clamp
        self.table.log_start = min(read_log_start(self.directory), self.end_offset)
        return report

    def _hold_for_reading(self) -> None:
        """A read-only store opens its segments now, newest first, while the store's segment
        cache has room: open files stay readable whatever the writer later does to their
        names, so a store of up to max_open_segments segments reads the log exactly as it was
        when it opened. One opened later finds the file as it is then (StoreChangedError if
        the writer replaced or removed it meanwhile: operations.md "Readers beside a writer").
        A damaged one stays closed: the reads that reach it raise, the others still read."""
        for i in range(len(self._segs) - 1, -1, -1):
            if self.cache is not None and len(self.cache) >= self.cache.limit:
                return
            seg = self._segs[i]
            if seg.is_open:
                continue
            try:
                seg.ensure_open()
            except CorruptRecordError:
                continue
            except StoreChangedError:
                if not self._retention_took(i):
                    raise  # replaced, or merged by compaction: the caller opens again
                for gone in self._segs[: i + 1]:
                    gone.close()
                self._set_segments(0, i + 1, [])
                return

    def _retention_took(self, i: int) -> bool:
        """Whether segment i and every older one are gone from the directory: retention moved
        the log start past them since this read-only open listed them (nothing else removes
        the oldest segments), so the view just starts later."""
        try:
            now = segment_layout(self.directory)
        except FileNotFoundError:
            return False
        return bool(now) and now[0][0] > self._segs[i].base_offset and i + 1 < len(self._segs)

    def _sync_recovered(self, report: RecoveryReport) -> None:
        """After an unclean stop, make what recovery kept durable before anything relies on it.

        The bytes a killed writer left in the page cache were never fsync'd, yet recovery
        accepted them: without this, a later roll would seal such a segment without a sync, the
        recovery point would move past it and a power loss would leave a hole below the point
        where the next open trusts the log. The directory is synced too (recovery may have
        deleted or cut segments)."""
        self.active.flush()  # the sealed ones were synced as they were scanned
        self._unsynced_dirs.append(self.directory)
        self._sync_dirs()

    def _dir_changed(self, directory: str) -> None:
        """A name was created in `directory`: sync it now, or with the next flush under "os"."""
        if directory not in self._unsynced_dirs:
            self._unsynced_dirs.append(directory)
        if self.flush_policy.mode != "os":
            self._sync_dirs()

    def _sync_dirs(self) -> None:
        """fsync the directories whose names changed (a copy of the list: a roll may add one
        while another thread syncs)."""
        for directory in list(self._unsynced_dirs):
            durable.sync_dir(directory)
            if directory in self._unsynced_dirs:
                self._unsynced_dirs.remove(directory)

    def _segment(
        self, base: int, paths: dict[str, str] | None = None, lazy: bool = False
    ) -> LogSegment:
        return LogSegment(
            self.directory,
            base,
            paths=paths,
            cache=self.cache,
            owner_lock=self._lock,
            lazy=lazy,
            writable=self.writable,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            map_reserve=self.config.segment_bytes,
            preallocate_bytes=self.config.preallocate_bytes,
            reserve_budget=self.reserve_budget,
            key_index_capacity=key_index_capacity(self.config),
        )

    def _first_to_recover(self, recovery_point: int | None, clean: bool) -> int:
        """Index of the first segment to scan: the one holding the recovery point."""
        return first_to_recover(self.table.bases(), recovery_point, clean)

    def _recover_segment(self, i: int, report: RecoveryReport, recovery_point: int) -> None:
        """Scan segment i (loader.recover_segment); the list keeps what it kept."""
        kept = list(self._segs)
        recover_segment(kept, i, report, recovery_point, self.writable)
        self._set_segments(len(kept), len(self._segs), [])

    # -- offsets --------------------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self._segs[-1]

    @property
    def start_offset(self) -> int:
        """The first offset readable: the first segment's base offset, or later when
        advance_log_start() (Kafka's DeleteRecords) moved it inside that segment."""
        return max(self._segs[0].base_offset, self.table.log_start)

    @property
    def end_offset(self) -> int:
        """The offset the next appended record will get (Kafka's log end offset)."""
        return self._segs[-1].next_offset

    def _segment_index(self, offset: int) -> int:
        return self.table.floor_index(offset)

    # -- appending ------------------------------------------------------------------------------

    def append(self, batch: AppendableBatch, check_timestamps: bool = True) -> int:
        """Assign offsets to `batch`, write it, and flush as the policy says; returns its base.

        `check_timestamps=False`: a replica's copy of batches the leader already accepted."""
        if check_timestamps:
            self._check_timestamps(batch)
        with self._lock:
            if self.closed:
                self._refuse_closed()
            seg = self.active
            if self._should_roll(seg, batch):
                seg = self._roll()
            base = seg.next_offset
            batch.set_base_offset(base)
            seg.append(batch)
            end = seg.size
            if not self.unflushed_messages:
                self.dirty_since = time.monotonic()
            self.unflushed_messages += batch.count
            due = self.unflushed_messages >= self.config.flush_after_messages
        if self.flush_policy.mode == "always":
            self._sync(seg, end, batch.last_offset + 1)
        elif due:  # the topic's flush_after_messages (Kafka's flush.messages), in this append
            self.flush()
        return base

    def reconfigure(self, config: TopicConfig) -> None:
        """Use `config` from the next append on (Store.alter_topic_config, which refuses the
        settings that size files already open: the active segment keeps the ones it has).
        A topic that now wants every append durable first syncs what "os" left unsynced (the
        appends of "always" sync only their own segment)."""
        with self._lock:
            deferred = self.flush_policy.mode == "os"
            self.config = config
            self.flush_policy = self.store_flush.for_topic(config)
            catch_up = deferred and self.flush_policy.mode != "os" and self.writable
        if catch_up and not self.closed:
            self.flush()

    def flush_due(self) -> float | None:
        """When the topic's flush_after_ms (Kafka's flush.ms) wants this partition synced, in
        time.monotonic() seconds: that long after its first unsynced append; None when
        nothing waits for it."""
        if not self.config.timed_flush or not self.unflushed_messages or self.closed:
            return None
        if self.flush_policy.mode == "always":
            return None
        return self.dirty_since + self.config.flush_after_ms / 1000

    def _check_timestamps(self, batch: AppendableBatch) -> None:
        """Kafka's message.timestamp.after.max.ms / before.max.ms on a CreateTime batch."""
        if batch.attributes & ATTR_LOG_APPEND_TIME:
            return  # stamped by the log itself
        check_timestamps(
            self.config, self.topic, batch.min_timestamp, batch.max_timestamp,
            self.clock(),
        )  # fmt: skip

    def _should_roll(self, seg: LogSegment, batch: AppendableBatch) -> bool:
        """Kafka's roll rules: size, age by record time, full index, 32-bit offset delta."""
        if seg.size == 0:
            return False
        if seg.size + batch.size > self.config.segment_bytes:
            return True
        if (
            seg.first_batch_timestamp >= 0
            and batch.max_timestamp - seg.first_batch_timestamp > self.config.segment_ms
        ):
            return True
        if seg.indexes_full() or not seg.key_index_has_room(batch):
            return True
        return seg.next_offset + batch.count - 1 - seg.base_offset > 0x7FFFFFFF

    def _roll(self) -> LogSegment:
        old = self.active
        old.seal(sync=self.flush_policy.mode != "os")
        if self.flush_policy.mode != "os":
            old.flush()
        self._park(old)
        crash_point("roll.after_seal")
        new = self._segment(old.next_offset)
        crash_point("roll.after_new_segment")
        new.attach_key_index(active=True)
        new.first_batch_timestamp = -1
        self._set_segments(len(self._segs), len(self._segs), [new])
        self.snapshot_producers(sync_dir_now=False)  # one directory fsync: the one below
        crash_point("roll.before_dir_fsync")
        self._dir_changed(self.directory)
        if self.flush_policy.mode != "os":
            self.recovery_point = new.base_offset
        return new

    def _sync(self, seg: LogSegment, upto: int, durable_offset: int) -> None:
        """Group commit: one fdatasync covers every append that finished before it started.

        The offsets below `durable_offset` are then on disk: the recovery point advances (it
        reaches the checkpoint file at the next roll, flush() or close()).
        """
        if seg.flushed_size < upto:
            with self._sync_lock:
                if seg.flushed_size < upto and not seg.closed:
                    seg.flush()
        self.recovery_point = max(self.recovery_point, durable_offset)

    def flush(self) -> int:
        """fdatasync every segment with unflushed bytes; returns the offset now durable.

        Group commit: each segment is synced only when no sync since this call began covered
        the bytes it held then, so callers that flush together (share members committing,
        consumers' offset commits) share one fdatasync instead of queueing for one each.
        """
        with self._lock:
            sizes = [(seg, seg.size) for seg in self._segs]
            end = self.end_offset
            self.unflushed_messages = 0
        with self._sync_lock:
            for seg, size in sizes:
                if not seg.closed:
                    seg.flush(size)
            self._sync_dirs()
        self.recovery_point = max(self.recovery_point, end)
        self.snapshot_producers(only_if_changed=True)
        return end

    def snapshot_producers(self, only_if_changed: bool = False, sync_dir_now: bool = True) -> None:
        """Write the producer state as `<end offset>.snapshot` (at roll, flush and close).
        None for an empty log with no producer: loading one finds the same empty state.
        `sync_dir_now=False`: the directory's fsync is left to the caller's _sync_dirs."""
        state = self.producer_state
        if state is None:
            return
        with self._lock:
            end = self.end_offset
            if end == state.snapshot_offset or (only_if_changed and not state.dirty):
                return
            if end == self.start_offset and not state.producers:
                return
            data = state.encode_snapshot()
            state.dirty = False
        if state.write_snapshot(end, data, sync_dir_now):
            with self._lock:
                if self.directory not in self._unsynced_dirs:
                    self._unsynced_dirs.append(self.directory)

    # -- transactions (storage/txnindex.py) ---------------------------------------------------

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Index an aborted transaction in the `.txnindex` of the segment holding its marker,
        fsync'd whatever the flush policy (aborts are rare): recovery walks the batches again
        only from the newest producer snapshot, so an entry of a marker below it must not be
        lost while the marker survives."""
        seg = self._segs[self._segment_index(entry.last_offset)]
        append_entry(txnindex_path(seg.log_path), entry, sync=True)

    def drop_aborted_from(self, offset: int) -> None:
        """Remove the `.txnindex` entries of markers at or after `offset`."""
        for seg in self._segs[self._segment_index(max(offset, self._segs[0].base_offset)) :]:
            path = txnindex_path(seg.log_path)
            entries = read_entries(path)
            kept = [e for e in entries if e.last_offset < offset]
            if len(kept) != len(entries):
                write_entries(path, kept, sync=True)

    def _transactions(self) -> ProducerStateManager:
        """The producer state whose open transactions give the last stable offset: the
        writer's own, or for a read-only store one read once from the snapshot and the
        batches after it (nothing on disk changes)."""
        state = self.producer_state
        if state is None:
            state = self._read_only_state
            if state is None:
                state = self._read_only_state = producer_state.load(self, read_only=True)
        return state

    _read_only_state: ProducerStateManager | None = None

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest transaction still open, or the log end: where a
        read_committed reader stops. Never below the log start offset (Kafka's UnifiedLog
        clamps it there: DeleteRecords or retention past an open transaction's first records
        would otherwise send a read_committed consumer's ListOffsets below the log start)."""
        with self._lock:
            end = self.end_offset
            first = self._transactions().first_unstable_offset()
            start = self.start_offset
        return end if first is None else max(start, min(first, end))

    def aborted_transactions(self, lo: int, hi: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [lo, hi) (txnindex.collect)."""
        with self._lock:
            segs = self._segs[self._segment_index(max(lo, self._segs[0].base_offset)) :]
        return collect((read_entries(txnindex_path(s.log_path)) for s in segs), lo, hi)

    def aborted_ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """[first, last] offset ranges of the batches a read_committed reader of [lo, hi)
        skips: each transactional batch of a producer that lies within one of its aborted
        transactions (found from the batch headers; no record is decoded)."""
        txns = self.aborted_transactions(lo, hi)
        if not txns:
            return []
        by_producer: dict[int, list[AbortedTxn]] = {}
        for t in txns:
            by_producer.setdefault(t.producer_id, []).append(t)
        out: list[tuple[int, int]] = []

        def walk(buf: memoryview, file_pos: int, seg: LogSegment) -> tuple[int, bool]:
            used = 0
            for at, info in batch_headers(buf, 0, len(buf)):
                if info.base_offset >= hi:
                    return at, True
                if info.attributes & ATTR_TRANSACTIONAL and not info.is_control:
                    for t in by_producer.get(info.producer_id, ()):
                        if t.first_offset <= info.base_offset <= t.last_offset:
                            out.append((info.base_offset, info.last_offset))
                            break
                used = at + info.size
            return used, False

        first = min(t.first_offset for t in txns)
        self.scan(max(lo, first, self.start_offset), walk)
        return out

    # -- reading --------------------------------------------------------------------------------

    def check_offset(self, offset: int) -> None:
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise OffsetOutOfRangeError(f"offset must be an int, not {type(offset).__name__}")
        start, end = self.start_offset, self.end_offset
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{start}, {end}] of {self.topic}-{self.partition}"
            )

    def scan(
        self, offset: int, decode: Decoder, start: tuple[LogSegment, int] | None = None
    ) -> None:
        """Feed the batches from the one holding `offset` (or from `start`, a known segment and
        position) onwards to `decode`, as one zero-copy view per segment, until it says stop or
        the log, as it was when the scan began, ends."""
        with self._lock:
            if self.closed:
                self._refuse_closed()
            if start is None and offset < self.start_offset:
                # retention moved the log start past it since the caller checked
                raise OffsetOutOfRangeError(
                    f"offset {offset} is below the log start offset {self.start_offset} of "
                    f"{self.topic}-{self.partition}"
                )
            i = self._segs.index(start[0]) if start else self._segment_index(offset)
            segs = self._segs[i:]
            sizes = [s.size for s in segs]
            pos = start[1] if start else segs[0].position_for(offset)
            self._pin(segs)
        try:
            for seg, size in zip(segs, sizes, strict=True):
                while pos < size:
                    used, stop = decode(seg.view(pos, size), pos, seg)
                    if stop:
                        return
                    if used == 0:
                        # the view ends where the log ended: a batch past it was never whole
                        raise CorruptRecordError(
                            "batch runs past the end of the segment",
                            path=seg.log_path,
                            position=pos,
                        )
                    pos += used
                pos = 0
        finally:
            self._unpin(segs)

    def read(
        self,
        offset: int,
        max_records: int,
        verify_crc: bool = True,
        max_offset: int | None = None,
        committed: bool = False,
    ) -> list[Message]:
        """Messages from `offset` on, at most max_records, in offset order. `committed`
        (read_committed): only below the last stable offset, without the records of aborted
        transactions."""
        self.check_offset(offset)
        last = (1 << 63) - 1 if max_offset is None else max_offset
        if not committed:
            return self._read(offset, max_records, verify_crc, last)
        out: list[Message] = []
        for lo, hi in self.committed_spans(offset, last + 1):
            out += self._read(lo, max_records - len(out), verify_crc, hi - 1)
            if len(out) >= max_records:
                break
        return out

    def committed_spans(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The [a, b) spans of [lo, hi) a read_committed reader reads: below the last stable
        offset, between the batches of aborted transactions (aborted_ranges)."""
        hi = min(hi, self.last_stable_offset)
        spans = []
        at = lo
        for first, last in sorted(self.aborted_ranges(lo, hi)):
            if at >= hi:
                break
            if first > at:
                spans.append((at, min(first, hi)))
            at = max(at, last + 1)
        if at < hi:
            spans.append((at, hi))
        return spans

    def _read(self, offset: int, max_records: int, verify_crc: bool, last: int) -> list[Message]:
        out: list[Message] = []
        state = [offset]

        def decode(buf: memoryview, file_pos: int, seg: LogSegment) -> tuple[int, bool]:
            want = max_records - len(out)
            pos, next_offset = decode_messages(
                buf,
                0,
                self.topic,
                self.partition,
                state[0],
                want,
                out,
                verify_crc,
                MAX_DECOMPRESSED,
                seg.log_path,
                file_pos,
                last,
            )
            state[0] = next_offset
            return pos, len(out) >= max_records or next_offset > last or (
                pos < len(buf) and _batch_base(buf, pos) > last
            )

        if max_records > 0 and offset < self.end_offset and offset <= last:
            self.scan(offset, decode)
        return out

    def get(self, offset: int, verify_crc: bool = True, committed: bool = False) -> Message | None:
        """The record at `offset`, or None (a compacted gap, a control record, or out of range).

        One kernel call (_ext/lookup.pyx get_record): under the lock, the segment, its index
        floor, its size and a buffer of its mapping (which keeps it mapped: the read's pin);
        then, without the lock, the batch holding the offset (by the memos of batches read
        before, else their headers) and only that record. A batch's CRC is checked the first
        time a get lands in it.
        """
        if committed:
            if offset >= self.last_stable_offset:
                return None
            if any(a <= offset <= b for a, b in self.aborted_ranges(offset, offset + 1)):
                return None
        return get_record(self.table, offset, verify_crc, MAX_DECOMPRESSED)

    def max_timestamp(self) -> int:
        """The largest timestamp in the partition, -1 when it holds no message (each segment
        keeps its own, from its time index and last batch)."""
        with self._lock:
            return max((s.max_timestamp for s in self._segs), default=-1)

    def offset_for_time(self, timestamp: int, verify_crc: bool = True) -> int | None:
        """Kafka's rule: the earliest offset whose timestamp is >= `timestamp`, or None.

        One kernel call (_ext/lookup.pyx offset_for_time): under the lock, the first segment
        whose largest timestamp reaches `timestamp`, its time-index floor and a buffer of its
        mapping; then, without the lock, batch memos or headers to the first batch whose
        maxTimestamp reaches it, and that batch's record timestamps only (they need not be
        monotonic: the first record in offset order that reaches it is the answer). A batch is
        checked (CRC, records) the first time a get or a lookup reads it, as get does.
        Offsets below the log start (advance_log_start, Kafka's DeleteRecords) are not
        answers, as in Kafka's fetchOffsetByTimestamp, though their bytes are still there.
        """
        return offset_for_time(self.table, timestamp, verify_crc, MAX_DECOMPRESSED)

    # -- pins: what a read has open -------------------------------------------------------------

    def _pin(self, segs: list[LogSegment]) -> None:
        """Count a reader on each segment (call with the lock held, as the reader picks them)."""
        for seg in segs:
            self._pins[seg] = self._pins.get(seg, 0) + 1

    def _unpin(self, segs: list[LogSegment]) -> None:
        """Drop a reader's pins; a retired segment whose last reader left is disposed of."""
        done = []
        with self._lock:
            for seg in segs:
                left = self._pins[seg] - 1
                if left:
                    self._pins[seg] = left
                    continue
                del self._pins[seg]
                dispose = self._retired.pop(seg, None)
                if dispose is not None:
                    done.append(dispose)
        for dispose in done:
            dispose()

    @contextlib.contextmanager
    def pinned_ends(self) -> Iterator[list[tuple[LogSegment, int, int]]]:
        """(segment, size, next offset) of every segment at one moment (appends hold the
        lock), pinned until the block ends: retention and compaction may take them out of the
        log meanwhile, but their files stay open for this reader."""
        with self._lock:
            if self.closed:
                self._refuse_closed()
            segs = list(self._segs)
            ends = [(s, s.size, s.next_offset) for s in segs]
            self._pin(segs)
        try:
            yield ends
        finally:
            self._unpin(segs)

    def retire(self, seg: LogSegment, dispose: Callable[[], None]) -> bool:
        """`seg` left the segment list (call with the lock held): run `dispose` (close and
        unlink its files) now if no reader has it pinned, else when the last one unpins.
        Returns whether it must run now; the caller runs it after releasing the lock."""
        if seg in self._pins:
            self._retired[seg] = dispose
            return False
        return True

    # -- maintenance: what retention and compaction do to the segment list -----------------------
    # (docs/architecture.md "Storage seams": they change the log only through these)

    def roll(self) -> LogSegment:
        """Seal the active segment and start a new one at the log end offset."""
        with self._lock:
            return self._roll()

    def locked(self) -> contextlib.AbstractContextManager[Any]:
        """The partition's lock (reentrant), held by every append and segment change: hold it
        to make several appends one run of consecutive offsets, or to read a state that an
        append changes (the producer state)."""
        return self._lock

    @contextlib.contextmanager
    def sync_lock(self) -> Iterator[None]:
        """Hold the lock flush() holds while it syncs: closing a segment's descriptor takes it."""
        with self._sync_lock:
            yield

    def segment_sizes(self) -> list[tuple[LogSegment, int]]:
        """(segment, size) of every segment at one moment (appends hold the lock)."""
        with self._lock:
            return [(s, s.size) for s in self._segs]

    def pin_for_maintenance(self) -> list[tuple[LogSegment, int]] | None:
        """(segment, size) of every segment at one moment, each pinned until unpin(); None when
        the partition is closed or read-only (no maintenance pass runs on it)."""
        with self._lock:
            if self.closed or not self.writable:
                return None
            segs = [(s, s.size) for s in self._segs]
            self._pin([s for s, _ in segs])
        return segs

    def unpin(self, segs: list[LogSegment]) -> None:
        """Drop the pins pin_for_maintenance() took on `segs`."""
        self._unpin(segs)

    def replace_segments(
        self, olds: list[LogSegment], disposers: list[Callable[[], None]]
    ) -> LogSegment:
        """Compaction's in-memory swap: the consecutive segments `olds` become the one segment
        whose files now stand at the first one's base offset (already swapped on disk). Each
        old one is retired with its disposer (run now, or when its last reader unpins it)."""
        new = self._segment(olds[0].base_offset, lazy=True)  # opened on first use
        with self._lock:
            i = self._segs.index(olds[0])
            assert self._segs[i : i + len(olds)] == olds
            self._set_segments(i, i + len(olds), [new])
            now = [d for old, d in zip(olds, disposers, strict=True) if self.retire(old, d)]
        for dispose in now:
            dispose()
        return new

    def delete_oldest(
        self,
        how_many: Callable[[list[LogSegment]], int],
        roll_all: bool,
        retire_files: Callable[[LogSegment, bool], Callable[[], None]],
    ) -> DeletedPrefix | None:
        """Take the first `how_many(segments)` segments out of the log (never the active one;
        with `roll_all`, roll first when that is every segment, so the active one can go too).
        `retire_files(segment, pinned)` renames a victim's files and returns its disposer; the
        disposers that may run at once come back for the caller to run after it syncs the
        directory. None when the partition is closed or read-only."""
        out = DeletedPrefix()
        with self._lock:
            if self.closed or not self.writable:
                return None
            count = how_many(self._segs)
            if roll_all and count >= len(self._segs) and self.active.size > 0:
                self._roll()  # every segment expired: Kafka rolls so the active can go too
            count = min(count, len(self._segs) - 1)
            if count > 0:
                for seg in self._segs[:count]:
                    out.victims.append((seg, seg.size))
                    dispose = retire_files(seg, self.is_pinned(seg))
                    if self.retire(seg, dispose):
                        out.dispose_now.append(dispose)
                self._set_segments(0, count, [])
            out.start_offset = self.start_offset
        return out

    # -- the log start and truncation (mqcore.log's embedding API) ------------------------------

    def advance_log_start(self, offset: int) -> int:
        """Move the log start offset up to `offset` (Kafka's DeleteRecords), durably: reads
        below it are refused from now on. Never past the log end, never backwards; returns the
        log start offset. Whole segments below it stay until retention.delete_below takes them."""
        with self._lock:
            self._check_changeable()
            if offset > self.end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is past the log end offset {self.end_offset} of "
                    f"{self.topic}-{self.partition}"
                )
            if offset > self.start_offset:
                write_log_start(self.directory, offset, sync=self.flush_policy.mode != "os")
                self.table.log_start = offset
            return self.start_offset

    def truncate(self, offset: int, start_at: bool = False) -> int:
        """Drop every batch holding an offset at or above `offset` (Kafka's truncateTo: the
        whole batch holding it goes); `start_at`, or an `offset` below the first segment: drop
        everything and start an empty log at `offset` (truncateFullyAndStartAt). Returns the
        log end offset.

        Files are replaced, never cut in place (readers map them: docs/architecture.md
        "Concurrency"): the kept prefix of the segment cut is copied to a new file that is
        renamed over it, the later segments' files are renamed to `.deleted`, and recovery's
        scan rebuilds the cut segment's indexes; readers holding a retired segment keep its old
        files until they unpin it. Durable when it returns (file and directory fsync'd)."""
        with self._lock:
            self._check_changeable()
            if not start_at and offset >= self.end_offset:
                return self.end_offset
            if start_at or offset < self._segs[0].base_offset:
                self._truncate_fully(offset)
            else:
                self._truncate_above(offset)
            if self.producer_state is not None:
                self.producer_state = producer_state.load(self)
            return self.end_offset

    def _check_changeable(self) -> None:
        if self.closed:
            raise StoreClosedError(f"partition {self.topic}-{self.partition} is closed")
        if not self.writable:
            raise StoreError(f"partition {self.topic}-{self.partition} is read-only")

    def _truncate_above(self, offset: int) -> None:
        i = self._segment_index(offset)
        old = self._segs[i]
        cut = _batch_start_at_or_after(old, offset)
        tmp = old.log_path + ".truncating.tmp"  # tidy_directory drops it after a crash
        _copy_prefix(old, cut, tmp)
        crash_point("truncate.after_copy")
        dispose = [self._retire_files(seg) for seg in reversed(self._segs[i + 1 :])]
        dispose.append(self._retire_files(old, keep_log=True))
        os.replace(tmp, old.log_path)
        durable.sync_dir(self.directory)
        crash_point("truncate.after_replace")
        new = self._segment(old.base_offset)
        self._set_segments(i, len(self._segs), [new])
        new.open_for_scan()
        recover_segment(self._segs, i, RecoveryReport(), 0, True)
        new.attach_key_index(active=True)
        new.flushed_size = new.size  # _copy_prefix fsync'd it
        self.recovery_point = min(self.recovery_point, self.end_offset)
        if self.table.log_start > self.end_offset:
            self._set_log_start(self.end_offset)
        for run in dispose:
            if run is not None:
                run()

    def _truncate_fully(self, offset: int) -> None:
        dispose = [self._retire_files(seg) for seg in reversed(self._segs)]
        durable.sync_dir(self.directory)
        crash_point("truncate.after_drop")
        new = self._segment(offset)
        new.attach_key_index(active=True)
        new.first_batch_timestamp = -1
        self._set_segments(0, len(self._segs), [new])
        durable.sync_dir(self.directory)
        self.recovery_point = offset
        self._set_log_start(offset)
        for run in dispose:
            if run is not None:
                run()

    def _set_log_start(self, offset: int) -> None:
        write_log_start(self.directory, offset, sync=True)
        self.table.log_start = offset

    def _retire_files(self, seg: LogSegment, keep_log: bool = False) -> Callable[[], None] | None:
        """Take `seg` out of the log's files: its files renamed to `.deleted` (the `.log`
        first; with `keep_log` the `.log` stays, about to be replaced). A reader that pinned it
        keeps it open; returns the disposer to run now, or None when the last reader runs it."""
        seg.retire(self.is_pinned(seg))
        paths = []
        stem = os.path.join(self.directory, segment_name(seg.base_offset))
        suffixes = [] if keep_log else [LOG_SUFFIX]
        suffixes += [s for s in SEGMENT_FILE_SUFFIXES if s != LOG_SUFFIX]
        for suffix in suffixes:
            with contextlib.suppress(FileNotFoundError):
                os.rename(stem + suffix, stem + suffix + ".deleted")
                paths.append(stem + suffix + ".deleted")

        def dispose() -> None:
            with self._sync_lock:
                seg.close()
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

        return dispose if self.retire(seg, dispose) else None

    # -- closing --------------------------------------------------------------------------------

    def _refuse_closed(self) -> None:
        if self.deleted:
            raise UnknownTopicError(
                f"partition {self.topic}-{self.partition} was deleted with its topic"
            )
        raise StoreClosedError(f"partition {self.topic}-{self.partition} is closed")

    def close(self, deleted: bool = False) -> None:
        """Seal the active segment (closing time entry, trimmed indexes), flush, close files.
        `deleted`: its topic is being deleted (Log.delete_topic): appends and reads of it
        raise UnknownTopicError from now on."""
        with self._lock:
            if self.closed:
                return
            self.deleted = deleted
            self.closed = True
            if self.writable:
                # the snapshot's name is made durable by the directory fsync below, with the
                # names of segments not synced yet (one fsync of the directory); a snapshot
                # lost is rebuilt from the log (producer_state.load)
                self.snapshot_producers(sync_dir_now=False)
                self.active.seal()
                with self._sync_lock:
                    for seg in self._segs:
                        seg.flush()
                    self._sync_dirs()
                self.recovery_point = self.end_offset
            for seg in self._segs:
                seg.close()
            retired, self._retired = list(self._retired.values()), {}
        for dispose in retired:
            dispose()  # readers still in them get StoreClosedError, as for any closed segment


def _batch_start_at_or_after(seg: LogSegment, offset: int) -> int:
    """Position of the first batch of `seg` whose last offset reaches `offset` (its size when
    none does): where truncating at `offset` cuts it."""
    size = seg.size
    pos = seg.position_for(offset)
    if size == 0:
        return 0
    view = seg.view(0, size)
    try:
        while pos < size:
            info = peek_batch_header(view, pos)
            if info is None or info.last_offset >= offset:
                return pos
            pos += info.size
        return size
    finally:
        view.release()


def _copy_prefix(seg: LogSegment, length: int, tmp: str) -> None:
    """Copy the first `length` bytes of the segment's `.log` (the very file it reads: its
    mapping) to `tmp` and fsync it."""
    fd = durable.open_store_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        if length:
            view = seg.view(0, length)
            try:
                durable.write_all(fd, view)
            finally:
                view.release()
        durable.sync_file(fd)
    finally:
        os.close(fd)


def _batch_base(buf: memoryview, pos: int) -> int:
    info = peek_batch_header(buf, pos)
    return info.base_offset if info is not None else -1


def key_index_capacity(config: TopicConfig) -> int:
    """Key entries a new active segment's table has room for: key_index_entries, but no more
    than its segment could fill (a record with a key takes well over 8 bytes of log), so small
    segments get small tables; a full table rolls the segment, as a full index does."""
    if not config.key_index:
        return 0
    return min(config.key_index_entries, max(MIN_KEY_INDEX_ENTRIES, config.segment_bytes // 8))


__all__ = [
    "Partition",
    "RecoveryReport",
    "finish_swap",
    "has_segments",
    "segment_layout",
    "segment_name",
    "tidy_directory",
]


def check_timestamps(cfg: TopicConfig, topic: str, low: int, high: int, now: int) -> None:
    """InvalidRecordError when CreateTime stamps in [low, high] fall outside what topic
    `topic` accepts at time `now`: message_timestamp_after_max_ms ahead of the clock,
    message_timestamp_before_max_ms behind it (Kafka's message.timestamp.*.max.ms)."""
    after, before = cfg.message_timestamp_after_max_ms, cfg.message_timestamp_before_max_ms
    if high - now > after:
        raise InvalidTimestampError(
            f"timestamp {high} is {high - now} ms ahead of the clock; topic {topic!r} accepts "
            f"at most message_timestamp_after_max_ms={after} (timestamps are in ms since the "
            "epoch)"
        )
    if now - low > before:
        raise InvalidTimestampError(
            f"timestamp {low} is {now - low} ms behind the clock; topic {topic!r} accepts at "
            f"most message_timestamp_before_max_ms={before}"
        )
