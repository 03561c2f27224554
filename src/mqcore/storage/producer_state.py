"""Idempotent-producer state of one partition (Kafka's ProducerStateManager).

For every producer id that wrote to the partition: its epoch and the metadata of its last
WINDOW (5) batches. An append of a batch carrying a producer id is checked against it under the
partition lock, before the write: an older epoch is fenced, a batch equal to one of the window's
is a duplicate (not written; its original offsets are returned), anything else must continue the
sequence. The state survives restart in Kafka's `<offset>.snapshot` files (exact byte format,
below) plus a walk of the batch headers written after the snapshot (docs/consume.md).

Snapshot file `<20-digit offset>.snapshot`, big-endian, the state of batches below that offset:

    int16  version = 1
    uint32 crc        CRC-32C of every byte after this field
    int32  count      then `count` entries of 46 bytes:
        int64 producer_id, int16 epoch, int32 last_sequence, int64 last_offset,
        int32 offset_delta (last - first offset of the last batch), int64 timestamp (its max),
        int32 coordinator_epoch (-1), int64 current_txn_first_offset (-1: none open)

Transactions (storage/txnindex.py): a producer's transactional batch opens its transaction at
the batch's base offset unless one is open; its control batch (COMMIT or ABORT marker) ends
it, and an ABORT gives the partition an `.txnindex` entry (`PartitionLog.add_aborted`). The
last stable offset is the first offset of the oldest transaction still open.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from mqcore._ext.batch import BatchInfo, EncodedBatch, peek_batch_header
from mqcore._ext.crc32c import crc32c
from mqcore.crashpoints import crash_point
from mqcore.errors import InvalidRecordError, OutOfOrderSequenceError, ProducerFencedError
from mqcore.storage import durable
from mqcore.storage.txnindex import ABORT, ATTR_TRANSACTIONAL, AbortedTxn, marker_type

if TYPE_CHECKING:
    from mqcore.config import FlushPolicy
    from mqcore.storage.segment import AppendableBatch, LogSegment

WINDOW = 5  # batches remembered per producer, as Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
SEQ_MOD = 1 << 31  # sequences run 0 .. 2^31-1 and wrap to 0
MAX_EPOCH = 0x7FFF
MAX_PRODUCER_ID = (1 << 63) - 1
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
KEEP_SNAPSHOTS = 3  # newest snapshot files kept; older ones only shorten a rebuild's walk


class PartitionLog(Protocol):
    """What rebuilding the producer state reads of a partition (storage/partition.py's
    Partition): a structural type, so this module does not import the partition above it."""

    topic: str
    partition: int
    directory: str
    flush_policy: FlushPolicy

    @property
    def segments(self) -> list[LogSegment]: ...

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    def add_aborted(self, entry: AbortedTxn) -> None:
        """Record an aborted transaction in the `.txnindex` of the segment holding its
        marker."""
        ...

    def drop_aborted_from(self, offset: int) -> None:
        """Remove the `.txnindex` entries of markers at or after `offset` (about to be walked
        again)."""
        ...


_HEAD = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
_ATTR_CONTROL = 0x20


def next_sequence(seq: int, count: int) -> int:
    """`seq` advanced by `count`, wrapping at 2^31-1 like Kafka's incrementSequence."""
    return (seq + count) % SEQ_MOD


