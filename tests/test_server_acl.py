"""The ACLs of the Kafka listener as a table: (operation, principal) -> the answer, every row
run over a real SASL connection (raw frames written by kio from Kafka's schemas, so each
answer's error code is read as sent), against a store holding a topic, a group's committed
offsets and `__consumer_offsets`. A refused row also checks that nothing stored changed.

The HTTP API's and the console's rows of the same model are in tests/test_server_http_acl.py
(docs/server.md "Security" states the model)."""

from __future__ import annotations

import datetime
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafkaclients import KioWire

import mqcore

server_mod = pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kio.schema.errors import ErrorCode  # noqa: E402

from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402
from mqcore.server.protocol import api  # noqa: E402

PASSWORD = "pw-{}-Secret9"
ACL = """
owner   all        *                   # every ordinary topic: not the internal ones
owner   all        group:billing*
reader  read       orders.public
ops     read       __consumer_offsets  # an internal topic, named by its own grant
ops     describe   group:*
"""
PRINCIPALS = ("owner", "reader", "ops", "nobody")
SECRET, PUBLIC, OFFSETS = "orders.private", "orders.public", "__consumer_offsets"
GROUP = "billing"
TIMEOUT = datetime.timedelta(seconds=30)

OK = ErrorCode.none
TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed


def module(key: int, version: int) -> Any:
    import importlib

    found = api(key, version)
    assert found is not None
    return importlib.import_module(found.request.__module__)


def batch(value: bytes) -> bytes:
    """A v2 batch as a Kafka producer builds it (kafka-python's codec, not ours)."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    b.append(0, int(time.time() * 1000), None, value, [])
    return bytes(b.build())


class Wire(KioWire):
    """A KioWire logged in with SASL/PLAIN (SaslHandshake v1, then SaslAuthenticate)."""

    def login(self, user: str) -> None:
        assert self.call(17, 1, mechanism="PLAIN").error_code == OK
        token = f"\0{user}\0{PASSWORD.format(user)}".encode()
        assert self.call(36, 2, auth_bytes=token).error_code == OK


# -- the operations: each returns what the principal got --------------------------------------


def produce(w: Wire, topic: str) -> Any:
    m = module(0, 9)
    r = w.call(0, 9, transactional_id=None, acks=-1, timeout=TIMEOUT, topic_data=(
        m.TopicProduceData(name=topic, partition_data=(
            m.PartitionProduceData(index=0, records=batch(b"forged")),)),))  # fmt: skip
    return r.responses[0].partition_responses[0].error_code


def fetch(w: Wire, topic: str) -> Any:
    m = module(1, 12)
    r = w.call(1, 12, cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(0),
               min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
               session_epoch=-1, forgotten_topics_data=(), rack_id="", topics=(
                   m.FetchTopic(topic=topic, partitions=(m.FetchPartition(
                       partition=0, current_leader_epoch=-1, fetch_offset=0,
                       last_fetched_epoch=-1, log_start_offset=-1,
                       partition_max_bytes=1 << 20),)),))  # fmt: skip
    return r.responses[0].partitions[0].error_code


def list_offsets(w: Wire, topic: str) -> Any:
    m = module(2, 7)
    r = w.call(2, 7, replica_id=-1, isolation_level=0, topics=(m.ListOffsetsTopic(
        name=topic, partitions=(m.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=-1),)),))  # fmt: skip
    return r.topics[0].partitions[0].error_code


def epoch_end(w: Wire, topic: str, replica: int) -> Any:
    m = module(23, 4)
    asked = m.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=0)
    r = w.call(23, 4, replica_id=replica,
               topics=(m.OffsetForLeaderTopic(topic=topic, partitions=(asked,)),))  # fmt: skip
    return r.topics[0].partitions[0].error_code


def leader_epoch(w: Wire, topic: str) -> Any:
    """A consumer's OffsetForLeaderEpoch (KIP-320): describe on the topic."""
    return epoch_end(w, topic, -1)


def replica_leader_epoch(w: Wire, topic: str) -> Any:
    """A replica's (replica_id set): Kafka's CLUSTER_ACTION, which no ACL line grants."""
    return epoch_end(w, topic, 2)


