"""The cluster's state in a real ZooKeeper (issue 33, mqcore.cluster.zk): broker registration,
the controller's election and its fencing, partition states changed only by compare-and-set,
Kafka's znode layout, and ZooKeeper unreachable. Each coordinator is its own ZooKeeper session,
as each broker process has one."""

from __future__ import annotations

import json
import threading
import time

import pytest
from clusterprocs import until
from zkserver import ZooKeeper, free_port

pytest.importorskip("kazoo", reason="the server extra (kazoo) is missing")
from kazoo.client import KazooClient  # noqa: E402

from mqcore.cluster.zk import (  # noqa: E402
    BrokerInfo,
    Controller,
    PartitionState,
    ZkCoordinator,
    parse_coordinator,
)
from mqcore.errors import (  # noqa: E402
    CoordinatorError,
    InvalidConfigError,
    NodeIdTakenError,
    StaleStateError,
    TopicExistsError,
)

WAIT = 30.0


def coordinator(zk: ZooKeeper, path: str = "/c1", **options: float) -> ZkCoordinator:
    return ZkCoordinator(zk.url(path), session_timeout_ms=4000, connect_timeout=10.0,
                         **options).start()  # fmt: skip


def test_coordinator_urls() -> None:
    assert parse_coordinator("zk://a:2181,b:2182/kafka/one") == ("a:2181,b:2182", "/kafka/one")
    assert parse_coordinator("zk://127.0.0.1:2181") == ("127.0.0.1:2181", "/")
    for bad in ("http://a:1/x", "zk:///x", "zk://a/x", "zk://a:0/x", "zk://a:1//x", "zk://a:1/x?y"):
        with pytest.raises(InvalidConfigError, match="coordinator"):
            parse_coordinator(bad)


def test_brokers_register_while_their_session_lives_and_an_id_is_taken_once(zk: ZooKeeper) -> None:
    one, two = coordinator(zk), coordinator(zk)
    seen: list[set[int]] = []
    two.watch_brokers(seen.append)
    one.register_broker(BrokerInfo(1, "127.0.0.1", 9101, rack="r1"))
    two.register_broker(BrokerInfo(2, "127.0.0.1", 9102))
    other = coordinator(zk)
    try:
        with pytest.raises(NodeIdTakenError, match="node ID 1 is registered"):
            other.register_broker(BrokerInfo(1, "127.0.0.1", 9999))
        assert other.brokers() == {1: BrokerInfo(1, "127.0.0.1", 9101, "r1"),
                                   2: BrokerInfo(2, "127.0.0.1", 9102)}  # fmt: skip
        one.close()  # its session ends, and its registration with it
        until(lambda: seen and seen[-1] == {2}, "the watch to see broker 1 go")
        assert set(other.brokers()) == {2}
        other.register_broker(BrokerInfo(1, "127.0.0.1", 9103))  # free again
        until(lambda: seen[-1] == {1, 2}, "the watch to see broker 1 back")
    finally:
        other.close()
        two.close()


