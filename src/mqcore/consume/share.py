"""Share groups: consumers beyond the partition count, each record acknowledged on its own.

KIP-932's model ("queues for Kafka") on mqcore's log. Every member of a share group may receive
records of every partition of its topics; a record is handed out under an acquisition lock
(`record_lock_ms`) to one member at a time, and that member acknowledges it:
  accept   done for good
  release  give it back now (its delivery count stays), another member gets it
  reject   done for good, not processed (archived; dead-lettered when the group asks for it)
  renew    keep the lock for another `record_lock_ms`
A lock that expires releases the record. A record is archived instead of released once it has
been delivered `delivery_count_limit` times (and then dead-lettered to `__dlq.<group>` when
`dead_letter=True`, with the origin headers of consume/retry.py).

The share-partition (one per group, topic, partition) keeps the window [start, end): every
offset below `start` is done, every offset from `end` on is still in the log only, and inside
it each record not done yet is available or acquired, with its delivery count. At most
`max_in_flight_records` records are in the window at once: at the bound a poll hands out only
released records until acknowledgements move `start` on (Kafka's share-partition record locks
limit). Records the group's filter (tag, SQL92) passes over, control records and compacted gaps
never enter the window: they are done.

State changes are kept in memory under the group's lock and written to `__share_group_state`
(sharestate.py): by each poll that acquired records (no sync) and by commit() (fdatasync'd).
Groups coordinate inside one process, as consumer groups do (consume/group.py).

Records are read through a RecordSource: the store's own partitions (LogSource), or on a
cluster's share coordinator each partition's leader below its high watermark (the server's),
with a `confirm` after each sync that returns once the state is replicated.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from mqcore._ext.batch import Message
from mqcore.consume.fetch import FILTER_SCAN_BUDGET, FilteredFetch
from mqcore.consume.group import DLQ_PREFIX, TopicPartition, validate_group_for_topics
from mqcore.consume.pulllog import PullBuffer, PullLog
from mqcore.consume.retry import copy_headers
from mqcore.consume.sharestate import ShareSnapshot, ShareStateStore, runs_of
from mqcore.errors import (
    ConsumerClosedError,
    InvalidConfigError,
    InvalidRecordStateError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.log.trace import TraceEvent

if TYPE_CHECKING:
    from mqcore.consume.group import ConsumeState
    from mqcore.log.manager import Log
    from mqcore.log.trace import Tracer

AVAILABLE, ACQUIRED = 0, 1  # the states of a record in the window (done records leave it)
ACK_KINDS = ("accept", "release", "reject", "renew")
RESETS = ("earliest", "latest")
DEFAULT_LOCK_MS = 30_000  # Kafka's group.share.record.lock.duration.ms
DEFAULT_DELIVERY_LIMIT = 5  # Kafka's group.share.delivery.count.limit
DEFAULT_MAX_IN_FLIGHT = 2000  # Kafka's group.share.partition.max.record.locks
MAX_POLL_RECORDS = 100_000
PULL_PENDING_MAX = 10_000  # pull-log entries a group gathers before a poll appends them
NO_DEADLINE = (1 << 63) - 1


def _int_arg(name: str, value: object, low: int, high: int = NO_DEADLINE) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidConfigError(f"{name} must be an int in [{low}, {high}], not {value!r}")
    return value


class RecordSource(Protocol):
    """Where share groups read the records they hand out."""

    @property
    def wait_cap(self) -> float | None:
        """The longest a waiting poll sleeps before it looks again (None: the store's appends
        wake it; a cluster's remote leaders' appends wake nothing here)."""
        ...

    def partitions_of(self, topic: str) -> list[int]:
        """The topic's partition numbers (UnknownTopicError)."""
        ...

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(start, end) of what may be handed out: the log start and the end a consumer sees
        (UnknownTopicError, UnknownPartitionError when it is not there)."""
        ...

    def get(self, topic: str, partition: int, offset: int) -> Message | None:
        """One record below the end; None when it is gone (compacted, retention)."""
        ...

    def fetch(
        self, tp: TopicPartition, filt: FilteredFetch, offset: int, room: int, budget: list[int]
    ) -> tuple[list[Message], int]:
        """FilteredFetch.fetch's contract: up to `room` records from `offset` that pass the
        filters, and the offset past every record examined."""
        ...


class LogSource:
    """A store's own partitions: what a node of one serves."""

    wait_cap = None

    def __init__(self, log: Log):
        self.log = log

    def partitions_of(self, topic: str) -> list[int]:
        return sorted(self.log.partitions_of(topic))

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        part = self.log.partition(topic, partition)
        return part.start_offset, part.end_offset

    def get(self, topic: str, partition: int, offset: int) -> Message | None:
        part = self.log.find_partition(topic, partition)
        return None if part is None else part.get(offset, self.log.verify_crc)

    def fetch(
        self, tp: TopicPartition, filt: FilteredFetch, offset: int, room: int, budget: list[int]
    ) -> tuple[list[Message], int]:
        return filt.fetch(tp, self.log.partition(*tp), offset, room, budget)


