"""Kafka's transactions on a cluster's broker (issue 34 on issue 33's cluster; docs/cluster.md
"Transactions"): where the transaction coordinator runs, how its state and markers become
durable, and how a partition's leader verifies a transactional produce.

- **The coordinator** is the leader of `__transaction_state-0`, an internal topic of the
  cluster replicated like `__consumer_offsets` (one partition, min(3, live brokers) replicas,
  compacted, min.insync.replicas 2 as Kafka's transaction.state.log.min.isr), made when a
  client first looks for it. FindCoordinator for a transactional ID names it; any other
  broker answers the transaction APIs NOT_COORDINATOR, and the client looks again.
- **Its state** is written to its replica of the topic and answered once every in-sync
  replica has it (acks=all), so a new coordinator after a failover holds every answered
  change. The coordinator epoch is the topic's leader epoch: a broker that becomes the
  coordinator reads the state again from its replica and first carries out every decision a
  former coordinator wrote (server/transactions.py).
- **Markers** go to each partition's leader: this broker's own (appended as leader and waited
  for until the in-sync replicas have it), or another's through Kafka's WriteTxnMarkers (v1),
  which that leader answers the same way. A marker that cannot be written now is retried by
  the coordinator (the transaction stays in its Prepare state meanwhile).
- **A transactional produce** to a partition's leader continues the producer's open
  transaction there when the partition's producer state has one at its epoch; a batch that
  would begin one is verified first with the coordinator (AddPartitionsToTxn v4,
  verify_only: KIP-890), so a late write of an ended transaction is refused.
- **A transaction's group offsets** (`send_offsets_to_transaction`) are Kafka's way: the
  transaction holds `__consumer_offsets-0`, TxnOffsetCommit goes to that partition's leader
  (the groups' coordinator), which verifies the transaction with the coordinator as a
  produce's leader does, holds the offsets (replicated before it answers) and, when the
  transaction's end reaches it (WriteTxnMarkers, or its own when it coordinates both),
  commits or drops them (server/transactions.py end_group_offsets).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from mqcore.cluster.assign import state_topic_configs
from mqcore.cluster.zk import BrokerInfo
from mqcore.errors import (
    MQCoreError,
    NotLeaderOrFollowerError,
    ProducerFencedError,
    ReplicationError,
)
from mqcore.server.interbroker import WireLeaderClient
from mqcore.server.transactions import (
    OFFSETS_PARTITION,
    STATE_SEGMENT_BYTES,
    STATE_TOPIC,
    TxnError,
    end_group_offsets,
)

if TYPE_CHECKING:
    from mqcore.cluster.replicas import ReplicaManager
    from mqcore.store import Store

STATE_CONFIGS = state_topic_configs(STATE_SEGMENT_BYTES)
STATE_MIN_ISR = 2  # Kafka's transaction.state.log.min.isr
REPLICATION_TIMEOUT = 5.0  # seconds a state change or a marker waits for the in-sync replicas
FENCED = (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch)


class BrokerClients:
    """One connection per broker for the transaction calls, each used by one caller at a
    time, made again after an error."""

    def __init__(self, replicas: ReplicaManager):
        self.replicas = replicas
        self._clients: dict[int, WireLeaderClient] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def call(
        self, info: BrokerInfo, use: str, fn: Callable[..., ErrorCode], *args: object
    ) -> ErrorCode:
        """`fn(client, *args)` on broker `info`'s connection; ReplicationError when the broker
        cannot be reached or answers nothing that parses."""
        with self._lock:
            lock = self._locks.setdefault(info.node_id, threading.Lock())
        with lock:
            client = self._clients.get(info.node_id)
            try:
                if client is None or client.broker != info:
                    if client is not None:
                        client.close()
                    client = WireLeaderClient(info, f"mqcore-broker-{self.replicas.node_id}-txn")
                    self._clients[info.node_id] = client
                return fn(client, *args)
            except (OSError, MQCoreError) as e:
                dropped = self._clients.pop(info.node_id, None)
                if dropped is not None:
                    dropped.close()
                raise ReplicationError(f"{use} at broker {info.node_id} failed: {e}") from None

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()


class ClusterHost:
    """server/transactions.TxnHost on a cluster's broker (module doc)."""

    def __init__(self, store: Store, replicas: ReplicaManager, clients: BrokerClients):
        self.store, self.replicas, self.clients = store, replicas, clients

    def coordinator(self) -> BrokerInfo | None:
        """The live broker that coordinates the transactions (None while none does)."""
        return self.replicas.internal_leader(STATE_TOPIC, STATE_CONFIGS, STATE_MIN_ISR)

    def term(self) -> int:
        if not self.replicas.has_topic(STATE_TOPIC):
            # made by the first FindCoordinator for a transactional ID, never here: the
            # expiry task runs from a broker's start, when too few brokers may be up to give
            # the state its replicas
            raise TxnError(ErrorCode.not_coordinator, "no transaction has a coordinator yet")
        info = self.coordinator()
        if info is None or info.node_id != self.replicas.node_id:
            raise TxnError(ErrorCode.not_coordinator,
                           f"broker {self.replicas.node_id} does not coordinate transactions "
                           "now")  # fmt: skip
        try:
            return self.replicas.leader_epoch(STATE_TOPIC, 0)
        except NotLeaderOrFollowerError as e:
            raise TxnError(ErrorCode.not_coordinator, str(e)) from None

    def replicated(self, last_offset: int) -> None:
        wait_committed(self.replicas, STATE_TOPIC, 0, last_offset)

    def new_producer_id(self) -> int | None:
        return self.replicas.next_producer_id()

    def has_partition(self, topic: str, partition: int) -> bool:
        return self.replicas.has_topic(topic) and partition in self.replicas.partitions(topic)

    def write_marker(
        self, topic: str, partition: int, producer_id: int, epoch: int, commit: bool, term: int
    ) -> None:
        meta = self.replicas.partitions(topic).get(partition)
        leader = -1 if meta is None or meta.state is None else meta.state.leader
        if leader == self.replicas.node_id:
            write_local_marker(self.store, self.replicas, topic, partition, producer_id, epoch,
                               commit, term)  # fmt: skip
            return
        info = self.replicas.brokers().get(leader)
        if info is None:
            raise ReplicationError(f"{topic}-{partition} has no live leader now")
        code = self.clients.call(info, "WriteTxnMarkers", WireLeaderClient.write_txn_marker,
                                 topic, partition, producer_id, epoch, commit, term)  # fmt: skip
        if code in FENCED:
            raise ProducerFencedError(f"{topic}-{partition}: {code.name}")
        if code != ErrorCode.none:
            raise ReplicationError(f"the marker of {topic}-{partition}: {code.name}")


