"""KIP-848's consumer group protocol (`group.protocol=consumer`, the default of Kafka 4's
clients): ConsumerGroupHeartbeat (API 68) and ConsumerGroupDescribe (API 69).

The coordinator assigns, not a member. Each member says in its heartbeats what it subscribes
to (topic names or a regular expression) and which partitions it owns; the coordinator keeps
the group's target assignment, computed by a server-side assignor (Kafka's
`group.consumer.assignors`: `uniform`, the default, or `range`), and moves each member towards
its target one heartbeat at a time, revoking before assigning: a partition goes to its new
owner only after its old owner's heartbeat no longer lists it. Nothing waits: a heartbeat is
answered at once with the member's epoch and the partitions it may use now, and the client
heartbeats again after `heartbeat_interval` (sooner when it has something to say).

Epochs. The group epoch goes up when a member joins or leaves, when a subscription changes,
and when the subscribed topics change (a topic made or deleted, partitions added); the target
assignment is computed again in the same step, for that epoch (the assignment epoch). A
member's epoch is the assignment epoch it has reconciled to; it commits offsets with it
(OffsetCommit v9), and a commit with another is STALE_MEMBER_EPOCH (server/groups.py).

Group states (ListGroups, ConsumerGroupDescribe), from the members' states:

    Empty ──a member joins──> Reconciling ──every member at the target──> Stable
      ^                            ^                                         │
      └──── the last one leaves    └── join, leave, expiry, new subscription ┘
                                       or topics: the group epoch goes up

(`Assigning`, the group epoch ahead of its target, is never seen: the target is computed in
the same step.) Member states (Kafka's CurrentAssignmentBuilder), each heartbeat:

    Stable ──target moved, it owns partitions it must give up──> UnrevokedPartitions
      │  ^                                                          │ a heartbeat without them
      │  └───────── all its target partitions are free ─────────────┤
      └─ target moved, some partitions still owned by others ──> UnreleasedPartitions
                                                                    │ the last one released
                                                                    v  Stable

A member leaves with epoch -1 (its partitions go to others at once), or -2 for a static member
(`group.instance.id`) that will be back: it keeps its partitions until its session ends, and
a new member with its instance ID takes its place and its assignment without a rebalance. A
member silent for `session_timeout` (Kafka's group.consumer.session.timeout.ms, 45 s), or
still owning partitions to revoke after its rebalance timeout (`max.poll.interval.ms`), is
dropped (fenced). Time is looked at whenever a request touches the group.

The member names topics by ID: a topic's is `common.topic_id(name)`, as Metadata gives it.
The groups live in memory, as the classic ones do; their offsets are the store's. The lock
is the classic coordinator's (server/groups.py owns this one): a group name is one type or
the other, decided under one lock. docs/server.md "Consumer groups" says what is served.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from mqcore.consume.group import range_assign, validate_group
from mqcore.errors import InvalidGroupError, MQCoreError
from mqcore.log.internal import is_internal
from mqcore.server.auth import DESCRIBE, GROUP, NOT_ASKED, READ, Access
from mqcore.server.common import NO_TIME, client_host, topic_id
from mqcore.server.defaults import CONSUMER_HEARTBEAT_INTERVAL, CONSUMER_SESSION_TIMEOUT
from mqcore.server.protocol import Api, build

if TYPE_CHECKING:
    from mqcore.store import Store

# group states, Kafka's names (ConsumerGroup.ConsumerGroupState)
EMPTY, ASSIGNING, RECONCILING, STABLE, DEAD = (
    "Empty", "Assigning", "Reconciling", "Stable", "Dead",
)  # fmt: skip
# member states (Kafka's MemberState)
MEMBER_STABLE, UNREVOKED, UNRELEASED = "Stable", "UnrevokedPartitions", "UnreleasedPartitions"
GROUP_TYPE = "consumer"  # ListGroups v5's name for this protocol's groups
JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2
SESSION_TIMEOUT = CONSUMER_SESSION_TIMEOUT  # Kafka's group.consumer.session.timeout.ms
HEARTBEAT_INTERVAL = CONSUMER_HEARTBEAT_INTERVAL  # group.consumer.heartbeat.interval.ms
ASSIGNORS = ("uniform", "range")  # group.consumer.assignors; the first is the default
CONSUMER_MEMBER = 1  # ConsumerGroupDescribe v1's member_type of this protocol's members
FIRST_ID_VERSION = 1  # from ConsumerGroupHeartbeat v1 the member makes its own ID

Assignment = dict[str, frozenset[int]]  # topic name -> partitions


class Refused(Exception):
    """A heartbeat answered with an error: Kafka's code and message."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(slots=True)
