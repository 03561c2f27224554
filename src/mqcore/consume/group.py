"""Consumer-group coordination inside one process (a store directory is locked to one process).

Each group has a coordinator. A consumer joins when it is created and leaves on close(); every
join or leave is a rebalance: the generation goes up and a new target assignment is computed by
range assignment per topic (Kafka's RangeAssignor: the members subscribed to a topic, in join
order, get consecutive partition ranges; the first `partitions % members` get one more).

Ownership moves by handoff, so two members never own a partition at once: at its next poll a
member releases the partitions it no longer has in its target (committing them first only with
auto-commit) and acquires the targeted ones nobody owns. A partition still owned by its previous
member is pending until that member polls or closes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from mqcore.config import MAX_NAME_LENGTH, validate_name
from mqcore.consume.offsets import GroupKey, OffsetAndMetadata, OffsetStore
from mqcore.errors import InvalidGroupError, InvalidTopicError, UnknownTopicError

TopicPartition = tuple[str, int]
RETRY_PREFIX = "__retry."
DLQ_PREFIX = "__dlq."


MAX_GROUP_BYTES = 0x7FFF  # a group ID is an int16-length string in `__consumer_offsets` keys


def validate_group(group: object) -> str:
    """A consumer group ID, Kafka's rule: any non-empty string (commas, spaces and slashes
    included), short enough for the int16 length of the `__consumer_offsets` key it is
    committed under. Every group the store keeps offsets for passes; mqcore's own consumers
    and share groups also need validate_group_for_topics."""
    if not isinstance(group, str):
        raise InvalidGroupError(f"group name must be a str, not {type(group).__name__}")
    if not group:
        raise InvalidGroupError("group name is empty")
    try:
        size = len(group.encode())
    except UnicodeEncodeError:
        raise InvalidGroupError(f"group name {group!r} is not valid Unicode text") from None
    if size > MAX_GROUP_BYTES:
        raise InvalidGroupError(f"group name is {size} bytes long; the limit is {MAX_GROUP_BYTES}")
    return group


def validate_group_for_topics(group: object) -> str:
    """A group name mqcore's own consumers and share groups can take: their retry, dead-letter
    and pull-log topics are named after it (`__retry.<group>`, `__dlq.<group>`,
    `__pull.<group>`), so it follows the topic-name rule, short enough for the longest of
    them. Kafka clients' groups over `mqcore serve` need only validate_group."""
    try:
        validate_name(group, "group")
    except InvalidTopicError as e:
        raise InvalidGroupError(str(e)) from None
    assert isinstance(group, str)
    if len(RETRY_PREFIX) + len(group) > MAX_NAME_LENGTH:
        raise InvalidGroupError(
            f"group name is {len(group)} characters long; the limit is "
            f"{MAX_NAME_LENGTH - len(RETRY_PREFIX)} (its retry topic {RETRY_PREFIX}<group> must "
            "be a legal topic name)"
        )
    return group


def unused_retry_level(topic: str, end_offset: int) -> bool:
    """A retry level that never held a message: left out of lag listings (its lag is 0 and
    says nothing; a group's retry topic has one partition per backoff level)."""
    return topic.startswith(RETRY_PREFIX) and end_offset == 0


@dataclass(frozen=True)
class PartitionLag:
    """A group's committed offset of one partition and how far it is behind the end.
    `end_offset` and `lag` are None when the store does not hold the partition."""

    group: str
    topic: str
    partition: int
    committed: int
    end_offset: int | None
    lag: int | None
    commit_time: int  # ms, -1 when unknown

    def to_json(self) -> dict[str, object]:
        return {"group": self.group, "topic": self.topic, "partition": self.partition,
                "committed": self.committed, "end_offset": self.end_offset, "lag": self.lag,
                "commit_time": self.commit_time}  # fmt: skip


def group_lags(
    offsets: Mapping[GroupKey, OffsetAndMetadata], end_offset: Callable[[str, int], int | None]
) -> dict[str, list[PartitionLag]]:
    """group -> its committed partitions in (topic, partition) order, each with the lag
    end - committed (0 when the commit is past the end seen); `end_offset` gives None for a
    partition the store does not hold. Unused retry levels are left out, as in lag()."""
    out: dict[str, list[PartitionLag]] = {}
    for (group, topic, p), om in sorted(offsets.items()):
        end = end_offset(topic, p)
        if end is not None and unused_retry_level(topic, end):
            continue
        lag = None if end is None else max(0, end - om.offset)
        out.setdefault(group, []).append(
            PartitionLag(group, topic, p, om.offset, end, lag, om.commit_time)
        )
    return out


