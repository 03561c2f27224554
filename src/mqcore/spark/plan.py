"""Planning a Spark batch read: parsed options + an open store -> what each task reads.

No Spark imports: tests drive it with plain stores.

  1. the subscription names topic-partitions (subscribe / subscribePattern / assign);
  2. each side of the range resolves per partition: earliest / latest / an offset, or the first
     offset whose timestamp is >= T (Kafka's offsetsForTimes rule) through the time index;
  3. failOnDataLoss decides what a range reaching outside [start_offset, end_offset] means;
  4. ranges split by Spark's rule (maxRecordsPerPartition, then minPartitions over the ranges
     that get more than one piece; SPARK-36576), each cut moved onto a nearby segment boundary.

PySpark keeps a batch read's partitions() per DataFrame and hands them to every later query
of it (docs/spark.md "Reusing a DataFrame"), so what planning fixes must hold for any of those
queries. A task therefore reads a ReadSlot, not offsets: the cuts between the pieces of one
partition are fixed when planned; the outer ends (the starting and ending options) are
resolved again when the task opens the store (read_ranges), as Kafka's source binds earliest and
latest per task; and the first slot also reads every partition the subscription names by then
that the plan had no piece of (created since, or empty when planned).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from mqcore.errors import InvalidConfigError, OffsetOutOfRangeError
from mqcore.spark.options import EARLIEST, LATEST, Bound, ReadOptions, Subscription, TopicPartition
from mqcore.store import Store


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Piece:
    """One planned piece of a partition's range: the offsets of [lo, hi) inside the range as
    resolved when the task reads it. lo None: from the range's start; hi None: to its end."""

    topic: str
    partition: int
    lo: int | None = None
    hi: int | None = None


@dataclass(frozen=True)
class ReadSlot:
    """What one Spark task of a batch read reads: its piece, and, in the plan's first slot,
    every partition of the subscription outside `planned` (None elsewhere)."""

    piece: Piece | None
    planned: frozenset[TopicPartition] | None = None


def plan_read(store: Store, opts: ReadOptions) -> list[OffsetRange]:
    """The non-empty offset ranges of the read as of now, split into Spark input partitions."""
    tps = topic_partitions(store, opts.subscription)
    ranges = resolve_ranges(store, opts, tps)
    return split_ranges(
        ranges, store.segment_offsets, opts.min_partitions, opts.max_records_per_partition
    )


def plan_slots(store: Store, opts: ReadOptions) -> list[ReadSlot]:
    """The read's tasks: plan_read's pieces with each partition's outer ends left open, the
    first slot also reading the partitions the plan has no piece of. Never empty."""
    pieces = plan_read(store, opts)
    first = {(r.topic, r.partition): r.start for r in reversed(pieces)}
    last = {(r.topic, r.partition): r.end for r in pieces}
    slots = [
        ReadSlot(
            Piece(
                r.topic,
                r.partition,
                None if first[(r.topic, r.partition)] == r.start else r.start,
                None if last[(r.topic, r.partition)] == r.end else r.end,
            )
        )
        for r in pieces
    ]
    planned = frozenset(last)
    if not slots:
        return [ReadSlot(None, planned)]
    return [ReadSlot(slots[0].piece, planned), *slots[1:]]


def read_ranges(store: Store, opts: ReadOptions, slot: ReadSlot) -> list[OffsetRange]:
    """The offsets a task reads for `slot`, with the read's bounds resolved and checked
    against the log now: its piece's share, then (first slot) the unplanned partitions."""
    out: list[OffsetRange] = []
    piece = slot.piece
    if piece is not None:
        tp = (piece.topic, piece.partition)
        (rng,) = resolve_ranges(store, opts, [tp], validate=False)
        lo = rng.start if piece.lo is None else max(rng.start, piece.lo)
        hi = rng.end if piece.hi is None else min(rng.end, piece.hi)
        if lo < hi:
            out.append(OffsetRange(rng.topic, rng.partition, lo, hi))
    if slot.planned is not None:
        now = topic_partitions(store, opts.subscription)
        ranges = resolve_ranges(store, opts, now)  # checks JSON bounds as planning does
        out.extend(r for r in ranges if (r.topic, r.partition) not in slot.planned and r.size)
    return out


def resolve_ranges(
    store: Store, opts: ReadOptions, tps: Sequence[TopicPartition], validate: bool = True
) -> list[OffsetRange]:
    """Each partition's range from the starting and ending options, checked against the log
    (failOnDataLoss). `validate`: per-partition JSON must name exactly `tps`."""
    strategy = opts.starting_strategy
    starts = resolve_bound(store, opts.starting, tps, strategy, True, validate, opts.committed)
    ends = resolve_bound(store, opts.ending, tps, strategy, False, validate, opts.committed)
    return [checked_range(store, OffsetRange(t, p, starts[(t, p)], ends[(t, p)]), opts)
            for t, p in tps]  # fmt: skip


