"""The controller (mqcore.cluster.controller) over a real ZooKeeper: one broker of several
holds the term, places topics, and moves leadership when brokers die and return. Each broker
here is a ZooKeeper session of its own with its registration and its ClusterController, in this
process; a broker dies when its session ends (ZooKeeper drops its ephemeral znodes at once, as
after a crashed broker's session timeout)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from clusterprocs import until
from zkserver import ZooKeeper

pytest.importorskip("kazoo", reason="the server extra (kazoo) is missing")

from clusternodes import Node  # noqa: E402

from mqcore.cluster.assign import NO_LEADER  # noqa: E402
from mqcore.cluster.zk import PartitionState  # noqa: E402
from mqcore.errors import InvalidConfigError, TopicExistsError  # noqa: E402

WAIT = 30.0


@pytest.fixture
def cluster(zk: ZooKeeper) -> Iterator[dict[int, Node]]:
    nodes = {n: Node(zk, n) for n in (1, 2, 3)}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


def the_controller(nodes: dict[int, Node]) -> Node:
    def one() -> Node | None:
        holding = [n for n in nodes.values() if n.alive and n.controller.is_controller]
        return holding[0] if len(holding) == 1 else None

    found = until(one, "one broker to hold the controller's term")
    assert isinstance(found, Node)
    return found


def states(node: Node, topic: str) -> dict[int, PartitionState]:
    c = node.coordinator
    return {p: c.partition_state(topic, p) for p in c.assignment(topic)}


def test_one_broker_controls_and_places_a_topic_over_the_live_brokers(
    cluster: dict[int, Node],
) -> None:
    """One of three holds the term. A broker that is not the controller writes a topic (as
    Kafka's brokers did in the ZooKeeper era) and the controller gives its partitions their
    states: six partitions of three replicas land on all three brokers, each leading two,
    every replica in sync at leader epoch 0."""
    controller = the_controller(cluster)
    other = next(n for n in cluster.values() if n is not controller)
    created = other.controller.create_topic("t", 6, 3, {"retention.ms": "5"})
    assert not other.controller.is_controller
    assignment = controller.coordinator.assignment("t")
    assert sorted(assignment) == list(range(6))
    for p, replicas in assignment.items():
        assert sorted(replicas) == [1, 2, 3]
        assert created[p] == PartitionState(replicas[0], 0, replicas,
                                            controller.controller.term.epoch, 0)  # type: ignore[union-attr]  # fmt: skip
    assert set(Counter(r[0] for r in assignment.values()).values()) == {2}
    with pytest.raises(TopicExistsError):
        controller.controller.create_topic("t", 1, 1)
    with pytest.raises(InvalidConfigError, match="larger than the 3 live brokers"):
        controller.controller.create_topic("u", 1, 4)
    assert controller.coordinator.topics() == ["t"]


def test_a_dead_brokers_partitions_move_to_live_in_sync_replicas(cluster: dict[int, Node]) -> None:
    """A broker that is not the controller dies: each partition it led gets the next replica
    in assignment order as leader at epoch 1; every partition's ISR loses it, and those it
    only followed keep their leader and epoch 0."""
    controller = the_controller(cluster)
    controller.controller.create_topic("t", 6, 3)
    assignment = controller.coordinator.assignment("t")
    victim = next(n for n in cluster.values() if n is not controller)
    victim.kill()
    gone = victim.node_id

    def moved() -> bool:
        return all(gone not in s.isr for s in states(controller, "t").values())

    until(moved, f"broker {gone} to leave every ISR")
    for p, s in states(controller, "t").items():
        replicas = assignment[p]
        expected_isr = tuple(r for r in replicas if r != gone)
        if replicas[0] == gone:
            assert (s.leader, s.leader_epoch, s.isr) == (expected_isr[0], 1, expected_isr)
        else:
            assert (s.leader, s.leader_epoch, s.isr) == (replicas[0], 0, expected_isr)


def test_the_controllers_death_hands_the_term_on(cluster: dict[int, Node]) -> None:
    """The controller's broker dies: another broker takes the term at epoch 2 and moves the
    dead broker's leaderships as above."""
    first = the_controller(cluster)
    first.controller.create_topic("t", 3, 3)
    epoch = first.controller.term.epoch  # type: ignore[union-attr]
    first.kill()
    second = the_controller(cluster)
    assert second is not first
    assert second.controller.term.epoch == epoch + 1  # type: ignore[union-attr]
    gone = first.node_id
    until(lambda: all(gone not in s.isr and s.leader != gone for s in states(second, "t").values()),
          "the dead controller's partitions to move")  # fmt: skip


def partition(node: Node, want: Callable[[PartitionState], bool], what: str) -> PartitionState:
    """The partition t-0's state once `want` holds for it."""
    found = until(lambda: (s := node.coordinator.partition_state("t", 0)) and want(s) and s, what)
    assert isinstance(found, PartitionState)
    return found


def test_a_partition_with_no_live_in_sync_replica_waits_for_one(zk: ZooKeeper) -> None:
    """A partition's followers die, then its leader: it has no leader and keeps its last ISR
    (the last leader). A replica that was out of sync returns first and does not take over
    (clean election); the last leader returns and leads again, one epoch on, so the other
    never led."""
    nodes = {n: Node(zk, n) for n in (1, 2, 3)}
    try:
        controller = the_controller(nodes)
        controller.controller.create_topic("t", 1, 3)
        others = [n for n in controller.coordinator.assignment("t")[0] if n != controller.node_id]
        first = controller.coordinator.partition_state("t", 0)
        leader = first.leader if first.leader != controller.node_id else others[0]
        follower = next(n for n in others if n != leader)
        if first.leader != leader:  # the controller's broker led: move it off, as a failover would
            nodes[controller.node_id].coordinator.set_partition_state(
                "t", 0, PartitionState(leader, first.leader_epoch + 1, (leader, follower),
                                       first.controller_epoch),
                expected_version=first.version)  # fmt: skip
        else:  # the leader drops the controller's broker from the ISR, as a leader does
            nodes[leader].coordinator.set_partition_state(
                "t", 0, PartitionState(leader, first.leader_epoch, (leader, follower),
                                       first.controller_epoch),
                expected_version=first.version)  # fmt: skip
        nodes[follower].kill()
        shrunk = partition(controller, lambda s: s.isr == (leader,), "the ISR to shrink")
        nodes[leader].kill()
        offline = partition(controller, lambda s: s.leader == NO_LEADER, "the partition offline")
        assert offline.isr == (leader,) and offline.leader_epoch == shrunk.leader_epoch + 1
        nodes[follower] = Node(zk, follower)  # out of sync: may not lead
        until(lambda: follower in controller.controller.live, "the controller to see it")
        nodes[leader] = Node(zk, leader)
        back = partition(controller, lambda s: s.leader == leader, f"broker {leader} to lead")
        assert back.leader_epoch == offline.leader_epoch + 1 and back.isr == (leader,)
    finally:
        for node in nodes.values():
            node.kill()


def test_unclean_election_takes_an_out_of_sync_replica(zk: ZooKeeper) -> None:
    """With unclean leader election on, the same loss makes the live out-of-sync replica the
    leader, alone in the ISR (it may lack acknowledged writes: the setting's price)."""
    nodes = {n: Node(zk, n, unclean=True) for n in (1, 2, 3)}
    try:
        controller = the_controller(nodes)
        controller.controller.create_topic("t", 1, 3)
        replicas = controller.coordinator.assignment("t")[0]
        lagging = controller.node_id
        in_sync = tuple(r for r in replicas if r != lagging)
        state = controller.coordinator.partition_state("t", 0)
        nodes[in_sync[0]].coordinator.set_partition_state(
            "t", 0, PartitionState(in_sync[0], state.leader_epoch, in_sync, state.controller_epoch),
            expected_version=state.version)  # fmt: skip
        for n in in_sync:
            nodes[n].kill()
        led = until(lambda: (s := controller.coordinator.partition_state("t", 0)).leader
                    == lagging and s, "the laggard to lead")  # fmt: skip
        assert isinstance(led, PartitionState)
        assert led.isr == (lagging,)
    finally:
        for node in nodes.values():
            node.kill()


def test_a_controller_that_dies_mid_election_leaves_the_rest_to_the_next(
    cluster: dict[int, Node],
) -> None:
    """A broker leading four partitions dies; the controller writes the first partition's new
    state and dies before the others (its thread held after that one write while its
    session ends). The next controller takes the term one epoch on and finishes: every
    partition is led by the last broker, at a leader epoch past the dead leader's, and the
    partition the first controller moved keeps its move (its epoch only grows)."""
    import threading

    from mqcore.errors import CoordinatorError

    first = the_controller(cluster)
    first.controller.create_topic("t", 4, 3)
    doomed, last = (n for n in cluster.values() if n is not first)
    for p, s in states(first, "t").items():  # the doomed broker leads all four
        if s.leader != doomed.node_id:
            first.coordinator.set_partition_state(
                "t", p, PartitionState(doomed.node_id, s.leader_epoch + 1, s.isr,
                                       s.controller_epoch), expected_version=s.version)  # fmt: skip

    def led_by_doomed() -> dict[int, PartitionState] | None:
        got = states(first, "t")
        return got if all(s.leader == doomed.node_id for s in got.values()) else None

    before = until(led_by_doomed, "the doomed broker leading")
    written: list[tuple[str, int, PartitionState]] = []
    wrote_one, died = threading.Event(), threading.Event()
    real = first.coordinator.set_partition_state

    def once_then_die(topic: str, partition: int, state: PartitionState, **kw: object) -> None:
        if wrote_one.is_set():
            died.wait(WAIT)  # the broker is dying: its next write never reaches ZooKeeper
            raise CoordinatorError("the controller's session ended")
        real(topic, partition, state, **kw)  # type: ignore[arg-type]
        written.append((topic, partition, state))
        wrote_one.set()

    first.coordinator.set_partition_state = once_then_die  # type: ignore[method-assign]
    epoch = first.controller.term.epoch  # type: ignore[union-attr]
    doomed.kill()
    assert wrote_one.wait(WAIT), "the controller did not start the election"
    first.coordinator.close()  # its session ends mid-election: registration and term go
    first.alive = False
    died.set()
    first.controller.stop()
    assert len(written) == 1
    moved = written[0][1]
    second = the_controller(cluster)
    assert second is last
    assert second.controller.term.epoch == epoch + 1  # type: ignore[union-attr]
    final = until(lambda: (got := states(second, "t")) and all(
        s.leader == last.node_id and s.isr == (last.node_id,) for s in got.values()) and got,
        "the next controller to finish the election")  # fmt: skip
    for p, s in final.items():
        assert s.leader_epoch > before[p].leader_epoch, (p, before[p], s)
    assert final[moved].leader_epoch >= written[0][2].leader_epoch