def check_producer_fields(producer_id: int, epoch: int, sequence: int | None = None) -> None:
    """Refuse values the v2 batch header cannot hold (the encoder would truncate them)."""
    if (
        type(producer_id) is int
        and type(epoch) is int
        and 0 <= producer_id <= MAX_PRODUCER_ID
        and 0 <= epoch <= MAX_EPOCH
        and (sequence is None or (type(sequence) is int and 0 <= sequence < SEQ_MOD))
    ):
        return
    for name, value, top in (
        ("producer_id", producer_id, MAX_PRODUCER_ID),
        ("epoch", epoch, MAX_EPOCH),
        ("sequence", 0 if sequence is None else sequence, SEQ_MOD - 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            raise InvalidRecordError(f"{name} must be an int in 0..{top}, not {value!r}")


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One appended batch of a producer: its sequence range and where it went."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """A producer id's epoch and its last WINDOW batches, oldest first (all of that epoch)."""

    epoch: int
    batches: list[BatchRecord] = field(default_factory=list)
    txn_first: int = -1  # the first offset of its open transaction, -1 when none is open

    @property
    def last(self) -> BatchRecord | None:
        return self.batches[-1] if self.batches else None

    def add(self, epoch: int, rec: BatchRecord | None) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches = []
        if rec is not None:
            self.batches.append(rec)
            del self.batches[:-WINDOW]


class ProducerStateManager:
    """Producer ids -> epoch and batch window of one partition, and its snapshot files."""

    def __init__(
        self,
        name: str,
        directory: str,
        log_start: Callable[[], int],
        fsync: bool,
        on_abort: Callable[[AbortedTxn], None] | None = None,
    ):
        self.name = name  # topic-partition, for error messages
        self.directory = directory
        self._log_start = log_start
        self._fsync = fsync
        self.on_abort = on_abort  # an ABORT marker ended a transaction: index it
        self.producers: dict[int, ProducerEntry] = {}
        self.dirty = False  # changed since the newest snapshot
        self.snapshot_offset = -1  # offset of the newest snapshot on disk
        self._files_lock = threading.Lock()

    # -- the append check (caller holds the partition lock) -----------------------------------

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int) -> BatchRecord | None:
        """None when the batch may be written; its original record when it is a duplicate.

        Raises ProducerFencedError for an epoch older than the known one, and
        OutOfOrderSequenceError for a sequence that neither repeats a window batch nor
        continues the last one (a new epoch, or a producer id this partition never saw while
        its log still starts at offset 0, must start at sequence 0)."""
        last_seq = next_sequence(first_seq, count - 1)
        entry = self.producers.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {epoch} is fenced on {self.name}: the log has "
                f"epoch {entry.epoch}"
            )
        if entry is not None and epoch == entry.epoch:
            for rec in entry.batches:
                if rec.first_seq == first_seq and rec.last_seq == last_seq:
                    return rec
            last = entry.last
            expected = 0 if last is None else next_sequence(last.last_seq, 1)
            what = "the next"
        elif entry is None and self._log_start() > 0:
            return None  # its earlier batches may have been deleted with old segments (Kafka)
        else:
            expected = 0
            what = "a new epoch's first" if entry is not None else "a new producer's first"
        if first_seq != expected:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch} on {self.name}: expected sequence "
                f"{expected} ({what}), "
                f"got batch {first_seq}..{last_seq}; nothing was written"
            )
        return None

    def record(
        self, producer_id: int, epoch: int, first_seq: int, batch: EncodedBatch | AppendableBatch
    ) -> None:
        """Remember a batch just written (its base offset assigned)."""
        if batch.attributes & ATTR_TRANSACTIONAL:
            self._begin_txn(producer_id, epoch, batch.base_offset)
        self._update(
            producer_id,
            epoch,
            BatchRecord(
                first_seq,
                next_sequence(first_seq, batch.count - 1),
                batch.base_offset,
                batch.last_offset,
                batch.max_timestamp,
            ),
        )

    def _update(self, producer_id: int, epoch: int, rec: BatchRecord | None) -> None:
        entry = self.producers.get(producer_id)
        if entry is None:
            self.producers[producer_id] = ProducerEntry(epoch, [] if rec is None else [rec])
        else:
            entry.add(epoch, rec)
        self.dirty = True

    def append(
        self,
        batches: Sequence[EncodedBatch],
        producer_id: int,
        epoch: int,
        first_seq: int,
        write: Callable[[EncodedBatch], int],
    ) -> tuple[int, BatchRecord | None]:
        """Check and write the consecutive-sequence pieces of one append, piece by piece.

        Returns (base offset of the first piece, the first piece's original record when every
        piece was a duplicate, else None). Each piece is checked after the previous one was
        recorded, so a resend whose first pieces reached the log before a crash writes only
        the rest."""
        first_base = -1
        first_dup: BatchRecord | None = None
        all_dup = True
        seq = first_seq
        for i, batch in enumerate(batches):
            dup = self.check(producer_id, epoch, seq, batch.count)
            if dup is None:
                all_dup = False
                base = write(batch)
                self.record(producer_id, epoch, seq, batch)
            else:
                base = dup.base_offset
            if i == 0:
                first_base, first_dup = base, dup
            seq = next_sequence(seq, batch.count)
        return first_base, first_dup if all_dup else None

    def next_sequence_for(self, producer_id: int, epoch: int) -> int:
        """Where a producer with this id and epoch goes on: after its last batch, or 0."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch or entry.last is None:
            return 0
        return next_sequence(entry.last.last_seq, 1)

    def known_epoch(self, producer_id: int) -> int | None:
        entry = self.producers.get(producer_id)
        return None if entry is None else entry.epoch

    # -- rebuilding from batch headers --------------------------------------------------------

    def apply_batch(self, info: BatchInfo, marker: int | None = None) -> None:
        """Take in one batch header as written (no record decode, no sequence check): how
        load() rebuilds the state, and a replica copying its leader (Kafka's replication
        origin). `marker`: a control batch's type (txnindex.marker_type)."""
        if info.producer_id < 0:
            return
        if info.attributes & _ATTR_CONTROL:
            self._update(info.producer_id, info.producer_epoch, None)  # markers carry no seq
            if marker is not None:
                self._end_txn(info.producer_id, info.base_offset, marker)
            return
        if info.attributes & ATTR_TRANSACTIONAL:
            self._begin_txn(info.producer_id, info.producer_epoch, info.base_offset)
        self._update(info.producer_id, info.producer_epoch, _record_of(info))

    # -- transactions -------------------------------------------------------------------------

    def _begin_txn(self, producer_id: int, epoch: int, offset: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        if entry.txn_first < 0:
            entry.txn_first = offset
            self.dirty = True

    def _end_txn(self, producer_id: int, marker_offset: int, marker: int) -> None:
        """A marker at `marker_offset` ends the producer's transaction (one with no batch
        here starts and ends at the marker, as Kafka's appendEndTxnMarker)."""
        entry = self.producers.get(producer_id)
        first = marker_offset
        if entry is not None and entry.txn_first >= 0:
            first = entry.txn_first
            entry.txn_first = -1
            self.dirty = True
        if marker == ABORT and self.on_abort is not None:
            lso = self.first_unstable_offset()
            self.on_abort(AbortedTxn(producer_id, first, marker_offset,
                                     marker_offset + 1 if lso is None else lso))  # fmt: skip

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none open)."""
        firsts = [e.txn_first for e in self.producers.values() if e.txn_first >= 0]
        return min(firsts) if firsts else None

    def open_transactions(self) -> dict[int, int]:
        """producer ID -> the first offset of its open transaction."""
        return {p: e.txn_first for p, e in self.producers.items() if e.txn_first >= 0}

    # -- snapshots ------------------------------------------------------------------------------

    def encode_snapshot(self) -> bytes:
        """The state as Kafka's snapshot bytes (one entry per producer: its last batch)."""
        body = bytearray(_ENTRY.size * len(self.producers))
        pos = 0
        for pid in sorted(self.producers):
            entry = self.producers[pid]
            last = entry.last
            if last is None:
                fields = (pid, entry.epoch, -1, -1, 0, -1, -1, entry.txn_first)
            else:
                fields = (
                    pid,
                    entry.epoch,
                    last.last_seq,
                    last.last_offset,
                    last.last_offset - last.base_offset,
                    last.max_timestamp,
                    -1,
                    entry.txn_first,
                )
            _ENTRY.pack_into(body, pos, *fields)
            pos += _ENTRY.size
        tail = struct.pack(">i", len(self.producers)) + bytes(body)
        return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(tail)) + tail

    def write_snapshot(self, offset: int, data: bytes, sync_dir_now: bool = True) -> bool:
        """Write `data` as `<offset>.snapshot` (temp file, fsync, rename); keep the newest
        KEEP_SNAPSHOTS files. With `sync_dir_now=False` the directory is not fsync'd here:
        returns whether the caller owes it that fsync (the policy syncs snapshots)."""
        with self._files_lock:
            path = snapshot_path(self.directory, offset)
            tmp = f"{path}.{threading.get_ident()}.tmp"
            durable.write_atomic(path, data, sync=self._fsync, tmp=tmp, sync_dir_now=sync_dir_now)
            crash_point("producer_snapshot.after_write")
            self.snapshot_offset = max(self.snapshot_offset, offset)
            self.prune_snapshots()
        return self._fsync and not sync_dir_now

    def prune_snapshots(self) -> None:
        """Delete all but the newest KEEP_SNAPSHOTS snapshot files: after each write, and at
        load, which finishes the pruning of a write a crash cut short."""
        for old in snapshot_offsets(self.directory)[:-KEEP_SNAPSHOTS]:
            _unlink(snapshot_path(self.directory, old))


