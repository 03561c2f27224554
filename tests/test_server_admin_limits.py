"""What `mqcore serve` answers to creations past the store's bounds, to bursts of creations, and
to admin requests racing on one topic (issue 31), in Kafka's codes: POLICY_VIOLATION past a
partition bound (Kafka's controller answers it past its 10,000 partitions per request),
THROTTLING_QUOTA_EXCEEDED with a throttle time past the mutation quota (KIP-599),
UNKNOWN_TOPIC_OR_PARTITION for a topic deleted under a request. Before, one CreateTopics of
30,000 partitions ran the server out of descriptors, and racing admin requests closed their
connections on a KeyError."""

from __future__ import annotations

import datetime
import os
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402
from kafkaclients import KioWire  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

from mqcore.server import Server  # noqa: E402
from mqcore.server.quota import MutationQuota  # noqa: E402

WAIT = 30.0
CT = load_payload_module(19, 7, EntityType.request)
CP = load_payload_module(37, 3, EntityType.request)
DT = load_payload_module(20, 6, EntityType.request)
IAC = load_payload_module(44, 1, EntityType.request)
MD = load_payload_module(3, 12, EntityType.request)
ZERO = __import__("uuid").UUID(int=0)


def create_topics(wire: KioWire, *topics: tuple[str, int], validate_only: bool = False) -> Any:
    return wire.call(
        19, 7, timeout=datetime.timedelta(seconds=30), validate_only=validate_only,
        topics=tuple(CT.CreatableTopic(name=n, num_partitions=p, replication_factor=1,
                                       assignments=(), configs=()) for n, p in topics),
    )  # fmt: skip


def codes(response: Any) -> dict[str, int]:
    return {t.name: int(t.error_code) for t in response.topics}


def create_partitions(wire: KioWire, topic: str, count: int) -> Any:
    return wire.call(
        37, 3, timeout=datetime.timedelta(seconds=30), validate_only=False,
        topics=(CP.CreatePartitionsTopic(name=topic, count=count, assignments=None),),
    )  # fmt: skip


def metadata(wire: KioWire, *names: str) -> dict[str, int]:
    r = wire.call(3, 12, topics=tuple(MD.MetadataRequestTopic(topic_id=ZERO, name=n)
                                      for n in names),
                  allow_auto_topic_creation=True,
                  include_topic_authorized_operations=False)  # fmt: skip
    return {t.name: int(t.error_code) for t in r.topics}


def partition_dirs(store: mqcore.Store) -> list[str]:
    return [n for n in os.listdir(store.path) if os.path.isdir(os.path.join(store.path, n))]


@pytest.fixture
def wire(kafka_server: Any) -> Iterator[KioWire]:
    w = KioWire(kafka_server.address)
    yield w
    w.close()


# -- partition bounds --------------------------------------------------------------------------


@pytest.mark.parametrize("count", [30_000, 65_534, 2**31 - 1])
def test_a_huge_create_topics_is_a_policy_violation_and_makes_nothing(
    wire: KioWire, store: mqcore.Store, count: int
) -> None:
    got = create_topics(wire, ("huge", count))
    assert codes(got) == {"huge": ErrorCode.policy_violation}
    assert "max_partitions_per_request is 10000" in got.topics[0].error_message
    assert store.topics() == [] and partition_dirs(store) == []
    assert codes(create_topics(wire, ("fine", 3))) == {"fine": 0}  # the server goes on


def test_the_request_bound_counts_every_topic_of_the_request(
    wire: KioWire, store: mqcore.Store
) -> None:
    """Kafka refuses the whole request: every topic gets the error, none is made."""
    got = create_topics(wire, ("a", 4000), ("b", 4000), ("c", 2001))
    assert codes(got) == dict.fromkeys("abc", ErrorCode.policy_violation)
    assert store.topics() == []
    got = create_topics(wire, ("a", 4000), ("b", 10), validate_only=True)
    assert codes(got) == {"a": 0, "b": 0} and store.topics() == []


def test_the_topic_and_store_bounds_over_every_way_of_creating(store_path: str) -> None:
    with (
        mqcore.open(store_path, flush="os", max_partitions=10, max_partitions_per_topic=6) as s,
        Server(s, listen="127.0.0.1:0", default_partitions=4) as srv,
    ):
        w = KioWire(srv.address)
        got = create_topics(w, ("wide", 7))
        assert codes(got) == {"wide": ErrorCode.policy_violation}
        assert "max_partitions_per_topic is 6" in got.topics[0].error_message
        assert codes(create_topics(w, ("wide", 7), validate_only=True)) == {
            "wide": ErrorCode.policy_violation
        }
        assert codes(create_topics(w, ("t", 5))) == {"t": 0}
        assert metadata(w, "auto1") == {"auto1": 0}  # 4 more: 9 of 10
        assert metadata(w, "auto2") == {"auto2": ErrorCode.policy_violation}
        assert create_partitions(w, "t", 6).results[0].error_code == 0  # 10 of 10
        grown = create_partitions(w, "auto1", 5)
        assert grown.results[0].error_code == ErrorCode.policy_violation
        assert "max_partitions (10)" in grown.results[0].error_message
        assert sorted(s.topics()) == ["auto1", "t"] and s.partitions("auto1") == 4
        w.close()


