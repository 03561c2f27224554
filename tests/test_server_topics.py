"""DeleteTopics and CreatePartitions served by `mqcore serve`, driven by Kafka's admin clients
we did not write (confluent-kafka's AdminClient, kafka-python's KafkaAdminClient): what they
delete is gone from the store, what they grow is where producers route keys and consumers
read; refusals carry Kafka's error codes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import kafkaclients
import pytest

import mqcore
from mqcore._ext.hashing import kafka_partition

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewPartitions  # noqa: E402
from kafka.admin import KafkaAdminClient  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

from mqcore.server import Server  # noqa: E402

WAIT = 30.0
UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS, INVALID_REPLICA_ASSIGNMENT = 3, 37, 39
INVALID_REQUEST = 42
TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID = 29, 100


def code_of(future: Any) -> int:
    """The Kafka error code a confluent AdminClient future ends with (0: it succeeded)."""
    try:
        future.result(WAIT)
    except ck.KafkaException as e:
        return int(e.args[0].code())
    return 0


def consume_all(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    """The first `n` messages of the topic's partitions, read with assign() (no group)."""
    return kafkaclients.consume_confluent({"bootstrap.servers": bootstrap}, topic, partitions, n)


# -- DeleteTopics ---------------------------------------------------------------------------------


def test_confluent_admin_deletes_a_topic_and_a_producer_recreates_it_fresh(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("gone", partitions=3)
    store.create_topic("kept")
    store.append_batch("gone", [b"old%d" % i for i in range(30)], partition=2)
    store.append("kept", b"k")
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    done = admin.delete_topics(["gone", "nope"], operation_timeout=WAIT)
    assert code_of(done["gone"]) == 0
    assert code_of(done["nope"]) == UNKNOWN_TOPIC_OR_PARTITION
    assert store.topics() == ["kept"]
    assert "gone" not in admin.list_topics(timeout=WAIT).topics
    # the server auto-creates topics: a producer naming it makes a new one, from offset 0
    p = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap)
    md = p.send("gone", b"new").get(timeout=WAIT)
    p.close()
    assert (md.partition, md.offset) == (0, 0)
    assert store.partitions("gone") == 1  # the server's default, not the old 3
    assert [m.value for m in store.read("gone", 0, 0, 100)] == [b"new"]
    assert [m.value for m in store.read("kept", 0, 0, 100)] == [b"k"]


def test_without_auto_create_a_deleted_topic_stays_unknown(store: mqcore.Store) -> None:
    store.create_topic("gone")
    with Server(store, listen="127.0.0.1:0", auto_create_topics=False) as srv:
        admin = AdminClient({"bootstrap.servers": srv.bootstrap})
        assert code_of(admin.delete_topics(["gone"])["gone"]) == 0
        p = kafka.KafkaProducer(bootstrap_servers=srv.bootstrap, max_block_ms=2000)
        try:
            with pytest.raises(kafka.errors.KafkaTimeoutError):  # never in Metadata
                p.send("gone", b"v").get(timeout=WAIT)
        finally:
            p.close()
        listed = admin.list_topics(topic="gone", timeout=WAIT).topics["gone"]
        assert listed.error.code() == UNKNOWN_TOPIC_OR_PARTITION
    assert store.topics() == []


