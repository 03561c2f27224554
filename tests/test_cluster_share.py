"""Share groups on a cluster (issue 33: "the share group state follows the leaders of its
internal partitions"; docs/cluster.md "Share groups"): three brokers of this process on a real
ZooKeeper, members over the HTTP API of different brokers.

- members joined through different brokers share the records of partitions led by different
  brokers: every record once, each to one member, and the group's lag from any broker;
- a commit is answered only once min.insync.replicas of `__share_group_state` have it (503
  while the followers are held back, answered once they caught up);
- the coordinator dies: its state's new leader serves the group, the records the group
  accepted are never handed out again and the ones it held come back with their counts;
- nothing past a partition's high watermark is handed out;
- and with real `mqcore serve` processes, members over HTTP while the coordinator's process is
  SIGKILLed: no record lost, none handed out again after a commit that accepted it.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clusterinproc import WAIT, InProcessCluster, http_get, produce
from clusterprocs import process_cluster, until
from zkserver import ZooKeeper

STATE = "__share_group_state"


def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """(status, JSON answer) of one HTTP request."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.load(e)


def url_of(cluster: InProcessCluster, node: int) -> str:
    server = cluster.servers[node].http_server
    assert server is not None
    return server.url


def join(url: str, group: str, topics: str, **options: Any) -> str:
    """A member's ID; 503 (the state topic the first join makes has no leader yet, as Kafka's
    COORDINATOR_NOT_AVAILABLE) is retried as docs/cluster.md tells clients to."""
    query = "&".join(f"{k}={v}" for k, v in {"topics": topics, **options}.items())

    def joined() -> str | None:
        status, got = call("POST", f"{url}/v1/share-groups/{group}/members?{query}")
        assert status in (200, 503), got
        return str(got["member_id"]) if status == 200 else None

    return str(until(joined, "a share coordinator to join at"))


def poll(url: str, group: str, member: str, timeout_ms: int = 0) -> list[dict[str, Any]]:
    status, got = call("POST", f"{url}/v1/share-groups/{group}/members/{member}/poll"
                               f"?max_records=500&timeout_ms={timeout_ms}")  # fmt: skip
    assert status == 200, got
    return list(got["messages"])


def polled(url: str, group: str, member: str) -> list[dict[str, Any]]:
    """poll(), but [] while the answer is 503 (a partition's leader moving)."""
    status, got = call("POST", f"{url}/v1/share-groups/{group}/members/{member}/poll"
                               "?max_records=500")  # fmt: skip
    assert status in (200, 503), got
    return list(got["messages"]) if status == 200 else []


def accept(url: str, group: str, member: str, msgs: list[dict[str, Any]]) -> None:
    acks = [[m["topic"], m["partition"], m["offset"], "accept"] for m in msgs]
    status, got = call("POST", f"{url}/v1/share-groups/{group}/members/{member}/acknowledge",
                       {"acknowledgements": acks})  # fmt: skip
    assert status == 200, got


def commit(url: str, group: str, member: str) -> tuple[int, Any]:
    return call("POST", f"{url}/v1/share-groups/{group}/members/{member}/commit")