class Member:
    """One member of a consumer group: what it subscribes to, its epochs, its state, and the
    partitions it owns (`assigned`) or must give up (`revoking`)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    deadline: float  # its session ends at this time of the clock unless it heartbeats
    rack_id: str | None = None
    rebalance_timeout: float = 0.0
    topics: tuple[str, ...] = ()
    regex: str | None = None
    assignor: str | None = None
    may_describe: Callable[[str], bool] = lambda topic: True  # its principal's topic grants
    epoch: int = 0
    previous_epoch: int = -1
    state: str = MEMBER_STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    revoke_deadline: float | None = None  # UnrevokedPartitions: fenced unless revoked by then

    def set_epoch(self, epoch: int) -> None:
        self.previous_epoch, self.epoch = self.epoch, epoch

    def reconciled_to(self, epoch: int) -> bool:
        return self.state == MEMBER_STABLE and self.epoch == epoch

    def subscribes(self, topic: str) -> bool:
        """Whether it subscribes to `topic`, by name or by its regular expression (internal
        topics and those its principal may not describe never match one)."""
        if topic in self.topics:
            return True
        if not self.regex or is_internal(topic) or not self.may_describe(topic):
            return False
        pattern = compiled(self.regex)
        return pattern is not None and pattern.fullmatch(topic) is not None


@dataclass(slots=True)
class ConsumerGroup:
    """A consumer group: its epochs, members, static members' IDs, target assignment and the
    subscribed topics' partition counts the target was computed for."""

    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ASSIGNORS[0]
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member ID
    target: dict[str, Assignment] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.epoch > self.assignment_epoch:
            return ASSIGNING
        if all(m.reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return STABLE
        return RECONCILING

    def owners(self) -> dict[tuple[str, int], str]:
        """Who owns each partition now: assigned to a member or still being revoked by it."""
        out: dict[tuple[str, int], str] = {}
        for m in self.members.values():
            for owned in (m.assigned, m.revoking):
                for topic, parts in owned.items():
                    out.update(((topic, p), m.member_id) for p in parts)
        return out

    def subscribed(self) -> set[str]:
        """The topics some member subscribes to now (of those the target was computed for)."""
        return {t for t in self.topics if any(m.subscribes(t) for m in self.members.values())}


@functools.lru_cache(maxsize=256)
def compiled(regex: str) -> re.Pattern[str] | None:
    """A subscription's regular expression (Kafka's are RE2/J; Python's `re` reads the
    patterns clients send, librdkafka's `^`-prefixed alternatives); None if it does not
    compile."""
    try:
        return re.compile(regex)
    except re.error:
        return None


class ConsumerGroups:
    """The KIP-848 consumer groups of one store: the handlers of ConsumerGroupHeartbeat and
    ConsumerGroupDescribe, and what the classic coordinator (server/groups.py, which owns this
    one and shares its `lock`) asks of them for the APIs both protocols share. `claim(group)`
    says why a new consumer group may not take a name (a classic group's, a share group's),
    None when it may; `access(session)` the session's grants; `clock` is monotonic seconds."""

    def __init__(
        self,
        store: Store,
        lock: threading.Condition,
        *,
        clock: Callable[[], float] = time.monotonic,
        access: Callable[[Any], Access] | None = None,
        claim: Callable[[str], str | None] = lambda group: None,
        here: Callable[[], bool] = lambda: True,
        session_timeout: float = SESSION_TIMEOUT,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
    ):
        self.store, self.lock, self.clock = store, lock, clock
        self.access, self.claim = access, claim
        self.here = here  # whether this node coordinates groups (a cluster's: see groups.py)
        self.session_timeout = session_timeout
        self.heartbeat_interval = heartbeat_interval
        self._groups: dict[str, ConsumerGroup] = {}
        store.add_member_source(self.member_count)  # the store counts these members too

    def close(self) -> None:
        self.store.remove_member_source(self.member_count)

    def forget_all(self) -> None:
        """Drop every group (call with the lock held): see GroupCoordinator.take_over."""
        self._groups.clear()

    def _allowed(self, session: Any, operation: str, group_id: str) -> bool:
        return self.access is None or self.access(session).group(operation, group_id)

    # -- ConsumerGroupHeartbeat -----------------------------------------------------------------

    def heartbeat(self, found: Api, body: Any, session: Any) -> Any:
        """One member's heartbeat: joining (epoch 0), leaving (-1, -2) or keeping up, answered
        at once with its epoch and, when it changed or was asked for, its assignment."""
        try:
            if not self._allowed(session, READ, body.group_id):
                raise Refused(ErrorCode.group_authorization_failed,
                              f"may not read group {body.group_id!r}")  # fmt: skip
            if not self.here():
                raise Refused(ErrorCode.not_coordinator, "this broker does not coordinate groups")
            check_heartbeat(body, found.version)
            if not body.member_id and body.member_epoch == JOIN_EPOCH:  # v0: made here
                body = dataclasses.replace(body, member_id=str(uuid.uuid4()))
            with self.lock:
                member_id, epoch, assignment = self._heartbeat(body, session)
        except Refused as e:
            return build(found.response, throttle_time=NO_TIME, error_code=e.code,
                         error_message=e.message, member_id=None, member_epoch=0,
                         heartbeat_interval=NO_TIME, assignment=None)  # fmt: skip
        m = found.module
        answer = None
        if assignment is not None:
            answer = build(m.Assignment, topic_partitions=wire_partitions(m, assignment))
        interval = NO_TIME if epoch < 0 else datetime.timedelta(seconds=self.heartbeat_interval)
        return build(found.response, throttle_time=NO_TIME, error_code=ErrorCode.none,
                     error_message=None, member_id=member_id, member_epoch=epoch,
                     heartbeat_interval=interval, assignment=answer)  # fmt: skip

    def _heartbeat(self, body: Any, session: Any) -> tuple[str, int, Assignment | None]:
        """(member ID, its epoch, the assignment to send or None), held lock."""
        now = self.clock()
        if body.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            self._leave(body, now)
            return body.member_id, body.member_epoch, None
        group = self._group_for(body.group_id, body.member_epoch == JOIN_EPOCH, now)
        owned = self._owned(group, body.topic_partitions)
        member = self._member_for(group, body, owned, session, now)
        before = dict(member.assigned)
        if self._subscribe(group, member, body, session) or self._topics_moved(group):
            self._bump(group)
        self._reconcile(group, member, owned, now)
        member.deadline = now + self.session_timeout
        full = body.member_epoch == JOIN_EPOCH or (
            body.rebalance_timeout.total_seconds() >= 0
            and body.subscribed_topic_names is not None
            and body.topic_partitions is not None
        )  # Kafka's rule: the assignment goes back when asked for or when it changed
        changed = full or member.assigned != before
        return member.member_id, member.epoch, dict(member.assigned) if changed else None

    def _group_for(self, group_id: str, create: bool, now: float) -> ConsumerGroup:
        """The group, its deadlines looked at; a joining member's makes a new one when the
        name is free (`claim`), else GROUP_ID_NOT_FOUND, Kafka's "not a consumer group"."""
        group = self._groups.get(group_id)
        if group is not None:
            self._tick(group, now)
            return group
        if not create:
            raise Refused(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        why = self.claim(group_id)
        if why is not None:
            raise Refused(ErrorCode.group_id_not_found, why)
        group = self._groups[group_id] = ConsumerGroup(group_id)
        return group

    def _owned(self, group: ConsumerGroup, listed: Iterable[Any] | None) -> Assignment | None:
        """The partitions a heartbeat says its member owns (None: not said), by topic name;
        an ID of no topic the group knows is left out (a deleted topic's)."""
        if listed is None:
            return None
        names = {topic_id(t): t for t in self._known_topics(group)}
        out: dict[str, frozenset[int]] = {}
        for tp in listed:
            name = names.get(tp.topic_id)
            if name is not None:
                out[name] = out.get(name, frozenset()) | frozenset(int(p) for p in tp.partitions)
        return out

    @staticmethod
    def _known_topics(group: ConsumerGroup) -> set[str]:
        names = set(group.topics)
        for m in group.members.values():
            names.update(m.assigned, m.revoking)
        return names

    def _member_for(
        self, group: ConsumerGroup, body: Any, owned: Assignment | None, session: Any, now: float
    ) -> Member:
        """The member the heartbeat is from: a new one (joining), a static member's successor
        (taking its place), or a known one whose epoch must be its own (FENCED_MEMBER_EPOCH
        otherwise: the member starts over)."""
        if body.instance_id is not None:
            return self._static_member(group, body, owned, session, now)
        member = group.members.get(body.member_id)
        if member is None:
            if body.member_epoch != JOIN_EPOCH:
                raise Refused(ErrorCode.unknown_member_id,
                              f"Member {body.member_id} is not a member of group "
                              f"{group.group_id}.")  # fmt: skip
            member = self._new_member(group, body, session, now)
        check_epoch(member, body.member_epoch, owned)
        return member

    def _new_member(self, group: ConsumerGroup, body: Any, session: Any, now: float) -> Member:
        """JOIN: a member new to the group, at epoch 0 (reconciled in the same heartbeat)."""
        member = Member(body.member_id, body.instance_id, session.client_id or "",
                        client_host(session), now + self.session_timeout)  # fmt: skip
        group.members[member.member_id] = member
        if body.instance_id is not None:
            group.static[body.instance_id] = member.member_id
        return member

    def _static_member(
        self, group: ConsumerGroup, body: Any, owned: Assignment | None, session: Any, now: float
    ) -> Member:
        """Kafka's rules for a member with a group.instance.id: joining, it is new, or takes
        the place of the member that left with epoch -2 (UNRELEASED_INSTANCE_ID while that
        one has not); otherwise it must be the instance's member, at its epoch."""
        iid = body.instance_id
        if body.member_epoch != JOIN_EPOCH:
            member = self._static_owner(group, body.member_id, iid)
            check_epoch(member, body.member_epoch, owned)
            return member
        old = group.members.get(group.static.get(iid, ""))
        if old is None:
            known = group.members.get(body.member_id)
            return known or self._new_member(group, body, session, now)
        if old.epoch != STATIC_LEAVE_EPOCH:
            raise Refused(ErrorCode.unreleased_instance_id,
                          f"Static member {body.member_id} with instance id {iid} cannot join "
                          f"the group because the instance id is owned by {old.member_id} "
                          "member.")  # fmt: skip
        return self._replace(group, old, body.member_id)

    @staticmethod
    def _static_owner(group: ConsumerGroup, member_id: str, instance_id: str) -> Member:
        """The member of `instance_id`, which must be `member_id` (FENCED_INSTANCE_ID: a
        successor took its place)."""
        member = group.members.get(group.static.get(instance_id, ""))
        if member is None:
            raise Refused(ErrorCode.unknown_member_id, f"Instance id {instance_id} is unknown.")
        if member.member_id != member_id:
            raise Refused(ErrorCode.fenced_instance_id,
                          f"Static member {member_id} with instance id {instance_id} was fenced "
                          f"by member {member.member_id}.")  # fmt: skip
        return member

    @staticmethod
    def _replace(group: ConsumerGroup, old: Member, member_id: str) -> Member:
        """A static member back (STATIC_REPLACED): a new member ID in the old one's place,
        with its subscription, partitions and target, at epoch 0; nothing else moves."""
        del group.members[old.member_id]
        target = group.target.pop(old.member_id, None)
        old.member_id, old.epoch, old.previous_epoch = member_id, 0, 0
        group.members[member_id] = old
        if target is not None:
            group.target[member_id] = target
        assert old.instance_id is not None
        group.static[old.instance_id] = member_id
        return old

    def _subscribe(self, group: ConsumerGroup, member: Member, body: Any, session: Any) -> bool:
        """Take what the heartbeat changed (null fields did not change); whether the
        subscription did (names or regular expression: the group epoch goes up)."""
        before = (member.topics, member.regex)
        if body.subscribed_topic_names is not None:
            member.topics = tuple(sorted(set(body.subscribed_topic_names)))
        regex = getattr(body, "subscribed_topic_regex", None)  # v1+
        if regex is not None:
            member.regex = regex or None  # "" unsubscribes
        if body.rebalance_timeout.total_seconds() >= 0:
            member.rebalance_timeout = body.rebalance_timeout.total_seconds()
        if body.server_assignor is not None:
            member.assignor = body.server_assignor
        if body.rack_id is not None:
            member.rack_id = body.rack_id
        member.client_id, member.client_host = session.client_id or "", client_host(session)
        if self.access is not None:
            member.may_describe = functools.partial(self.access(session).topic, DESCRIBE)
        return (member.topics, member.regex) != before

    # -- epochs and the target assignment -------------------------------------------------------

    def _subscribed_topics(self, group: ConsumerGroup) -> dict[str, int]:
        """{topic: partitions} of every existing topic some member subscribes to."""
        names: set[str] = set()
        every: list[str] | None = None
        for m in group.members.values():
            names.update(m.topics)
            if m.regex:
                every = self.store.topics() if every is None else every
                names.update(t for t in every if m.subscribes(t))
        out = {}
        for name in sorted(names):
            count = self._partitions(name)
            if count:
                out[name] = count
        return out

    def _partitions(self, topic: str) -> int:
        try:
            return self.store.partitions(topic)
        except MQCoreError:  # not a topic (any more), or not a topic name at all
            return 0

    def _topics_moved(self, group: ConsumerGroup) -> bool:
        return self._subscribed_topics(group) != group.topics

    def _bump(self, group: ConsumerGroup) -> None:
        """A new group epoch and, for it, a new target assignment (a join, leave, expiry, new
        subscription or topic change)."""
        group.epoch += 1
        group.topics = self._subscribed_topics(group)
        group.assignor = preferred_assignor(group.members.values())
        subscriptions = {
            mid: frozenset(t for t in group.topics if m.subscribes(t))
            for mid, m in group.members.items()
        }
        assign = ASSIGN[group.assignor]
        group.target = assign(subscriptions, group.topics, group.target)
        group.assignment_epoch = group.epoch

    # -- reconciliation (Kafka's CurrentAssignmentBuilder) --------------------------------------

    def _reconcile(
        self, group: ConsumerGroup, member: Member, owned: Assignment | None, now: float
    ) -> None:
        """Move `member` one step towards its target (the member state machine above)."""
        if member.epoch == STATIC_LEAVE_EPOCH:
            return
        if member.state == MEMBER_STABLE and member.epoch == group.assignment_epoch:
            return
        if member.state == UNREVOKED and owns_any(owned, member.revoking):
            return  # still revoking; REVOKED once a heartbeat no longer lists them
        self._next_assignment(group, member, owned, now)

    def _next_assignment(
        self, group: ConsumerGroup, member: Member, owned: Assignment | None, now: float
    ) -> None:
        target = group.target.get(member.member_id, {})
        owners = group.owners()
        keep: Assignment = {}
        revoke: Assignment = {}
        free: Assignment = {}
        unreleased = False
        for topic in set(target) | set(member.assigned):
            have = member.assigned.get(topic, frozenset())
            want = target.get(topic, frozenset()) if member.subscribes(topic) else frozenset()
            kept, gone, new = have & want, have - want, want - have
            taken = frozenset(p for p in new if owners.get((topic, p), member.member_id)
                              != member.member_id)  # fmt: skip
            unreleased = unreleased or bool(taken)
            for out, parts in ((keep, kept), (revoke, gone), (free, new - taken)):
                if parts:
                    out[topic] = parts
        if revoke and owns_any(owned, revoke):  # REVOKE: give these up first, same epoch
            self._to_state(member, UNREVOKED, member.epoch, keep, revoke, now)
        else:  # ASSIGN (the free ones; UnreleasedPartitions until RELEASED): the target epoch
            merged = {t: keep.get(t, frozenset()) | free.get(t, frozenset())
                      for t in set(keep) | set(free)}  # fmt: skip
            state = UNRELEASED if unreleased else MEMBER_STABLE
            self._to_state(member, state, group.assignment_epoch, merged, {}, now)

    @staticmethod
    def _to_state(
        member: Member, state: str, epoch: int, assigned: Assignment, revoking: Assignment,
        now: float,
    ) -> None:  # fmt: skip
        if state == UNREVOKED and (member.state != UNREVOKED or member.revoking != revoking):
            member.revoke_deadline = now + member.rebalance_timeout
        elif state != UNREVOKED:
            member.revoke_deadline = None
        member.state, member.assigned, member.revoking = state, assigned, revoking
        member.set_epoch(epoch)

    # -- leaving, expiry ------------------------------------------------------------------------

    def _leave(self, body: Any, now: float) -> None:
        """Epoch -1: the member leaves (LEFT); -2: a static member steps out, keeping its
        partitions until its session ends or its successor comes (STATIC_LEFT)."""
        group = self._groups.get(body.group_id)
        if group is None:
            raise Refused(ErrorCode.group_id_not_found, f"Group {body.group_id} not found.")
        self._tick(group, now)
        if body.instance_id is None:
            member = group.members.get(body.member_id)
            if member is None:
                raise Refused(ErrorCode.unknown_member_id,
                              f"Member {body.member_id} is not a member of group "
                              f"{group.group_id}.")  # fmt: skip
        else:
            member = self._static_owner(group, body.member_id, body.instance_id)
        if body.member_epoch == STATIC_LEAVE_EPOCH:
            member.epoch, member.revoking, member.revoke_deadline = STATIC_LEAVE_EPOCH, {}, None
        else:
            self._remove(group, [member])

    def _remove(self, group: ConsumerGroup, members: list[Member]) -> None:
        """Drop members (left, session expired, not revoked in time: FENCED); the group epoch
        goes up and the others share their partitions."""
        for m in members:
            del group.members[m.member_id]
            group.target.pop(m.member_id, None)
            if m.instance_id is not None and group.static.get(m.instance_id) == m.member_id:
                del group.static[m.instance_id]
        self._bump(group)

    def _tick(self, group: ConsumerGroup, now: float) -> None:
        """Drop the members whose session ended (SESSION_EXPIRED) or whose revocation is
        overdue (REVOKE_TIMEOUT)."""
        gone = [
            m for m in group.members.values()
            if now >= m.deadline or (m.revoke_deadline is not None and now >= m.revoke_deadline)
        ]  # fmt: skip
        if gone:
            self._remove(group, gone)

    # -- what the classic coordinator asks (its lock held) --------------------------------------

    def group(self, group_id: str) -> ConsumerGroup | None:
        """The consumer group of that name, its deadlines looked at; None when there is none."""
        group = self._groups.get(group_id)
        if group is not None:
            self._tick(group, self.clock())
        return group

    def groups(self) -> list[ConsumerGroup]:
        return [g for g in map(self.group, list(self._groups)) if g is not None]

    def member_count(self, group_id: str) -> int:
        """How many members `group_id` has (the store's member source)."""
        with self.lock:
            group = self.group(group_id)
            return 0 if group is None else len(group.members)

    def release(self, group_id: str) -> None:
        """Forget the (empty) group: a classic group takes its name, as Kafka converts one."""
        self._groups.pop(group_id, None)

    def forget_dead(self, committed: set[str]) -> None:
        """Forget the Empty groups that have no committed offsets (Kafka's cleanup)."""
        for gid in [g.group_id for g in self.groups() if not g.members]:
            if gid not in committed:
                del self._groups[gid]

    def commit_error(
        self, group_id: str, member_id: str, epoch: int, version: int
    ) -> ErrorCode | None:
        """OffsetCommit's check for a consumer group (None: `group_id` is not one): a member's
        commit needs v9 and its current epoch (STALE_MEMBER_EPOCH); one with epoch -1 (an
        admin's, a consumer's without a group) needs a group without members."""
        group = self.group(group_id)
        if group is None:
            return None
        if epoch < 0 and not group.members:
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if version < 9:
            return ErrorCode.unsupported_version
        return ErrorCode.none if epoch == member.epoch else ErrorCode.stale_member_epoch

    def fetch_error(self, group_id: str, member_id: str | None, epoch: int) -> ErrorCode | None:
        """OffsetFetch v9's check when it names a member: known, at its epoch."""
        group = self.group(group_id)
        if group is None or (member_id is None and epoch < 0):
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        return ErrorCode.none if epoch == member.epoch else ErrorCode.stale_member_epoch

    def member_list(self, group_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """(state, members) for the console, as the classic coordinator's member_list."""
        with self.lock:
            group = self.group(group_id)
            if group is None:
                return None
            members = [
                {"member_id": m.member_id, "instance_id": m.instance_id,
                 "client_id": m.client_id, "client_host": m.client_host,
                 "assignment": {t: sorted(ps) for t, ps in sorted(m.assigned.items())}}
                for m in group.members.values()
            ]  # fmt: skip
            return group.state, members

    # -- ConsumerGroupDescribe ------------------------------------------------------------------

    def describe(self, found: Api, body: Any, session: Any) -> Any:
        """Each group as Kafka describes a consumer group: GROUP_ID_NOT_FOUND for a name that
        is not one (librdkafka then asks DescribeGroups, for a classic group)."""
        asked = bool(body.include_authorized_operations)
        with self.lock:
            described = tuple(
                self._described(found.module, gid, session, asked) for gid in body.group_ids
            )
        return build(found.response, throttle_time=NO_TIME, groups=described)

    def _operations(self, session: Any, group_id: str, asked: bool) -> int:
        """The principal's authorized operations on the group, when asked (Kafka's bit field)."""
        if not asked:
            return NOT_ASKED
        access = Access(None) if self.access is None else self.access(session)
        return access.kafka_operations(GROUP, group_id)

    def _described(self, m: Any, group_id: str, session: Any, asked: bool) -> Any:
        group = self.group(group_id)
        if not self._allowed(session, DESCRIBE, group_id):
            code, message = ErrorCode.group_authorization_failed, f"may not describe {group_id!r}"
        elif not self.here():
            code, message = ErrorCode.not_coordinator, "this broker does not coordinate groups"
        elif group is None:
            code, message = (
                ErrorCode.group_id_not_found,
                f"Group {group_id} is not a consumer group.",
            )
        else:
            return build(
                m.DescribedGroup, error_code=ErrorCode.none, error_message=None,
                group_id=group_id, group_state=group.state, group_epoch=group.epoch,
                assignment_epoch=group.assignment_epoch, assignor_name=group.assignor,
                members=tuple(self._described_member(m, group, x) for x in group.members.values()),
                authorized_operations=self._operations(session, group_id, asked),
            )  # fmt: skip
        return build(m.DescribedGroup, error_code=code, error_message=message, group_id=group_id,
                     group_state=DEAD, group_epoch=-1, assignment_epoch=-1, assignor_name="",
                     members=(), authorized_operations=NOT_ASKED)  # fmt: skip

    @staticmethod
    def _described_member(m: Any, group: ConsumerGroup, member: Member) -> Any:
        def assignment(parts: Assignment) -> Any:
            return build(m.Assignment, topic_partitions=tuple(
                build(m.TopicPartitions, topic_id=topic_id(t), topic_name=t,
                      partitions=tuple(sorted(ps)))
                for t, ps in sorted(parts.items())))  # fmt: skip

        return build(
            m.Member, member_id=member.member_id, instance_id=member.instance_id,
            rack_id=member.rack_id, member_epoch=member.epoch, client_id=member.client_id,
            client_host=member.client_host, subscribed_topic_names=member.topics,
            subscribed_topic_regex=member.regex, assignment=assignment(member.assigned),
            target_assignment=assignment(group.target.get(member.member_id, {})),
            member_type=CONSUMER_MEMBER,
        )  # fmt: skip


def check_heartbeat(body: Any, version: int) -> None:
    """Kafka's checks of a heartbeat before it touches a group, in its order (INVALID_REQUEST,
    INVALID_GROUP_ID, UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION)."""
    invalid = ErrorCode.invalid_request
    epoch = body.member_epoch
    if (version >= FIRST_ID_VERSION or epoch > 0 or epoch == LEAVE_EPOCH) and blank(body.member_id):
        raise Refused(invalid, "MemberId can't be empty.")
    for name, value in (("GroupId", body.group_id), ("InstanceId", body.instance_id),
                        ("RackId", body.rack_id)):  # fmt: skip
        if value is not None and blank(value):
            raise Refused(invalid, f"{name} can't be empty.")
    if epoch == JOIN_EPOCH:
        check_join(body)
    elif epoch == STATIC_LEAVE_EPOCH and body.instance_id is None:
        raise Refused(invalid, "InstanceId can't be null.")
    elif epoch < STATIC_LEAVE_EPOCH:
        raise Refused(invalid, "MemberEpoch is invalid.")
    try:
        validate_group(body.group_id)
    except InvalidGroupError as e:
        raise Refused(ErrorCode.invalid_group_id, str(e)) from None
    if body.server_assignor is not None and body.server_assignor not in ASSIGNORS:
        raise Refused(ErrorCode.unsupported_assignor,
                      f"ServerAssignor {body.server_assignor} is not supported. Supported "
                      f"assignors: {', '.join(ASSIGNORS)}.")  # fmt: skip
    regex = getattr(body, "subscribed_topic_regex", None)
    if regex and compiled(regex) is None:
        raise Refused(
            ErrorCode.invalid_regular_expression,
            f"SubscribedTopicRegex `{regex}` is not a valid regular expression.",
        )


def check_join(body: Any) -> None:
    """What a joining heartbeat (epoch 0) must carry."""
    invalid = ErrorCode.invalid_request
    if body.rebalance_timeout.total_seconds() < 0:
        raise Refused(invalid, "RebalanceTimeoutMs must be provided in first request.")
    if body.topic_partitions is None or len(body.topic_partitions):
        raise Refused(invalid, "TopicPartitions must be empty when (re-)joining.")
    if (
        body.subscribed_topic_names is None
        and getattr(body, "subscribed_topic_regex", None) is None
    ):
        raise Refused(invalid, "Either SubscribedTopicNames or SubscribedTopicRegex must be "
                               "non-null when (re-)joining.")  # fmt: skip


def blank(value: str) -> bool:
    """Kafka's "empty": nothing but whitespace."""
    return not value.strip()


def check_epoch(member: Member, received: int, owned: Assignment | None) -> None:
    """FENCED_MEMBER_EPOCH unless the member sends its epoch, or its previous one with no
    more than it owns now (the answer that bumped it may have been lost)."""
    if received == member.epoch or (
        received == member.previous_epoch and within(owned, member.assigned)
    ):
        return
    than = "greater" if received > member.epoch else "smaller"
    raise Refused(ErrorCode.fenced_member_epoch,
                  f"The consumer group member has a {than} member epoch ({received}) than the "
                  f"one known by the group coordinator ({member.epoch}). The member must "
                  "abandon all its partitions and rejoin.")  # fmt: skip


def within(owned: Assignment | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    return all(parts <= assigned.get(topic, frozenset()) for topic, parts in owned.items())


def owns_any(owned: Assignment | None, revoking: Assignment) -> bool:
    """Whether the member may still own some of `revoking` (it did not say: it may)."""
    if owned is None:
        return True
    return any(parts & revoking.get(topic, frozenset()) for topic, parts in owned.items())


def preferred_assignor(members: Iterable[Member]) -> str:
    """The assignor most members asked for (ties: Kafka's order), else the default."""
    votes: dict[str, int] = {}
    for m in members:
        if m.assignor is not None:
            votes[m.assignor] = votes.get(m.assignor, 0) + 1
    if not votes:
        return ASSIGNORS[0]
    return max(ASSIGNORS, key=lambda name: (votes.get(name, 0), -ASSIGNORS.index(name)))


Subscriptions = Mapping[str, frozenset[str]]  # member ID -> the topics it subscribes to


def uniform_assign(
    members: Subscriptions, topics: Mapping[str, int], previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Kafka's `uniform` assignor's aim: each member as many partitions as those sharing its
    topics (one more at most) and as few moves as that allows. Each member keeps what it had
    up to its fair share; the rest go, fewest-candidates first, to the candidate with the
    fewest (its previous owner on a tie, then member ID order)."""
    candidates = {(t, p): sorted(m for m, ts in members.items() if t in ts)
                  for t, n in topics.items() for p in range(n)}  # fmt: skip
    candidates = {tp: ms for tp, ms in candidates.items() if ms}
    share = dict.fromkeys(members, Fraction(0))
    for ms in candidates.values():
        for m in ms:
            share[m] += Fraction(1, len(ms))
    given: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    before = {(t, p): m for m, a in previous.items() for t, ps in a.items() for p in ps}
    for tp, m in sorted(before.items(), key=lambda item: (item[1], item[0])):
        if m in given and m in candidates.get(tp, ()) and len(given[m]) < int(share[m]):
            given[m].add(tp)
    taken = set().union(*given.values())
    for tp in sorted(set(candidates) - taken, key=lambda tp: (len(candidates[tp]), tp)):
        m = min(candidates[tp], key=lambda m: (len(given[m]), before.get(tp) != m, m))
        given[m].add(tp)
    return {m: by_topic(tps) for m, tps in given.items()}


def range_assignor(
    members: Subscriptions, topics: Mapping[str, int], previous: Mapping[str, Assignment]
) -> dict[str, Assignment]:
    """Kafka's `range`: per topic, its subscribers in member ID order take consecutive ranges
    (consume/group.range_assign, the in-process groups' assignor)."""
    order = [(m, sorted(members[m])) for m in sorted(members)]
    got = range_assign(order, lambda topic: topics.get(topic, 0))
    return {m: by_topic(tps) for m, tps in got.items()}


ASSIGN: dict[str, Callable[..., dict[str, Assignment]]] = {
    "uniform": uniform_assign,
    "range": range_assignor,
}


def by_topic(tps: Iterable[tuple[str, int]]) -> Assignment:
    out: dict[str, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


def wire_partitions(m: Any, assignment: Assignment) -> tuple[Any, ...]:
    """A heartbeat answer's topic partitions, by topic ID."""
    return tuple(
        build(m.TopicPartitions, topic_id=topic_id(t), partitions=tuple(sorted(ps)))
        for t, ps in sorted(assignment.items())
    )
