"""Kafka's transactions on three brokers (issue 34 on issue 33's cluster; server/txncluster.py):
the transaction coordinator is the leader of the replicated `__transaction_state-0`, markers
reach every partition's leader (its own or another broker's, through WriteTxnMarkers) and
are replicated like any batch, a transactional produce that would begin a transaction is
verified with the coordinator from another broker (KIP-890), and the coordinator's loss
leaves its state to the next one. Unmodified clients (confluent-kafka/librdkafka) against
brokers of this process on a real ZooKeeper (clusterinproc.py).
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clusterinproc import InProcessCluster
from clusterprocs import process_cluster, until
from kafkaclients import KioWire
from test_server_transactions import confluent_producer, consume_all, values

from mqcore.server.transactions import STATE_TOPIC

WAIT = 60.0


def coordinator(cluster: InProcessCluster) -> int:
    """The broker leading the transaction state (made by the first transactional client)."""
    return int(until(lambda: (s := cluster.state(STATE_TOPIC, 0)) is not None and s.leader > 0
                     and s.leader, "a transaction coordinator"))  # fmt: skip


def spread(cluster: InProcessCluster, topic: str) -> None:
    """`topic` with three partitions, each led by another broker, each on every broker."""
    cluster.create(topic, partitions=3, rf=3)
    until(lambda: {cluster.state(topic, p).leader for p in range(3)} == {1, 2, 3},
          "one leader per broker")  # fmt: skip


def replicas_agree(cluster: InProcessCluster, topic: str, partitions: int) -> None:
    """Every broker's replica holds the same records and the same last stable offset (the
    markers were replicated as batches)."""

    def same(p: int) -> bool:
        seen = set()
        for s in cluster.servers.values():
            assert s.store is not None
            seen.add((s.store.end_offset(topic, p), s.store.last_stable_offset(topic, p),
                      tuple(m.value for m in s.store.read(
                          topic, p, 0, 10_000, isolation_level="read_committed"))))  # fmt: skip
        return len(seen) == 1

    for p in range(partitions):
        until(functools.partial(same, p), f"every replica of {topic}-{p} alike")


def test_commit_and_abort_over_partitions_led_by_three_brokers(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    cluster = make_cluster()
    spread(cluster, "out")
    p = confluent_producer(cluster.bootstrap, "tx")
    node = coordinator(cluster)
    assert {cluster.state(STATE_TOPIC, 0).leader} == {node}
    assert len(cluster.state(STATE_TOPIC, 0).isr) == 3  # the state replicated to every broker
    p.begin_transaction()
    for i in range(30):
        p.produce("out", b"kept-%d" % i, partition=i % 3)
    p.commit_transaction(WAIT)
    p.begin_transaction()
    for i in range(15):
        p.produce("out", b"dropped-%d" % i, partition=i % 3)
    p.flush(WAIT)
    p.abort_transaction(WAIT)
    p.begin_transaction()
    p.produce("out", b"after", partition=1)
    p.commit_transaction(WAIT)
    kept = sorted([b"kept-%d" % i for i in range(30)] + [b"after"])
    dropped = sorted(b"dropped-%d" % i for i in range(15))
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_committed")) == kept
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_uncommitted")) == sorted(
        kept + dropped)  # fmt: skip
    replicas_agree(cluster, "out", 3)
    for s in cluster.servers.values():  # the markers are in every replica: nothing left open
        assert s.store is not None
        for part in range(3):
            assert s.store.last_stable_offset("out", part) == s.store.end_offset("out", part)


def test_a_new_session_fences_the_zombie_across_brokers(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    from confluent_kafka import KafkaException

    cluster = make_cluster()
    spread(cluster, "out")
    zombie = confluent_producer(cluster.bootstrap, "tx")
    zombie.begin_transaction()
    for part in range(3):
        zombie.produce("out", b"zombie", partition=part)
    zombie.flush(WAIT)
    fresh = confluent_producer(cluster.bootstrap, "tx")  # aborts the zombie's everywhere
    fresh.begin_transaction()
    fresh.produce("out", b"fresh", partition=2)
    fresh.commit_transaction(WAIT)
    with pytest.raises(KafkaException) as refused:
        zombie.produce("out", b"late", partition=0)
        zombie.commit_transaction(WAIT)
    assert refused.value.args[0].fatal() or "fenced" in str(refused.value).lower()
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_committed")) == [b"fresh"]
    replicas_agree(cluster, "out", 3)


def test_kafka_python_and_aiokafka_transactions_over_three_brokers(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """kafka-python's and aiokafka's transactional producers commit and abort over
    partitions three brokers lead (each client finds the coordinator itself)."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    cluster = make_cluster()
    spread(cluster, "out")
    kp = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id="kp")
    try:
        kp.init_transactions()
        kp.begin_transaction()
        for part in range(3):
            kp.send("out", b"kp-kept-%d" % part, partition=part)
        kp.commit_transaction()
        kp.begin_transaction()
        kp.send("out", b"kp-dropped", partition=1)
        kp.flush()
        kp.abort_transaction()
    finally:
        kp.close()

    async def aiokafka() -> None:
        p = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id="ak")
        await p.start()
        try:
            async with p.transaction():
                for part in range(3):
                    await p.send_and_wait("out", b"ak-kept-%d" % part, partition=part)
            await p.begin_transaction()
            await p.send_and_wait("out", b"ak-dropped", partition=2)
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(aiokafka())
    kept = sorted(b"%s-kept-%d" % (c, part) for c in (b"kp", b"ak") for part in range(3))
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_committed")) == kept
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_uncommitted")) == sorted(
        [*kept, b"kp-dropped", b"ak-dropped"])  # fmt: skip
    replicas_agree(cluster, "out", 3)


