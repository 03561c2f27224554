"""Clients we did not write against a cluster of three `mqcore serve` processes (issue 33):
kafka-python, aiokafka and kcat each see three brokers and each partition's leader, replicas
and ISR in Metadata, and produce and consume through a change of leader (the leader killed,
the controller electing another, the client finding it from Metadata and
NOT_LEADER_OR_FOLLOWER)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from zkserver import ZooKeeper

pytest.importorskip("kazoo", reason="the server extra (kazoo) is missing")

from clusterprocs import ProcessCluster, process_cluster, until  # noqa: E402

FLAGS = ["--zk-session-timeout-ms", "4000", "--replica-lag-time-max-ms", "3000"]
KCAT = shutil.which("kcat") or shutil.which("kafkacat")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    directory = tmp_path_factory.mktemp("cluster")
    zk = ZooKeeper(directory).start()
    try:
        with process_cluster(zk, directory, 3, FLAGS) as c:
            yield c
    finally:
        zk.stop()


def fail_over(cluster: ProcessCluster, topic: str, partition: int = 0) -> int:
    """Kill the partition's leader, wait for another to lead it; the dead broker's ID (the
    caller restarts it with `recover`)."""
    old = until(lambda: _leader(cluster, topic, partition), f"a leader of {topic}")
    cluster.brokers[old].kill()
    until(lambda: _leader(cluster, topic, partition) not in (None, old),
          f"a new leader of {topic}-{partition}", cluster=cluster)  # fmt: skip
    return old


def recover(cluster: ProcessCluster, node: int, topic: str) -> None:
    cluster.brokers[node].start()
    until(lambda: all(node in cluster.state(topic, p).isr for p in range(3)),
          f"broker {node} back in the ISR of {topic}", cluster=cluster)  # fmt: skip


def _leader(cluster: ProcessCluster, topic: str, partition: int) -> int | None:
    try:
        leader = cluster.state(topic, partition).leader
    except Exception:  # not created yet
        return None
    return leader if leader >= 0 else None


def test_kafka_python_sees_three_brokers_and_produces_through_a_leader_change(
    cluster: ProcessCluster,
) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.create_topics([NewTopic("kp", 3, 3)])

        def described_with_leaders() -> dict[str, Any] | None:
            # CreateTopics waits until the broker that answered it knows the partitions'
            # states; the broker answering this Metadata may learn them a moment later
            # (Kafka's brokers lag each other the same way: LEADER_NOT_AVAILABLE, retried)
            got = admin.describe_topics(["kp"])[0]
            return got if all(p["leader_id"] >= 0 for p in got["partitions"]) else None

        described = until(described_with_leaders, "every broker to know the new topic's leaders")
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    assert sorted(b["broker_id"] for b in brokers) == [1, 2, 3]
    for p in described["partitions"]:
        state = cluster.state("kp", p["partition_index"])
        assert (p["leader_id"], sorted(p["replica_nodes"]), sorted(p["isr_nodes"])) == (
            state.leader, [1, 2, 3], sorted(state.isr))  # fmt: skip
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", retries=20,
                             retry_backoff_ms=200, request_timeout_ms=5000)  # fmt: skip
    try:
        first = [producer.send("kp", b"a%d" % i, partition=0) for i in range(50)]
        for f in first:
            f.get(30)
        dead = fail_over(cluster, "kp")
        second = [producer.send("kp", b"b%d" % i, partition=0) for i in range(50)]
        for f in second:
            f.get(60)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest")
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition("kp", 0)])
        deadline = time.monotonic() + 60
        while len(got) < 100 and time.monotonic() < deadline:  # bounded
            for records in consumer.poll(timeout_ms=500).values():
                got += [m.value for m in records]
    finally:
        consumer.close()
    assert got == [b"a%d" % i for i in range(50)] + [b"b%d" % i for i in range(50)]
    recover(cluster, dead, "kp")


def test_aiokafka_produces_and_consumes_through_a_leader_change(cluster: ProcessCluster) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    async def run() -> list[bytes]:
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("ak", 3, 3)])
        finally:
            await admin.close()
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=cluster.bootstrap, acks="all", request_timeout_ms=5000,
            retry_backoff_ms=200,
        )  # fmt: skip
        await producer.start()
        try:
            for i in range(30):
                await producer.send_and_wait("ak", b"a%d" % i, partition=1)
            dead = await asyncio.to_thread(fail_over, cluster, "ak", 1)
            for i in range(30):
                for _ in range(40):  # bounded: aiokafka retries a send only inside its timeout
                    try:
                        await producer.send_and_wait("ak", b"b%d" % i, partition=1)
                        break
                    except KafkaError:
                        await asyncio.sleep(0.25)
                else:
                    raise AssertionError("aiokafka could not produce after the failover")
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap,
                                             auto_offset_reset="earliest")  # fmt: skip
        await consumer.start()
        got: list[bytes] = []
        try:
            consumer.assign([aiokafka.TopicPartition("ak", 1)])
            deadline = time.monotonic() + 60
            while len(got) < 60 and time.monotonic() < deadline:  # bounded
                batches = await consumer.getmany(timeout_ms=500)
                got += [m.value for ms in batches.values() for m in ms]
        finally:
            await consumer.stop()
        await asyncio.to_thread(recover, cluster, dead, "ak")
        return got

    got = asyncio.run(run())
    assert got == [b"a%d" % i for i in range(30)] + [b"b%d" % i for i in range(30)]


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (make test-tools installs it)")
def test_kcat_lists_the_cluster_and_produces_and_consumes_through_a_leader_change(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    assert KCAT is not None

    def kcat(*args: str, data: bytes | None = None) -> str:
        done = subprocess.run([KCAT, "-b", cluster.bootstrap, "-X", "topic.metadata.refresh."
                               "interval.ms=500", *args], input=data, capture_output=True,
                              timeout=90, check=True)  # fmt: skip
        return done.stdout.decode()

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.create_topics([NewTopic("kc", 3, 3)])
    finally:
        admin.close()
    listed = json.loads(kcat("-L", "-J", "-t", "kc"))
    assert sorted(b["id"] for b in listed["brokers"]) == [1, 2, 3]
    (topic,) = listed["topics"]
    for p in topic["partitions"]:
        assert p["leader"] == cluster.state("kc", p["partition"]).leader
        assert sorted(r["id"] for r in p["replicas"]) == [1, 2, 3]
    kcat(
        "-P",
        "-t",
        "kc",
        "-p",
        "2",
        "-X",
        "acks=all",
        data=b"".join(b"a%d\n" % i for i in range(20)),
    )
    dead = fail_over(cluster, "kc", 2)
    kcat("-P", "-t", "kc", "-p", "2", "-X", "acks=all", "-X", "message.send.max.retries=50",
         data=b"".join(b"b%d\n" % i for i in range(20)))  # fmt: skip
    out = kcat("-C", "-t", "kc", "-p", "2", "-o", "beginning", "-e")
    assert out.split() == [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
    recover(cluster, dead, "kc")
