"""One broker's replicas in a cluster: which partitions it leads and follows, the followers'
fetching, the leaders' ISR upkeep, and the answers the request handlers need (issue 33;
docs/cluster.md "Replication"). Kafka's ReplicaManager and ReplicaFetcherManager, over the
partition states in ZooKeeper (cluster.zk) and the embedding API's ReplicaLog.

Transport-free, as cluster.replication is: a follower reaches its leader through a
`LeaderClient` made by the `connect` callable (the server layer's is Kafka's Fetch with
replica_id and OffsetForLeaderEpoch over the wire), so the same decisions run between
in-process brokers in tests.

Threads and locks:

- one event thread applies ZooKeeper's news in order: the topics, each partition's state (this
  broker becomes its leader, its follower, or neither), the live brokers, this node's session;
  and every `tick` it shrinks the ISR of the partitions it leads by their followers' lag;
- one fetcher thread per leader broker copies every partition this broker follows from it;
- the request threads call produce/fetch checks from the server;
- each replica has a lock: appends, follower fetches, truncation and a change of role take it,
  so a reply of a leader that is no longer followed is never applied, and a leader's append
  never races its own demotion.

The high watermark starts at the log start when the broker starts (nothing of an earlier run
is shown to consumers until the in-sync replicas confirm it again); a leader advances it as
its followers fetch, a follower takes min(leader's, own log end) from each fetch.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from mqcore.cluster.assign import INTERNAL_REPLICATION_FACTOR, NO_LEADER
from mqcore.cluster.controller import CAS_ATTEMPTS, ClusterController
from mqcore.cluster.replication import (
    REPLICA_LAG_TIME_MAX_MS,
    LeaderPartition,
    truncate_to_leader,
)
from mqcore.cluster.zk import BrokerInfo, PartitionState, ZkCoordinator
from mqcore.config import FIXED_AT_CREATION, TopicConfig, config_overrides, topic_setting
from mqcore.errors import (
    CoordinatorError,
    FencedLeaderEpochError,
    InvalidConfigError,
    InvalidTopicError,
    MQCoreError,
    NodeIdTakenError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    ReplicationError,
    StaleStateError,
    TopicExistsError,
    UnknownLeaderEpochError,
    UnknownTopicError,
)
from mqcore.log import AppendInfo, ReplicaLog
from mqcore.log.internal import is_internal, refuse_internal
from mqcore.store import Store

log = logging.getLogger("mqcore.cluster")
_T = TypeVar("_T")

FETCH_MAX_WAIT_MS = 500  # Kafka's replica.fetch.wait.max.ms
FETCH_MAX_BYTES = 10 * 1024 * 1024  # replica.fetch.response.max.bytes
# replica.fetch.max.bytes; Kafka's is 1 MiB, but pipelined acks=all produces (server.py)
# append several 1 MiB batches while a follower fetches
PARTITION_FETCH_BYTES = 8 * 1024 * 1024
BACKOFF = 0.2  # seconds between a failed fetch round and the next (replica.fetch.backoff.ms)
MAX_BACKOFF = 2.0
# a leader that does not lead yet (its state change is on its way from ZooKeeper) is asked
# again this soon: a failover waits on it
NOT_YET_WAIT = 0.02
TICK = 0.25  # how often the event thread looks at the ISR of the partitions it leads
CREATE_WAIT = 30.0  # seconds create_topic waits for the states to reach this broker


def now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(frozen=True, slots=True)
class FetchSpec:
    """One partition of a follower's fetch."""

    topic: str
    partition: int
    fetch_offset: int
    leader_epoch: int  # the follower's view of the current epoch: a leader at another refuses
    log_start_offset: int


@dataclass(slots=True)
class FetchReply:
    """The leader's answer for one partition: an error (ReplicationError,
    OffsetOutOfRangeError, another MQCoreError) or whole batches from the fetch offset."""

    error: MQCoreError | None
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""


class LeaderClient(Protocol):
    """A follower's connection to one leader broker."""

    def fetch(
        self, replica_id: int, partitions: Sequence[FetchSpec], max_wait_ms: int
    ) -> dict[tuple[str, int], FetchReply]: ...

    def end_offset_for_epoch(
        self, replica_id: int, topic: str, partition: int, epoch: int, current_epoch: int
    ) -> tuple[int, int]: ...

    def close(self) -> None: ...


Connect = Callable[[BrokerInfo], LeaderClient]


class _Moved(Exception):
    """A partition's state changed while its fetcher waited for the leader's answer."""


@dataclass(eq=False)
class _Replica:
    """This broker's replica of one partition and its role."""

    topic: str
    partition: int
    log: ReplicaLog
    lock: threading.RLock = field(default_factory=threading.RLock)
    state: PartitionState | None = None
    leader: LeaderPartition | None = None  # set while this broker leads it
    following: tuple[int, int] | None = None  # (leader, epoch) while this broker follows it
    truncated: bool = False  # a follower truncated for `following`, fetching now
    joining: bool = False  # an ISR expansion asked of the event thread, not yet written


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """What Metadata says of one partition."""

    replicas: tuple[int, ...]
    state: PartitionState | None