def race_to_control(nodes: dict[int, ZkCoordinator]) -> dict[int, Controller | None]:
    """Every node tries to become controller at the same moment; each one's term or None."""
    start = threading.Barrier(len(nodes))
    terms: dict[int, Controller | None] = {}

    def run(n: int) -> None:
        start.wait(WAIT)
        terms[n] = nodes[n].elect(n)

    threads = [threading.Thread(target=run, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    return terms


def test_one_of_racing_nodes_becomes_controller_and_each_term_has_a_new_epoch(
    zk: ZooKeeper,
) -> None:
    """Eight sessions try to become controller at once, three times over (the winner's session
    ends after each round): exactly one wins each round, the controller znode names it, and
    the epochs are 1, 2, 3."""
    nodes = {n: coordinator(zk) for n in range(1, 9)}
    try:
        epochs = []
        for _round in range(3):
            terms = race_to_control(nodes)
            winners = {n: t for n, t in terms.items() if t is not None}
            assert len(terms) == len(nodes) and len(winners) == 1, terms
            ((winner, term),) = winners.items()
            other = next(c for n, c in nodes.items() if n != winner)
            assert other.controller() == winner
            assert other.controller_epoch() == term.epoch
            epochs.append(term.epoch)
            nodes.pop(winner).close()
            until(lambda c=other: c.controller() is None, "the controller znode to go")
        assert epochs == [1, 2, 3]
    finally:
        for c in nodes.values():
            c.close()


def make_topic(c: ZkCoordinator, term: Controller, topic: str,
               assignment: dict[int, list[int]]) -> None:  # fmt: skip
    """A topic written and its partitions initialised, as a broker and the controller do."""
    c.write_topic(topic, assignment)
    c.init_partition_states(term, topic, {p: PartitionState(r[0], 0, tuple(r), term.epoch)
                                          for p, r in assignment.items()})  # fmt: skip


def test_create_topic_writes_kafkas_layout_whole(zk: ZooKeeper) -> None:
    """The znodes a ZooKeeper-era Kafka tool reads, with Kafka's field names; a second creation
    is TopicExistsError and changes nothing."""
    c = coordinator(zk, "/layout")
    try:
        term = c.elect(1)
        assert term is not None
        c.write_topic("orders", {0: [1, 2, 3], 1: [2, 3, 1]}, {"retention.ms": "1000"})
        assert not c.has_state("orders", 0)
        first = {p: PartitionState(r[0], 0, tuple(r), term.epoch)
                 for p, r in c.assignment("orders").items()}  # fmt: skip
        states = c.init_partition_states(term, "orders", first)
        assert states[1] == PartitionState(2, 0, (2, 3, 1), term.epoch, 0)
        assert c.init_partition_states(term, "orders", first) == {}  # each state only once
        raw = KazooClient(hosts=zk.address)
        raw.start(WAIT)
        try:
            topic = json.loads(raw.get("/layout/brokers/topics/orders")[0])
            assert topic == {"version": 2, "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]},
                             "adding_replicas": {}, "removing_replicas": {}}  # fmt: skip
            state = json.loads(raw.get("/layout/brokers/topics/orders/partitions/0/state")[0])
            assert state == {"controller_epoch": 1, "leader": 1, "version": 1,
                             "leader_epoch": 0, "isr": [1, 2, 3]}  # fmt: skip
            config = json.loads(raw.get("/layout/config/topics/orders")[0])
            assert config == {"version": 1, "config": {"retention.ms": "1000"}}
            controller = json.loads(raw.get("/layout/controller")[0])
            assert (controller["version"], controller["brokerid"]) == (1, 1)
            assert raw.get("/layout/controller_epoch")[0] == b"1"
        finally:
            raw.stop()
            raw.close()
        with pytest.raises(TopicExistsError):
            c.write_topic("orders", {0: [3]})
        assert c.assignment("orders") == {0: (1, 2, 3), 1: (2, 3, 1)}
        assert c.topic_config("orders") == {"retention.ms": "1000"}
        assert c.topics() == ["orders"]
        for bad in ({1: [1]}, {0: [1, 1]}, {0: []}, {}):
            with pytest.raises(InvalidConfigError):
                c.write_topic("bad", bad)
        assert c.topics() == ["orders"]
    finally:
        c.close()


def test_a_partition_state_changes_only_by_compare_and_set(zk: ZooKeeper) -> None:
    """Two writers read the same version: the first write wins, the second is StaleStateError
    and changes nothing; a leader's ISR change needs no term, a controller's does."""
    a, b = coordinator(zk), coordinator(zk)
    try:
        term = a.elect(1)
        assert term is not None
        make_topic(a, term, "t", {0: [1, 2, 3]})
        seen: list[PartitionState | None] = []
        b.watch_partition_state("t", 0, seen.append)
        read_a, read_b = a.partition_state("t", 0), b.partition_state("t", 0)
        assert read_a == read_b and read_a.version == 0
        shrunk = PartitionState(1, 0, (1, 2), term.epoch)
        written = a.set_partition_state("t", 0, shrunk, expected_version=read_a.version)
        assert written.version == 1 and written.isr == (1, 2)
        with pytest.raises(StaleStateError, match="changed since version 0"):
            b.set_partition_state("t", 0, PartitionState(1, 0, (1, 3), term.epoch),
                                  expected_version=read_b.version)  # fmt: skip
        assert b.partition_state("t", 0) == written
        moved = PartitionState(2, 1, (2,), term.epoch)
        now = a.set_partition_state("t", 0, moved, expected_version=1, term=term)
        assert (now.leader, now.leader_epoch, now.version) == (2, 1, 2)
        until(lambda: seen and seen[-1] == now, "the watch to see the new state")
        assert [s.version for s in seen if s is not None] == sorted(
            {s.version for s in seen if s is not None}
        )
    finally:
        a.close()
        b.close()


def test_an_old_controllers_writes_are_fenced(zk: ZooKeeper) -> None:
    """A controller that lost its term without knowing it (its /controller znode gone, as
    when its session expired while it was paused, and another node elected): every write of
    its old term is StaleStateError and leaves the new controller's state alone."""
    old, new = coordinator(zk), coordinator(zk)
    try:
        first = old.elect(1)
        assert first is not None
        make_topic(old, first, "t", {0: [1, 2]})
        raw = KazooClient(hosts=zk.address + "/c1")
        raw.start(WAIT)
        raw.delete("/controller")  # what the expiry of node 1's session does
        raw.stop()
        raw.close()
        second = new.elect(2)
        assert second is not None and second.epoch == first.epoch + 1
        state = new.partition_state("t", 0)
        with pytest.raises(StaleStateError, match=f"controller epoch {first.epoch} is over"):
            old.set_partition_state("t", 0, PartitionState(1, 1, (1,), first.epoch),
                                    expected_version=state.version, term=first)  # fmt: skip
        old.write_topic("u", {0: [1]})  # any broker may write a topic: the states are fenced
        with pytest.raises(StaleStateError):
            old.init_partition_states(first, "u", {0: PartitionState(1, 0, (1,), first.epoch)})
        assert new.partition_state("t", 0) == state and not new.has_state("u", 0)
        taken = new.set_partition_state("t", 0, PartitionState(2, 1, (2,), second.epoch),
                                        expected_version=state.version, term=second)  # fmt: skip
        assert taken.leader == 2
    finally:
        old.close()
        new.close()


def test_zookeeper_unreachable_is_a_coordinator_error_in_bounded_time(zk: ZooKeeper) -> None:
    """Nothing listening: start() gives up after its timeout. ZooKeeper gone while a session
    lives: each request fails within the request timeout; back within the session timeout,
    the session and its registration are as they were."""
    t0 = time.monotonic()
    nowhere = ZkCoordinator(f"zk://127.0.0.1:{free_port()}/x", connect_timeout=2.0)
    with pytest.raises(CoordinatorError, match="did not answer within 2 s"):
        nowhere.start()
    assert time.monotonic() - t0 < 10
    c = ZkCoordinator(zk.url("/outage"), session_timeout_ms=10_000, connect_timeout=2.0).start()
    try:
        c.register_broker(BrokerInfo(7, "127.0.0.1", 9107))
        zk.stop()
        t0 = time.monotonic()
        with pytest.raises(CoordinatorError):
            c.brokers()
        assert time.monotonic() - t0 < 10
        zk.start()
        until(lambda: _answers(c), "the session to come back")
        assert set(c.brokers()) == {7}
        assert not c.session_lost.is_set()
    finally:
        c.close()


def _answers(c: ZkCoordinator) -> bool:
    try:
        c.brokers()
    except CoordinatorError:
        return False
    return True


def test_the_sessions_changes_are_logged_once_each(
    zk: ZooKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    """ZooKeeper away and back is one warning each way (kazoo's own line per failed
    reconnect is left to kazoo's logger, which `mqcore serve` quiets), and a close says
    nothing."""
    import logging

    caplog.set_level(logging.WARNING, logger="mqcore.cluster")
    c = coordinator(zk)
    try:
        zk.stop()
        until(lambda: any("unreachable" in r.message for r in caplog.records), "the warning")
        zk.start()
        until(lambda: any("reached again, the session kept" in r.message
                          for r in caplog.records), "the all-clear")  # fmt: skip
    finally:
        c.close()
    ours = [r.message for r in caplog.records if r.name == "mqcore.cluster"]
    assert len(ours) == 2 and "expired" not in " ".join(ours), ours