def range_assign(
    members: Sequence[tuple[str, Sequence[str]]], partitions: Callable[[str], int]
) -> dict[str, set[TopicPartition]]:
    """Kafka's RangeAssignor over (member, topics) in join order."""
    out: dict[str, set[TopicPartition]] = {m: set() for m, _ in members}
    topics = sorted({t for _, ts in members for t in ts})
    for topic in topics:
        subs = [m for m, ts in members if topic in ts]
        n = partitions(topic)
        per, extra = divmod(n, len(subs))
        start = 0
        for i, m in enumerate(subs):
            count = per + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + count))
            start += count
    return out


class GroupCoordinator:
    """Members, target assignment, generation and actual ownership of one group."""

    def __init__(self, group: str, partitions: Callable[[str], int], wake: Callable[[], None]):
        self.group = group
        self._partitions = partitions
        self._wake = wake
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._members: dict[str, tuple[str, ...]] = {}  # join order
        self._target: dict[str, set[TopicPartition]] = {}
        self._owner: dict[TopicPartition, str] = {}
        self.generation = 0

    def join(self, topics: Iterable[str]) -> str:
        with self._lock:
            member = f"{self.group}-{next(self._ids):06d}"
            self._members[member] = tuple(topics)
            self._rebalance()
        self._wake()
        return member

    def leave(self, member: str) -> None:
        with self._lock:
            if self._members.pop(member, None) is None:
                return
            for tp in [tp for tp, m in self._owner.items() if m == member]:
                del self._owner[tp]
            self._rebalance()
        self._wake()

    def topics_changed(self) -> None:
        """A subscribed topic appeared (the group's retry topic, at its first nack): assign
        its partitions like a join or leave would."""
        with self._lock:
            self._rebalance()
        self._wake()

    def _rebalance(self) -> None:
        self.generation += 1
        self._target = range_assign(list(self._members.items()), self._partition_count)

    def _partition_count(self, topic: str) -> int:
        """A subscribed topic that does not exist yet (a retry topic before the group's first
        nack) has nothing to assign."""
        try:
            return self._partitions(topic)
        except UnknownTopicError:
            return 0

    def target(self, member: str) -> tuple[int, set[TopicPartition]]:
        with self._lock:
            return self.generation, set(self._target.get(member, ()))

    def release(self, member: str, tps: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                if self._owner.get(tp) == member:
                    del self._owner[tp]
        self._wake()

    def acquire(self, member: str) -> tuple[set[TopicPartition], set[TopicPartition]]:
        """Take the targeted partitions nobody owns: (owned now, still pending elsewhere)."""
        with self._lock:
            pending = set()
            for tp in self._target.get(member, ()):
                owner = self._owner.get(tp)
                if owner is None:
                    self._owner[tp] = member
                elif owner != member:
                    pending.add(tp)
            return {tp for tp, m in self._owner.items() if m == member}, pending

    def owner(self, tp: TopicPartition) -> str | None:
        with self._lock:
            return self._owner.get(tp)

    def owners(self) -> dict[TopicPartition, str]:
        """Who owns what right now (a copy)."""
        with self._lock:
            return dict(self._owner)

    def members(self) -> list[str]:
        with self._lock:
            return list(self._members)


class ConsumeState:
    """A store's consumer-side state: group coordinators, committed offsets, and the condition
    that appends signal (only when some poll waits, so appends stay cheap)."""

    def __init__(self, offsets: OffsetStore, partitions: Callable[[str], int]):
        self.offsets = offsets
        self._partitions = partitions
        self._lock = threading.Lock()
        self.groups: dict[str, GroupCoordinator] = {}
        self.cond = threading.Condition()
        self.waiters = 0

    def coordinator(self, group: str) -> GroupCoordinator:
        with self._lock:
            coord = self.groups.get(group)
            if coord is None:
                coord = self.groups[group] = GroupCoordinator(group, self._partitions, self.wake)
            return coord

    def wake(self) -> None:
        """Wake every waiting poll (after an append when a poll waits, and on rebalances)."""
        with self.cond:
            self.cond.notify_all()

    def on_append(self, topic: str, partition: int, base: int, count: int,
                  uids: bytes | None, now: int) -> None:  # fmt: skip
        """The log's append listener: a poll waiting for data wakes (consume/consumer.py)."""
        if self.waiters:
            self.wake()