def test_a_transaction_past_its_timeout_is_aborted_by_the_cluster_coordinator(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """The coordinator aborts a transaction older than transaction.timeout.ms at a new
    epoch: its markers reach the partitions other brokers lead, every replica's last stable
    offset moves past them, a read_committed consumer sees none of it."""
    cluster = make_cluster()
    spread(cluster, "out")
    p = confluent_producer(cluster.bootstrap, "slow", **{"transaction.timeout.ms": 1500})
    p.begin_transaction()
    for part in range(3):
        p.produce("out", b"late", partition=part)
    p.flush(WAIT)

    def all_ended() -> bool:
        for s in cluster.servers.values():
            assert s.store is not None
            for part in range(3):
                if s.store.last_stable_offset("out", part) != s.store.end_offset("out", part):
                    return False
                if s.store.end_offset("out", part) != 2:  # the record and the ABORT marker
                    return False
        return True

    until(all_ended, "the coordinator's abort on every replica")
    assert consume_all(cluster.bootstrap, "out", 3, "read_committed") == []
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_uncommitted")) == [b"late"] * 3


def test_a_produce_that_would_begin_an_ended_transaction_is_refused_by_another_leader(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """KIP-890 on a cluster: a transactional batch sent to a partition's leader, which is not
    the coordinator, for a partition the producer's transaction did not add, is refused with
    INVALID_TXN_STATE after the leader asked the coordinator (AddPartitionsToTxn v4); once
    added, the same batch is taken."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.index import load_payload_module
    from kio.schema.errors import ErrorCode
    from kio.static.constants import EntityType

    cluster = make_cluster()
    spread(cluster, "out")
    confluent_producer(cluster.bootstrap, "other")  # makes the state topic: a coordinator
    node = coordinator(cluster)
    part = next(p for p in range(3) if cluster.state("out", p).leader != node)
    leader = cluster.servers[cluster.state("out", part).leader]
    to_coordinator = KioWire(("127.0.0.1", cluster.servers[node].port))
    to_leader = KioWire(("127.0.0.1", leader.port))
    try:
        init = to_coordinator.call(22, 4, transactional_id="raw",
                                   transaction_timeout=datetime.timedelta(seconds=60),
                                   producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                      producer_id=pid, producer_epoch=epoch, base_sequence=0,
                                      batch_size=1 << 20)  # fmt: skip
        b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"x", headers=[])
        records = bytes(b.build())
        m = load_payload_module(0, 9, EntityType.request)

        def produce() -> Any:
            data = m.PartitionProduceData(index=part, records=records)
            topic = m.TopicProduceData(name="out", partition_data=(data,))
            answer = to_leader.call(0, 9, transactional_id="raw", acks=-1,
                                    timeout=datetime.timedelta(seconds=10),
                                    topic_data=(topic,))  # fmt: skip
            return answer.responses[0].partition_responses[0].error_code

        assert produce() == ErrorCode.invalid_txn_state
        assert leader.store is not None and leader.store.end_offset("out", part) == 0
        a = load_payload_module(24, 3, EntityType.request)
        added = to_coordinator.call(24, 3, v3_and_below_transactional_id="raw",
                                    v3_and_below_producer_id=pid,
                                    v3_and_below_producer_epoch=epoch,
                                    v3_and_below_topics=(a.AddPartitionsToTxnTopic(
                                        name="out", partitions=(part,)),))  # fmt: skip
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0] \
            .partition_error_code == ErrorCode.none  # fmt: skip
        assert produce() == ErrorCode.none
        assert leader.store.end_offset("out", part) == 1
    finally:
        to_coordinator.close()
        to_leader.close()


def test_the_coordinators_loss_leaves_its_transactions_to_the_next(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """A transaction open when its coordinator's broker stops commits through the next
    coordinator (the state's new leader, which read the replicated state); the committed
    records are all there, read_committed, once."""
    cluster = make_cluster()
    spread(cluster, "out")
    p = confluent_producer(cluster.bootstrap, "tx", **{"transaction.timeout.ms": 60_000})
    p.begin_transaction()
    for i in range(9):
        p.produce("out", b"first-%d" % i, partition=i % 3)
    p.commit_transaction(WAIT)
    p.begin_transaction()
    for i in range(9):
        p.produce("out", b"second-%d" % i, partition=i % 3)
    p.flush(WAIT)
    old = coordinator(cluster)
    cluster.stop(old)
    until(lambda: cluster.state(STATE_TOPIC, 0).leader not in (-1, old),
          "a new transaction coordinator")  # fmt: skip
    p.commit_transaction(WAIT)
    want = sorted([b"first-%d" % i for i in range(9)] + [b"second-%d" % i for i in range(9)])
    assert values(consume_all(cluster.bootstrap, "out", 3, "read_committed")) == want
    cluster.start(old)  # it rejoins as a follower and catches up, markers included
    replicas_agree(cluster, "out", 3)


def test_consume_transform_produce_with_the_groups_coordinator_on_another_broker(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """send_offsets_to_transaction on a cluster whose group coordinator (broker 1, leader of
    `__consumer_offsets-0`) is not the transaction coordinator (broker 2): a copier's
    transactions commit the group's offsets with the records (through WriteTxnMarkers to
    broker 1), an aborted one's offsets are dropped; the output holds every input once, the
    group's committed offsets are the input's ends, on every replica."""
    from confluent_kafka import Consumer, TopicPartition

    from mqcore.server.broker import OFFSETS_CONFIGS
    from mqcore.server.txncluster import STATE_CONFIGS

    cluster = make_cluster()
    replicas = cluster.any().replicas
    assert replicas is not None
    replicas.create_topic("__consumer_offsets", 1, 3, {**OFFSETS_CONFIGS,
                          "min.insync.replicas": "2"}, assignment={0: [1, 2, 3]})  # fmt: skip
    replicas.create_topic(STATE_TOPIC, 1, 3, {**STATE_CONFIGS, "min.insync.replicas": "2"},
                          assignment={0: [2, 3, 1]})  # fmt: skip
    spread(cluster, "in")
    spread(cluster, "out")
    until(lambda: cluster.state("__consumer_offsets", 0).leader == 1, "groups on broker 1")
    assert coordinator(cluster) == 2
    from confluent_kafka import Producer

    feeder = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(300):
        feeder.produce("in", b"n-%d" % i, partition=i % 3)
    assert feeder.flush(WAIT) == 0
    producer = confluent_producer(cluster.bootstrap, "copier-tx")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "copier",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        consumer.subscribe(["in"])
        copied, aborted_once = 0, False
        deadline = time.monotonic() + WAIT
        while copied < 300 and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(50, 0.5) if m.error() is None]
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                producer.produce("out", m.value().upper(), partition=m.partition())
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(),
                                                 WAIT)  # fmt: skip
            if not aborted_once:  # this one's records and offsets must not count
                producer.abort_transaction(WAIT)
                aborted_once = True
                for tp in consumer.committed(consumer.assignment(), WAIT):
                    consumer.seek(TopicPartition(tp.topic, tp.partition,
                                                 max(tp.offset, 0)))  # fmt: skip
                continue
            producer.commit_transaction(WAIT)
            copied += len(batch)
        assert copied == 300
        committed = consumer.committed([TopicPartition("in", p) for p in range(3)], WAIT)
        assert sorted(tp.offset for tp in committed) == [100, 100, 100]
    finally:
        consumer.close()
    got = values(consume_all(cluster.bootstrap, "out", 3, "read_committed"))
    assert got == sorted(b"N-%d" % i for i in range(300))  # each once, the aborted copy not
    for s in cluster.servers.values():  # the offsets are in every replica's log
        until(lambda s=s: s.store.end_offset("__consumer_offsets", 0)
              == cluster.servers[1].store.end_offset("__consumer_offsets", 0),
              "the offsets replicated")  # fmt: skip


def test_a_state_change_is_answered_only_once_the_replicas_have_it(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """The coordinator answers a transactional ID's change only once the in-sync replicas of
    `__transaction_state` have it: with its followers held back, InitProducerId is refused
    (COORDINATOR_NOT_AVAILABLE, the client retries), and answered once they fetch again."""
    from kio.schema.errors import ErrorCode

    cluster = make_cluster()
    confluent_producer(cluster.bootstrap, "first")  # makes the state topic
    node = coordinator(cluster)
    followers = [b for b in cluster.state(STATE_TOPIC, 0).isr if b != node]
    assert len(followers) == 2
    wire = KioWire(("127.0.0.1", cluster.servers[node].port))
    try:

        def init() -> Any:
            return wire.call(22, 4, transactional_id="held",
                             transaction_timeout=datetime.timedelta(seconds=60),
                             producer_id=-1, producer_epoch=-1)  # fmt: skip

        cluster.hold(*followers)
        refused = init()
        assert refused.error_code in (ErrorCode.coordinator_not_available,
                                      ErrorCode.not_coordinator), refused  # fmt: skip
        cluster.release()
        answered = until(lambda: (r := init()).error_code == ErrorCode.none and r,
                         "InitProducerId answered once the followers fetch")  # fmt: skip
        assert answered.producer_id >= 0
    finally:
        wire.close()


@pytest.mark.slow
def test_consume_transform_produce_is_exactly_once_on_three_brokers_while_processes_die(
    zk: Any, tmp_path: Path
) -> None:
    """Issue 34's exactly-once proof on issue 33's cluster: three `mqcore serve` processes,
    `in` and `out` replicated three times (min.insync.replicas 2); the copier of
    test_server_transactions.py (confluent-kafka: read_committed consumer, transactional
    producer, send_offsets_to_transaction) copies 15,000 numbered messages while the test
    SIGKILLs, 8 times at random moments, the copier's process or a broker (the transaction
    coordinator's, the groups' coordinator's or another), restarting what it killed: `out`
    read read_committed holds every input exactly once, in order per partition."""
    import random

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from test_server_transactions import Copier, stop

    rng = random.Random(3334)
    partitions, total = 2, 15_000
    flags = ["--zk-session-timeout-ms", "4000"]
    with process_cluster(zk, tmp_path, 3, flags, links=False) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        made = admin.create_topics([NewTopic(t, partitions, 3, config={
            "min.insync.replicas": "2"}) for t in ("in", "out")])  # fmt: skip
        for f in made.values():
            f.result(WAIT)
        feeder = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
        for n in range(total):
            feeder.produce("in", b"%06d" % n, partition=n % partitions)
            if n % 5000 == 0:
                feeder.poll(0)
        assert feeder.flush(WAIT) == 0
        copier = Copier(cluster.bootstrap, partitions, tmp_path / "copier.log")
        kills: dict[str, int] = {"copier": 0, "broker": 0}
        try:
            for _ in range(8):
                before = copier.committed()
                until(lambda before=before: before >= total or copier.progressed(before),
                      "the copier to commit again", timeout=180, cluster=cluster)  # fmt: skip
                time.sleep(rng.uniform(0, 0.4))
                victim = rng.choice(["copier", "broker", "broker"])
                kills[victim] += 1
                if victim == "copier":
                    copier.kill()
                    continue
                node = rng.choice([cluster.state(STATE_TOPIC, 0).leader,
                                   cluster.state("__consumer_offsets", 0).leader,
                                   rng.choice([1, 2, 3])])  # fmt: skip
                node = node if node in cluster.brokers else 1
                cluster.brokers[node].kill()
                until(lambda node=node: all(cluster.state(t, 0).leader not in (node, -1)
                                            for t in (STATE_TOPIC, "__consumer_offsets")),
                      "the coordinators to move", cluster=cluster)  # fmt: skip
                cluster.brokers[node].start()
            until(lambda: copier.progressed(total - 1) and copier.committed() >= total,
                  "every input message copied", timeout=300, cluster=cluster)  # fmt: skip
        finally:
            stop(copier.proc, kill=True)
        assert kills["copier"] >= 2 and kills["broker"] >= 3, kills
        got = consume_all(cluster.bootstrap, "out", partitions, "read_committed")
    for p in range(partitions):
        out = [v for part, _, v in sorted(got) if part == p]
        want = [b"copy-%06d" % n for n in range(p, total, partitions)]
        assert out == want, (p, len(out), len(want), len(out) - len(set(out)),
                             len(set(want) - set(out)))  # fmt: skip


def test_the_state_topic_is_made_by_the_first_transactional_client(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Regression: each broker's timeout task made `__transaction_state` at its start, when
    too few brokers may be up to give it three replicas; it is made by the first client's
    FindCoordinator, replicated on every broker."""
    cluster = make_cluster()
    for s in cluster.servers.values():  # what each broker's timeout task does every second
        assert s.broker is not None and s.broker.txn_apis.coordinator is not None
        assert s.broker.txn_apis.coordinator.expire() == []
    replicas = cluster.any().replicas
    assert replicas is not None and not replicas.has_topic(STATE_TOPIC)
    confluent_producer(cluster.bootstrap, "first")
    assert replicas.has_topic(STATE_TOPIC)
    assert len(replicas.partitions(STATE_TOPIC)[0].replicas) == 3


def test_write_txn_markers_is_bounded_in_size_and_time(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """WriteTxnMarkers (which any client of a cluster without ACLs may send, as Kafka's) holds a
    request thread REPLICATION_TIMEOUT at most: the markers of three partitions whose followers
    are held back are answered together at that deadline (not one timeout after another), and
    a request naming more than MAX_MARKER_PARTITIONS partitions is refused whole."""
    from kio.index import load_payload_module
    from kio.schema.errors import ErrorCode
    from kio.static.constants import EntityType

    from mqcore.server.txnapis import MAX_MARKER_PARTITIONS
    from mqcore.server.txncluster import REPLICATION_TIMEOUT

    cluster = make_cluster()
    replicas = cluster.any().replicas
    assert replicas is not None
    # three partitions led by broker 1, every replica needed (min.insync.replicas 3): with the
    # followers held back no marker can be answered as written
    replicas.create_topic("held", 3, 3, {"min.insync.replicas": "3"},
                          assignment={p: [1, 2, 3] for p in range(3)})  # fmt: skip
    for p in range(3):
        until(lambda p=p: cluster.state("held", p).leader == 1, "broker 1 to lead")
    w = load_payload_module(27, 1, EntityType.request)
    wire = KioWire(("127.0.0.1", cluster.servers[1].port))
    try:

        def markers(partitions: list[int]) -> Any:
            topic = w.WritableTxnMarkerTopic(name="held", partition_indexes=tuple(partitions))
            marker = w.WritableTxnMarker(producer_id=77, producer_epoch=0,
                                         transaction_result=False, coordinator_epoch=0,
                                         topics=(topic,))  # fmt: skip
            return wire.call(27, 1, markers=(marker,))

        too_many = markers(list(range(MAX_MARKER_PARTITIONS + 1)))
        codes = {p.error_code for p in too_many.markers[0].topics[0].partitions}
        assert codes == {ErrorCode.invalid_request}
        cluster.hold(2, 3)
        started = time.monotonic()
        answer = markers([0, 1, 2])
        took = time.monotonic() - started
        cluster.release()
        assert all(p.error_code != ErrorCode.none for p in answer.markers[0].topics[0].partitions)
        # one shared deadline: one timeout for the three, not one after another (three)
        assert took < 2 * REPLICATION_TIMEOUT, took
    finally:
        wire.close()
