"""The Kafka APIs of transactions (issue 34): InitProducerId with a transactional ID,
AddPartitionsToTxn (v0-v3, a producer's; v4, a partition leader's verification), AddOffsetsToTxn,
TxnOffsetCommit, EndTxn, DescribeTransactions, ListTransactions, WriteTxnMarkers (a
coordinator's, on a cluster), and the check of a transactional produce, over the transaction
coordinator (server/transactions.py; on a cluster's broker, server/txncluster.py).

With an ACL file, each request needs Kafka's grants on its transactional ID (`write` to use
it, `describe` to see it: server/auth.py), besides those on its topics and group;
TRANSACTIONAL_ID_AUTHORIZATION_FAILED otherwise. A broker's own requests (AddPartitionsToTxn
v4, WriteTxnMarkers) need Kafka's CLUSTER_ACTION, which no ACL line grants.
"""

from __future__ import annotations

import datetime
import functools
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from mqcore.consume.offsets import OffsetAndMetadata
from mqcore.errors import MQCoreError
from mqcore.server.auth import DESCRIBE, READ, WRITE
from mqcore.server.common import NO_TIME, KafkaError, Session, error_code
from mqcore.server.interbroker import WireLeaderClient
from mqcore.server.protocol import Api, build
from mqcore.server.transactions import (
    OFFSETS_PARTITION,
    STATUS_NAMES,
    TransactionCoordinator,
    TxnError,
)
from mqcore.server.txncluster import (
    REPLICATION_TIMEOUT,
    BrokerClients,
    ClusterHost,
    wait_committed,
    write_local_marker,
)

if TYPE_CHECKING:
    from mqcore.server.broker import Broker

Handler = Callable[[Api, Any, Session], Any]
_PRODUCER = struct.Struct(">qh")  # producerId, producerEpoch at byte 43 of a v2 batch
REFUSED = ErrorCode.transactional_id_authorization_failed
# partitions one WriteTxnMarkers may name (a coordinator's name one; Kafka's a transaction's)
MAX_MARKER_PARTITIONS = 10_000


def _code(e: MQCoreError) -> ErrorCode:
    return e.code if isinstance(e, TxnError) else ErrorCode(int(error_code(e)))


def _outcome(call: Callable[[], object]) -> ErrorCode:
    """NONE when `call` succeeds, else Kafka's code for the mqcore error it raised."""
    try:
        call()
    except MQCoreError as e:
        return _code(e)
    return ErrorCode.none