def topic_partitions(store: Store, sub: Subscription) -> list[TopicPartition]:
    """The topic-partitions a subscription reads, in (topic, partition) order. A pattern never
    takes internal (`__`) topics, as Kafka's consumer excludes internal topics; `subscribe`
    and `assign` may name them."""
    if sub.kind == "subscribe":
        return [(t, p) for t in sorted(sub.topics) for p in store.available_partitions(t)]
    if sub.kind == "subscribePattern":
        topics = [t for t in store.topics() if not t.startswith("__") and sub.matches(t)]
        return [(t, p) for t in topics for p in store.available_partitions(t)]
    for t, p in sub.assigned:
        store.start_offset(t, p)  # UnknownTopicError / UnknownPartitionError naming it
    return list(sub.assigned)


def resolve_bound(
    store: Store,
    bound: Bound,
    tps: Sequence[TopicPartition],
    strategy: str,
    starting: bool,
    validate: bool = True,
    committed: bool = False,
) -> dict[TopicPartition, int]:
    """The offset each partition's range starts (or ends) at; `committed`
    (kafka.isolation.level=read_committed): "latest" is the last stable offset."""
    if validate and bound.per_partition and set(bound.offsets) != set(tps):
        raise InvalidConfigError(
            f"option {bound.option!r} must name every partition read and no other: it names "
            f"{_names(bound.offsets)}, the subscription reads {_names(tps)}"
            + (" (use -2 for earliest, -1 for latest)" if bound.kind == "offsets" else "")
        )
    return {tp: _resolve_one(store, bound, tp, strategy, starting, committed) for tp in tps}


def latest(store: Store, t: str, p: int, committed: bool) -> int:
    """Where a read of the partition ends now: its end, or its last stable offset for a
    read_committed reader (Kafka's consumer's endOffsets)."""
    return store.last_stable_offset(t, p) if committed else store.end_offset(t, p)


def _resolve_one(
    store: Store, bound: Bound, tp: TopicPartition, strategy: str, starting: bool,
    committed: bool = False,
) -> int:  # fmt: skip
    t, p = tp
    if bound.kind == "earliest":
        return store.start_offset(t, p)
    if bound.kind == "latest":
        return latest(store, t, p, committed)
    if bound.kind == "offsets":
        off = bound.offsets[tp]
        if off == EARLIEST:
            return store.start_offset(t, p)
        return latest(store, t, p, committed) if off == LATEST else off
    ts = bound.timestamp if bound.kind == "timestamp" else bound.offsets[tp]
    found = store.offset_for_time(t, p, ts)
    if found is not None:
        return found
    if starting and strategy == "error":
        raise OffsetOutOfRangeError(
            f"no message of {t}-{p} has a timestamp >= {ts} (option {bound.option!r}); "
            f"startingOffsetsByTimestampStrategy=latest starts such partitions at their end"
        )
    return store.end_offset(t, p)  # Kafka: no match -> latest


def checked_range(store: Store, rng: OffsetRange, opts: ReadOptions) -> OffsetRange:
    """The range limited to what the log holds now; with failOnDataLoss, an error instead when
    part of it is gone (retention) or was never written."""
    t, p = rng.topic, rng.partition
    first, end = store.start_offset(t, p), store.end_offset(t, p)
    start, stop = rng.start, rng.end
    if start < first or stop < first:
        if opts.fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"data loss in {t}-{p}: offsets from {min(start, stop)} were asked for but the "
                f"log starts at {first} (its retention point; older offsets were deleted); "
                f"set failOnDataLoss=false to read from {first}"
            )
        start, stop = max(start, first), max(stop, first)
    if start > end or stop > end:
        if opts.fail_on_data_loss:
            raise OffsetOutOfRangeError(
                f"{t}-{p}: offsets up to {max(start, stop)} were asked for but the log ends at "
                f"{end}; set failOnDataLoss=false to stop at the end"
            )
        start, stop = min(start, end), min(stop, end)
    if start > stop:
        raise InvalidConfigError(
            f"{t}-{p}: starting offset {start} ({opts.starting.option}) is after ending offset "
            f"{stop} ({opts.ending.option})"
        )
    return OffsetRange(t, p, start, stop)


# -- splitting --------------------------------------------------------------------------------