class InFlight:
    """A record in the window that is not done: available or acquired by `member` until
    `expiry` (ms), delivered `count` times so far."""

    __slots__ = ("count", "expiry", "member", "state")

    def __init__(self, state: int, count: int, member: str | None = None, expiry: int = 0):
        self.state, self.count, self.member, self.expiry = state, count, member, expiry


class Outcome(NamedTuple):
    """What an acknowledgement, a release or an expiry did to one record: `ended` is
    "accepted", "rejected", "archived" (the delivery limit), "released" or "renewed". (A
    tuple: one is made per record acknowledged.)"""

    offset: int
    ended: str
    deliveries: int
    member: str | None  # who held it (None: nobody, for a record that was available)


class SharePartition:
    """The in-flight window of one share-partition: a plain state machine over offsets, with no
    I/O (the group reads the log and writes the state); not thread-safe (the group's lock).

    `records` holds the records not done, in ascending offset order (a dict keeps insertion
    order, and records enter only at `end`), so `start` is its first key, or `end`."""

    def __init__(self, end: int, pending: dict[int, int] | None = None):
        self.end = end
        self.records: dict[int, InFlight] = {
            off: InFlight(AVAILABLE, count) for off, count in sorted((pending or {}).items())
        }
        self.available = len(self.records)  # records in state AVAILABLE: a poll with none
        # to hand out does not walk a window of acquired ones
        # no acquired record's lock expires before this (a lower bound: records that ended
        # since it was computed may have held the earliest locks), so a poll looks for
        # expired locks only once it is reached instead of walking the window every time
        self.earliest_expiry = NO_DEADLINE

    @property
    def start(self) -> int:
        return next(iter(self.records), self.end)

    def snapshot(self) -> ShareSnapshot:
        """The durable form: acquired records are written as available (no lock survives a
        restart), with their delivery counts."""
        records = self.records
        return ShareSnapshot(
            self.start, self.end, runs_of(list(records), [r.count for r in records.values()])
        )

    def counts(self) -> tuple[int, int]:
        """(available, acquired) records in the window."""
        return self.available, len(self.records) - self.available

    def next_expiry(self) -> int:
        """When a lock may expire next, in ms (NO_DEADLINE when nothing is acquired); may be
        early, never late: expire() at that time finds the exact next one."""
        return self.earliest_expiry

    def _give_back(self, off: int, rec: InFlight, limit: int, ended: str) -> Outcome:
        """Release rule: available again, or archived once delivered `limit` times."""
        held_by = rec.member
        if rec.count >= limit:
            del self.records[off]
            return Outcome(off, "archived", rec.count, held_by)
        rec.state, rec.member, rec.expiry = AVAILABLE, None, 0
        self.available += 1
        return Outcome(off, ended, rec.count, held_by)

    def _remove(self, off: int) -> None:
        """A record is done, whatever its state."""
        rec = self.records.pop(off, None)
        if rec is not None and rec.state == AVAILABLE:
            self.available -= 1

    def expire(self, now: int, limit: int) -> list[Outcome]:
        """Release every record whose lock has expired ("released", or "archived")."""
        if now < self.earliest_expiry:
            return []
        acquired = [(off, rec) for off, rec in self.records.items() if rec.state == ACQUIRED]
        due = [(off, rec) for off, rec in acquired if rec.expiry <= now]
        self.earliest_expiry = min(
            (rec.expiry for _, rec in acquired if rec.expiry > now), default=NO_DEADLINE
        )
        return [self._give_back(off, rec, limit, "released") for off, rec in due]

    def acquire_available(self, member: str, now: int, lock_ms: int, room: int) -> list[int]:
        """Hand up to `room` available records to `member`, lowest offsets first."""
        out: list[int] = []
        room = min(room, self.available)
        if room <= 0:
            return out
        for off, rec in self.records.items():
            if rec.state == AVAILABLE:
                rec.state, rec.member, rec.expiry = ACQUIRED, member, now + lock_ms
                rec.count += 1
                out.append(off)
                if len(out) >= room:
                    break
        self.available -= len(out)
        if out:
            self.earliest_expiry = min(self.earliest_expiry, now + lock_ms)
        return out

    def room_for_new(self, max_in_flight: int) -> int:
        return max(0, max_in_flight - len(self.records))

    def acquire_new(
        self, offsets: Sequence[int], next_end: int, member: str, now: int, lock_ms: int
    ) -> None:
        """Records read from the log at `end` on (`offsets`, ascending) go to `member`; the
        offsets in [end, next_end) not among them (filtered, control, compacted) are done."""
        if offsets and (offsets[0] < self.end or offsets[-1] >= next_end):
            raise ValueError(
                f"offsets {offsets[0]}..{offsets[-1]} outside [{self.end}, {next_end})"
            )
        expiry = now + lock_ms
        for off in offsets:
            self.records[off] = InFlight(ACQUIRED, 1, member, expiry)
        if offsets:
            self.earliest_expiry = min(self.earliest_expiry, expiry)
        self.end = max(self.end, next_end)

    def acknowledge(
        self, member: str, offset: int, kind: str, now: int, lock_ms: int, limit: int
    ) -> Outcome:
        """Apply `kind` (ACK_KINDS) to a record `member` holds; InvalidRecordStateError when it
        does not hold it (not acquired by it, or its lock has expired)."""
        rec = self.holds(member, offset, now)
        if rec is None:
            found = self.records.get(offset)
            why = (
                "is done already or was never delivered"
                if found is None
                else "is not held by this member"
                if found.state != ACQUIRED or found.member != member
                else "has an expired lock"
            )
            raise InvalidRecordStateError(f"record at offset {offset} {why}")
        if kind == "accept" or kind == "reject":
            del self.records[offset]
            ended = "accepted" if kind == "accept" else "rejected"
            return Outcome(offset, ended, rec.count, member)
        if kind == "renew":
            rec.expiry = now + lock_ms
            return Outcome(offset, "renewed", rec.count, member)
        return self._give_back(offset, rec, limit, "released")

    def holds(self, member: str, offset: int, now: int) -> InFlight | None:
        """The record at `offset` when `member` holds it now (acquired by it, lock not
        expired), else None: what an acknowledgement needs."""
        rec = self.records.get(offset)
        if rec is None or rec.state != ACQUIRED or rec.member != member or rec.expiry <= now:
            return None
        return rec

    def accept_held(
        self, member: str, offsets: Sequence[int], now: int
    ) -> tuple[list[int], list[int]]:
        """Accept those of `offsets` that `member` still holds, pass over the others (implicit
        acknowledgement: a record whose lock expired went back, and is not this member's);
        returns the accepted offsets and their delivery counts (two lists: no object per
        record)."""
        accepted: list[int] = []
        counts: list[int] = []
        records = self.records
        for off in offsets:
            rec = self.holds(member, off, now)
            if rec is not None:
                del records[off]
                accepted.append(off)
                counts.append(rec.count)
        return accepted, counts

    def release_member(self, member: str, limit: int) -> list[Outcome]:
        """Every record `member` holds goes back (it leaves the group)."""
        held = [
            (off, rec)
            for off, rec in self.records.items()
            if rec.state == ACQUIRED and rec.member == member
        ]
        return [self._give_back(off, rec, limit, "released") for off, rec in held]

    def forget_below(self, log_start: int) -> list[int]:
        """Retention or DeleteRecords moved the log start past records of the window: they are
        gone (done); returns their offsets."""
        gone = list(itertools.takewhile(lambda off: off < log_start, self.records))
        for off in gone:
            self._remove(off)
        self.end = max(self.end, log_start)
        return gone

    def cut_back(self, log_end: int) -> None:
        """The log was cut back to `log_end` (recovery of a torn tail): the window ends there."""
        for off in [o for o in self.records if o >= log_end]:
            self._remove(off)
        self.end = min(self.end, log_end)

    def drop(self, offset: int) -> None:
        """A record the log no longer holds (compacted away): done."""
        self._remove(offset)


