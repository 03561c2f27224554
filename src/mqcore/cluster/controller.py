"""The controller: one broker of the cluster, elected through ZooKeeper, places new topics'
replicas and moves leadership when brokers come and go (issue 33; docs/cluster.md).

Every broker runs a ClusterController; it acts only while it holds the controller's term
(`cluster.zk.ZkCoordinator.elect`), and every write it makes is fenced by that term, so a
controller that lost its term without knowing it changes nothing. Its work runs on one thread
from a queue of events, as Kafka's ControllerEventManager runs it: ZooKeeper's watches (the
live brokers, the controller znode) and requests (create a topic) only enqueue.

On becoming controller, and on every change of the live brokers, it walks every partition
(Kafka's controller targets the changed brokers' partitions; a full walk is simpler and costs
one ZooKeeper read per partition, which the cluster sizes of issue 33 afford):

- a partition whose leader is not alive gets the first live in-sync replica in assignment
  order as leader, with the leader epoch bumped (Kafka's offline-partition election). With no
  live in-sync replica it has no leader (-1) and keeps its last ISR, so that a returning member
  of it leads again; unclean election (off by default) takes any live replica instead;
- a partition whose leader lives loses its dead followers from the ISR (the leader epoch
  stays: only a leader change bumps it).

Each change is a compare-and-set; a lost one is read again and decided anew.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mqcore.cluster.assign import (
    NO_LEADER,
    assign_replicas,
    checked_assignment,
    elect_leader,
    placement_order,
)
from mqcore.cluster.zk import Controller, PartitionState, ZkCoordinator
from mqcore.errors import (
    CoordinatorError,
    InvalidConfigError,
    InvalidReplicaAssignmentError,
    StaleStateError,
    UnknownTopicError,
)

log = logging.getLogger("mqcore.cluster")

# a partition's compare-and-set lost this many times in a row: left for the next walk (each
# loss means another writer changed it, so the walk after the next event sees its state)
CAS_ATTEMPTS = 5
CREATE_TIMEOUT = 30.0  # seconds create_topic waits for the controller to initialise
POLL = 0.2  # how often the event loop looks at `stopping` while idle


class ClusterController:
    """This broker's controller: start() joins the election; `term` is the controller term
    it holds now (None when another broker is the controller)."""

    def __init__(
        self,
        coordinator: ZkCoordinator,
        node_id: int,
        *,
        unclean_leader_election: bool = False,
        rng: random.Random | None = None,
    ):
        self.coordinator = coordinator
        self.node_id = node_id
        self.unclean = unclean_leader_election
        self.rng = rng or random.Random()
        self.term: Controller | None = None
        self.live: set[int] = set()
        self._events: queue.Queue[Any] = queue.Queue()
        self._watched: set[str] = set()  # topics whose assignment this controller watches
        self._acks_watched: set[str] = set()  # topics marked for deletion, acks watched
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"mqcore-controller-{node_id}", daemon=True
        )

    # -- life -----------------------------------------------------------------------------

    def start(self) -> ClusterController:
        self._thread.start()
        self.coordinator.watch_brokers(lambda live: self._events.put(("brokers", live)))
        self.coordinator.watch_controller(lambda node: self._events.put(("controller", node)))
        self.coordinator.watch_topics(lambda topics: self._events.put(("topics", topics)))
        self.coordinator.watch_preferred_election(
            lambda partitions: self._events.put(("preferred", partitions))
        )
        self.coordinator.watch_deletions(lambda topics: self._events.put(("deletions", topics)))
        return self

    def stop(self) -> None:
        """Stop handling events (the term, if held, ends with the coordinator's session)."""
        self._stopping.set()
        self._events.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join()

    @property
    def is_controller(self) -> bool:
        return self.term is not None

    # -- requests -------------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
        *,
        timeout: float = CREATE_TIMEOUT,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> dict[int, PartitionState]:
        """create_topic (the module's function) through this broker's coordinator; its own
        controller, if it holds the term, is told at once rather than by the watch."""
        placement = write_topic(self.coordinator, topic, partitions, replication_factor,
                                config, rng=self.rng, assignment=assignment)  # fmt: skip
        self._events.put(("topics", {topic}))
        return await_states(self.coordinator, topic, placement, timeout)

    def add_partitions(
        self,
        topic: str,
        count: int,
        *,
        timeout: float = CREATE_TIMEOUT,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> dict[int, PartitionState]:
        """add_partitions (the module's function) through this broker's coordinator."""
        added = write_partitions(self.coordinator, topic, count, rng=self.rng,
                                 assignment=assignment)  # fmt: skip
        self._events.put(("topics", {topic}))
        return await_states(self.coordinator, topic, added, timeout)

    # -- the event loop -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                kind, value = self._events.get(timeout=POLL)
            except queue.Empty:
                continue
            try:
                self._handle(kind, value)
            except CoordinatorError as e:  # ZooKeeper away: the next event tries again
                log.warning("controller %d: %s", self.node_id, e)
            except Exception:  # one event's bug must not end the controller
                log.exception("controller %d: handling %s failed", self.node_id, kind)

    def _handle(self, kind: str, value: Any) -> None:
        if kind == "stop":
            return
        if kind == "controller":
            if value is None:
                self.term = self.coordinator.elect(self.node_id)
                if self.term is not None:
                    log.info("broker %d is the controller, epoch %d", self.node_id,
                             self.term.epoch)  # fmt: skip
                    self.live = set(self.coordinator.brokers())
                    self._walk()
                    pending = self.coordinator.pending_preferred_election()
                    if pending is not None:  # asked of an earlier controller, not done
                        self._elect_preferred(pending)
                    self._delete_topics(self.coordinator.pending_deletions())
            elif value != self.node_id:
                self.term = None
            return
        if kind == "brokers":
            self.live = set(value)
            if self.term is not None:
                self._walk()
            return
        if kind == "topics":
            if self.term is not None:
                self._init_topics(value)
            return
        if kind == "preferred" and self.term is not None:
            self._elect_preferred(value)
        if kind == "deletions":
            self._delete_topics(value)

    def _assignment_watch(self, topic: str) -> Callable[[dict[int, tuple[int, ...]] | None], None]:
        def changed(_assignment: dict[int, tuple[int, ...]] | None) -> None:
            self._events.put(("topics", {topic}))

        return changed

    def _init_topics(self, topics: set[str]) -> None:
        """New topics' partitions get their first state: the first live replica in
        assignment order leads at epoch 0 with the live replicas in sync (Kafka's
        onNewPartitionCreation); with none alive, no leader and every replica in the ISR,
        so that the first to come back leads."""
        assert self.term is not None
        for topic in sorted(topics):
            if topic not in self._watched:  # partitions added later come by this watch
                self._watched.add(topic)
                self.coordinator.watch_assignment(topic, self._assignment_watch(topic))
            try:
                assignment = self.coordinator.assignment(topic)
            except UnknownTopicError:
                continue
            states = {}
            for p, replicas in assignment.items():
                live = tuple(r for r in replicas if r in self.live)
                leader = live[0] if live else NO_LEADER
                states[p] = PartitionState(leader, 0, live or replicas, self.term.epoch)
            try:
                self.coordinator.init_partition_states(self.term, topic, states)
            except StaleStateError:
                self.term = None
                return
            except UnknownTopicError:
                continue

    # -- deleting topics --------------------------------------------------------------------

    def _acks_watch(self, topic: str) -> Callable[[], None]:
        def changed() -> None:
            self._events.put(("deletions", {topic}))

        return changed

    def _delete_topics(self, marked: set[str]) -> None:
        """Topics marked for deletion: once every broker holding one of a topic's replicas
        has deleted them (its ack), the topic's znodes go, as Kafka's controller deleted a
        topic once every replica had answered StopReplica. A broker that is down holds the
        deletion until it returns, so no broker keeps a deleted topic's records that a topic
        made again under the name would take for its own."""
        for topic in sorted(marked):
            if topic not in self._acks_watched:
                self._acks_watched.add(topic)
                self.coordinator.watch_deletion_acks(topic, self._acks_watch(topic))
        self._acks_watched &= marked | self.coordinator.pending_deletions()
        term = self.term
        if term is None:
            return
        for topic in sorted(marked):
            try:
                replicas = {b for r in self.coordinator.assignment(topic).values() for b in r}
            except UnknownTopicError:
                replicas = set()  # its znodes went already: only the mark is left
            if not replicas <= self.coordinator.deletion_acks(topic):
                continue
            if topic not in self.coordinator.pending_deletions():
                continue  # finished by an earlier event
            try:
                self.coordinator.finish_topic_deletion(term, topic)
            except StaleStateError:
                self.term = None
                return
            self._acks_watched.discard(
                topic
            )  # its watch ended with the mark: a new mark, a new one
            log.info("topic %r deleted", topic)

    # -- leadership -----------------------------------------------------------------------

    def _walk(self) -> None:
        """Every partition's leader and ISR brought in line with the live brokers (a topic
        written while no controller was there gets its first states)."""
        topics = self.coordinator.topics()
        self._init_topics(set(topics))
        for topic in topics:
            try:
                assignment = self.coordinator.assignment(topic)
            except UnknownTopicError:
                continue  # deleted meanwhile
            for partition, replicas in sorted(assignment.items()):
                if self.term is None:
                    return
                self._settle(topic, partition, replicas)

    def _settle(
        self, topic: str, partition: int, replicas: tuple[int, ...], *, preferred: bool = False
    ) -> None:
        for _ in range(CAS_ATTEMPTS):
            try:
                state = self.coordinator.partition_state(topic, partition)
            except UnknownTopicError:
                return
            wanted = self._decide(state, replicas, preferred=preferred)
            if wanted is None:
                return
            term = self.term
            if term is None:
                return
            try:
                self.coordinator.set_partition_state(
                    topic, partition, wanted, expected_version=state.version, term=term
                )
            except StaleStateError as e:
                if "controller epoch" in str(e):  # a newer controller: this term is over
                    self.term = None
                    return
                continue  # the partition changed meanwhile (a leader's ISR change): again
            if wanted.leader != state.leader:
                log.info("%s-%d: leader %d -> %d (epoch %d), ISR %s", topic, partition,
                         state.leader, wanted.leader, wanted.leader_epoch,
                         list(wanted.isr))  # fmt: skip
            return
        log.warning("%s-%d: gave up after %d lost updates; the next change retries", topic,
                    partition, CAS_ATTEMPTS)  # fmt: skip

    def _elect_preferred(self, partitions: list[tuple[str, int]]) -> None:
        """A requested preferred-leader election (Kafka's PreferredReplicaPartitionLeader-
        Election): each partition whose preferred replica (the first assigned) is alive, in
        sync and not leading gets it as leader at the next epoch; the others are left as they
        are. The request is deleted once every partition was looked at, whatever the
        outcome (`mqcore cluster elect-leaders` then reads who leads)."""
        assert self.term is not None
        for topic, partition in partitions:
            try:
                replicas = self.coordinator.assignment(topic).get(partition)
            except UnknownTopicError:
                continue
            if replicas:
                self._settle(topic, partition, replicas, preferred=True)
            if self.term is None:
                return  # the term ended: the next controller sees the request still there
        self.coordinator.finish_preferred_election()

    def _decide(
        self, state: PartitionState, replicas: tuple[int, ...], *, preferred: bool = False
    ) -> PartitionState | None:
        """The state the partition should have with the live brokers, or None if it has it."""
        assert self.term is not None
        live = self.live
        first = replicas[0]
        if preferred and state.leader != first and first in live and first in state.isr:
            return PartitionState(first, state.leader_epoch + 1, state.isr, self.term.epoch)
        if state.leader in live:
            isr = tuple(r for r in state.isr if r in live)
            if isr == state.isr:
                return None
            return PartitionState(state.leader, state.leader_epoch, isr, self.term.epoch)
        leader = elect_leader(replicas, state.isr, live, unclean=self.unclean)
        if leader == NO_LEADER:
            if state.leader == NO_LEADER:
                return None
            # offline: the ISR keeps its last members, so one of them leads when it returns
            return PartitionState(NO_LEADER, state.leader_epoch + 1, state.isr, self.term.epoch)
        isr = tuple(r for r in state.isr if r in live) if leader in state.isr else (leader,)
        return PartitionState(leader, state.leader_epoch + 1, isr, self.term.epoch)


# -- creating topics and partitions, from any broker or tool ---------------------------------


def write_topic(
    coordinator: ZkCoordinator,
    topic: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str] | None = None,
    *,
    rng: random.Random | None = None,
    assignment: Mapping[int, Sequence[int]] | None = None,
) -> dict[int, list[int]]:
    """Place a new topic's replicas on the live brokers (racks apart when given), or as
    `assignment` gives them (checked: assign.checked_assignment; `partitions` and
    `replication_factor` are then its own), and write it, as any broker did in Kafka's
    ZooKeeper era; the controller, watching the topics, gives each partition its first state
    (await_states waits for that). The placement. TopicExistsError, InvalidConfigError (a
    replication factor above the live brokers, racks on some brokers only)."""
    brokers = coordinator.brokers()
    if assignment is not None:
        placement = checked_assignment(assignment, brokers)
    else:
        placement = assign_replicas(
            {b: info.rack for b, info in brokers.items()}, partitions, replication_factor,
            rng=rng,
        )  # fmt: skip
    coordinator.write_topic(topic, placement, config)
    return placement


def write_partitions(
    coordinator: ZkCoordinator,
    topic: str,
    count: int,
    *,
    rng: random.Random | None = None,
    assignment: Sequence[Sequence[int]] | None = None,
) -> dict[int, list[int]]:
    """Grow a topic to `count` partitions, the new ones placed as Kafka's addPartitions places
    them (after the existing ones, starting where partition 0's preferred leader stands in the
    placement order) with the topic's replication factor, and written by compare-and-set; the
    new partitions' placement. InvalidConfigError for a count that does not grow the topic or
    a factor above the live brokers."""
    current = coordinator.assignment(topic)
    if count <= len(current):
        raise InvalidConfigError(
            f"topic {topic!r} has {len(current)} partitions: {count} does not add any"
        )
    brokers = {b: info.rack for b, info in coordinator.brokers().items()}
    if assignment is not None:  # one replica list per new partition (CreatePartitions')
        if len(assignment) != count - len(current):
            raise InvalidReplicaAssignmentError(
                f"{len(assignment)} replica lists for {count - len(current)} new partitions"
            )
        given = {len(current) + i: list(r) for i, r in enumerate(assignment)}
        added = checked_assignment(given, brokers, len(current), len(current[0]))
        coordinator.add_partitions(topic, added)
        return added
    order = placement_order(brokers)
    first = current[0][0] if current.get(0) else None
    start = order.index(first) if first in order else None
    added = assign_replicas(
        brokers, count - len(current), len(current[0]), start=start, shift=start,
        first_partition=len(current), rng=rng,
    )  # fmt: skip
    coordinator.add_partitions(topic, added)
    return added


def await_states(
    coordinator: ZkCoordinator, topic: str, partitions: Mapping[int, object], timeout: float
) -> dict[int, PartitionState]:
    """The first states of a topic's new `partitions` once the controller has written them;
    CoordinatorError after `timeout` s (the partitions are written: they get states once a
    controller acts)."""
    deadline = time.monotonic() + timeout
    states: dict[int, PartitionState] = {}
    pause = 0.005
    while True:
        for p in partitions:
            if p not in states:
                try:
                    states[p] = coordinator.partition_state(topic, p)
                except UnknownTopicError:
                    pass
        if len(states) == len(partitions):
            return states
        if time.monotonic() >= deadline:
            raise CoordinatorError(
                f"topic {topic!r} is written but no controller gave its partitions a state "
                f"within {timeout:g} s (the controller is {coordinator.controller()})"
            )
        time.sleep(pause)  # bounded by the deadline; ZooKeeper reads, backing off
        pause = min(pause * 2, 0.2)