def produce_spread(bootstrap: str, topic: str, per_partition: dict[int, int]) -> set[tuple]:
    """`n` numbered records into each partition (acks=all); {(partition, offset, value)}."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=10,
                             retry_backoff_ms=100, request_timeout_ms=20_000)  # fmt: skip
    try:
        futures = [(p, f"p{p}-{i}", producer.send(topic, f"p{p}-{i}".encode(), partition=p))
                   for p, n in per_partition.items() for i in range(n)]  # fmt: skip
        return {(p, f.get(60).offset, v) for p, v, f in futures}
    finally:
        producer.close()


def seen(msgs: list[dict[str, Any]]) -> set[tuple]:
    return {(m["partition"], m["offset"], m["value"]) for m in msgs}


def coordinator(cluster: InProcessCluster) -> int:
    return int(until(lambda: (s := cluster.state(STATE, 0)) is not None and s.leader > 0
                     and s.leader, "a share coordinator"))  # fmt: skip


def test_members_through_different_brokers_share_records_led_by_every_broker(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Two members, each joined through a different broker (neither need be the coordinator),
    poll a topic whose three partitions are led by three brokers: together they get every
    record once, no record twice; the group's lag is the same from every broker; the state
    topic is replicated to every broker."""
    cluster = make_cluster(http="127.0.0.1:0")
    cluster.create("work", partitions=3, rf=1)
    leaders = {cluster.state("work", p).leader for p in range(3)}
    assert leaders == {1, 2, 3}  # one partition on each broker
    produced = produce_spread(cluster.bootstrap, "work", {0: 7, 1: 5, 2: 9})
    a = join(url_of(cluster, 1), "workers", "work", explicit_ack="true")
    b = join(url_of(cluster, 2), "workers", "work", explicit_ack="true")
    got: dict[str, list[dict[str, Any]]] = {a: [], b: []}
    for _ in range(50):  # bounded: each round polls both members
        for member, node in ((a, 1), (b, 2)):
            msgs = poll(url_of(cluster, node), "workers", member)
            got[member] += msgs
            if msgs:
                accept(url_of(cluster, node), "workers", member, msgs)
        if len(got[a]) + len(got[b]) >= len(produced):
            break
    assert seen(got[a]) | seen(got[b]) == produced
    assert not seen(got[a]) & seen(got[b])
    assert len(got[a]) + len(got[b]) == len(produced)  # none twice
    assert all(m["delivery_count"] == 1 for m in got[a] + got[b])
    for member, node in ((a, 1), (b, 2)):
        status, answer = commit(url_of(cluster, node), "workers", member)
        assert status == 200, answer
    state = cluster.state(STATE, 0)
    assert len(state.isr) == 3
    for node in (1, 2, 3):
        lag = http_get(f"{url_of(cluster, node)}/v1/share-groups/workers")
        assert (lag["available"], lag["in_flight"]) == (0, 0), (node, lag)
        assert {(p["partition"], p["start"], p["log_end"]) for p in lag["partitions"]} == {
            (0, 7, 7), (1, 5, 5), (2, 9, 9)}, (node, lag)  # fmt: skip
    # a member is its coordinator's: another broker's request for it is forwarded there
    assert poll(url_of(cluster, 3), "workers", a) == []
    produced_more = produce_spread(cluster.bootstrap, "work", {1: 2})
    more = until(lambda: poll(url_of(cluster, 3), "workers", b, timeout_ms=2000),
                 "the new records")  # fmt: skip
    assert seen(more) == produced_more


