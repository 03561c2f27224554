"""Compaction (Kafka's log cleaner): keep the latest record of every key, offsets unchanged.

One pass over a partition (docs/consume.md "Compaction"):
1. Map every key to its latest offset over the stable part of the log as it is when the pass
   starts: below the last stable offset (the active segment included), as Kafka's cleaner.
   Keyless records, control batches and the records of aborted Kafka transactions do not
   enter the map, so neither an aborted nor a still-open transaction's record ever shadows a
   committed one.
2. Rewrite each sealed segment that ends at or below the last stable offset (never the active
   one; the pass stops at the first that does not): a record of an aborted transaction goes
   (Kafka's cleaner discards them too: no read_committed reader ever sees them, and a
   read_uncommitted reader of a compacted topic no longer does); any other stays iff it is
   the latest for its key; a tombstone (value None) that is the latest stays until
   `delete_retention_ms` after the pass that first cleaned its segment (the segment's
   `.cleanmark`), then goes. Keyless
   records go. Control batches are kept whole. A batch keeps its base offset, offset range,
   codec, timestamps, producer fields and leader epoch; each record keeps its offset (gaps
   appear), timestamp, key, value and headers. A batch left empty is dropped.
3. A segment that loses nothing is not rewritten (only its `.cleanmark` is written, once).
   Otherwise the new segment is built in the scratch directory by the segment code (log,
   then its indexes rebuilt from it), fsync'd, and swapped in: `.cleaned` -> `.swap` (the
   `.log` last: the commit), then loader.finish_swap: each new index and the `.cleanmark`
   replaces the old file of its kind, the merged later segments are removed, and the new
   `.log` replaces the old one last. Every step is one atomic rename, so a reader in another
   process always finds one consistent set of files (loader.segment_layout), and
   loader.tidy_directory finishes or undoes a crash at any step. Readers in this process
   that pinned an old segment go on reading its open files.

`<base>.cleanmark` (20 bytes): magic b"MQCM", version byte 1, three zero bytes, int64
big-endian `first_cleaned_ms` (wall-clock ms of the first pass that cleaned this segment), then
crc32c of the first 16 bytes, big-endian uint32. Missing or invalid means "never cleaned": the
segment counts as dirty and the next pass starts its tombstone clock (tombstones live longer,
never shorter).
"""

from __future__ import annotations

import bisect
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mqcore import compression as codecs
from mqcore._ext.batch import (
    TIMESTAMP_LOG_APPEND_TIME,
    BatchInfo,
    Message,
    decode_messages,
    encode_batch,
    read_batch_info,
)
from mqcore._ext.crc32c import crc32c
from mqcore.crashpoints import crash_point
from mqcore.errors import CorruptRecordError
from mqcore.storage import durable
from mqcore.storage.loader import (
    CLEANMARK,
    CLEANMARK_MAGIC,
    CLEANMARK_SUFFIX,
    SCRATCH_DIR,
    SEGMENT_FILE_SUFFIXES,
    SWAP_SUFFIX,
    finish_swap,
    read_cleanmark_fields,
    segment_layout,
)
from mqcore.storage.partition import Partition, key_index_capacity
from mqcore.storage.retention import disposer
from mqcore.storage.segment import LOG_SUFFIX, MAX_DECOMPRESSED, LogSegment, segment_name
from mqcore.storage.txnindex import TXNINDEX_SUFFIX, read_entries, txnindex_path, write_entries

DECODE_CHUNK = 4096  # records decoded at a time while building the key map

# progress(done, total): sealed segments handled so far, of all in the pass
Progress = Callable[[int, int], None]