class ReplicaManager:
    """This broker's part in a cluster: registered with the coordinator, running its
    controller, leading and following its replicas. `store` is the broker's own store (every
    topic it holds a replica of exists in it with the cluster's partition count); `connect`
    opens a LeaderClient to another broker. `on_progress(topic, partition)` is called when a
    partition's high watermark moves or its leadership changes (the server wakes the requests
    waiting on it)."""

    def __init__(
        self,
        store: Store,
        coordinator: ZkCoordinator,
        info: BrokerInfo,
        connect: Connect,
        *,
        replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS,
        fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS,
        unclean_leader_election: bool = False,
        on_progress: Callable[[str, int], None] | None = None,
    ):
        if replica_lag_time_max_ms <= 0 or fetch_max_wait_ms < 0:
            raise InvalidConfigError("replica lag and fetch wait times must be positive")
        if fetch_max_wait_ms >= replica_lag_time_max_ms:
            raise InvalidConfigError(
                f"replica fetch wait {fetch_max_wait_ms} ms must be below the replica lag "
                f"time {replica_lag_time_max_ms} ms, or idle followers fall out of the ISR"
            )
        self.store = store
        self.coordinator = coordinator
        self.info = info
        self.node_id = info.node_id
        self.connect = connect
        self.lag_ms = replica_lag_time_max_ms
        self.fetch_wait_ms = fetch_max_wait_ms
        self.on_progress = on_progress or (lambda topic, partition: None)
        self.controller = ClusterController(
            coordinator, self.node_id, unclean_leader_election=unclean_leader_election
        )
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"mqcore-replicas-{self.node_id}",
                                        daemon=True)  # fmt: skip
        self._lock = threading.Lock()  # the caches below
        self._assignments: dict[str, dict[int, tuple[int, ...]]] = {}
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._brokers: dict[int, BrokerInfo] = {}
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._fetchers: dict[int, _Fetcher] = {}
        self._fenced = False  # the session expired: no replica acts until it is back
        self._deleting: set[str] = set()  # topics marked for deletion
        self._assignment_watched: set[str] = set()  # a watch outlives its topic's deletion
        self._state_watched: set[tuple[str, int]] = set()
        self._config_watched: set[str] = set()
        self._producer_ids: range = range(0)
        self._controller_id = -1
        self._producer_lock = threading.Lock()

    # -- life -----------------------------------------------------------------------------

    def start(self) -> ReplicaManager:
        """Register this broker, start its controller and follow the cluster's state."""
        self._register()
        self._brokers = self.coordinator.brokers()
        self._producer_ids = self.coordinator.allocate_producer_ids(self.node_id)  # in hand

        self._thread.start()
        self.coordinator.on_session(lambda alive: self._events.put(("session", alive)))
        self.coordinator.watch_brokers(lambda live: self._events.put(("brokers", live)))
        # marks first: a topic marked while this broker was away is deleted, not served
        self.coordinator.watch_deletions(lambda marked: self._events.put(("deletions", marked)))
        self.coordinator.watch_topics(lambda topics: self._events.put(("topics", topics)))
        self.coordinator.watch_controller(self._controller_changed)
        self.controller.start()
        return self

    def _register(self) -> None:
        """Register, waiting out a registration this node left behind: a broker restarted
        after a crash finds its old session's znode until ZooKeeper expires that session
        (Kafka's brokers wait the same way). Still taken after the session timeout (and its
        rounding to ZooKeeper's ticks): another live process holds the ID, NodeIdTakenError."""
        deadline = time.monotonic() + self.coordinator.session_timeout * 1.5 + 2
        while True:
            try:
                self.coordinator.register_broker(self.info)
                return
            except NodeIdTakenError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)  # bounded by the deadline

    def stop(self) -> None:
        """Stop following and leading (the coordinator's session, closed by its owner, ends
        the registration)."""
        self._stopping.set()
        self._events.put(("stop", None))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        self.controller.stop()
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
        for f in fetchers:
            f.stop()

    # -- what the request handlers ask ----------------------------------------------------

    def brokers(self) -> dict[int, BrokerInfo]:
        with self._lock:
            return dict(self._brokers)

    def controller_id(self) -> int:
        """The controller's node ID as last heard (-1: none now), without asking ZooKeeper:
        Metadata must not wait on it."""
        return self._controller_id

    def _controller_changed(self, node: int | None) -> None:
        self._controller_id = -1 if node is None else node

    def topics(self) -> list[str]:
        with self._lock:
            return sorted(self._assignments)

    def has_topic(self, topic: str) -> bool:
        with self._lock:
            return topic in self._assignments

    def partitions(self, topic: str) -> dict[int, PartitionMeta]:
        """Each partition's replicas and state as this broker last heard (UnknownTopicError
        for a topic it does not know)."""
        with self._lock:
            assignment = self._assignments.get(topic)
            if assignment is None:
                raise UnknownTopicError(topic)
            return {p: PartitionMeta(r, self._states.get((topic, p)))
                    for p, r in sorted(assignment.items())}  # fmt: skip

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
        *,
        timeout: float = CREATE_WAIT,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """Create a topic in the cluster (Kafka's config names in `config`, checked here
        first; `assignment`: each partition's replicas, the preferred leader first, instead
        of the controller's placement) and wait, bounded, until this broker knows every
        partition's state."""
        for name, value in (config or {}).items():
            topic_setting(name, value)  # InvalidConfigError for a name or value mqcore lacks
        self.check_creatable(topic)
        self.controller.create_topic(topic, partitions, replication_factor, config,
                                     timeout=timeout, assignment=assignment)  # fmt: skip
        self._events.put(("topics", {topic}))
        self._await_known(topic, partitions, timeout)

    def internal_leader(
        self, topic: str, config: Mapping[str, str], min_insync: int = 1
    ) -> BrokerInfo | None:
        """The live broker leading partition 0 of internal topic `topic` (a coordinator's:
        `__consumer_offsets`, `__share_group_state`), the topic made with one partition,
        min(INTERNAL_REPLICATION_FACTOR, live brokers) replicas and min.insync.replicas
        `min_insync` (at most the replicas) when nobody made it yet; None while it has no
        leader (or cannot be made now)."""
        if not self.has_topic(topic):
            factor = min(INTERNAL_REPLICATION_FACTOR, max(len(self.brokers()), 1))
            config = {**config, "min.insync.replicas": str(min(min_insync, factor))}
            try:
                self.create_topic(topic, 1, factor, config)
            except TopicExistsError:
                pass
            except MQCoreError:
                return None
        meta = self.partitions(topic).get(0)
        state = None if meta is None else meta.state
        if state is None or state.leader < 0:
            return None
        return self.brokers().get(state.leader)

    def refuse_marked(self, topic: str, action: str) -> None:
        """InvalidTopicError for a topic marked for deletion, as Kafka refuses changes to one
        (a replica added now would never acknowledge the deletion)."""
        if topic in self.coordinator.pending_deletions():
            raise InvalidTopicError(f"cannot {action} topic {topic!r}: it is marked for deletion")

    def check_creatable(self, topic: str) -> None:
        """TopicExistsError for a topic of the cluster, or one marked for deletion (made again
        only once every replica of the old one is deleted); checked first, as Kafka does."""
        if self.has_topic(topic):
            raise TopicExistsError(f"topic {topic!r} already exists")
        if topic in self._deleting and topic in self.coordinator.pending_deletions():
            raise TopicExistsError(f"topic {topic!r} is marked for deletion")

    def add_partitions(
        self,
        topic: str,
        count: int,
        *,
        timeout: float = CREATE_WAIT,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Grow a topic of the cluster to `count` partitions and wait, bounded, until this
        broker knows every new partition's state."""
        self.refuse_marked(topic, "add partitions to")
        self.controller.add_partitions(topic, count, timeout=timeout, assignment=assignment)
        self._await_known(topic, count, timeout)

    def _await_known(self, topic: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pause = 0.005
        while time.monotonic() < deadline:
            with self._lock:
                known = self._assignments.get(topic)
                if (
                    known is not None
                    and len(known) >= count
                    and all((topic, p) in self._states for p in known)
                ):
                    return
            time.sleep(pause)  # bounded by the deadline
            pause = min(pause * 2, 0.1)
        raise CoordinatorError(f"topic {topic!r} was changed but this broker did not learn its "
                               f"partitions' states within {timeout:g} s")  # fmt: skip

    def next_producer_id(self) -> int:
        """A producer ID unique in the cluster (from this broker's block, a new block from
        the coordinator when it is used up)."""
        with self._producer_lock:
            if not self._producer_ids:
                self._producer_ids = self.coordinator.allocate_producer_ids(self.node_id)
            pid = self._producer_ids[0]
            self._producer_ids = self._producer_ids[1:]
            return pid

    def leader_log(self, topic: str, partition: int, current_epoch: int = -1) -> ReplicaLog:
        """The log of a partition this broker leads, for a client's read: NotLeaderOrFollower
        otherwise; with `current_epoch` >= 0 (the client's view), FencedLeaderEpoch when it is
        older than the leader's, UnknownLeaderEpoch when newer."""
        r = self._leading(topic, partition, current_epoch)
        return r.log

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch this broker leads the partition at (NotLeaderOrFollower if not)."""
        r = self._leading(topic, partition, -1)
        leader = r.leader
        if leader is None:
            raise NotLeaderOrFollowerError(f"broker {self.node_id} does not lead "
                                           f"{topic}-{partition}")  # fmt: skip
        return leader.leader_epoch

    def append(
        self, topic: str, partition: int, records: Any, acks: int, transactional: bool = False
    ) -> AppendInfo:
        """A producer's batch appended as leader. acks=all (-1) first needs at least the
        topic's min.insync.replicas in sync (NotEnoughReplicas: nothing appended); then wait
        for `committed` before answering. `transactional`: the caller verified the producer's
        transaction (ReplicaLog.append_as_leader)."""

        def write(replica: ReplicaLog, leader: LeaderPartition) -> AppendInfo:
            if acks == -1:
                needed = replica.config.min_insync_replicas
                if not leader.enough_replicas(needed):
                    raise NotEnoughReplicasError(
                        f"{topic}-{partition} has {len(leader.isr)} in-sync replicas "
                        f"{sorted(leader.isr)}, min.insync.replicas is {needed}"
                    )
            return replica.append_as_leader(records, leader.leader_epoch,
                                            transactional=transactional)  # fmt: skip

        return self._append_leading(topic, partition, write)

    def append_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, commit: bool,
        coordinator_epoch: int,
    ) -> int:  # fmt: skip
        """A transaction coordinator's COMMIT or ABORT marker appended as leader (Kafka's
        WriteTxnMarkers); returns its offset, which the caller waits to see `committed`.
        NotLeaderOrFollower when this broker does not lead the partition."""

        def write(replica: ReplicaLog, leader: LeaderPartition) -> int:
            return replica.append_marker(producer_id, producer_epoch, commit, coordinator_epoch,
                                         leader_epoch=leader.leader_epoch)  # fmt: skip

        return self._append_leading(topic, partition, write)

    def _append_leading(
        self, topic: str, partition: int, write: Callable[[ReplicaLog, LeaderPartition], _T]
    ) -> _T:
        """`write(replica, leader)` under the partition's lock while this broker leads it
        (NotLeaderOrFollower otherwise), then the high watermark advanced (an ISR of one
        commits at once) and the waiters told."""
        r = self._leading(topic, partition, -1)
        with r.lock:
            leader = r.leader
            if leader is None or self._fenced:
                raise NotLeaderOrFollowerError(f"broker {self.node_id} does not lead "
                                               f"{topic}-{partition}")  # fmt: skip
            result = write(r.log, leader)
            before = r.log.high_watermark
            after = leader.advance_high_watermark()
        if after != before:
            self.on_progress(topic, partition)
        return result

    def open_transaction(self, topic: str, partition: int, producer_id: int, epoch: int) -> bool:
        """Whether the producer, at `epoch`, has a transaction open in this leader's log of
        the partition (a batch that continues it needs no verification: KIP-890)."""
        r = self._leading(topic, partition, -1)
        state = r.log.producer_state
        if state is None:
            return False
        with r.log.partition.locked():
            return (producer_id in state.open_transactions()
                    and state.known_epoch(producer_id) == epoch)  # fmt: skip

    def committed(self, topic: str, partition: int, last_offset: int) -> bool:
        """Whether an acks=all write ending at `last_offset` may be answered: True once the
        high watermark passed it with at least min.insync.replicas in sync, and
        NotEnoughReplicasAfterAppend if it passed with fewer (the ISR shrank under the write);
        NotLeaderOrFollower when this broker stopped leading (the write may or may not
        survive: the producer retries)."""
        r = self._leading(topic, partition, -1)
        with r.lock:
            leader = r.leader
            if leader is None:
                raise NotLeaderOrFollowerError(f"broker {self.node_id} no longer leads "
                                               f"{topic}-{partition}")  # fmt: skip
            if not leader.committed(last_offset):
                return False
            needed = r.log.config.min_insync_replicas
            if not leader.enough_replicas(needed):  # Kafka's DelayedProduce check
                raise NotEnoughReplicasAfterAppendError(
                    f"{topic}-{partition}: offset {last_offset} is committed by the in-sync "
                    f"replicas {sorted(leader.isr)}, fewer than min.insync.replicas {needed}"
                )
            return True

    def await_committed(
        self, topic: str, partition: int, last: int, deadline: float, why: str = ""
    ) -> None:
        """Return once `last` is `committed`, ReplicationError at `deadline` (monotonic
        seconds; `why` ends its message); NotLeaderOrFollower (and
        NotEnoughReplicasAfterAppend) as `committed` raises them. Polls: the followers'
        fetches move the high watermark meanwhile."""
        pause = 0.001
        while not self.committed(topic, partition, last):
            if time.monotonic() >= deadline:
                raise ReplicationError(
                    f"the in-sync replicas of {topic}-{partition} did not take offset {last} "
                    f"in time{why}"
                )
            time.sleep(pause)  # bounded by the deadline
            pause = min(pause * 2, 0.02)

    def follower_fetch(
        self,
        replica_id: int,
        topic: str,
        partition: int,
        fetch_offset: int,
        current_epoch: int,
        log_start_offset: int = -1,
    ) -> ReplicaLog:
        """A follower's fetch reached this leader: everything before `fetch_offset` is on its
        log. Advances the high watermark, asks for the follower's return to the ISR when it
        caught up; returns the log to read from (to its end)."""
        r = self._leading(topic, partition, current_epoch)
        moved = False
        with r.lock:
            leader = r.leader
            if leader is None:
                raise NotLeaderOrFollowerError(f"broker {self.node_id} does not lead "
                                               f"{topic}-{partition}")  # fmt: skip
            if replica_id not in leader.followers:
                raise NotLeaderOrFollowerError(
                    f"broker {replica_id} is not a replica of {topic}-{partition}"
                )
            if not r.log.log_start_offset <= fetch_offset <= r.log.log_end_offset:
                # a follower cannot hold what the leader does not: refused before it counts
                # towards the high watermark (Kafka answers OFFSET_OUT_OF_RANGE too)
                raise OffsetOutOfRangeError(
                    f"{topic}-{partition}: fetch offset {fetch_offset} outside the leader's "
                    f"log [{r.log.log_start_offset}, {r.log.log_end_offset}]"
                )
            before = r.log.high_watermark
            got = leader.follower_fetched(replica_id, fetch_offset, now_ms(), log_start_offset)
            moved = got != before
            if not r.joining and replica_id not in leader.isr and replica_id in leader.may_join():
                r.joining = True
                self._events.put(("expand", (topic, partition)))
        if moved:
            self.on_progress(topic, partition)
        return r.log

    def delete_records(
        self, topic: str, partition: int, offset: int, *, timeout: float = CREATE_WAIT
    ) -> int:
        """Kafka's DeleteRecords on a partition this broker leads: move its log start to
        `offset` (-1: the high watermark), then wait, bounded, until every in-sync replica's
        log start is there too (they follow on their fetches), as Kafka's DelayedDeleteRecords
        does, so a failover cannot bring the records back. The low watermark;
        CoordinatorError (REQUEST_TIMED_OUT) when the replicas were not there in time."""
        r = self._leading(topic, partition, -1)
        with r.lock:
            target = r.log.high_watermark if offset == -1 else offset
            start = r.log.delete_records_before(target)
        self.on_progress(topic, partition)
        deadline = time.monotonic() + min(timeout, CREATE_WAIT)
        pause = 0.01
        while True:
            with r.lock:
                leader = r.leader
                if leader is None:
                    raise NotLeaderOrFollowerError(
                        f"broker {self.node_id} no longer leads {topic}-{partition}"
                    )
                low = leader.low_watermark()
            if low >= start:
                return low
            if time.monotonic() >= deadline:
                raise CoordinatorError(
                    f"{topic}-{partition}: the log start moved to {start} on the leader, but "
                    f"the in-sync replicas' low watermark is {low} after {timeout:g} s"
                )
            time.sleep(pause)  # bounded by the deadline
            pause = min(pause * 2, 0.2)

    def end_offset_for_epoch(
        self, topic: str, partition: int, epoch: int, current_epoch: int
    ) -> tuple[int, int]:
        """OffsetForLeaderEpoch, answered by the leader only (fenced as `leader_log`)."""
        r = self._leading(topic, partition, current_epoch)
        return r.log.end_offset_for_epoch(epoch)

    def _leading(self, topic: str, partition: int, current_epoch: int) -> _Replica:
        r = self._replicas.get((topic, partition))
        leader = r.leader if r is not None else None
        if r is None or leader is None or self._fenced:
            if not self.has_topic(topic):
                raise UnknownTopicError(f"{topic}-{partition}")
            raise NotLeaderOrFollowerError(
                f"broker {self.node_id} is not the leader of {topic}-{partition}"
            )
        if current_epoch >= 0:
            if current_epoch < leader.leader_epoch:
                raise FencedLeaderEpochError(
                    f"{topic}-{partition}: epoch {current_epoch} is older than the leader's "
                    f"{leader.leader_epoch}"
                )
            if current_epoch > leader.leader_epoch:
                raise UnknownLeaderEpochError(
                    f"{topic}-{partition}: epoch {current_epoch} is newer than this broker's "
                    f"{leader.leader_epoch}"
                )
        return r

    # -- the event thread -----------------------------------------------------------------

    def _run(self) -> None:
        next_tick = time.monotonic() + TICK
        while not self._stopping.is_set():
            try:
                kind, value = self._events.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                kind, value = "tick", None
            try:
                self._handle(kind, value)
            except CoordinatorError as e:
                log.warning("broker %d: %s", self.node_id, e)
            except Exception:  # one event's failure must not end the broker's replication
                log.exception("broker %d: handling %s failed", self.node_id, kind)
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK
                try:
                    self._shrink_isr()
                except CoordinatorError as e:
                    log.warning("broker %d: %s", self.node_id, e)
                except Exception:
                    log.exception("broker %d: ISR upkeep failed", self.node_id)

    def _handle(self, kind: str, value: Any) -> None:
        if kind == "topics":
            self._topics(value)
        elif kind == "state":
            topic, partition, state = value
            self._state(topic, partition, state)
        elif kind == "brokers":
            brokers = self.coordinator.brokers()
            with self._lock:
                self._brokers = brokers
        elif kind == "assignment":
            self._assignment(*value)
        elif kind == "expand":
            self._expand_isr(*value)
        elif kind == "session":
            self._session(value)
        elif kind == "deletions":  # None: read the marks now (a request made one)
            self._deletions(self.coordinator.pending_deletions() if value is None else value)
        elif kind == "config":
            self._apply_config(*value)

    def _topics(self, names: set[str]) -> None:
        """Topics new to this broker: cache their assignment, make the local topic when it
        holds a replica, and watch every partition's state (Metadata names every leader)."""
        for topic in sorted(names - self._deleting):
            with self._lock:
                if topic in self._assignments:
                    continue
            try:
                assignment = self.coordinator.assignment(topic)
            except UnknownTopicError:
                continue
            self._assignment(topic, assignment)
            if topic not in self._assignment_watched:
                self._assignment_watched.add(topic)
                self.coordinator.watch_assignment(topic, self._assignment_watch(topic))

    def _assignment(self, topic: str, assignment: dict[int, tuple[int, ...]] | None) -> None:
        """A topic's assignment, first heard or grown (partitions added): the new partitions
        this broker holds exist in its store (the local topic grown to the cluster's count),
        and every new partition's state is watched."""
        if assignment is None or topic in self._deleting:
            self._forget(topic)  # deleted (its replicas went with the mark: _deletions)
            return
        with self._lock:
            known = self._assignments.get(topic, {})
        new = sorted(p for p in assignment if p not in known)
        if not new:
            return
        if any(self.node_id in assignment[p] for p in new):
            self._local_topic(topic, len(assignment), self.coordinator.topic_config(topic))
            if topic not in self._config_watched:  # its configs, as they change
                self._config_watched.add(topic)
                self.coordinator.watch_topic_config(topic, self._config_watch(topic))
            for p in new:
                if self.node_id in assignment[p]:
                    log_ = self.store.log.replica(topic, p)
                    log_.update_high_watermark(log_.log_start_offset)
                    log_.follow()  # until its state names this broker leader
                    self._replicas[(topic, p)] = _Replica(topic, p, log_)
        with self._lock:
            self._assignments[topic] = dict(assignment)
        for p in new:
            if (topic, p) not in self._state_watched:
                self._state_watched.add((topic, p))
                self.coordinator.watch_partition_state(topic, p, self._state_watch(topic, p))

    def _deletions(self, marked: set[str]) -> None:
        """Topics marked for deletion: this broker stops serving them, deletes its replicas
        (durably: Store.delete_topic) and acknowledges, so the controller can delete the
        topic's znodes once every replica's broker has. Done again for a mark found at start
        (the broker was down while the topic was deleted)."""
        self._deleting = set(marked)
        for topic in sorted(marked):
            try:
                assignment = self.coordinator.assignment(topic)
            except UnknownTopicError:
                assignment = {}
            self._forget(topic)
            if self.store.log.has_topic(topic):
                self.store.log.delete_topic(topic)
                log.info("broker %d deleted its replicas of %r", self.node_id, topic)
            if any(self.node_id in replicas for replicas in assignment.values()):
                self.coordinator.ack_topic_deletion(topic, self.node_id)

    def _forget(self, topic: str) -> None:
        """Stop leading and following `topic`'s partitions and drop what is known of it."""
        for key in [k for k in self._replicas if k[0] == topic]:
            r = self._replicas.pop(key)
            with r.lock:
                r.log.follow()
                r.leader = None
                self._unfollow(r)
            self.on_progress(*key)  # waiting requests see it gone
        with self._lock:
            self._assignments.pop(topic, None)
            for key in [k for k in self._states if k[0] == topic]:
                del self._states[key]

    def delete_topic(self, topic: str, *, timeout: float = CREATE_WAIT) -> None:
        """Delete a topic of the cluster (DeleteTopics): mark it, then wait, bounded, until
        every broker holding a replica deleted it and the controller deleted its znodes.
        CoordinatorError when that takes longer (the deletion goes on: a broker that is down
        holds it until it returns, as in Kafka); UnknownTopicError for a topic of none."""
        self.mark_for_deletion(topic)
        if self.await_deleted([topic], timeout):
            raise CoordinatorError(
                f"topic {topic!r} is marked for deletion, but not every broker holding one of "
                f"its replicas deleted them within {timeout:g} s (one that is down holds the "
                "deletion until it returns)"
            )

    def mark_for_deletion(self, topic: str) -> None:
        """Mark a topic of the cluster for deletion (UnknownTopicError for none); this
        broker's own replicas go at once (the marks are read again on its event thread)."""
        self.coordinator.request_topic_deletion(topic)
        self._events.put(("deletions", None))

    def await_deleted(self, topics: Sequence[str], timeout: float) -> list[str]:
        """Wait, at most `timeout` seconds (and CREATE_WAIT), until the topics are gone from
        the cluster; those still there."""
        deadline = time.monotonic() + min(timeout, CREATE_WAIT)
        pause = 0.01
        while True:
            present = set(self.coordinator.topics())
            left = [t for t in topics if t in present]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(pause)  # bounded by the deadline
            pause = min(pause * 2, 0.2)

    def update_topic_config(
        self,
        topic: str,
        changes_of: Callable[[TopicConfig], dict[str, Any]],
        *,
        validate_only: bool = False,
    ) -> TopicConfig:
        """Change a topic's configs in the cluster (AlterConfigs, IncrementalAlterConfigs):
        `changes_of(current settings)` checked as on a node of one, then the overrides
        written by compare-and-set (read again and retried when another change came first).
        Every broker holding a replica applies them when it hears of the change."""
        refuse_internal(topic, "alter")
        self.refuse_marked(topic, "change the configs of")
        base = self.store.log.topic_defaults
        for _ in range(CAS_ATTEMPTS):
            overrides, version = self.coordinator.versioned_topic_config(topic)
            current = base.with_changes(**dict(topic_setting(k, v) for k, v in overrides.items()))
            changes = changes_of(current)
            current.changes_allowed(changes)
            wanted = current.with_changes(**changes)
            if validate_only:
                return wanted
            try:
                self.coordinator.set_topic_config(
                    topic, config_overrides(wanted, base), expected_version=version
                )
            except StaleStateError:
                continue
            return wanted
        raise CoordinatorError(f"the configs of {topic!r} kept changing: try again")

    def topic_config(self, topic: str) -> TopicConfig:
        """A topic's settings as the cluster has them (this store's defaults and the topic's
        overrides in the coordinator), on any broker, holding a replica or not."""
        overrides = self.coordinator.topic_config(topic)
        settings = dict(topic_setting(k, v) for k, v in overrides.items())
        return self.store.log.topic_defaults.with_changes(**settings)

    def _config_watch(self, topic: str) -> Callable[[dict[str, str] | None], None]:
        def changed(overrides: dict[str, str] | None) -> None:
            if overrides is not None:
                self._events.put(("config", (topic, overrides)))

        return changed

    def _apply_config(self, topic: str, overrides: dict[str, str]) -> None:
        """A topic's configs as the cluster has them now, applied to this broker's replicas
        (the settings fixed at creation stay as they are)."""
        log_ = self.store.log
        if not log_.has_topic(topic) or topic in self._deleting:
            return
        settings = dict(topic_setting(k, v) for k, v in overrides.items())
        wanted = log_.topic_defaults.with_changes(**settings)

        def changes_of(current: TopicConfig) -> dict[str, Any]:
            return {
                f.name: getattr(wanted, f.name)
                for f in dataclasses.fields(TopicConfig)
                if f.name != "partitions" and f.name not in FIXED_AT_CREATION
                and getattr(current, f.name) != getattr(wanted, f.name)
            }  # fmt: skip

        log_.update_topic_config(topic, changes_of)

    def _assignment_watch(self, topic: str) -> Callable[[dict[int, tuple[int, ...]] | None], None]:
        def changed(assignment: dict[int, tuple[int, ...]] | None) -> None:
            self._events.put(("assignment", (topic, assignment)))

        return changed

    def _state_watch(self, topic: str, partition: int) -> Callable[[PartitionState | None], None]:
        def changed(state: PartitionState | None) -> None:
            self._events.put(("state", (topic, partition, state)))

        return changed

    def _local_topic(self, topic: str, partitions: int, config: Mapping[str, str]) -> None:
        """The topic in this broker's store, with the cluster's partition count and configs."""
        log_ = self.store.log
        if log_.has_topic(topic):
            have = len(log_.partitions_of(topic))
            if have < partitions:  # partitions added in the cluster
                log_.add_partitions(topic, partitions)
            elif have > partitions:
                raise CoordinatorError(
                    f"topic {topic!r} has {have} partitions in this broker's store but "
                    f"{partitions} in the cluster: this store belongs to another cluster"
                )
            return
        settings = dict(topic_setting(k, v) for k, v in config.items())
        log_.create_topic(topic, partitions, **settings)

    def _state(self, topic: str, partition: int, state: PartitionState | None) -> None:
        with self._lock:
            if state is None:
                self._states.pop((topic, partition), None)
            else:
                self._states[(topic, partition)] = state
        r = self._replicas.get((topic, partition))
        if r is None or state is None or self._fenced:
            return
        self._become(r, state)

    def _become(self, r: _Replica, state: PartitionState) -> None:
        """Take the role the partition's state gives this broker."""
        with self._lock:
            replicas = self._assignments[r.topic][r.partition]
        changed = False
        with r.lock:
            r.state = state
            if state.leader == self.node_id:
                if r.leader is None or r.leader.leader_epoch != state.leader_epoch:
                    self._unfollow(r)
                    r.leader = LeaderPartition(
                        r.log, self.node_id, state.leader_epoch, replicas, state.isr, now_ms(),
                        replica_lag_time_max_ms=self.lag_ms,
                    )  # fmt: skip
                    r.leader.advance_high_watermark()
                    log.info("broker %d leads %s-%d at epoch %d, ISR %s", self.node_id, r.topic,
                             r.partition, state.leader_epoch, list(state.isr))  # fmt: skip
                    changed = True
                elif set(state.isr) != r.leader.isr and self.node_id in state.isr:
                    r.leader.set_isr(state.isr)
                    changed = True
            else:
                r.log.follow()  # another broker's appends only, by replication
                if r.leader is not None:
                    r.leader = None
                    changed = True
                if state.leader == NO_LEADER:
                    self._unfollow(r)
                elif r.following != (state.leader, state.leader_epoch):
                    self._follow(r, state.leader, state.leader_epoch)
        if changed:
            self.on_progress(r.topic, r.partition)

    def _follow(self, r: _Replica, leader: int, epoch: int) -> None:
        """Follow `leader` at `epoch` (r.lock held): truncate first, then fetch."""
        self._unfollow(r)
        r.following = (leader, epoch)
        r.truncated = False
        with self._lock:
            fetcher = self._fetchers.get(leader)
            if fetcher is None:
                fetcher = self._fetchers[leader] = _Fetcher(self, leader)
                fetcher.start()
        fetcher.add(r)
        log.info("broker %d follows broker %d for %s-%d at epoch %d", self.node_id, leader,
                 r.topic, r.partition, epoch)  # fmt: skip

    def _unfollow(self, r: _Replica) -> None:
        if r.following is None:
            return
        with self._lock:
            fetcher = self._fetchers.get(r.following[0])
        if fetcher is not None:
            fetcher.remove(r)
        r.following = None

    def _expand_isr(self, topic: str, partition: int) -> None:
        """Followers that caught up rejoin the ISR (a compare-and-set of the state without
        the controller's term, as Kafka's leaders wrote it in the ZooKeeper era)."""
        r = self._replicas.get((topic, partition))
        if r is None:
            return
        with r.lock:
            r.joining = False
            leader, state = r.leader, r.state
            if leader is None or state is None:
                return
            joining = leader.may_join()
        if joining:
            self._write_isr(r, state, tuple(state.isr) + tuple(sorted(joining)))

    def _shrink_isr(self) -> None:
        """Followers that have not caught up for the lag time leave the ISR."""
        for r in list(self._replicas.values()):
            with r.lock:
                leader, state = r.leader, r.state
                if leader is None or state is None or self._fenced:
                    continue
                lagging = leader.lagging(now_ms())
            if lagging:
                log.info("%s-%d: followers %s lag more than %d ms: leaving the ISR", r.topic,
                         r.partition, sorted(lagging), self.lag_ms)  # fmt: skip
                self._write_isr(r, state, tuple(b for b in state.isr if b not in lagging))

    def _write_isr(self, r: _Replica, state: PartitionState, isr: tuple[int, ...]) -> None:
        new = PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)
        try:
            written = self.coordinator.set_partition_state(
                r.topic, r.partition, new, expected_version=state.version
            )
        except StaleStateError:
            return  # the state changed (the controller moved it): its watch brings the new one
        except UnknownTopicError:
            return
        self._state(r.topic, r.partition, written)

    def _session(self, alive: bool) -> None:
        """ZooKeeper expired this broker's session: its registration is gone and the
        controller may already have moved its partitions, so it stops leading and following
        until a new session registers it again and the states are read anew."""
        if not alive:
            log.warning("broker %d: ZooKeeper session expired; stepping down", self.node_id)
            self._fenced = True
            for r in list(self._replicas.values()):
                with r.lock:
                    r.log.follow()
                    r.leader = None
                    self._unfollow(r)
                self.on_progress(r.topic, r.partition)
            return
        self._register()
        self._fenced = False
        for r in list(self._replicas.values()):
            try:
                state = self.coordinator.partition_state(r.topic, r.partition)
            except UnknownTopicError:
                continue
            self._state(r.topic, r.partition, state)
        log.info("broker %d: registered again after its session expired", self.node_id)

    # -- follower side, called by the fetchers --------------------------------------------

    def _broker(self, node_id: int) -> BrokerInfo | None:
        with self._lock:
            found = self._brokers.get(node_id)
        if found is None:
            found = self.coordinator.brokers().get(node_id)
            if found is not None:
                with self._lock:
                    self._brokers[node_id] = found
        return found


