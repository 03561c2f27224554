"""The request versions Kafka 4 removed (KIP-896) and Kafka 3.9 served, driven by kafka-python at
the protocol versions of old brokers (its code, not ours): a 0.9 producer (Produce v1, magic 0
message sets) and a 0.10 one (Produce v2, magic 1) in every codec they have, consumers at 0.9
and 0.10 (Fetch v1-v3, down-converted message sets; JoinGroup v0; OffsetCommit and OffsetFetch
of those clients; ListOffsets v0), an admin client at 0.10.1 (CreateTopics v0, DeleteTopics
v0). Each answer is checked against the store: what was produced is stored as v2 batches with
the codec the client sent, and read back the same. ApiVersions lists Produce and Fetch from v0,
which is what makes librdkafka before 2.x compress at all (KAFKA-18659)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
kafka = pytest.importorskip("kafka")
from kafkaclients import kafka_python_call  # noqa: E402

from mqcore.server import Server  # noqa: E402
from mqcore.server.protocol import APIS  # noqa: E402

WAIT = 60.0
CODECS = {None: "none", "gzip": "gzip", "snappy": "snappy", "lz4": "lz4"}


@pytest.fixture
def served(store: mqcore.Store) -> Iterator[Server]:
    with Server(store, "127.0.0.1:0", group_initial_rebalance_delay=0.1) as srv:
        yield srv


def stored(store: mqcore.Store, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(m.key, m.value) for m in store.read(topic, 0, 0, 10_000)]


def batch_codecs(store: mqcore.Store, topic: str) -> set[str]:
    """The codecs of the topic's stored batches, read by kafka-python's v2 reader."""
    from kafka.record.memory_records import MemoryRecords

    data = store.log.replica(topic, 0).read_bytes(0, 1 << 30, "log_end").data
    records, codecs = MemoryRecords(data), set()
    names = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    while records.has_next():
        batch = records.next_batch()
        assert batch.magic == 2
        codecs.add(names[batch.compression_type])
    return codecs


@pytest.mark.parametrize("api_version", [(0, 9), (0, 10)])
@pytest.mark.parametrize("codec", list(CODECS))
def test_old_producers_are_stored_as_v2_batches_with_their_codec(
    served: Server, store: mqcore.Store, api_version: tuple[int, int], codec: str | None
) -> None:
    topic = f"old-{api_version[1]}-{codec}"
    store.create_topic(topic)
    producer = kafka.KafkaProducer(bootstrap_servers=served.bootstrap, api_version=api_version,
                                   compression_type=codec, linger_ms=20)  # fmt: skip
    sent = [(b"k%d" % i if i % 3 else None, b"value %d " % i * 10) for i in range(200)]
    try:
        for key, value in sent:
            producer.send(topic, key=key, value=value, partition=0)
        producer.flush(WAIT)
    finally:
        producer.close(WAIT)
    assert stored(store, topic) == sent
    assert batch_codecs(store, topic) == {CODECS[codec]}


@pytest.mark.parametrize("api_version", [(0, 9), (0, 10), (0, 10, 1)])
def test_old_consumers_read_down_converted_message_sets(
    served: Server, store: mqcore.Store, api_version: tuple[int, ...]
) -> None:
    """Records stored as v2 batches (some compressed, with headers an old client cannot
    see) reach a consumer of Fetch v1 (magic 0), v2 or v3 (magic 1) with their offsets,
    keys, values and, for magic 1, timestamps; its group commits through the old versions."""
    store.create_topic("t")
    for i in range(5):
        store.append_batch("t", [b"v%d-%d" % (i, j) for j in range(40)], compression="gzip",
                           headers=[[("h", b"x")]] * 40, partition=0)  # fmt: skip
    want = [(m.offset, m.value, m.timestamp) for m in store.read("t", 0, 0, 1000)]
    consumer = kafka.KafkaConsumer("t", bootstrap_servers=served.bootstrap, group_id="old",
                                   api_version=api_version, auto_offset_reset="earliest",
                                   enable_auto_commit=False,
                                   consumer_timeout_ms=int(WAIT * 1000))  # fmt: skip
    try:
        got = []
        for m in consumer:
            got.append((m.offset, m.value, m.timestamp if api_version >= (0, 10) else None))
            if len(got) == len(want):
                break
        consumer.commit()
    finally:
        consumer.close()
    magic1 = api_version >= (0, 10)
    assert got == [(o, v, t if magic1 else None) for o, v, t in want]
    lag = {(p.topic, p.partition): p.committed for p in store.group_lag("old")["old"]}
    assert lag == {("t", 0): 200}


def test_list_offsets_v0_answers_the_start_and_the_end(served: Server, store: mqcore.Store) -> None:
    """kafka-python at 0.9 asks where a partition begins and ends with ListOffsets v0."""
    store.create_topic("t")
    store.append_batch("t", [b"x"] * 7)
    consumer = kafka.KafkaConsumer(bootstrap_servers=served.bootstrap, api_version=(0, 9))
    try:
        tp = kafka.TopicPartition("t", 0)
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 7
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == 0
    finally:
        consumer.close()


def test_create_and_delete_topics_v0(served: Server, store: mqcore.Store) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=served.bootstrap, api_version=(0, 10, 1))
    try:
        admin.create_topics([NewTopic("made-old", 3, 1)])
        assert store.partitions("made-old") == 3
        admin.delete_topics(["made-old"])
        deadline = time.monotonic() + WAIT
        while "made-old" in store.topics() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "made-old" not in store.topics()
    finally:
        admin.close()


def test_api_versions_lists_what_kafka_3_9_served() -> None:
    floors = {key: low for key, (_, low, _) in APIS.items()}
    for key in (0, 1, 2, 8, 9, 11, 19, 20, 23, 32):  # the versions KIP-896 removed
        assert floors[key] == 0, key


def test_offset_commit_v0_v1_and_fetch_v0(served: Server, store: mqcore.Store) -> None:
    from kafka.protocol.old.commit import (
        OffsetCommitRequest_v0,
        OffsetCommitRequest_v1,
        OffsetFetchRequest_v0,
    )

    store.create_topic("t", partitions=2)
    store.append_batch("t", [b"x"] * 50, partition=0)
    store.append_batch("t", [b"x"] * 50, partition=1)
    r = kafka_python_call(served.address, OffsetCommitRequest_v0("g0", [("t", [(0, 11, "zero")])]))
    assert r.topics[0][1][0][1] == 0  # error_code NONE
    r = kafka_python_call(
        served.address, OffsetCommitRequest_v1("g0", -1, "", [("t", [(1, 22, 0, "one")])])
    )
    assert r.topics[0][1][0][1] == 0
    fetched = kafka_python_call(served.address, OffsetFetchRequest_v0("g0", [("t", [0, 1])]))
    assert [(p[0], p[1], p[2], p[3]) for p in fetched.topics[0][1]] == [
        (0, 11, "zero", 0), (1, 22, "one", 0)
    ]  # fmt: skip
    lag = {(p.topic, p.partition): p.committed for p in store.group_lag("g0")["g0"]}
    assert lag == {("t", 0): 11, ("t", 1): 22}


def test_describe_configs_v0(served: Server, store: mqcore.Store) -> None:
    from kafka.protocol.old.admin import DescribeConfigsRequest_v0

    store.create_topic("t", retention_ms=1234)
    r = kafka_python_call(
        served.address, DescribeConfigsRequest_v0([(2, "t", ["retention.ms", "cleanup.policy"])])
    )
    error_code, _message, _type, name, configs = r.resources[0]
    assert (error_code, name) == (0, "t")
    got = {c[0]: (c[1], c[3]) for c in configs}  # name: (value, is_default)
    assert got == {"retention.ms": ("1234", False), "cleanup.policy": ("delete", True)}