def test_confluent_admin_sees_policy_violation(kafka_server: Any, store: mqcore.Store) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    done = admin.create_topics([NewTopic("huge", num_partitions=30_000)])
    with pytest.raises(ck.KafkaException) as e:
        done["huge"].result(WAIT)
    assert e.value.args[0].code() == ck.KafkaError.POLICY_VIOLATION
    store.create_topic("t", partitions=4000)
    grown = admin.create_partitions([NewPartitions("t", 5000)])
    with pytest.raises(ck.KafkaException) as e:
        grown["t"].result(WAIT)
    assert e.value.args[0].code() == ck.KafkaError.POLICY_VIOLATION
    assert store.topics() == ["t"] and store.partitions("t") == 4000


def test_create_topics_of_an_existing_topic_is_topic_already_exists(
    wire: KioWire, store: mqcore.Store
) -> None:
    store.create_topic("t", partitions=2)
    assert codes(create_topics(wire, ("t", 2))) == {"t": ErrorCode.topic_already_exists}


# -- the mutation quota (KIP-599) ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_creations_is_throttled_until_the_bucket_refills(
    kafka_server: Any, wire: KioWire, store: mqcore.Store
) -> None:
    clock = Clock()
    kafka_server.broker.quota = MutationQuota(rate=2, burst=5, clock=clock)
    got = create_topics(wire, ("a", 2), ("b", 2), ("c", 2), ("d", 1))
    # a creation is admitted while the bucket holds a token (5, 3, 1), then takes them all
    assert codes(got) == {"a": 0, "b": 0, "c": 0, "d": ErrorCode.throttling_quota_exceeded}
    assert got.throttle_time == datetime.timedelta(milliseconds=1000)  # -1 + 2/s: 1 s to 1
    assert metadata(wire, "auto") == {"auto": ErrorCode.throttling_quota_exceeded}
    assert create_partitions(wire, "a", 3).results[0].error_code == (
        ErrorCode.throttling_quota_exceeded
    )
    clock.now += 1.0
    assert codes(create_topics(wire, ("d", 1))) == {"d": 0}
    clock.now += 0.5
    assert metadata(wire, "auto") == {"auto": 0}
    assert sorted(store.topics()) == ["a", "auto", "b", "c", "d"]


def test_each_principal_has_its_own_bucket() -> None:
    clock = Clock()
    quota = MutationQuota(rate=1, burst=2, clock=clock)
    quota.admit("User:alice")
    quota.record("User:alice", 3)
    with pytest.raises(Exception, match="retry in 2000 ms") as e:
        quota.admit("User:alice")
    assert e.value.throttle_ms == 2000
    quota.admit("User:bob")  # untouched by alice's creations
    clock.now += 2.0
    quota.admit("User:alice")


@pytest.mark.parametrize("rate, burst", [(0, 5), (-1, 5), (1, 0), (1, 2.5), (True, 3)])
def test_bad_quota_settings_are_refused(rate: float, burst: int) -> None:
    with pytest.raises(mqcore.errors.InvalidConfigError):
        MutationQuota(rate=rate, burst=burst)


# -- admin requests racing on one topic ---------------------------------------------------------


def test_racing_admin_requests_on_one_topic_get_kafka_codes(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """DeleteTopics, CreatePartitions, IncrementalAlterConfigs and CreateTopics of one topic
    from four connections at once: every answer carries a code Kafka would give, and no
    connection is closed on an error of the server's own."""
    kafka_server.broker.quota = MutationQuota(rate=1e9, burst=10**9)
    store.create_topic("t")
    rounds, seen, lock = 40, Counter[str](), threading.Lock()
    start = threading.Barrier(4)

    def delete(w: KioWire) -> int:
        r = w.call(20, 6, timeout=datetime.timedelta(seconds=30),
                   topics=(DT.DeleteTopicState(name="t", topic_id=ZERO),))  # fmt: skip
        return int(r.responses[0].error_code)

    def grow(w: KioWire) -> int:
        try:
            count = store.partitions("t")
        except mqcore.errors.UnknownTopicError:
            count = 1
        return int(create_partitions(w, "t", count + 1).results[0].error_code)

    def alter(w: KioWire) -> int:
        r = w.call(44, 1, validate_only=False, resources=(IAC.AlterConfigsResource(
            resource_type=2, resource_name="t",
            configs=(IAC.AlterableConfig(name="retention.ms", config_operation=0,
                                         value="60000"),)),))  # fmt: skip
        return int(r.responses[0].error_code)

    def create(w: KioWire) -> int:
        return codes(create_topics(w, ("t", 1)))["t"]

    def run(call: Any) -> None:
        w = KioWire(kafka_server.address)
        try:
            start.wait()
            for _ in range(rounds):
                code = ErrorCode(call(w)).name
                with lock:
                    seen[f"{call.__name__}:{code}"] += 1
        finally:
            w.close()

    threads = [threading.Thread(target=run, args=(c,)) for c in (delete, grow, alter, create)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(seen.values()) == 4 * rounds, seen  # no connection closed under a request
    allowed = {"none", "unknown_topic_or_partition", "topic_already_exists", "invalid_partitions"}
    assert {k.split(":")[1] for k in seen} <= allowed, seen
    assert seen["delete:none"] > 0 and seen["delete:unknown_topic_or_partition"] > 0
