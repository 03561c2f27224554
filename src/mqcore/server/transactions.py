"""Kafka's transaction coordinator on a node of one (issue 34; docs/server.md "Transactions"):
InitProducerId with a transactional ID, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit,
EndTxn, DescribeTransactions and ListTransactions, the verification of a transactional
produce (KIP-890: only a partition of the producer's open transaction, at its epoch), and the
abort of a transaction that outlives its timeout.

A transactional ID's state lives in the compacted internal topic `__transaction_state`, one
record per change, appended and fdatasync'd before the request is answered, so it survives a
process kill and a power loss. Kafka's TransactionLogKey/Value, version 0 (big-endian; string:
int16 length + UTF-8; array: int32 count, -1 null):

    key    int16 version (0) | string transactional_id
    value  int16 version (0) | int64 producer_id | int16 producer_epoch
           | int32 transaction_timeout_ms | int8 status | [string topic | [int32 partition]]
           | int64 last_update_ms | int64 start_ms
    status 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort, 4 CompleteCommit,
           5 CompleteAbort

The offsets a transaction commits for a group are Kafka's way: AddOffsetsToTxn adds
`__consumer_offsets-0` to the transaction (one partition, as mqcore makes it), TxnOffsetCommit
reaches the group's coordinator, which holds the offsets until the transaction's end reaches
that partition (consume/offsets.py "A Kafka transaction's offsets"); there the end commits or
drops them instead of writing a marker (end_group_offsets). So the coordinator and the
group's coordinator may be two brokers of a cluster, as in Kafka.

Ending a transaction: the Prepare state is written and synced, then each partition of the
transaction gets its COMMIT or ABORT marker (storage/txnindex.py; synced; the groups' offsets
committed or dropped), and the Complete state is written. A restart completes a transaction
found in a Prepare state the same way (a marker written twice is harmless: the second ends no
transaction), so the decision, once written, is carried out whole. EndTxn is answered once the
decision is durable; a marker that cannot be written now (on a cluster, a partition without a
leader) is written again every EXPIRY_INTERVAL_MS until it is, the transactional ID answering
CONCURRENT_TRANSACTIONS meanwhile, as Kafka's coordinator does.

Where the coordinator runs is its TxnHost's: on a node of one (LocalHost) it always does,
writes its state and markers to its own store; on a cluster's broker (server/txncluster.py)
only while it leads `__transaction_state-0`, its state written there and answered once the in-
sync replicas have it, its markers sent to each partition's leader.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kio.schema.errors import ErrorCode

from mqcore.consume.offsets import OFFSETS_TOPIC, BigEndianReader, encode_string
from mqcore.crashpoints import crash_point
from mqcore.errors import MQCoreError, NotLeaderOrFollowerError, ProducerFencedError
from mqcore.log.internal import replay_last_values

if TYPE_CHECKING:
    from mqcore.store import Store

log = logging.getLogger("mqcore.server")

STATE_TOPIC = "__transaction_state"
STATE_SEGMENT_BYTES = 100 << 20
EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT = range(6)
STATUS_NAMES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
                "CompleteAbort")  # fmt: skip
MAX_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms
EXPIRY_INTERVAL_MS = 1000  # how often timed-out transactions are looked for
STATE_KEY = 0
# the partition of `__consumer_offsets` whose end commits a transaction's group offsets
OFFSETS_PARTITION = (OFFSETS_TOPIC, 0)
MAX_EPOCH = 0x7FFF - 1  # an epoch is bumped past this only with a new producer ID
# transactional IDs one coordinator keeps: a client making new ones without end is refused
# past it (Kafka expires an ID idle for transactional.id.expiration.ms instead)
MAX_TRANSACTIONAL_IDS = 100_000
MAX_GROUPS_PER_TXN = 1000

TopicPartition = tuple[str, int]


@dataclass
class TxnMeta:
    """A transactional ID's producer, epoch, timeout, status and the partitions and group
    offsets of its open transaction."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    status: int = EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    last_update_ms: int = -1
    start_ms: int = -1
    groups: set[str] = field(default_factory=set)  # AddOffsetsToTxn's (this term's)
    marked: set[TopicPartition] = field(default_factory=set)  # markers written (a Prepare's)


def encode_key(kind: int, transactional_id: str) -> bytes:
    return struct.pack(">h", kind) + encode_string(transactional_id)