def _record_of(info: BatchInfo) -> BatchRecord:
    return BatchRecord(
        info.base_sequence,
        next_sequence(info.base_sequence, info.last_offset_delta),
        info.base_offset,
        info.last_offset,
        info.max_timestamp,
    )


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def snapshot_offsets(directory: str) -> list[int]:
    """Offsets of the `.snapshot` files of a partition directory, ascending."""
    out = []
    for name in os.listdir(directory):
        stem = name[: -len(SNAPSHOT_SUFFIX)]
        if name.endswith(SNAPSHOT_SUFFIX) and len(stem) == 20 and stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def read_snapshot(path: str) -> dict[int, ProducerEntry]:
    """Parse a snapshot file; ValueError when it is not a whole, valid version-1 snapshot."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _HEAD.size:
        raise ValueError(f"{len(data)} bytes, shorter than the header")
    version, crc, count = _HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise ValueError(f"unknown snapshot version {version}")
    if crc32c(memoryview(data)[6:]) != crc:
        raise ValueError("CRC mismatch")
    if count < 0 or len(data) != _HEAD.size + count * _ENTRY.size:
        raise ValueError(f"{len(data)} bytes do not hold {count} entries")
    out: dict[int, ProducerEntry] = {}
    for i in range(count):
        pid, epoch, last_seq, last_off, delta, ts, _, txn_first = _ENTRY.unpack_from(
            data, _HEAD.size + i * _ENTRY.size
        )
        if pid < 0 or epoch < 0 or delta < 0 or pid in out or txn_first < -1:
            raise ValueError(f"entry {i} is invalid (producer {pid}, epoch {epoch})")
        batches = []
        if last_off >= 0:
            if not 0 <= last_seq < SEQ_MOD:
                raise ValueError(f"entry {i} has sequence {last_seq}")
            batches.append(
                BatchRecord(
                    next_sequence(last_seq, SEQ_MOD - delta % SEQ_MOD),
                    last_seq,
                    last_off - delta,
                    last_off,
                    ts,
                )
            )
        out[pid] = ProducerEntry(epoch, batches, txn_first)
    return out


def empty(part: PartitionLog) -> ProducerStateManager:
    """The state of a partition with no producer yet (a new one, or before load reads)."""
    return ProducerStateManager(
        f"{part.topic}-{part.partition}",
        part.directory,
        lambda: part.start_offset,
        part.flush_policy.mode != "os",
        part.add_aborted,
    )


def load(part: PartitionLog, read_only: bool = False) -> ProducerStateManager:
    """The partition's producer state after open (and recovery): the newest valid snapshot at
    or below the log end (newer and corrupt ones are deleted), the batch headers after it,
    then older batch headers for producers whose window is still short (docs/consume.md). The
    walk indexes again the ABORT markers it meets (their `.txnindex` entries dropped first: a
    crash may have torn them). `read_only`: nothing on disk changes and the `.txnindex` files
    are trusted as they are (a Kafka log directory)."""
    mgr = empty(part)
    if read_only:
        mgr.on_abort = None
    start, end = part.start_offset, part.end_offset
    if not read_only:
        for name in os.listdir(part.directory):
            if name.endswith(".tmp") and SNAPSHOT_SUFFIX + "." in name:
                _unlink(os.path.join(part.directory, name))  # a write a crash cut short
    from_offset = start
    for off in reversed(snapshot_offsets(part.directory)):
        path = snapshot_path(part.directory, off)
        if off > end or off < start:
            if not read_only:
                _unlink(path)
            continue
        try:
            mgr.producers = read_snapshot(path)
        except (OSError, ValueError):
            if not read_only:
                _unlink(path)
            continue
        from_offset = off
        mgr.snapshot_offset = off
        break
    if not read_only:
        part.drop_aborted_from(from_offset)
    for info, marker in _headers(part, from_offset, end):
        mgr.apply_batch(info, marker)
    _backfill(mgr, part, from_offset)
    mgr.dirty = from_offset != end
    if not read_only:
        mgr.prune_snapshots()
    return mgr


def _headers(part: PartitionLog, offset: int, end: int) -> Iterator[tuple[BatchInfo, int | None]]:
    """Headers of the batches holding offsets [offset, end), in log order."""
    segs = part.segments
    for i, seg in enumerate(segs):
        # by base offsets only: a sealed segment nobody reads stays unopened
        upper = segs[i + 1].base_offset if i + 1 < len(segs) else end
        if upper <= offset or seg.base_offset >= end:
            continue
        pos = seg.position_for(offset) if offset > seg.base_offset else 0
        yield from _segment_headers(seg, pos, offset)


def _segment_headers(
    seg: LogSegment, pos: int, min_offset: int
) -> Iterator[tuple[BatchInfo, int | None]]:
    """(header, marker type of a control batch) of the segment's batches from `pos`."""
    size = seg.size
    if size == 0:
        return
    view = seg.view(0, size)
    try:
        while pos < size:
            info = peek_batch_header(view, pos)
            if info is None or info.size <= 0:
                return
            at, pos = pos, pos + info.size
            if info.last_offset >= min_offset:
                control = info.attributes & _ATTR_CONTROL and pos <= size
                yield info, marker_type(view, at) if control else None
    finally:
        view.release()


