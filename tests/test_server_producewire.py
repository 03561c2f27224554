"""The hand-read Produce requests and hand-written responses (server/producewire.py) against
kio's reader and writer of the same messages, at every version served; truncated and
arbitrary bytes; and the server's reused receive buffer carrying produces of every size on
one connection."""

from __future__ import annotations

import datetime
import io
import os
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafkaclients import KioWire, kio_response_frame  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

import mqcore  # noqa: E402
from mqcore.errors import ProtocolError  # noqa: E402
from mqcore.server import Server  # noqa: E402
from mqcore.server.producewire import (  # noqa: E402
    ProduceAnswer,
    ProducedPartition,
    ProducedTopic,
    encode_produce,
    read_produce,
)
from mqcore.server.protocol import APIS, kio_floor, parse_request  # noqa: E402

VERSIONS = range(kio_floor(0), APIS[0][2] + 1)  # v0-v2: tests/test_server_legacy.py

names = st.from_regex(r"[a-zA-Z0-9._-]{1,30}", fullmatch=True)
records = st.none() | st.binary(max_size=300)
partitions = st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), records), max_size=4)
requests = st.tuples(
    st.none() | st.text(max_size=20),
    st.sampled_from([-1, 0, 1, 7]),
    st.integers(0, 2**31 - 1),
    st.lists(st.tuples(names, partitions), max_size=4),
)


def kio_frame(version: int, request: tuple[Any, ...]) -> tuple[bytes, int, Any]:
    """The request written by kio: (payload, where its body starts, kio's reading of it)."""
    txn, acks, timeout_ms, topics = request
    m = load_payload_module(0, version, EntityType.request)
    body = m.ProduceRequest(
        transactional_id=txn, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(m.TopicProduceData(name=n, partition_data=tuple(
            m.PartitionProduceData(index=i, records=r) for i, r in parts)) for n, parts in topics),
    )  # fmt: skip
    head = m.ProduceRequest.__header_schema__
    out = io.BytesIO()
    entity_writer(head)(out, head(request_api_key=0, request_api_version=version,
                                  correlation_id=7, client_id="pw"))  # fmt: skip
    start = out.tell()
    entity_writer(m.ProduceRequest)(out, body)
    payload = out.getvalue()
    return payload, start, entity_reader(m.ProduceRequest)(payload, start)[0]


def same(ours: Any, theirs: Any) -> None:
    assert ours.transactional_id == theirs.transactional_id
    assert ours.acks == theirs.acks
    assert ours.timeout_ms == theirs.timeout // datetime.timedelta(milliseconds=1)
    assert [t.name for t in ours.topic_data] == [t.name for t in theirs.topic_data]
    for a, b in zip(ours.topic_data, theirs.topic_data, strict=True):
        ours_parts = [(p.index, p.records and bytes(p.records)) for p in a.partition_data]
        assert ours_parts == [(p.index, p.records) for p in b.partition_data]


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(request=requests)
def test_read_produce_agrees_with_kio(version: int, request: tuple[Any, ...]) -> None:
    payload, start, theirs = kio_frame(version, request)
    frame = bytearray(payload)
    ours = read_produce(memoryview(frame), start, version)
    same(ours, theirs)
    # through the server's parser too: a writable frame, records left as views into it
    parsed = parse_request(frame)
    same(parsed.body, theirs)
    for t in parsed.body.topic_data:
        for p in t.partition_data:
            assert p.records is None or (
                isinstance(p.records, memoryview) and not p.records.readonly
            )


@pytest.mark.parametrize("version", [8, 9])
def test_every_truncation_is_a_protocol_error(version: int) -> None:
    request = ("txn", 1, 30_000, [("t", [(0, b"r" * 40), (1, None)]), ("u", [(2, b"")])])
    payload, start, _ = kio_frame(version, request)
    for cut in range(start, len(payload)):
        with pytest.raises(ProtocolError):
            read_produce(memoryview(bytearray(payload[:cut])), start, version)


def test_tagged_fields_are_skipped() -> None:
    """A v9 request with a tagged field after each struct (none is defined for Produce; a
    newer client may send some): skipped, as Kafka's generated readers keep unknown tagged
    fields aside (kio's reader refuses them, so it is no reference here)."""
    tagged = b"\x01\x05\x03abc"  # one field: tag 5, 3 bytes
    body = (
        b"\x00"  # transactional_id null
        + struct.pack(">hi", 1, 5000)
        + b"\x02"  # one topic
        + b"\x02t"  # name "t"
        + b"\x02"  # one partition
        + struct.pack(">i", 3)
        + b"\x04xyz"  # records: 3 bytes
        + tagged  # partition
        + tagged  # topic
        + tagged  # body
    )
    head = struct.pack(">hhih", 0, 9, 1, 2) + b"pw" + b"\x00"
    payload = head + body
    with pytest.raises(KeyError):
        entity_reader(load_payload_module(0, 9, EntityType.request).ProduceRequest)(payload, 9)
    ours = read_produce(memoryview(bytearray(payload)), len(head), 9)
    assert (ours.transactional_id, ours.acks, ours.timeout_ms) == (None, 1, 5000)
    [topic] = ours.topic_data
    [part] = topic.partition_data
    assert (topic.name, part.index, bytes(part.records or b"")) == ("t", 3, b"xyz")


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=200), version=st.sampled_from(list(VERSIONS)))
def test_arbitrary_bytes_read_or_raise_protocol_error(data: bytes, version: int) -> None:
    try:
        read_produce(memoryview(bytearray(data)), 0, version)
    except ProtocolError:
        pass