def test_metadata_naming_consumer_offsets_makes_it_as_kafka_makes_its_internal_topic(
    store: mqcore.Store,
) -> None:
    """Burrow (over sarama, Metadata v1) names __consumer_offsets before any group committed:
    Kafka's broker creates its internal topic then, whatever auto.create.topics.enable says, so
    it answers the topic (internal, one partition here) and a later commit lands in it. A
    request that does not allow auto-creation (v4+) gets UNKNOWN_TOPIC_OR_PARTITION; another
    missing topic stays unknown on a server that does not auto-create."""
    v1 = load_payload_module(3, 1, EntityType.request)
    v4 = load_payload_module(3, 4, EntityType.request)
    with Server(store, listen="127.0.0.1:0", auto_create_topics=False) as srv:
        wire = kafkaclients.KioWire(srv.address)
        try:
            r = wire.call(3, 4, topics=(v4.MetadataRequestTopic(name="__consumer_offsets"),),
                          allow_auto_topic_creation=False)  # fmt: skip
            assert [int(t.error_code) for t in r.topics] == [UNKNOWN_TOPIC_OR_PARTITION]
            assert store.topics() == []
            r = wire.call(3, 1, topics=tuple(v1.MetadataRequestTopic(name=n)
                                             for n in ("__consumer_offsets", "other")))  # fmt: skip
            got = {t.name: (int(t.error_code), t.is_internal, len(t.partitions)) for t in r.topics}
            assert got == {"__consumer_offsets": (0, True, 1),
                           "other": (UNKNOWN_TOPIC_OR_PARTITION, False, 0)}  # fmt: skip
        finally:
            wire.close()
        assert store.topics() == ["__consumer_offsets"]
        store.create_topic("t")
        store.alter_group_offsets("g", {("t", 0): 0})
        assert [(x.topic, x.committed) for x in store.group_lag("g")["g"]] == [("t", 0)]


def test_kafka_python_deletes_by_name_and_by_the_id_metadata_gives(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """kafka-python sends DeleteTopics v6, which may name a topic by ID: the ID Metadata gives
    deletes that topic, an ID of no topic is UNKNOWN_TOPIC_ID (and nothing is deleted)."""
    store.create_topic("a", partitions=2)
    store.create_topic("b")
    store.create_topic("c")
    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap)
    try:
        ids = {t["name"]: t["topic_id"] for t in admin.describe_topics(["a", "b", "c"])}
        assert len(set(ids.values())) == 3 and str(uuid.UUID(int=0)) not in ids.values()
        some_id = uuid.uuid4()
        got = admin.delete_topics(["a", some_id, uuid.UUID(ids["c"])], raise_errors=False)
        codes = {(t["name"], t["topic_id"]): t["error_code"] for t in got["topics"]}
        assert codes == {
            ("a", ids["a"]): 0,
            (None, str(some_id)): UNKNOWN_TOPIC_ID,
            ("c", ids["c"]): 0,
        }
        assert store.topics() == ["b"]
        twice = admin.delete_topics(["b", "b"], raise_errors=False)
        assert [t["error_code"] for t in twice["topics"]] == [INVALID_REQUEST] * 2
        assert store.topics() == ["b"]
        internal = admin.delete_topics(["__consumer_offsets"], raise_errors=False)
        assert internal["topics"][0]["error_code"] != 0
    finally:
        admin.close()


# -- CreatePartitions -----------------------------------------------------------------------------


def test_confluent_admin_adds_partitions_producers_spread_keys_and_consumers_read_them(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("grow", partitions=2)
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    asked = admin.create_partitions([NewPartitions("grow", 5)], validate_only=True)
    assert code_of(asked["grow"]) == 0
    assert store.partitions("grow") == 2  # validate_only changes nothing
    assert code_of(admin.create_partitions([NewPartitions("grow", 5)])["grow"]) == 0
    assert store.partitions("grow") == 5
    listed = admin.list_topics(timeout=WAIT).topics["grow"]
    assert sorted(listed.partitions) == [0, 1, 2, 3, 4]
    keys = [b"key-%d" % i for i in range(100)]
    p = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap)  # murmur2, as Kafka's
    placed = {k: p.send("grow", k, key=k).get(timeout=WAIT).partition for k in keys}
    p.close()
    assert placed == {k: kafka_partition(k, 5) for k in keys}
    assert set(placed.values()) == {0, 1, 2, 3, 4}
    got = consume_all(kafka_server.bootstrap, "grow", 5, len(keys))
    assert sorted((m.partition(), m.key()) for m in got) == sorted(
        (p_, k) for k, p_ in placed.items()
    )


