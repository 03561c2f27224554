"""A cluster of three `mqcore serve` processes on one ZooKeeper (issue 33), side by side in one
run: a confluent-kafka producer with acks=all to a topic of replication factor 3 against the
same producer to a topic of replication factor 1 on the same three brokers (the baseline: the
same wire path, nobody to wait for), and failover: from a leader's SIGKILL to the producer's
next acknowledged write, twenty times.

The brokers, ZooKeeper and the client share this machine's cores: bench/README.md "Cluster"
says where the time goes. The processes and links are the test suite's
(tests/clusterprocs.py, tests/zkserver.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from benchdata import SEED, record, values_of
from pytest_benchmark.fixture import BenchmarkFixture

ck = pytest.importorskip("confluent_kafka")
pytest.importorskip("kazoo", reason="the server extra (kazoo) is missing")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

from clusterprocs import ProcessCluster, process_cluster, until  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from zkserver import ZooKeeper  # noqa: E402

SIZE = 1024
PER_ROUND = 20_000
ROUNDS = int(os.environ.get("MQCORE_BENCH_ROUNDS", "6"))
SESSION_MS = 4000
TICK_MS = 100  # ZooKeeper expires a session up to a tick after its timeout: a short tick
FAILOVERS = 20
PRODUCER = {
    "acks": "all", "linger.ms": 5, "batch.size": 1 << 20, "compression.type": "none",
    "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 4_000_000,
}  # fmt: skip
# a client that looks for the new leader often, as Kafka's Java client does (it asks for
# metadata again, retry.backoff.ms apart, while the dead leader refuses connections). librdkafka
# keeps a partition on its down leader until its topic scan or periodic metadata refresh, once a
# second by default: up to a second of the failover would be the client's. bench/README.md
# "Cluster" has the figures with librdkafka's defaults too.
FAST_CLIENT = {
    "socket.timeout.ms": 5000, "request.timeout.ms": 5000, "reconnect.backoff.max.ms": 200,
    "topic.metadata.refresh.interval.ms": 200, "retry.backoff.ms": 50,
    "retry.backoff.max.ms": 200,
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    directory = tmp_path_factory.mktemp("cluster")
    zk = ZooKeeper(directory, tick_ms=TICK_MS).start()
    env = dict(os.environ)
    flags = ["--zk-session-timeout-ms", str(SESSION_MS), "--flush", "os"]
    try:
        with process_cluster(zk, directory, 3, flags, env=env, links=False) as c:
            admin = AdminClient({"bootstrap.servers": c.bootstrap})
            topics = [NewTopic(name, 1, rf, config={"segment.bytes": str(1 << 30)})
                      for name, rf in (("rf3", 3), ("rf1", 1), ("fo", 3))]  # fmt: skip
            for f in admin.create_topics(topics).values():
                f.result(60)
            yield c
    finally:
        zk.stop()


def produce_all(producer: Any, topic: str, values: list[bytes]) -> None:
    send = producer.produce
    for v in values:
        try:
            send(topic, v, partition=0)
        except BufferError:
            producer.poll(0.005)
            send(topic, v, partition=0)
    assert producer.flush(120) == 0


@pytest.mark.parametrize("rf", [3, 1])
def test_cluster_produce(benchmark: BenchmarkFixture, cluster: ProcessCluster, rf: int) -> None:
    """acks=all, 1 KiB, to a one-partition topic of `rf` replicas."""
    values = values_of(PER_ROUND, SIZE, SEED)
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap, **PRODUCER})
    benchmark.group = "cluster-produce-1KiB"
    record(benchmark, f"cluster/produce/1KiB/rf{rf}-acks-all", nbytes=PER_ROUND * SIZE,
           messages=PER_ROUND)  # fmt: skip
    benchmark.pedantic(lambda: produce_all(producer, f"rf{rf}", values), rounds=ROUNDS,
                       warmup_rounds=1, iterations=1)  # fmt: skip
    state = cluster.state(f"rf{rf}", 0)
    assert len(state.isr) == rf  # nobody fell out of sync: every round was replicated


class Acks(threading.Thread):
    """Produces to topic "fo" without pause (acks=all). `after(t)`: when the first message
    produced after monotonic time `t` was acknowledged (0.0: none yet), so that an ack the dead
    leader sent just before its death, read by the client after it, does not count."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                     "enable.idempotence": True, "linger.ms": 1,
                                     "message.timeout.ms": 60_000, **FAST_CLIENT})  # fmt: skip
        self.stop = threading.Event()
        self._mark = float("inf")
        self._first = 0.0

    def after(self, mark: float | None = None) -> float:
        if mark is not None:
            self._mark, self._first = mark, 0.0
        return self._first

    def _acked(self, err: Any, produced: float) -> None:
        if err is None and produced > self._mark and not self._first:
            self._first = time.monotonic()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            if len(self.producer) < 100:
                at = time.monotonic()
                done = lambda err, _m, at=at: self._acked(err, at)  # noqa: E731
                self.producer.produce("fo", b"%d" % n, partition=0, on_delivery=done)
                n += 1
            self.producer.poll(0.001)
        self.producer.flush(60)


def test_cluster_failover(benchmark: BenchmarkFixture, cluster: ProcessCluster) -> None:
    """From SIGKILL of the leader of "fo" to the producer's next acknowledgement (a new leader
    took it), FAILOVERS times; the killed broker restarts and rejoins the ISR between rounds
    (not timed)."""
    acks = Acks(cluster.bootstrap)
    acks.start()
    dead: list[int] = []
    times: list[float] = []
    elected: list[float] = []  # from the kill to the controller's new partition state
    zk = cluster.coordinator.client

    def heal() -> None:
        for node in dead:
            cluster.brokers[node].start()
        dead.clear()
        until(lambda: len(cluster.state("fo", 0).isr) == 3, "a full ISR")
        acks.after(time.monotonic())
        until(acks.after, "acknowledgements before the kill")

    def fail_over() -> None:
        leader = cluster.state("fo", 0).leader
        killed, wall = time.monotonic(), time.time()
        acks.after(killed)
        cluster.brokers[leader].kill()
        dead.append(leader)
        until(acks.after, "an acknowledgement after the kill", timeout=60)
        times.append(acks.after() - killed)
        _, stat = zk.get("/cluster/brokers/topics/fo/partitions/0/state")
        elected.append(stat.mtime / 1000 - wall)

    benchmark.group = "cluster-failover"
    record(benchmark, "cluster/failover/sigkill-to-next-ack", ops=1,
           session_timeout_ms=SESSION_MS)  # fmt: skip
    try:
        benchmark.pedantic(fail_over, setup=heal, rounds=FAILOVERS, iterations=1)
        heal()
    finally:
        acks.stop.set()
        acks.join(90)
    benchmark.extra_info.update(median_s=sorted(times)[len(times) // 2], worst_s=max(times),
                                times_s=[round(t, 3) for t in times],
                                elected_s=[round(t, 3) for t in elected])  # fmt: skip
    assert max(times) < 60