@dataclass(frozen=True, slots=True)
class ShareLag:
    """A share-partition's backlog: `available` records (never delivered, or released) and
    `in_flight` ones (acquired now), with the window and the log's end."""

    group: str
    topic: str
    partition: int
    start: int
    end: int
    log_end: int
    available: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """What every member of a share group must agree on (the first member sets them)."""

    delivery_count_limit: int
    max_in_flight_records: int
    dead_letter: bool
    auto_offset_reset: str
    tag: str | None  # the filters: what they pass over is done for the whole group
    where: str | None
    isolation_level: str = "read_uncommitted"  # KIP-932's share.isolation.level


class ShareGroup:
    """One share group of a store: its members, share-partitions and durable state. Every
    change happens under `lock`; `wake` wakes polls waiting for records."""

    def __init__(
        self,
        name: str,
        log: Log,
        store: ShareStateStore,
        wake: Callable[[], None],
        tracer: Tracer | None,
        source: RecordSource,
        confirm: Callable[[], None] | None = None,
    ):
        self.name, self.log, self.store, self.wake, self.tracer = name, log, store, wake, tracer
        self.source, self.confirm = source, confirm
        self.lock = threading.Lock()
        self.settings: GroupSettings | None = None
        self.members: set[str] = set()
        self.partitions: dict[TopicPartition, SharePartition] = {}
        self.dirty: set[TopicPartition] = set()
        self.pull = PullLog(log, name)
        # pull-log entries not appended yet, per member: write() appends them, one record each
        self.pull_pending = PullBuffer()
        self._ids = itertools.count(1)

    def join(self, settings: GroupSettings) -> str:
        with self.lock:
            if self.members and self.settings != settings:
                raise InvalidConfigError(
                    f"share group {self.name!r} runs with {self.settings}; a member cannot join "
                    f"with {settings}"
                )
            self.settings = settings
            member = f"{self.name}-share-{next(self._ids)}"
            self.members.add(member)
            return member

    def share_partition(self, tp: TopicPartition, bounds: tuple[int, int]) -> SharePartition:
        """The window of `tp` (call under the lock) whose log holds [start, end) (`bounds`):
        from the durable state, else empty at the log's start or end (auto_offset_reset), then
        moved past what retention removed."""
        log_start, log_end = bounds
        sp = self.partitions.get(tp)
        if sp is None:
            snap = self.store.snapshot(self.name, *tp)
            if snap is not None:
                sp = SharePartition(snap.end, snap.pending())
            else:
                assert self.settings is not None
                reset = self.settings.auto_offset_reset
                sp = SharePartition(log_start if reset == "earliest" else log_end)
                self.dirty.add(tp)
            self.partitions[tp] = sp
        if sp.start < log_start:
            sp.forget_below(log_start)
            self.dirty.add(tp)
        if sp.end > log_end:  # the log was cut back (recovery of a torn tail)
            sp.cut_back(log_end)
            self.dirty.add(tp)
        return sp

    def write(self, pull: bool = True) -> None:
        """Append the changed share-partitions' values and (with `pull`, or when many wait) the
        pull-log entries gathered since, unsynced (call under the lock). A poll writes the
        windows only: its pull-log entries go with the next commit's write (one append)."""
        if self.dirty:
            snaps = {tp: self.partitions[tp].snapshot() for tp in sorted(self.dirty)}
            self.dirty.clear()
            self.store.write(self.name, snaps, sync=False)
        if self.pull_pending.size and (pull or self.pull_pending.size >= PULL_PENDING_MAX):
            for member, groups in self.pull_pending.drain().items():
                self.pull.append(member, groups)

    def sync(self) -> None:
        """fdatasync what write() appended so far (outside the lock: one sync covers every
        member's writes before it), then `confirm` it (a cluster: replicated)."""
        self.store.sync()
        if self.confirm is not None:
            self.confirm()

    def start_of(self, topic: str, partition: int) -> int | None:
        """The share-partition's start: live, else durable; None when the group has none."""
        sp = self.partitions.get((topic, partition))
        if sp is not None:
            return sp.start
        snap = self.store.snapshot(self.name, topic, partition)
        return None if snap is None else snap.start

    def settle(self, tp: TopicPartition, outcomes: Sequence[Outcome]) -> None:
        """After records ended or went back (call under the lock): mark the partition changed,
        note each in the pull log, dead-letter what was archived or rejected when the group
        asks for it, trace each, wake waiting polls when records became available."""
        if not outcomes:
            return
        self.dirty.add(tp)
        for o in outcomes:
            if o.ended != "renewed":
                self.pull_pending.add(o.member or "", *tp, (o.offset,), (o.deliveries,), o.ended)
        settings = self.settings
        assert settings is not None
        if settings.dead_letter:
            ended = [o for o in outcomes if o.ended in ("archived", "rejected")]
            if ended:
                self.dead_letter(tp, ended)
        if any(o.ended == "released" for o in outcomes):
            self.wake()
        if self.tracer is not None:
            self.trace_outcomes(tp, outcomes)

    def settle_accepted(
        self, tp: TopicPartition, member: str, offsets: Sequence[int], counts: Sequence[int]
    ) -> None:
        """settle() for implicit acceptances (`offsets`, with their delivery `counts`): nothing
        to dead-letter or wake for, so only the pull log, the trace and the changed mark."""
        if not offsets:
            return
        self.dirty.add(tp)
        self.pull_pending.add(member, *tp, offsets, counts, "accepted")
        if self.tracer is not None:
            accepted = zip(offsets, counts, strict=True)
            self.trace_outcomes(tp, [Outcome(off, "accepted", n, member) for off, n in accepted])

    def dead_letter(self, tp: TopicPartition, ended: Sequence[Outcome]) -> None:
        msgs = [m for m in (self.source.get(*tp, o.offset) for o in ended) if m]
        if not msgs:
            return
        counts = {o.offset: o.deliveries for o in ended}
        topic = self.log.internal_topic(
            DLQ_PREFIX + self.name, partitions=1, unique_ids=False, cleanup_policy="delete"
        )
        self.log.append_records(
            topic,
            0,
            [m.value for m in msgs],
            [m.key for m in msgs],
            [copy_headers(m, counts[m.offset], None) for m in msgs],
        )

    def trace_outcomes(self, tp: TopicPartition, outcomes: Sequence[Outcome]) -> None:
        assert self.tracer is not None
        now = self.log.clock()
        events = []
        for o in outcomes:
            if o.ended == "renewed":
                continue
            m = self.source.get(*tp, o.offset)
            uid = None if m is None else m.unique_id
            if uid is not None:
                detail = {"share": o.ended, "delivery_count": o.deliveries, "member": o.member}
                events.append(
                    TraceEvent(uid, "acknowledged", now, tp[0], tp[1], o.offset, self.name, detail)
                )
        self.tracer.record(events)

    def leave(self, member: str) -> None:
        with self.lock:
            self.members.discard(member)
            assert self.settings is not None
            for tp, sp in self.partitions.items():
                self.settle(tp, sp.release_member(member, self.settings.delivery_count_limit))