def test_create_partitions_refusals_carry_kafkas_codes(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("t", partitions=3)
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    for count in (2, 3):
        done = admin.create_partitions([NewPartitions("t", count)])
        assert code_of(done["t"]) == INVALID_PARTITIONS, count
    assert code_of(admin.create_partitions([NewPartitions("nope", 4)])["nope"]) == (
        UNKNOWN_TOPIC_OR_PARTITION
    )
    # a replica assignment may name only this node (node 0), one list per new partition
    for assignment in ([[1]], [[0, 0]]):
        placed = admin.create_partitions([NewPartitions("t", 4, replica_assignment=assignment)])
        assert code_of(placed["t"]) == INVALID_REPLICA_ASSIGNMENT, assignment
    assert store.partitions("t") == 3
    placed = admin.create_partitions([NewPartitions("t", 5, replica_assignment=[[0], [0]])])
    assert code_of(placed["t"]) == 0
    assert store.partitions("t") == 5


def test_kafka_python_adds_partitions(kafka_server: Any, store: mqcore.Store) -> None:
    store.create_topic("kp", partitions=1)
    store.append("kp", b"before")
    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap)
    try:
        admin.create_partitions({"kp": 3})
        assert store.partitions("kp") == 3
        with pytest.raises(kafka.errors.InvalidPartitionsError):
            admin.create_partitions({"kp": 2})
        twice = admin.create_partitions({"kp": 6, "other": 2}, raise_errors=False)
        assert {r.name for r in twice.results} == {"kp", "other"}
    finally:
        admin.close()
    assert store.partitions("kp") == 6
    assert [m.value for m in store.read("kp", 0, 0, 10)] == [b"before"]


# -- authorization --------------------------------------------------------------------------------

ACL = """
alice    read,write,create   *
reader   read                *
"""


@pytest.fixture
def sasl_server(store: mqcore.Store, tmp_path: Path) -> Any:
    with kafkaclients.sasl_acl_server(store, tmp_path, ACL) as srv:
        yield srv


def admin_as(srv: Any, user: str, password: str) -> Any:
    return AdminClient({
        "bootstrap.servers": srv.bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password,
    })  # fmt: skip


def test_deleting_and_growing_need_the_create_grant(sasl_server: Any, store: mqcore.Store) -> None:
    store.create_topic("t", partitions=1)
    reader = admin_as(sasl_server, "reader", "reader-secret-9x")
    assert code_of(reader.delete_topics(["t"])["t"]) == TOPIC_AUTHORIZATION_FAILED
    grown = reader.create_partitions([NewPartitions("t", 2)])
    assert code_of(grown["t"]) == TOPIC_AUTHORIZATION_FAILED
    assert store.topics() == ["t"] and store.partitions("t") == 1
    alice = admin_as(sasl_server, "alice", "alice-secret-Pa55")
    assert code_of(alice.create_partitions([NewPartitions("t", 2)])["t"]) == 0
    assert code_of(alice.delete_topics(["t"])["t"]) == 0
    assert store.topics() == []


def test_a_consumer_fetching_while_its_topic_is_deleted_gets_errors_not_a_dead_server(
    store: mqcore.Store,
) -> None:
    """A kafka-python consumer polls the topic while an admin client deletes it: the server
    answers both, and goes on serving the name created again. (Auto-creation off: the
    consumer's Metadata requests would otherwise make the topic again at once.)"""
    store.create_topic("busy", partitions=2)
    store.append_batch("busy", [b"x%d" % i for i in range(200)], partition=0)
    with Server(store, listen="127.0.0.1:0", auto_create_topics=False) as srv:
        c = kafka.KafkaConsumer(bootstrap_servers=srv.bootstrap, fetch_max_wait_ms=100,
                                enable_auto_commit=False)  # fmt: skip
        try:
            c.assign([kafka.TopicPartition("busy", p) for p in range(2)])
            c.seek_to_beginning()
            assert sum(len(v) for v in c.poll(timeout_ms=int(WAIT * 1000)).values()) > 0
            admin = AdminClient({"bootstrap.servers": srv.bootstrap})
            done = admin.delete_topics(["busy"])["busy"]
            for _ in range(5):  # fetches of the deleted topic: errors the client handles
                c.poll(timeout_ms=200)
            assert code_of(done) == 0
            assert store.topics() == []
            store.create_topic("busy", partitions=2)
            store.append("busy", b"again", partition=1)
            p = kafka.KafkaProducer(bootstrap_servers=srv.bootstrap)
            p.send("busy", b"wire", partition=1).get(timeout=WAIT)
            p.close()
        finally:
            c.close()
    assert [m.value for m in store.read("busy", 1, 0, 10)] == [b"again", b"wire"]