class _Fetcher:
    """Copies the partitions this broker follows from one leader broker: each truncates by
    leader epochs first (cluster.replication.truncate_to_leader), then every round fetches
    all of them in one Fetch, waiting up to fetch_max_wait_ms at the leader for new data."""

    def __init__(self, manager: ReplicaManager, leader: int):
        self.manager = manager
        self.leader = leader
        self._partitions: dict[tuple[str, int], _Replica] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._client: LeaderClient | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"mqcore-fetcher-{manager.node_id}-from-{leader}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def add(self, r: _Replica) -> None:
        with self._cond:
            self._partitions[(r.topic, r.partition)] = r
            self._cond.notify_all()

    def remove(self, r: _Replica) -> None:
        with self._cond:
            self._partitions.pop((r.topic, r.partition), None)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)
        self._drop_client()

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken connection: nothing to do
                pass

    def _run(self) -> None:
        backoff = BACKOFF
        while True:
            with self._cond:
                while not self._partitions and not self._stopped:
                    self._cond.wait(1.0)
                if self._stopped:
                    return
                partitions = list(self._partitions.values())
            try:
                self._round(partitions)
                backoff = BACKOFF
            except Exception as e:  # the leader is away or broken: reconnect after a pause
                if isinstance(e, MQCoreError | OSError):
                    log.info("broker %d fetching from %d: %s", self.manager.node_id,
                             self.leader, e)  # fmt: skip
                else:
                    log.exception("broker %d fetching from %d", self.manager.node_id, self.leader)
                self._drop_client()
                with self._cond:
                    if not self._stopped:
                        self._cond.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _connect(self) -> LeaderClient:
        if self._client is None:
            info = self.manager._broker(self.leader)  # noqa: SLF001 - its own manager
            if info is None:
                raise NotLeaderOrFollowerError(f"broker {self.leader} is not registered")
            self._client = self.manager.connect(info)
        return self._client

    def _round(self, partitions: list[_Replica]) -> None:
        client = self._connect()
        me = self.manager.node_id
        specs: list[FetchSpec] = []
        for r in partitions:
            with r.lock:
                if r.following is None or r.following[0] != self.leader:
                    continue
                epoch = r.following[1]
                if not r.truncated:
                    following = r.following

                    def ask(e: int, r: _Replica = r, epoch: int = epoch,
                            following: tuple[int, int] = following) -> tuple[int, int]:  # fmt: skip
                        # the leader's answer is awaited without the partition's lock (state
                        # changes take it); what it answers holds only if nothing moved
                        r.lock.release()
                        try:
                            return client.end_offset_for_epoch(me, r.topic, r.partition, e, epoch)
                        finally:
                            r.lock.acquire()
                            if r.following != following:
                                raise _Moved  # noqa: B012 - the answer is for a state now gone

                    try:
                        truncate_to_leader(r.log, ask)
                    except (ReplicationError, _Moved):
                        continue  # the leader has not taken its epoch yet, or the state moved
                    if r.following != following:
                        continue
                    r.truncated = True
                specs.append(FetchSpec(r.topic, r.partition, r.log.log_end_offset, epoch,
                                       r.log.log_start_offset))  # fmt: skip
        if not specs:
            with self._cond:
                self._cond.wait(NOT_YET_WAIT)  # each waits for the leader to know its epoch
            return
        replies = client.fetch(me, specs, self.manager.fetch_wait_ms)
        waiting = False
        for spec in specs:
            reply = replies.get((spec.topic, spec.partition))
            found = self.manager._replicas.get((spec.topic, spec.partition))  # noqa: SLF001
            if reply is not None and found is not None:
                waiting |= self._apply(found, spec, reply)
        if waiting:
            with self._cond:
                self._cond.wait(NOT_YET_WAIT)

    @staticmethod
    def _follow_log_start(r: _Replica, leader_start: int) -> None:
        """The leader's log start moved up (DeleteRecords, its retention): this replica's
        follows, as far as its own high watermark (Kafka's follower does the same). Internal
        topics keep their own: retention runs on each of their replicas (mqcore's state)."""
        start = min(leader_start, r.log.high_watermark)
        if start > r.log.log_start_offset and not is_internal(r.topic):
            r.log.delete_records_before(start)

    def _apply(self, r: _Replica, spec: FetchSpec, reply: FetchReply) -> bool:
        """One partition's reply applied if it still answers what this broker follows;
        True when the partition must wait before fetching again."""
        moved = False
        with r.lock:
            if r.following != (self.leader, spec.leader_epoch) or not r.truncated:
                return False
            if r.log.log_end_offset != spec.fetch_offset:
                return False  # truncated meanwhile: the next round fetches from the new end
            error = reply.error
            if error is None:
                if reply.records:
                    r.log.append_as_follower(reply.records)
                before = r.log.high_watermark
                r.log.update_high_watermark(min(reply.high_watermark, r.log.log_end_offset))
                moved = r.log.high_watermark != before
                self._follow_log_start(r, reply.log_start_offset)
            elif isinstance(error, OffsetOutOfRangeError):
                if reply.log_start_offset > r.log.log_end_offset:
                    # the leader deleted what this follower lacks: start where it starts
                    r.log.truncate_fully_and_start_at(reply.log_start_offset)
                else:
                    r.truncated = False  # truncate by epochs again
            elif isinstance(error, ReplicationError):
                return True  # not the leader yet or any more: the state's watch decides
            else:
                raise error
        if moved:
            self.manager.on_progress(r.topic, r.partition)
        return False