def encode_state(m: TxnMeta) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(m.partitions):
        by_topic.setdefault(t, []).append(p)
    parts = [struct.pack(">hqhib", 0, m.producer_id, m.epoch, m.timeout_ms, m.status),
             struct.pack(">i", len(by_topic))]  # fmt: skip
    for t, ps in by_topic.items():
        parts += [encode_string(t), struct.pack(">i", len(ps)), struct.pack(f">{len(ps)}i", *ps)]
    parts.append(struct.pack(">qq", m.last_update_ms, m.start_ms))
    return b"".join(parts)


def decode_key(raw: bytes | None) -> tuple[int, str] | None:
    if raw is None:
        raise ValueError("no key")
    r = BigEndianReader(raw)
    kind = r.take(">h")
    if kind != STATE_KEY:
        return None  # 100: the group offsets of a transaction, kept here before 2026-12-07
    return kind, r.string()


def decode_value(raw: bytes) -> bytes:
    """A value of a known version (its kind, state or offsets, is its key's)."""
    r = BigEndianReader(raw)
    version = r.take(">h")
    if version != 0:
        raise ValueError(f"unknown value version {version}")
    return raw


def _state_of(raw: bytes) -> tuple[int, int, int, int, set[TopicPartition], int, int]:
    r = BigEndianReader(raw)
    r.take(">h")
    pid, epoch, timeout, status = r.take(">q"), r.take(">h"), r.take(">i"), r.take(">b")
    if not 0 <= status <= COMPLETE_ABORT:
        raise ValueError(f"unknown transaction status {status}")
    partitions: set[TopicPartition] = set()
    for _ in range(max(r.take(">i"), 0)):
        topic = r.string()
        for _ in range(r.take(">i")):
            partitions.add((topic, r.take(">i")))
    return pid, epoch, timeout, status, partitions, r.take(">q"), r.take(">q")


