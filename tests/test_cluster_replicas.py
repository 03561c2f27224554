"""Each failure path of the replication protocol, one deterministic test each (issue 33): three
`mqcore.server.Server` brokers in this process, on a real ZooKeeper, replicating over Kafka's
Fetch and OffsetForLeaderEpoch on loopback. A follower's fetching is held back by refusing its
requests to the leader (`blocked`: the follower's wire client fails as on a cut link), so the
test decides which replica has which record instead of racing the fetchers.

- the ISR shrinks after replica.lag.time.max.ms and expands once the follower caught up;
- a follower that was ahead of the new leader (it led, and wrote what nobody copied) truncates
  to where its epoch ends on the new leader, and the logs agree again;
- NOT_ENOUGH_REPLICAS below min.insync.replicas, and NOT_ENOUGH_REPLICAS_AFTER_APPEND when the
  ISR shrinks under a waiting acks=all write;
- the controller dies with a leader: the broker left elects itself and serves;
- ZooKeeper away for a while: the brokers serve as they are, and what changed meanwhile (a
  broker that died) is acted on once it is back;
- and what a cluster serves beyond replication, through unmodified clients: the HTTP API and
  the console for the whole cluster, topics deleted and configs changed on every replica,
  records deleted, replica assignments given, racks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clusterinproc import WAIT, InProcessCluster, consume, http_get, produce
from clusterprocs import until
from zkserver import ZooKeeper

from mqcore.server import Server, interbroker


def test_the_isr_shrinks_after_the_lag_time_and_expands_when_the_follower_catches_up(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = make_cluster(replica_lag_time_max_ms=1500, zk_session_timeout_ms=8000)
    cluster.create("t")
    first = cluster.state("t")
    follower = next(r for r in first.isr if r != first.leader)
    cluster.hold(follower)
    produce(cluster.bootstrap, "t", [b"x%d" % i for i in range(10)])  # the other follower acks
    shrunk = until(lambda: follower not in cluster.state("t").isr and cluster.state("t"),
                   "the lagging follower to leave the ISR")  # fmt: skip
    assert (shrunk.leader, shrunk.leader_epoch) == (first.leader, first.leader_epoch)
    assert len(shrunk.isr) == 2
    assert cluster.log(follower, "t") == []  # it has none of them
    assert consume(cluster.bootstrap, "t", 10) == [b"x%d" % i for i in range(10)]
    cluster.release()
    grown = until(lambda: follower in cluster.state("t").isr and cluster.state("t"),
                  "the follower to rejoin the ISR")  # fmt: skip
    assert grown.leader_epoch == first.leader_epoch and len(grown.isr) == 3
    assert cluster.log(follower, "t") == cluster.log(first.leader, "t")


def test_a_follower_ahead_of_the_new_leader_truncates_to_the_new_leaders_epoch(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = make_cluster(zk_session_timeout_ms=8000)
    cluster.create("t")
    produce(cluster.bootstrap, "t", [b"committed-%d" % i for i in range(5)])
    old = cluster.state("t")
    until(lambda: all(len(cluster.log(n, "t")) == 5 for n in (1, 2, 3)), "every replica at 5")
    others = [n for n in (1, 2, 3) if n != old.leader]
    cluster.hold(*others)
    # acks=1: the leader alone has these (offsets 5..7): never committed
    assert produce(cluster.bootstrap, "t", [b"lost-%d" % i for i in range(3)], acks=1) == [5, 6, 7]
    assert len(cluster.log(old.leader, "t")) == 8
    cluster.stop(old.leader)
    cluster.release()
    new = until(lambda: cluster.state("t").leader in others and cluster.state("t"),
                "a new leader from the ISR")  # fmt: skip
    assert new.leader_epoch == old.leader_epoch + 1
    assert produce(cluster.bootstrap, "t", [b"new-%d" % i for i in range(4)]) == [5, 6, 7, 8]
    cluster.start(old.leader)  # comes back ahead at offsets 5..7 with epoch 0's records
    until(lambda: old.leader in cluster.state("t").isr, "the old leader back in the ISR")
    until(lambda: cluster.log(old.leader, "t") == cluster.log(new.leader, "t"),
          "the old leader's log to equal the new leader's")  # fmt: skip
    values = [v for _, v in cluster.log(old.leader, "t")]
    assert values == [b"committed-%d" % i for i in range(5)] + [b"new-%d" % i for i in range(4)]
    handle = cluster.servers[old.leader].store.log.replica("t", 0)  # type: ignore[union-attr]
    assert handle.end_offset_for_epoch(old.leader_epoch) == (old.leader_epoch, 5)


def test_acks_all_is_refused_below_min_insync_replicas(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    from kafka.errors import NotEnoughReplicasAfterAppendError, NotEnoughReplicasError

    cluster = make_cluster(replica_lag_time_max_ms=1500, zk_session_timeout_ms=8000)
    cluster.create("t", rf=2, **{"min.insync.replicas": "2"})
    state = cluster.state("t")
    follower = next(r for r in state.isr if r != state.leader)
    cluster.hold(follower)
    # the write is appended, then the ISR shrinks under it: refused after the append
    with pytest.raises(NotEnoughReplicasAfterAppendError):
        produce(cluster.bootstrap, "t", [b"a"], retries=0)
    until(lambda: cluster.state("t").isr == (state.leader,), "the ISR to shrink to the leader")
    with pytest.raises(NotEnoughReplicasError):  # now refused before the append
        produce(cluster.bootstrap, "t", [b"b"], retries=0)
    assert produce(cluster.bootstrap, "t", [b"c"], acks=1) == [1]  # acks=1 is still taken
    assert [v for _, v in cluster.log(state.leader, "t")] == [b"a", b"c"]
    cluster.release()
    until(lambda: len(cluster.state("t").isr) == 2, "the follower back in the ISR")
    assert produce(cluster.bootstrap, "t", [b"d"]) == [2]


def test_the_controller_dying_with_a_leader_leaves_the_last_broker_leading(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = make_cluster(zk_session_timeout_ms=8000)
    cluster.create("t", partitions=3)
    controller = cluster.any().replicas.controller_id()  # type: ignore[union-attr]
    leaders = {p: cluster.state("t", p).leader for p in range(3)}
    other = next(n for n in (1, 2, 3) if n != controller)
    survivor = next(n for n in (1, 2, 3) if n not in (controller, other))
    cluster.stop(controller)  # both sessions end at once: the new controller sees both gone
    cluster.stop(other)
    for p in range(3):  # the two deaths may reach the new controller as one change or two
        until(lambda p=p: cluster.state("t", p).leader == survivor
              and cluster.state("t", p).isr == (survivor,), f"partition {p} led by broker "
              f"{survivor} alone (it was led by {leaders[p]})")  # fmt: skip
    assert cluster.servers[survivor].replicas.controller_id() == survivor  # type: ignore[union-attr]
    assert produce(cluster.bootstrap, "t", [b"after"]) == [0]
    for node in (controller, other):
        cluster.start(node)
    until(lambda: all(len(cluster.state("t", p).isr) == 3 for p in range(3)), "a full ISR")


def test_zookeeper_away_for_a_while_stops_nothing_but_changes(
    make_cluster: Callable[..., InProcessCluster], zk: ZooKeeper
) -> None:
    """While ZooKeeper is away the brokers go on as they are (the leader and its ISR take
    acks=all writes) and nothing can change who leads or who is in sync; a broker that died
    meanwhile leaves the ISR once ZooKeeper is back and its session expires there."""
    cluster = make_cluster(zk_session_timeout_ms=8000)
    cluster.create("t")
    produce(cluster.bootstrap, "t", [b"before-%d" % i for i in range(5)])
    state = cluster.state("t")
    zk.stop()
    assert produce(cluster.bootstrap, "t", [b"during"]) == [5]
    follower = next(r for r in state.isr if r != state.leader)
    cluster.stop(follower)  # it cannot even end its session: ZooKeeper will expire it
    zk.start()
    shrunk = until(lambda: follower not in cluster.state("t").isr and cluster.state("t"),
                   "the dead follower's session to expire and the controller to act")  # fmt: skip
    # the leader keeps its epoch, unless its own session expired too while ZooKeeper came
    # back (a loaded machine's reconnect can take that long): then another leads, at a new one
    assert (shrunk.leader, shrunk.leader_epoch) == (state.leader, state.leader_epoch) or (
        shrunk.leader != follower and shrunk.leader_epoch > state.leader_epoch
    )
    assert produce(cluster.bootstrap, "t", [b"after"]) == [6]
    got = consume(cluster.bootstrap, "t", 7)
    assert got == [b"before-%d" % i for i in range(5)] + [b"during", b"after"]
    cluster.start(follower)
    until(lambda: len(cluster.state("t").isr) == 3, "the follower back in the ISR")


def test_a_topics_configs_changed_on_a_cluster_reach_every_replica(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """IncrementalAlterConfigs (confluent-kafka's SET, kafka-python's SET and DELETE) through
    any broker change the topic's overrides in ZooKeeper, and every broker
    holding a replica applies them; DescribeConfigs answers them on a broker without a
    replica; a setting fixed at creation and an internal topic are refused, nothing
    changed."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType

    cluster = make_cluster()
    cluster.create("t", partitions=1, rf=2, **{"retention.bytes": "123456"})
    produce(cluster.bootstrap, "t", [b"kept"])
    holders = set(cluster.any().replicas.partitions("t")[0].replicas)  # type: ignore[union-attr]
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def alter(name: str, value: str, topic: str = "t") -> Any:
        entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource("topic", topic, incremental_configs=[entry])
        return next(iter(admin.incremental_alter_configs([resource]).values()))

    alter("retention.ms", "1000").result(30)
    for node in holders:
        store = cluster.servers[node].store
        assert store is not None
        until(lambda s=store: s.topic_config("t").retention_ms == 1000,
              f"broker {node} to apply retention.ms")  # fmt: skip
        assert store.topic_config("t").retention_bytes == 123456  # the others kept
    coordinator = cluster.any().replicas.coordinator  # type: ignore[union-attr]
    assert coordinator.topic_config("t")["retention.ms"] == "1000"
    for name, value, topic in (("segment.bytes", "1048576", "t"),
                               ("retention.ms", "5", "__consumer_offsets")):  # fmt: skip
        with pytest.raises(ck.KafkaException):
            alter(name, value, topic).result(30)
    assert coordinator.topic_config("t").get("segment.bytes") is None
    kadmin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:  # retention.ms set, retention.bytes deleted: back to its default
        kadmin.alter_configs([KConfigResource(ConfigResourceType.TOPIC, "t", configs={
            "retention.ms": "2000", "retention.bytes": ("DELETE", None)})])  # fmt: skip
    finally:
        kadmin.close()
    for node in holders:
        store = cluster.servers[node].store
        assert store is not None
        until(lambda s=store: (s.topic_config("t").retention_ms,
                               s.topic_config("t").retention_bytes) == (2000, -1),
              f"broker {node} to apply the change and the deletion")  # fmt: skip
    outside = [n for n in cluster.servers if n not in holders]
    assert len(outside) == 1
    for node in outside:  # no replica here, and the configs are still described
        one = AdminClient({"bootstrap.servers": cluster.servers[node].bootstrap})
        described = one.describe_configs([ConfigResource("topic", "t")])
        configs = next(iter(described.values())).result(30)
        assert configs["retention.ms"].value == "2000"
    assert consume(cluster.bootstrap, "t", 1) == [b"kept"]


