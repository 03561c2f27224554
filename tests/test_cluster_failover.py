"""Three `mqcore serve` brokers in their own processes on a real ZooKeeper, written to by an
unmodified client while the test hurts them (issue 33, "Prove it"): a confluent-kafka
idempotent producer with acks=all and min.insync.replicas=2 writes numbered messages and a
confluent-kafka consumer in a group reads them, while the test, over and over, SIGKILLs the
leader, SIGSTOPs it (a zombie that wakes later), cuts it off the network (its Kafka and
ZooKeeper links, tests/clusterprocs.py) and restarts a follower. Then: no acknowledged message
lost or duplicated, every replica's log the same bytes, and the consumer saw each partition in
the log's one order."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from zkserver import ZooKeeper

pytest.importorskip("kazoo", reason="the server extra (kazoo) is missing")
confluent_kafka = pytest.importorskip("confluent_kafka")
from clusterprocs import (  # noqa: E402
    ProcessCluster,
    check_histories,
    process_cluster,
    read_partition,
    until,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "chaos"
PARTITIONS = 3
SESSION_MS = 4000
BROKER_FLAGS = ["--zk-session-timeout-ms", str(SESSION_MS), "--replica-lag-time-max-ms", "3000"]
CLIENT = {
    "socket.timeout.ms": 5000,
    "request.timeout.ms": 5000,
    "topic.metadata.refresh.interval.ms": 1000,
    "metadata.max.age.ms": 5000,
    "reconnect.backoff.max.ms": 500,
}
PROGRESS = 300  # acknowledgements the producer must add through each failure


class Writer(threading.Thread):
    """The idempotent acks=all producer: numbered values, at most 500 in flight; `acked` the
    values the cluster acknowledged, `errors` what it refused (those may or may not be in the
    log, but never twice)."""

    def __init__(self, bootstrap: str):
        super().__init__(name="writer", daemon=True)
        self.producer = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "linger.ms": 2, "message.timeout.ms": 120_000, **CLIENT,
        })  # fmt: skip
        self.acked: set[bytes] = set()
        self.errors: list[str] = []
        self.fatal: str | None = None
        self.sent = 0
        self.stop = threading.Event()

    def _done(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.add(msg.value())
        else:
            self.errors.append(str(err))
            if err.fatal():
                self.fatal = str(err)

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.fatal is None:
                if len(self.producer) < 500:
                    self.producer.produce(TOPIC, value=b"%09d" % self.sent,
                                          on_delivery=self._done)  # fmt: skip
                    self.sent += 1
                self.producer.poll(0.002)
            self.producer.flush(150)
        except confluent_kafka.KafkaException as e:  # a fatal error surfaces here too
            self.fatal = str(e)


class Reader(threading.Thread):
    """A consumer in group `g`: every (partition, offset, value) it was given, in order."""

    def __init__(self, bootstrap: str):
        super().__init__(name="reader", daemon=True)
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": "g", "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": 200,
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, **CLIENT,
        })  # fmt: skip
        self.seen: list[tuple[int, int, bytes]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([TOPIC])
        try:
            while not self.stop.is_set():
                m = self.consumer.poll(0.2)
                if m is not None and m.error() is None:
                    self.seen.append((m.partition(), m.offset(), m.value()))
        finally:
            self.consumer.close()


def leader_of(cluster: ProcessCluster, partition: int) -> int:
    return int(cluster.state(TOPIC, partition).leader)


def full_isr(cluster: ProcessCluster) -> bool:
    return all(len(cluster.state(TOPIC, p).isr) == 3 for p in range(PARTITIONS))


@pytest.mark.slow
def test_no_acknowledged_write_is_lost_or_doubled_while_brokers_fail(
    zk: ZooKeeper, tmp_path: Path
) -> None:
    with process_cluster(zk, tmp_path, 3, BROKER_FLAGS) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        created = admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})]
        )
        created[TOPIC].result(60)
        writer, reader = Writer(cluster.bootstrap), Reader(cluster.bootstrap)
        writer.start()
        reader.start()
        try:
            until(lambda: len(writer.acked) >= PROGRESS, "the first acks", cluster=cluster)
            for fault in ("kill", "pause", "cut", "restart", "kill", "pause", "cut"):
                inflict(cluster, writer, fault)
                assert writer.fatal is None, writer.fatal
        finally:
            writer.stop.set()
            writer.join(180)
        assert writer.fatal is None, writer.fatal
        assert not writer.is_alive()
        until(lambda: full_isr(cluster), "every replica back in the ISR", cluster=cluster)
        acked = set(writer.acked)
        # the consumer reads to the end: every acknowledged value reached it
        until(lambda: acked <= {v for _, _, v in reader.seen}, "the consumer to see every "
              "acknowledged message", timeout=90, cluster=cluster)  # fmt: skip
        reader.stop.set()
        reader.join(60)
        until(lambda: _caught_up(cluster), "the followers to reach the leaders' log ends",
              cluster=cluster)  # fmt: skip
    # the brokers are stopped: read every replica from its store
    placed: dict[bytes, tuple[int, int]] = {}
    for p in range(PARTITIONS):
        logs = {n: read_partition(b.directory, TOPIC, p) for n, b in cluster.brokers.items()}
        raws = [raw for raw, _ in logs.values()]
        assert all(r == raws[0] for r in raws), f"partition {p}: the replicas' bytes differ"
        where = check_histories({n: records for n, (_, records) in logs.items()}, acked)
        for value, offset in where.items():
            assert value not in placed, f"{value!r} in partitions {placed[value][0]} and {p}"
            placed[value] = (p, offset)
    lost = acked - set(placed)
    assert not lost, f"{len(lost)} acknowledged messages lost: {sorted(lost)[:5]}"
    assert len(acked) >= PROGRESS * 8
    # the consumer saw each partition in the log's order: every value where the log has it
    for partition, offset, value in reader.seen:
        assert placed.get(value) == (partition, offset), (partition, offset, value)


def inflict(cluster: ProcessCluster, writer: Writer, fault: str) -> None:
    """One failure of the leader of partition 0 (a follower's restart for "restart"), held
    until the controller moved leadership and the producer went on through it, then healed
    and waited for until the broker is back in every ISR."""
    leader = until(lambda: leader_of(cluster, 0) if leader_of(cluster, 0) >= 0 else None,
                   "partition 0 to have a leader", cluster=cluster)  # fmt: skip
    before = len(writer.acked)
    if fault == "restart":
        victim = cluster.brokers[next(n for n in cluster.brokers if n != leader)]
        victim.terminate()
        victim.start()
    else:
        victim = cluster.brokers[leader]
        {"kill": victim.kill, "pause": victim.pause, "cut": victim.cut}[fault]()
        until(lambda: leader_of(cluster, 0) not in (leader, -1),
              f"a new leader of partition 0 after {fault} of broker {leader}",
              cluster=cluster)  # fmt: skip
    until(lambda: len(writer.acked) >= before + PROGRESS or writer.fatal,
          f"the producer to go on after {fault} of broker {victim.node_id}",
          timeout=90, cluster=cluster)  # fmt: skip
    {"kill": victim.start, "pause": victim.resume, "cut": victim.heal,
     "restart": lambda: None}[fault]()  # fmt: skip
    until(lambda: full_isr(cluster), f"broker {victim.node_id} back in the ISR after {fault}",
          timeout=90, cluster=cluster)  # fmt: skip


def _caught_up(cluster: ProcessCluster) -> bool:
    """Every replica's log ends where its leader's high watermark is (read beside the
    running brokers: each store opened read-only, as a second process may)."""
    from kafka import KafkaConsumer, TopicPartition

    import mqcore

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap)
    try:
        hw = consumer.end_offsets([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    finally:
        consumer.close()
    for b in cluster.brokers.values():
        with mqcore.open(str(b.directory), read_only=True) as store:
            if any(store.end_offset(TOPIC, p) != hw[TopicPartition(TOPIC, p)]
                   for p in range(PARTITIONS)):  # fmt: skip
                return False
    return True