def write_local_marker(
    store: Store, replicas: ReplicaManager, topic: str, partition: int, producer_id: int,
    epoch: int, commit: bool, term: int, deadline: float | None = None,
) -> None:  # fmt: skip
    """A marker appended by this broker as the partition's leader, returned once the in-sync
    replicas have it (NotLeaderOrFollower, ReplicationError, ProducerFenced otherwise); at
    `__consumer_offsets-0`, the groups' offsets the transaction held committed or dropped."""
    if (topic, partition) == OFFSETS_PARTITION:
        replicas.leader_epoch(topic, partition)  # NotLeaderOrFollower unless it leads
        end_group_offsets(store, producer_id, commit)
        offset = store.log.replica(topic, partition).log_end_offset - 1
    else:
        offset = replicas.append_marker(topic, partition, producer_id, epoch, commit, term)
    wait_committed(replicas, topic, partition, offset, deadline)


def wait_committed(
    replicas: ReplicaManager, topic: str, partition: int, last: int, deadline: float | None = None
) -> None:
    """Return once `last` is committed (ReplicaManager.committed), ReplicationError after
    REPLICATION_TIMEOUT (or at `deadline`, monotonic seconds); NotLeaderOrFollower (and
    NotEnoughReplicasAfterAppend) as raised."""
    if deadline is None:
        deadline = time.monotonic() + REPLICATION_TIMEOUT
    replicas.await_committed(topic, partition, last, deadline)