class TxnError(MQCoreError):
    """A transactional request refused with Kafka's error `code`."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class TxnHost(Protocol):
    """What the coordinator needs of where it runs (module doc)."""

    def term(self) -> int:
        """The coordinator epoch this broker coordinates at now (what its markers carry);
        TxnError NOT_COORDINATOR when it does not coordinate."""
        ...

    def replicated(self, last_offset: int) -> None:
        """Return once the state written up to `last_offset` (fsync'd here) is as durable as
        the coordinator promises (on a cluster: every in-sync replica has it)."""
        ...

    def new_producer_id(self) -> int | None:
        """A producer ID no other broker hands out (None: the store allocates one)."""
        ...

    def has_partition(self, topic: str, partition: int) -> bool: ...

    def write_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool, term: int
    ) -> None:
        """The partition's COMMIT or ABORT marker, written (and as durable as an acks=all
        append) before this returns; ProducerFencedError when a newer epoch's is there; any
        other MQCoreError when it cannot be written now (retried later)."""
        ...


def end_group_offsets(store: Store, producer_id: int, commit: bool) -> None:
    """A transaction's end reaching `__consumer_offsets` (its OFFSETS_PARTITION): the groups'
    offsets it held committed or dropped (consume/offsets.py), durable when this returns."""
    store.offset_store().end_txn(producer_id, commit, store.log.clock())


class LocalHost:
    """A node of one: it always coordinates; its state and markers are in its own store."""

    def __init__(self, store: Store, leader_epoch: int):
        self.store, self.log = store, store.log
        self.leader_epoch = leader_epoch  # what the markers carry (the broker's appends' own)

    def term(self) -> int:
        return 0

    def replicated(self, last_offset: int) -> None:
        pass

    def new_producer_id(self) -> int | None:
        return None

    def has_partition(self, topic: str, partition: int) -> bool:
        return self.log.find_partition(topic, partition) is not None

    def write_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool, term: int
    ) -> None:
        if (topic, partition) == OFFSETS_PARTITION:
            end_group_offsets(self.store, producer_id, commit)
            return
        replica = self.log.replica(topic, partition)
        replica.append_marker(producer_id, epoch, commit, term, leader_epoch=self.leader_epoch)
        self.log.partition(topic, partition).flush()


class TransactionCoordinator:
    """Every transactional ID of one store (module doc). Thread-safe: one lock for all."""

    def __init__(
        self, store: Store, leader_epoch: int = -1, expiry_interval_ms: int = EXPIRY_INTERVAL_MS,
        host: TxnHost | None = None,
    ):  # fmt: skip
        self.store, self.log = store, store.log
        self.host: TxnHost = LocalHost(store, leader_epoch) if host is None else host
        self.clock: Callable[[], int] = store.log.clock
        self._lock = threading.RLock()
        self._txns: dict[str, TxnMeta] | None = None
        self._term: int | None = None  # the coordinator epoch the loaded state is of
        self._by_producer: dict[int, str] = {}
        self.expiry_interval_ms = expiry_interval_ms
        if not store.read_only:
            if host is None:
                with self._lock:  # load now: a decision a crash left half done is carried out
                    self._serving()
            self.log.tasks.add("kafka-transaction-expiry", expiry_interval_ms, self.expire)

    def close(self) -> None:
        if not self.store.read_only:
            self.log.tasks.remove("kafka-transaction-expiry")

    # -- state ------------------------------------------------------------------------------

    def _serving(self) -> dict[str, TxnMeta]:
        """The transactional IDs, when this broker coordinates them (TxnError NOT_COORDINATOR
        otherwise): loaded again from its replica of the state when its term changed (it
        just became the coordinator: what an earlier one decided is carried out first)."""
        term = self.host.term()
        if term != self._term:
            self._txns, self._term = None, term
        return self._loaded()

    def _loaded(self) -> dict[str, TxnMeta]:
        """The transactional IDs as `__transaction_state` holds them, loaded on first use;
        a transaction found prepared is completed then (module doc)."""
        if self._txns is None:
            txns: dict[str, TxnMeta] = {}
            if self.log.has_topic(STATE_TOPIC):
                values = replay_last_values(self.log, STATE_TOPIC, decode_key, decode_value,
                                            "a transaction state")  # fmt: skip
                for (kind, tid), raw in values.items():
                    if kind != STATE_KEY:
                        continue
                    pid, epoch, timeout, status, parts, update, start = _state_of(raw)
                    txns[tid] = TxnMeta(tid, pid, epoch, timeout, status, parts, update, start)
            self._txns = txns
            self._by_producer = {m.producer_id: tid for tid, m in txns.items()}
            for m in list(txns.values()):
                if m.status in (PREPARE_COMMIT, PREPARE_ABORT):
                    self._try_complete(m)
        return self._txns

    def _write(self, m: TxnMeta) -> None:
        """Append the state and fdatasync it (and on a cluster, wait for the replicas)."""
        topic = self.log.internal_topic(STATE_TOPIC, partitions=1, cleanup_policy="compact",
                                        unique_ids=False, key_index=False,
                                        segment_bytes=STATE_SEGMENT_BYTES)  # fmt: skip
        keys = [encode_key(STATE_KEY, m.transactional_id)]
        values: list[bytes | None] = [encode_state(m)]
        written = self.log.append_records(topic, 0, values, keys)
        self.log.partition(topic, 0).flush()
        try:
            self.host.replicated(written.base_offset + len(values) - 1)
        except MQCoreError as e:
            # not known to be durable: what memory holds may not be what a new coordinator
            # reads, so it is read again from the log at the next request
            self._txns, self._term = None, None
            code = (ErrorCode.not_coordinator if isinstance(e, NotLeaderOrFollowerError)
                    else ErrorCode.coordinator_not_available)  # fmt: skip
            raise TxnError(code, f"the transaction state was not replicated: {e}") from e

    # -- the requests -----------------------------------------------------------------------

    def _meta(self, tid: str, producer_id: int, epoch: int) -> TxnMeta:
        m = self._serving().get(tid)
        if m is None or m.producer_id != producer_id:
            raise TxnError(ErrorCode.invalid_producer_id_mapping,
                           f"transactional ID {tid!r} is not producer {producer_id}")  # fmt: skip
        if epoch < m.epoch:
            raise TxnError(ErrorCode.producer_fenced,
                           f"producer {producer_id} epoch {epoch} of {tid!r} is fenced: the "
                           f"coordinator has epoch {m.epoch}")  # fmt: skip
        if epoch > m.epoch:
            raise TxnError(
                ErrorCode.invalid_producer_epoch,
                f"producer {producer_id} epoch {epoch} is newer than {m.epoch}",
            )
        return m

    def init_producer_id(
        self, tid: str, timeout_ms: int, producer_id: int = -1, epoch: int = -1
    ) -> tuple[int, int]:
        """(producer ID, epoch) for a transactional producer's session: a new ID for a new
        transactional ID, else the same one at the next epoch, which fences every earlier
        session; an open transaction of an earlier session is aborted first (its markers at
        the new epoch, so its late writes are refused)."""
        if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise TxnError(
                ErrorCode.invalid_transaction_timeout,
                f"transaction.timeout.ms {timeout_ms} is not in (0, {MAX_TIMEOUT_MS}]",
            )
        with self._lock:
            txns = self._serving()
            m = txns.get(tid)
            now = self.clock()
            if m is None:
                if len(txns) >= MAX_TRANSACTIONAL_IDS:
                    raise TxnError(ErrorCode.invalid_request,
                                   f"this coordinator keeps {MAX_TRANSACTIONAL_IDS} transactional "
                                   "IDs already (MAX_TRANSACTIONAL_IDS)")  # fmt: skip
                pid = self.log.register_producer(self.host.new_producer_id(), 0)
                m = txns[tid] = TxnMeta(tid, pid, 0, timeout_ms, EMPTY, set(), now, -1)
                self._by_producer[pid] = tid
                self._write(m)
                return m.producer_id, m.epoch
            if producer_id >= 0 and (producer_id, epoch) != (m.producer_id, m.epoch):
                raise TxnError(ErrorCode.producer_fenced,
                               f"producer {producer_id} epoch {epoch} is not the current "
                               f"session of {tid!r}")  # fmt: skip
            if m.status in (PREPARE_COMMIT, PREPARE_ABORT) and not self._try_complete(m):
                raise TxnError(ErrorCode.concurrent_transactions,
                               f"the last transaction of {tid!r} is still ending")  # fmt: skip
            if m.status == ONGOING:
                self._bump(m)
                m.status, m.last_update_ms = PREPARE_ABORT, now
                self._write(m)
                if not self._try_complete(m):
                    raise TxnError(ErrorCode.concurrent_transactions,
                                   f"the aborted transaction of {tid!r} is ending")  # fmt: skip
            self._bump(m)
            m.timeout_ms, m.status, m.partitions, m.groups = timeout_ms, EMPTY, set(), set()
            m.last_update_ms, m.start_ms = now, -1
            self._write(m)
            return m.producer_id, m.epoch

    def _bump(self, m: TxnMeta) -> None:
        """The next epoch, or a new producer ID past the last epoch."""
        if m.epoch >= MAX_EPOCH:
            self._by_producer.pop(m.producer_id, None)
            m.producer_id, m.epoch = self.log.register_producer(self.host.new_producer_id(), 0), 0
            self._by_producer[m.producer_id] = m.transactional_id
        else:
            m.epoch += 1
            self.log.register_producer(m.producer_id, m.epoch)

    def add_partitions(
        self, tid: str, producer_id: int, epoch: int, partitions: Iterable[TopicPartition]
    ) -> None:
        with self._lock:
            m = self._meta(tid, producer_id, epoch)
            self._check_open(m)
            wanted = set(partitions)
            for t, p in wanted:
                if not self.host.has_partition(t, p):
                    raise TxnError(ErrorCode.unknown_topic_or_partition, f"{t}-{p} is not here")
            if wanted <= m.partitions and m.status == ONGOING:
                return
            now = self.clock()
            if m.status != ONGOING:
                m.status, m.start_ms = ONGOING, now
            m.partitions |= wanted
            m.last_update_ms = now
            self._write(m)

    def add_offsets(self, tid: str, producer_id: int, epoch: int, group: str) -> None:
        with self._lock:
            m = self._meta(tid, producer_id, epoch)
            self._check_open(m)
            if group not in m.groups and len(m.groups) >= MAX_GROUPS_PER_TXN:
                raise TxnError(ErrorCode.invalid_request,
                               f"a transaction takes the offsets of {MAX_GROUPS_PER_TXN} groups "
                               "at most")  # fmt: skip
            m.groups.add(group)
            if OFFSETS_PARTITION in m.partitions and m.status == ONGOING:
                return
            now = self.clock()
            if m.status != ONGOING:
                m.status, m.start_ms = ONGOING, now
            m.partitions.add(OFFSETS_PARTITION)
            m.last_update_ms = now
            self._write(m)

    def end_txn(self, tid: str, producer_id: int, epoch: int, commit: bool) -> None:
        with self._lock:
            m = self._meta(tid, producer_id, epoch)
            done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
            prepared = PREPARE_COMMIT if commit else PREPARE_ABORT
            if m.status in (EMPTY, done, prepared):
                return  # nothing open, or a retry of the end just made (or decided)
            if m.status != ONGOING:
                raise TxnError(ErrorCode.invalid_txn_state,
                               f"{tid!r} is {STATUS_NAMES[m.status]}: cannot "
                               f"{'commit' if commit else 'abort'}")  # fmt: skip
            m.status = PREPARE_COMMIT if commit else PREPARE_ABORT
            m.last_update_ms = self.clock()
            self._write(m)
            crash_point("kafka_txn.after_prepare")
            self._try_complete(m)  # the decision is durable: what is left is retried

    def _try_complete(self, m: TxnMeta) -> bool:
        """_complete, or False (logged) when a marker cannot be written now: the Prepare
        state stays, and the expiry task tries again."""
        try:
            self._complete(m)
        except MQCoreError as e:
            if isinstance(e, TxnError) and e.code == ErrorCode.not_coordinator:
                raise
            log.warning("transaction %r: %s is not carried out yet (retried): %s",
                        m.transactional_id, STATUS_NAMES[m.status], e)  # fmt: skip
            return False
        return True

    def _complete(self, m: TxnMeta) -> None:
        """Carry out a written Prepare decision: markers (and the groups' offsets), then the
        Complete state.
        A marker that fails raises (MQCoreError): those written are remembered, the rest is
        written at the next try."""
        commit = m.status == PREPARE_COMMIT
        term = self.host.term()
        for t, p in sorted(m.partitions - m.marked):
            if not self.host.has_partition(t, p):
                m.marked.add((t, p))
                continue  # deleted since: nothing to end there
            try:
                self.host.write_marker(t, p, m.producer_id, m.epoch, commit, term)
            except ProducerFencedError:
                pass  # a newer session's marker is there already
            m.marked.add((t, p))
            crash_point("kafka_txn.after_marker")
        m.status = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        m.partitions, m.groups, m.marked = set(), set(), set()
        m.last_update_ms = self.clock()
        self._write(m)

    def _check_open(self, m: TxnMeta) -> None:
        if m.status in (PREPARE_COMMIT, PREPARE_ABORT) and not self._try_complete(m):
            raise TxnError(ErrorCode.concurrent_transactions, "the last transaction is ending")

    def verify(self, producer_id: int, epoch: int, topic: str, partition: int) -> None:
        """KIP-890's check of a transactional produce: the producer's transaction is open
        here, holds this partition, at this epoch (TxnError with Kafka's code if not)."""
        with self._lock:
            txns = self._serving()
            tid = self._by_producer.get(producer_id)
            m = None if tid is None else txns.get(tid)
            if m is None:
                raise TxnError(ErrorCode.invalid_producer_id_mapping,
                               f"producer {producer_id} has no transactional ID here")  # fmt: skip
            if epoch < m.epoch:
                raise TxnError(ErrorCode.invalid_producer_epoch,
                               f"producer {producer_id} epoch {epoch} is fenced (epoch "
                               f"{m.epoch})")  # fmt: skip
            if m.status != ONGOING or (topic, partition) not in m.partitions or epoch != m.epoch:
                raise TxnError(ErrorCode.invalid_txn_state,
                               f"{topic}-{partition} is not in an open transaction of producer "
                               f"{producer_id} epoch {epoch}")  # fmt: skip

    def expire(self, now: int | None = None) -> list[str]:
        """Abort every transaction open longer than its timeout, at a new epoch (fencing its
        producer, as Kafka does), and carry out the decisions whose markers could not all be
        written before; returns the transactional IDs aborted. Nothing where this broker
        does not coordinate."""
        now = self.clock() if now is None else now
        with self._lock:
            try:
                txns = self._serving()
            except TxnError:
                return []  # another broker coordinates (or none does now)
            for m in list(txns.values()):
                if m.status in (PREPARE_COMMIT, PREPARE_ABORT):
                    self._try_complete(m)
            gone = [m for m in txns.values()
                    if m.status == ONGOING and m.start_ms >= 0
                    and now - m.start_ms > m.timeout_ms]  # fmt: skip
            for m in gone:
                self._bump(m)
                m.status, m.last_update_ms = PREPARE_ABORT, now
                self._write(m)
                self._try_complete(m)
            return [m.transactional_id for m in gone]

    def describe(self, tid: str) -> TxnMeta | None:
        with self._lock:
            return self._serving().get(tid)

    def listing(self) -> list[TxnMeta]:
        with self._lock:
            return sorted(self._serving().values(), key=lambda m: m.transactional_id)
