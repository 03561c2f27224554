"""The queries behind Store.get_by_id / find_by_key / find_by_unique_id / range / search.

Keys and unique IDs go through each segment's key index (storage/keyindex.py): every hit is
checked against the stored record before it counts, and `limit` applies after that check (a
key's lookup is query/keyed.pyx, compiled, over these helpers).
Scans (time ranges, content, tags, selectors) walk batches in Cython (_ext/search.pyx), start at
the time index's answer, and skip segments whose timestamps cannot match. Results come in
(partition, offset) order; a result always says why it ended and where to resume.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import math
import os
import re
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mqcore._ext.batch import Message
from mqcore._ext.hashing import KEY_SEED, xxh64_hash
from mqcore._ext.search import scan_records
from mqcore.errors import (
    CorruptRecordError,
    ImplausibleTimeWarning,
    InvalidConfigError,
    QueryInterrupted,
)
from mqcore.query.ids import parse_uid, uid_time_ms
from mqcore.query.pattern import BytesPattern, compile_pattern
from mqcore.storage.partition import Partition
from mqcore.storage.segment import MAX_DECOMPRESSED, LogSegment

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore._ext.arrowcols import ArrowColumns
    from mqcore._ext.search import ScanResult, SelectorProgram
    from mqcore.query.selector import Selector

MAX_LIMIT = 100_000  # results one query may return (caps user limits before allocating)
MAX_PROBE = 1 << 20  # index entries one segment probe may walk
SCAN_CHUNK = 4096  # records a scan kernel call may return before Python filters them
# records one scan kernel call may examine: a call is not interrupted, so this bounds how far
# past its deadline a search can run (about 0.03 s of plain 1 KiB records, more compressed)
SCAN_CALL_RECORDS = 1 << 18
# a segment is scanned ahead on a helper thread (ScanAhead) only from this planned size on:
# below it a thread's start and join cost more than the second core saves
SCAN_AHEAD_BYTES = 4 << 20
SCAN_AHEAD_CANDIDATES = 16 * SCAN_CHUNK  # candidates a helper holds for Python filters
MAX_SCAN_THREADS = 64
KEY_SPAN_MAX_HITS = 4096  # key_spans: candidates in one segment past which it is read whole
NO_END = (1 << 63) - 1
CURSOR_PREFIX = "c1-"

EXHAUSTED, LIMIT, MAX_SCAN, TIMEOUT = "exhausted", "limit", "max_scan", "timeout"
INTERRUPTED = "interrupted"
# the orders a query's messages come in: partition by partition (each in offset order), or
# merged across the partitions by timestamp (query/merge.py)
PARTITION_ORDER, TIME_ORDER = "partition", "time"
ORDERS = (PARTITION_ORDER, TIME_ORDER)
# time bounds in ms outside [2001-01-01, 2100-01-01) UTC draw an ImplausibleTimeWarning
PLAUSIBLE_MS = (978_307_200_000, 4_102_444_800_000)


@dataclass
class QueryResult:
    """Messages a query found, in (partition, offset) order, and why it stopped.

    `reason`: "exhausted" (everything was examined), "limit", "max_scan", "timeout" or
    "interrupted" (Ctrl-C: carried by QueryInterrupted); unless exhausted, `cursor` resumes the
    query where it stopped (pass it back as `cursor=`). `missing_properties`: the names a
    `where` selector refers to that no message it examined carried, sorted (None without a
    selector or when it examined no message): the mark of an unquoted string value, as
    `service = payments` compares two properties and `service = 'payments'` a property with a
    string.
    """

    messages: list[Message] = field(default_factory=list)
    reason: str = EXHAUSTED
    scanned_records: int = 0
    scanned_bytes: int = 0
    cursor: str | None = None
    # class-level defaults (immutable): query/keyed.pyx makes its results without __init__
    missing_properties: tuple[str, ...] | None = None

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    @property
    def complete(self) -> bool:
        return self.reason == EXHAUSTED

    def to_arrow(self) -> pa.Table:
        """The messages as a table: Spark's Kafka source columns, headers, then the IDs:
        `msg_id` (the store ID, a string) and `unique_id` (a string; null without one)."""
        import pyarrow as pa

        from mqcore.arrow import kafka_schema

        schema = kafka_schema(include_headers=True)
        schema = schema.append(pa.field("msg_id", pa.string(), nullable=False))
        schema = schema.append(pa.field("unique_id", pa.string(), nullable=True))
        rows = {
            "key": [m.key for m in self.messages],
            "value": [m.value for m in self.messages],
            "topic": [m.topic for m in self.messages],
            "partition": [m.partition for m in self.messages],
            "offset": [m.offset for m in self.messages],
            "timestamp": [m.timestamp * 1000 for m in self.messages],
            "timestampType": [m.timestamp_type for m in self.messages],
            "headers": [[{"key": k, "value": v} for k, v in m.headers] for m in self.messages],
            "msg_id": [m.msg_id for m in self.messages],
            "unique_id": [m.unique_id for m in self.messages],
        }
        return pa.Table.from_pydict(rows, schema=schema)


# "c1-<partition>-<offset>", both canonical decimal (no sign, no leading zero, ASCII digits
# only): one text per position, and digit counts bounded before anything is converted
_CURSOR = re.compile(r"c1-(0|[1-9][0-9]{0,9})-(0|[1-9][0-9]{0,18})")
MAX_PARTITION = 0x7FFFFFFF


def encode_cursor(partition: int, offset: int) -> str:
    return f"{CURSOR_PREFIX}{partition}-{offset}"


def decode_cursor(cursor: str | None) -> tuple[int, int]:
    """(partition, offset) to resume at; (-1, 0) for no cursor. InvalidConfigError names a
    cursor that encode_cursor did not write (or that names an impossible place)."""
    if cursor is None:
        return -1, 0
    match = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is not None:
        partition, offset = int(match[1]), int(match[2])
        if partition <= MAX_PARTITION and offset <= NO_END:
            return partition, offset
    if isinstance(cursor, str) and cursor.startswith("t1"):
        raise InvalidConfigError(
            f"cursor {shown(cursor)} resumes a query in time order: ask again with "
            "order='time' (mqcore query --order time)"
        )
    raise InvalidConfigError(
        f"cursor {shown(cursor)} is not a query cursor (c1-PARTITION-OFFSET, as a result's "
        "`cursor` gives it)"
    )


def check_order(order: object) -> str:
    """A query's order: "partition" or "time"."""
    if order not in ORDERS:
        raise InvalidConfigError(f"order must be 'partition' or 'time', not {shown(order)}")
    return str(order)


