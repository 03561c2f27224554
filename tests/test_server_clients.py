"""`mqcore serve` driven by Kafka clients we did not write, unmodified, with default settings
plus the bootstrap address: kafka-python and confluent-kafka (librdkafka). What they produce is
what mqcore's own API reads (and finds by key), what mqcore's API appends is what they consume,
byte for byte, with every codec and with headers."""

from __future__ import annotations

from typing import Any

import kafkaclients
import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
WAIT = 30.0


def consume_confluent(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    """The first `n` messages of every partition of `topic`, read with assign() (no group)."""
    return kafkaclients.consume_confluent({"bootstrap.servers": bootstrap}, topic, partitions, n)


def consume_kafka_python(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    c = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
        consumer_timeout_ms=int(WAIT * 1000),
    )  # fmt: skip
    try:
        c.assign([kafka.TopicPartition(topic, p) for p in range(partitions)])
        got = []
        for m in c:
            got.append(m)
            if len(got) == n:
                break
        return got
    finally:
        c.close()


def rows(msgs: Any) -> list[tuple[Any, ...]]:
    """(partition, offset, key, value, headers) of each message, sorted: mqcore's Messages and
    kafka-python's records have these as attributes, confluent-kafka's as methods."""
    out = []
    for m in msgs:
        fields = [getattr(m, name) for name in ("partition", "offset", "key", "value", "headers")]
        fields = [f() if callable(f) else f for f in fields]
        out.append((*fields[:4], tuple(fields[4] or ())))
    return sorted(out)


def stored(store: mqcore.Store, topic: str) -> dict[tuple[int, int], mqcore.Message]:
    return {
        (m.partition, m.offset): m
        for p in range(store.partitions(topic))
        for m in store.read(topic, p, 0, 1 << 20)
    }


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_produces_what_the_store_reads(
    kafka_server: Any, store: mqcore.Store, codec: str
) -> None:
    store.create_topic("c", partitions=3)
    p = ck.Producer({"bootstrap.servers": kafka_server.bootstrap, "compression.type": codec})
    sent: dict[bytes, list[tuple[str, bytes]]] = {}  # value: headers
    reports: list[Any] = []
    for i in range(600):
        key, value = b"key-%d" % (i % 37), b"value %d " % i + bytes(range(i % 200))
        headers = [("n", b"%d" % i), ("bin", bytes([0, 255, i % 256]))]
        sent[value] = headers
        p.produce("c", key=key, value=value, headers=headers,
                  on_delivery=lambda e, m: reports.append((e, m)))  # fmt: skip
    assert p.flush(WAIT) == 0
    assert [e for e, _ in reports if e is not None] == []
    on_disk = stored(store, "c")
    assert len(on_disk) == 600
    # each delivery report's offset is where the store has that message
    for _, m in reports:
        got = on_disk[(m.partition(), m.offset())]
        assert (got.key, got.value) == (m.key(), m.value())
        assert list(got.headers) == sent[got.value]  # a delivery report carries no headers
    # and the key index found what came over the wire
    found = store.find_by_key("c", b"key-5")
    assert sorted(m.value for m in found) == sorted(v for i, v in enumerate(sent) if i % 37 == 5)
    # consumed back byte for byte
    back = consume_confluent(kafka_server.bootstrap, "c", 3, 600)
    assert rows(back) == rows(on_disk.values())


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_produces_what_the_store_reads(
    kafka_server: Any, store: mqcore.Store, codec: str
) -> None:
    store.create_topic("k", partitions=2)
    p = kafka.KafkaProducer(
        bootstrap_servers=kafka_server.bootstrap,
        compression_type=None if codec == "none" else codec,
    )
    futures = [
        p.send("k", key=b"k%d" % (i % 5), value=b"v%d" % i, headers=[("h", b"%d" % i)])
        for i in range(300)
    ]
    p.flush()
    metas = [f.get(timeout=WAIT) for f in futures]
    p.close()
    on_disk = stored(store, "k")
    assert len(on_disk) == 300
    for i, meta in enumerate(metas):
        m = on_disk[(meta.partition, meta.offset)]
        assert (m.value, list(m.headers)) == (b"v%d" % i, [("h", b"%d" % i)])
    back = consume_kafka_python(kafka_server.bootstrap, "k", 2, 300)
    assert rows(back) == rows(on_disk.values())


def test_clients_consume_what_the_store_appended(kafka_server: Any, store: mqcore.Store) -> None:
    store.create_topic("s", partitions=2, compression="zstd")
    for p in range(2):
        store.append_batch(
            "s", [b"m%d-%d" % (p, i) for i in range(200)],
            keys=[b"k%d" % i for i in range(200)], partition=p,
            headers=[[("x", b"%d" % i)] for i in range(200)],
        )  # fmt: skip
    store.append("s", b"tagged", partition=0, tag="TagA", properties={"region": "eu"})
    want = sorted(
        (m.partition, m.offset, m.key, m.value, tuple(m.headers))
        for m in stored(store, "s").values()
    )
    conf = consume_confluent(kafka_server.bootstrap, "s", 2, len(want))
    assert (
        sorted((m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers())) for m in conf)
        == want
    )
    kp = consume_kafka_python(kafka_server.bootstrap, "s", 2, len(want))
    assert sorted((m.partition, m.offset, m.key, m.value, tuple(m.headers)) for m in kp) == want


