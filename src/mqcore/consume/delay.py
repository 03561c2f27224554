"""Delayed messages: a timer log (`__delay`) and an in-memory heap, delivered when due.

A message sent with `deliver_at=` / `delay_ms=` is appended to the internal topic `__delay`
instead of its real topic, so every reader of the real topic sees it only once it is delivered
(docs/consume.md). Delivery re-appends the record to the real topic with its key,
headers and unique ID, in due order (deliver_at, then timer-log offset). Progress is durable in
`__delay_state`: the newest record there is a snapshot of what was delivered; a PREPARE snapshot
written before the real appends names the in-doubt messages and where their target partitions
ended, so a crash mid-delivery neither loses nor duplicates (a message whose unique ID is already
in its target partition is not appended again).

Also the pieces transactions share: PendingMetadata, the internal header layout, the store
options of both features, the unique-ID presence check and the crash hook of the tests.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mqcore.consume.trace import TraceEvent
from mqcore.errors import InvalidConfigError, InvalidRecordError, StoreClosedError
from mqcore.query import engine

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.store import Store

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
DELAY_HEADERS = (H_TOPIC, H_PARTITION, H_DELIVER_AT, H_TIMESTAMP)
DAY_MS = 86_400_000

# tests set this to a function of a point name ("delay:after_prepare", "txn:after_append:1",
# ...) that kills the process there; None in normal use
crash_hook: Callable[[str], None] | None = None


def crash_point(name: str) -> None:
    """A step boundary the crash tests can kill the process at."""
    if crash_hook is not None:
        crash_hook(name)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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


def split_parked(
    msg: Message, names: Sequence[str]
) -> tuple[dict[str, bytes | None], list[tuple[str, bytes | None]]]:
    """(internal header values by name, the producer's headers) of a parked record; a record
    whose first headers are not `names` is corrupt bookkeeping."""
    hdrs = list(msg.headers)
    head = hdrs[: len(names)]
    if [h[0] for h in head] != list(names):
        raise InvalidRecordError(
            f"record {msg.topic}-{msg.partition}@{msg.offset} lacks the internal headers {names}"
        )
    return dict(head), hdrs[len(names) :]


def stored_timestamp(raw: bytes | None) -> int | None:
    """The producer's explicit timestamp a parked record kept (None: stamp at delivery)."""
    return None if raw is None else int.from_bytes(raw, "big", signed=True)


# -- never append twice ------------------------------------------------------------------------


class PresenceCheck:
    """Answers 'is unique ID U already in partition P of topic T?' for in-doubt messages.

    A topic with a key index answers from the index; one without is scanned once from the end
    offset recorded before the interrupted appends (anything the crash left is after it)."""

    def __init__(self, store: Store):
        self.store = store
        self._tails: dict[tuple[str, int], set[str]] = {}

    def present(self, topic: str, partition: int, from_offset: int, uid: str | None) -> bool:
        if uid is None:
            return False
        part = self.store._partition(topic, partition)
        if part.config.key_index:
            return bool(engine.find_unique([part], uid, None, None, 1).messages)
        seen = self._tails.get((topic, partition))
        if seen is None:
            seen = set()
            for m in scan(self.store, topic, partition, from_offset):
                if m.unique_id is not None:
                    seen.add(m.unique_id)
            self._tails[(topic, partition)] = seen
        return uid in seen


def scan(store: Store, topic: str, partition: int, start: int) -> Iterable[Message]:
    """Every message of the partition from `start` (clamped to its start offset) to its end."""
    offset = max(start, store.start_offset(topic, partition))
    end = store.end_offset(topic, partition)
    while offset < end:
        chunk = store.read(topic, partition, offset, 1000)
        if not chunk:
            break
        yield from chunk
        offset = chunk[-1].offset + 1


def last_record(store: Store, topic: str) -> Message | None:
    """The newest record of a one-partition internal topic (None when it is empty)."""
    if topic not in store._partitions:
        return None
    end = store.end_offset(topic, 0)
    start = store.start_offset(topic, 0)
    for off in range(end - 1, start - 1, -1):
        m = store.get(topic, 0, off)
        if m is not None:
            return m
    return None


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
    """The timer log, its heap of pending messages and the delivery loop of one store.

    Loaded lazily (first delayed append, first delivery, or the background task): the newest
    `__delay_state` record gives (low, delivered offsets above low); `__delay` is read from low
    and every record not delivered goes on the heap as (deliver_at, timer offset)."""

    def __init__(self, store: Store, options: TxnDelayOptions):
        self.store = store
        self.options = options
        self._lock = threading.RLock()
        self._loaded = False
        self._heap: list[tuple[int, int, str, int]] = []  # (deliver_at, offset, topic, partition)
        self._pending: set[int] = set()
        self._low = 0  # every timer offset below it is delivered
        self._above: set[int] = set()  # delivered offsets >= low
        self._in_doubt: dict[int, int] = {}  # timer offset -> target end offset before the crash
        self.max_round = 10_000

    # -- loading

    def _load(self) -> None:
        if self._loaded:
            return
        store = self.store
        last = last_record(store, DELAY_STATE_TOPIC)
        if last is not None and last.value is not None:
            state = json.loads(last.value)
            self._low = int(state["low"])
            self._above = from_ranges(state["above"])
            self._in_doubt = {int(off): int(end) for off, end in state["doubt"]}
            if state["t"] == "prepare":
                ends = {(t, p): e for t, p, e in state["targets"]}
                for off, t, p in state["items"]:  # an older end (an earlier crash) wins
                    self._in_doubt.setdefault(off, ends[(t, p)])
        if DELAY_TOPIC in store._partitions:
            for m in scan(store, DELAY_TOPIC, 0, self._low):
                if m.offset in self._above:
                    continue
                fields, _ = split_parked(m, DELAY_HEADERS)
                self._push(
                    int.from_bytes(fields[H_DELIVER_AT] or b"", "big", signed=True),
                    m.offset,
                    (fields[H_TOPIC] or b"").decode(),
                    int.from_bytes(fields[H_PARTITION] or b"", "big", signed=True),
                )
        self._loaded = True

    def _push(self, at: int, offset: int, topic: str, partition: int) -> None:
        heapq.heappush(self._heap, (at, offset, topic, partition))
        self._pending.add(offset)

    def pending(self) -> int:
        """How many delayed messages wait for delivery."""
        with self._lock:
            self._load()
            return len(self._pending)

    # -- sending

    def append(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Any] | None,
        partition: int | None,
        timestamps: Sequence[int | None] | None,
        deliver_at: list[int],
    ) -> list[PendingMetadata]:
        """Park messages (already given their headers by message_headers) in the timer log.

        The partition is resolved now with the store's partitioner (a key routes as it would
        have; no key and no partition: round robin per message), so the placement is fixed."""
        store = self.store
        store._check_writable()
        if topic in (DELAY_TOPIC, DELAY_STATE_TOPIC) or topic.startswith("__txn_"):
            raise InvalidRecordError(f"cannot delay messages into internal topic {topic!r}")
        store._parts(topic, create=True)
        count = store._configs[topic].partitions
        n = len(values)
        parts = [
            store._partition(
                topic,
                store._choose_partition(topic, None if keys is None else keys[i], count)
                if partition is None
                else partition,
            ).partition
            for i in range(n)
        ]
        rows = []
        for i in range(n):
            ts = None if timestamps is None else timestamps[i]
            if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
                raise InvalidRecordError(f"timestamps must be ints >= 0, not {ts!r}")
            internal = [
                (H_TOPIC, topic.encode()),
                (H_PARTITION, int_header(parts[i], 4)),
                (H_DELIVER_AT, int_header(deliver_at[i], 8)),
                (H_TIMESTAMP, None if ts is None else int_header(ts, 8)),
            ]
            rows.append(parked_headers(internal, None if headers is None else headers[i]))
        with self._lock:
            self._load()
            timer = store._internal_topic(
                DELAY_TOPIC, unique_ids=True, key_index=False, retention_ms=-1
            )
            md = store.append_batch(timer, list(values), keys, rows, partition=0)
            now = now_ms()
            out = []
            for i in range(n):
                off = md.base_offset + i
                self._push(deliver_at[i], off, topic, parts[i])
                out.append(
                    PendingMetadata(
                        topic, parts[i], now, md.unique_id(i), "delayed", off, deliver_at[i]
                    )
                )
        if store._tracer is not None:
            store._tracer.record(
                TraceEvent(
                    p.unique_id,
                    "delayed",
                    now,
                    DELAY_TOPIC,
                    0,
                    p.internal_offset,
                    None,
                    {"topic": p.topic, "partition": p.partition, "deliver_at": p.deliver_at},
                )
                for p in out
                if p.unique_id is not None
            )
        if min(deliver_at) <= now + max(self.options.delay_tick_ms, 1):
            store._tasks.wake()
        return out

    # -- delivering

    def deliver_due(self, now: int | None = None) -> int:
        """Deliver every message due at `now` (default: the clock); returns how many."""
        self.store._check_writable()
        total = 0
        while True:
            done = self._round(now_ms() if now is None else now)
            total += done
            if done < self.max_round:
                return total

    def _round(self, now: int) -> int:
        store = self.store
        with self._lock:
            self._load()
            due: list[tuple[int, int, str, int]] = []
            while self._heap and self._heap[0][0] <= now and len(due) < self.max_round:
                due.append(heapq.heappop(self._heap))
            if not due:
                return 0
            groups: dict[tuple[str, int], list[tuple[int, int, Message]]] = {}
            for at, off, topic, p in due:
                m = store.get(DELAY_TOPIC, 0, off)
                if m is None:  # gone (retention of the timer log): nothing to deliver
                    _log.warning("delayed message at __delay offset %d is gone", off)
                    continue
                groups.setdefault((topic, p), []).append((at, off, m))
            state = store._internal_topic(
                DELAY_STATE_TOPIC, unique_ids=False, key_index=False, retention_ms=-1
            )
            in_doubt = dict(self._in_doubt)
            targets = [[t, p, store.end_offset(t, p)] for t, p in sorted(groups)]
            store.append(
                state,
                state_record(
                    t="prepare",
                    low=self._low,
                    above=to_ranges(self._above),
                    items=[[off, t, p] for (t, p), g in groups.items() for _a, off, _m in g],
                    targets=targets,
                    doubt=[[off, end] for off, end in self._in_doubt.items()],
                ),
            )
            crash_point("delay:after_prepare")
            check = PresenceCheck(store)
            events: list[TraceEvent] = []
            for i, (t, p) in enumerate(sorted(groups)):
                rows = [
                    (at, off, m)
                    for at, off, m in groups[(t, p)]
                    if off not in in_doubt or not check.present(t, p, in_doubt[off], m.unique_id)
                ]
                if rows:
                    events.extend(self._deliver(t, p, rows, now))
                crash_point(f"delay:after_append:{i + 1}")
            if store.flush_policy.mode == "interval":
                for t, p in groups:
                    store._partition(t, p).flush()
            for _at, off, _t, _p in due:
                self._pending.discard(off)
                self._in_doubt.pop(off, None)
                self._above.add(off)
            self._advance_low()
            store.append(
                state,
                state_record(
                    t="done",
                    low=self._low,
                    above=to_ranges(self._above),
                    doubt=[[off, end] for off, end in self._in_doubt.items()],
                ),
            )
        if store._tracer is not None and events:
            store._tracer.record(events)
        return len(due)

    def _deliver(
        self, topic: str, partition: int, rows: list[tuple[int, int, Message]], now: int
    ) -> list[TraceEvent]:
        values, keys, headers, stamps = [], [], [], []
        for _at, _off, m in rows:
            fields, user = split_parked(m, DELAY_HEADERS)
            values.append(m.value)
            keys.append(m.key)
            headers.append(user)
            ts = stored_timestamp(fields[H_TIMESTAMP])
            stamps.append(now_ms() if ts is None else ts)
        md = self.store.append_batch(
            topic, values, keys, headers, partition=partition, timestamps=stamps
        )
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
        end = self.store.end_offset(DELAY_TOPIC, 0) if DELAY_TOPIC in self.store._partitions else 0
        while self._low < end and self._low not in self._pending:
            self._above.discard(self._low)
            self._low += 1

    def register(self) -> None:
        """The background delivery task (not for read-only stores or delay_tick_ms=0)."""
        if self.options.delay_tick_ms > 0:
            self.store._tasks.add("delay", self.options.delay_tick_ms, background(self.deliver_due))


def background(run: Callable[[], object]) -> Callable[[], object]:
    """`run` for the background thread: a store closing under it is not a failure."""

    def task() -> object:
        try:
            return run()
        except StoreClosedError:
            return None

    return task
