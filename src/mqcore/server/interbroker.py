"""A broker's connection to another broker: a follower's Kafka Fetch (v12, replica_id set)
and OffsetForLeaderEpoch (v4) to its leader, as cluster.replicas' LeaderClient, and a
transaction coordinator's WriteTxnMarkers (v1) to a partition's leader and a leader's
AddPartitionsToTxn (v4, verify_only: KIP-890) to the coordinator (server/txncluster.py), over
one TCP connection, the requests and responses encoded with kio's writers and readers (Kafka's
schemas). Blocking, one request at a time: each user has its own.

Wire schema: the frames of server/protocol.py; a request's header is v2 (both APIs are
flexible at these versions), the response's v1.
"""

from __future__ import annotations

import datetime
import io
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from mqcore.cluster.replicas import (
    FETCH_MAX_BYTES,
    PARTITION_FETCH_BYTES,
    FetchReply,
    FetchSpec,
)
from mqcore.cluster.zk import BrokerInfo
from mqcore.errors import (
    FencedLeaderEpochError,
    MQCoreError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    ProtocolError,
    ReplicationError,
    UnknownLeaderEpochError,
)
from mqcore.server.protocol import api, build

FETCH, OFFSET_FOR_LEADER_EPOCH, ADD_PARTITIONS_TO_TXN, WRITE_TXN_MARKERS = 1, 23, 24, 27
FETCH_VERSION, EPOCH_VERSION, VERIFY_VERSION, MARKERS_VERSION = 12, 4, 4, 1
TXN_TIMEOUT = 15.0  # seconds a marker or a verification may take (the leader's acks=all wait)
CONNECT_TIMEOUT = 5.0  # seconds
RESPONSE_SLACK = 10.0  # seconds a response may take past the fetch's max wait
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a leader's answer larger than this is refused
_SIZE = struct.Struct(">i")
_BATCH_HEAD = struct.Struct(">qi")  # baseOffset, batchLength (the bytes after these 12)
READ_UNCOMMITTED = 0


def _error(code: ErrorCode, what: str) -> MQCoreError | None:
    if code == ErrorCode.none:
        return None
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
        return NotLeaderOrFollowerError(f"{what}: {code.name}")
    if code == ErrorCode.fenced_leader_epoch:
        return FencedLeaderEpochError(what)
    if code == ErrorCode.unknown_leader_epoch:
        return UnknownLeaderEpochError(what)
    if code == ErrorCode.offset_out_of_range:
        return OffsetOutOfRangeError(what)
    return ReplicationError(f"{what}: the leader answered {code.name}")


def whole_batches(records: bytes) -> bytes:
    """`records` cut after its last whole batch (a leader may end a response inside one)."""
    pos, end = 0, len(records)
    while pos + _BATCH_HEAD.size <= end:
        _, length = _BATCH_HEAD.unpack_from(records, pos)
        if length <= 0 or pos + _BATCH_HEAD.size + length > end:
            break
        pos += _BATCH_HEAD.size + length
    return records if pos == end else records[:pos]