class ShareGroups:
    """Every share group of one store, made by the first share_consumer()."""

    def __init__(
        self,
        log: Log,
        state: ConsumeState,
        tracer: Tracer | None,
        store: ShareStateStore | None = None,
        source: RecordSource | None = None,
        confirm: Callable[[], None] | None = None,
    ):
        self.log, self.state, self.tracer = log, state, tracer
        self.store = ShareStateStore(log) if store is None else store  # the store's replay
        self.source = LogSource(log) if source is None else source
        self.confirm = confirm
        self._lock = threading.Lock()
        self.groups: dict[str, ShareGroup] = {}

    def group(self, name: str) -> ShareGroup:
        with self._lock:
            g = self.groups.get(name)
            if g is None:
                g = self.groups[name] = ShareGroup(
                    name, self.log, self.store, self.state.wake, self.tracer, self.source,
                    self.confirm,
                )  # fmt: skip
            return g

    def has_members(self, group: str) -> bool:
        """Whether `group` has an open member in this process."""
        with self._lock:
            g = self.groups.get(group)
        return g is not None and bool(g.members)

    def write_pending(self, group: str | None = None) -> None:
        """Append what open groups (or `group`) gathered since their last write (pull-log
        entries, changed windows), unsynced: a reader of the pull log sees every step so far."""
        with self._lock:
            live = [g for n, g in self.groups.items() if group in (None, n)]
        for g in live:
            with g.lock:
                g.write()

    def lag(self, group: str | None = None) -> dict[str, list[ShareLag]]:
        with self._lock:
            live = dict(self.groups)
        return share_lags(self.source, self.store, live, group)


