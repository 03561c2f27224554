"""Time order: a query's matches merged across partitions by timestamp (issue 32).

In partition order (engine.run_scan) "what happened between 10:00 and 10:05" comes back as
partition 0's answer, then partition 1's. `merge_by_time` keeps one stream per partition, each
giving that partition's matches in offset order from a position (a scan, or a key lookup:
a `Fetch`), and returns the smallest of the streams' heads by (timestamp, partition, offset),
again and again (a heap; a block at a time with one sort while the buffers are in timestamp
order: `Merge`). It reads more of a stream only when the stream's buffer runs out, in growing
fetches, so a page of `limit` messages reads about its share of each partition. A page reads
each partition as it was when the page began.

The cursor, `t1-P.O-P.O...`, gives for each partition whose position is past 0 (in increasing
partition order, both numbers canonical decimal) the offset its stream resumes from: every
match below it has been returned, none at or past it. The merge's next step depends only on
the streams' heads, so pages resumed by cursor return exactly what one long query would, and a
message appended meanwhile is never skipped (its partition resumes below it).

The order is (timestamp, partition, offset) exactly when no partition's timestamps decrease
with its offsets (LogAppendTime, one producer's clock, a log loaded in order). Where one does,
its messages still come in offset order: the merge is the greedy one (always the smallest
head), not a sort of the whole window, which would hold every match of the window in memory
before returning the first. Nothing is lost or repeated either way (docs/query.md "Time
order").
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import operator
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mqcore._ext.batch import Message
from mqcore.errors import InvalidConfigError, QueryInterrupted
from mqcore.query.engine import (
    EXHAUSTED,
    INTERRUPTED,
    LIMIT,
    MAX_PARTITION,
    MAX_SCAN,
    NO_END,
    SCAN_CHUNK,
    TIMEOUT,
    Place,
    QueryResult,
    ScanBudget,
    ScanSpec,
    check_threads,
    decode_cursor,
    page_budget,
    scan_partition,
    shown,
)
from mqcore.storage.partition import Partition

P = TypeVar("P", bound=Place)

TIME_CURSOR_PREFIX = "t1"
_PAIR = re.compile(r"-(0|[1-9][0-9]{0,9})\.(0|[1-9][0-9]{0,18})")
FIRST_FETCH_MIN = 16  # matches a stream's first fetch asks for at least (its share of a page)
KEY = operator.attrgetter("timestamp", "partition", "offset")  # the order of a time query
TIMESTAMP = operator.attrgetter("timestamp")


@dataclass
class Fetched:
    """What one fetch of a stream found: its matches (offset order, at most what was asked),
    the offset it resumes from (every record below it examined, none of its matches past the
    last one given), why it stopped (None: the partition's end; LIMIT: it has the matches
    asked for; MAX_SCAN or TIMEOUT: the budget ran out) and what it read."""

    messages: list[Message]
    next_offset: int
    stop: str | None
    scanned_records: int = 0
    scanned_bytes: int = 0


# fetch(partition, from_offset, end_offset, matches wanted, records it may examine, deadline):
# the partition's matches at offsets in [from_offset, end_offset)
Fetch = Callable[[P, int, int, int, int, float], Fetched]


def encode_time_cursor(positions: dict[int, int]) -> str:
    """The cursor of a time-ordered query: each partition's resume offset, zeros left out."""
    pairs = "".join(f"-{p}.{o}" for p, o in sorted(positions.items()) if o > 0)
    return TIME_CURSOR_PREFIX + pairs


def decode_time_cursor(cursor: str | None) -> dict[int, int]:
    """{partition: resume offset} of a cursor encode_time_cursor wrote ({} for None);
    InvalidConfigError for any other text, a partition-order cursor named as such."""
    if cursor is None:
        return {}
    if isinstance(cursor, str) and cursor.startswith(TIME_CURSOR_PREFIX):
        positions = _time_pairs(cursor)
        if positions is not None:
            return positions
    elif isinstance(cursor, str) and cursor.startswith("c1-"):
        decode_cursor(cursor)  # a bad one is refused as such
        raise InvalidConfigError(
            f"cursor {shown(cursor)} resumes a query in partition order: ask again with "
            "order='partition' (mqcore query --order partition)"
        )
    raise InvalidConfigError(
        f"cursor {shown(cursor)} is not a time-order cursor (t1-PARTITION.OFFSET-..., as a "
        "result's `cursor` gives it)"
    )


def _time_pairs(cursor: str) -> dict[int, int] | None:
    """The pairs of a t1 cursor, or None when it is not canonical (partitions increasing and
    in range, offsets past 0 and below 2**63)."""
    positions: dict[int, int] = {}
    at, last = len(TIME_CURSOR_PREFIX), -1
    while at < len(cursor):
        match = _PAIR.match(cursor, at)
        if match is None:
            return None
        p, o = int(match[1]), int(match[2])
        if not last < p <= MAX_PARTITION or not 0 < o <= NO_END:
            return None
        positions[p], last, at = o, p, match.end()
    return positions


