"""Brokers 1..3 of one cluster as `mqcore.server.Server`s of the test's process, on a real
ZooKeeper (the `zk` fixture), each restartable on its store and port, with a switch that holds
a follower's fetches back (`hold`): the failure-path tests of the cluster
(test_cluster_replicas.py, test_cluster_share.py) decide which replica has which record instead
of racing the fetchers. `make_cluster` is the fixture (conftest.py)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterprocs import until
from zkserver import ZooKeeper

from mqcore.cluster.replicas import ReplicaManager
from mqcore.server import Server, interbroker

WAIT = 60.0


class InProcessCluster:
    """Brokers 1..3 as Servers of this process, each restartable on its store and port."""

    def __init__(self, zk: ZooKeeper, directory: Path, **options: Any):
        self.racks: dict[int, str] = options.pop("racks", {})
        self.zk, self.directory, self.options = zk, directory, options
        self.servers: dict[int, Server] = {}
        self.ports: dict[int, int] = {}
        self.blocked: set[int] = set()  # followers whose fetches the leaders refuse
        self.held: set[int] = set()  # those of them whose fetcher met the block since

    def hold(self, *nodes: int) -> None:
        """Hold back the fetches of `nodes`, once any fetch they had under way is over (a
        long poll at the leader would otherwise still bring records)."""
        self.held.difference_update(nodes)
        self.blocked.update(nodes)
        until(lambda: self.held.issuperset(nodes), f"the fetchers of {nodes} to be held")

    def release(self) -> None:
        self.blocked.clear()

    def start(self, node: int) -> Server:
        listen = f"127.0.0.1:{self.ports.get(node, 0)}"
        server = Server(self.directory / f"b{node}", listen, node_id=node, create=True,
                        coordinator=self.zk.url("/cluster"), rack=self.racks.get(node),
                        **self.options).start()  # fmt: skip
        self.servers[node] = server
        self.ports[node] = server.port
        return server

    def stop(self, node: int) -> None:
        self.servers.pop(node).stop()

    @property
    def bootstrap(self) -> str:
        return ",".join(s.bootstrap for s in self.servers.values())

    def any(self) -> Server:
        return next(iter(self.servers.values()))

    def state(self, topic: str, partition: int = 0) -> Any:
        coordinator = self.any().replicas.coordinator  # type: ignore[union-attr]
        return coordinator.partition_state(topic, partition)

    def create(self, topic: str, partitions: int = 1, rf: int = 3, **config: str) -> None:
        replicas = self.any().replicas
        assert replicas is not None
        replicas.create_topic(topic, partitions, rf, config)
        for s in self.servers.values():  # every broker knows every partition's leader
            until(functools.partial(knows, s.replicas, topic), f"{topic} at every broker")

    def log(self, node: int, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
        store = self.servers[node].store
        assert store is not None
        return [(m.offset, bytes(m.value or b"")) for m in store.read(topic, partition, 0, 100_000)]


@pytest.fixture
def make_cluster(
    zk: ZooKeeper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., InProcessCluster]]:
    made: list[InProcessCluster] = []
    real = interbroker.WireLeaderClient.fetch

    def fetch(self: Any, replica_id: int, partitions: Any, max_wait_ms: int) -> Any:
        for c in made:
            if replica_id in c.blocked:
                c.held.add(replica_id)
                time.sleep(max_wait_ms / 1000)  # as long as a fetch that found nothing takes
                raise ConnectionError(f"the test holds broker {replica_id}'s fetches back")
        return real(self, replica_id, partitions, max_wait_ms)

    monkeypatch.setattr(interbroker.WireLeaderClient, "fetch", fetch)

    def make(**options: Any) -> InProcessCluster:
        cluster = InProcessCluster(zk, tmp_path, **options)
        made.append(cluster)
        for node in (1, 2, 3):
            cluster.start(node)
        return cluster

    yield make
    for cluster in made:
        for node in list(cluster.servers):
            cluster.stop(node)


def knows(replicas: ReplicaManager | None, topic: str) -> bool:
    """Whether a broker knows `topic` and the state of each of its partitions."""
    assert replicas is not None
    return replicas.has_topic(topic) and all(
        m.state is not None for m in replicas.partitions(topic).values()
    )


def produce(bootstrap: str, topic: str, values: list[bytes], acks: Any = "all",
            retries: int = 10) -> list[int]:  # fmt: skip
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=acks, retries=retries,
                             retry_backoff_ms=100, request_timeout_ms=20_000)  # fmt: skip
    try:
        futures = [producer.send(topic, v, partition=0) for v in values]
        return [f.get(60).offset for f in futures]
    finally:
        producer.close()


def consume(bootstrap: str, topic: str, n: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + WAIT
        while len(got) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got += [m.value for m in records]
    finally:
        consumer.close()
    return got


def http_get(url: str) -> Any:
    """GET a JSON answer (an HTTP error's JSON body too, with its status)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=WAIT) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        with e:
            return {"status": e.code, **json.load(e)}