def test_a_share_commit_is_answered_only_once_the_state_is_replicated(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """With both followers of the share state held back, a commit is not answered 200: the
    ISR falls below the state's min.insync.replicas (2) and it answers 503; once the
    followers catch up, the same commit is answered and every replica holds the state."""
    cluster = make_cluster(http="127.0.0.1:0", replica_lag_time_max_ms=1500,
                           zk_session_timeout_ms=8000)  # fmt: skip
    cluster.create("jobs", partitions=1, rf=3)
    produced = produce_spread(cluster.bootstrap, "jobs", {0: 4})
    url = url_of(cluster, 1)
    member = join(url, "g", "jobs", explicit_ack="true")
    coord = coordinator(cluster)
    msgs = poll(url, "g", member)
    assert seen(msgs) == produced
    followers = [n for n in (1, 2, 3) if n != coord]
    until(lambda: all(len(cluster.log(n, STATE)) == len(cluster.log(coord, STATE))
                      for n in followers), "the followers to copy the state so far")  # fmt: skip
    cluster.hold(*followers)
    accept(url, "g", member, msgs)
    status, answer = commit(url, "g", member)
    assert status == 503 and answer["error"] == "NotEnoughReplicasAfterAppendError", answer
    assert all(len(cluster.log(n, STATE)) < len(cluster.log(coord, STATE)) for n in followers)
    cluster.release()
    until(lambda: len(cluster.state(STATE, 0).isr) == 3, "the followers back in the ISR")
    status, answer = commit(url, "g", member)
    assert status == 200, answer
    assert all(cluster.log(n, STATE) == cluster.log(coord, STATE) for n in followers)


def test_the_share_coordinator_dies_and_the_next_serves_what_was_committed(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """The coordinator stops after a commit: the leader elected for the state serves the
    group. Its member is gone (404: it joins again); the records it accepted are never handed
    out again, the ones it held and did not acknowledge come back with delivery count 2."""
    cluster = make_cluster(http="127.0.0.1:0", zk_session_timeout_ms=4000)
    cluster.create("jobs", partitions=2, rf=3)
    produced = produce_spread(cluster.bootstrap, "jobs", {0: 6, 1: 6})
    first = url_of(cluster, 1)
    member = join(first, "g", "jobs", explicit_ack="true")
    coord = coordinator(cluster)
    survivor = next(n for n in (1, 2, 3) if n != coord)
    msgs = poll(first, "g", member)
    assert seen(msgs) == produced
    done = [m for m in msgs if m["offset"] < 3]  # half of each partition
    accept(first, "g", member, done)
    status, answer = commit(first, "g", member)
    assert status == 200, answer
    cluster.stop(coord)
    url = url_of(cluster, survivor)
    until(lambda: cluster.state(STATE, 0).leader not in (coord, -1), "a new share coordinator")
    status, answer = call("POST", f"{url}/v1/share-groups/g/members/{member}/poll")
    assert status in (404, 503), answer  # 503 only while the coordinator moves
    again = until(lambda: call("POST", f"{url}/v1/share-groups/g/members?topics=jobs"
                                       "&explicit_ack=true")[1].get("member_id"),
                  "a member joined at the new coordinator")  # fmt: skip
    # the stopped broker may have led a partition of "jobs" too: 503 until its next leader
    back = until(lambda: polled(url, "g", again), "the held records back")
    assert seen(back) == produced - seen(done)
    assert all(m["delivery_count"] == 2 for m in back)


def test_a_share_group_hands_out_nothing_past_the_high_watermark(
    make_cluster: Callable[..., InProcessCluster],
) -> None:
    """Records the leader has but its followers do not (acks=1, followers held) are not
    handed out; once the followers copy them they are."""
    cluster = make_cluster(http="127.0.0.1:0", zk_session_timeout_ms=8000,
                           replica_lag_time_max_ms=30_000)  # fmt: skip
    cluster.create("jobs", partitions=1, rf=3)
    produce(cluster.bootstrap, "jobs", [b"committed"])
    leader = cluster.state("jobs").leader
    url = url_of(cluster, 1)
    member = join(url, "g", "jobs", explicit_ack="true")
    coordinator(cluster)
    first = until(lambda: poll(url, "g", member), "the committed record")
    assert [m["value"] for m in first] == ["committed"]
    accept(url, "g", member, first)
    followers = [n for n in (1, 2, 3) if n != leader]
    cluster.hold(*followers)
    assert produce(cluster.bootstrap, "jobs", [b"uncommitted"], acks=1) == [1]
    assert poll(url, "g", member, timeout_ms=500) == []
    cluster.release()
    later = until(lambda: poll(url, "g", member, timeout_ms=500), "the record once committed")
    assert [(m["offset"], m["value"]) for m in later] == [(1, "uncommitted")]


Place = tuple[int, int]  # (partition, offset)


class ShareWorker(threading.Thread):
    """A share member over HTTP that accepts and commits all it gets, joining again through
    any live broker whenever its member is gone or a broker does not answer. Every delivery
    and every answered commit is stamped from one counter shared by the workers."""

    def __init__(self, urls: Callable[[], list[str]], stamp: Callable[[], int], name: str):
        super().__init__(name=name, daemon=True)
        self.urls, self.stamp = urls, stamp
        self.stop = threading.Event()
        self.deliveries: list[tuple[Place, str, int]] = []  # (record, value, stamp)
        self.commits: list[tuple[Place, int]] = []  # (record, stamp of its answered commit)
        self.errors = 0
        self.last_error = ""

    def run(self) -> None:
        member: str | None = None
        url = ""
        accepted: list[Place] = []
        while not self.stop.is_set():
            try:
                if member is None:
                    url = random.choice(self.urls())
                    member = join(url, "workers", "jobs", explicit_ack="true",
                                  delivery_count_limit=1000, session_timeout_ms=10_000)  # fmt: skip
                    accepted = []
                status, got = call("POST", f"{url}/v1/share-groups/workers/members/{member}"
                                           "/poll?max_records=40&timeout_ms=300")  # fmt: skip
                if status != 200:
                    raise ConnectionError(f"poll {status}: {got}")
                msgs = got["messages"]
                self.deliveries += [((m["partition"], m["offset"]), m["value"], self.stamp())
                                    for m in msgs]  # fmt: skip
                if msgs:
                    acks = [[m["topic"], m["partition"], m["offset"], "accept"] for m in msgs]
                    path = f"{url}/v1/share-groups/workers/members/{member}/acknowledge"
                    status, got = call("POST", path, {"acknowledgements": acks})
                    if status != 200:
                        raise ConnectionError(f"acknowledge {status}: {got}")
                    accepted += [(m["partition"], m["offset"]) for m in msgs]
                status, got = commit(url, "workers", member)
                if status != 200:
                    raise ConnectionError(f"commit {status}: {got}")
                done = self.stamp()
                self.commits += [(r, done) for r in accepted]
                accepted = []
            except (OSError, ValueError, AssertionError) as e:  # a broker killed, a member gone
                self.errors += 1
                self.last_error = repr(e)[:300]
                member = None
                self.stop.wait(0.2)


class Feeder(threading.Thread):
    """An acks=all producer of numbered records into the three partitions of "jobs" until
    stopped (at most FEED records); `acked` the values the cluster acknowledged."""

    def __init__(self, bootstrap: str):
        super().__init__(name="feeder", daemon=True)
        self.bootstrap = bootstrap
        self.stop = threading.Event()
        self.acked: list[str] = []

    def run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", retries=20,
                                 retry_backoff_ms=200, request_timeout_ms=20_000)  # fmt: skip
        try:
            for i in range(FEED):
                if self.stop.is_set():
                    break
                value = f"job-{i}"
                producer.send("jobs", value.encode(), partition=i % 3).add_callback(
                    lambda _meta, value=value: self.acked.append(value)
                )
                self.stop.wait(0.01)
            producer.flush(60)
        finally:
            producer.close()


FEED = 20_000


@pytest.mark.slow
def test_share_workers_lose_no_record_and_redo_no_committed_one_while_the_coordinator_is_killed(
    zk: ZooKeeper, tmp_path: Path
) -> None:
    """Three `mqcore serve` processes; a producer writes all along; three HTTP share members,
    each through whichever live broker it picks, accept and commit what they get while the
    test SIGKILLs the share coordinator's process twice (restarting it after the state
    moved): the group ends done with every record, every acknowledged record reached a
    member, and no record is handed out after a commit that accepted it was answered."""
    from kafka.admin import KafkaAdminClient, NewTopic

    flags = ["--http", "127.0.0.1:0", "--zk-session-timeout-ms", "4000"]
    with process_cluster(zk, tmp_path, 3, flags, links=False) as cluster:
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
        try:
            admin.create_topics([NewTopic("jobs", 3, 3, topic_configs={
                "min.insync.replicas": "2"})])  # fmt: skip
        finally:
            admin.close()
        producer = Feeder(cluster.bootstrap)
        producer.start()
        until(lambda: len(producer.acked) >= 100, "the first records", cluster=cluster)

        def urls() -> list[str]:
            live = cluster.coordinator.brokers()
            return [b.http for n, b in live.items() if b.http and cluster.brokers[n].running]

        counter = itertools.count()
        lock = threading.Lock()

        def stamp() -> int:
            with lock:
                return next(counter)

        workers = [ShareWorker(urls, stamp, f"worker-{i}") for i in range(3)]
        for w in workers:
            w.start()
        try:
            for _ in range(2):
                base = sum(len(w.commits) for w in workers)
                until(lambda base=base: sum(len(w.commits) for w in workers) > base + 50,
                      "the workers to commit", cluster=cluster)  # fmt: skip
                victim = until(lambda: (s := cluster.state(STATE, 0)) is not None
                               and s.leader > 0 and s.leader, "a share coordinator")  # fmt: skip
                cluster.brokers[victim].kill()
                until(lambda victim=victim: cluster.state(STATE, 0).leader not in (victim, -1),
                      "a new share coordinator", cluster=cluster)  # fmt: skip
                cluster.brokers[victim].start()
            producer.stop.set()
            producer.join(60)
            values = set(producer.acked)

            def finished() -> bool:
                lag = http_get(urls()[0] + "/v1/share-groups/workers")
                return (
                    lag.get("available") == 0
                    and lag.get("in_flight") == 0
                    and all(p["start"] == p["log_end"] for p in lag["partitions"])
                )

            until(finished, "the group to be done with every record", timeout=120,
                  cluster=cluster)  # fmt: skip
        finally:
            producer.stop.set()
            for w in workers:
                w.stop.set()
            for w in workers:
                w.join(60)
    committed: dict[Place, int] = {}
    for w in workers:
        for r, at in w.commits:
            committed[r] = min(at, committed.get(r, at))
    redone = [(r, v, at) for w in workers for r, v, at in w.deliveries
              if at > committed.get(r, at)]  # fmt: skip
    assert not redone, f"{len(redone)} records handed out after their commit: {redone[:5]}"
    # at least once: every acknowledged record reached a member (a record a member accepted
    # in a commit whose answer was lost to a kill may be done without an answered commit)
    assert values <= {v for w in workers for _, v, _ in w.deliveries}
    assert len(values) > 300 and len(committed) > len(values) // 2
    assert sum(w.errors for w in workers) > 0  # the kills were felt