@dataclass
class Stream(Generic[P]):
    """One partition's matches as the merge reads them: the last fetch's `buffered` from
    `start` on (offset order, not yet returned), fetched up to `next_offset`; `done` once a
    fetch reached the partition's end; `ordered` when the buffer's timestamps never go back."""

    part: P
    next_offset: int
    want: int
    end: int  # the partition's end offset when the page began: the page reads below it
    buffered: list[Message] = field(default_factory=list)
    start: int = 0
    done: bool = False
    ordered: bool = True

    @property
    def position(self) -> int:
        """Where the stream resumes in a cursor: its first match not yet returned."""
        return self.buffered[self.start].offset if self.waiting else self.next_offset

    @property
    def waiting(self) -> int:
        """How many buffered matches are not yet returned."""
        return len(self.buffered) - self.start

    def head(self, index: int) -> tuple[int, int, int, int]:
        m = self.buffered[self.start]
        return (m.timestamp, m.partition, m.offset, index)


class Merge(Generic[P]):
    """One page of a time-ordered query: the streams and the result.

    While every buffer is in timestamp order (the common case), the greedy merge is a sort:
    until some stream runs out, it returns every buffered match up to the smallest of the
    streams' last buffered keys, in key order, which `take_blocks` does with one C sort per
    refill instead of a heap operation per message. A buffer whose timestamps go back hands
    the rest of the page to `take_heads`, the heap itself."""

    def __init__(
        self,
        parts: Sequence[P],
        fetch: Fetch[P],
        budget: ScanBudget,
        cursor: str | None,
    ) -> None:
        positions = decode_time_cursor(cursor)
        share = -(-budget.limit // max(1, len(parts)))
        first = min(budget.limit, SCAN_CHUNK, max(FIRST_FETCH_MIN, share + share // 4))
        # each partition as it is now: a message appended while the page is read waits for
        # the next page, so one page never returns a later message before an earlier one
        self.streams = [
            Stream(p, positions.get(p.partition, 0), first, p.end_offset)
            for p in sorted(parts, key=lambda p: p.partition)  # next_block's sort needs it
        ]
        self.fetch, self.budget = fetch, budget
        self.result = QueryResult()

    def run(self) -> QueryResult:
        """Fill every stream once, then return matches until the limit, the end, or a stream
        that needs more when the budget is spent."""
        stop = None
        for stream in self.streams:
            stop = self.refill(stream) or stop
        if stop is None or all(s.waiting or s.done for s in self.streams):
            stop = self.take_blocks()
        return self.finish(stop)

    def take_blocks(self) -> str | None:
        """Return blocks of matches in key order (class doc) until the limit, the end, a
        refill the budget stops, or a buffer out of order (then take_heads goes on)."""
        out, limit = self.result.messages, self.budget.limit
        while True:
            live = [s for s in self.streams if s.waiting]
            if not live:
                return None
            if not all(s.ordered for s in live):
                return self.take_heads()
            block, taken = self.next_block(live)
            room = limit - len(out)
            if len(block) >= room:
                out += block[:room]
                taken = collections.Counter(m.partition for m in block[:room])
            else:
                out += block
            for s in live:
                s.start += taken.get(s.part.partition, 0)
            if len(out) >= limit:
                return LIMIT
            why = self.refill_empty()
            if why is not None:
                return why

    def next_block(self, live: list[Stream[P]]) -> tuple[list[Message], dict[int, int]]:
        """The buffered matches up to the smallest last buffered key of the streams not at
        their end (all of them when every stream is), sorted, and how many of each partition."""
        bound = min((KEY(s.buffered[-1]) for s in live if not s.done), default=None)
        runs, taken = [], {}
        for s in live:
            stop = len(s.buffered)
            if bound is not None:
                stop = bisect.bisect_right(s.buffered, bound, s.start, stop, key=KEY)
            runs.append(s.buffered[s.start : stop])
            taken[s.part.partition] = stop - s.start
        # a stable sort by timestamp of the runs in partition order (each in offset order) is
        # the (timestamp, partition, offset) order, at the cost of an int compare
        return sorted(itertools.chain.from_iterable(runs), key=TIMESTAMP), taken

    def refill_empty(self) -> str | None:
        """Refill each stream whose buffer ran out (not at its end); MAX_SCAN or TIMEOUT
        when the budget is spent and one of them still has nothing."""
        for s in self.streams:
            if not s.waiting and not s.done:
                why = self.spent() or self.refill(s)
                if not s.waiting and why is not None:
                    return why
        return None

    def take_heads(self) -> str | None:
        """The greedy merge itself, a heap of the streams' heads: return the smallest until
        the limit; refill a stream whose buffer ran out. Returns why it stopped (None: every
        stream is at its end)."""
        out, limit, streams = self.result.messages, self.budget.limit, self.streams
        heap = [s.head(i) for i, s in enumerate(streams) if s.waiting]
        heapq.heapify(heap)
        while heap:
            index = heap[0][3]
            stream = streams[index]
            out.append(stream.buffered[stream.start])
            stream.start += 1
            if len(out) >= limit:
                return LIMIT
            if not stream.waiting and not stream.done:
                why = self.spent() or self.refill(stream)
                if not stream.waiting and why is not None:
                    return why
            if stream.waiting:
                heapq.heapreplace(heap, stream.head(index))
            else:
                heapq.heappop(heap)
        return None

    def spent(self) -> str | None:
        if self.result.scanned_records >= self.budget.max_scan:
            return MAX_SCAN
        if time.monotonic() >= self.budget.deadline:
            return TIMEOUT
        return None

    def refill(self, stream: Stream[P]) -> str | None:
        """One fetch of the stream, asking for twice as many matches as the last one (at most
        what the page may still return); returns MAX_SCAN or TIMEOUT when its budget ran out."""
        result, budget = self.result, self.budget
        if stream.next_offset >= stream.end:
            stream.done = True
            return None
        want = max(1, min(stream.want, budget.limit - len(result.messages)))
        records = max(1, budget.max_scan - result.scanned_records)
        got = self.fetch(
            stream.part, stream.next_offset, stream.end, want, records, budget.deadline
        )
        result.scanned_records += got.scanned_records
        result.scanned_bytes += got.scanned_bytes
        stream.buffered, stream.start = got.messages, 0  # refilled only once it ran out
        stamps = list(map(TIMESTAMP, got.messages))
        stream.ordered = stamps == sorted(stamps)
        stream.next_offset = max(stream.next_offset, got.next_offset)
        stream.done = got.stop is None
        stream.want = min(SCAN_CHUNK, 2 * stream.want)
        return got.stop if got.stop in (MAX_SCAN, TIMEOUT) else None

    def finish(self, stop: str | None) -> QueryResult:
        result = self.result
        result.reason = EXHAUSTED if stop is None else stop
        if stop is not None:
            result.cursor = self.cursor()
        return result

    def cursor(self) -> str:
        return encode_time_cursor({s.part.partition: s.position for s in self.streams})


def merge_by_time(
    parts: Sequence[P],
    fetch: Fetch[P],
    budget: ScanBudget,
    cursor: str | None,
    spec: ScanSpec | None = None,
) -> QueryResult:
    """A page of `budget.limit` messages of `parts` in time order (module doc), resuming at
    `cursor`. Ctrl-C raises QueryInterrupted with what was returned and the cursor after it
    (an interrupted fetch's finds are dropped: the stream resumes where it was)."""
    merge = Merge(parts, fetch, budget, cursor)
    try:
        result = merge.run()
    except KeyboardInterrupt:
        result = merge.finish(INTERRUPTED)
        if spec is not None:
            result.missing_properties = spec.missing_properties()
        raise QueryInterrupted(result) from None
    if spec is not None:
        result.missing_properties = spec.missing_properties()
    return result


def scan_fetch(spec: ScanSpec, threads: int) -> Fetch[Partition]:
    """A stream of a scan: engine.scan_partition from an offset, for `want` matches."""

    def fetch(
        part: Partition, offset: int, end: int, want: int, records: int, deadline: float
    ) -> Fetched:
        budget = ScanBudget(want, records, deadline, (part.partition, offset), end)
        found = QueryResult()
        # a stream resumes where a fetch stopped (this page's or the one before), which
        # counted the batch it stopped in
        stop = scan_partition(part, spec, budget, found, offset, threads, resumed=offset > 0)
        if stop is None:
            next_offset = min(budget.reached[1], end)
        else:
            next_offset = decode_cursor(found.cursor)[1]
        return Fetched(found.messages, max(offset, next_offset), stop, found.scanned_records,
                       found.scanned_bytes)  # fmt: skip

    return fetch


def run_time_scan(
    parts: Sequence[Partition],
    spec: ScanSpec,
    limit: int,
    max_scan: int,
    timeout: float | None,
    cursor: str | None,
    threads: int | None = None,
) -> QueryResult:
    """Store.search(order="time") of a scan: its streams scan each partition."""
    threads = check_threads(threads)
    budget = page_budget(limit, max_scan, timeout)
    return merge_by_time(parts, scan_fetch(spec, threads), budget, cursor, spec)