def share_lags(
    source: RecordSource,
    store: ShareStateStore,
    live: dict[str, ShareGroup],
    group: str | None = None,
) -> dict[str, list[ShareLag]]:
    """Per share group (all of them, or `group`): each share-partition's backlog. The live
    window where a group is open in this process (`live`), else the durable state, where every
    record not done counts as available (no lock outlives its process)."""
    out: dict[str, list[ShareLag]] = {}
    snaps = store.group_snapshots(group)
    names = {k[0] for k in snaps} | {
        n for n, g in live.items() if g.partitions and group in (None, n)
    }
    for name in sorted(names):
        g = live.get(name)
        tps = {(t, p) for n, t, p in snaps if n == name}
        if g is not None:
            tps |= set(g.partitions)
        rows = []
        for tp in sorted(tps):
            try:
                log_start, log_end = source.bounds(*tp)
            except (UnknownTopicError, UnknownPartitionError):
                continue
            if g is not None and tp in g.partitions:
                with g.lock:
                    sp = g.partitions[tp]
                    available, acquired = sp.counts()
                    start, end = sp.start, sp.end
            else:
                snap = snaps[(name, tp[0], tp[1])]
                start, end, acquired = snap.start, snap.end, 0
                available = sum(length for _, length, _ in snap.runs)
            start, end = max(start, log_start), max(end, log_start)
            available += max(0, log_end - end)
            rows.append(ShareLag(name, tp[0], tp[1], start, end, log_end, available, acquired))
        out[name] = rows
    return out