def metadata_named(w: Wire, topic: str) -> Any:
    m = module(3, 12)
    r = w.call(
        3,
        12,
        topics=(m.MetadataRequestTopic(topic_id=None, name=topic),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return r.topics[0].error_code


def metadata_lists(w: Wire, topic: str) -> str:
    r = w.call(3, 12, topics=None, allow_auto_topic_creation=False,
               include_topic_authorized_operations=False)  # fmt: skip
    return "listed" if topic in {t.name for t in r.topics} else "hidden"


def describe_configs(w: Wire, topic: str) -> Any:
    m = module(32, 4)
    r = w.call(32, 4, include_synonyms=False, include_documentation=False, resources=(
        m.DescribeConfigsResource(resource_type=2, resource_name=topic,
                                  configuration_keys=None),))  # fmt: skip
    return r.results[0].error_code


def create_topic(w: Wire, topic: str) -> Any:
    m = module(19, 7)
    r = w.call(19, 7, timeout=TIMEOUT, validate_only=False, topics=(m.CreatableTopic(
        name=topic + ".new", num_partitions=1, replication_factor=-1, assignments=(),
        configs=()),))  # fmt: skip
    return r.topics[0].error_code


def delete_topic(w: Wire, topic: str) -> Any:
    m = module(20, 6)
    r = w.call(20, 6, timeout=TIMEOUT, topics=(m.DeleteTopicState(name=topic, topic_id=None),))
    return r.responses[0].error_code


def create_partitions(w: Wire, topic: str) -> Any:
    m = module(37, 3)
    r = w.call(37, 3, timeout=TIMEOUT, validate_only=False, topics=(
        m.CreatePartitionsTopic(name=topic, count=3, assignments=None),))  # fmt: skip
    return r.results[0].error_code


def alter_configs(w: Wire, topic: str) -> Any:
    m = module(44, 1)
    r = w.call(44, 1, validate_only=False, resources=(m.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=(m.AlterableConfig(
            name="retention.ms", config_operation=0, value="1000"),)),))  # fmt: skip
    return r.responses[0].error_code


def delete_records(w: Wire, topic: str) -> Any:
    m = module(21, 2)
    r = w.call(21, 2, timeout=TIMEOUT, topics=(m.DeleteRecordsTopic(name=topic, partitions=(
        m.DeleteRecordsPartition(partition_index=0, offset=-1),)),))  # fmt: skip
    return r.topics[0].partitions[0].error_code


def find_coordinator(w: Wire, group: str) -> Any:
    return w.call(10, 3, key=group, key_type=0).error_code


def join_group(w: Wire, group: str) -> Any:
    m = module(11, 7)
    r = w.call(11, 7, group_id=group, session_timeout=datetime.timedelta(seconds=10),
               rebalance_timeout=datetime.timedelta(seconds=10), member_id="",
               group_instance_id=None, protocol_type="consumer",
               protocols=(m.JoinGroupRequestProtocol(name="range", metadata=b""),))  # fmt: skip
    return r.error_code


def heartbeat(w: Wire, group: str) -> Any:
    return w.call(12, 4, group_id=group, generation_id=1, member_id="m",
                  group_instance_id=None).error_code  # fmt: skip


def sync_group(w: Wire, group: str) -> Any:
    return w.call(14, 5, group_id=group, generation_id=1, member_id="m", group_instance_id=None,
                  protocol_type=None, protocol_name=None, assignments=()).error_code  # fmt: skip


def leave_group(w: Wire, group: str) -> Any:
    m = module(13, 4)
    return w.call(13, 4, group_id=group, members=(
        m.MemberIdentity(member_id="m", group_instance_id=None),)).error_code  # fmt: skip


def offset_commit(w: Wire, group: str) -> Any:
    m = module(8, 8)
    r = w.call(8, 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
               group_instance_id=None, topics=(m.OffsetCommitRequestTopic(name=PUBLIC,
                   partitions=(m.OffsetCommitRequestPartition(partition_index=0,
                       committed_offset=424242, committed_leader_epoch=-1,
                       committed_metadata=""),)),))  # fmt: skip
    return r.topics[0].partitions[0].error_code


def offset_fetch(w: Wire, group: str) -> Any:
    m = module(9, 8)
    r = w.call(9, 8, require_stable=False, groups=(m.OffsetFetchRequestGroup(
        group_id=group, topics=None),))  # fmt: skip
    got = r.groups[0]
    if got.error_code != OK:
        return got.error_code
    return "offsets" if got.topics else "none shown"


def describe_group(w: Wire, group: str) -> Any:
    return w.call(15, 5, groups=(group,), include_authorized_operations=False).groups[0].error_code


def list_groups(w: Wire, group: str) -> str:
    r = w.call(16, 4, states_filter=())
    return "listed" if group in {g.group_id for g in r.groups} else "hidden"


def delete_group(w: Wire, group: str) -> Any:
    return w.call(42, 2, groups_names=(group,)).results[0].error_code


def offset_delete(w: Wire, group: str) -> Any:
    m = module(47, 0)
    part = m.OffsetDeleteRequestPartition(partition_index=0)
    r = w.call(47, 0, group_id=group, topics=(
        m.OffsetDeleteRequestTopic(name=SECRET, partitions=(part,)),))  # fmt: skip
    return r.error_code if r.error_code != OK else r.topics[0].partitions[0].error_code


Op = Callable[[Wire, str], Any]

# (operation, its argument, principal) -> answer: every row is a test
TABLE: list[tuple[Op, str, str, Any]] = [
    *[(produce, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(produce, OFFSETS, p, TOPIC_DENIED) for p in PRINCIPALS],  # no grant writes it
    *[(fetch, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(fetch, PUBLIC, p, OK if p in ("owner", "reader") else TOPIC_DENIED) for p in PRINCIPALS],
    *[(fetch, OFFSETS, p, OK if p == "ops" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(list_offsets, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(leader_epoch, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(leader_epoch, PUBLIC, p, OK if p in ("owner", "reader") else TOPIC_DENIED)
      for p in PRINCIPALS],
    *[(replica_leader_epoch, SECRET, p, ErrorCode.cluster_authorization_failed)
      for p in PRINCIPALS],
    *[(metadata_named, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(metadata_named, OFFSETS, p, OK if p == "ops" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(metadata_lists, SECRET, p, "listed" if p == "owner" else "hidden") for p in PRINCIPALS],
    *[(metadata_lists, OFFSETS, p, "listed" if p == "ops" else "hidden") for p in PRINCIPALS],
    *[(describe_configs, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(create_topic, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(delete_topic, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(create_partitions, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(alter_configs, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(delete_records, SECRET, p, OK if p == "owner" else TOPIC_DENIED) for p in PRINCIPALS],
    *[(delete_records, OFFSETS, p, TOPIC_DENIED) for p in PRINCIPALS],
    # groups: billing is the owner's; ops may describe every group, not join or delete one
    *[(find_coordinator, GROUP, p, OK if p in ("owner", "ops") else GROUP_DENIED)
      for p in PRINCIPALS],
    *[(join_group, GROUP, p, ErrorCode.member_id_required if p == "owner" else GROUP_DENIED)
      for p in PRINCIPALS],
    *[(heartbeat, GROUP, p, ErrorCode.unknown_member_id if p == "owner" else GROUP_DENIED)
      for p in PRINCIPALS],
    *[(sync_group, GROUP, p, ErrorCode.unknown_member_id if p == "owner" else GROUP_DENIED)
      for p in PRINCIPALS],
    *[(leave_group, GROUP, p, OK if p == "owner" else GROUP_DENIED) for p in PRINCIPALS],
    # the owner may read the group and the public topic; reader the topic, not the group
    *[(offset_commit, GROUP, p, OK if p == "owner" else GROUP_DENIED) for p in PRINCIPALS],
    *[(offset_fetch, GROUP, p, {"owner": "offsets", "ops": "none shown"}.get(p, GROUP_DENIED))
      for p in PRINCIPALS],
    *[(describe_group, GROUP, p, OK if p in ("owner", "ops") else GROUP_DENIED)
      for p in PRINCIPALS],
    *[(list_groups, GROUP, p, "listed" if p in ("owner", "ops") else "hidden")
      for p in PRINCIPALS],
    *[(delete_group, GROUP, p, OK if p == "owner" else GROUP_DENIED) for p in PRINCIPALS],
    *[(offset_delete, GROUP, p, OK if p == "owner" else GROUP_DENIED) for p in PRINCIPALS],
]  # fmt: skip


def row_id(row: tuple[Op, str, str, Any]) -> str:
    op, arg, principal, _ = row
    return f"{op.__name__}-{arg}-{principal}"


@pytest.fixture
def secured(store: mqcore.Store, tmp_path: Path) -> Iterator[Server]:
    users, acl = tmp_path / "users.jsonl", tmp_path / "acl.txt"
    for user in PRINCIPALS:
        add_user(users, user, PASSWORD.format(user))
    acl.write_text(ACL)
    for topic in (SECRET, PUBLIC):
        store.create_topic(topic)
        store.append(topic, b"stored")
    store.alter_group_offsets(GROUP, {(SECRET, 0): 1, (PUBLIC, 0): 1})
    store.flush()
    with Server(store, "127.0.0.1:0", sasl_credentials=users, acl=acl) as srv:
        yield srv


def snapshot(store: mqcore.Store) -> dict[str, Any]:
    """What a refused request must leave as it was."""
    topics = sorted(store.topics())
    return {
        "topics": topics,
        "partitions": {t: store.partitions(t) for t in topics},
        "messages": {t: [m.value for m in store.read(t, 0, 0, 100)] for t in (SECRET, PUBLIC)
                     if t in topics},
        "offsets": {g: sorted((p.topic, p.partition, p.committed) for p in parts)
                    for g, parts in store.group_lag().items()},
        "configs": {t: store.topic_config(t) for t in topics if not t.startswith("__")},
    }  # fmt: skip


@pytest.mark.parametrize("row", TABLE, ids=row_id)
def test_kafka_listener_acl_table(
    secured: Server, store: mqcore.Store, row: tuple[Op, str, str, Any]
) -> None:
    op, arg, principal, expected = row
    before = snapshot(store)
    wire = Wire(secured.address)
    try:
        wire.login(principal)
        got = op(wire, arg)
    finally:
        wire.close()
    assert got == expected
    if expected in (TOPIC_DENIED, GROUP_DENIED, "hidden"):
        assert snapshot(store) == before, "a refused request changed the store"


def test_a_forged_commit_to_consumer_offsets_is_refused_without_acls(
    kafka_server: Server, store: mqcore.Store
) -> None:
    """The issue's exploit: a record produced to __consumer_offsets set a group's committed
    offset after a restart. Without any ACL, the produce is refused as Kafka refuses it
    (INVALID_TOPIC_EXCEPTION) and the group's offset survives a reopen unchanged."""
    store.create_topic("t")
    store.alter_group_offsets("g", {("t", 0): 0})
    key = struct.pack(">hh", 1, 1) + b"g" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 0)
    value = struct.pack(">hqi", 3, 424242, -1) + struct.pack(">h", 0) + struct.pack(">q", 0)
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    b.append(0, int(time.time() * 1000), key, value, [])
    m = module(0, 9)
    wire = KioWire(kafka_server.address)
    try:
        r = wire.call(0, 9, transactional_id=None, acks=-1, timeout=TIMEOUT, topic_data=(
            m.TopicProduceData(name=OFFSETS, partition_data=(
                m.PartitionProduceData(index=0, records=bytes(b.build())),)),))  # fmt: skip
        assert r.responses[0].partition_responses[0].error_code == ErrorCode.invalid_topic_exception
        assert delete_records(wire, OFFSETS) == ErrorCode.invalid_topic_exception
    finally:
        wire.close()
    path = store.path
    kafka_server.stop()
    store.close()
    with mqcore.open(path) as again:
        assert {(p.topic, p.partition): p.committed for p in again.group_lag()["g"]} == {
            ("t", 0): 0
        }