@dataclass
class CompactionReport:
    """What a compaction pass did."""

    cleaned_segments: list[str] = field(default_factory=list)  # rewritten: "<topic>-<p>/<base>.log"
    segments_seen: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_before: int = 0  # of the sealed segments looked at
    bytes_after: int = 0

    def merge(self, other: CompactionReport) -> None:
        self.cleaned_segments.extend(other.cleaned_segments)
        self.segments_seen += other.segments_seen
        self.records_removed += other.records_removed
        self.tombstones_removed += other.tombstones_removed
        self.bytes_before += other.bytes_before
        self.bytes_after += other.bytes_after

    def to_json(self) -> dict[str, object]:
        return {
            "cleaned_segments": list(self.cleaned_segments),
            "segments_seen": self.segments_seen,
            "records_removed": self.records_removed,
            "tombstones_removed": self.tombstones_removed,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
        }


def applies(cleanup_policy: str) -> bool:
    return "compact" in cleanup_policy.split(",")


# -- the tombstone clock ----------------------------------------------------------------------


def cleanmark_path(seg: LogSegment) -> str:
    return os.path.join(seg.directory, segment_name(seg.base_offset) + CLEANMARK_SUFFIX)


def encode_cleanmark(first_cleaned_ms: int, end_offset: int) -> bytes:
    head = CLEANMARK.pack(CLEANMARK_MAGIC, 1, first_cleaned_ms, end_offset)
    return head + crc32c(head).to_bytes(4, "big")


def read_cleanmark(path: str) -> int | None:
    """The `first_cleaned_ms` a `.cleanmark` holds, or None (missing or not valid)."""
    fields = read_cleanmark_fields(path)
    return None if fields is None else fields[0]


def write_cleanmark(path: str, first_cleaned_ms: int, end_offset: int) -> None:
    """Write a `.cleanmark` atomically and durably (storage/durable.py write_atomic)."""
    durable.write_atomic(path, encode_cleanmark(first_cleaned_ms, end_offset))


def dirty_bytes(part: Partition) -> tuple[int, int]:
    """(bytes of sealed segments never cleaned, bytes of all sealed segments)."""
    sealed = part.segment_sizes()[:-1]
    dirty = sum(size for s, size in sealed if read_cleanmark(cleanmark_path(s)) is None)
    return dirty, sum(size for _, size in sealed)


def dirty_ratio(part: Partition) -> float:
    dirty, total = dirty_bytes(part)
    return dirty / total if total else 0.0


# -- the pass ---------------------------------------------------------------------------------


def _messages(part: Partition, seg: LogSegment, size: int, verify_crc: bool) -> Iterator[Message]:
    """Every non-control record of the segment's first `size` bytes, in bounded chunks."""
    view = seg.view(0, size)
    try:
        pos, next_offset = 0, 0
        while pos < size:
            out: list[Message] = []
            before = (pos, next_offset)
            pos, next_offset = decode_messages(
                view, pos, part.topic, part.partition, next_offset, DECODE_CHUNK, out,
                verify_crc, MAX_DECOMPRESSED, seg.log_path, 0,
            )  # fmt: skip
            yield from out
            if (pos, next_offset) == before:
                raise CorruptRecordError("batch cut short", path=seg.log_path, position=pos)
    finally:
        view.release()


@dataclass
class Stable:
    """The part of the log a pass may clean: below `offset` (the last stable offset when the
    pass starts), without the batches of aborted transactions ([first, last] offsets each,
    sorted and disjoint: Partition.aborted_ranges)."""

    offset: int
    firsts: list[int]
    lasts: list[int]

    @classmethod
    def of(cls, part: Partition) -> Stable:
        stable = part.last_stable_offset
        ranges = sorted(part.aborted_ranges(part.start_offset, stable))
        return cls(stable, [a for a, _ in ranges], [b for _, b in ranges])

    def aborted(self, offset: int) -> bool:
        """Whether the record at `offset` is in a batch of an aborted transaction."""
        i = bisect.bisect_right(self.firsts, offset) - 1
        return i >= 0 and offset <= self.lasts[i]


