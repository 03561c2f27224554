"""Consumer groups over the wire: Kafka's classic group protocol, coordinated by this node.

Every group's coordinator is this node (FindCoordinator names it for any key). A group moves
through Kafka's states:

    Empty ──join──> PreparingRebalance ──all joined / rebalance timeout──> CompletingRebalance
      ^                  ^   (members that did not rejoin are dropped)        │ leader's SyncGroup
      └── last member ───┴──── join, leave, session expiry ──────── Stable <──┘

A JoinGroup waits (long-polls, as a server/delayed.py Delayed: no thread is held) until the
rebalance completes: every
known member has rejoined, or the largest rebalance timeout of the members passed. Then the
generation goes up, one protocol (assignor) all members support is chosen, and the leader's
response carries every member's subscription metadata; the leader sends the assignments in its
SyncGroup, which followers' SyncGroups wait for. A member is kept alive by heartbeats (and by
commits and being blocked in a join or sync); one silent for its session timeout is dropped
and the group rebalances, which is how a consumer killed with SIGKILL leaves. Static members
(group.instance.id) keep their place across restarts: a rejoin under the same instance ID
takes over the old member ID (the old one is fenced: FENCED_INSTANCE_ID) and, in a Stable
group, gets its assignment back without a rebalance, the leader too (KIP-814).

Group membership lives in memory: a server restart starts every group Empty, and clients
rejoin. Committed offsets are durable, in `__consumer_offsets` in Kafka's key/value layout,
written and read through the store's one OffsetStore (`Store.offset_store()`), so wire
consumers, `store.consumer(...)`, `store.group_lag()` and `mqcore groups` see the same offsets.
Membership of wire groups and of in-process `store.consumer()` groups is separate.

Time is checked lazily: whenever a request touches a group, and by every waiting JoinGroup or
SyncGroup at its group's next deadline (the purgatory's recheck), so no thread of its own is
needed. Every change to a group wakes the waiting requests (`wake`, the purgatory's "groups"
key).
docs/server.md "Consumer groups" lists the APIs, versions and what is not served.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from mqcore.consume.group import validate_group
from mqcore.consume.offsets import OffsetAndMetadata, OffsetStore
from mqcore.errors import (
    GroupNotEmptyError,
    InvalidGroupError,
    MQCoreError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.server.auth import DELETE, DESCRIBE, GROUP, NOT_ASKED, READ, Access
from mqcore.server.common import client_host
from mqcore.server.consumergroups import GROUP_TYPE as CONSUMER_GROUP_TYPE
from mqcore.server.consumergroups import (
    HEARTBEAT_INTERVAL,
    SESSION_TIMEOUT,
    ConsumerGroups,
)
from mqcore.server.delayed import NOT_YET, Delayed
from mqcore.server.protocol import Api, build

if TYPE_CHECKING:
    from mqcore.store import Store

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
)
GROUP_TYPE = "classic"  # ListGroups v5's name for the protocol served here (not KIP-848's)
CONSUMER = "consumer"  # the protocol type of Kafka's consumers (OffsetDelete's subscriptions)

# Kafka's broker defaults: group.min.session.timeout.ms, group.max.session.timeout.ms,
# offset.metadata.max.bytes
MIN_SESSION_TIMEOUT = 6.0
MAX_SESSION_TIMEOUT = 1800.0
MAX_METADATA = 4096
# Kafka's group.initial.rebalance.delay.ms: the first rebalance of an Empty group waits this
# long (and as long again after each member that joins meanwhile, up to the rebalance timeout)
# so that members started together land in one generation, with their metadata
INITIAL_REBALANCE_DELAY = 3.0
MAX_WAIT_SLICE = 1.0  # a waiter re-checks the clock at least this often (the clock may be a test's)
KEY_GROUP, KEY_TRANSACTION = 0, 1
WAKE_KEY = "groups"  # the purgatory key every group change wakes
CLEANUP_INTERVAL = 60.0  # seconds: a new group's join forgets dead groups at most this often
NO_DURATION = datetime.timedelta(0)  # throttle_time

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class Waiter:
    """A JoinGroup or SyncGroup waiting for the rebalance: `result` is set when it is answered."""

    __slots__ = ("result",)

    def __init__(self) -> None:
        self.result: Any = None


@dataclass(slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    skip_assignment: bool = False  # KIP-814: a static leader rejoined, the assignment stands


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    deadline: float  # the session expires at this time of the clock unless it heartbeats
    assignment: bytes = b""
    join: Waiter | None = None  # set while its JoinGroup waits
    sync: Waiter | None = None  # set while its SyncGroup waits

    def metadata(self, protocol: str | None) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""


@dataclass(slots=True)
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member ID
    pending: dict[str, float] = field(default_factory=dict)  # IDs given by MEMBER_ID_REQUIRED
    rebalance_deadline: float = 0.0
    join_not_before: float = 0.0  # the initial rebalance's delay (0: none)

    def fenced(self, member_id: str, instance_id: str | None) -> bool:
        """A static member's request under a member ID its instance no longer has."""
        if instance_id is None:
            return False
        owner = self.static.get(instance_id)
        return owner is not None and owner != member_id


@dataclass(frozen=True, slots=True)
class Fetched:
    """One partition's answer to OffsetFetch: its committed offset (-1: none), the leader
    epoch committed with it, its metadata, or an error."""

    offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error: ErrorCode = ErrorCode.none


Committed = dict[str, dict[int, Fetched]]  # OffsetFetch's answer by topic and partition


def fetched(om: OffsetAndMetadata | None) -> Fetched:
    if om is None:
        return Fetched()
    return Fetched(om.offset, om.leader_epoch, om.metadata)


@dataclass(frozen=True, slots=True)
class Listed:
    """How ListGroups shows a group."""

    state: str
    protocol_type: str
    group_type: str  # "classic" or "consumer" (KIP-848)


def failed(code: ErrorCode, asked: Iterable[Any] | None) -> tuple[ErrorCode, Committed]:
    """OffsetFetch's answer for a group it cannot read: `code`, in each asked partition too."""
    return code, {t.name: dict.fromkeys(t.partition_indexes, Fetched(error=code))
                  for t in asked or ()}  # fmt: skip


