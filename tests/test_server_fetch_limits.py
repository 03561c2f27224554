"""A Fetch answer stays within the request's max_bytes (fetch.max.bytes) and each partition's
partition_max_bytes, exceeding them only by the first batch of the first partition with records
(KIP-74), as Kafka's broker answers. mqcore answered many MB to a consumer asking for 1,000,000
bytes with max.partition.fetch.bytes 20,000,000, and librdkafka dropped the connection ("Invalid
response size") and never got a message (librdkafka's test 0082_fetch_max_bytes)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafkaclients import KioWire

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
ck = pytest.importorskip("confluent_kafka")
from mqcore.server import Server  # noqa: E402

WAIT = 60.0


@pytest.fixture
def served(store: mqcore.Store) -> Iterator[Server]:
    # three partitions of 1,500 batches of 1 KiB (about 1.6 MB each)
    store.create_topic("big", partitions=3)
    for p in range(3):
        for i in range(1500):
            store.append_batch("big", [b"%d-%05d-" % (p, i) + b"x" * 1000], partition=p)
    store.create_topic("huge", partitions=2)
    for p in range(2):  # one batch of 2 MB each: larger than the whole fetch's budget
        store.append_batch("huge", [b"y" * 100_000] * 20, partition=p)
    store.flush()
    with Server(store, "127.0.0.1:0") as srv:
        yield srv


def fetch(srv: Server, topic: str, max_bytes: int, partition_max: int, parts: int) -> Any:
    from kio.schema.fetch.v12.request import FetchPartition, FetchTopic

    wanted = tuple(
        FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=0,
                       last_fetched_epoch=-1, log_start_offset=-1,
                       partition_max_bytes=partition_max)
        for p in range(parts)
    )  # fmt: skip
    wire = KioWire(srv.address)
    try:
        return wire.call(1, 12, cluster_id=None, replica_id=-1,
                         max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=max_bytes,
                         isolation_level=0, session_id=0, session_epoch=-1,
                         forgotten_topics_data=(), rack_id="",
                         topics=(FetchTopic(topic=topic, partitions=wanted),))  # fmt: skip
    finally:
        wire.close()


def sizes(response: Any) -> list[int]:
    return [len(p.records or b"") for p in response.responses[0].partitions]


def test_the_answer_stays_within_max_bytes(served: Server) -> None:
    got = sizes(fetch(served, "big", 1_000_000, 20_000_000, 3))
    assert 0 < sum(got) <= 1_000_000, got
    assert got[0] > 900_000 and got[1:] == [0, 0]  # the budget is spent on the first


def test_each_partition_stays_within_its_own_bound(served: Server) -> None:
    got = sizes(fetch(served, "big", 50_000_000, 300_000, 3))
    assert all(200_000 < n <= 300_000 for n in got), got


def test_only_the_first_partitions_first_batch_may_exceed(served: Server) -> None:
    """A 2 MB batch comes whole to a fetch of 1 MB (else the consumer could never read it),
    but only in the first partition: the second partition's equal batch does not come."""
    got = sizes(fetch(served, "huge", 1_000_000, 1_000_000, 2))
    assert got[0] > 1_000_000 and got[1] == 0, got


def test_librdkafka_with_a_small_fetch_max_bytes_reads_everything(served: Server) -> None:
    """librdkafka's 0082_fetch_max_bytes: fetch.max.bytes 1,000,000 beside
    max.partition.fetch.bytes 20,000,000; every message arrives (the consumer dropped every
    response before and got none)."""
    c = ck.Consumer({
        "bootstrap.servers": served.bootstrap, "group.id": "g", "enable.auto.commit": False,
        "fetch.max.bytes": 1_000_000, "max.partition.fetch.bytes": 20_000_000,
        "receive.message.max.bytes": 1_000_000 + 512, "auto.offset.reset": "earliest",
    })  # fmt: skip
    try:
        c.assign([ck.TopicPartition("big", p, 0) for p in range(3)])
        seen: set[bytes] = set()
        deadline = time.monotonic() + WAIT
        while len(seen) < 4500 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            seen.add(m.value()[:9])
        assert len(seen) == 4500
    finally:
        c.close()
