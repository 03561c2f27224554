"""`mqcore cluster status` (issue 33) as a process, over a real ZooKeeper and three brokers'
coordination (tests/clusternodes.py): what it prints is the coordination state read by an
independent ZooKeeper client, and its exit status says whether every partition is healthy."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from clusterprocs import until
from conftest import run_cli
from zkserver import ZooKeeper

pytest.importorskip("kazoo", reason="the server extra (kazoo) is missing")
from clusternodes import Node  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402

from mqcore.cluster.zk import PartitionState  # noqa: E402

WAIT = 30.0
UNHEALTHY = 3
Partitions = dict[str, tuple[list[int], int, int, list[int]]]


def znodes(zk: ZooKeeper) -> tuple[list[int], int, int, Partitions]:
    """The state as a plain kazoo client reads it, which the command must show: the live
    brokers, the controller, its epoch, and "topic-p" -> (replicas, leader, epoch, isr)."""
    raw = KazooClient(hosts=zk.address + "/cluster")
    raw.start(WAIT)
    try:
        brokers = sorted(int(b) for b in raw.get_children("/brokers/ids"))
        controller = json.loads(raw.get("/controller")[0])["brokerid"]
        epoch = int(raw.get("/controller_epoch")[0])
        partitions: Partitions = {}
        for topic in raw.get_children("/brokers/topics"):
            assignment = json.loads(raw.get(f"/brokers/topics/{topic}")[0])["partitions"]
            for p, replicas in assignment.items():
                state = json.loads(raw.get(f"/brokers/topics/{topic}/partitions/{p}/state")[0])
                partitions[f"{topic}-{p}"] = (replicas, state["leader"], state["leader_epoch"],
                                              state["isr"])  # fmt: skip
        return brokers, controller, epoch, partitions
    finally:
        raw.stop()
        raw.close()


def status(zk: ZooKeeper, *flags: str) -> tuple[int, Any]:
    code, out, err = run_cli("cluster", "status", "--coordinator", zk.url("/cluster"), "--json",
                             *flags)  # fmt: skip
    assert err == "", err
    return code, json.loads(out)


def shown_partitions(shown: Any) -> Partitions:
    return {f"{p['topic']}-{p['partition']}": (p["replicas"], p["leader"], p["leader_epoch"],
                                               p["isr"]) for p in shown["partitions"]}  # fmt: skip


def test_status_shows_the_coordination_state_and_exits_3_when_unhealthy(zk: ZooKeeper) -> None:
    nodes = {n: Node(zk, n) for n in (1, 2, 3)}
    try:
        until(lambda: sum(n.controller.is_controller for n in nodes.values()) == 1, "a controller")
        controller = next(n for n in nodes.values() if n.controller.is_controller)
        controller.controller.create_topic("wide", 3, 3)
        controller.controller.create_topic("narrow", 3, 1)
        code, shown = status(zk)
        brokers, leader_of_all, epoch, partitions = znodes(zk)
        assert code == 0
        assert [b["id"] for b in shown["brokers"]] == brokers == [1, 2, 3]
        assert (shown["controller"], shown["controller_epoch"]) == (leader_of_all, epoch)
        assert shown_partitions(shown) == partitions
        assert (shown["under_replicated"], shown["offline"]) == (0, 0)

        victim = next(n for n in nodes.values() if n is not controller)
        victim.kill()
        gone = victim.node_id

        def settled() -> bool:
            # it leaves every ISR, or, where it was the only replica, the partition goes
            # offline keeping it as its last ISR
            return all(gone not in v[3] or v[1] == -1 for v in znodes(zk)[3].values())

        until(settled, "the partitions to settle")
        code, shown = status(zk, "--under-replicated")
        _, _, epoch, partitions = znodes(zk)
        assert code == UNHEALTHY
        listed = {f"{p['topic']}-{p['partition']}": p for p in shown["partitions"]}
        offline = {k for k, v in partitions.items() if k.startswith("narrow-") and v[0] == [gone]}
        assert len(offline) == 1  # each broker leads one of the three
        assert set(listed) == {f"wide-{p}" for p in range(3)} | offline
        assert all(listed[k]["offline"] and listed[k]["leader"] is None for k in offline)
        # counted as Kafka counts them: under-replicated is fewer in-sync replicas than
        # replicas; an offline partition of one replica keeps that replica as its last ISR
        assert (shown["under_replicated"], shown["offline"]) == (3, 1)
        code, out, err = run_cli("cluster", "status", "--coordinator", zk.url("/cluster"))
        assert code == UNHEALTHY and err == ""
        lines = out.splitlines()
        assert lines[:2] == [f"controller: broker {controller.node_id} (epoch {epoch})",
                             "brokers: 2 live"]  # fmt: skip
        assert "partitions: 6 in 2 topic(s), 3 under-replicated, 1 offline" in lines
        for key in [f"wide-{p}" for p in range(3)] + sorted(offline):
            (line,) = [x for x in lines if x.strip().startswith(key + " ")]
            assert ("offline" if key in offline else "under-replicated") in line
    finally:
        for node in nodes.values():
            node.kill()


def test_status_without_zookeeper_is_one_line(zk: ZooKeeper) -> None:
    zk.stop()
    t0 = time.monotonic()
    code, out, err = run_cli("cluster", "status", "--coordinator", zk.url("/cluster"),
                             "--timeout", "1")  # fmt: skip
    assert (code, out) == (1, "")
    assert err == f"mqcore: error: ZooKeeper at {zk.url('/cluster')} did not answer within 1 s\n"
    assert time.monotonic() - t0 < 30
    code, _, err = run_cli("cluster", "status", "--coordinator", "http://x")
    assert code == 1 and "is not a ZooKeeper URL" in err


def test_elect_leaders_gives_partitions_back_to_their_preferred_replicas(zk: ZooKeeper) -> None:
    """A preferred replica dies and comes back. While it is out of sync, elect-leaders
    leaves its partition alone and exits 3 naming it; once the leader has taken it back into
    the ISR (what a caught-up follower gets), elect-leaders makes it the leader again, one
    epoch on, and exits 0."""
    nodes = {n: Node(zk, n) for n in (1, 2, 3)}
    try:
        until(lambda: sum(n.controller.is_controller for n in nodes.values()) == 1, "a controller")
        controller = next(n for n in nodes.values() if n.controller.is_controller)
        controller.controller.create_topic("t", 3, 3)
        assignment = controller.coordinator.assignment("t")
        # the partition whose preferred replica is not the controller's broker
        part, replicas = next((p, r) for p, r in sorted(assignment.items())
                              if r[0] != controller.node_id)  # fmt: skip
        preferred, successor = replicas[0], replicas[1]
        nodes[preferred].kill()
        until(lambda: controller.coordinator.partition_state("t", part).leader == successor,
              "the successor to lead")  # fmt: skip
        nodes[preferred] = Node(zk, preferred)
        until(lambda: preferred in controller.controller.live, "the controller to see it back")

        code, out, err = run_cli("cluster", "elect-leaders", "--coordinator", zk.url("/cluster"),
                                 "--topic", "t")  # fmt: skip
        assert (code, err) == (UNHEALTHY, "")
        assert out.splitlines()[-1] == (
            f"not led by their preferred replica (dead or out of sync): t-{part}"
        )
        state = controller.coordinator.partition_state("t", part)
        assert (state.leader, state.leader_epoch) == (successor, 1)

        # the leader takes it back into the ISR, as it will once the follower caught up
        nodes[successor].coordinator.set_partition_state(
            "t", part, PartitionState(successor, 1, (*state.isr, preferred),
                                      state.controller_epoch),
            expected_version=state.version)  # fmt: skip
        code, out, err = run_cli("cluster", "elect-leaders", "--coordinator", zk.url("/cluster"),
                                 "--topic", "t", "--partition", str(part), "--json")  # fmt: skip
        assert (code, err) == (0, "")
        shown = json.loads(out)
        assert shown["not_preferred"] == []
        assert [(p["partition"], p["leader"], p["leader_epoch"], p["preferred"])
                for p in shown["partitions"]] == [(part, preferred, 2, preferred)]  # fmt: skip
        assert controller.coordinator.partition_state("t", part).leader == preferred
        code, _, err = run_cli("cluster", "elect-leaders", "--coordinator", zk.url("/cluster"),
                               "--partition", "0")  # fmt: skip
        assert code == 2 and "--partition needs --topic" in err
    finally:
        for node in nodes.values():
            node.kill()


def test_create_topic_places_a_replicated_topic_and_waits_for_its_leaders(zk: ZooKeeper) -> None:
    """`mqcore cluster create-topic`: written through ZooKeeper as kafka-topics.sh --zookeeper
    did, answered once the controller gave every partition a leader; a second creation, a
    factor above the live brokers and an unknown setting are refused in one line."""
    nodes = {n: Node(zk, n) for n in (1, 2, 3)}
    try:
        until(lambda: sum(n.controller.is_controller for n in nodes.values()) == 1, "a controller")
        url = zk.url("/cluster")
        code, out, err = run_cli("cluster", "create-topic", "--coordinator", url, "orders",
                                 "--partitions", "3", "--replication-factor", "2",
                                 "--config", "min.insync.replicas=2")  # fmt: skip
        assert (code, err) == (0, "")
        _, _, _, partitions = znodes(zk)
        assert sorted(k for k in partitions if k.startswith("orders-")) == [
            "orders-0", "orders-1", "orders-2"]  # fmt: skip
        for line in out.splitlines():
            name, _, leader, _, replicas = line.split()
            assert partitions[name][1] == int(leader) == partitions[name][0][0]
            assert [int(r) for r in replicas.split(",")] == partitions[name][0]
            assert len(partitions[name][0]) == 2 and partitions[name][3] == partitions[name][0]
        coordinator = nodes[1].coordinator
        assert coordinator.topic_config("orders") == {"min.insync.replicas": "2"}
        for argv, words in (
            (["orders", "--partitions", "1", "--replication-factor", "1"], "already exists"),
            (["wide", "--partitions", "1", "--replication-factor", "4"], "larger than the 3"),
            (
                ["x", "--partitions", "1", "--replication-factor", "1", "--config", "no.such=1"],
                "unknown topic config",
            ),
        ):
            code, out, err = run_cli("cluster", "create-topic", "--coordinator", url, *argv)
            assert code != 0 and words in err and "Traceback" not in err, (argv, err)
        assert coordinator.topics() == ["orders"]
    finally:
        for n in nodes.values():
            n.kill()


def test_status_shows_a_topic_marked_for_deletion_and_who_it_waits_for(zk: ZooKeeper) -> None:
    """A topic marked for deletion whose replica on a stopped broker is not deleted yet: the
    status names it and the broker the deletion waits for (read from the marks as a plain
    kazoo client sees them); once that broker's acknowledgement is there, the controller
    finishes and the status no longer shows it."""
    nodes = {n: Node(zk, n) for n in (1, 2)}
    try:
        until(lambda: sum(n.controller.is_controller for n in nodes.values()) == 1, "a controller")
        nodes[1].controller.create_topic("gone", 1, 2)
        nodes[1].coordinator.request_topic_deletion("gone")
        nodes[1].coordinator.ack_topic_deletion("gone", 1)
        raw = KazooClient(hosts=zk.address + "/cluster")
        raw.start(WAIT)
        try:
            assert sorted(raw.get_children("/admin/delete_topics/gone")) == ["1"]
        finally:
            raw.stop()
            raw.close()
        code, shown = status(zk)
        assert shown["deleting"] == {"gone": [2]}
        code, out, err = run_cli("cluster", "status", "--coordinator", zk.url("/cluster"))
        assert "marked for deletion: gone (waiting for brokers [2])" in out, out
        nodes[2].coordinator.ack_topic_deletion("gone", 2)
        until(lambda: status(zk)[1]["deleting"] == {}, "the controller to finish the deletion")
        assert "gone" not in {p["topic"] for p in status(zk)[1]["partitions"]}
    finally:
        for node in nodes.values():
            node.kill()