class GroupCoordinator:
    """The classic consumer-group protocol for every group of one store: the request handlers
    of FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
    DescribeGroups, ListGroups, DeleteGroups and OffsetDelete, and, through `consumer` (a
    server/consumergroups.py ConsumerGroups sharing its lock), KIP-848's consumer groups
    (ConsumerGroupHeartbeat, ConsumerGroupDescribe) and their side of the shared APIs.
    `node_id`, `host` and `port` are what FindCoordinator answers; `initial_rebalance_delay`
    (seconds) is Kafka's group.initial.rebalance.delay.ms (the Server passes
    INITIAL_REBALANCE_DELAY unless told); `consumer_session_timeout` and
    `consumer_heartbeat_interval` Kafka's group.consumer.session.timeout.ms and
    group.consumer.heartbeat.interval.ms; `clock` (seconds, monotonic) is for tests."""

    def __init__(
        self,
        store: Store,
        node_id: int,
        host: str,
        port: int,
        *,
        min_session_timeout: float = MIN_SESSION_TIMEOUT,
        max_session_timeout: float = MAX_SESSION_TIMEOUT,
        initial_rebalance_delay: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        access: Callable[[Any], Access] | None = None,
        wake: Callable[[], None] | None = None,
        consumer_session_timeout: float = SESSION_TIMEOUT,
        consumer_heartbeat_interval: float = HEARTBEAT_INTERVAL,
        locate: Callable[[], tuple[int, str, int] | None] | None = None,
        replicated: Callable[[Callable[[Any], Any]], Any] | None = None,
        locate_txn: Callable[[], tuple[int, str, int] | None] | None = None,
    ):
        self.store = store
        # on a cluster, (node, host, port) of the broker coordinating the groups (the offsets
        # topic's leader), None while it has none; None here: this node, always
        self.locate = locate
        # on a cluster, the same for the transaction coordinator (server/txncluster.py)
        self.locate_txn = locate_txn
        # on a cluster, replicated(respond): an offset commit's response once the offsets
        # topic's in-sync replicas have it (respond(error code) if they do not in time)
        self.replicated = replicated
        # access(session): the session's grants (server.auth.Access; None: no ACLs). Kafka's
        # rules: a group's members need `read` on it, describing and fetching its offsets
        # `describe`, deleting it or its offsets `delete`; offsets of a topic are committed
        # with the topic's `read` and fetched with its `describe`
        self.access = access
        self._wake = wake  # a group changed: the Broker wakes the purgatory's WAKE_KEY
        self.node_id, self.host, self.port = node_id, host, port
        self.min_session_timeout = min_session_timeout
        self.max_session_timeout = max_session_timeout
        self.initial_rebalance_delay = initial_rebalance_delay
        self.clock = clock
        self.closed = False
        # one lock for every group, of either protocol: group operations are short, and
        # waits release it
        self._cond = threading.Condition()
        self.consumer = ConsumerGroups(
            store, self._cond, clock=clock, access=access, claim=self._claim, here=self.here,
            session_timeout=consumer_session_timeout,
            heartbeat_interval=consumer_heartbeat_interval,
        )  # fmt: skip
        self._groups: dict[str, Group] = {}
        self._last_cleanup = -float("inf")  # when dead groups were last forgotten
        self._offsets: OffsetStore | None = None
        # the store counts this coordinator's members (group_type, delete_group,
        # alter_group_offsets): a group of Kafka clients is a consumer group there too
        store.add_member_source(self.member_count)
        # the store's expiry of abandoned groups' offsets: their Empty groups go too
        store.add_group_expiry_listener(self._offsets_expired)

    def close(self) -> None:
        """Answer every waiting JoinGroup and SyncGroup at once (the server is stopping)."""
        with self._cond:
            self.closed = True
            self._changed()
        self.consumer.close()
        self.store.remove_member_source(self.member_count)
        self.store.remove_group_expiry_listener(self._offsets_expired)

    def take_over(self) -> None:
        """This broker became the groups' coordinator (a cluster's offsets-topic leader
        moved here): forget the groups it held before (their members rejoin, as with a
        Kafka coordinator that loads a partition) and read the committed offsets again from
        the replicated log."""
        with self._cond:
            self._groups.clear()
            self.consumer.forget_all()
            self._changed()
        if self._offsets is not None:
            self._offsets.reload()

    def _changed(self) -> None:
        """A group changed (held lock): wake the requests waiting on one, blocked or Delayed."""
        self._cond.notify_all()
        if self._wake is not None:
            self._wake()

    def member_count(self, group_id: str) -> int:
        """How many members `group_id` has here, those still joining included (the store's
        member source)."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return 0
            self._tick(group, self.clock())
            return len(group.members) + len(group.pending)

    @property
    def offsets(self) -> OffsetStore:
        """The store's committed offsets (made on first use: a read-only store refuses)."""
        if self._offsets is None:
            self._offsets = self.store.offset_store()
        return self._offsets

    def member_list(self, group_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """(state, members) of a group this coordinator holds, each member's ID, static
        instance ID, client ID, host and, in a consumer group, its assignment ({topic:
        partitions}, decoded by consumer_assignment), in join order; None for a group it does
        not hold (the console's groups page shows them); a KIP-848 group's as
        ConsumerGroups.member_list gives them."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return self.consumer.member_list(group_id)
            self._tick(group, self.clock())
            consumer = group.protocol_type == "consumer"
            members = [
                {"member_id": m.member_id, "instance_id": m.instance_id,
                 "client_id": m.client_id, "client_host": m.client_host,
                 "assignment": consumer_assignment(m.assignment) if consumer else None}
                for m in group.members.values()
            ]  # fmt: skip
            return group.state, members

    def handlers(self) -> dict[int, Callable[[Api, Any, Any], Any]]:
        """API key -> handler, for the Broker's table."""
        return {
            8: self.offset_commit,
            9: self.offset_fetch,
            10: self.find_coordinator,
            11: self.join_group,
            12: self.heartbeat,
            13: self.leave_group,
            14: self.sync_group,
            15: self.describe_groups,
            16: self.list_groups,
            42: self.delete_groups,
            47: self.offset_delete,
        }

    def _claim(self, group_id: str) -> str | None:
        """Why a new KIP-848 group may not take `group_id` (held lock): a classic group or an
        in-process `store.consumer()` group has members, or it is a share group's; None when
        it may. A classic group left Empty is forgotten, as Kafka converts it."""
        classic = self._groups.get(group_id)
        if classic is not None:
            self._tick(classic, self.clock())
            if classic.members or classic.pending:
                return f"Group {group_id} is not a consumer group."
            del self._groups[group_id]
        if self.store.group_type(group_id) == "share" or self.store.group_members(group_id):
            return f"Group {group_id} is not a consumer group."
        return None

    # -- authorization (server.auth; docs/server.md "ACL file") --------------------------------

    def topic_allowed(self, session: Any, operation: str, topic: str) -> bool:
        return self.access is None or self.access(session).topic(operation, topic)

    def group_allowed(self, session: Any, operation: str, group_id: str) -> bool:
        return self.access is None or self.access(session).group(operation, group_id)

    def refusal(self, session: Any, operation: str, group_id: str) -> ErrorCode | None:
        """Why a group request is not answered here: GROUP_AUTHORIZATION_FAILED without the
        grant, NOT_COORDINATOR on a cluster's broker that does not lead the offsets topic
        (the client asks FindCoordinator again); None when it is."""
        if not self.group_allowed(session, operation, group_id):
            return ErrorCode.group_authorization_failed
        if self.locate is not None and not self.here():
            return ErrorCode.not_coordinator
        return None

    def here(self) -> bool:
        """Whether this node coordinates the groups (always on a node of one)."""
        if self.locate is None:
            return True
        found = self.locate()
        return found is not None and found[0] == self.node_id

    # -- FindCoordinator ------------------------------------------------------------------------

    def find_coordinator(self, found: Api, body: Any, session: Any) -> Any:
        """The groups' coordinator for a group, the transactions' for a transactional ID: this
        node on a node of one; on a cluster the leader of the offsets topic, or of the
        transaction state's."""
        key_type = getattr(body, "key_type", KEY_GROUP)
        if found.version >= 4:  # KIP-699: a batch of keys
            coordinators = tuple(
                build(
                    found.module.Coordinator,
                    key=key,
                    node_id=node,
                    host=host,
                    port=port,
                    error_code=code,
                    error_message=message,
                )  # fmt: skip
                for key in body.coordinator_keys
                for code, message, node, host, port in [self._coordinator(session, key_type, key)]
            )
            return build(found.response, throttle_time=NO_DURATION, coordinators=coordinators)
        code, message, node, host, port = self._coordinator(session, key_type, body.key)
        return build(
            found.response,
            throttle_time=NO_DURATION,
            error_code=code,
            error_message=message,
            node_id=node,
            host=host,
            port=port,
        )

    def _coordinator(
        self, session: Any, key_type: int, key: str
    ) -> tuple[ErrorCode, str | None, int, str, int]:
        """(error, message, node, host, port) for one key: a group's needs `describe` on it
        (Kafka's rule, so a principal cannot learn of groups it may not see), a
        transactional ID's `describe` on the ID."""
        if key_type not in (KEY_GROUP, KEY_TRANSACTION):
            return ErrorCode.invalid_request, f"coordinator key type {key_type}", -1, "", -1
        if key_type == KEY_GROUP and not self.group_allowed(session, DESCRIBE, key):
            return ErrorCode.group_authorization_failed, f"may not describe {key!r}", -1, "", -1
        if key_type == KEY_TRANSACTION and self.access is not None and \
                not self.access(session).transactional_id(DESCRIBE, key):  # fmt: skip
            return (ErrorCode.transactional_id_authorization_failed,
                    f"may not describe transactional ID {key!r}", -1, "", -1)  # fmt: skip
        locate = self.locate_txn if key_type == KEY_TRANSACTION else self.locate
        if locate is not None:  # a cluster: the leader of the internal topic
            found = locate()
            if found is None:
                return (ErrorCode.coordinator_not_available, "the coordinator's internal topic "
                        "has no leader", -1, "", -1)  # fmt: skip
            return (ErrorCode.none, None, *found)
        return ErrorCode.none, None, self.node_id, self.host, self.port

    # -- JoinGroup ------------------------------------------------------------------------------

    def join_group(self, found: Api, body: Any, session: Any) -> Any:
        """Join (or rejoin); a Delayed answered when the rebalance completes."""
        with self._cond:
            result = self._join(found.version, body, session)
        answer = functools.partial(self._join_response, found)
        if isinstance(result, Waiter):
            closing = JoinResult(ErrorCode.rebalance_in_progress, "")
            return self._delayed(result, body.group_id, closing, answer)
        return answer(result)

    def _join_response(self, found: Api, result: JoinResult) -> Any:
        m = found.module
        members = tuple(
            build(m.JoinGroupResponseMember, member_id=mid, group_instance_id=iid, metadata=data)
            for mid, iid, data in result.members
        )
        # protocol_name is nullable from v7 on; earlier versions answer "" on an error
        name = result.protocol_name
        if name is None and found.version < 7:
            name = ""
        return build(
            found.response,
            throttle_time=NO_DURATION,
            error_code=result.error,
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=name,
            leader=result.leader,
            skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=members,
        )

    def _join(self, version: int, body: Any, session: Any) -> JoinResult | Waiter:
        member_id: str = body.member_id
        instance_id: str | None = getattr(body, "group_instance_id", None)
        session_timeout = body.session_timeout.total_seconds()
        rebalance_timeout = getattr(body, "rebalance_timeout", body.session_timeout)
        rebalance_timeout = rebalance_timeout.total_seconds()
        if rebalance_timeout < 0:  # v0 has none: the session timeout serves
            rebalance_timeout = session_timeout
        protocols = [(p.name, bytes(p.metadata)) for p in body.protocols]
        if self.closed:
            return JoinResult(ErrorCode.rebalance_in_progress, member_id)
        refused = self.refusal(session, READ, body.group_id)  # Kafka's first check
        if refused is not None:
            return JoinResult(refused, member_id)
        try:
            validate_group(body.group_id)
        except InvalidGroupError:
            return JoinResult(ErrorCode.invalid_group_id, member_id)
        if not self.min_session_timeout <= session_timeout <= self.max_session_timeout:
            return JoinResult(ErrorCode.invalid_session_timeout, member_id)
        if not body.protocol_type or not protocols:
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id)
        if self.store.group_type(body.group_id) == "share":  # Kafka: "not a consumer group"
            return JoinResult(ErrorCode.group_id_not_found, member_id)
        if self.consumer.member_count(body.group_id):  # a KIP-848 group's (no migration)
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id)
        self.consumer.release(body.group_id)  # an Empty one becomes a classic group
        now = self.clock()
        group = self._groups.get(body.group_id)
        if group is None:
            if member_id:
                return JoinResult(ErrorCode.unknown_member_id, member_id)
            if now - self._last_cleanup > CLEANUP_INTERVAL:  # new groups: forget dead ones
                self._forget_dead(self._committed_groups())
            group = self._groups[body.group_id] = Group(body.group_id)
        self._tick(group, now)
        if not self._supports(group, body.protocol_type, protocols, member_id):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id)

        def new_member(mid: str) -> Member:
            return Member(
                mid,
                instance_id,
                session.client_id or "",
                client_host(session),
                session_timeout,
                rebalance_timeout,
                body.protocol_type,
                protocols,
                now + session_timeout,
            )

        known = set(group.members)
        if not member_id and instance_id is not None:
            new_id = make_member_id(instance_id)
            old = group.members.get(group.static.get(instance_id, ""))
            if old is None:
                member = group.members[new_id] = new_member(new_id)
                group.static[instance_id] = new_id
            else:
                old_leader = group.leader
                member = self._replace_static(group, old, new_id)
                self._update(member, session_timeout, rebalance_timeout, protocols, now)
                if group.state == STABLE and self._select_protocol(group) == group.protocol_name:
                    return self._static_rejoined(group, new_id, old_leader, version)
        elif not member_id:
            new_id = make_member_id(session.client_id or "member")
            if version >= 4:  # KIP-394: the client rejoins with the ID it is given
                group.pending[new_id] = now + session_timeout
                return JoinResult(ErrorCode.member_id_required, new_id)
            member = group.members[new_id] = new_member(new_id)
        elif member_id in group.pending:
            del group.pending[member_id]
            member = group.members[member_id] = new_member(member_id)
            if instance_id is not None:
                group.static[instance_id] = member_id
        elif group.fenced(member_id, instance_id):
            return JoinResult(ErrorCode.fenced_instance_id, member_id)
        elif member_id not in group.members:
            return JoinResult(ErrorCode.unknown_member_id, member_id)
        else:
            member = group.members[member_id]
            unchanged = member.protocols == protocols
            self._update(member, session_timeout, rebalance_timeout, protocols, now)
            # a follower whose subscription did not change rejoins a Stable group as it is
            if group.state == STABLE and unchanged and group.leader != member_id:
                return self._current(group, member_id)
        if member.join is not None:  # a rejoin while its earlier JoinGroup still waits
            member.join.result = JoinResult(ErrorCode.rebalance_in_progress, member.member_id)
        waiter = member.join = Waiter()
        if group.state == EMPTY:  # its first rebalance: wait for the others started with it
            self._prepare(group, now)
            group.join_not_before = min(now + self.initial_rebalance_delay,
                                        group.rebalance_deadline)  # fmt: skip
        elif group.state != PREPARING:
            self._prepare(group, now)
        elif group.join_not_before and member.member_id not in known:  # joined during the delay
            group.join_not_before = min(now + self.initial_rebalance_delay,
                                        group.rebalance_deadline)  # fmt: skip
        self._maybe_complete_join(group, now)  # answers `waiter` when it was the last to join
        return waiter

    def _supports(
        self, group: Group, protocol_type: str, protocols: list[tuple[str, bytes]], member: str
    ) -> bool:
        """Kafka's rule: an Empty group takes any protocol type; otherwise the type must be the
        group's, and some protocol (assignor) must be supported by every other member too."""
        others = [m for mid, m in group.members.items() if mid != member]
        if group.state == EMPTY or not others:
            return True
        if protocol_type != others[0].protocol_type:  # the group's, set by its first member
            return False
        names = {n for n, _ in protocols}
        for m in others:
            names &= {n for n, _ in m.protocols}
        return bool(names)

    def _update(
        self, member: Member, session_timeout: float, rebalance_timeout: float,
        protocols: list[tuple[str, bytes]], now: float,
    ) -> None:  # fmt: skip
        member.session_timeout, member.rebalance_timeout = session_timeout, rebalance_timeout
        member.protocols = protocols
        member.deadline = now + session_timeout

    def _replace_static(self, group: Group, old: Member, new_id: str) -> Member:
        """A static member restarted: its old member ID is fenced, the new one takes its place
        (and its assignment, and leadership)."""
        for waiter in (old.join, old.sync):
            if waiter is not None:
                waiter.result = (
                    JoinResult(ErrorCode.fenced_instance_id, old.member_id)
                    if waiter is old.join
                    else (ErrorCode.fenced_instance_id, b"")
                )
        old.join = old.sync = None
        del group.members[old.member_id]
        if group.leader == old.member_id:
            group.leader = new_id
        assert old.instance_id is not None
        group.static[old.instance_id] = new_id
        old.member_id = new_id
        group.members[new_id] = old
        self._changed()
        return old

    def _static_rejoined(
        self, group: Group, member_id: str, old_leader: str | None, version: int
    ) -> JoinResult:
        """A restarted static member of a Stable group whose protocol stays: no rebalance, the
        generation as it is (KIP-345). When it was the leader, v9+ tells it so with every
        member and skip_assignment (KIP-814: the assignment stands, it need not compute one);
        older versions name the old member ID as leader, so the client syncs as a follower
        and gets its assignment back (Kafka's answer to both)."""
        result = self._current(group, member_id)
        if group.leader == member_id:
            if version >= 9:
                result.skip_assignment = True
                result.members = tuple(
                    (m.member_id, m.instance_id, m.metadata(group.protocol_name))
                    for m in group.members.values()
                )
            else:
                result.leader = old_leader or ""
        return result

    def _current(self, group: Group, member_id: str) -> JoinResult:
        """The group's current generation, for a member that rejoins without changing it."""
        return JoinResult(
            ErrorCode.none,
            member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader or "",
        )

    def _prepare(self, group: Group, now: float) -> None:
        """Start a rebalance: SyncGroups waiting on the old generation are told to rejoin."""
        for m in group.members.values():
            if m.sync is not None:
                m.sync.result = (ErrorCode.rebalance_in_progress, b"")
                m.sync = None
            m.assignment = b""
        group.state = PREPARING
        group.rebalance_deadline = now + max(
            (m.rebalance_timeout for m in group.members.values()), default=0.0
        )
        self._changed()

    def _maybe_complete_join(self, group: Group, now: float) -> None:
        """Complete the rebalance once every member rejoined and no handed-out member ID is
        still to come, or at the rebalance deadline (dropping who did not rejoin)."""
        if group.state != PREPARING:
            return
        waiting = all(m.join is not None for m in group.members.values()) and not group.pending
        if now < group.rebalance_deadline and (not waiting or now < group.join_not_before):
            return
        group.join_not_before = 0.0
        for m in [m for m in group.members.values() if m.join is None]:
            self._remove(group, m)
        group.pending.clear()
        group.generation += 1
        if not group.members:
            group.state, group.protocol_name, group.leader = EMPTY, None, None
            self._changed()
            return
        first = next(iter(group.members.values()))
        group.protocol_type = first.protocol_type
        group.protocol_name = self._select_protocol(group)
        if group.leader not in group.members:
            group.leader = first.member_id
        group.state = COMPLETING
        everyone = tuple(
            (m.member_id, m.instance_id, m.metadata(group.protocol_name))
            for m in group.members.values()
        )
        for m in group.members.values():
            assert m.join is not None
            m.join.result = JoinResult(
                ErrorCode.none,
                m.member_id,
                group.generation,
                group.protocol_type,
                group.protocol_name,
                group.leader,
                everyone if m.member_id == group.leader else (),
            )
            m.join = None
            m.deadline = now + m.session_timeout
        self._changed()

    def _select_protocol(self, group: Group) -> str:
        """Kafka's vote: of the protocols every member supports, each member votes for the
        first in its own order; most votes wins (ties: the earlier in the leader's order)."""
        members = list(group.members.values())
        common = {n for n, _ in members[0].protocols}
        for m in members[1:]:
            common &= {n for n, _ in m.protocols}
        votes: dict[str, int] = {}
        for m in members:
            choice = next(n for n, _ in m.protocols if n in common)
            votes[choice] = votes.get(choice, 0) + 1
        leader = group.members.get(group.leader or "", members[0])
        order = [n for n, _ in leader.protocols if n in common]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    def _remove(self, group: Group, member: Member) -> None:
        """Drop a member (left, expired, or missed the rebalance); its waits end with
        UNKNOWN_MEMBER_ID."""
        del group.members[member.member_id]
        iid = member.instance_id
        if iid is not None and group.static.get(iid) == member.member_id:
            del group.static[iid]
        if member.join is not None:
            member.join.result = JoinResult(ErrorCode.unknown_member_id, member.member_id)
        if member.sync is not None:
            member.sync.result = (ErrorCode.unknown_member_id, b"")
        member.join = member.sync = None
        if group.leader == member.member_id:
            group.leader = None
        self._changed()

    def _members_left(self, group: Group, now: float) -> None:
        if group.state in (STABLE, COMPLETING):
            self._prepare(group, now)
        self._maybe_complete_join(group, now)

    def _tick(self, group: Group, now: float) -> None:
        """Expire the sessions and handed-out member IDs whose time is up, and complete a
        rebalance whose deadline passed. A member blocked in a join or sync is alive."""
        for mid, deadline in list(group.pending.items()):
            if now >= deadline:
                del group.pending[mid]
        expired = [
            m for m in group.members.values()
            if m.join is None and m.sync is None and now >= m.deadline
        ]  # fmt: skip
        for m in expired:
            self._remove(group, m)
        if expired:
            self._members_left(group, now)
        else:
            self._maybe_complete_join(group, now)

    def _next_deadline(self, group: Group) -> float:
        times = [m.deadline for m in group.members.values() if m.join is None and m.sync is None]
        times.extend(group.pending.values())
        if group.state == PREPARING:
            times.append(group.rebalance_deadline)
            if group.join_not_before:
                times.append(group.join_not_before)
        return min(times, default=float("inf"))

    def _delayed(
        self, waiter: Waiter, group_id: str, closing: Any, answer: Callable[[Any], Any]
    ) -> Delayed:
        """A JoinGroup's or SyncGroup's wait for `waiter`, as a Delayed: polled when a group
        changes and at the group's next deadline; a closing server answers `closing`."""

        def poll(final: bool) -> Any:
            with self._cond:
                result = self._poll(waiter, group_id, closing)
            return closing if result is NOT_YET and final else result

        def block() -> Any:
            with self._cond:
                return self._await(waiter, group_id, closing)

        return Delayed(
            poll, block, keys=(WAKE_KEY,), then=answer,
            recheck=lambda: self._recheck(group_id),
        )  # fmt: skip

    def _poll(self, waiter: Waiter, group_id: str, closing: Any) -> Any:
        """`waiter`'s answer after the group's deadlines up to now, or NOT_YET (held lock)."""
        group = self._groups.get(group_id)
        if group is not None:
            self._tick(group, self.clock())
        if waiter.result is not None:
            return waiter.result
        return closing if self.closed else NOT_YET

    def _recheck(self, group_id: str) -> float:
        """When (time.monotonic) the group's next deadline falls, by this coordinator's clock
        (a test's clock moves by hand: the purgatory looks at least every MAX_RECHECK)."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return time.monotonic() + MAX_WAIT_SLICE
            wait = max(self._next_deadline(group) - self.clock(), 0.001)
        return time.monotonic() + min(wait, MAX_WAIT_SLICE)

    def _await(self, waiter: Waiter, group_id: str, closing: Any) -> Any:
        """Wait (holding the condition between waits) until `waiter` is answered, checking
        the group's deadlines as they come; a closing server answers `closing` at once."""
        while (result := self._poll(waiter, group_id, closing)) is NOT_YET:
            group = self._groups.get(group_id)
            wait = MAX_WAIT_SLICE
            if group is not None:
                wait = min(wait, max(self._next_deadline(group) - self.clock(), 0.001))
            self._cond.wait(wait)
        return result

    # -- SyncGroup, Heartbeat, LeaveGroup -------------------------------------------------------

    def sync_group(self, found: Api, body: Any, session: Any) -> Any:
        """The leader's assignments go to every member; a follower waits for them."""
        answer = functools.partial(self._sync_response, found, body.group_id)
        refused = self.refusal(session, READ, body.group_id)
        if refused is not None:
            return answer((refused, b""))
        with self._cond:
            result = self._sync(body)
        if isinstance(result, Waiter):
            closing = (ErrorCode.rebalance_in_progress, b"")
            return self._delayed(result, body.group_id, closing, answer)
        return answer(result)

    def _sync_response(self, found: Api, group_id: str, result: tuple[ErrorCode, bytes]) -> Any:
        error, assignment = result
        protocol_type = protocol_name = None  # v5's fields, null on an error as in Kafka
        group = self._groups.get(group_id)
        if group is not None and error == ErrorCode.none:
            protocol_type, protocol_name = group.protocol_type, group.protocol_name
        return build(
            found.response,
            throttle_time=NO_DURATION,
            error_code=error,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            assignment=assignment,
        )

    def _sync(self, body: Any) -> tuple[ErrorCode, bytes] | Waiter:
        group = self._groups.get(body.group_id)
        if group is None:
            return ErrorCode.unknown_member_id, b""
        now = self.clock()
        self._tick(group, now)
        instance_id = getattr(body, "group_instance_id", None)
        if group.fenced(body.member_id, instance_id):
            return ErrorCode.fenced_instance_id, b""
        member = group.members.get(body.member_id)
        if member is None:
            return ErrorCode.unknown_member_id, b""
        if body.generation_id != group.generation:
            return ErrorCode.illegal_generation, b""
        protocol_type = getattr(body, "protocol_type", None)
        protocol_name = getattr(body, "protocol_name", None)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return ErrorCode.inconsistent_group_protocol, b""
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress, b""
        member.deadline = now + member.session_timeout
        if group.state == STABLE:
            return ErrorCode.none, member.assignment
        # CompletingRebalance
        if body.member_id == group.leader:
            given = {a.member_id: bytes(a.assignment) for a in body.assignments}
            for m in group.members.values():
                m.assignment = given.get(m.member_id, b"")
                m.deadline = now + m.session_timeout
                if m.sync is not None:
                    m.sync.result = (ErrorCode.none, m.assignment)
                    m.sync = None
            group.state = STABLE
            self._changed()
            return ErrorCode.none, member.assignment
        if member.sync is not None:
            member.sync.result = (ErrorCode.rebalance_in_progress, b"")
        member.sync = Waiter()
        return member.sync

    def heartbeat(self, found: Api, body: Any, session: Any) -> Any:
        refused = self.refusal(session, READ, body.group_id)
        if refused is not None:
            return build(found.response, throttle_time=NO_DURATION, error_code=refused)
        with self._cond:
            code = self._heartbeat(body)
        return build(found.response, throttle_time=NO_DURATION, error_code=code)

    def _heartbeat(self, body: Any) -> ErrorCode:
        group = self._groups.get(body.group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        now = self.clock()
        self._tick(group, now)
        if group.fenced(body.member_id, getattr(body, "group_instance_id", None)):
            return ErrorCode.fenced_instance_id
        member = group.members.get(body.member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        if body.generation_id != group.generation:
            return ErrorCode.illegal_generation
        member.deadline = now + member.session_timeout
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave_group(self, found: Api, body: Any, session: Any) -> Any:
        """Members leave (v3+: several at once, by member or instance ID); the group
        rebalances without them."""
        if found.version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        else:
            leaving = [(body.member_id, None)]
        denied = self.refusal(session, READ, body.group_id)
        if denied is not None:
            if found.version < 3:
                return build(found.response, throttle_time=NO_DURATION, error_code=denied)
            return build(
                found.response, throttle_time=NO_DURATION, error_code=denied, members=()
            )  # fmt: skip
        with self._cond:
            codes = self._leave(body.group_id, leaving)
        if found.version < 3:
            return build(found.response, throttle_time=NO_DURATION, error_code=codes[0])
        members = tuple(
            build(
                found.module.MemberResponse,
                member_id=mid,
                group_instance_id=iid,
                error_code=code,
            )
            for (mid, iid), code in zip(leaving, codes, strict=True)
        )
        return build(
            found.response,
            throttle_time=NO_DURATION,
            error_code=ErrorCode.none,
            members=members,
        )

    def _leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> list[ErrorCode]:
        group = self._groups.get(group_id)
        if group is None:
            return [ErrorCode.unknown_member_id] * len(leaving)
        now = self.clock()
        self._tick(group, now)
        codes, left = [], False
        for member_id, instance_id in leaving:
            if instance_id is not None:
                owner = group.static.get(instance_id)
                if owner is None or owner not in group.members:
                    codes.append(ErrorCode.unknown_member_id)
                elif member_id and member_id != owner:
                    codes.append(ErrorCode.fenced_instance_id)
                else:
                    self._remove(group, group.members[owner])
                    codes.append(ErrorCode.none)
                    left = True
            elif member_id in group.members:
                self._remove(group, group.members[member_id])
                codes.append(ErrorCode.none)
                left = True
            elif group.pending.pop(member_id, None) is not None:
                codes.append(ErrorCode.none)
                left = True
            else:
                codes.append(ErrorCode.unknown_member_id)
        if left:
            self._members_left(group, now)
        return codes

    # -- offsets --------------------------------------------------------------------------------

    def offset_commit(self, found: Api, body: Any, session: Any) -> Any:
        """Commit a member's offsets (or a standalone consumer's, generation -1, to a group
        without members) to `__consumer_offsets`, durably, through the store's OffsetStore
        (on a cluster, answered once the offsets topic's in-sync replicas have it)."""
        code = self.refusal(session, READ, body.group_id)
        if code is None:
            code = self._commit_allowed(body, found.version)
        chosen: dict[tuple[str, int], OffsetAndMetadata] = {}
        codes: dict[tuple[str, int], ErrorCode] = {}
        now_ms = self.store.log.clock()  # the store's clock: offsets expire by it
        for t in body.topics:
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                if code != ErrorCode.none:
                    codes[tp] = code
                    continue
                metadata = p.committed_metadata or ""
                if not self.topic_allowed(session, READ, t.name):
                    codes[tp] = ErrorCode.topic_authorization_failed
                elif len(metadata.encode()) > MAX_METADATA:
                    codes[tp] = ErrorCode.offset_metadata_too_large
                elif not self._partition_exists(*tp):
                    codes[tp] = ErrorCode.unknown_topic_or_partition
                else:
                    epoch = getattr(p, "committed_leader_epoch", -1)  # v6+ carry it
                    chosen[tp] = OffsetAndMetadata(p.committed_offset, metadata, now_ms, epoch)
                    codes[tp] = ErrorCode.none
        written = False
        if chosen:
            # written after the checks, outside the groups' lock, so an fdatasync does not
            # hold up every group's heartbeats; a rebalance that starts meanwhile does not
            # undo a commit the member was entitled to when it asked
            try:
                self.offsets.commit(body.group_id, chosen)
                written = True
            except MQCoreError as e:
                failed = storage_error(e)
                codes.update(dict.fromkeys(chosen, failed))

        def respond(failed: ErrorCode | None = None) -> Any:
            if failed is not None:
                codes.update(dict.fromkeys(chosen, failed))
            return self._commit_response(found, body, codes)

        if written and self.replicated is not None:  # a cluster: answered once replicated
            return self.replicated(respond)
        return respond()

    def _commit_response(self, found: Api, body: Any, codes: dict[tuple[str, int], Any]) -> Any:
        m = found.module
        topics = tuple(
            build(
                m.OffsetCommitResponseTopic,
                name=t.name,
                partitions=tuple(
                    build(
                        m.OffsetCommitResponsePartition,
                        partition_index=p.partition_index,
                        error_code=codes[(t.name, p.partition_index)],
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topics
        )
        return build(found.response, throttle_time=NO_DURATION, topics=topics)

    def _commit_allowed(self, body: Any, version: int) -> ErrorCode:
        """Kafka's checks, in its order: a standalone commit needs a group without members (here
        or `store.consumer()`s in the store's process: Store.group_members); a
        member's needs its member ID and the current generation, and no rebalance between
        JoinGroup and SyncGroup. The commit counts as a heartbeat. A KIP-848 group's member
        commits with its member epoch (ConsumerGroups.commit_error)."""
        try:
            validate_group(body.group_id)
        except InvalidGroupError:
            return ErrorCode.invalid_group_id
        if self.store.group_type(body.group_id) == "share":
            return ErrorCode.group_id_not_found
        generation = body.generation_id_or_member_epoch
        with self._cond:
            modern = self.consumer.commit_error(body.group_id, body.member_id, generation, version)
            if modern is not None:
                return modern
            group = self._groups.get(body.group_id)
            if group is None:  # no member here; members of the store's own consumers count
                if generation < 0 and not self.store.group_members(body.group_id):
                    return ErrorCode.none
                return ErrorCode.unknown_member_id
            now = self.clock()
            self._tick(group, now)
            if group.fenced(body.member_id, getattr(body, "group_instance_id", None)):
                return ErrorCode.fenced_instance_id
            if generation < 0 and group.state == EMPTY:
                return ErrorCode.none
            member = group.members.get(body.member_id)
            if member is None:
                return ErrorCode.unknown_member_id
            if generation != group.generation:
                return ErrorCode.illegal_generation
            if group.state == COMPLETING:
                return ErrorCode.rebalance_in_progress
            member.deadline = now + member.session_timeout
            return ErrorCode.none

    def _partition_exists(self, topic: str, partition: int) -> bool:
        try:
            return 0 <= partition < self.store.partitions(topic)
        except (UnknownTopicError, UnknownPartitionError):
            return False
        except MQCoreError:  # not a topic name at all
            return False

    def offset_fetch(self, found: Api, body: Any, session: Any) -> Any:
        """Committed offsets (-1 where none) of the partitions asked for, or of every partition
        the group committed (topics null); v8+ asks for several groups at once."""
        m = found.module
        if found.version >= 8:
            groups = tuple(
                build(
                    m.OffsetFetchResponseGroup,
                    group_id=g.group_id,
                    error_code=code,
                    topics=self._fetched(
                        m.OffsetFetchResponseTopics, m.OffsetFetchResponsePartitions, topics
                    ),
                )
                for g in body.groups
                for code, topics in [self._offsets_for(session, g.group_id, g.topics, g)]
            )
            return build(found.response, throttle_time=NO_DURATION, groups=groups)
        code, topics = self._offsets_for(session, body.group_id, body.topics)
        if found.version < 2 and code != ErrorCode.none:
            # v1 has no top-level error: each partition carries it
            topics = {t: dict.fromkeys(parts, Fetched(error=code)) for t, parts in topics.items()}
        return build(
            found.response,
            throttle_time=NO_DURATION,
            error_code=code,
            topics=self._fetched(
                m.OffsetFetchResponseTopic, m.OffsetFetchResponsePartition, topics
            ),
        )

    def _offsets_for(
        self, session: Any, group_id: str, asked: Iterable[Any] | None, member: Any = None
    ) -> tuple[ErrorCode, Committed]:
        """What OffsetFetch answers for one group: GROUP_AUTHORIZATION_FAILED without
        `describe` on the group (each asked partition carrying it, for v0-v1), UNKNOWN_MEMBER_ID
        or STALE_MEMBER_EPOCH for a KIP-848 member's fetch (v9's `member`: its member ID and
        epoch) that is not at its epoch, else the committed offsets the session may see."""
        refused = self.refusal(session, DESCRIBE, group_id)
        if refused is not None:
            return failed(refused, asked)
        member_id, epoch = getattr(member, "member_id", None), getattr(member, "member_epoch", -1)
        with self._cond:
            code = self.consumer.fetch_error(group_id, member_id, epoch)
        if code not in (None, ErrorCode.none):
            return failed(code, asked)
        return self._visible(session, *self._committed(group_id, asked), every=asked is None)

    def _committed(self, group_id: str, asked: Iterable[Any] | None) -> tuple[ErrorCode, Committed]:
        try:
            committed = self.offsets.group_offsets(group_id)
        except MQCoreError as e:
            return failed(storage_error(e), asked)
        out: Committed = {}
        if asked is None:
            for (topic, p), have in sorted(committed.items()):
                out.setdefault(topic, {})[p] = fetched(have)
            return ErrorCode.none, out
        for t in asked:
            parts = out.setdefault(t.name, {})
            for p in t.partition_indexes:
                parts[p] = fetched(committed.get((t.name, p)))
        return ErrorCode.none, out

    def _visible(
        self, session: Any, code: ErrorCode, topics: Committed, every: bool
    ) -> tuple[ErrorCode, Committed]:
        """The committed offsets of topics the session may describe. When the request asked
        for every topic (`every`) the others are left out, as Kafka filters them; when it
        named them, each of their partitions answers TOPIC_AUTHORIZATION_FAILED."""
        out = {}
        denied = Fetched(error=ErrorCode.topic_authorization_failed)
        for name, parts in topics.items():
            if self.topic_allowed(session, DESCRIBE, name):
                out[name] = parts
            elif not every:
                out[name] = dict.fromkeys(parts, denied)
        return code, out

    @staticmethod
    def _fetched(topic_cls: type, part_cls: type, topics: Committed) -> tuple[Any, ...]:
        return tuple(
            build(
                topic_cls,
                name=name,
                partitions=tuple(
                    build(
                        part_cls,
                        partition_index=p,
                        committed_offset=got.offset,
                        committed_leader_epoch=got.leader_epoch,
                        metadata=got.metadata,
                        error_code=got.error,
                    )
                    for p, got in parts.items()
                ),
            )
            for name, parts in topics.items()
        )

    def offset_delete(self, found: Api, body: Any, session: Any) -> Any:
        """Delete committed offsets of topics the group does not consume now (Kafka's rule:
        GROUP_SUBSCRIBED_TO_TOPIC for a topic an active member subscribes to)."""
        m = found.module
        code = ErrorCode.none
        subscribed: set[str] | None = set()
        committed: dict[tuple[str, int], OffsetAndMetadata] = {}
        refused = self.refusal(session, DELETE, body.group_id)  # Kafka's first check
        if refused is not None:
            return build(found.response, throttle_time=NO_DURATION, error_code=refused, topics=())
        try:
            committed = self.offsets.group_offsets(body.group_id)
        except MQCoreError as e:
            code = storage_error(e)
        if code == ErrorCode.none:
            code, subscribed = self._subscriptions(body.group_id, bool(committed))
        codes: dict[tuple[str, int], ErrorCode] = {}
        doomed: dict[tuple[str, int], OffsetAndMetadata | None] = {}
        if code == ErrorCode.none:
            for t in body.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition_index)
                    if not self.topic_allowed(session, READ, t.name):
                        codes[tp] = ErrorCode.topic_authorization_failed
                    elif subscribed is None or t.name in subscribed:
                        codes[tp] = ErrorCode.group_subscribed_to_topic
                    elif not self._partition_exists(*tp):
                        codes[tp] = ErrorCode.unknown_topic_or_partition
                    else:
                        codes[tp] = ErrorCode.none
                        if tp in committed:
                            doomed[tp] = None
        if doomed:
            try:
                self.offsets.commit(body.group_id, doomed)
            except MQCoreError as e:
                code = storage_error(e)
        topics = ()
        if code == ErrorCode.none:
            topics = tuple(
                build(
                    m.OffsetDeleteResponseTopic,
                    name=t.name,
                    partitions=tuple(
                        build(
                            m.OffsetDeleteResponsePartition,
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, p.partition_index)],
                        )
                        for p in t.partitions
                    ),
                )
                for t in body.topics
            )
        return build(found.response, throttle_time=NO_DURATION, error_code=code, topics=topics)

    def _subscriptions(self, group_id: str, committed: bool) -> tuple[ErrorCode, set[str] | None]:
        """(error, the topics the group's members subscribe to now; None: every topic, a
        member's subscription did not parse) for OffsetDelete: GROUP_ID_NOT_FOUND for a group
        with neither members nor offsets, NON_EMPTY_GROUP for an active group of another
        protocol type than "consumer"."""
        with self._cond:
            modern = self.consumer.group(group_id)
            if modern is not None and modern.members:
                return ErrorCode.none, modern.subscribed()
            group = self._groups.get(group_id)
            if group is not None:
                self._tick(group, self.clock())
            if (group is None or not group.members) and not committed:
                return ErrorCode.group_id_not_found, set()
            if group is None or group.state == EMPTY:
                return ErrorCode.none, set()
            if group.protocol_type != CONSUMER:
                return ErrorCode.non_empty_group, set()
            subscribed: set[str] = set()
            for member in group.members.values():
                names = subscription_topics(member.metadata(group.protocol_name))
                if names is None:
                    return ErrorCode.none, None  # unreadable: every topic counts as subscribed
                subscribed.update(names)
            return ErrorCode.none, subscribed

    # -- describing, listing, deleting groups ---------------------------------------------------

    def _known(self) -> dict[str, Listed]:
        """Every group as ListGroups shows it: those with members or a state here, of either
        protocol, and those that only have committed offsets (Empty, no protocol type, a
        classic group, as Kafka shows a group of standalone commits). An Empty group with no
        committed offsets is Dead: forgotten (Kafka's cleanup)."""
        committed = self._committed_groups()
        out = dict.fromkeys(sorted(committed), Listed(EMPTY, "", GROUP_TYPE))
        with self._cond:
            self._forget_dead(committed)
            for gid, group in self._groups.items():
                out[gid] = Listed(group.state, group.protocol_type or "", GROUP_TYPE)
            for cg in self.consumer.groups():
                out[cg.group_id] = Listed(cg.state, CONSUMER, CONSUMER_GROUP_TYPE)
        return out

    def _offsets_expired(self, expired: list[str]) -> None:
        """The store's expiry pass ended (Store.add_group_expiry_listener): the groups whose
        offsets it deleted, and every other Empty one without offsets, are Dead."""
        committed = self._committed_groups()
        with self._cond:
            self._forget_dead(committed)

    def _forget_dead(self, committed: set[str]) -> None:
        """Drop the groups left Empty (every member gone) that have no committed offsets:
        abandoned groups are not listed forever, nor kept in memory (held lock)."""
        now = self.clock()
        self._last_cleanup = now
        for gid, group in list(self._groups.items()):
            self._tick(group, now)
            if group.state == EMPTY and not group.members and not group.pending:
                if gid not in committed:
                    del self._groups[gid]
        self.consumer.forget_dead(committed)

    def _committed_groups(self) -> set[str]:
        """The groups with committed offsets (none when the store cannot keep offsets: a
        read-only store)."""
        try:
            return {g for g, _, _ in self.offsets.all_offsets()}
        except MQCoreError:
            return set()

    def describe_groups(self, found: Api, body: Any, session: Any) -> Any:
        """Each classic group: its state, protocol and members (their metadata and assignment
        once Stable); a group of standalone commits is Empty. A group that does not exist, or
        is a KIP-848 group (ConsumerGroupDescribe describes those, as in Kafka), is Dead, and
        from v6 GROUP_ID_NOT_FOUND (KIP-1043)."""
        with_offsets = self._committed_groups()
        ops = getattr(body, "include_authorized_operations", False)  # v3+
        with self._cond:
            described = tuple(
                self._described(found, gid, session, gid in with_offsets, ops)
                for gid in body.groups
            )
        return build(found.response, throttle_time=NO_DURATION, groups=described)

    def _described(
        self, found: Api, group_id: str, session: Any, committed: bool, ops: bool
    ) -> Any:
        m = found.module
        group = self._groups.get(group_id)
        if group is not None:
            self._tick(group, self.clock())
        code, message, state, ptype = ErrorCode.none, None, DEAD, ""
        refused = self.refusal(session, DESCRIBE, group_id)
        if refused is not None:  # as if it were not there
            code, message, group = refused, "may not describe it here", None
        elif self.consumer.group(group_id) is not None:
            message = f"Group {group_id} is not a classic group."
        elif group is not None or committed:
            state = group.state if group is not None else EMPTY
            ptype = (group.protocol_type if group is not None else None) or ""
        if state == DEAD and found.version >= 6 and not code:  # KIP-1043
            code, message = ErrorCode.group_id_not_found, message or f"Group {group_id} not found."
        stable = group is not None and group.state == STABLE
        return build(
            m.DescribedGroup, error_code=code, error_message=message, group_id=group_id,
            group_state=state, protocol_type=ptype,
            protocol_data=(group.protocol_name or "") if stable and group else "",
            members=self._described_members(m, group, stable) if group is not None else (),
            authorized_operations=self._operations(session, group_id, ops and not code),
        )  # fmt: skip

    def _operations(self, session: Any, group_id: str, asked: bool) -> int:
        """The principal's authorized operations on the group (Kafka's bit field), when asked
        and the group is described without an error (as Kafka answers)."""
        if not asked:
            return NOT_ASKED
        access = Access(None) if self.access is None else self.access(session)
        return access.kafka_operations(GROUP, group_id)

    @staticmethod
    def _described_members(m: Any, group: Group, stable: bool) -> tuple[Any, ...]:
        return tuple(
            build(
                m.DescribedGroupMember,
                member_id=mem.member_id,
                group_instance_id=mem.instance_id,
                client_id=mem.client_id,
                client_host=mem.client_host,
                member_metadata=mem.metadata(group.protocol_name) if stable else b"",
                member_assignment=mem.assignment if stable else b"",
            )
            for mem in group.members.values()
        )

    def list_groups(self, found: Api, body: Any, session: Any) -> Any:
        """Every group, filtered by state (v4+) and type (v5+, "classic" or "consumer"),
        case-insensitively."""
        states = {s.lower() for s in getattr(body, "states_filter", ())}
        types = {s.lower() for s in getattr(body, "types_filter", ())}
        listed = []
        for gid, group in self._known().items():
            if self.refusal(session, DESCRIBE, gid) is not None:  # Kafka lists only these
                continue
            if states and group.state.lower() not in states:
                continue
            if types and group.group_type not in types:
                continue
            listed.append(
                build(
                    found.module.ListedGroup,
                    group_id=gid,
                    protocol_type=group.protocol_type,
                    group_state=group.state,
                    group_type=group.group_type,
                )
            )
        return build(
            found.response,
            throttle_time=NO_DURATION,
            error_code=ErrorCode.none,
            groups=tuple(listed),
        )

    def delete_groups(self, found: Api, body: Any, session: Any) -> Any:
        """Delete groups without members: their committed offsets are tombstoned
        (Store.delete_group); NON_EMPTY_GROUP while members are in."""
        results = []
        known = self._known()
        for gid in body.groups_names:
            code = ErrorCode.none
            with self._cond:
                group = self._groups.get(gid)
                refused = self.refusal(session, DELETE, gid)
                if refused is not None:
                    code = refused
                elif gid not in known:
                    code = ErrorCode.group_id_not_found
                elif (group is not None and (group.members or group.pending)) or (
                    self.consumer.member_count(gid)
                ):
                    code = ErrorCode.non_empty_group
                else:
                    self._groups.pop(gid, None)
                    self.consumer.release(gid)
            if code == ErrorCode.none:
                code = self._delete_offsets(gid)
            results.append(build(found.module.DeletableGroupResult, group_id=gid, error_code=code))
        return build(found.response, throttle_time=NO_DURATION, results=tuple(results))

    def _delete_offsets(self, group_id: str) -> ErrorCode:
        try:
            validate_group(group_id)
        except InvalidGroupError:  # "" (Kafka log directories may hold it): tombstone directly
            try:
                self.offsets.delete_group(group_id)
            except MQCoreError as e:
                return storage_error(e)
            return ErrorCode.none
        try:
            self.store.delete_group(group_id)
        except GroupNotEmptyError:  # an in-process store.consumer() group has members
            return ErrorCode.non_empty_group
        except MQCoreError as e:
            return storage_error(e)
        return ErrorCode.none


def storage_error(e: MQCoreError) -> ErrorCode:
    """The code of a failed read or write of `__consumer_offsets`."""
    if isinstance(e, InvalidGroupError):
        return ErrorCode.invalid_group_id
    return ErrorCode.kafka_storage_error


def consumer_assignment(raw: bytes) -> dict[str, list[int]] | None:
    """A consumer group member's assignment, as the leader's SyncGroup gave it (Kafka's
    ConsumerProtocolAssignment: int16 version, then that version's body, read by kio), as
    {topic: partitions}; {} before the first assignment, None for bytes that are not one
    (a client's bytes: never trusted to parse)."""
    if not raw:
        return {}
    version = int.from_bytes(raw[:2], "big", signed=True) if len(raw) >= 2 else -1
    if version < 0:
        return None
    module = importlib.import_module(
        f"kio.schema.consumer_protocol_assignment.v{min(version, 3)}.data"
    )
    try:
        found, _ = entity_reader(module.ConsumerProtocolAssignment)(raw, 2)
    except Exception:  # noqa: BLE001 - any failure of kio's reader means "not an assignment"
        return None
    return {str(t.topic): sorted(int(p) for p in t.partitions) for t in found.assigned_partitions}


def make_member_id(prefix: str) -> str:
    """Kafka's form: the client ID (or group.instance.id), "-", a random UUID."""
    return f"{prefix}-{uuid.uuid4()}"


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a consumer's subscription (ConsumerProtocolSubscription, any version:
    int16 version, then an int32 count of int16-length strings); None if it does not parse."""
    try:
        pos = _I16.size
        (count,) = _I32.unpack_from(metadata, pos)
        pos += _I32.size
        if count < 0 or count > len(metadata):
            return None
        topics = []
        for _ in range(count):
            (n,) = _I16.unpack_from(metadata, pos)
            pos += _I16.size
            if n < 0 or pos + n > len(metadata):
                return None
            topics.append(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