def build_key_map(
    part: Partition, segs: list[tuple[LogSegment, int]], verify_crc: bool, stable: Stable
) -> dict[bytes, int]:
    """key -> the offset of its latest stable record (Stable), over the given segments (log
    order)."""
    latest: dict[bytes, int] = {}
    for seg, size in segs:
        if seg.base_offset >= stable.offset:
            break
        for m in _messages(part, seg, size, verify_crc):
            if m.offset >= stable.offset:
                break
            if m.key is not None and not stable.aborted(m.offset):
                latest[m.key] = m.offset
    return latest


@dataclass
class _Filtered:
    """One sealed segment after filtering: what stays, as pieces to write in order (a
    (position, size) range of the old log copied as it is, or a re-encoded batch)."""

    seg: LogSegment
    old_size: int
    mark: int | None  # its first_cleaned_ms, None: never cleaned
    pieces: list[bytes | tuple[int, int]] = field(default_factory=list)
    changed: bool = False
    removed: int = 0
    tombstones_removed: int = 0
    tombstones_left: int = 0
    size: int = 0


def _filter_segment(
    part: Partition,
    seg: LogSegment,
    size: int,
    latest: dict[bytes, int],
    stable: Stable,
    mark: int | None,
    now: int,
    verify_crc: bool,
) -> _Filtered:
    """The segment's batches with only the records compaction keeps (module doc)."""
    out = _Filtered(seg, size, mark)
    drop_tombstones = mark is not None and now >= mark + part.config.delete_retention_ms
    view = seg.view(0, size)
    try:
        pos = 0
        while pos < size:
            info = read_batch_info(view, pos, verify_crc, seg.log_path, 0)
            if info is None or pos + info.size > size:
                raise CorruptRecordError("batch cut short", path=seg.log_path, position=pos)
            at = pos
            pos += info.size
            if info.is_control:
                out.pieces.append((at, info.size))
                continue
            if stable.aborted(info.base_offset):  # an aborted transaction's batch, whole
                out.changed = True
                out.removed += info.records_count
                continue
            records: list[Message] = []
            decode_messages(
                view[at:pos], 0, part.topic, part.partition, 0, 1 << 31, records, False,
                MAX_DECOMPRESSED, seg.log_path, at,
            )  # fmt: skip
            kept = []
            for m in records:
                if m.key is None or latest.get(m.key) != m.offset:
                    out.removed += 1
                elif m.value is None and drop_tombstones:
                    out.removed += 1
                    out.tombstones_removed += 1
                else:
                    kept.append(m)
                    out.tombstones_left += m.value is None
            if len(kept) == len(records):
                out.pieces.append((at, info.size))
            else:
                out.changed = True
                if kept:
                    out.pieces.append(_encode(info, kept))
    finally:
        view.release()
    out.size = sum(p[1] if isinstance(p, tuple) else len(p) for p in out.pieces)
    return out


def _encode(info: BatchInfo, kept: list[Message]) -> bytes:
    """A batch of the kept records with the original batch's offsets, codec and fields."""
    batch = encode_batch(
        [m.value for m in kept],
        [m.key for m in kept],
        [list(m.headers) for m in kept],
        [m.timestamp for m in kept],
        0,
        info.codec,
        info.max_timestamp if info.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else -1,
        info.producer_id,
        info.producer_epoch,
        info.base_sequence,
        info.is_transactional,
        info.leader_epoch,
        compress=codecs.compress,
        offset_deltas=[m.offset - info.base_offset for m in kept],
        last_offset_delta=info.last_offset_delta,
    )
    batch.set_base_offset(info.base_offset)
    return batch.tobytes()


