"""Where librdkafka's own test suite found `mqcore serve` answering otherwise than Kafka (issue
32, "smaller divergences"), each driven as that suite drives it, with clients we did not write
(confluent-kafka/librdkafka, kafka-python) or raw frames where a client cannot send what is
needed: keyless records to a compacted topic (librdkafka test 0011), cleanup.policy as a list
with APPEND and SUBTRACT (0011), replica assignments naming this node (0081), and the
authorized operations of Metadata, DescribeCluster and DescribeGroups."""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path
from typing import Any

import kafkaclients
import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AclOperation,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafkaclients import KioWire, kio_response_frame  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

from mqcore.server.producewire import (  # noqa: E402
    ProduceAnswer,
    ProducedPartition,
    ProducedTopic,
    encode_produce,
)
from mqcore.server.protocol import build  # noqa: E402

WAIT = 30.0
INVALID_REPLICA_ASSIGNMENT, INVALID_REQUEST, INVALID_RECORD = 39, 42, 87
INVALID_DIFFERENT_RECORD = -138  # librdkafka's: another record of the batch was refused
NOT_ASKED = -(2**31)
SECONDS = datetime.timedelta(seconds=5)


def code_of(future: Any) -> int:
    """The Kafka error code a confluent AdminClient future ends with (0: it succeeded)."""
    try:
        future.result(WAIT)
    except ck.KafkaException as e:
        return int(e.args[0].code())
    return 0


def module(key: int, version: int) -> Any:
    """kio's module of request `key` at `version` (its nested entities)."""
    return load_payload_module(key, version, EntityType.request)


# -- keyless records to a compacted topic (librdkafka test 0011) ----------------------------------


def produce_all(bootstrap: str, topic: str, keys: list[bytes | None], **conf: Any) -> list[int]:
    """Produce one message per key to partition 0 and return each delivery's error code (0:
    delivered), in order; the messages go out together (one batch) unless `conf` says."""
    codes: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        codes[int(msg.value()[1:])] = err.code() if err else 0

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5000, **conf})
    for i, key in enumerate(keys):
        p.produce(topic, value=b"v%d" % i, key=key, partition=0, on_delivery=delivered)
    assert p.flush(WAIT) == 0
    return [codes[i] for i in range(len(keys))]