def split_ranges(
    ranges: Sequence[OffsetRange],
    segment_offsets: Callable[[str, int], list[int]],
    min_partitions: int | None,
    max_records: int | None,
) -> list[OffsetRange]:
    """Spark's split (kafka_split), then each cut moved onto a segment boundary near it."""
    out = kafka_split(ranges, min_partitions, max_records)
    if len(out) == len([r for r in ranges if r.size > 0]):
        return out  # nothing was cut
    return _snapped(out, segment_offsets, max_records)


def kafka_split(
    ranges: Sequence[OffsetRange], min_partitions: int | None, max_records: int | None
) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator.getRanges: empty ranges dropped; each range cut in
    ceil(size / maxRecordsPerPartition) pieces; then, when fewer pieces than minPartitions,
    a piece whose share of minPartitions rounds to 1 stays whole (and so does every piece of
    its topic-partition), and the rest share what remains of minPartitions in proportion to
    size (SPARK-36576). A piece of n parts takes remaining // (parts left) records each step."""
    out = [r for r in ranges if r.size > 0]
    if max_records is not None:
        out = [p for r in out for p in _divided(r, math.ceil(r.size / max_records))]
    if min_partitions is None or min_partitions <= len(out):
        return out
    total = sum(r.size for r in out)
    whole = [r for r in out if _part_count(r.size, total, min_partitions) == 1]
    whole_tps = {(r.topic, r.partition) for r in whole}
    split_total = total - sum(r.size for r in whole)
    split_min = max(min_partitions - len(whole), 1)
    return [
        p
        for r in out
        for p in _divided(
            r,
            1
            if (r.topic, r.partition) in whole_tps
            else _part_count(r.size, split_total, split_min),
        )
    ]


def _part_count(size: int, total: int, parts: int) -> int:
    """Spark's getPartCount: max(math.round(size.toDouble / total * parts), 1)."""
    return max(java_round(size / total * parts), 1)


def java_round(x: float) -> int:
    """Java's Math.round of a double >= 0: the nearest integer, ties up. Not floor(x + 0.5),
    whose addition rounds 0.49999999999999994 up to 1."""
    whole = math.floor(x)
    return whole + (1 if x - whole >= 0.5 else 0)


def _divided(rng: OffsetRange, parts: int) -> list[OffsetRange]:
    """Spark's getDividedPartition: `parts` pieces, each remaining // (parts left) records;
    empty pieces dropped."""
    out, start, remaining = [], rng.start, rng.size
    for i in range(parts):
        step = remaining // (parts - i)
        remaining -= step
        end = min(start + step, rng.end)
        if end > start:
            out.append(OffsetRange(rng.topic, rng.partition, start, end))
        start = end
    return out


def _snapped(
    pieces: list[OffsetRange],
    segment_offsets: Callable[[str, int], list[int]],
    max_records: int | None,
) -> list[OffsetRange]:
    """Each cut between two pieces of one partition moved to the nearest segment base offset
    within a quarter of the smaller piece, unless the move makes a piece larger than
    maxRecordsPerPartition: most tasks then start at the first batch of a segment file."""
    out: list[OffsetRange] = []
    i = 0
    while i < len(pieces):
        j = i
        while j + 1 < len(pieces) and (pieces[j + 1].topic, pieces[j + 1].partition) == (
            pieces[i].topic,
            pieces[i].partition,
        ):
            j += 1
        group = pieces[i : j + 1]
        if len(group) > 1:
            bases = segment_offsets(group[0].topic, group[0].partition)
            group = _snap_group(group, bases, max_records)
        out.extend(group)
        i = j + 1
    return out


def _snap_group(
    group: list[OffsetRange], bases: list[int], max_records: int | None
) -> list[OffsetRange]:
    """The contiguous pieces of one partition with their inner cuts snapped (_snapped)."""
    edges = [group[0].start, *(r.end for r in group)]
    for k in range(1, len(edges) - 1):
        cut = edges[k]
        tolerance = min(cut - edges[k - 1], edges[k + 1] - cut) // 4
        i = bisect.bisect_left(bases, cut)
        near = [b for b in bases[max(i - 1, 0) : i + 1] if abs(b - cut) <= tolerance]
        if not near:
            continue
        best = min(near, key=lambda b: abs(b - cut))
        too_big = max_records is not None and (
            best - edges[k - 1] > max_records or edges[k + 1] - best > max_records
        )
        if edges[k - 1] < best < edges[k + 1] and not too_big:
            edges[k] = best
    t, p = group[0].topic, group[0].partition
    return [OffsetRange(t, p, a, b) for a, b in pairwise(edges)]


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps)) or "nothing"