def test_a_node_id_held_by_a_live_broker_is_refused_after_the_session_timeout(
    zk: ZooKeeper, tmp_path: Path
) -> None:
    """A restarted broker waits out its old session's registration; a second live process
    with the same node ID is refused (NodeIdTakenError) once that wait is over, and the
    first goes on serving."""
    from mqcore.errors import NodeIdTakenError

    first = Server(tmp_path / "a", "127.0.0.1:0", node_id=7, create=True,
                   coordinator=zk.url("/cluster"), zk_session_timeout_ms=2000).start()  # fmt: skip
    try:
        second = Server(tmp_path / "b", "127.0.0.1:0", node_id=7, create=True,
                        coordinator=zk.url("/cluster"), zk_session_timeout_ms=2000)  # fmt: skip
        with pytest.raises(NodeIdTakenError, match="node ID 7 is registered"):
            second.start()
        assert not second.serving and first.serving
        assert first.replicas is not None and first.replicas.brokers().keys() == {7}
    finally:
        first.stop()


def test_partitions_added_to_a_topic_are_replicated(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """CreatePartitions on a cluster: the new partitions are placed over the brokers, get
    their first states from the controller, exist in the stores of the brokers holding them,
    and are written to and replicated like the first ones."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions

    cluster = make_cluster()
    cluster.create("t", partitions=2)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_partitions([NewPartitions("t", 5)])["t"].result(30)
    with pytest.raises(ck.KafkaException) as refused:  # fewer than it has
        admin.create_partitions([NewPartitions("t", 3)])["t"].result(30)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
    coordinator = cluster.any().replicas.coordinator  # type: ignore[union-attr]
    assignment = coordinator.assignment("t")
    assert sorted(assignment) == [0, 1, 2, 3, 4]
    assert all(sorted(r) == [1, 2, 3] for r in assignment.values())
    for p in range(5):
        until(lambda p=p: len(cluster.state("t", p).isr) == 3, f"partition {p} in sync")
    for node in (1, 2, 3):
        store = cluster.servers[node].store
        assert store is not None and store.partitions("t") == 5
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    try:
        assert producer.send("t", b"new", partition=4).get(30).offset == 0
    finally:
        producer.close()
    until(lambda: all(cluster.log(n, "t", 4) == [(0, b"new")] for n in (1, 2, 3)),
          "partition 4's record on every replica")  # fmt: skip


def test_an_offset_commit_is_answered_once_the_offsets_replicas_have_it(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """The group coordinator (the offsets topic's leader) answers a commit only once every
    in-sync replica of `__consumer_offsets` has it, so a coordinator's failover keeps it."""
    import threading

    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    cluster = make_cluster(zk_session_timeout_ms=8000)
    cluster.create("t")
    produce(cluster.bootstrap, "t", [b"m%d" % i for i in range(10)])
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id="g",
                             enable_auto_commit=False)  # fmt: skip
    tp = TopicPartition("t", 0)
    try:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(3, "", -1)})  # makes the offsets topic
        offsets = cluster.state("__consumer_offsets")
        followers = [r for r in offsets.isr if r != offsets.leader]
        assert len(followers) == 2
        leader_log = cluster.servers[offsets.leader].store.log  # type: ignore[union-attr]
        end = leader_log.replica("__consumer_offsets", 0).log_end_offset
        cluster.hold(followers[0])
        done = threading.Event()
        committing = threading.Thread(target=lambda: (
            consumer.commit({tp: OffsetAndMetadata(7, "", -1)}), done.set()))  # fmt: skip
        committing.start()
        until(lambda: leader_log.replica("__consumer_offsets", 0).log_end_offset > end,
              "the commit on the coordinator's log")  # fmt: skip
        assert not done.is_set()  # one in-sync replica lacks it: no answer yet
        cluster.release()
        committing.join(WAIT)
        assert done.is_set()
        for r in (offsets.leader, *followers):  # every replica has the commit, whose batch
            log = cluster.servers[r].store.log  # type: ignore[union-attr]  # carries the epoch
            handle = log.replica("__consumer_offsets", 0)
            assert handle.log_end_offset > end
            assert handle.latest_epoch == offsets.leader_epoch  # so truncation goes by epochs
    finally:
        consumer.close()
    cluster.stop(offsets.leader)  # the coordinator fails over: the commit is kept
    until(lambda: cluster.state("__consumer_offsets").leader in followers, "a new coordinator")
    again = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id="g",
                          enable_auto_commit=False)  # fmt: skip
    try:
        assert until(lambda: again.committed(tp), "the committed offset") == 7
    finally:
        again.close()


