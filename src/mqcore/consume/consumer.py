"""The group consumer: `store.consumer(group, topics, tag=None, where=None, ...)`.

poll() returns messages of the partitions this member owns (group.py), from each partition's
position on; commit() stores the positions in `__consumer_offsets` (offsets.py). At-least-once:
what was polled but not committed is delivered again after a crash or a rebalance.

Filters (tag, SQL92 `where`) are applied by fetch.py's FilteredFetch, shared with share groups:
in the scan kernel (or through the tag column), a record that does not pass never becomes a
Message. A filtered poll examines at most FILTER_SCAN_BUDGET records and returns what it found,
possibly nothing, with the positions advanced past every examined record (RocketMQ's filtered
pull).

Priorities: each poll picks a leading topic among the topics with data by smooth weighted round
robin over the priorities (default 1 each; the retry topic has 1); the leader is served first,
then the other topics in descending priority (ties: name) while room is left. Over any run of
polls in which every topic has data, a topic leads in exactly weight / (sum of weights) of
them (10 and 1: 10 of every 11 polls lead with the first, 1 with the second), so a lower
priority is never starved.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mqcore._ext.batch import Message
from mqcore.consume.fetch import FILTER_SCAN_BUDGET, FilteredFetch
from mqcore.consume.group import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    TopicPartition,
    unused_retry_level,
    validate_group_for_topics,
)
from mqcore.consume.offsets import OffsetAndMetadata
from mqcore.consume.retry import check_levels, copy_headers, due_time, reconsume_times
from mqcore.errors import (
    CommitFailedError,
    ConsumerClosedError,
    InvalidConfigError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownPartitionError,
)
from mqcore.log.trace import TraceEvent, events_for
from mqcore.storage.partition import Partition

if TYPE_CHECKING:
    from mqcore.consume.group import ConsumeState, GroupCoordinator
    from mqcore.log.manager import Log
    from mqcore.log.trace import Tracer

RESETS = ("earliest", "latest", "none")
MAX_POLL_RECORDS = 100_000
NO_END = (1 << 63) - 1


def _int_arg(name: str, value: object, low: int, high: int = NO_END) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidConfigError(f"{name} must be an int in [{low}, {high}], not {value!r}")
    return value


class Consumer:
    """One member of a consumer group. Use from one thread (one consumer per thread).
    Rebalances take effect inside poll() only (as in Kafka), so between two polls the
    assignment, positions and commit() refer to what the last poll delivered."""

    def __init__(
        self,
        log: Log,
        state: ConsumeState,
        tracer: Tracer | None,
        group: str,
        topics: str | Sequence[str],
        tag: str | None = None,
        where: str | None = None,
        *,
        auto_offset_reset: str = "earliest",
        enable_auto_commit: bool = False,
        auto_commit_interval_ms: int = 5000,
        priorities: Mapping[str, int] | None = None,
        max_reconsume_times: int = 16,
        retry_backoff_ms: Sequence[int] | None = None,
        now_ms: Any = None,
        isolation_level: str = "read_uncommitted",
    ):
        log.check_writable()
        self.group = validate_group_for_topics(group)
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        if not topic_list:
            raise InvalidConfigError("a consumer needs at least one topic")
        for t in topic_list:
            log.partitions_of(t)  # UnknownTopicError / InvalidTopicError
        if len(set(topic_list)) != len(topic_list):
            raise InvalidConfigError(f"topics listed twice: {topic_list}")
        if auto_offset_reset not in RESETS:
            raise InvalidConfigError(
                f"auto_offset_reset={auto_offset_reset!r}; expected one of {', '.join(RESETS)}"
            )
        if not isinstance(enable_auto_commit, bool):
            raise InvalidConfigError(
                f"enable_auto_commit must be a bool, not {enable_auto_commit!r}"
            )
        self._auto_interval = _int_arg("auto_commit_interval_ms", auto_commit_interval_ms, 0)
        self.max_reconsume_times = _int_arg("max_reconsume_times", max_reconsume_times, 0, 10_000)
        self.levels = check_levels(retry_backoff_ms)
        self._weights = self._check_priorities(priorities, topic_list)
        self._filter = FilteredFetch(log, tag, where, isolation_level)
        self.spec = self._filter.spec
        if now_ms is not None and not callable(now_ms):
            raise InvalidConfigError("now_ms must be a callable returning ms")
        self._now = now_ms or log.clock
        self.log, self._state, self._tracer, self.topics = log, state, tracer, topic_list
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = enable_auto_commit
        # made by the group's first nack (retry.py): until then the group has no retry topic
        self.retry_topic = RETRY_PREFIX + group
        self._retry_ready = False
        if log.has_topic(self.retry_topic):
            self._check_retry_levels()
        self.dlq_topic = DLQ_PREFIX + group
        self._weights.setdefault(self.retry_topic, 1)
        self._credit = dict.fromkeys(self._weights, 0)
        self._ranked = sorted(self._weights, key=lambda t: (-self._weights[t], t))
        self._topic_tps: dict[str, list[TopicPartition]] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._partition_cache: dict[TopicPartition, Partition] = {}
        self._owned: set[TopicPartition] = set()
        self._pending: set[TopicPartition] = set()
        self._not_due: dict[TopicPartition, int] = {}
        # topic -> the store's append count for it when a fetch found every one of its
        # partitions drained: while the count is unchanged the topic is skipped without a look
        # at each partition (the retry topic alone has one partition per backoff level)
        self._drained: dict[str, int] = {}
        self._delivered_uids: dict[TopicPartition, list[tuple[int, str]]] = {}
        # retry and dead-letter partitions holding copies that nack() appended since the last
        # commit: made durable before a commit moves past their originals
        self._unsynced_copies: set[TopicPartition] = set()
        self._rotation = 0
        self._last_auto = self._now()
        self._closed = False
        self._coord: GroupCoordinator = state.coordinator(group)
        self._generation = -1
        self.member_id = self._coord.join([*topic_list, self.retry_topic])
        self._sync_assignment()

    @staticmethod
    def _check_priorities(
        priorities: Mapping[str, int] | None, topics: list[str]
    ) -> dict[str, int]:
        weights = dict.fromkeys(topics, 1)
        if priorities is None:
            return weights
        if not isinstance(priorities, Mapping):
            raise InvalidConfigError(f"priorities must be a dict topic -> int, not {priorities!r}")
        for t, w in priorities.items():
            if t not in weights:
                raise InvalidConfigError(f"priority for {t!r}, which is not a subscribed topic")
            weights[t] = _int_arg(f"priority of {t!r}", w, 1, 1_000_000)
        return weights

    # -- state ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError(
                f"consumer {self.member_id} of group {self.group!r} is closed"
            )
        self.log.check_open()

    def _sync_assignment(self) -> None:
        """Follow a rebalance: release what is no longer ours (committing it first only with
        auto-commit), then take the targeted partitions nobody owns."""
        generation, target = self._coord.target(self.member_id)
        if generation == self._generation and not self._pending:
            return
        revoked = self._owned - target
        if revoked:
            if self.enable_auto_commit:
                self._commit_positions(revoked)
            for tp in revoked:
                self._positions.pop(tp, None)
                self._not_due.pop(tp, None)
                self._delivered_uids.pop(tp, None)
            self._coord.release(self.member_id, revoked)
        self._take_unowned()
        self._generation = generation

    def _part(self, tp: TopicPartition) -> Partition:
        part = self._partition_cache.get(tp)
        if part is None or part.closed:
            self.log.check_open()
            part = self._partition_cache[tp] = self.log.partition(*tp)
        return part

    def _position(self, tp: TopicPartition) -> int:
        """The fetch position, initialised from the committed offset or the reset policy, and
        reset when retention (or a truncation) left it outside the log."""
        part = self._part(tp)
        pos = self._positions.get(tp)
        if pos is None:
            om = self._state.offsets.committed(self.group, *tp)
            pos = om.offset if om is not None else None
            if pos is None:
                pos = self._reset(tp, part, None)
        if not part.start_offset <= pos <= part.end_offset:
            pos = self._reset(tp, part, pos)
        self._positions[tp] = pos
        return pos

    def _reset(self, tp: TopicPartition, part: Partition, bad: int | None) -> int:
        self._drained.pop(tp[0], None)
        policy = "earliest" if tp[0] == self.retry_topic else self.auto_offset_reset
        if policy == "earliest":
            return part.start_offset
        if policy == "latest":
            return part.end_offset
        if bad is None:
            raise NoOffsetForPartitionError(
                f"group {self.group!r} has no committed offset for {tp[0]}-{tp[1]} and "
                "auto_offset_reset='none'"
            )
        raise OffsetOutOfRangeError(
            f"position {bad} of {tp[0]}-{tp[1]} is outside [{part.start_offset}, "
            f"{part.end_offset}] and auto_offset_reset='none'"
        )

    # -- polling --------------------------------------------------------------------------------

    def poll(self, max_records: int = 500, timeout_ms: int = 0) -> list[Message]:
        """Up to max_records messages; waits up to timeout_ms for data when there is none."""
        self._check_open()
        max_records = _int_arg("max_records", max_records, 1, MAX_POLL_RECORDS)
        timeout_ms = _int_arg("timeout_ms", timeout_ms, 0)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._sync_assignment()
            self._maybe_auto_commit()
            out = self._fetch(max_records)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                break
            self._wait(remaining)
        if out:
            self._record_delivered(out)
        return out

    def _ready(self) -> bool:
        """Something a poll could return or must handle now (called under the condition)."""
        generation, _ = self._coord.target(self.member_id)
        if generation != self._generation:
            return True
        if any(self._coord.owner(tp) is None for tp in self._pending):
            return True  # released by its previous owner (which woke us)
        now = self._now()
        for tp in self._owned:
            if self._not_due.get(tp, 0) > now:
                continue
            if self._positions.get(tp, -1) != self._part(tp).end_offset:
                return True
        return False

    def _wait(self, seconds: float) -> None:
        if self._not_due:
            nearest = min(self._not_due.values()) - self._now()
            seconds = max(0.0, min(seconds, nearest / 1000))
        state = self._state
        with state.cond:
            state.waiters += 1
            try:
                if not self._ready():
                    state.cond.wait(seconds)
            finally:
                state.waiters -= 1

    def _has_data(self, tp: TopicPartition, now: int) -> bool:
        """A position short of the end (or outside the log: the fetch resets it); a retry
        partition only when its first message is due."""
        if self._not_due.get(tp, 0) > now:
            return False
        pos = self._positions.get(tp)
        return (self._position(tp) if pos is None else pos) != self._part(tp).end_offset

    def _order(self) -> list[str]:
        """Topics in serving order: the smooth-weighted-round-robin leader among the topics
        with data, then the rest by descending priority."""
        now = self._now()
        with_data = [
            t
            for t, tps in self._topic_tps.items()
            if t not in self._drained and any(self._has_data(tp, now) for tp in tps)
        ]
        if len(with_data) <= 1:  # a lone candidate's credit would rise and fall by its weight
            return with_data + [t for t in self._ranked if t not in with_data]
        total = sum(self._weights[t] for t in with_data)
        for t in with_data:
            self._credit[t] += self._weights[t]
        leader = max(with_data, key=lambda t: (self._credit[t], self._weights[t], t))
        self._credit[leader] -= total
        return [leader] + [t for t in self._ranked if t != leader]

    def _fetch(self, max_records: int) -> list[Message]:
        out: list[Message] = []
        budget = [FILTER_SCAN_BUDGET]
        self._rotation += 1
        appends_to = self.log.appends_to
        for topic, count in list(self._drained.items()):
            if appends_to(topic) != count:
                del self._drained[topic]  # new data since it was drained
        counts = {t: appends_to(t) for t in self._topic_tps}  # before looking at the ends
        for topic in self._order():
            if topic in self._drained:
                continue
            tps = self._topic_tps.get(topic, [])
            if len(tps) > 1:
                k = self._rotation % len(tps)
                tps = tps[k:] + tps[:k]  # rotate so a small max_records reaches every partition
            for tp in tps:
                room = max_records - len(out)
                if room <= 0 or budget[0] <= 0:
                    return out
                if topic == self.retry_topic:
                    out.extend(self._fetch_retry(tp, room))
                else:
                    out.extend(self._fetch_partition(tp, room, budget))
            if tps and all(self._positions.get(tp) == self._part(tp).end_offset for tp in tps):
                self._drained[topic] = counts[topic]
        return out

    def _fetch_partition(self, tp: TopicPartition, room: int, budget: list[int]) -> list[Message]:
        """Up to `room` messages of one partition that pass the filters (fetch.py); advances
        the position past every record examined."""
        out, self._positions[tp] = self._filter.fetch(
            tp, self._part(tp), self._position(tp), room, budget
        )
        return out

    def _fetch_retry(self, tp: TopicPartition, room: int) -> list[Message]:
        """Due retry copies, stopping at the first one not due yet."""
        now = self._now()
        if self._not_due.get(tp, 0) > now:
            return []
        self._not_due.pop(tp, None)
        offset = self._position(tp)
        if offset >= self._part(tp).end_offset:
            return []
        msgs = self._part(tp).read(offset, room, self.log.verify_crc)
        out: list[Message] = []
        for m in msgs:
            due = due_time(m)
            if due > now:
                self._not_due[tp] = due
                self._positions[tp] = m.offset
                return out
            out.append(m)
        if msgs:
            self._positions[tp] = msgs[-1].offset + 1
        return out

    def _record_delivered(self, out: list[Message]) -> None:
        tracer = self._tracer
        if tracer is None:
            return
        events = events_for(out, "delivered", self.log.clock(), self.group)
        for m in out:
            uid = m.unique_id
            if uid is not None:
                self._delivered_uids.setdefault((m.topic, m.partition), []).append((m.offset, uid))
        tracer.record(events)

    # -- committing -----------------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit the positions of every owned partition (everything poll returned so far), or
        the given {(topic, partition): next offset to consume}. Durable when this returns.
        Raises CommitFailedError for a partition this member does not own (any more)."""
        self._check_open()
        if offsets is None:
            self._commit_positions(self._owned)
            return
        if not isinstance(offsets, Mapping):
            raise InvalidConfigError(
                f"offsets must be a dict (topic, partition) -> offset, not {offsets!r}"
            )
        chosen: dict[TopicPartition, int] = {}
        for tp, off in offsets.items():
            if not (isinstance(tp, tuple) and len(tp) == 2):
                raise InvalidConfigError(f"offset keys are (topic, partition) tuples, not {tp!r}")
            _int_arg(f"offset of {tp[0]}-{tp[1]}", off, 0)
            if self._coord.owner(tp) != self.member_id:
                raise CommitFailedError(
                    f"{tp[0]}-{tp[1]} is not owned by consumer {self.member_id} of group "
                    f"{self.group!r} (rebalanced away or never assigned)"
                )
            chosen[tp] = off
        self._write_commit(chosen)

    def _commit_positions(self, tps: Iterable[TopicPartition]) -> None:
        chosen = {}
        for tp in tps:
            pos = self._positions.get(tp)
            if pos is None:
                continue
            om = self._state.offsets.committed(self.group, *tp)
            if om is None or om.offset != pos:
                chosen[tp] = pos
        self._write_commit(chosen)

    def _write_commit(self, chosen: Mapping[TopicPartition, int]) -> None:
        """Make the copies of nacked messages durable, then the offsets (offsets.py): a commit
        never reaches the disk without the copy that carries a message it moves past."""
        if not chosen:
            return
        self.log.sync_partitions(sorted(self._unsynced_copies))
        self._unsynced_copies.clear()
        now = self.log.clock()
        self._state.offsets.commit(
            self.group, {tp: OffsetAndMetadata(off, "", now) for tp, off in chosen.items()}
        )
        tracer = self._tracer
        if tracer is None:
            return
        events = []
        for tp, off in chosen.items():
            pending = self._delivered_uids.get(tp)
            if not pending:
                continue
            done = [(o, u) for o, u in pending if o < off]
            self._delivered_uids[tp] = [(o, u) for o, u in pending if o >= off]
            events += [
                TraceEvent(u, "committed", now, tp[0], tp[1], o, self.group) for o, u in done
            ]
        tracer.record(events)

    def _maybe_auto_commit(self) -> None:
        if self.enable_auto_commit and self._now() - self._last_auto >= self._auto_interval:
            self._commit_positions(self._owned)
            self._last_auto = self._now()

    # -- positions ------------------------------------------------------------------------------

    def _tp(self, args: tuple[Any, ...], what: str) -> tuple[TopicPartition, tuple[Any, ...]]:
        """(topic, partition) from (topic, partition, ...) or, with one topic, (partition, ...)."""
        if args and isinstance(args[0], str):
            tp, rest = (args[0], args[1]), args[2:]
        elif len(self.topics) == 1:
            tp, rest = (self.topics[0], args[0]), args[1:]
        else:
            raise InvalidConfigError(f"{what} needs the topic: this consumer has several topics")
        self._part(tp)  # UnknownTopicError / UnknownPartitionError
        return tp, rest

    def _owned_tp(self, tp: TopicPartition) -> None:
        if tp not in self._owned:
            raise UnknownPartitionError(
                f"{tp[0]}-{tp[1]} is not assigned to consumer {self.member_id} of group "
                f"{self.group!r}; it has {sorted(self._owned)}"
            )

    def seek(self, *args: Any) -> None:
        """seek(topic, partition, offset), or seek(partition, offset) with one topic: the next
        poll reads that partition from `offset` (reset by the policy if outside the log)."""
        self._check_open()
        if len(args) not in (2, 3):
            raise InvalidConfigError("seek takes (topic, partition, offset) or (partition, offset)")
        tp, rest = self._tp(args, "seek")
        if len(rest) != 1:
            raise InvalidConfigError("seek takes (topic, partition, offset) or (partition, offset)")
        offset = _int_arg("offset", rest[0], 0)
        self._owned_tp(tp)
        self._positions[tp] = offset
        self._not_due.pop(tp, None)
        self._drained.pop(tp[0], None)

    def seek_to_time(self, timestamp: int) -> None:
        """Every owned partition to its first offset with a timestamp >= `timestamp` (ms), or to
        its end when there is none."""
        self._check_open()
        _int_arg("timestamp", timestamp, 0)
        for tp in self._owned:
            found = self._part(tp).offset_for_time(timestamp, self.log.verify_crc)
            self._positions[tp] = self._part(tp).end_offset if found is None else found
            self._not_due.pop(tp, None)
        self._drained.clear()

    def position(self, *args: Any) -> int:
        """position(topic, partition) or position(partition): the next offset poll reads."""
        self._check_open()
        tp, rest = self._tp(args, "position")
        if rest:
            raise InvalidConfigError("position takes (topic, partition) or (partition)")
        self._owned_tp(tp)
        return self._position(tp)

    def committed(self, *args: Any) -> int | None:
        """The group's committed offset of (topic, partition) (or partition), None if none."""
        self._check_open()
        tp, rest = self._tp(args, "committed")
        if rest:
            raise InvalidConfigError("committed takes (topic, partition) or (partition)")
        om = self._state.offsets.committed(self.group, *tp)
        return None if om is None else om.offset

    def lag(self) -> dict[TopicPartition, int]:
        """end offset - committed offset per owned partition (the position when nothing is
        committed): what the group still has to consume and commit. Retry levels that never
        held a message are left out (their lag is 0 and says nothing)."""
        self._check_open()
        out = {}
        for tp in sorted(self._owned):
            end = self._part(tp).end_offset
            if unused_retry_level(tp[0], end):
                continue
            om = self._state.offsets.committed(self.group, *tp)
            base = om.offset if om is not None else self._position(tp)
            out[tp] = max(0, end - base)
        return out

    def assignment(self) -> list[TopicPartition]:
        """The partitions this member owns now (retry partitions included)."""
        self._check_open()
        return sorted(self._owned)

    def group_assignment(self) -> dict[TopicPartition, str]:
        """Who owns each partition of the group right now, by member id: every member's
        share, this one's included (a partition in a handoff between two members is absent)."""
        self._check_open()
        return self._coord.owners()

    # -- retry and dead-letter ------------------------------------------------------------------

    def nack(self, message: Message) -> None:
        """Consumption of `message` failed: redeliver it after the next backoff level through
        `__retry.<group>`, or, once it was redelivered max_reconsume_times, append it to
        `__dlq.<group>`. Either way the original counts as consumed (the copy carries it)."""
        self._check_open()
        if not isinstance(message, Message):
            raise InvalidConfigError(f"nack takes a Message, not {type(message).__name__}")
        now, wall = self._now(), self.log.clock()
        times = reconsume_times(message)
        events = events_for([message], "nacked", wall, self.group, reconsume=times)
        uid = message.unique_id
        if times >= self.max_reconsume_times:
            topic = self.log.internal_topic(
                self.dlq_topic, partitions=1, unique_ids=False, cleanup_policy="delete"
            )
            level, headers, event = 0, copy_headers(message, times, None), "dead_lettered"
        else:
            topic, level = self._retry_topic(), min(times + 1, len(self.levels)) - 1
            headers = copy_headers(message, times + 1, now + self.levels[level])
            event = "retried"
        md = self.log.append_records(topic, level, [message.value], [message.key], [headers])
        self._unsynced_copies.add((topic, level))
        if uid is not None:
            events.append(
                TraceEvent(uid, event, wall, topic, level, md.base_offset, self.group,
                           {"reconsume": times + (event == "retried")})
            )  # fmt: skip
        if self._tracer is not None:
            self._tracer.record(events)

    def _retry_topic(self) -> str:
        """`__retry.<group>`, made now when this is the group's first nack: the group then
        rebalances so that its members share the new levels (at their next poll)."""
        if self._retry_ready:
            return self.retry_topic
        if not self.log.has_topic(self.retry_topic):
            with contextlib.suppress(TopicExistsError):  # another member's levels: checked below
                self.log.internal_topic(
                    self.retry_topic,
                    partitions=len(self.levels),
                    unique_ids=False,
                    cleanup_policy="delete",  # never compacted: copies share their original's key
                )
            self._coord.topics_changed()
            self._take_unowned()
        self._check_retry_levels()
        return self.retry_topic

    def _take_unowned(self) -> None:
        """Take the targeted partitions nobody owns now, releasing nothing: this member's share
        of a topic that just appeared is at once in its assignment and lag(). Anything else the
        new target changes waits for the next poll, as every rebalance does."""
        self._owned, self._pending = self._coord.acquire(self.member_id)
        self._drained.clear()
        self._topic_tps = {}
        for tp in sorted(self._owned):
            self._topic_tps.setdefault(tp[0], []).append(tp)

    def _check_retry_levels(self) -> None:
        have = self.log.config(self.retry_topic).partitions
        if have != len(self.levels):
            raise InvalidConfigError(
                f"{self.retry_topic} has {have} partitions (one per backoff level) but "
                f"retry_backoff_ms has {len(self.levels)} levels"
            )
        self._retry_ready = True

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group (its partitions go to the other members at their next poll);
        commits first only with auto-commit."""
        if self._closed:
            return
        try:
            if self.enable_auto_commit and not self.log.closed:
                self._commit_positions(self._owned)
        finally:
            self._closed = True
            self._coord.leave(self.member_id)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