def test_a_waiting_fetch_is_woken_by_an_append(kafka_server: Any, store: mqcore.Store) -> None:
    """The consumer's fetch waits up to 25 s for data (fetch.wait.max.ms); an append through
    the store's own API must answer it before the 15 s poll gives up."""
    store.create_topic("w")
    c = ck.Consumer(
        {"bootstrap.servers": kafka_server.bootstrap, "group.id": "w",
         "fetch.wait.max.ms": 25_000, "socket.timeout.ms": 60_000, "enable.auto.commit": False}
    )  # fmt: skip
    try:
        c.assign([ck.TopicPartition("w", 0, 0)])
        assert c.poll(1.0) is None  # nothing yet: its fetch is now parked in the server
        store.append("w", b"wake up", partition=0)
        m = c.poll(15.0)
        assert m is not None and m.error() is None and m.value() == b"wake up"
    finally:
        c.close()


def test_list_offsets_by_time_equals_offset_for_time(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("lo", partitions=2)
    t0 = 1_790_000_000_000
    for p in range(2):
        store.append_batch("lo", [b"%d" % i for i in range(100)], partition=p,
                           timestamps=[t0 + 1000 * i + p for i in range(100)])  # fmt: skip
    asked = [t0 - 5, t0, t0 + 999, t0 + 50_000, t0 + 50_001, t0 + 99_000, t0 + 99_002, t0 + 10**9]
    kp = kafka.KafkaConsumer(bootstrap_servers=kafka_server.bootstrap)
    conf = ck.Consumer({"bootstrap.servers": kafka_server.bootstrap, "group.id": "lo"})
    try:
        for ts in asked:
            want = {p: store.offset_for_time("lo", p, ts) for p in range(2)}
            found = kp.offsets_for_times({kafka.TopicPartition("lo", p): ts for p in range(2)})
            got = {tp.partition: (None if o is None else o.offset) for tp, o in found.items()}
            assert got == want, ts
            answer = conf.offsets_for_times([ck.TopicPartition("lo", p, ts) for p in range(2)],
                                            timeout=WAIT)  # fmt: skip
            # librdkafka says "no such offset" with the end offset (OFFSET_END, -1)
            assert {tp.partition: (None if tp.offset < 0 else tp.offset) for tp in answer} == want
            for p, o in want.items():
                if o is not None:
                    m = store.get("lo", p, o)
                    assert (
                        m is not None
                        and found[kafka.TopicPartition("lo", p)].timestamp == m.timestamp
                    )
        ends = kp.end_offsets([kafka.TopicPartition("lo", p) for p in range(2)])
        starts = kp.beginning_offsets([kafka.TopicPartition("lo", p) for p in range(2)])
        assert {tp.partition: o for tp, o in ends.items()} == {0: 100, 1: 100}
        assert {tp.partition: o for tp, o in starts.items()} == {0: 0, 1: 0}
    finally:
        kp.close()
        conf.close()


def test_admin_client_creates_and_lists_topics(kafka_server: Any, store: mqcore.Store) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    done = admin.create_topics(
        [NewTopic("orders", num_partitions=4, config={"retention.ms": "3600000",
                                                      "compression.type": "lz4"}),
         NewTopic("bad", num_partitions=1, replication_factor=3),
         NewTopic("not a name", num_partitions=1)]
    )  # fmt: skip
    done["orders"].result(WAIT)
    with pytest.raises(ck.KafkaException) as bad:
        done["bad"].result(WAIT)
    assert bad.value.args[0].code() == ck.KafkaError.INVALID_REPLICATION_FACTOR
    with pytest.raises(ck.KafkaException) as named:
        done["not a name"].result(WAIT)
    assert named.value.args[0].code() == ck.KafkaError.TOPIC_EXCEPTION
    cfg = store.topic_config("orders")
    assert (cfg.partitions, cfg.retention_ms, cfg.compression) == (4, 3_600_000, "lz4")
    again = admin.create_topics([NewTopic("orders", num_partitions=1)])
    with pytest.raises(ck.KafkaException) as exists:
        again["orders"].result(WAIT)
    assert exists.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    listed = admin.list_topics(timeout=WAIT)
    assert "orders" in listed.topics and len(listed.topics["orders"].partitions) == 4
    assert set(listed.topics) == set(store.topics())
    assert listed.cluster_id == kafka_server.broker.cluster_id


def test_metadata_auto_creates_a_topic_a_producer_names(
    kafka_server: Any, store: mqcore.Store
) -> None:
    p = kafka.KafkaProducer(bootstrap_servers=kafka_server.bootstrap)
    p.send("fresh", b"first").get(timeout=WAIT)
    p.close()
    assert "fresh" in store.topics()
    assert [m.value for m in store.read("fresh", 0, 0, 10)] == [b"first"]


def test_a_too_large_batch_is_refused_with_message_too_large(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("small", max_message_bytes=2000)
    p = ck.Producer({"bootstrap.servers": kafka_server.bootstrap, "message.max.bytes": 100_000,
                     "compression.type": "none"})  # fmt: skip
    errors: list[Any] = []
    # one at a time: a batch holding both would be refused whole, as Kafka refuses it
    p.produce("small", b"x" * 5000, on_delivery=lambda e, m: errors.append(e))
    assert p.flush(WAIT) == 0
    p.produce("small", b"fits", on_delivery=lambda e, m: errors.append(e))
    assert p.flush(WAIT) == 0
    assert [e.code() if e is not None else 0 for e in errors] == [
        ck.KafkaError.MSG_SIZE_TOO_LARGE,
        0,
    ]
    assert [m.value for m in store.read("small", 0, 0, 10)] == [b"fits"]


def test_admin_list_offsets_max_timestamp_equals_brute_force(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """ListOffsets v7's max-timestamp query (KIP-734), through confluent's AdminClient, against
    the message with the largest timestamp found by reading every message."""
    from confluent_kafka.admin import OffsetSpec

    store.create_topic("mx", partitions=2)
    t0 = 1_790_000_000_000
    shuffled = [37, 5, 99, 12, 99, 3, 70]  # out of order, the largest twice in partition 0
    store.append_batch("mx", [b"%d" % i for i in range(7)], partition=0,
                       timestamps=[t0 + 1000 * x for x in shuffled])  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    asked = {ck.TopicPartition("mx", p): OffsetSpec.max_timestamp() for p in range(2)}
    answers = {tp.partition: f.result(WAIT) for tp, f in admin.list_offsets(asked).items()}
    msgs = store.read("mx", 0, 0, 100)
    top = max(m.timestamp for m in msgs)
    first = min(m.offset for m in msgs if m.timestamp == top)
    assert (answers[0].offset, answers[0].timestamp) == (first, top) == (2, t0 + 99_000)
    assert answers[1].offset == -1  # an empty partition has none
    for spec, want in ((OffsetSpec.earliest(), 0), (OffsetSpec.latest(), 7)):
        got = admin.list_offsets({ck.TopicPartition("mx", 0): spec})
        assert next(iter(got.values())).result(WAIT).offset == want


def test_admin_client_describes_and_alters_configs(kafka_server: Any, store: mqcore.Store) -> None:
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    store.create_topic("cfg", partitions=2, retention_ms=86_400_000)
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, "cfg")
    described = admin.describe_configs([res])[res].result(WAIT)
    cfg = store.topic_config("cfg")
    assert described["retention.ms"].value == str(cfg.retention_ms)
    assert described["compression.type"].value == cfg.compression
    assert described["key.index"].value == "true"
    assert described["segment.bytes"].is_read_only  # fixed at creation
    assert described["retention.ms"].is_default is False
    assert described["cleanup.policy"].is_default is True
    change = ConfigResource(ResourceType.TOPIC, "cfg", incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET),
    ])  # fmt: skip
    admin.incremental_alter_configs([change])[change].result(WAIT)
    cfg = store.topic_config("cfg")
    assert (cfg.retention_ms, cfg.cleanup_policy) == (3_600_000, "compact")
    reset = ConfigResource(ResourceType.TOPIC, "cfg", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])  # fmt: skip
    admin.incremental_alter_configs([reset])[reset].result(WAIT)
    assert store.topic_config("cfg").retention_ms == mqcore.config.TopicConfig().retention_ms
    for name, value in (("segment.bytes", "1000000"), ("no.such.setting", "1"),
                        ("retention.ms", "soon")):  # fmt: skip
        bad = ConfigResource(ResourceType.TOPIC, "cfg", incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])  # fmt: skip
        with pytest.raises(ck.KafkaException) as refused:
            admin.incremental_alter_configs([bad])[bad].result(WAIT)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG, name
    assert store.topic_config("cfg").segment_bytes == cfg.segment_bytes
    missing = ConfigResource(ResourceType.TOPIC, "nope")
    with pytest.raises(ck.KafkaException) as unknown:
        admin.describe_configs([missing])[missing].result(WAIT)
    assert unknown.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_alter_configs_replaces_a_topics_settings_as_kafka_does(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """AlterConfigs (key 33, what confluent-kafka's deprecated alter_configs and librdkafka's
    AlterConfigs send): the configs given become the topic's whole set, so a setting left out
    goes back to its default; one fixed at creation keeps its value; validate_only changes
    nothing; an unknown name, a bad value or a name given twice refuses the resource whole.
    v0 (not flexible) over raw frames, as old clients send it. Was UNSUPPORTED_VERSION."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    defaults = mqcore.config.TopicConfig()
    store.create_topic("ac", retention_ms=3_600_000, max_message_bytes=50_000,
                       segment_bytes=4 << 20)  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    res = ConfigResource(ResourceType.TOPIC, "ac", set_config={"cleanup.policy": "compact"})
    admin.alter_configs([res])[res].result(WAIT)
    cfg = store.topic_config("ac")
    assert (cfg.cleanup_policy, cfg.retention_ms, cfg.max_message_bytes, cfg.segment_bytes) == (
        "compact",
        defaults.retention_ms,
        defaults.max_message_bytes,
        4 << 20,
    )
    check = ConfigResource(ResourceType.TOPIC, "ac", set_config={"retention.ms": "1000"})
    admin.alter_configs([check], validate_only=True)[check].result(WAIT)
    assert store.topic_config("ac") == cfg
    for configs in ({"retention.ms": "soon"}, {"no.such.setting": "1"},
                    {"segment.bytes": "1000000"}):  # fmt: skip
        bad = ConfigResource(ResourceType.TOPIC, "ac", set_config=configs)
        with pytest.raises(ck.KafkaException) as refused:
            admin.alter_configs([bad])[bad].result(WAIT)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG, configs
    assert store.topic_config("ac") == cfg
    from kio.index import load_payload_module
    from kio.static.constants import EntityType

    v0 = load_payload_module(33, 0, EntityType.request)
    wire = kafkaclients.KioWire(kafka_server.address)
    try:

        def alter(*configs: tuple[str, str | None]) -> int:
            entries = tuple(v0.AlterableConfig(name=n, value=v) for n, v in configs)
            r = wire.call(33, 0, validate_only=False, resources=(v0.AlterConfigsResource(
                resource_type=2, resource_name="ac", configs=entries),))  # fmt: skip
            return int(r.responses[0].error_code)

        assert alter(("retention.ms", "7000"), ("retention.ms", "8000")) == 42  # INVALID_REQUEST
        assert alter(("retention.ms", "7000"), ("compression.type", None)) == 0
        cfg = store.topic_config("ac")
        assert (cfg.retention_ms, cfg.compression, cfg.cleanup_policy) == (
            7000,
            defaults.compression,
            defaults.cleanup_policy,
        )
    finally:
        wire.close()


def test_admin_client_describes_the_cluster_and_deletes_records(
    kafka_server: Any, store: mqcore.Store
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    cluster = admin.describe_cluster().result(WAIT)
    assert cluster.cluster_id == kafka_server.broker.cluster_id
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(0, *kafka_server.address)]
    assert cluster.controller.id == 0
    store.create_topic("del", partitions=1, segment_bytes=4096)
    store.append_batch("del", [b"x" * 100 for _ in range(200)], partition=0)
    tp = ck.TopicPartition("del", 0, 150)
    done = admin.delete_records([tp])
    low = next(iter(done.values())).result(WAIT)
    assert low.low_watermark == 150 == store.start_offset("del", 0)
    assert [m.offset() for m in consume_confluent(kafka_server.bootstrap, "del", 1, 50)] == list(
        range(150, 200)
    )
    past = admin.delete_records([ck.TopicPartition("del", 0, 10_000)])
    with pytest.raises(ck.KafkaException) as refused:
        next(iter(past.values())).result(WAIT)
    assert refused.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_produces_and_consumes(kafka_server: Any, store: mqcore.Store, codec: str) -> None:
    """aiokafka (asyncio, its own protocol code): produce with a codec and headers, read back
    byte for byte, and the store holds the same."""
    import asyncio

    aiokafka = pytest.importorskip("aiokafka")
    if codec != "none":  # aiokafka needs the codec's package; the test extra brings them
        pytest.importorskip({"gzip": "gzip", "snappy": "snappy", "lz4": "lz4.frame",
                             "zstd": "zstandard"}[codec])  # fmt: skip
    store.create_topic("aio", partitions=2)

    async def run() -> list[Any]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=kafka_server.bootstrap,
            compression_type=None if codec == "none" else codec,
        )
        await producer.start()
        try:
            for i in range(200):
                await producer.send("aio", b"v%d" % i, key=b"k%d" % (i % 7),
                                    headers=[("n", b"%d" % i)], partition=i % 2)  # fmt: skip
            await producer.flush()
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=kafka_server.bootstrap, enable_auto_commit=False,
            auto_offset_reset="earliest",
        )  # fmt: skip
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition("aio", p) for p in range(2)])
            got: list[Any] = []
            while len(got) < 200:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), WAIT)
                for msgs in batches.values():
                    got.extend(msgs)
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert rows(got) == rows(stored(store, "aio").values())
    assert len(got) == 200