class WireLeaderClient:
    """cluster.replicas.LeaderClient over Kafka's protocol to one broker."""

    def __init__(self, broker: BrokerInfo, client_id: str):
        self.broker = broker
        self.client_id = client_id
        self.correlation = 0
        try:
            self.sock = socket.create_connection((broker.host, broker.port), CONNECT_TIMEOUT)
        except OSError as e:
            raise NotLeaderOrFollowerError(
                f"cannot reach broker {broker.node_id} at {broker.host}:{broker.port}: {e}"
            ) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        self.sock.close()

    def _call(self, key: int, version: int, timeout: float, **values: Any) -> Any:
        found = api(key, version)
        assert found is not None
        head = found.request.__header_schema__  # type: ignore[attr-defined]
        self.correlation += 1
        out = io.BytesIO()
        out.write(b"\0\0\0\0")
        entity_writer(head)(out, build(head, request_api_key=key, request_api_version=version,
                                       correlation_id=self.correlation,
                                       client_id=self.client_id))  # fmt: skip
        entity_writer(found.request)(out, build(found.request, **values))
        data = out.getbuffer()
        _SIZE.pack_into(data, 0, len(data) - 4)
        self.sock.settimeout(timeout)
        self.sock.sendall(data)
        del data
        (size,) = _SIZE.unpack(self._recv(4))
        if not 0 < size <= MAX_RESPONSE_BYTES:
            raise ProtocolError(f"broker {self.broker.node_id} sent a frame of {size} bytes")
        payload = self._recv(size)
        try:
            header: Any
            header, used = entity_reader(found.response_header)(payload, 0)
            if header.correlation_id != self.correlation:
                raise ProtocolError(f"correlation {header.correlation_id}, {self.correlation} sent")
            return entity_reader(found.response)(payload, used)[0]
        except ProtocolError:
            raise
        except Exception as e:  # kio raises several types on bytes that do not parse
            raise ProtocolError(
                f"broker {self.broker.node_id}'s response does not parse: {e}"
            ) from None

    def _recv(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError(f"broker {self.broker.node_id} closed the connection")
            got += k
        return bytes(buf)

    def fetch(
        self, replica_id: int, partitions: Sequence[FetchSpec], max_wait_ms: int
    ) -> dict[tuple[str, int], FetchReply]:
        m = api(FETCH, FETCH_VERSION)
        assert m is not None
        rm = sys.modules[m.request.__module__]  # the request's nested types
        by_topic: dict[str, list[Any]] = {}
        for s in partitions:
            by_topic.setdefault(s.topic, []).append(
                rm.FetchPartition(
                    partition=s.partition,
                    current_leader_epoch=s.leader_epoch,
                    fetch_offset=s.fetch_offset,
                    last_fetched_epoch=-1,
                    log_start_offset=s.log_start_offset,
                    partition_max_bytes=PARTITION_FETCH_BYTES,
                )  # fmt: skip
            )
        topics = tuple(rm.FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items())
        body = self._call(
            FETCH, FETCH_VERSION, max_wait_ms / 1000 + RESPONSE_SLACK, replica_id=replica_id,
            max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1,
            max_bytes=FETCH_MAX_BYTES, isolation_level=READ_UNCOMMITTED, session_id=0,
            session_epoch=-1, topics=topics, forgotten_topics_data=(), rack_id="",
        )  # fmt: skip
        if body.error_code != ErrorCode.none:
            raise ReplicationError(f"broker {self.broker.node_id}: fetch {body.error_code.name}")
        out: dict[tuple[str, int], FetchReply] = {}
        for t in body.responses:
            for p in t.partitions:
                what = f"{t.topic}-{p.partition_index} at broker {self.broker.node_id}"
                out[(t.topic, p.partition_index)] = FetchReply(
                    _error(p.error_code, what), p.high_watermark, p.log_start_offset,
                    whole_batches(bytes(p.records or b"")),
                )  # fmt: skip
        return out

    def end_offset_for_epoch(
        self, replica_id: int, topic: str, partition: int, epoch: int, current_epoch: int
    ) -> tuple[int, int]:
        m = api(OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION)
        assert m is not None
        rm = sys.modules[m.request.__module__]
        body = self._call(
            OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, CONNECT_TIMEOUT + RESPONSE_SLACK,
            replica_id=replica_id,
            topics=(rm.OffsetForLeaderTopic(topic=topic, partitions=(rm.OffsetForLeaderPartition(
                partition=partition, current_leader_epoch=current_epoch, leader_epoch=epoch),)),),
        )  # fmt: skip
        for t in body.topics:
            for p in t.partitions:
                if t.topic == topic and p.partition == partition:
                    err = _error(p.error_code, f"{topic}-{partition} at broker "
                                               f"{self.broker.node_id}")  # fmt: skip
                    if err is not None:
                        raise err
                    return p.leader_epoch, p.end_offset
        raise ProtocolError(f"broker {self.broker.node_id} did not answer for {topic}-{partition}")

    def write_txn_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool,
        coordinator_epoch: int,
    ) -> ErrorCode:  # fmt: skip
        """One partition's COMMIT or ABORT marker written by its leader (answered once its
        in-sync replicas have it): the leader's error code for it."""
        m = api(WRITE_TXN_MARKERS, MARKERS_VERSION)
        assert m is not None
        rm = sys.modules[m.request.__module__]
        marker = rm.WritableTxnMarker(
            producer_id=producer_id, producer_epoch=epoch, transaction_result=commit,
            topics=(rm.WritableTxnMarkerTopic(name=topic, partition_indexes=(partition,)),),
            coordinator_epoch=coordinator_epoch,
        )  # fmt: skip
        body = self._call(WRITE_TXN_MARKERS, MARKERS_VERSION, TXN_TIMEOUT, markers=(marker,))
        for result in body.markers:
            for t in result.topics:
                for p in t.partitions:
                    if t.name == topic and p.partition_index == partition:
                        return ErrorCode(p.error_code)
        raise ProtocolError(f"broker {self.broker.node_id} did not answer for {topic}-{partition}")

    def verify_txn(
        self, transactional_id: str, producer_id: int, epoch: int, topic: str, partition: int
    ) -> ErrorCode:
        """Whether the coordinator has the producer's transaction open at `epoch` with this
        partition in it (AddPartitionsToTxn v4, verify_only): its error code for it."""
        m = api(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
        assert m is not None
        rm = sys.modules[m.request.__module__]
        txn = rm.AddPartitionsToTxnTransaction(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
            verify_only=True, topics=(rm.AddPartitionsToTxnTopic(name=topic,
                                                                  partitions=(partition,)),),
        )  # fmt: skip
        body = self._call(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, TXN_TIMEOUT, transactions=(txn,))
        if body.error_code != ErrorCode.none:
            return ErrorCode(body.error_code)
        for result in body.results_by_transaction:
            for t in result.topic_results:
                for p in t.results_by_partition:
                    if t.name == topic and p.partition_index == partition:
                        return ErrorCode(p.partition_error_code)
        raise ProtocolError(f"broker {self.broker.node_id} did not answer for {topic}-{partition}")