def test_the_http_api_and_the_console_show_leaders_replicas_and_isr(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """A cluster broker's HTTP API describes each partition with its leader, leader epoch,
    replicas and in-sync replicas as the cluster's state has them (and its own high
    watermark), and the console's topic page shows the same columns."""
    import json
    import urllib.request

    cluster = make_cluster(http="127.0.0.1:0")
    cluster.create("t", partitions=3)
    produce(cluster.bootstrap, "t", [b"x"])
    for node, server in cluster.servers.items():
        assert server.http_server is not None
        url = server.http_server.url
        with urllib.request.urlopen(f"{url}/v1/topics/t", timeout=WAIT) as r:
            described = json.load(r)
        for entry in described["partitions"]:
            state = cluster.state("t", entry["partition"])
            assert (entry["leader"], entry["leader_epoch"], entry["isr"]) == (
                state.leader, state.leader_epoch, list(state.isr))  # fmt: skip
            assert sorted(entry["replicas"]) == [1, 2, 3]
            assert 0 <= entry["high_watermark"] <= entry["end_offset"]
        with urllib.request.urlopen(f"{url}/ui/topics/t", timeout=WAIT) as r:
            page = r.read().decode()
        leader0 = cluster.state("t", 0).leader
        assert '<td class="leader">' + str(leader0) + "</td>" in page.split(
            'data-partition="0"')[1].split("</tr>")[0], node  # fmt: skip


def test_a_replica_fetch_past_the_leaders_log_end_does_not_move_the_high_watermark(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """A Fetch with a replica's ID claiming an offset the leader does not have (a confused
    or lying peer) is OFFSET_OUT_OF_RANGE and does not count towards the high watermark; the
    same from a broker that is no replica is NOT_LEADER_OR_FOLLOWER."""
    import datetime

    from kafkaclients import KioWire
    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v12.request import FetchPartition, FetchTopic

    cluster = make_cluster(zk_session_timeout_ms=8000)
    cluster.create("t", rf=2)
    state = cluster.state("t")
    follower = next(r for r in state.isr if r != state.leader)
    cluster.hold(follower)  # the real follower stays where it is
    produce(cluster.bootstrap, "t", [b"a", b"b"], acks=1)
    handle = cluster.servers[state.leader].store.log.replica("t", 0)  # type: ignore[union-attr]
    before = handle.high_watermark
    outsider = next(n for n in (1, 2, 3) if n not in (state.leader, follower))
    wire = KioWire(cluster.servers[state.leader].address)
    try:
        for replica, offset, code in ((follower, 99, ErrorCode.offset_out_of_range),
                                      (outsider, 2, ErrorCode.not_leader_or_follower)):  # fmt: skip
            body = wire.call(1, 12, replica_id=replica, max_wait=datetime.timedelta(0),
                             min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                             session_epoch=-1, forgotten_topics_data=(), rack_id="",
                             topics=(FetchTopic(topic="t", partitions=(FetchPartition(
                                 partition=0, current_leader_epoch=state.leader_epoch,
                                 fetch_offset=offset, last_fetched_epoch=-1,
                                 log_start_offset=0, partition_max_bytes=1 << 20),)),))  # fmt: skip
            assert body.responses[0].partitions[0].error_code == code
            assert handle.high_watermark == before
    finally:
        wire.close()
        cluster.release()


def test_a_topic_past_the_partition_bounds_is_refused_before_the_cluster_has_it(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """CreateTopics on a cluster is bounded as on a node of one (the store's partition
    limits: POLICY_VIOLATION), before anything reaches ZooKeeper."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = make_cluster(max_partitions_per_topic=4)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    with pytest.raises(ck.KafkaException) as refused:
        admin.create_topics([NewTopic("wide", 10, 3)])["wide"].result(30)
    assert refused.value.args[0].code() == ck.KafkaError.POLICY_VIOLATION
    coordinator = cluster.any().replicas.coordinator  # type: ignore[union-attr]
    assert "wide" not in coordinator.topics()
    admin.create_topics([NewTopic("narrow", 4, 3)])["narrow"].result(30)
    assert "narrow" in coordinator.topics()


def test_acks_all_produces_of_one_connection_are_appended_while_the_first_waits(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Two acks=all produces sent back to back on one connection: the second is appended
    while the first waits for its replica (their replication overlaps), and both are
    answered in request order once the follower has them."""
    import datetime
    import io
    import socket
    import struct

    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafkaclients import recv_exactly
    from kio.schema.errors import ErrorCode
    from kio.schema.produce.v8.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.produce.v8.response import ProduceResponse
    from kio.schema.request_header.v1.header import RequestHeader
    from kio.schema.response_header.v0.header import ResponseHeader
    from kio.serial import entity_reader, entity_writer

    cluster = make_cluster(zk_session_timeout_ms=8000)
    cluster.create("t", rf=2)
    state = cluster.state("t")
    follower = next(r for r in state.isr if r != state.leader)
    cluster.hold(follower)

    def request(correlation: int, value: bytes) -> bytes:
        batch = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                          producer_id=-1, producer_epoch=-1,
                                          base_sequence=-1, batch_size=1 << 16)  # fmt: skip
        batch.append(0, timestamp=int(time.time() * 1000), key=None, value=value, headers=[])
        out = io.BytesIO()
        entity_writer(RequestHeader)(out, RequestHeader(
            request_api_key=0, request_api_version=8, correlation_id=correlation,
            client_id="pipeline"))  # fmt: skip
        entity_writer(ProduceRequest)(out, ProduceRequest(
            transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
            topic_data=(TopicProduceData(name="t", partition_data=(PartitionProduceData(
                index=0, records=bytes(batch.build())),)),)))  # fmt: skip
        return struct.pack(">i", out.tell()) + out.getvalue()

    handle = cluster.servers[state.leader].store.log.replica("t", 0)  # type: ignore[union-attr]
    host, port = cluster.servers[state.leader].address
    with socket.create_connection((host, port), timeout=WAIT) as sock:
        sock.sendall(request(1, b"first") + request(2, b"second"))
        until(lambda: handle.log_end_offset == 2, "both appended while the first waits",
              timeout=10)  # fmt: skip
        assert handle.high_watermark == 0  # neither is replicated: neither answered
        cluster.release()
        answers = []
        for _ in range(2):
            (size,) = struct.unpack(">i", recv_exactly(sock, 4))
            payload = recv_exactly(sock, size)
            header, used = entity_reader(ResponseHeader)(payload, 0)
            body = entity_reader(ProduceResponse)(payload, used)[0]
            part = body.responses[0].partition_responses[0]
            answers.append((header.correlation_id, part.error_code, part.base_offset))
    assert answers == [(1, ErrorCode.none, 0), (2, ErrorCode.none, 1)]
    assert cluster.log(follower, "t") == [(0, b"first"), (1, b"second")]


def pages(url: str, limit: int) -> list[dict[str, Any]]:
    """Every message of a query, page by page through its cursors (bounded)."""
    import urllib.parse

    got: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        query = {"limit": str(limit)} | ({"cursor": cursor} if cursor else {})
        sep = "&" if "?" in url else "?"
        answer = http_get(f"{url}{sep}{urllib.parse.urlencode(query)}")
        assert "messages" in answer, answer
        got += answer["messages"]
        cursor = answer["cursor"]
        if answer["complete"]:
            return got
    raise AssertionError(f"{url} did not end in 1000 pages")


def test_the_http_api_and_the_console_answer_for_the_whole_cluster(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Whichever broker is asked, the HTTP API answers from every partition's leader: a topic
    whose three partitions live on three different brokers (replication factor 1) is listed,
    read, searched in partition and in time order across pages, looked up by key and by
    message ID as one store holding it all would answer (brute force over what was
    produced), and the console's message page shows a message another broker holds."""
    import urllib.parse

    from kafka import KafkaProducer

    cluster = make_cluster(http="127.0.0.1:0")
    cluster.create("q", partitions=3, rf=1)
    leaders = {p: cluster.state("q", p).leader for p in range(3)}
    assert sorted(leaders.values()) == [1, 2, 3]  # each partition on its own broker
    produced: list[tuple[int, int, int, bytes, bytes]] = []  # (partition, offset, ts, key, value)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    try:
        base = 1_700_000_000_000
        futures = []
        for i in range(60):
            p, key = i % 3, b"k%d" % (i % 7)
            value = b"v%d %s" % (i, b"needle" if i % 4 == 0 else b"hay")
            ts = base + i * 1000 - p * 2500  # rising in each partition, interleaved across
            futures.append((p, ts, key, value, producer.send("q", value, key=key, partition=p,
                                                             timestamp_ms=ts)))  # fmt: skip
        for p, ts, key, value, f in futures:
            produced.append((p, f.get(WAIT).offset, ts, key, value))
    finally:
        producer.close()
    produced.sort()

    def places(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(m["partition"], m["offset"]) for m in messages]

    for node, server in cluster.servers.items():
        assert server.http_server is not None
        url = server.http_server.url
        described = http_get(f"{url}/v1/topics/q")
        ends = {e["partition"]: e["end_offset"] for e in described["partitions"]}
        assert ends == {p: sum(1 for x in produced if x[0] == p) for p in range(3)}, node
        listed = {t["topic"]: t for t in http_get(f"{url}/v1/topics")["topics"]}
        assert {e["partition"]: e["end_offset"] for e in listed["q"]["partitions"]} == ends
        for p in range(3):
            read = http_get(f"{url}/v1/topics/q/partitions/{p}/messages?offset=0&limit=1000")
            assert [m["value"].encode() for m in read["messages"]] == [
                x[4] for x in produced if x[0] == p], (node, p)  # fmt: skip
            assert read["end_offset"] == ends[p]
        found = pages(f"{url}/v1/topics/q/search?contains=needle", limit=4)
        assert places(found) == [(x[0], x[1]) for x in produced if b"needle" in x[4]], node
        timed = pages(f"{url}/v1/topics/q/by-time?order=time&start={base + 5000}", limit=7)
        expected = sorted((x[2], x[0], x[1]) for x in produced if x[2] >= base + 5000)
        assert len(expected) > 40
        assert [(m["timestamp"], m["partition"], m["offset"]) for m in timed] == expected, node
        keyed = pages(f"{url}/v1/topics/q/by-key?key=k3", limit=2)
        assert places(keyed) == [(x[0], x[1]) for x in produced if x[3] == b"k3"], node
        for p, offset, _ts, _key, value in produced[::11]:
            one = http_get(f"{url}/v1/topics/q/partitions/{p}/offsets/{offset}")["message"]
            assert one["value"].encode() == value
            by_id = http_get(f"{url}/v1/messages/{urllib.parse.quote(one['msg_id'])}")
            assert by_id["message"] == one
        past = http_get(f"{url}/v1/topics/q/partitions/0/offsets/{ends[0]}")
        assert past["status"] == 404 and past["error"] == "MessageNotFoundError", past
        remote = next(p for p, leader in leaders.items() if leader != node)
        offset = next(x[1] for x in produced if x[0] == remote)
        import urllib.request

        with urllib.request.urlopen(f"{url}/ui/topics/q/partitions/{remote}/offsets/{offset}",
                                    timeout=WAIT) as r:  # fmt: skip
            page = r.read().decode()
        value = next(x[4] for x in produced if x[:2] == (remote, offset)).decode()
        assert value in page, node
        with urllib.request.urlopen(f"{url}/ui/", timeout=WAIT) as r:  # partitions held elsewhere
            assert r.status == 200 and ">q<" in r.read().decode().replace(" ", ""), node


def test_the_http_api_shows_no_record_past_the_high_watermark(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Records the leader has but its in-sync followers do not (acks=1, the followers held)
    are not committed: asked through any broker, a read, a message lookup, a search and the
    end offset stop at the high watermark; once the followers catch up, all of it shows."""
    cluster = make_cluster(http="127.0.0.1:0", replica_lag_time_max_ms=60_000)
    cluster.create("h", partitions=1, rf=3)
    produce(cluster.bootstrap, "h", [b"c%d" % i for i in range(5)])
    leader = cluster.state("h").leader
    followers = [n for n in cluster.servers if n != leader]
    cluster.hold(*followers)
    produce(cluster.bootstrap, "h", [b"u%d" % i for i in range(4)], acks=1)
    assert len(cluster.log(leader, "h")) == 9  # the leader has them
    for node, server in cluster.servers.items():
        assert server.http_server is not None
        url = server.http_server.url
        read = http_get(f"{url}/v1/topics/h/partitions/0/messages?offset=0&limit=100")
        assert [m["value"] for m in read["messages"]] == [f"c{i}" for i in range(5)], node
        assert read["end_offset"] == 5
        assert http_get(f"{url}/v1/topics/h/partitions/0/offsets/6")["status"] == 404
        found = http_get(f"{url}/v1/topics/h/search?contains=u&limit=100")
        assert found["messages"] == [] and found["complete"], (node, found)
        assert http_get(f"{url}/v1/topics/h")["partitions"][0]["end_offset"] == 5
    cluster.release()
    url = cluster.servers[followers[0]].http_server.url  # type: ignore[union-attr]
    until(lambda: http_get(f"{url}/v1/topics/h")["partitions"][0]["end_offset"] == 9,
          "the high watermark past the records the followers now have")  # fmt: skip
    found = http_get(f"{url}/v1/topics/h/search?contains=u&limit=100")
    assert [m["value"] for m in found["messages"]] == [f"u{i}" for i in range(4)]


def test_the_http_api_finds_unique_ids_and_group_lag_across_the_cluster_and_503s_leaderless(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Through any broker: a unique ID is found in whichever broker's partition holds it, a
    consumer group's committed offsets and lag come from its coordinator against the
    leaders' high watermarks; a partition whose only replica stopped answers 503."""
    import uuid

    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    cluster = make_cluster(http="127.0.0.1:0")
    cluster.create("u", partitions=3, rf=1)
    uids = [uuid.uuid4() for _ in range(6)]
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    try:
        for i, uid in enumerate(uids):
            producer.send("u", b"m%d" % i, partition=i % 3, headers=[("uid", uid.bytes)])
        producer.flush(WAIT)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id="g",
                             enable_auto_commit=False)  # fmt: skip
    try:
        consumer.assign([TopicPartition("u", p) for p in range(3)])
        consumer.seek(TopicPartition("u", 0), 1)
        consumer.seek(TopicPartition("u", 1), 0)
        consumer.seek(TopicPartition("u", 2), 2)
        consumer.commit()  # committed 1, 0, 2 of 2 records each
    finally:
        consumer.close()
    for node, server in cluster.servers.items():
        url = server.http_server.url  # type: ignore[union-attr]
        for i, uid in enumerate(uids):
            found = http_get(f"{url}/v1/unique-ids/{uid}")
            assert [(m["partition"], m["value"]) for m in found["messages"]] == [
                (i % 3, f"m{i}")], (node, found)  # fmt: skip
        group = http_get(f"{url}/v1/groups/g")
        lags = {p["partition"]: (p["committed"], p["end_offset"], p["lag"])
                for p in group["partitions"]}  # fmt: skip
        assert lags == {0: (1, 2, 1), 1: (0, 2, 2), 2: (2, 2, 0)}, (node, group)
        assert group["lag"] == 3
    gone = cluster.state("u", 0).leader
    cluster.stop(gone)
    until(lambda: cluster.state("u", 0).leader == -1, "u-0 without a leader")
    for node, server in cluster.servers.items():
        url = server.http_server.url  # type: ignore[union-attr]
        until(lambda url=url: http_get(f"{url}/v1/topics/u/partitions/0/messages").get("status")
              == 503, f"broker {node} to answer 503 for u-0")  # fmt: skip
        refused = http_get(f"{url}/v1/topics/u/search?contains=m")
        assert refused["status"] == 503 and "u-0" in refused["message"], refused
        other = next(p for p in (1, 2) if cluster.state("u", p).leader in cluster.servers)
        read = http_get(f"{url}/v1/topics/u/partitions/{other}/messages")
        assert len(read["messages"]) == 2


def test_a_replica_refuses_its_stores_own_appends_unless_it_leads(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """The store's own appends (an embedder's, a broker's internal writers') to a partition
    another broker leads are refused: only what the follower copies from its leader enters
    its replica, so the replicas never diverge. On the leader they are appended (with its
    epoch) and replicated."""
    from mqcore.errors import NotLeaderOrFollowerError

    cluster = make_cluster()
    cluster.create("own", partitions=1, rf=3)
    produce(cluster.bootstrap, "own", [b"a", b"b"])
    leader = cluster.state("own").leader
    for node, server in cluster.servers.items():
        assert server.store is not None
        if node != leader:
            with pytest.raises(NotLeaderOrFollowerError, match="own-0"):
                server.store.append("own", b"stray", partition=0)
    leading = cluster.servers[leader].store
    assert leading is not None
    leading.append("own", b"c", partition=0)
    for node in cluster.servers:
        until(lambda node=node: cluster.log(node, "own") == [(0, b"a"), (1, b"b"), (2, b"c")],
              f"broker {node}'s replica to be the leader's")  # fmt: skip


def test_racks_given_to_the_brokers_spread_each_partitions_replicas_and_show_in_metadata(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Brokers started with racks (Kafka's broker.rack): every partition of a topic with two
    replicas has one on each rack (two brokers share rack "a"), and Metadata names each
    broker's rack, as a Kafka client reads it."""
    from kafka import KafkaAdminClient

    cluster = make_cluster(racks={1: "a", 2: "a", 3: "b"})
    cluster.create("racked", partitions=6, rf=2)
    replicas = cluster.any().replicas
    assert replicas is not None
    for p, meta in replicas.partitions("racked").items():
        assert sorted(cluster.racks[b] for b in meta.replicas) == ["a", "b"], (p, meta)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        described = admin.describe_cluster()
    finally:
        admin.close()
    brokers = {b["broker_id"]: b["rack"] for b in described["brokers"]}
    assert brokers == {1: "a", 2: "a", 3: "b"}, described


def test_a_follower_waiting_for_its_leaders_epoch_answer_still_takes_a_new_role(
    make_cluster: Callable[..., InProcessCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose OffsetForLeaderEpoch question hangs (a leader that stopped answering
    without closing the connection) does not hold its partition meanwhile: when the cluster
    names it leader, it leads at once, the question still unanswered."""
    import threading

    answer = threading.Event()
    asked = threading.Event()
    real = interbroker.WireLeaderClient.end_offset_for_epoch

    def hang(self: Any, replica_id: int, *args: Any) -> Any:
        asked.set()
        answer.wait(WAIT)
        return real(self, replica_id, *args)

    cluster = make_cluster()
    cluster.create("r", partitions=1, rf=3)
    produce(cluster.bootstrap, "r", [b"a"])
    first = cluster.state("r").leader
    monkeypatch.setattr(interbroker.WireLeaderClient, "end_offset_for_epoch", hang)
    try:
        cluster.stop(first)
        second = until(lambda: (s := cluster.state("r")).leader not in (first, -1) and s.leader,
                       "a second leader")  # fmt: skip
        assert asked.wait(WAIT), "the last follower did not ask its new leader"
        last = next(n for n in cluster.servers if n != second)
        cluster.stop(second)
        server = cluster.servers[last]
        assert server.replicas is not None
        until(lambda: cluster.state("r").leader == last, "the last broker named leader")

        def leads() -> bool:
            try:
                server.replicas.leader_epoch("r", 0)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - not leading yet
                return False
            return True

        until(leads, "the last broker to lead while its question hangs", timeout=15)
        assert not answer.is_set()
    finally:
        answer.set()


def test_a_topic_deleted_on_a_cluster_is_gone_from_every_replica_even_one_that_was_down(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """DeleteTopics on a cluster (kafka-python's admin): every broker deletes its replicas and
    the controller the topic's znodes, so a topic made again under the name starts empty on
    every replica. With a replica's broker down the deletion waits for it (the request times
    out, the topic stays marked and cannot be made again); once it returns it deletes its old
    copy, and the topic made again holds none of the old records there either."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    cluster = make_cluster()
    cluster.create("d", partitions=2, rf=3)
    produce(cluster.bootstrap, "d", [b"old%d" % i for i in range(5)])

    def zk() -> Any:  # a live broker's session (one of them goes down below)
        return cluster.any().replicas.coordinator  # type: ignore[union-attr]

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=60_000)
    try:
        admin.delete_topics(["d"], timeout_ms=30_000)
        assert "d" not in zk().topics() and "d" not in zk().pending_deletions()
        for node, server in cluster.servers.items():
            assert server.store is not None and not server.store.log.has_topic("d"), node
            until(lambda s=server: not s.replicas.has_topic("d"), f"broker {node} to forget d")  # type: ignore[union-attr]
        cluster.create("d", partitions=1, rf=3)
        produce(cluster.bootstrap, "d", [b"new"])
        for node in cluster.servers:
            until(lambda node=node: cluster.log(node, "d") == [(0, b"new")],
                  f"broker {node}'s replica of the new d")  # fmt: skip

        down = next(n for n in cluster.servers if n != cluster.state("d").leader)
        cluster.stop(down)
        until(lambda: cluster.any().replicas.controller_id() not in (down, -1),  # type: ignore[union-attr]
              "a live controller")  # fmt: skip
        admin.close()
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=60_000)
        with pytest.raises(KafkaError) as timed_out:  # the deletion waits for `down`
            admin.delete_topics(["d"], timeout_ms=2_000)
        assert "RequestTimedOut" in repr(timed_out.value), timed_out.value
        assert "d" in zk().pending_deletions() and "d" in zk().topics()
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("d", 1, 3)])
        with pytest.raises(KafkaError, match="marked for deletion"):  # Kafka refuses it too
            admin.create_partitions({"d": NewPartitions(2)})
        cluster.start(down)
        until(lambda: "d" not in zk().topics() and "d" not in zk().pending_deletions(),
              "the deletion to finish once the broker is back")  # fmt: skip
        store = cluster.servers[down].store
        assert store is not None and not store.log.has_topic("d")
    finally:
        admin.close()
    cluster.create("d", partitions=1, rf=3)
    produce(cluster.bootstrap, "d", [b"newer"])
    until(lambda: cluster.log(down, "d") == [(0, b"newer")], "the returned broker's new replica")


def test_delete_records_on_a_cluster_moves_the_log_start_of_every_replica(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """DeleteRecords (confluent-kafka's admin, routed to the leader) moves the leader's log
    start, and is answered once each in-sync follower's has followed (on its fetches), as
    Kafka's DelayedDeleteRecords; a consumer from the earliest offset starts there; an offset
    past the high watermark is refused."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    cluster = make_cluster()
    cluster.create("dr", partitions=1, rf=3)
    produce(cluster.bootstrap, "dr", [b"m%d" % i for i in range(10)])
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    done = next(iter(admin.delete_records([TopicPartition("dr", 0, 4)]).values())).result(30)
    assert done.low_watermark == 4
    for node, server in cluster.servers.items():  # answered once every in-sync replica's
        store = server.store  # log start is there: no failover can bring them back
        assert store is not None and store.start_offset("dr", 0) == 4, node
    assert consume(cluster.bootstrap, "dr", 6) == [b"m%d" % i for i in range(4, 10)]
    with pytest.raises(ck.KafkaException) as refused:
        next(iter(admin.delete_records([TopicPartition("dr", 0, 11)]).values())).result(30)
    assert refused.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE


def test_replica_assignments_given_by_the_client_are_taken_and_checked(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """CreateTopics and CreatePartitions with explicit replica assignments (confluent-kafka):
    the partitions get exactly those replicas, the first leading; an assignment naming a
    broker the cluster does not have, or replication factors that differ, is refused with
    INVALID_REPLICA_ASSIGNMENT and nothing is written."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    cluster = make_cluster()
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("a", 2, replica_assignment=[[2, 3], [3, 1]])])["a"].result(30)
    coordinator = cluster.any().replicas.coordinator  # type: ignore[union-attr]
    assert coordinator.assignment("a") == {0: (2, 3), 1: (3, 1)}
    until(lambda: [cluster.state("a", p).leader for p in (0, 1)] == [2, 3], "preferred leaders")
    admin.create_partitions([NewPartitions("a", 3, replica_assignment=[[1, 2]])])["a"].result(30)
    assert coordinator.assignment("a")[2] == (1, 2)
    until(lambda: cluster.state("a", 2).leader == 1, "partition 2 led by broker 1")
    refusals = [
        admin.create_topics([NewTopic("b", 1, replica_assignment=[[1, 9]])])["b"],
        admin.create_topics([NewTopic("c", 2, replica_assignment=[[1, 2], [3]])])["c"],
        admin.create_partitions([NewPartitions("a", 4, replica_assignment=[[1]])])["a"],
    ]
    for refused in refusals:
        with pytest.raises(ck.KafkaException) as e:
            refused.result(30)
        assert e.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT, e.value
    assert "b" not in coordinator.topics() and "c" not in coordinator.topics()
    assert len(coordinator.assignment("a")) == 3


def test_a_broker_forwards_a_bounded_number_of_requests_at_once(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """With every forwarding slot taken (brokers flooded with requests for each other's
    partitions), a request that needs another broker is answered 503 with Retry-After in
    bounded time instead of holding a thread, while a partition led here is still read;
    once a slot is free, forwarding works again."""
    import time as clock

    cluster = make_cluster(http="127.0.0.1:0")
    cluster.create("f", partitions=3, rf=1)
    produce_to = {p: cluster.state("f", p).leader for p in range(3)}
    node, server = next(iter(cluster.servers.items()))
    assert server.http_server is not None
    url, view = server.http_server.url, server.http_server.app.state.cluster
    local = next(p for p, leader in produce_to.items() if leader == node)
    remote = next(p for p, leader in produce_to.items() if leader != node)
    taken = 0
    while view.forwarding.acquire(blocking=False):
        taken += 1
    try:
        began = clock.monotonic()
        refused = http_get(f"{url}/v1/topics/f/partitions/{remote}/messages")
        assert refused["status"] == 503 and "forwarding" in refused["message"], refused
        assert clock.monotonic() - began < 10
        assert "messages" in http_get(f"{url}/v1/topics/f/partitions/{local}/messages")
    finally:
        for _ in range(taken):
            view.forwarding.release()
    assert taken >= 1
    assert "messages" in http_get(f"{url}/v1/topics/f/partitions/{remote}/messages")