class TxnApis:
    """The transactional request handlers of one broker."""

    def __init__(self, broker: Broker, leader_epoch: int):
        self.broker = broker
        self.refusal: str | None = None
        if broker.store.read_only:
            self.refusal = "the store is read-only"
        self.host: ClusterHost | None = None
        self.clients: BrokerClients | None = None
        if broker.cluster is not None and self.refusal is None:
            self.clients = BrokerClients(broker.cluster)
            self.host = ClusterHost(broker.store, broker.cluster, self.clients)
        self.coordinator = None if self.refusal else TransactionCoordinator(
            broker.store, leader_epoch, host=self.host)  # fmt: skip

    def handlers(self) -> dict[int, Handler]:
        return {
            24: self.add_partitions_to_txn,
            25: self.add_offsets_to_txn,
            26: self.end_txn,
            27: self.write_txn_markers,
            28: self.txn_offset_commit,
            65: self.describe_transactions,
            66: self.list_transactions,
        }

    def close(self) -> None:
        if self.coordinator is not None:
            self.coordinator.close()
        if self.clients is not None:
            self.clients.close()

    def locate(self) -> tuple[int, str, int] | None:
        """(node, host, port) of the cluster's transaction coordinator (None while it has
        none; FindCoordinator answers COORDINATOR_NOT_AVAILABLE then)."""
        if self.host is None:
            return None
        info = self.host.coordinator()
        return None if info is None else (info.node_id, info.host, info.port)

    def _coordinator(self) -> TransactionCoordinator:
        if self.coordinator is None:
            raise TxnError(REFUSED, self.refusal or "no transactions")
        return self.coordinator

    def _check_tid(self, session: Session, tid: str, operation: str = WRITE) -> None:
        """Kafka's grant on the transactional ID (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
        self.broker.access(session).check_transactional_id(operation, tid)

    def _check_group(self, session: Session, group: str) -> None:
        """A transaction's group offsets need read on the group (Kafka's rule)."""
        if not self.broker.access(session).group(READ, group):
            raise TxnError(ErrorCode.group_authorization_failed, f"may not read group {group!r}")

    # -- the requests -----------------------------------------------------------------------

    def init_producer_id(self, found: Api, body: Any, session: Session) -> Any:
        pid, epoch, code = -1, -1, ErrorCode.none
        try:
            timeout = body.transaction_timeout
            ms = int(timeout.total_seconds() * 1000) if isinstance(timeout, datetime.timedelta) \
                else int(timeout)  # fmt: skip
            self._check_tid(session, body.transactional_id)
            pid, epoch = self._coordinator().init_producer_id(
                body.transactional_id, ms, getattr(body, "producer_id", -1),
                getattr(body, "producer_epoch", -1),
            )  # fmt: skip
        except MQCoreError as e:
            code = _code(e)
        return build(found.response, throttle_time=NO_TIME, error_code=code, producer_id=pid,
                     producer_epoch=epoch)  # fmt: skip

    def add_partitions_to_txn(self, found: Api, body: Any, session: Session) -> Any:
        if found.version >= 4:
            return self._verify_partitions(found, body, session)
        m = found.module
        tid = body.v3_and_below_transactional_id
        wanted = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        codes: dict[tuple[str, int], ErrorCode] = {}
        if not self.broker.access(session).transactional_id(WRITE, tid):
            codes = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        for t, p in wanted:
            if not self.broker.allowed(session, WRITE, t):
                codes.setdefault((t, p), ErrorCode.topic_authorization_failed)
        if codes:  # Kafka: one refused partition fails the others with OPERATION_NOT_ATTEMPTED
            for tp in wanted:
                codes.setdefault(tp, ErrorCode.operation_not_attempted)
        else:
            try:
                pid, epoch = body.v3_and_below_producer_id, body.v3_and_below_producer_epoch
                self._coordinator().add_partitions(tid, pid, epoch, wanted)
                code = ErrorCode.none
            except MQCoreError as e:
                code = _code(e)
            codes = dict.fromkeys(wanted, code)
        by_topic: dict[str, list[Any]] = {}
        for (t, p), code in codes.items():
            by_topic.setdefault(t, []).append(
                build(m.AddPartitionsToTxnPartitionResult, partition_index=p,
                      partition_error_code=code))  # fmt: skip
        results = tuple(
            build(m.AddPartitionsToTxnTopicResult, name=t, results_by_partition=tuple(r))
            for t, r in by_topic.items()
        )
        return build(found.response, throttle_time=NO_TIME, results_by_topic_v3_and_below=results)

    def _verify_partitions(self, found: Api, body: Any, session: Session) -> Any:
        """AddPartitionsToTxn v4+: a partition leader's check that each producer's open
        transaction holds the partitions (verify_only, KIP-890), or a batch of adds."""
        m = found.module
        results = []
        for txn in body.transactions:
            codes: dict[tuple[str, int], ErrorCode] = {}
            wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
            if self.broker.authorizer is not None:  # CLUSTER_ACTION, which no line grants
                codes = dict.fromkeys(wanted, ErrorCode.cluster_authorization_failed)
            for t, p in [] if codes else wanted:
                if not self.broker.allowed(session, WRITE, t):
                    codes[(t, p)] = ErrorCode.topic_authorization_failed
                    continue
                if txn.verify_only:
                    codes[(t, p)] = _outcome(functools.partial(self._verify, txn, t, p))
            if not txn.verify_only and not codes:
                code = _outcome(functools.partial(self._add, txn, wanted))
                codes = dict.fromkeys(wanted, code)
            by_topic: dict[str, list[Any]] = {}
            for (t, p), code in codes.items():
                by_topic.setdefault(t, []).append(build(
                    m.AddPartitionsToTxnPartitionResult, partition_index=p,
                    partition_error_code=code))  # fmt: skip
            results.append(build(
                m.AddPartitionsToTxnResult, transactional_id=txn.transactional_id,
                topic_results=tuple(build(m.AddPartitionsToTxnTopicResult, name=t,
                                          results_by_partition=tuple(r))
                                    for t, r in by_topic.items())))  # fmt: skip
        return build(found.response, throttle_time=NO_TIME, error_code=ErrorCode.none,
                     results_by_transaction=tuple(results))  # fmt: skip

    def _verify(self, txn: Any, topic: str, partition: int) -> None:
        self._coordinator().verify(txn.producer_id, txn.producer_epoch, topic, partition)

    def _add(self, txn: Any, partitions: list[tuple[str, int]]) -> None:
        self._coordinator().add_partitions(txn.transactional_id, txn.producer_id,
                                           txn.producer_epoch, partitions)  # fmt: skip

    def write_txn_markers(self, found: Api, body: Any, session: Session) -> Any:
        """A coordinator's markers, written as each partition's leader and answered once its
        in-sync replicas have them (a cluster's broker only; Kafka's CLUSTER_ACTION, which no
        ACL line grants, so with ACLs never)."""
        m = found.module
        cluster = self.broker.cluster
        results = []
        allowed = cluster is not None and self.refusal is None and self.broker.authorizer is None
        count = sum(len(t.partition_indexes) for marker in body.markers for t in marker.topics)
        # one wait for the whole request, and a bound on its size: a request thread is held
        # REPLICATION_TIMEOUT at most, whatever a client sends
        deadline = time.monotonic() + REPLICATION_TIMEOUT
        for marker in body.markers:
            topics = []
            for t in marker.topics:
                parts = []
                for p in t.partition_indexes:
                    code = ErrorCode.cluster_authorization_failed
                    if allowed and count > MAX_MARKER_PARTITIONS:
                        code = ErrorCode.invalid_request
                    elif allowed:
                        assert cluster is not None
                        code = _outcome(functools.partial(
                            write_local_marker, self.broker.store, cluster, t.name, p,
                            marker.producer_id, marker.producer_epoch,
                            marker.transaction_result, marker.coordinator_epoch,
                            deadline))  # fmt: skip
                    parts.append(build(m.WritableTxnMarkerPartitionResult, partition_index=p,
                                       error_code=code))  # fmt: skip
                topics.append(build(m.WritableTxnMarkerTopicResult, name=t.name,
                                    partitions=tuple(parts)))  # fmt: skip
            results.append(build(m.WritableTxnMarkerResult, producer_id=marker.producer_id,
                                 topics=tuple(topics)))  # fmt: skip
        return build(found.response, markers=tuple(results))

    def add_offsets_to_txn(self, found: Api, body: Any, session: Session) -> Any:
        def add() -> None:
            self._check_tid(session, body.transactional_id)
            self._check_group(session, body.group_id)
            self._coordinator().add_offsets(body.transactional_id, body.producer_id,
                                            body.producer_epoch, body.group_id)  # fmt: skip

        return build(found.response, throttle_time=NO_TIME, error_code=_outcome(add))

    def txn_offset_commit(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        now = self.broker.log.clock()
        offsets = {}
        for t in body.topics:
            for p in t.partitions:
                epoch = getattr(p, "committed_leader_epoch", -1)
                offsets[(t.name, p.partition_index)] = OffsetAndMetadata(
                    p.committed_offset, p.committed_metadata or "", now, epoch)  # fmt: skip

        def keep() -> None:
            """Kafka's group coordinator's part: the transaction verified with its
            coordinator, the offsets held until its end reaches __consumer_offsets-0."""
            self._check_tid(session, body.transactional_id)
            self._check_group(session, body.group_id)
            for t, _ in offsets:
                if not self.broker.allowed(session, READ, t):
                    raise TxnError(ErrorCode.topic_authorization_failed, f"may not read {t!r}")
            coordinator = self._coordinator()
            if not self.broker.groups.here():
                raise TxnError(ErrorCode.not_coordinator, f"broker {self.broker.node_id} does "
                                                          "not coordinate the groups")  # fmt: skip
            for t, p in offsets:  # only partitions that exist
                if not coordinator.host.has_partition(t, p):
                    raise TxnError(ErrorCode.unknown_topic_or_partition, f"{t}-{p} is not here")
            self._ask_coordinator(body.transactional_id, body.producer_id, body.producer_epoch,
                                  *OFFSETS_PARTITION)  # fmt: skip
            self.broker.store.offset_store().stage_txn(body.producer_id, body.producer_epoch,
                                                       body.group_id, offsets)  # fmt: skip
            cluster = self.broker.cluster
            if cluster is not None:  # answered once the replicas hold them too
                last = self.broker.log.replica(*OFFSETS_PARTITION).log_end_offset - 1
                wait_committed(cluster, *OFFSETS_PARTITION, last)

        code = _outcome(keep)
        topics = tuple(
            build(m.TxnOffsetCommitResponseTopic, name=t.name, partitions=tuple(
                build(m.TxnOffsetCommitResponsePartition, partition_index=p.partition_index,
                      error_code=code) for p in t.partitions))
            for t in body.topics
        )  # fmt: skip
        return build(found.response, throttle_time=NO_TIME, topics=topics)

    def end_txn(self, found: Api, body: Any, session: Session) -> Any:
        def end() -> None:
            self._check_tid(session, body.transactional_id)
            self._coordinator().end_txn(body.transactional_id, body.producer_id,
                                        body.producer_epoch, body.committed)  # fmt: skip

        code = _outcome(end)
        return build(found.response, throttle_time=NO_TIME, error_code=code)

    def describe_transactions(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        states = []
        may = self.broker.access(session)
        for tid in body.transactional_ids:
            code, meta = ErrorCode.transactional_id_not_found, None
            if not may.transactional_id(DESCRIBE, tid):
                code = ErrorCode.transactional_id_authorization_failed
            elif self.coordinator is not None:
                try:
                    meta = self.coordinator.describe(tid)
                except TxnError as e:  # not the coordinator (a cluster's other broker)
                    code = e.code
            if meta is None:
                states.append(build(
                    m.TransactionState, error_code=code,
                    transactional_id=tid, transaction_state="", transaction_timeout=NO_TIME,
                    transaction_start_time=_when(-1), producer_id=-1, producer_epoch=-1,
                    topics=()))  # fmt: skip
                continue
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(meta.partitions):
                by_topic.setdefault(t, []).append(p)
            states.append(build(
                m.TransactionState, error_code=ErrorCode.none, transactional_id=tid,
                transaction_state=STATUS_NAMES[meta.status],
                transaction_timeout=datetime.timedelta(milliseconds=meta.timeout_ms),
                transaction_start_time=_when(meta.start_ms), producer_id=meta.producer_id,
                producer_epoch=meta.epoch,
                topics=tuple(build(m.TopicData, topic=t, partitions=tuple(ps))
                             for t, ps in by_topic.items())))  # fmt: skip
        return build(found.response, throttle_time=NO_TIME, transaction_states=tuple(states))

    def list_transactions(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        wanted = set(body.state_filters)
        unknown = tuple(s for s in body.state_filters if s not in STATUS_NAMES)
        producers = set(body.producer_id_filters)
        may = self.broker.access(session)
        code, metas = ErrorCode.none, []
        if self.coordinator is not None:
            try:
                metas = self.coordinator.listing()
            except TxnError as e:  # not the coordinator (a cluster's other broker)
                code = e.code
        states = tuple(
            build(m.TransactionState, transactional_id=x.transactional_id,
                  producer_id=x.producer_id, transaction_state=STATUS_NAMES[x.status])
            for x in metas
            if (not wanted or STATUS_NAMES[x.status] in wanted)
            and (not producers or x.producer_id in producers)
            and may.transactional_id(DESCRIBE, x.transactional_id)
        )  # fmt: skip
        return build(found.response, throttle_time=NO_TIME, error_code=code,
                     unknown_state_filters=unknown, transaction_states=states)  # fmt: skip

    def verify_produce(self, tid: str, records: Any, topic: str, partition: int) -> None:
        """A transactional produce: its batch's producer, at its epoch, must hold this
        partition in its open transaction (KafkaError with Kafka's code if not). On a cluster
        a batch that continues the producer's open transaction in the partition needs no
        check; one that would begin it is checked with the coordinator (txncluster.py)."""
        try:
            self._coordinator()
            view = memoryview(records)
            if len(view) < 61:
                raise TxnError(ErrorCode.corrupt_message, "a produce of no whole batch")
            producer_id, epoch = _PRODUCER.unpack_from(view, 43)
            cluster = self.broker.cluster
            if cluster is not None and cluster.open_transaction(topic, partition, producer_id,
                                                                epoch):  # fmt: skip
                return
            self._ask_coordinator(tid, producer_id, epoch, topic, partition)
        except TxnError as e:
            raise KafkaError(e.code, str(e)) from None

    def _ask_coordinator(
        self, tid: str, producer_id: int, epoch: int, topic: str, partition: int
    ) -> None:
        """KIP-890's check that the producer's transaction, open at `epoch`, holds the
        partition: this broker's coordinator's, or on a cluster the coordinator's over
        AddPartitionsToTxn v4 (TxnError with its code if not)."""
        coordinator = self._coordinator()
        if self.host is not None and self.clients is not None:
            info = self.host.coordinator()
            if info is None:
                raise TxnError(ErrorCode.coordinator_not_available,
                               "transactions have no coordinator now")  # fmt: skip
            if info.node_id != self.host.replicas.node_id:
                code = self.clients.call(info, "the transaction's verification",
                                         WireLeaderClient.verify_txn, tid, producer_id, epoch,
                                         topic, partition)  # fmt: skip
                if code != ErrorCode.none:
                    raise TxnError(code, f"the coordinator refused {topic}-{partition} "
                                         f"for producer {producer_id} epoch {epoch}: "
                                         f"{code.name}")  # fmt: skip
                return
        coordinator.verify(producer_id, epoch, topic, partition)


def _when(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(max(ms, 0) / 1000, tz=datetime.timezone.utc)