@dataclass
class _Group:
    """Consecutive filtered segments that become one cleaned segment (Kafka groups small
    cleaned segments so the log does not keep a file per rolled segment forever)."""

    members: list[_Filtered] = field(default_factory=list)
    size: int = 0
    tombstone_mark: int | None = None  # the clock of the tombstones it holds (one for all)

    def accepts(self, f: _Filtered, limit: int, now: int) -> bool:
        """Whether `f` can join: the result stays within segment_bytes and a 32-bit offset
        range, and the group's tombstones share one clock (a merge never moves a tombstone's
        clock, so none lives longer or shorter than its delete_retention_ms)."""
        if not self.members:
            return True
        if self.size + f.size > limit:
            return False
        if f.seg.next_offset - 1 - self.members[0].seg.base_offset > 0x7FFFFFFF:
            return False
        if f.tombstones_left and self.tombstone_mark is not None:
            return self.tombstone_mark == (now if f.mark is None else f.mark)
        return True

    def add(self, f: _Filtered, now: int) -> None:
        self.members.append(f)
        self.size += f.size
        if f.tombstones_left:
            self.tombstone_mark = now if f.mark is None else f.mark

    def mark(self, now: int) -> int:
        """The group's first_cleaned_ms: its tombstones' clock, else the newest member's."""
        if self.tombstone_mark is not None:
            return self.tombstone_mark
        return max(now if f.mark is None else f.mark for f in self.members)


def _build_cleaned(part: Partition, group: _Group, sizes: dict[LogSegment, int], now: int) -> None:
    """Write the group's new segment as `<base>.*.cleaned`: the log in the scratch directory,
    its indexes rebuilt from it by the segment code, all fsync'd, then moved in."""
    cfg = part.config
    base = group.members[0].seg.base_offset
    end = group.members[-1].seg.next_offset
    scratch = os.path.join(part.directory, SCRATCH_DIR)
    if os.path.isdir(scratch):
        shutil.rmtree(scratch)
    os.makedirs(scratch)
    stem = segment_name(base)
    fd = durable.open_file(os.path.join(scratch, stem + LOG_SUFFIX), os.O_WRONLY | os.O_CREAT)
    try:
        for f in group.members:
            view = f.seg.view(0, sizes[f.seg])
            try:
                for piece in f.pieces:
                    if isinstance(piece, tuple):
                        data = view[piece[0] : piece[0] + piece[1]]
                    else:
                        data = memoryview(piece)
                    durable.write_all(fd, data)
            finally:
                view.release()
        durable.sync_data(fd)
    finally:
        os.close(fd)
    seg = LogSegment(
        scratch,
        base,
        writable=True,
        index_interval_bytes=cfg.index_interval_bytes,
        max_index_bytes=cfg.segment_index_bytes,
        key_index_capacity=key_index_capacity(cfg),
    )
    try:
        seg.rebuild(verify_crc=True)
        seg.attach_key_index(active=False)
        seg.seal(sync=True)
    finally:
        seg.close()
    mark = encode_cleanmark(group.mark(now), end)
    durable.write_file(os.path.join(scratch, stem + CLEANMARK_SUFFIX), mark)
    # the merged segments' aborted transactions, in marker order: their records and markers
    # stay (a batch keeps its producer fields and offsets), so a read_committed reader still
    # skips them
    aborted = [e for f in group.members for e in read_entries(txnindex_path(f.seg.log_path))]
    if aborted:
        write_entries(os.path.join(scratch, stem + TXNINDEX_SUFFIX), aborted, sync=True)
    for suffix in SEGMENT_FILE_SUFFIXES:
        path = os.path.join(scratch, stem + suffix)
        if os.path.exists(path):
            fd = durable.open_file(path, os.O_RDONLY)
            try:
                durable.sync_file(fd)
            finally:
                os.close(fd)
            os.rename(path, os.path.join(part.directory, stem + suffix + ".cleaned"))
    shutil.rmtree(scratch)
    durable.sync_dir(part.directory)


