"""Delayed messages: a timer log (`__delay`) and an in-memory heap, delivered when due.

A message sent with `deliver_at=` / `delay_ms=` is appended to the internal topic `__delay`
instead of its real topic, so every reader of the real topic sees it only once it is delivered
(docs/consume.md). Delivery re-appends the record to the real topic with its key,
headers and unique ID, in due order (deliver_at, then origin offset). Progress is durable in
`__delay_state`: the newest record there is a snapshot of what was delivered; a PREPARE snapshot
written (and fdatasync'd, whatever the flush policy) before the real appends names the in-doubt
messages and where their target partitions ended, so a crash or a power loss mid-delivery
neither loses nor duplicates (a message whose unique ID is already in its target partition is
not appended again); the real appends are fdatasync'd before the "done" snapshot. `trim()`
deletes the delivered prefix of the timer log, re-parking the few pending messages in it
(trim.py).

Also the pieces transactions share: PendingMetadata, the internal header layout (read_parked,
re-parked copies, re-appends), the store options of both features and the checks of
bookkeeping records (junk is skipped and reported).
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mqcore.crashpoints import crash_point
from mqcore.errors import InvalidConfigError, InvalidRecordError, StoreClosedError
from mqcore.log.internal import is_internal
from mqcore.log.trace import TraceEvent
from mqcore.produce.relay import relay, scan
from mqcore.produce.trim import delete_below, segment_bases, trim_point
from mqcore.storage.retention import RetentionReport

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.log.append import BatchMetadata
    from mqcore.log.manager import Log
    from mqcore.log.trace import Tracer

_log = logging.getLogger("mqcore")

DELAY_TOPIC = "__delay"
DELAY_STATE_TOPIC = "__delay_state"
# internal headers come FIRST in a parked record, in this order, so that stripping exactly
# that many leaves the producer's own headers (even ones with the same names) untouched
H_TXN = "mq.txn"
H_TOPIC = "mq.topic"
H_PARTITION = "mq.partition"
H_DELIVER_AT = "mq.deliver_at"
H_TIMESTAMP = "mq.ts"
H_MOVED = "mq.moved"  # a re-parked copy only, before the others: where it was first parked
DELAY_HEADERS = (H_TOPIC, H_PARTITION, H_DELIVER_AT, H_TIMESTAMP)
DAY_MS = 86_400_000
# the parked logs and their bookkeeping are trimmed by resolution (trim.py), never by time, size
# or compaction, whatever the store's topic defaults say
KEPT_UNTIL_RESOLVED: dict[str, Any] = {
    "cleanup_policy": "delete",
    "retention_ms": -1,
    "retention_bytes": -1,
}

# -- store options --------------------------------------------------------------------------


@dataclass(frozen=True)
class TxnDelayOptions:
    """Store options of transactions and delayed messages (mqcore.open(path, **options))."""

    transaction_timeout_ms: int = 6000  # RocketMQ's transactionTimeOut
    transaction_check_max: int = 15  # RocketMQ's transactionCheckMax
    transaction_check_interval_ms: int = 1000  # background check-back period; 0: on demand only
    delay_tick_ms: int = 100  # background delivery period; 0: on demand only
    delay_max_ms: int = 40 * DAY_MS  # the furthest deliver_at accepted, from now

    def __post_init__(self) -> None:
        for name, low in (
            ("transaction_timeout_ms", 0),
            ("transaction_check_max", 1),
            ("transaction_check_interval_ms", 0),
            ("delay_tick_ms", 0),
            ("delay_max_ms", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**53:
                raise InvalidConfigError(f"{name} must be an int in [{low}, 2**53), not {value!r}")


def pop_options(options: dict[str, Any]) -> TxnDelayOptions:
    """Take this module's options out of the store's keyword options (the rest are topic
    defaults) and validate them."""
    names = TxnDelayOptions.__dataclass_fields__
    return TxnDelayOptions(**{k: options.pop(k) for k in list(options) if k in names})


# -- what a parked append returns ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingMetadata:
    """A message accepted but not yet in its real topic: `kind` "delayed" (until deliver_at)
    or "half" (until its transaction commits). `topic`/`partition` are where it will go (fixed
    at send time); its offset there is not known yet, so `offset` and `msg_id` are None and the
    `unique_id` is what tracks it (find_by_unique_id, store.trace)."""

    topic: str
    partition: int
    timestamp: int
    unique_id: str | None
    kind: str
    internal_offset: int  # in __delay or __txn_half
    deliver_at: int | None = None

    @property
    def offset(self) -> None:
        return None

    @property
    def msg_id(self) -> None:
        return None

    @property
    def delayed(self) -> bool:
        return self.kind == "delayed"


# -- internal header layout -------------------------------------------------------------------


def int_header(value: int, width: int) -> bytes:
    return value.to_bytes(width, "big", signed=True)


def parked_headers(
    internal: Sequence[tuple[str, bytes | None]], user: Any
) -> list[tuple[str, bytes | None]]:
    """The internal headers first, then the producer's (a mapping or pairs, or None)."""
    out = list(internal)
    if user is not None:
        out.extend(user.items() if isinstance(user, Mapping) else user)
    return out