def _backfill(mgr: ProducerStateManager, part: PartitionLog, snapshot_offset: int) -> None:
    """Complete the windows a snapshot cut short: walk whole segments before the earliest known
    batch, newest segment first, for producers with fewer than WINDOW batches whose oldest known
    batch does not start its epoch at sequence 0. Stops at another epoch or a sequence break."""
    need = {
        pid: e
        for pid, e in mgr.producers.items()
        if e.batches and len(e.batches) < WINDOW and e.batches[0].first_seq != 0
        and e.batches[0].base_offset < snapshot_offset
    }  # fmt: skip
    if not need:
        return
    before = max(e.batches[0].base_offset for e in need.values())
    for seg in reversed([s for s in part.segments if s.base_offset < before]):
        found: dict[int, list[BatchRecord]] = {}
        broken: set[int] = set()  # met an older epoch: nothing earlier belongs to the window
        for info, _ in _segment_headers(seg, 0, -1):
            entry = need.get(info.producer_id)
            if entry is None or info.attributes & _ATTR_CONTROL:
                continue
            if info.base_offset >= entry.batches[0].base_offset:
                continue
            if info.producer_epoch != entry.epoch:
                found[info.producer_id] = []
                broken.add(info.producer_id)
                continue
            found.setdefault(info.producer_id, []).append(_record_of(info))
        for pid, recs in found.items():
            entry = need[pid]
            done = pid in broken
            for rec in reversed(recs):  # a run of consecutive sequences ending at the window
                if next_sequence(rec.last_seq, 1) != entry.batches[0].first_seq:
                    done = True
                    break
                entry.batches.insert(0, rec)
                if len(entry.batches) >= WINDOW or rec.first_seq == 0:
                    done = True
                    break
            if done:
                del need[pid]
        if not need:
            return


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = [
    "WINDOW",
    "BatchRecord",
    "ProducerEntry",
    "ProducerStateManager",
    "check_producer_fields",
    "load",
    "next_sequence",
    "read_snapshot",
    "snapshot_offsets",
    "snapshot_path",
]