def shown(value: object, limit: int = 80) -> str:
    """repr(value) for an error message, cut to about `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}...({len(text):,} characters)"


class Place(Protocol):
    """What a query walking partitions needs of one: its number, and its end offset when
    the page began (a Partition of this store, or one another broker leads)."""

    @property
    def partition(self) -> int: ...

    @property
    def end_offset(self) -> int: ...


PlaceT = TypeVar("PlaceT", bound=Place)


def resume_points(parts: Sequence[PlaceT], cursor: str | None) -> Iterator[tuple[PlaceT, int]]:
    """Each partition still to look at, with the offset to start from, resuming at `cursor`."""
    resume_p, resume_o = decode_cursor(cursor)
    for part in parts:
        if part.partition >= resume_p:
            yield part, resume_o if part.partition == resume_p else 0


def check_threads(threads: object) -> int:
    """Threads a scan may use: an int in [1, MAX_SCAN_THREADS]; None is 2 where this process
    may run on two CPUs or more, else 1."""
    if threads is None:
        return 2 if usable_cpus() >= 2 else 1
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise InvalidConfigError(f"threads must be an int or None, not {shown(threads)}")
    if not 1 <= threads <= MAX_SCAN_THREADS:
        raise InvalidConfigError(f"threads must be in [1, {MAX_SCAN_THREADS}], not {threads}")
    return threads


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_limit(name: str, value: object, cap: int) -> int:
    """A user limit as an int in [1, cap] (capped before anything is allocated)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConfigError(f"{name} must be an int >= 1, not {shown(value)}")
    return min(value, cap)