@dataclass(frozen=True, slots=True)
class Parked:
    """What the internal headers of a parked record (`__delay` or `__txn_half`) say."""

    topic: str  # the real topic and partition it goes to
    partition: int
    timestamp: int | None  # the producer's explicit timestamp (None: stamp at delivery)
    deliver_at: int | None  # delayed messages
    txn: str | None  # half messages: the transaction id
    origin: int  # the offset where it was first parked (a re-parked copy names it)
    user: list[tuple[str, bytes | None]]  # the producer's headers


def _fixed_int(raw: bytes | None, width: int, name: str) -> int:
    if raw is None or len(raw) != width:
        raise InvalidRecordError(f"header {name} is not {width} bytes")
    return int.from_bytes(raw, "big", signed=True)


def read_parked(msg: Message, names: Sequence[str]) -> Parked:
    """The internal fields of a parked record; InvalidRecordError says what is wrong with a
    record that is not one (corrupt bookkeeping, or junk written by something else).

    A re-parked copy carries one more header *before* the others: H_MOVED, the offset of the
    first copy (trim.py). The producer's headers follow the internal ones, so a producer header
    with one of these names is never taken for ours."""
    hdrs = list(msg.headers)
    origin = msg.offset
    if hdrs and hdrs[0][0] == H_MOVED:
        origin = _fixed_int(hdrs[0][1], 8, H_MOVED)
        if not 0 <= origin < msg.offset:
            raise InvalidRecordError(f"{H_MOVED} {origin} is not an earlier offset")
        hdrs = hdrs[1:]
    head = hdrs[: len(names)]
    if [h[0] for h in head] != list(names):
        raise InvalidRecordError(f"the record lacks the internal headers {list(names)}")
    fields = dict(head)
    try:
        topic = (fields[H_TOPIC] or b"").decode()
        txn = None if H_TXN not in fields else (fields[H_TXN] or b"").decode()
    except UnicodeDecodeError as e:
        raise InvalidRecordError(f"an internal header is not UTF-8: {e}") from None
    if not topic or is_internal(topic) or txn == "":
        raise InvalidRecordError(f"bad target topic {topic!r} or transaction id {txn!r}")
    partition = _fixed_int(fields[H_PARTITION], 4, H_PARTITION)
    raw_ts = fields[H_TIMESTAMP]
    timestamp = None if raw_ts is None else _fixed_int(raw_ts, 8, H_TIMESTAMP)
    deliver_at = None
    if H_DELIVER_AT in fields:
        deliver_at = _fixed_int(fields[H_DELIVER_AT], 8, H_DELIVER_AT)
    if partition < 0 or (timestamp is not None and timestamp < 0):
        raise InvalidRecordError(f"negative partition {partition} or timestamp {timestamp}")
    return Parked(topic, partition, timestamp, deliver_at, txn, origin, hdrs[len(names) :])


def read_target(log: Log, msg: Message, names: Sequence[str]) -> Parked:
    """read_parked, and the real topic-partition must exist in this log."""
    parked = read_parked(msg, names)
    if not log.has_topic(parked.topic) or not (
        parked.partition < log.config(parked.topic).partitions
    ):
        raise InvalidRecordError(f"no partition {parked.partition} of topic {parked.topic!r}")
    return parked


def moved_copy_headers(msg: Message) -> list[tuple[str, bytes | None]]:
    """The headers of a re-parked copy of `msg`: H_MOVED (its first offset), then its own."""
    hdrs = list(msg.headers)
    origin = msg.offset
    if hdrs and hdrs[0][0] == H_MOVED:
        origin = _fixed_int(hdrs[0][1], 8, H_MOVED)
        hdrs = hdrs[1:]
    return [(H_MOVED, int_header(origin, 8)), *hdrs]