class ShareConsumer:
    """One member of a share group. Use from one thread; any number of members per group.

    poll() returns records of any partition of its topics under an acquisition lock; each one
    carries `delivery_count`. Implicit mode (default): the next poll(), commit() or close()
    accepts what the previous poll returned and this member still holds. Explicit mode
    (`explicit_ack=True`): acknowledge() every record before the next poll."""

    def __init__(
        self,
        log: Log,
        groups: ShareGroups,
        group: str,
        topics: str | Sequence[str],
        tag: str | None = None,
        where: str | None = None,
        *,
        record_lock_ms: int = DEFAULT_LOCK_MS,
        explicit_ack: bool = False,
        delivery_count_limit: int = DEFAULT_DELIVERY_LIMIT,
        max_in_flight_records: int = DEFAULT_MAX_IN_FLIGHT,
        dead_letter: bool = False,
        auto_offset_reset: str = "earliest",
        now_ms: Any = None,
        isolation_level: str = "read_uncommitted",
    ):
        log.check_writable()
        name = validate_group_for_topics(group)
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        if not topic_list:
            raise InvalidConfigError("a share consumer needs at least one topic")
        if len(set(topic_list)) != len(topic_list):
            raise InvalidConfigError(f"topics listed twice: {topic_list}")
        self._source = groups.source
        self._tps: list[TopicPartition] = []
        for t in topic_list:
            self._tps += [(t, p) for p in self._source.partitions_of(t)]
        # SelectorSyntaxError and a bad isolation_level before joining
        self._filter = FilteredFetch(log, tag, where, isolation_level)
        self.lock_ms = _int_arg("record_lock_ms", record_lock_ms, 1, 3_600_000)
        if not isinstance(explicit_ack, bool) or not isinstance(dead_letter, bool):
            raise InvalidConfigError("explicit_ack and dead_letter are bools")
        if auto_offset_reset not in RESETS:
            raise InvalidConfigError(
                f"auto_offset_reset={auto_offset_reset!r}; expected one of {', '.join(RESETS)}"
            )
        settings = GroupSettings(
            _int_arg("delivery_count_limit", delivery_count_limit, 1, 10_000),
            _int_arg("max_in_flight_records", max_in_flight_records, 1, 1_000_000),
            dead_letter,
            auto_offset_reset,
            tag,
            where,
            isolation_level,
        )
        if now_ms is not None and not callable(now_ms):
            raise InvalidConfigError("now_ms must be a callable returning ms")
        self._now: Callable[[], int] = now_ms or log.clock
        self.log, self.explicit_ack, self.topics = log, explicit_ack, topic_list
        self._groups = groups
        self._group = groups.group(name)
        self.group = name
        self.member_id = self._group.join(settings)
        self._limit = settings.delivery_count_limit
        self._max_in_flight = settings.max_in_flight_records
        self._last: dict[TopicPartition, list[int]] = {}  # the offsets the last poll returned
        self._rotation = 0
        self._closed = False

    # -- polling --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError(
                f"share consumer {self.member_id} of group {self.group!r} is closed"
            )
        self.log.check_open()

    def poll(self, max_records: int = 500, timeout_ms: int = 0) -> list[Message]:
        """Up to max_records records under this member's lock; waits up to timeout_ms for some
        when none is available."""
        self._check_open()
        max_records = _int_arg("max_records", max_records, 1, MAX_POLL_RECORDS)
        timeout_ms = _int_arg("timeout_ms", timeout_ms, 0)
        self._settle_last_poll()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            out, next_expiry, moved = self._acquire(max_records)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                break
            if moved:  # the filters passed over records, and there may be more to examine
                continue
            wait = min(remaining, max(0.0, (next_expiry - self._now()) / 1000))
            self._wait(wait)
        if out and self._group.tracer is not None:
            self._trace_delivered(out)
        return out

    def _settle_last_poll(self) -> None:
        """Implicit mode accepts what the last poll returned and this member still holds;
        explicit mode refuses to go on while any of it is unacknowledged."""
        if not self._last:
            return
        g = self._group
        by_tp = self._last
        with g.lock:
            now = self._now()
            if self.explicit_ack:
                for tp, offsets in by_tp.items():
                    sp = g.partitions[tp]
                    held = [o for o in offsets if sp.holds(self.member_id, o, now)]
                    if held:
                        raise InvalidRecordStateError(
                            f"records of the last poll are not acknowledged (explicit_ack): "
                            f"{tp[0]}-{tp[1]}@{held[0]}" + (" and more" if len(held) > 1 else "")
                        )
            else:
                for tp, offsets in by_tp.items():
                    accepted, counts = g.partitions[tp].accept_held(self.member_id, offsets, now)
                    g.settle_accepted(tp, self.member_id, accepted, counts)
        self._last = {}

    def _acquire(self, room: int) -> tuple[list[Message], int, bool]:
        """One pass over the partitions (rotated per poll): released records first, then new
        ones from the log; the acquisitions are written (no sync) before returning. Returns
        the records, the next lock expiry, and whether a window's end moved."""
        g = self._group
        out: list[Message] = []
        self._rotation += 1
        k = self._rotation % len(self._tps) if self._tps else 0
        next_expiry = NO_DEADLINE
        budget = [FILTER_SCAN_BUDGET]  # records the filters may examine in this pass
        moved = False
        self._last = {}
        with g.lock:
            now = self._now()
            for tp in self._tps[k:] + self._tps[:k]:
                bounds = self._source.bounds(*tp)
                sp = g.share_partition(tp, bounds)
                g.settle(tp, sp.expire(now, self._limit))
                if len(out) < room:
                    end = sp.end
                    got = self._redeliver(tp, sp, now, room - len(out))
                    got += self._take_new(tp, bounds[1], sp, now, room - len(out) - len(got),
                                          budget)  # fmt: skip
                    if got or sp.end != end:
                        g.dirty.add(tp)
                    moved |= sp.end != end
                    if got:
                        offsets = self._last[tp] = [m.offset for m in got]
                        counts = [m.delivery_count for m in got]
                        g.pull_pending.add(self.member_id, *tp, offsets, counts, "delivered")
                        out += got
                next_expiry = min(next_expiry, sp.next_expiry())
            if out or moved:
                g.write(pull=False)
        return out, next_expiry, moved

    def _redeliver(
        self, tp: TopicPartition, sp: SharePartition, now: int, room: int
    ) -> list[Message]:
        out = []
        for off in sp.acquire_available(self.member_id, now, self.lock_ms, room):
            m = self._source.get(*tp, off)
            if m is None:  # compacted away since it entered the window
                sp.drop(off)
                continue
            m.delivery_count = sp.records[off].count
            out.append(m)
        return out

    def _take_new(
        self,
        tp: TopicPartition,
        log_end: int,
        sp: SharePartition,
        now: int,
        room: int,
        budget: list[int],
    ) -> list[Message]:
        """New records from the window's end through the group's filters (fetch.py): those
        that pass are acquired; the ones passed over, control records and compacted gaps up
        to the offset the fetch reached are done."""
        room = min(room, sp.room_for_new(self._max_in_flight))
        if room <= 0 or sp.end >= log_end or budget[0] <= 0:
            return []
        msgs, next_end = self._source.fetch(tp, self._filter, sp.end, room, budget)
        sp.acquire_new([m.offset for m in msgs], next_end, self.member_id, now, self.lock_ms)
        for m in msgs:
            m.delivery_count = 1
        return msgs

    def _wait(self, seconds: float) -> None:
        cap = self._source.wait_cap
        if cap is not None:
            seconds = min(seconds, cap)
        state = self._groups.state
        with state.cond:
            state.waiters += 1
            try:
                state.cond.wait(seconds)
            finally:
                state.waiters -= 1

    def _trace_delivered(self, out: list[Message]) -> None:
        tracer = self._group.tracer
        assert tracer is not None
        now = self.log.clock()
        tracer.record(
            TraceEvent(
                m.unique_id,
                "delivered",
                now,
                m.topic,
                m.partition,
                m.offset,
                self.group,
                {"member": self.member_id, "delivery_count": m.delivery_count},
            )  # fmt: skip
            for m in out
            if m.unique_id is not None
        )

    # -- acknowledging --------------------------------------------------------------------------

    def acknowledge(self, message: Message | tuple[str, int, int], kind: str = "accept") -> None:
        """accept, release, reject or renew one record this member holds (ACK_KINDS), named by
        its Message or (topic, partition, offset); InvalidRecordStateError when the member does
        not hold it (lock expired, acknowledged already). Durable at the next commit()."""
        self._check_open()
        if isinstance(message, Message):
            topic, partition, offset = message.topic, message.partition, message.offset
        elif (
            isinstance(message, tuple)
            and len(message) == 3
            and isinstance(message[0], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in message[1:])
        ):
            topic, partition, offset = message
        else:
            raise InvalidConfigError(
                "acknowledge takes a Message or (topic, partition, offset), not "
                f"{type(message).__name__}"
            )
        if kind not in ACK_KINDS:
            raise InvalidConfigError(f"acknowledgement {kind!r}; expected one of {ACK_KINDS}")
        with self._group.lock:
            self._ack_locked((topic, partition), offset, kind, self._now())

    def _ack_locked(self, tp: TopicPartition, offset: int, kind: str, now: int) -> None:
        g = self._group
        sp = g.partitions.get(tp)
        if sp is None:
            raise InvalidRecordStateError(
                f"{tp[0]}-{tp[1]}@{offset} was not delivered by share group {g.name!r}"
            )
        outcome = sp.acknowledge(self.member_id, offset, kind, now, self.lock_ms, self._limit)
        g.settle(tp, [outcome])

    def commit(self) -> None:
        """Make every acknowledgement so far durable (implicit mode: after accepting the last
        poll's records): one append to `__share_group_state` and an fdatasync."""
        self._check_open()
        if not self.explicit_ack:
            self._settle_last_poll()
        g = self._group
        with g.lock:
            g.write()
            g.pull.trim(g.start_of)
        g.sync()

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group: implicit mode accepts the last poll's records first; whatever this
        member still holds is released; the state is written and synced."""
        if self._closed:
            return
        try:
            if not self.log.closed:
                if not self.explicit_ack:
                    self._settle_last_poll()
                self._group.leave(self.member_id)
                with self._group.lock:
                    self._group.write()
                self._group.sync()
        finally:
            self._closed = True
            with self._group.lock:
                self._group.members.discard(self.member_id)

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