@pytest.mark.parametrize("count", [2**31 - 1, 10**6])
def test_a_huge_count_is_refused_before_reading(count: int) -> None:
    """A count larger than the bytes left is refused at once (no loop over a client's count)."""
    payload = b"\xff\xff" + struct.pack(">hi", 1, 5000) + struct.pack(">i", count)
    with pytest.raises(ProtocolError, match="count"):
        read_produce(memoryview(bytearray(payload)), 0, 8)


answers = st.lists(
    st.tuples(
        names,
        st.lists(
            st.tuples(
                st.integers(-(2**31), 2**31 - 1),
                st.sampled_from([0, 2, 10, 47, 87]),
                st.integers(-1, 2**62),
                st.integers(-1, 2**45),
                st.integers(-1, 2**62),
                st.none() | st.text(max_size=40),
            ),
            max_size=4,
        ),
    ),
    max_size=4,
)


def kio_response(version: int, correlation: int, topics: list[Any]) -> bytes:
    """The same response built and written by kio."""
    m = load_payload_module(0, version, EntityType.response)
    part_fields = set(m.PartitionProduceResponse.__dataclass_fields__)
    responses = []
    for name, parts in topics:
        built = []
        for index, code, base, append_ms, start, message in parts:
            append_time = (
                None
                if append_ms < 0
                else datetime.datetime.fromtimestamp(append_ms / 1000, datetime.timezone.utc)
            )
            values = dict(index=index, error_code=ErrorCode(code), base_offset=base,
                          log_append_time=append_time, log_start_offset=start, record_errors=(),
                          error_message=message)  # fmt: skip
            if "current_leader" in part_fields:  # v10+: the default, which kio leaves out
                values["current_leader"] = m.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)
            built.append(m.PartitionProduceResponse(
                **{k: v for k, v in values.items() if k in part_fields}))  # fmt: skip
        responses.append(m.TopicProduceResponse(name=name, partition_responses=tuple(built)))
    body = dict(responses=tuple(responses), throttle_time=datetime.timedelta(0),
                node_endpoints=())  # fmt: skip
    return kio_response_frame(m.ProduceResponse, correlation, body)


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=60, deadline=None)
@given(topics=answers, correlation=st.integers(-(2**31), 2**31 - 1))
def test_encode_produce_equals_kio(version: int, topics: list[Any], correlation: int) -> None:
    answer = ProduceAnswer([
        ProducedTopic(name, [ProducedPartition(*p) for p in parts]) for name, parts in topics
    ])  # fmt: skip
    assert encode_produce(version, correlation, answer) == kio_response(
        version, correlation, topics
    )


def kafka_batch(values: list[bytes]) -> bytes:
    """A v2 batch as a Kafka producer builds it (kafka-python's codec, not ours)."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 64 << 20)
    for i, v in enumerate(values):
        b.append(i, 1_700_000_000_000 + i, None, v, [])
    return bytes(b.build())


def test_one_connection_produces_every_size(tmp_path: Any) -> None:
    """Produces of growing and shrinking sizes over one connection: the receive buffer grows
    past its keep limit and is let go, and every batch lands byte-exact (a view into a buffer
    reused too early would store the next request's bytes)."""
    sizes = [10, 5_000, 3 << 20, 12 << 20, 100, 9 << 20, 1, 70_000]
    with mqcore.open(str(tmp_path / "s")) as store:
        store.create_topic("big", max_message_bytes=16 << 20, segment_bytes=64 << 20)
        srv = Server(store, listen="127.0.0.1:0", max_request_bytes=32 << 20)
        srv.start()
        wire = KioWire(srv.address)
        try:
            m = load_payload_module(0, 9, EntityType.request)
            expect: list[bytes] = []
            for n, size in enumerate(sizes):
                values = [os.urandom(size), bytes([n]) * 3]
                expect += values
                data = m.PartitionProduceData(index=0, records=kafka_batch(values))
                topic = m.TopicProduceData(name="big", partition_data=(data,))
                timeout = datetime.timedelta(seconds=30)
                resp = wire.call(
                    0, 9, transactional_id=None, acks=1, timeout=timeout, topic_data=(topic,)
                )
                part = resp.responses[0].partition_responses[0]
                assert (part.error_code, part.base_offset) == (ErrorCode.none, 2 * n)
        finally:
            wire.close()
            srv.stop()
        assert [m.value for m in store.read("big", 0, 0, 1 << 30)] == expect


def test_a_produce_beside_another_connection(tmp_path: Any) -> None:
    """Two connections, each with its own buffer, interleaving produces to one partition."""
    with mqcore.open(str(tmp_path / "s")) as store:
        store.create_topic("t")
        srv = Server(store, listen="127.0.0.1:0")
        srv.start()
        a, b = KioWire(srv.address, "a"), KioWire(srv.address, "b")
        try:
            m = load_payload_module(0, 3, EntityType.request)
            for i in range(20):
                for wire, tag in ((a, b"a"), (b, b"b")):
                    wire.call(0, 3, transactional_id=None, acks=-1,
                              timeout=datetime.timedelta(seconds=30),
                              topic_data=(m.TopicProduceData(name="t", partition_data=(
                                  m.PartitionProduceData(index=0, records=kafka_batch(
                                      [tag + b"%d" % i] * 3)),)),))  # fmt: skip
        finally:
            a.close()
            b.close()
            srv.stop()
        got = [m.value for m in store.read("t", 0, 0, 1000)]
        assert got == [t + b"%d" % i for i in range(20) for t in (b"a", b"b") for _ in range(3)]