def durable_end(log: Log, topic: str) -> int:
    """Offsets of the one-partition `topic` below this are on disk (its recovery point)."""
    return log.partition(topic, 0).recovery_point


def get_parked(log: Log, topic: str, offset: int) -> Message | None:
    """The record at `offset` of the one-partition internal `topic` (None: not there)."""
    return log.partition(topic, 0).get(offset, log.verify_crc)


def check_timestamp(ts: object) -> None:
    """A parked message's own timestamp: None (stamped when it is re-appended) or ms >= 0."""
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
        raise InvalidRecordError(f"timestamps must be ints >= 0, not {ts!r}")


def to_ranges(offsets: Iterable[int]) -> list[list[int]]:
    """Sorted offsets as [first, last] runs (what the snapshots store)."""
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and out[-1][1] == o - 1:
            out[-1][1] = o
        else:
            out.append([o, o])
    return out


def from_ranges(runs: Iterable[Sequence[int]]) -> set[int]:
    return {o for a, b in runs for o in range(a, b + 1)}


def state_record(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode()


def json_record(msg: Message) -> dict[str, Any]:
    """The JSON object a bookkeeping record holds; ValueError when it holds something else."""
    try:
        value = json.loads(msg.value or b"")
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {type(value).__name__}")
    return value


def is_offset(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


def check_rows(value: object, kinds: Sequence[type], name: str) -> list[list[Any]]:
    """`value` must be a list of rows [x, y, ...] of these kinds (ints: offsets >= 0)."""
    if not isinstance(value, list):
        raise ValueError(f"{name} is not a list")
    for row in value:
        if not (isinstance(row, list) and len(row) == len(kinds)) or not all(
            is_offset(x) if k is int else isinstance(x, k) for x, k in zip(row, kinds, strict=True)
        ):
            raise ValueError(f"{name} holds a bad row {row!r}")
    return value


def read_state(msg: Message) -> dict[str, Any]:
    """A `__delay_state` snapshot, checked field by field (ValueError names the bad one)."""
    state = json_record(msg)
    kind = state.get("t")
    if kind not in ("prepare", "done"):
        raise ValueError(f"unknown kind {kind!r}")
    if not is_offset(state.get("low")):
        raise ValueError("no valid low")
    check_rows(state.get("above"), (int, int), "above")
    check_rows(state.get("doubt"), (int, int), "doubt")
    if kind == "prepare":
        items = check_rows(state.get("items"), (int, str, int), "items")
        targets = check_rows(state.get("targets"), (str, int, int), "targets")
        if {(t, p) for _o, t, p in items} - {(t, p) for t, p, _e in targets}:
            raise ValueError("an item's target has no end offset")
    return state


def report_skipped(log: Log, msg: Message, reason: object) -> None:
    """Skip-and-report an internal record its reader cannot parse (log/internal.py)."""
    log.skipped.report(msg.topic, msg.partition, msg.offset, str(reason))


# -- the delay manager -------------------------------------------------------------------------


def check_delay(
    deliver_at: object, delay_ms: object, now: int, max_ms: int, n: int
) -> list[int] | None:
    """The deliver_at of each of `n` messages (None: not delayed). Either argument may be one
    int for all or a list of n ints; InvalidRecordError names a bad one."""
    if deliver_at is None and delay_ms is None:
        return None
    if deliver_at is not None and delay_ms is not None:
        raise InvalidRecordError("give deliver_at or delay_ms, not both")
    name, raw = ("deliver_at", deliver_at) if deliver_at is not None else ("delay_ms", delay_ms)
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw] * n
    if len(values) != n:
        raise InvalidRecordError(f"{len(values)} {name} values for {n} messages")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidRecordError(f"{name} must be an int >= 0 (ms), not {v!r}")
        at = v if name == "deliver_at" else now + v
        if at > now + max_ms:
            raise InvalidRecordError(
                f"{name}={v} is more than delay_max_ms={max_ms} ms after now ({now})"
            )
        out.append(at)
    return out


class DelayManager:
    """The timer log, its heap of pending messages and the delivery loop of one log.

    Loaded lazily (first delayed append, first delivery, or the background task): the newest
    valid `__delay_state` record gives (low, delivered offsets above low); `__delay` is read from
    low and every record not delivered goes on the heap as (deliver_at, origin, timer offset)."""

    def __init__(self, log: Log, tracer: Tracer | None, options: TxnDelayOptions):
        self.log = log
        self.tracer = tracer
        self.options = options
        self._lock = threading.RLock()
        self._loaded = False
        # (deliver_at, origin, timer offset, topic, partition): due order is deliver_at, then
        # where the message was first parked; an entry whose offset is no longer pending (it
        # was re-parked) is dropped when it comes up
        self._heap: list[tuple[int, int, int, str, int]] = []
        self._pending: dict[int, int] = {}  # timer offset -> origin
        self._by_origin: dict[int, int] = {}  # origin -> timer offset, of pending messages
        self._low = 0  # every timer offset below it is delivered
        self._above: set[int] = set()  # delivered offsets >= low
        self._in_doubt: dict[int, int] = {}  # timer offset -> target end offset before the crash
        self._state_offset = -1  # the newest state record (the only one a load needs)
        self.max_round = 10_000

    # -- loading

    def _load(self) -> None:
        if self._loaded:
            return
        log = self.log
        state = self._newest_state()
        if state is not None:
            self._low = int(state["low"])
            self._above = from_ranges(state["above"])
            self._in_doubt = {int(off): int(end) for off, end in state["doubt"]}
            if state["t"] == "prepare":
                ends = {(t, p): e for t, p, e in state["targets"]}
                for off, t, p in state["items"]:  # an older end (an earlier crash) wins
                    self._in_doubt.setdefault(off, ends[(t, p)])
        if log.has_topic(DELAY_TOPIC):
            for m in scan(log, DELAY_TOPIC, 0, self._low):
                if m.offset in self._above:
                    continue
                try:
                    parked = read_target(log, m, DELAY_HEADERS)
                except InvalidRecordError as e:
                    report_skipped(log, m, e)  # never pending: the low passes over it
                    continue
                earlier = self._by_origin.get(parked.origin)
                if earlier is not None:  # a re-parked copy: it replaces the earlier one
                    self._done(earlier)
                assert parked.deliver_at is not None
                self._push(parked.deliver_at, parked.origin, m.offset, parked.topic,
                           parked.partition)  # fmt: skip
        self._loaded = True

    def _newest_state(self) -> dict[str, Any] | None:
        """The newest `__delay_state` record that parses (junk after it is skipped, reported)."""
        log = self.log
        if not log.has_topic(DELAY_STATE_TOPIC):
            return None
        part = log.partition(DELAY_STATE_TOPIC, 0)
        for off in range(part.end_offset - 1, part.start_offset - 1, -1):
            m = get_parked(log, DELAY_STATE_TOPIC, off)
            if m is None:
                continue
            try:
                state = read_state(m)
            except ValueError as e:
                report_skipped(log, m, e)
                continue
            self._state_offset = off
            return state
        return None

    def _push(self, at: int, origin: int, offset: int, topic: str, partition: int) -> None:
        heapq.heappush(self._heap, (at, origin, offset, topic, partition))
        self._pending[offset] = origin
        self._by_origin[origin] = offset

    def _done(self, offset: int) -> None:
        """The message at timer offset `offset` is delivered (or re-parked elsewhere)."""
        origin = self._pending.pop(offset)
        if self._by_origin.get(origin) == offset:
            del self._by_origin[origin]
        self._in_doubt.pop(offset, None)
        self._above.add(offset)

    def pending(self) -> int:
        """How many delayed messages wait for delivery."""
        with self._lock:
            self._load()
            return len(self._pending)

    # -- sending

    def park(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Any] | None,
        parts: Sequence[int],
        timestamps: Sequence[int | None] | None,
        deliver_at: list[int],
    ) -> list[PendingMetadata]:
        """Park messages (already given their headers by message_headers) in the timer log;
        `parts` is the partition each will go to (routed by the sender: fixed now)."""
        log = self.log
        n = len(values)
        rows = []
        for i in range(n):
            ts = None if timestamps is None else timestamps[i]
            check_timestamp(ts)
            internal = [
                (H_TOPIC, topic.encode()),
                (H_PARTITION, int_header(parts[i], 4)),
                (H_DELIVER_AT, int_header(deliver_at[i], 8)),
                (H_TIMESTAMP, None if ts is None else int_header(ts, 8)),
            ]
            rows.append(parked_headers(internal, None if headers is None else headers[i]))
        with self._lock:
            self._load()
            timer = log.internal_topic(
                DELAY_TOPIC, unique_ids=True, key_index=False, **KEPT_UNTIL_RESOLVED
            )
            md = log.append_records(timer, 0, values, keys, rows)
            now = log.clock()
            out = []
            for i in range(n):
                off = md.base_offset + i
                self._push(deliver_at[i], off, off, topic, parts[i])
                out.append(
                    PendingMetadata(
                        topic, parts[i], now, md.unique_id(i), "delayed", off, deliver_at[i]
                    )
                )
        trace_parked(self.tracer, out, "delayed", DELAY_TOPIC)
        if min(deliver_at) <= now + max(self.options.delay_tick_ms, 1):
            log.tasks.wake()
        return out

    # -- delivering

    def deliver_due(self, now: int | None = None) -> int:
        """Deliver every message due at `now` (default: the log's clock); returns how many."""
        self.log.check_writable()
        total = 0
        while True:
            done = self._round(self.log.clock() if now is None else now)
            total += done
            if done < self.max_round:
                return total

    def _round(self, now: int) -> int:
        """One delivery round through the two-phase relay (relay.py): the timer records and
        the `prepare` snapshot durable before the first real append (so a redelivery after any
        crash or power loss knows these messages are in doubt), the real appends before the
        `done` snapshot (so "delivered" never outlives the messages)."""
        log = self.log
        with self._lock:
            self._load()
            due: list[tuple[int, int, int, str, int]] = []
            while self._heap and self._heap[0][0] <= now and len(due) < self.max_round:
                entry = heapq.heappop(self._heap)
                if self._pending.get(entry[2]) == entry[1]:  # else re-parked since
                    due.append(entry)
            if not due:
                return 0
            groups: dict[tuple[str, int], list[tuple[int, int, Message]]] = {}
            for at, _origin, off, topic, p in due:
                m = get_parked(log, DELAY_TOPIC, off)
                if m is None:  # gone (the timer log was trimmed under it): nothing to deliver
                    _log.warning("delayed message at __delay offset %d is gone", off)
                    continue
                groups.setdefault((topic, p), []).append((at, off, m))
            in_doubt = dict(self._in_doubt)
            events: list[TraceEvent] = []

            def prepare() -> str:
                targets = [[t, p, log.partition(t, p).end_offset] for t, p in sorted(groups)]
                items = [[off, t, p] for (t, p), g in groups.items() for _a, off, _m in g]
                return self._write_state("prepare", items=items, targets=targets)

            def finish() -> None:
                for _at, _origin, off, _t, _p in due:
                    self._done(off)
                self._advance_low()
                self._write_state("done")

            relay(
                log,
                "delay",
                DELAY_TOPIC,
                groups,
                prepare,
                lambda _t, _p, row: in_doubt.get(row[1]),
                lambda row: row[2].unique_id,
                lambda t, p, rows: events.extend(self._deliver(t, p, rows, now)),
                finish,
            )
        if self.tracer is not None and events:
            self.tracer.record(events)
        return len(due)

    def _write_state(self, kind: str, **extra: Any) -> str:
        """Append a snapshot: the low, the delivered offsets above it, the messages in doubt.
        Returns the state topic."""
        log = self.log
        state = log.internal_topic(
            DELAY_STATE_TOPIC, unique_ids=False, key_index=False, **KEPT_UNTIL_RESOLVED
        )
        md = log.append_records(
            state,
            0,
            [
                state_record(
                    t=kind,
                    low=self._low,
                    above=to_ranges(self._above),
                    doubt=[[off, end] for off, end in self._in_doubt.items()],
                    **extra,
                )
            ],
        )
        self._state_offset = md.base_offset
        return state

    def _deliver(
        self, topic: str, partition: int, rows: list[tuple[int, int, Message]], now: int
    ) -> list[TraceEvent]:
        md = append_parked(self.log, topic, partition, [m for _at, _off, m in rows],
                           DELAY_HEADERS)  # fmt: skip
        return [
            TraceEvent(
                m.unique_id,
                "delay_delivered",
                now,
                topic,
                partition,
                md.base_offset + i,
                None,
                {"deliver_at": at, "timer_offset": off},
            )
            for i, (at, off, m) in enumerate(rows)
            if m.unique_id is not None
        ]

    def _advance_low(self) -> None:
        log = self.log
        end = log.partition(DELAY_TOPIC, 0).end_offset if log.has_topic(DELAY_TOPIC) else 0
        while self._low < end and self._low not in self._pending:
            self._above.discard(self._low)
            self._low += 1

    # -- trimming (trim.py)

    def trim(self) -> RetentionReport:
        """Delete the prefix of `__delay` whose messages are all delivered, re-parking the few
        pending ones first when that frees at least twice what it copies, and the
        `__delay_state` records older than the newest one. Every record the deletion relies on
        is made durable first."""
        log = self.log
        report = RetentionReport()
        with self._lock:
            self._load()
            if not log.has_topic(DELAY_TOPIC) or not log.has_topic(DELAY_STATE_TOPIC):
                return report
            bases = segment_bases(log.partition(DELAY_TOPIC, 0))
            cap = min(self._in_doubt, default=bases[-1])  # in doubt: redelivered, never moved
            boundary = trim_point(bases, sorted(self._pending), cap)
            movers = sorted(off for off in self._pending if off < boundary)
            if movers:
                self._repark(movers)
            log.sync_partitions([(DELAY_TOPIC, 0), (DELAY_STATE_TOPIC, 0)])
            report.merge(delete_below(log.partition(DELAY_TOPIC, 0), self._low))
            if self._state_offset >= 0:
                report.merge(delete_below(log.partition(DELAY_STATE_TOPIC, 0), self._state_offset))
        return report

    def _repark(self, offsets: list[int]) -> None:
        """Copy pending messages to the end of the timer log (H_MOVED names their origin), then
        record the old places as done. The copies are durable before the snapshot that drops
        the originals; a crash between the two leaves both, and the load keeps the copy."""
        log = self.log
        msgs = []
        for off in offsets:
            m = get_parked(log, DELAY_TOPIC, off)
            if m is None:
                raise InvalidRecordError(f"pending delayed message at {DELAY_TOPIC}@{off} is gone")
            msgs.append(m)
        md = repark_copies(log, DELAY_TOPIC, msgs)
        log.sync_partitions([(DELAY_TOPIC, 0)])
        crash_point("delay.after_repark")
        for i, m in enumerate(msgs):
            parked = read_parked(m, DELAY_HEADERS)
            assert parked.deliver_at is not None
            self._done(m.offset)
            self._push(parked.deliver_at, parked.origin, md.base_offset + i, parked.topic,
                       parked.partition)  # fmt: skip
        self._advance_low()
        self._write_state("done")

    def register(self) -> None:
        """The background delivery task (not for read-only stores or delay_tick_ms=0)."""
        if self.options.delay_tick_ms > 0:
            self.log.tasks.add("delay", self.options.delay_tick_ms, background(self.deliver_due))


