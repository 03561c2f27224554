"""Planning a Spark batch read: parsed options + an open store -> offset ranges to read.

Runs where Spark plans the query (and again, per range, in each task to catch retention that
ran in between). No Spark imports: tests drive it with plain stores.

  1. the subscription names topic-partitions (subscribe / subscribePattern / assign);
  2. each side of the range resolves per partition: earliest / latest / an offset, or the first
     offset whose timestamp is >= T (Kafka's offsetsForTimes rule) through the time index;
  3. failOnDataLoss decides what a range reaching outside [start_offset, end_offset] means;
  4. ranges split like Kafka's (maxRecordsPerPartition first, then minPartitions in proportion
     to size), each cut moved onto a nearby segment boundary when one is close.
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

Span = tuple[int, int]  # offsets [lo, hi)


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic-partition: what one Spark task reads. A key or
    msg_id lookup sets `pieces`: then only those sorted, disjoint spans inside it are read."""

    topic: str
    partition: int
    start: int
    end: int
    pieces: tuple[Span, ...] = ()

    @property
    def size(self) -> int:
        """The records planned: what the task reads."""
        if self.pieces:
            return sum(hi - lo for lo, hi in self.pieces)
        return self.end - self.start

    def spans(self) -> tuple[Span, ...]:
        return self.pieces or ((self.start, self.end),)


def pieced(topic: str, partition: int, pieces: Sequence[Span]) -> OffsetRange | None:
    """The range reading just `pieces` (sorted, disjoint, non-empty each); None for none."""
    if not pieces:
        return None
    return OffsetRange(topic, partition, pieces[0][0], pieces[-1][1], tuple(pieces))


Narrow = Callable[[Store, list[OffsetRange]], list[OffsetRange]]


def plan_read(store: Store, opts: ReadOptions, narrow: Narrow | None = None) -> list[OffsetRange]:
    """The non-empty offset ranges of the read, split into Spark input partitions; `narrow`
    (pushed filters) may cut the resolved ranges down before they are split."""
    tps = topic_partitions(store, opts.subscription)
    starts = resolve_bound(store, opts.starting, tps, opts.starting_strategy, starting=True)
    ends = resolve_bound(store, opts.ending, tps, opts.starting_strategy, starting=False)
    ranges = [
        checked_range(store, OffsetRange(t, p, starts[(t, p)], ends[(t, p)]), opts) for t, p in tps
    ]
    if narrow is not None:
        ranges = narrow(store, ranges)
    return split_ranges(
        ranges, store.segment_offsets, opts.min_partitions, opts.max_records_per_partition
    )


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
    store: Store, bound: Bound, tps: Sequence[TopicPartition], strategy: str, starting: bool
) -> dict[TopicPartition, int]:
    """The offset each partition's range starts (or ends) at."""
    if bound.per_partition and set(bound.offsets) != set(tps):
        raise InvalidConfigError(
            f"option {bound.option!r} must name every partition read and no other: it names "
            f"{_names(bound.offsets)}, the subscription reads {_names(tps)}"
            + (" (use -2 for earliest, -1 for latest)" if bound.kind == "offsets" else "")
        )
    return {tp: _resolve_one(store, bound, tp, strategy, starting) for tp in tps}


def _resolve_one(
    store: Store, bound: Bound, tp: TopicPartition, strategy: str, starting: bool
) -> int:
    t, p = tp
    if bound.kind == "earliest":
        return store.start_offset(t, p)
    if bound.kind == "latest":
        return store.end_offset(t, p)
    if bound.kind == "offsets":
        off = bound.offsets[tp]
        if off == EARLIEST:
            return store.start_offset(t, p)
        return store.end_offset(t, p) if off == LATEST else off
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
    if rng.pieces:
        kept = [(max(lo, start), min(hi, stop)) for lo, hi in rng.pieces]
        found = pieced(t, p, [(lo, hi) for lo, hi in kept if lo < hi])
        return found if found is not None else OffsetRange(t, p, start, start)
    return OffsetRange(t, p, start, stop)


def split_ranges(
    ranges: Sequence[OffsetRange],
    segment_offsets: Callable[[str, int], list[int]],
    min_partitions: int | None,
    max_records: int | None,
) -> list[OffsetRange]:
    """Kafka's split: one range per topic-partition unless maxRecordsPerPartition or
    minPartitions asks for more; then cuts at segment boundaries where one is near."""
    out = [r for r in ranges if r.size > 0]
    if max_records is None and (min_partitions is None or len(out) >= min_partitions):
        return out
    bases = {(r.topic, r.partition): segment_offsets(r.topic, r.partition) for r in out}
    if max_records is not None:
        out = [
            piece
            for r in out
            for piece in _divide(r, math.ceil(r.size / max_records), bases, max_records)
        ]
    if min_partitions is not None and min_partitions > len(out):
        total = sum(r.size for r in out)
        out = [
            piece
            for r in out
            for piece in _divide(
                r, max(math.floor(r.size / total * min_partitions + 0.5), 1), bases, max_records
            )
        ]
    return out


def _divide(
    rng: OffsetRange,
    parts: int,
    bases: dict[TopicPartition, list[int]],
    max_records: int | None,
) -> list[OffsetRange]:
    """`rng` in `parts` pieces of (nearly) equal size; each inner cut moves to a segment
    boundary within a quarter piece of it, unless that breaks maxRecordsPerPartition."""
    if parts <= 1:
        return [rng]
    if rng.pieces:
        return _divide_pieces(rng, parts)
    cuts, position, remaining = [], rng.start, rng.size
    for i in range(parts - 1):
        step = remaining // (parts - i)
        remaining -= step
        position += step
        cuts.append(position)
    snapped = _snap(cuts, bases[(rng.topic, rng.partition)], rng.size // (4 * parts))
    edges = [rng.start, *snapped, rng.end]
    if max_records is not None and any(b - a > max_records for a, b in pairwise(edges)):
        edges = [rng.start, *cuts, rng.end]
    return [OffsetRange(rng.topic, rng.partition, a, b) for a, b in pairwise(edges) if b > a]


def _divide_pieces(rng: OffsetRange, parts: int) -> list[OffsetRange]:
    """A lookup's spans in `parts` groups of (nearly) equal record counts, in offset order;
    a span is cut where a group fills up."""
    groups: list[list[Span]] = [[]]
    remaining, left = rng.size, parts
    room = remaining // left
    for lo, hi in rng.pieces:
        while lo < hi:
            if room == 0 and left > 1:
                groups.append([])
                left -= 1
                room = remaining // left
            take = hi - lo if left == 1 else min(hi - lo, room)
            groups[-1].append((lo, lo + take))
            lo, room, remaining = lo + take, room - take, remaining - take
    return [r for r in (pieced(rng.topic, rng.partition, g) for g in groups) if r is not None]


def _snap(cuts: list[int], bases: list[int], tolerance: int) -> list[int]:
    """Each cut replaced by the nearest segment base offset within `tolerance`, kept rising."""
    out: list[int] = []
    for cut in cuts:
        i = bisect.bisect_left(bases, cut)
        near = [b for b in bases[max(i - 1, 0) : i + 1] if abs(b - cut) <= tolerance]
        best = min(near, key=lambda b: abs(b - cut)) if near else cut
        if not out or best > out[-1]:
            out.append(best)
        elif cut > out[-1]:
            out.append(cut)
    return out


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps)) or "nothing"