def _rename_all(directory: str, stem: str, old: str, new: str) -> None:
    """Rename `<stem><suffix><old>` to `<stem><suffix><new>` for each suffix, the .log last."""
    for suffix in SEGMENT_FILE_SUFFIXES:
        path = os.path.join(directory, stem + suffix)
        if os.path.exists(path + old):
            os.rename(path + old, path + new)
    durable.sync_dir(directory)


def _swap(part: Partition, olds: list[LogSegment]) -> None:
    """Swap consecutive segments for their `.cleaned` replacement (the first one's base
    offset) on disk (module docstring), then in memory: readers that pinned an old segment go
    on reading its open files."""
    directory, base = part.directory, olds[0].base_offset
    stem = segment_name(base)
    crash_point("compact.after_cleaned")
    _rename_all(directory, stem, ".cleaned", SWAP_SUFFIX)  # the .log.swap is the commit
    crash_point("compact.after_swap")
    for old in olds:
        # its files are replaced or removed next: it never writes one again, and a reader
        # that holds it keeps the files it has open
        old.retire(part.is_pinned(old))
    new_files = dict(segment_layout(directory))[base]
    finish_swap(directory, base, new_files)
    crash_point("compact.after_final")
    disposers = [disposer(part, old, [], "compact.before_unlink") for old in olds]
    part.replace_segments(olds, disposers)


def compact_partition(
    part: Partition,
    now: int,
    verify_crc: bool = True,
    progress: Callable[[int], None] | None = None,
) -> CompactionReport:
    """One compaction pass over one partition; `progress(n)` after each sealed segment."""
    report = CompactionReport()
    with part.maintenance:
        segs = part.pin_for_maintenance()
        if segs is None:
            return report
        sizes = dict(segs)
        pinned = [s for s, _ in segs]

        def finish(group: _Group) -> None:
            olds = [f.seg for f in group.members]
            first = group.members[0]
            if len(olds) > 1 or first.changed:
                _build_cleaned(part, group, sizes, now)
                _swap(part, olds)
                report.cleaned_segments.append(
                    f"{part.topic}-{part.partition}/{segment_name(olds[0].base_offset)}.log"
                )
            elif first.mark is None:
                write_cleanmark(cleanmark_path(first.seg), now, first.seg.next_offset)
            for seg in olds:
                pinned.remove(seg)
            part.unpin(olds)  # swapped-out segments go once other readers leave them

        try:
            stable = Stable.of(part)
            latest = build_key_map(part, segs, verify_crc, stable)
            group = _Group()
            for seg, size in segs[:-1]:
                if seg.next_offset > stable.offset:
                    break  # it holds records of a transaction still open: not cleaned yet
                mark = read_cleanmark(cleanmark_path(seg))
                f = _filter_segment(part, seg, size, latest, stable, mark, now, verify_crc)
                report.segments_seen += 1
                report.bytes_before += size
                report.bytes_after += f.size
                report.records_removed += f.removed
                report.tombstones_removed += f.tombstones_removed
                if not group.accepts(f, part.config.segment_bytes, now):
                    finish(group)
                    group = _Group()
                group.add(f, now)
                if progress is not None:
                    progress(1)
            if group.members:
                finish(group)
        finally:
            part.unpin(pinned)
    return report


def compact(
    parts: list[Partition], now: int, verify_crc: bool = True, progress: Progress | None = None
) -> CompactionReport:
    """Compaction over `parts` (the caller picked those whose cleanup policy has "compact")."""
    report = CompactionReport()
    total = sum(max(0, len(p.segments) - 1) for p in parts)
    done = [0]

    def step(n: int) -> None:
        done[0] = min(total, done[0] + n)
        if progress is not None:
            progress(done[0], total)

    if progress is not None:
        progress(0, total)
    for part in parts:
        report.merge(compact_partition(part, now, verify_crc, step))
    return report


__all__ = [
    "CompactionReport",
    "compact",
    "compact_partition",
    "dirty_ratio",
    "read_cleanmark",
    "read_cleanmark_fields",
    "write_cleanmark",
]