def trace_parked(
    tracer: Tracer | None, out: Sequence[PendingMetadata], event: str, parked: str, **lead: Any
) -> None:
    """The trace event of each parked message with a unique ID: where it is parked, and in its
    detail `lead`, then the topic and partition it goes to (and when, for a delayed one)."""
    if tracer is None:
        return
    events = []
    for p in out:
        if p.unique_id is not None:
            detail = {**lead, "topic": p.topic, "partition": p.partition}
            if p.deliver_at is not None:
                detail["deliver_at"] = p.deliver_at
            events.append(TraceEvent(p.unique_id, event, p.timestamp, parked, 0,
                                     p.internal_offset, None, detail))  # fmt: skip
    tracer.record(events)


def append_parked(
    log: Log, topic: str, partition: int, msgs: Sequence[Message], names: Sequence[str]
) -> BatchMetadata:
    """Re-append parked records to their real partition, as one batch: value, key, the
    producer's headers and unique ID kept; the producer's timestamp, or now when it gave none."""
    values, keys, headers, stamps = [], [], [], []
    now = log.clock()
    for m in msgs:
        parked = read_parked(m, names)  # read at send or load: known good
        values.append(m.value)
        keys.append(m.key)
        headers.append(parked.user)
        stamps.append(now if parked.timestamp is None else parked.timestamp)
    return log.append_records(topic, partition, values, keys, headers, stamps)


def repark_copies(log: Log, topic: str, msgs: Sequence[Message]) -> BatchMetadata:
    """Copy parked records to the end of their log (trim.py), each naming its first offset."""
    return log.append_records(
        topic,
        0,
        [m.value for m in msgs],
        [m.key for m in msgs],
        [moved_copy_headers(m) for m in msgs],
        timestamps=[m.timestamp for m in msgs],
    )


def background(run: Callable[[], object]) -> Callable[[], object]:
    """`run` for the background thread: a store closing under it is not a failure."""

    def task() -> object:
        try:
            return run()
        except StoreClosedError:
            return None

    return task