def test_confluent_keyless_records_to_a_compacted_topic_are_refused_by_record(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """Kafka answers INVALID_RECORD with record_errors naming each keyless record of the batch:
    librdkafka fails those with INVALID_RECORD and the rest of the batch with
    _INVALID_DIFFERENT_RECORD (one batch), or only those (a batch a message)."""
    store.create_topic("c", cleanup_policy="compact")
    keys = [None if i % 10 == 0 else b"k%d" % i for i in range(100)]
    codes = produce_all(kafka_server.bootstrap, "c", keys)
    assert [i for i, c in enumerate(codes) if c == ck.KafkaError.INVALID_RECORD] == list(
        range(0, 100, 10)
    )
    assert codes.count(INVALID_DIFFERENT_RECORD) == 90
    assert store.end_offset("c") == 0  # nothing of the batch was written
    codes = produce_all(kafka_server.bootstrap, "c", keys, **{"batch.size": 1})
    assert codes == [ck.KafkaError.INVALID_RECORD if k is None else 0 for k in keys]
    assert [m.key for m in store.read("c", 0, 0, 1000)] == [k for k in keys if k is not None]


def keyed_batch(keys: list[bytes | None]) -> bytes:
    """A v2 batch as a Kafka producer builds it (kafka-python's codec, not ours)."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, key in enumerate(keys):
        b.append(i, 1_700_000_000_000, key, b"v%d" % i, [])
    return bytes(b.build())


@pytest.mark.parametrize("version", [3, 7, 8, 9, 11])
def test_produce_names_keyless_records_where_the_version_has_record_errors(
    kafka_server: Any, store: mqcore.Store, version: int
) -> None:
    store.create_topic("c", cleanup_policy="delete, compact")
    m = module(0, version)
    wire = KioWire(kafka_server.address)
    try:
        answer = wire.call(0, version, transactional_id=None, acks=-1, timeout=SECONDS,
                           topic_data=(m.TopicProduceData(name="c", partition_data=(
                               m.PartitionProduceData(index=0, records=keyed_batch(
                                   [b"a", None, b"b", None])),)),))  # fmt: skip
    finally:
        wire.close()
    (part,) = answer.responses[0].partition_responses
    assert part.error_code == INVALID_RECORD
    if version >= 8:
        assert [e.batch_index for e in part.record_errors] == [1, 3]
        assert all("key" in (e.batch_index_error_message or "") for e in part.record_errors)
        assert "compacted" in (part.error_message or "")
    assert store.end_offset("c") == 0


def test_encode_produce_writes_record_errors_as_kio_does() -> None:
    """The hand-written response's record_errors, byte for byte against kio's writer."""
    errors = ((1, "no key"), (3, None))
    for version in range(8, 12):
        answer = ProduceAnswer([ProducedTopic("c", [ProducedPartition(
            0, INVALID_RECORD, -1, -1, 5, "refused", errors)])])  # fmt: skip
        m = load_payload_module(0, version, EntityType.response)
        rec = tuple(m.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=t)
                    for i, t in errors)  # fmt: skip
        fields = set(m.PartitionProduceResponse.__dataclass_fields__)
        values = dict(index=0, error_code=ErrorCode(INVALID_RECORD), base_offset=-1,
                      log_append_time=None,
                      log_start_offset=5, record_errors=rec, error_message="refused",
                      current_leader=m.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)
                      if "current_leader" in fields else None)  # fmt: skip
        part = m.PartitionProduceResponse(**{k: v for k, v in values.items() if k in fields})
        body = dict(responses=(m.TopicProduceResponse(name="c", partition_responses=(part,)),),
                    throttle_time=datetime.timedelta(0), node_endpoints=())  # fmt: skip
        assert encode_produce(version, 7, answer) == kio_response_frame(
            m.ProduceResponse, 7, body
        ), version


# -- cleanup.policy is a list -------------------------------------------------------------------


def alter(admin: AdminClient, topic: str, op: Any, name: str, value: str | None) -> int:
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op)])  # fmt: skip
    return code_of(admin.incremental_alter_configs([res])[res])


def described(admin: AdminClient, topic: str, name: str) -> Any:
    res = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([res])[res].result(WAIT)[name]


def test_cleanup_policy_is_a_list_that_append_and_subtract_change(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """librdkafka 0011 turns compaction on with APPEND and off with SUBTRACT; DescribeConfigs
    answers the list as Kafka writes it (its items joined by ","), typed LIST."""
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    made = admin.create_topics([NewTopic("t", 1, config={"cleanup.policy": "compact , delete"})])
    assert code_of(made["t"]) == 0
    assert store.topic_config("t").cleanup_policy == "compact,delete"
    steps = [(AlterConfigOpType.SUBTRACT, "compact", "delete"),
             (AlterConfigOpType.APPEND, "compact", "delete,compact"),
             (AlterConfigOpType.APPEND, "delete", "delete,compact"),
             (AlterConfigOpType.SUBTRACT, "delete,compact", ""),
             (AlterConfigOpType.APPEND, "compact", "compact")]  # fmt: skip
    for op, value, want in steps:
        assert alter(admin, "t", op, "cleanup.policy", value) == 0, (op, value)
        assert store.topic_config("t").cleanup_policy == want
        assert described(admin, "t", "cleanup.policy").value == want
    resource = module(32, 4).DescribeConfigsResource(
        resource_type=2, resource_name="t", configuration_keys=("cleanup.policy",)
    )
    wire = KioWire(kafka_server.address)
    try:
        got = wire.call(32, 4, include_synonyms=False, include_documentation=False,
                        resources=(resource,))  # fmt: skip
    finally:
        wire.close()
    (entry,) = got.results[0].configs
    assert (entry.value, entry.config_type) == ("compact", 7)  # ConfigType LIST
    for op, name, value in ((AlterConfigOpType.APPEND, "cleanup.policy", "shrink"),
                            (AlterConfigOpType.APPEND, "retention.ms", "5"),
                            (AlterConfigOpType.SUBTRACT, "compression.type", "gzip")):  # fmt: skip
        assert alter(admin, "t", op, name, value) == ck.KafkaError.INVALID_CONFIG, (op, name)
    assert store.topic_config("t").cleanup_policy == "compact"


def test_a_config_named_twice_in_one_resource_is_an_invalid_request(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """Kafka refuses a resource naming one config twice (INVALID_REQUEST) rather than apply
    its operations in turn; nothing changes."""
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig,
        AlterConfigsResource,
    )

    store.create_topic("t", retention_ms=1000)
    twice = (AlterableConfig(name="retention.ms", config_operation=0, value="5"),
             AlterableConfig(name="retention.ms", config_operation=0, value="6"))  # fmt: skip
    wire = KioWire(kafka_server.address)
    try:
        r = wire.call(44, 1, validate_only=False, resources=(
            AlterConfigsResource(resource_type=2, resource_name="t", configs=twice),))  # fmt: skip
    finally:
        wire.close()
    assert r.responses[0].error_code == ErrorCode.invalid_request
    assert store.topic_config("t").retention_ms == 1000


def test_an_empty_cleanup_policy_keeps_everything(store: mqcore.Store) -> None:
    """Kafka 3.9 takes an empty list: neither retention nor compaction applies."""
    store.create_topic("k", cleanup_policy="", retention_ms=1, segment_bytes=200)
    for i in range(20):
        store.append("k", b"x" * 50, key=None, timestamp=1_000 + i)
    assert store.topic_config("k").cleanup_policies == ()
    report = store.apply_retention("k", now=10**13)
    assert report.deleted_segments == [] and store.start_offset("k") == 0
    with pytest.raises(mqcore.errors.InvalidConfigError, match="cleanup_policy"):
        store.compact("k")


# -- replica assignments naming this node (librdkafka test 0081) ---------------------------------


def test_confluent_creates_topics_and_partitions_with_this_nodes_assignment(
    kafka_server: Any, store: mqcore.Store
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    # as librdkafka's test builds them: the partition count, replication factor -1 and the
    # assignment (librdkafka then sends -1 for both, as Kafka requires)
    made = admin.create_topics([NewTopic(t, len(a), -1, replica_assignment=a) for t, a in (
        ("a", [[0], [0], [0]]), ("b", [[1]]), ("c", [[0, 0]]))])  # fmt: skip
    codes = [code_of(made[t]) for t in "abc"]
    assert codes == [0, INVALID_REPLICA_ASSIGNMENT, INVALID_REPLICA_ASSIGNMENT]
    assert store.topics() == ["a"] and store.partitions("a") == 3
    md = admin.list_topics("a", timeout=WAIT).topics["a"]
    assert sorted(md.partitions) == [0, 1, 2]
    assert all(p.replicas == [0] for p in md.partitions.values())
    grown = admin.create_partitions([NewPartitions("a", 5, replica_assignment=[[0], [0]])])
    assert code_of(grown["a"]) == 0 and store.partitions("a") == 5


def test_create_topics_checks_assignments_as_kafkas_controller(
    kafka_server: Any, store: mqcore.Store
) -> None:
    m = module(19, 7)

    def topic(name: str, assignments: list[tuple[int, list[int]]], count: int = -1) -> Any:
        return m.CreatableTopic(name=name, num_partitions=count, replication_factor=-1,
                                assignments=tuple(m.CreatableReplicaAssignment(
                                    partition_index=i, broker_ids=tuple(b))
                                    for i, b in assignments), configs=())  # fmt: skip

    wire = KioWire(kafka_server.address)
    try:
        answer = wire.call(19, 7, timeout=SECONDS, validate_only=False, topics=(
            topic("counted", [(0, [0])], count=1),
            topic("gap", [(0, [0]), (2, [0])]),
            topic("twice", [(0, [0]), (0, [0])]),
            topic("empty", [(0, [])]),
            topic("ok", [(1, [0]), (0, [0])]),
        ))  # fmt: skip
    finally:
        wire.close()
    codes = {t.name: (t.error_code, t.num_partitions) for t in answer.topics}
    assert codes == {"counted": (INVALID_REQUEST, -1), "gap": (INVALID_REPLICA_ASSIGNMENT, -1),
                     "twice": (INVALID_REPLICA_ASSIGNMENT, -1),
                     "empty": (INVALID_REPLICA_ASSIGNMENT, -1), "ok": (0, 2)}  # fmt: skip
    assert store.topics() == ["ok"] and store.partitions("ok") == 2


# -- authorized operations ------------------------------------------------------------------------

TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
             AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
             AclOperation.ALTER_CONFIGS}  # fmt: skip
CLUSTER_OPS = {AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE,
               AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}  # fmt: skip
GROUP_OPS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}


def operations_seen(admin: AdminClient, topic: str, group: str) -> tuple[set[Any], ...]:
    """What the admin client reads back for a topic, the cluster and a group."""
    topics = admin.describe_topics(ck.TopicCollection([topic]), include_authorized_operations=True)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(WAIT)
    groups = admin.describe_consumer_groups([group], include_authorized_operations=True)
    return (set(topics[topic].result(WAIT).authorized_operations or ()),
            set(cluster.authorized_operations or ()),
            set(groups[group].result(WAIT).authorized_operations or ()))  # fmt: skip


def commit_offsets(bootstrap: str, group: str, topic: str, **conf: Any) -> None:
    """Give `group` a committed offset (it then exists, Empty), as a consumer would."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, **conf})
    try:
        c.commit(offsets=[ck.TopicPartition(topic, 0, 1)], asynchronous=False)
    finally:
        c.close()


def test_without_acls_every_operation_kafka_has_is_authorized(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("t")
    commit_offsets(kafka_server.bootstrap, "g", "t")
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    assert operations_seen(admin, "t", "g") == (TOPIC_OPS, CLUSTER_OPS, GROUP_OPS)


ACL = """
alice    read,write,create   *
alice    all                 group:*
reader   read                rep*
reader   describe            group:g
"""


@pytest.fixture
def sasl_server(store: mqcore.Store, tmp_path: Path) -> Any:
    with kafkaclients.sasl_acl_server(store, tmp_path, ACL) as srv:
        yield srv


def sasl_conf(user: str, password: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": user, "sasl.password": password}  # fmt: skip


def test_authorized_operations_follow_the_principals_grants(
    sasl_server: Any, store: mqcore.Store
) -> None:
    """The ACL file's grants as Kafka's operations, each with what it implies: read gives
    describe, a topic's describe its configs' describe, create the topic's management
    (delete, alter, alter configs); no line grants the cluster, so it answers none."""
    store.create_topic("report")
    alice = sasl_conf("alice", "alice-secret-Pa55")
    commit_offsets(sasl_server.bootstrap, "g", "report", **alice)
    admin = AdminClient({"bootstrap.servers": sasl_server.bootstrap, **alice})
    assert operations_seen(admin, "report", "g") == (TOPIC_OPS, set(), GROUP_OPS)
    reader = AdminClient({"bootstrap.servers": sasl_server.bootstrap,
                          **sasl_conf("reader", "reader-secret-9x")})  # fmt: skip
    assert operations_seen(reader, "report", "g") == (
        {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS}, set(),
        {AclOperation.DESCRIBE},
    )  # fmt: skip


def bits(ops: set[Any]) -> int:
    """Kafka's bit field of a set of operations, as a signed int32 (none here sets bit 31)."""
    return sum(1 << op.value for op in ops)


def test_operations_are_answered_only_when_asked_and_where_the_version_has_them(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """Metadata v8-v10 carry the cluster's operations, v8+ each topic's; DescribeCluster and
    DescribeGroups v3+ theirs: each -2147483648 unless the request asks (and for a group
    answered with an error, as Kafka)."""
    store.create_topic("t")
    wire = KioWire(kafka_server.address)
    try:
        for version, asked in ((8, True), (10, False), (10, True), (12, True)):
            m = module(3, version)
            wanted = build(m.MetadataRequestTopic, name="t", topic_id=uuid.UUID(int=0))
            got = wire.call(3, version, topics=(wanted,), allow_auto_topic_creation=False,
                            include_cluster_authorized_operations=asked,
                            include_topic_authorized_operations=asked)  # fmt: skip
            ops = got.topics[0].topic_authorized_operations
            assert ops == (bits(TOPIC_OPS) if asked else NOT_ASKED), version
            if version <= 10:
                cluster = got.cluster_authorized_operations
                assert cluster == (bits(CLUSTER_OPS) if asked else NOT_ASKED), version
        for asked in (False, True):
            got = wire.call(60, 1, include_cluster_authorized_operations=asked, endpoint_type=1)
            want = bits(CLUSTER_OPS) if asked else NOT_ASKED
            assert got.cluster_authorized_operations == want
        for version in (3, 5):
            got = wire.call(15, version, groups=("nobody",), include_authorized_operations=True)
            assert got.groups[0].authorized_operations == bits(GROUP_OPS), version
        got = wire.call(15, 6, groups=("nobody",), include_authorized_operations=True)
        assert got.groups[0].authorized_operations == NOT_ASKED  # GROUP_ID_NOT_FOUND
    finally:
        wire.close()