def time_bounds(start: int | None, end: int | None) -> tuple[int, int]:
    """[lo, hi) in ms from a query's `start` and `end` (None: unbounded). A reversed range
    (start > end) is refused: it can hold nothing, and is a mistake, not a question. start ==
    end is the empty range, allowed like range(5, 5). A bound that is not plausible as ms
    (ImplausibleTimeWarning) is warned about, then used as given."""
    lo = 0 if start is None else start
    hi = NO_END if end is None else end
    for name, v in (("start", lo), ("end", hi)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= NO_END:
            raise InvalidConfigError(
                f"{name} must be a timestamp in ms in [0, 2**63), not {shown(v)}"
            )
    if lo > hi:
        raise InvalidConfigError(
            f"start {lo} ({iso_ms(lo)}) is after end {hi} ({iso_ms(hi)}): a reversed time "
            "range holds nothing (start is inclusive, end exclusive)"
        )
    # 0 and 2**63-1 are the explicit "unbounded" values, not mistakes
    if start is not None and start != 0:
        check_plausible_ms("start", start)
    if end is not None and end != NO_END:
        check_plausible_ms("end", end)
    return lo, hi


def renamed(
    method: str, name: str, value: int | None, old: str, old_value: int | None
) -> int | None:
    """A time bound given by its name or, with a DeprecationWarning, by its old name (the
    warning names the caller of the Store method); both at once is refused."""
    if old_value is None:
        return value
    if value is not None:
        raise InvalidConfigError(f"{method}() got both {name}= and its deprecated name {old}=")
    warnings.warn(
        f"{method}(): {old}= is deprecated, use {name}= (the name search() and find_by_key() "
        "use); the old name goes away in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value


def iso_ms(ms: int) -> str:
    """A timestamp in ms (>= 0) as ISO-8601 UTC with milliseconds, `2024-06-10T10:00:00.123Z`;
    str(ms) past year 9999. The one formatter: error messages here, the CLI's text output."""
    try:
        dt = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def check_plausible_ms(name: str, ms: int) -> None:
    """Warn (ImplausibleTimeWarning) when `ms` lies outside [2001, 2100) as milliseconds,
    saying which unit it fits: seconds or microseconds (or nanoseconds)."""
    lo, hi = PLAUSIBLE_MS
    if lo <= ms < hi:
        return
    guess = ""
    for unit, scaled in (("seconds", ms * 1000), ("microseconds", ms // 1000),
                         ("nanoseconds", ms // 1_000_000)):  # fmt: skip
        if lo <= scaled < hi:
            guess = f"; it looks like {unit} (as ms that would be {iso_ms(scaled)})"
            break
    warnings.warn(
        f"{name}={ms} is {iso_ms(ms)} as milliseconds since the epoch, "
        f"{'before 2001' if ms < lo else 'after 2100'}{guess}",
        ImplausibleTimeWarning,
        stacklevel=_caller_level(),
    )


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_level() -> int:
    """warnings.warn's stacklevel, for a warn two frames down, that names the first frame
    outside mqcore: the caller's line that passed the value."""
    here = inspect.currentframe()  # None only on a Python without frame support
    frame = None if here is None or here.f_back is None else here.f_back.f_back
    if frame is None:
        return 2
    level = 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def check_timeout(timeout: object) -> float:
    """A scan's time budget in seconds (None: unbounded); a number >= 0, not NaN."""
    if timeout is None:
        return math.inf
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise InvalidConfigError(f"timeout must be a number of seconds >= 0, not {shown(timeout)}")
    return float(timeout)


def query_bytes(value: object, what: str) -> bytes:
    """A key or needle as bytes: bytes-like as is, a str as UTF-8. Anything else is refused
    (bytes(5) would be five zero bytes), as is text without a UTF-8 form."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, str):
        raise InvalidConfigError(f"{what} must be bytes or str, not {type(value).__name__}")
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise InvalidConfigError(f"{what} {shown(value)} is not valid text (UTF-8)") from None


def check_tag(tag: object) -> bytes:
    """A tag filter as the bytes the `tag` header holds (UTF-8 of the text)."""
    if not isinstance(tag, str):
        raise InvalidConfigError(f"tag must be a str, not {type(tag).__name__}")
    try:
        return tag.encode()
    except UnicodeEncodeError:
        raise InvalidConfigError(f"tag {shown(tag)} is not valid text (UTF-8)") from None


@contextlib.contextmanager
def scan_plan(part: Partition, from_offset: int = 0) -> Iterator[list[tuple[LogSegment, int, int]]]:
    """The one scan planner (queries, key spans and the consumer's filtered poll): the
    segments holding data at or after `from_offset`, oldest first, each with the size and
    next offset it had when the plan was made, pinned until the block ends (retention or
    compaction closes a segment's files only after its readers leave). Reading a segment
    only up to its planned size keeps a scan inside one moment of the log."""
    with part.pinned_ends() as segs:
        yield [(seg, size, end) for seg, size, end in segs if size and end > from_offset]


# -- lookups by ID and key ---------------------------------------------------------------------


def uid_matches(m: Message, uid: bytes) -> bool:
    return m.header("uid") == uid


def key_spans(
    part: Partition, hashed: int, start: int, end: int, max_hits: int
) -> list[tuple[int, int]]:
    """Offset spans [lo, hi) inside [start, end) that hold every record of `part` whose key
    index entries carry `hashed` (a superset: hash collisions and `keys` words included), in
    order and disjoint. One span per batch with candidates, from its first candidate to its
    last; the whole of a segment's share of [start, end) when it keeps no key table or has more
    than `max_hits` candidates (reading it then beats a lookup per batch). Nothing is read but
    the key tables."""
    out: list[tuple[int, int]] = []
    with scan_plan(part, start) as segments:
        for seg, _size, seg_end in segments:
            lo, hi = max(start, seg.base_offset), min(end, seg_end)
            if lo >= hi:
                continue
            table = seg.key_table()
            hits = None if table is None else table.probe(hashed, max_hits + 1)
            if hits is None or len(hits) > max_hits:
                out.append((lo, hi))
                continue
            batches: dict[int, tuple[int, int]] = {}
            for rel, pos, _ts_lo, _ts_hi in hits:
                offset = seg.base_offset + rel
                if lo <= offset < hi:
                    first, last = batches.get(pos, (offset, offset))
                    batches[pos] = (min(first, offset), max(last, offset))
            out.extend(sorted((first, last + 1) for first, last in batches.values()))
    return out


def key_hash(key: bytes | str) -> tuple[bytes, int]:
    raw = query_bytes(key, "key")
    return raw, xxh64_hash(raw, KEY_SEED)


def find_unique(
    parts: Sequence[Partition], uid: str, start: int | None, end: int | None, limit: int
) -> QueryResult:
    """Messages carrying unique ID `uid` in any of `parts`. A UUIDv7's time orders the search:
    segments whose timestamps span it are probed first. The reason is "limit" only when more
    than `limit` messages carry the ID (the probe of every segment's table is cheap; only
    candidates are read: an ID's own entries, and for a UUIDv7 the one record each run entry
    of its ms and node names, KeyTable.probe_uid)."""
    raw = parse_uid(uid)
    lo, hi = time_bounds(start, end)
    limit = check_limit("limit", limit, MAX_LIMIT)
    t = uid_time_ms(raw)
    with contextlib.ExitStack() as pins:
        segs = [(part, seg) for part in parts for seg, *_ in pins.enter_context(scan_plan(part))]
        return _find_unique_in(segs, raw, lo, hi, t, limit)


def _find_unique_in(
    segs: list[tuple[Partition, LogSegment]],
    raw: bytes,
    lo: int,
    hi: int,
    t: int | None,
    limit: int,
) -> QueryResult:
    if t is not None:
        segs.sort(key=lambda ps: not (ps[1].max_timestamp >= t >= _min_ts(ps[1])))
    result = QueryResult()
    for part, seg in segs:
        table = seg.key_table()
        if table is None:
            continue
        for rel, _pos, ts_lo, ts_hi in table.probe_uid(raw, MAX_PROBE):
            if ts_hi < lo or ts_lo >= hi:
                continue
            m = part.get(seg.base_offset + rel)
            result.scanned_records += 1
            if m is not None and lo <= m.timestamp < hi and uid_matches(m, raw):
                result.messages.append(m)
        if len(result.messages) > limit:
            break
    result.messages.sort(key=lambda m: (m.topic, m.partition, m.offset))
    if len(result.messages) > limit:
        # more messages carry the ID than asked for (a producer reused it): say so; there is
        # no cursor across topics, a larger limit returns them all
        del result.messages[limit:]
        result.reason = LIMIT
    return result


def _min_ts(seg: LogSegment) -> int:
    table = seg.key_table()
    return table.min_timestamp if table is not None and table.key_count else 0


# -- scans: time range, content, tag, selector -------------------------------------------------


@dataclass
class ScanSpec:
    """What a scan looks for; Python-side filters run on the kernel's candidates."""

    lo: int = 0
    hi: int = NO_END
    needle: bytes | None = None
    tag: bytes | None = None
    pattern: BytesPattern | None = None
    selector: Selector | None = None
    # the selector's property names no examined message carried yet (None: none examined)
    unseen: tuple[str, ...] | None = None

    @property
    def kernel_selector(self) -> SelectorProgram | None:
        """The selector's kernel program when the scan kernel evaluates it: it has one, and no
        regex runs first in Python (the names a scan reports seen are those of the messages
        the selector examined, which a regex narrows)."""
        if self.selector is None or self.pattern is not None:
            return None
        return self.selector.program

    @property
    def filters_in_python(self) -> bool:
        """Whether candidates go through `accepts` (a regex, or a selector the kernel does
        not evaluate) after the kernel."""
        return self.pattern is not None or (
            self.selector is not None and self.selector.program is None
        )

    def accepts(self, m: Message) -> bool:
        """Whether a kernel candidate passes the filters that run in Python."""
        if self.pattern is not None and (m.value is None or not self.pattern.search(m.value)):
            return False
        if self.selector is None or self.kernel_selector is not None:
            return True
        return self.selector_accepts(m)

    def matches(self, m: Message) -> bool:
        """Every filter tested on a message the scan kernel did not see (a key lookup's hits):
        the kernel's rules, in Python. The time window; the needle anywhere in a non-null value
        (an empty one matches any); a header `tag` equal to the tag (any of them, as the
        kernel's has_tag); then the regex and the selector as `accepts` runs them."""
        if not self.lo <= m.timestamp < self.hi:
            return False
        if self.needle is not None and (m.value is None or self.needle not in m.value):
            return False
        if self.tag is not None and not any(k == "tag" and v == self.tag for k, v in m.headers):
            return False
        if self.pattern is not None and (m.value is None or not self.pattern.search(m.value)):
            return False
        return self.selector is None or self.selector_accepts(m)

    def selector_accepts(self, m: Message) -> bool:
        """The selector's Python form on `m`, noting which of its names `m` carries."""
        assert self.selector is not None
        props = selector_view(m)
        unseen = self.unseen
        if unseen is None:
            unseen = self.unseen = tuple(sorted(self.selector.properties))
        for name in unseen:  # a few names, each checked until a message carries it
            if name in props:
                self.unseen = tuple(n for n in unseen if n not in props)
                break
        return self.selector.matches(props)

    def note_seen(self, r: ScanResult) -> None:
        """Take the names the kernel's selector saw in a scan call into `unseen`."""
        if r.selector_runs == 0 or self.selector is None:
            return
        unseen = self.unseen
        if unseen is None:
            unseen = tuple(sorted(self.selector.properties))
        names, seen = self.selector.program_names, r.properties_seen
        self.unseen = tuple(n for n in unseen if not seen >> names.index(n) & 1)

    def missing_properties(self) -> tuple[str, ...] | None:
        """The selector's names that no message it examined carried, sorted (None: it
        examined none)."""
        return self.unseen


def scan_chunk(
    view: memoryview,
    pos: int,
    part: Partition | tuple[str, int],
    spec: ScanSpec,
    min_offset: int,
    max_offset: int,
    limit: int,
    max_records: int,
    verify_crc: bool,
    source: str,
    note: bool = True,
    count_partial: bool = True,
) -> ScanResult:
    """One scan kernel call with `spec`'s kernel filters: time window, content, tag and the
    selector's program when the kernel runs it (the one place selectors reach the kernel:
    search(), the CLI, the server's filtered fetch and the consumer all come here). With
    `note` False nothing in `spec` changes (ScanAhead's threads: the caller notes what the
    selector saw when it takes the result). `count_partial` False: the batch the call starts
    inside was counted in scanned bytes by the call before (the kernel's rule)."""
    topic, partition = (part.topic, part.partition) if isinstance(part, Partition) else part
    r = scan_records(
        view, pos, topic, partition, min_offset, max_offset, spec.lo, spec.hi, spec.needle,
        False, spec.tag, limit, max_records, verify_crc, MAX_DECOMPRESSED, source, 0,
        spec.kernel_selector, count_partial,
    )  # fmt: skip
    if note:
        spec.note_seen(r)
    return r


def selector_view(m: Message) -> dict[str, str]:
    """The properties a selector sees: the text headers, plus TAGS for the tag (RocketMQ)."""
    props = m.properties
    if "tag" in props:
        props.setdefault("TAGS", props["tag"])
    return props


def make_spec(
    start: int | None,
    end: int | None,
    contains: bytes | str | None = None,
    regex: str | bytes | None = None,
    tag: str | None = None,
    where: str | None = None,
) -> ScanSpec:
    lo, hi = time_bounds(start, end)
    spec = ScanSpec(lo, hi)
    if contains is not None:
        spec.needle = query_bytes(contains, "contains")
    if regex is not None:
        spec.pattern = compile_pattern(regex)
        if spec.needle is None:  # the kernel passes over what lacks the pattern's literal
            spec.needle = spec.pattern.literal
    if tag is not None:
        spec.tag = check_tag(tag)
    if where is not None:
        from mqcore.query.selector import compile_selector  # its parser loads on first use

        spec.selector = compile_selector(where)
    return spec


@dataclass
class ScanBudget:
    limit: int
    max_scan: int
    deadline: float
    # (partition, offset): every record before it has been examined and its match, if any,
    # added to the result; where an interrupted scan resumes (with the last match)
    reached: tuple[int, int] = (-1, 0)
    # offsets at or past it are not read (a time-ordered page reads each partition as it was
    # when the page began: query/merge.py)
    end: int = NO_END

    def spent(self, result: QueryResult) -> str | None:
        if len(result.messages) >= self.limit:
            return LIMIT
        if result.scanned_records >= self.max_scan:
            return MAX_SCAN
        if time.monotonic() >= self.deadline:
            return TIMEOUT
        return None


def scan_partition(
    part: Partition,
    spec: ScanSpec,
    budget: ScanBudget,
    result: QueryResult,
    from_offset: int,
    threads: int = 1,
    resumed: bool = False,
) -> str | None:
    """Scan one partition into `result`; returns why it stopped early (None: exhausted). With
    `threads` > 1, up to threads - 1 of the segments after the one being scanned are scanned
    ahead on helper threads (ScanAhead); the answer is the one a single thread gives.
    `resumed`: `from_offset` is where an earlier scan stopped (its cursor), which counted the
    batch holding it in its scanned bytes."""
    start_offset = max(from_offset, part.start_offset)
    if spec.lo > 0:
        first = part.offset_for_time(spec.lo)
        if first is None:
            return None
        start_offset = max(start_offset, first)
    resumed = resumed and start_offset == from_offset  # else it starts in a batch of its own
    next_offset = start_offset
    with scan_plan(part, next_offset) as planned:
        # may_match loads a segment: asked only of the segment reached and of those big
        # enough to be read ahead, never of those past where the scan stops
        segments = iter(planned)
        window: collections.deque[tuple[LogSegment, int]] = collections.deque()
        known: dict[int, bool] = {}
        ahead: dict[int, ScanAhead] = {}

        def matches(seg: LogSegment) -> bool:
            if id(seg) not in known:
                known[id(seg)] = may_match(seg, spec)
            return known[id(seg)]

        try:
            while True:
                while len(window) < threads and (nxt := next(segments, None)) is not None:
                    window.append(nxt[:2])
                if not window:
                    return None
                seg, size = window.popleft()
                if seg.base_offset >= budget.end:
                    return None
                if not matches(seg):
                    continue
                for later, later_size in window:
                    if later_size >= SCAN_AHEAD_BYTES and id(later) not in ahead and matches(later):
                        helper = ahead[id(later)] = ScanAhead(
                            part, later, later_size, start_offset, spec, budget, result
                        )
                        helper.start()
                taken = ahead.get(id(seg))
                stop, next_offset = scan_segment(part, seg, size, spec, budget, result,
                                                 next_offset, taken, not resumed)  # fmt: skip
                resumed = True  # the next segment starts at its first batch anyway
                ahead.pop(id(seg), None)
                if stop is not None:
                    result.cursor = encode_cursor(part.partition, next_offset)
                    return stop
        finally:
            for helper in ahead.values():  # not waited for: each stops after its kernel call
                helper.stopped.set()  # under way, its view keeping the mapping meanwhile


def may_match(seg: LogSegment, spec: ScanSpec) -> bool:
    """False when the segment's timestamps (its time index, its key table's) rule it out."""
    if seg.max_timestamp < spec.lo:
        return False
    if spec.hi == NO_END:
        return True  # no key table to load: nothing is at or past the end of time
    table = seg.key_table()
    return table is None or not table.key_count or table.min_timestamp < spec.hi


def scan_segment(
    part: Partition,
    seg: LogSegment,
    size: int,
    spec: ScanSpec,
    budget: ScanBudget,
    result: QueryResult,
    from_offset: int,
    ahead: ScanAhead | None = None,
    count_partial: bool = True,
) -> tuple[str | None, int]:
    """Scan one segment from `from_offset` into `result` in kernel calls (each with at most
    SCAN_CHUNK candidates and SCAN_CALL_RECORDS records), taking the helper's results where
    they equal the calls this one would make; (why it stopped or None at its end, the offset
    to go on from). Each call after the first resumes where the one before stopped, inside a
    batch that call counted in scanned bytes (`count_partial` is for the first)."""
    view = seg.view(0, size)
    try:
        pos = seg.position_for(max(from_offset, seg.base_offset))
        offset = from_offset
        done = ahead.take(pos, max(from_offset, seg.base_offset)) if ahead is not None else []
        while True:
            room = min(SCAN_CHUNK, budget.limit - len(result.messages))
            if spec.filters_in_python:
                room = SCAN_CHUNK  # Python filters follow: the limit counts after them
            records = max(1, min(budget.max_scan - result.scanned_records, SCAN_CALL_RECORDS))
            r = None
            if done:
                r, its_room, its_records = done.pop(0)
                if (its_room != room and len(r.messages) >= room) or (
                    its_records != records and r.records_scanned >= records
                ):
                    r, done = None, []  # the helper looked further than this call may: redo it
            if r is None:
                r = scan_chunk(view, pos, part, spec, offset, budget.end, room, records, True,
                               seg.log_path, count_partial=count_partial)  # fmt: skip
            else:
                spec.note_seen(r)
            count_partial = False
            result.scanned_records += r.records_scanned
            result.scanned_bytes += r.bytes_scanned
            stopped = filter_chunk(r.messages, spec, budget, result)
            if stopped is not None:
                return stopped
            pos, offset = r.next_position, r.next_offset
            budget.reached = (part.partition, offset)
            if r.reason == "end":
                return None, offset
            why = budget.spent(result)
            if why is not None:
                return why, offset
    finally:
        view.release()


class ScanAhead:
    """One segment scanned on a helper thread while the caller scans the segments before it.

    A scan from the page cache is bound by how fast one core reads memory (about 8-12 GB/s on
    the test VM, 80 % of it in the CRC-and-needle pass; two cores read about 1.8 times that:
    bench/README.md "Content search on two cores"), so a second core speeds a long scan up.

    The helper makes the kernel calls the caller's loop would make from the segment's start,
    with bounds no smaller than the caller's (room and records per call, the budget left when
    it started), and keeps each result with its bounds. The caller takes them in order and
    uses one only where its own call, with its bounds at that moment, would have returned the
    same (the same bounds, or fewer matches than its room and fewer records than its budget);
    else it makes that call itself. So limits, cursors, counts and errors are one thread's.

    The helper stops at the segment's end, the budget, the limit's worth of matches
    (SCAN_AHEAD_CANDIDATES candidates when Python filters them), the deadline, a kernel error
    (the caller meets it again in its own call) or when told to. The kernel releases the GIL
    over the bytes. A scan that ends before it reaches a helper's segment tells the helper to
    stop and returns without waiting for the kernel call under way (at most SCAN_CALL_RECORDS
    records): the helper's view, taken on the caller's thread inside the plan's pin, keeps the
    mapping until the helper ends, past the pin, a retention close or Store.close() (a
    MappedFile unmaps when its last buffer goes)."""

    def __init__(
        self,
        part: Partition,
        seg: LogSegment,
        size: int,
        start_offset: int,
        spec: ScanSpec,
        budget: ScanBudget,
        result: QueryResult,
    ) -> None:
        self.offset = max(start_offset, seg.base_offset)
        self.pos = seg.position_for(self.offset)
        self.results: list[tuple[ScanResult, int, int]] = []  # each call's result and bounds
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.seg, self.size = seg, size
        records = max(1, budget.max_scan - result.scanned_records)
        room = SCAN_CHUNK if spec.filters_in_python else min(SCAN_CHUNK, budget.limit)
        # messages it may hold: the limit's worth, or a bounded number of candidates when
        # Python filters them later (a regex without a literal makes every record one)
        held = SCAN_AHEAD_CANDIDATES if spec.filters_in_python else budget.limit
        where = (part.topic, part.partition)
        self.args = (where, spec, room, held, records, budget.deadline, budget.end, seg.log_path)

    def start(self) -> None:
        """Start the thread, taking the segment's view on the caller's thread (inside the
        plan's pin). Where no thread can be started (RuntimeError), the caller scans the
        segment itself."""
        view = self.seg.view(0, self.size)
        thread = threading.Thread(
            target=self.run, args=(view, *self.args), name="mqcore-scan-ahead", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:
            view.release()
            return
        self.thread = thread

    def run(
        self,
        view: memoryview,
        where: tuple[str, int],
        spec: ScanSpec,
        room: int,
        held: int,
        records: int,
        deadline: float,
        end: int,
        source: str,
    ) -> None:
        pos, offset = self.pos, self.offset
        try:
            while not self.stopped.is_set() and records > 0 and held > 0:
                call_records = min(records, SCAN_CALL_RECORDS)
                r = scan_chunk(view, pos, where, spec, offset, end, room, call_records, True,
                               source, note=False, count_partial=not self.results)  # fmt: skip
                self.results.append((r, room, call_records))
                records -= r.records_scanned
                held -= len(r.messages)
                if r.reason == "end" or time.monotonic() >= deadline:
                    break
                pos, offset = r.next_position, r.next_offset
        except Exception:  # noqa: BLE001, S110 - the caller's own call meets it and raises it
            pass
        finally:
            view.release()

    def take(self, pos: int, offset: int) -> list[tuple[ScanResult, int, int]]:
        """The helper's results, once it has finished, for a caller starting at (pos, offset);
        none when it started elsewhere or never started."""
        if self.thread is None:
            return []
        self.thread.join()
        return self.results if (pos, offset) == (self.pos, self.offset) else []


def filter_chunk(
    messages: list[Message], spec: ScanSpec, budget: ScanBudget, result: QueryResult
) -> tuple[str, int] | None:
    """Add the kernel's candidates that `spec` accepts to `result`; (why, next offset) when the
    limit is reached, or when the time is up after filtering one in Python (each candidate can
    cost time proportional to its size, so the deadline is checked after every one)."""
    if not spec.filters_in_python:  # every candidate is a match: no loop in Python
        room = budget.limit - len(result.messages)
        result.messages += messages[:room]
        return (LIMIT, messages[room - 1].offset + 1) if len(messages) >= room else None
    timed = budget.deadline != math.inf
    for m in messages:
        if spec.accepts(m):
            result.messages.append(m)
            if len(result.messages) >= budget.limit:
                return LIMIT, m.offset + 1
        if timed and time.monotonic() >= budget.deadline:
            return TIMEOUT, m.offset + 1
    return None


_MIN_TS = -(1 << 63)


def fill_holding(
    part: Partition,
    cols: ArrowColumns,
    needle: bytes,
    offset: int,
    last: int,
    max_rows: int,
    max_bytes: int,
    verify_crc: bool,
) -> tuple[int, bool]:
    """Store.iter_arrow_holding's step: decode into `cols`, from `offset` up to `last`, only
    the batches whose records hold a value containing `needle` (non-empty), each from the first
    such record to its end. The search kernel finds that record and passes every other batch
    over without decoding it. Returns (next offset, done) like Store._fill."""
    state: dict[str, Any] = {"next": offset, "done": True}

    def decode(buf: memoryview, file_pos: int, seg: LogSegment) -> tuple[int, bool]:
        pos, size = 0, len(buf)
        while pos < size:
            r = scan_records(
                buf, pos, part.topic, part.partition, state["next"], last + 1, _MIN_TS, NO_END,
                needle, False, None, 1, NO_END, verify_crc, MAX_DECOMPRESSED, seg.log_path,
                file_pos,
            )  # fmt: skip
            if not r.messages:
                state["next"] = max(state["next"], r.next_offset)
                return r.next_position, r.next_offset > last
            found = r.messages[0].offset
            at, length, batch_last = _batch_holding(buf, r.next_position, pos, found, seg, file_pos)
            _, nxt, _, full = cols.add(
                buf[: at + length], at, found, min(batch_last, last), max_rows, max_bytes,
                verify_crc, seg.log_path, file_pos,
            )  # fmt: skip
            if full:
                state["next"], state["done"] = nxt, False
                return at, True
            state["next"] = batch_last + 1
            pos = at + length
            if batch_last >= last:
                return pos, True
        return pos, False

    part.scan(offset, decode)
    return int(state["next"]), bool(state["done"]) or state["next"] > last


ARROW_MAX_BYTES = 1 << 30  # a match adds its row before the bound is checked: int32 offsets


def fill_matching(
    part: Partition,
    cols: ArrowColumns,
    spec: ScanSpec,
    offset: int,
    last: int,
    max_rows: int,
    max_bytes: int,
    verify_crc: bool,
) -> tuple[int, bool]:
    """Store.iter_arrow_matching's step: the records from `offset` up to `last` that pass
    `spec`'s kernel filters (time window, content, tag, the selector's program; the spec
    needs no Python filter), added to `cols` by the scan kernel itself (no Message per match)
    until it holds `max_rows` rows or `max_bytes` data bytes. Returns (next offset, done)
    like Store._fill."""
    assert not spec.filters_in_python
    _, nxt, full = _kernel_pass(part, spec, offset, last + 1, verify_crc, max_rows, cols,
                                min(max_bytes, ARROW_MAX_BYTES))  # fmt: skip
    return nxt, not full or nxt > last


def scan_messages(
    part: Partition, spec: ScanSpec, start: int, end: int, verify_crc: bool, committed: bool
) -> Iterator[Message]:
    """The records of [start, end) that match `spec`, in offset order (read_committed's
    spans only when `committed`): the kernel's candidates through the filters that run in
    Python (a regex, a selector beyond the kernel), SCAN_CHUNK candidates a kernel call."""
    for lo, hi in part.committed_spans(start, end) if committed else [(start, end)]:
        offset, more = lo, True
        while more and offset < hi:
            found, offset, more = _kernel_pass(part, spec, offset, hi, verify_crc, SCAN_CHUNK)
            yield from (m for m in found if spec.accepts(m))


def _kernel_pass(
    part: Partition,
    spec: ScanSpec,
    offset: int,
    end: int,
    verify_crc: bool,
    limit: int,
    into: ArrowColumns | None = None,
    max_bytes: int = ARROW_MAX_BYTES,
) -> tuple[list[Message], int, bool]:
    """The kernel's matches of [offset, end) over the segments, up to `limit` of them (as
    Messages, or rows added to `into` up to `max_bytes`): (the Messages, the offset to go on
    from, whether a bound stopped it before `end`)."""
    found: list[Message] = []
    state: dict[str, Any] = {"next": offset, "more": False}

    def decode(buf: memoryview, file_pos: int, seg: LogSegment) -> tuple[int, bool]:
        taken = len(found) if into is None else into.num_rows
        r = scan_records(
            buf, 0, part.topic, part.partition, state["next"], end, spec.lo, spec.hi,
            spec.needle, False, spec.tag, max(1, limit - taken), NO_END, verify_crc,
            MAX_DECOMPRESSED, seg.log_path, file_pos, spec.kernel_selector, True, into,
            max_bytes,
        )  # fmt: skip
        state["next"] = max(state["next"], r.next_offset)
        found.extend(r.messages)
        if r.reason == "end":  # the view's end, or past `end`
            return r.next_position, state["next"] >= end
        state["more"] = True
        return r.next_position, True

    part.scan(offset, decode)
    return found, int(state["next"]), bool(state["more"])


def _batch_holding(
    buf: memoryview, stopped: int, began: int, offset: int, seg: LogSegment, file_pos: int
) -> tuple[int, int, int]:
    """(position, size, last offset) of the batch of `buf` that holds `offset`, where a scan
    that began at batch position `began` stopped at `stopped` (that batch itself, unless the
    record was its last). The walk starts at the offset index's floor, so it is short."""
    size = len(buf)
    if (
        stopped + 8 <= size
        and int.from_bytes(buf[stopped : stopped + 8], "big", signed=True) <= offset
    ):
        pos = stopped
    else:
        pos = max(began, seg.position_for(offset) - file_pos)
    while pos + 27 <= size:
        base, length = struct.unpack_from(">qi", buf, pos)
        (last_delta,) = struct.unpack_from(">i", buf, pos + 23)
        if length <= 0:
            break
        if base + last_delta >= offset:
            return pos, 12 + length, base + last_delta
        pos += 12 + length
    raise CorruptRecordError(
        f"no batch holds offset {offset} although the scan found it there",
        path=seg.log_path,
        position=file_pos + pos,
    )


def page_budget(limit: int, max_scan: int, timeout: float | None) -> ScanBudget:
    """A query's limits, checked (InvalidConfigError names a bad one): one page's budget,
    for a scan in partition order and a merge in time order alike."""
    return ScanBudget(
        check_limit("limit", limit, MAX_LIMIT),
        check_limit("max_scan", max_scan, NO_END),
        time.monotonic() + check_timeout(timeout),
    )


def run_scan(
    parts: Sequence[Partition],
    spec: ScanSpec,
    limit: int,
    max_scan: int,
    timeout: float | None,
    cursor: str | None,
    threads: int | None = None,
) -> QueryResult:
    threads = check_threads(threads)
    budget = page_budget(limit, max_scan, timeout)
    result = QueryResult()
    resume_partition = decode_cursor(cursor)[0]
    try:
        for part, from_offset in resume_points(parts, cursor):
            budget.reached = (part.partition, from_offset)
            resumed = part.partition == resume_partition
            stop = scan_partition(part, spec, budget, result, from_offset, threads, resumed)
            if stop is not None:
                result.reason = stop
                if result.cursor is None:
                    result.cursor = encode_cursor(part.partition, from_offset)
                break
    except KeyboardInterrupt:
        result.reason = INTERRUPTED
        result.cursor = interrupted_cursor(budget.reached, result.messages)
        result.missing_properties = spec.missing_properties()
        raise QueryInterrupted(result) from None
    result.missing_properties = spec.missing_properties()
    return result


def interrupted_cursor(reached: tuple[int, int], messages: list[Message]) -> str:
    """Where a scan stopped by KeyboardInterrupt resumes: past everything examined, and past
    its last match (matches are added in offset order, so the ones found are a prefix of the
    matches: resuming there neither repeats nor loses one)."""
    partition, offset = reached
    if messages and messages[-1].partition == partition:
        offset = max(offset, messages[-1].offset + 1)
    return encode_cursor(max(partition, 0), offset)
