"""What each Kafka request does to the store: the broker behind `mqcore serve`.

One node: it is its own controller and the leader and only replica of every partition, so
Metadata names it for all of them, a partition's high watermark is its log end, and acks=1 and
acks=all both mean "appended" (durable as the store's flush policy says: with
flush="always" the append is fdatasync'd before the response). Records arrive as the client
built them and are appended through the embedding API (`Log.replica`): validated, offsets
assigned in place, never re-encoded; a fetch returns the stored batches as they are.
docs/server.md lists the APIs and versions, and what is not served.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from mqcore.cluster.assign import (
    INTERNAL_REPLICATION_FACTOR,
    checked_assignment,
    state_topic_configs,
)
from mqcore.config import TopicConfig, topic_setting, validate_name
from mqcore.consume.offsets import OFFSETS_SEGMENT_BYTES, OFFSETS_TOPIC
from mqcore.errors import (
    CoordinatorError,
    InvalidRecordError,
    InvalidReplicaAssignmentError,
    MissingKeyError,
    MQCoreError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    TopicExistsError,
    UnknownTopicError,
)
from mqcore.log import ReplicaLog
from mqcore.log.legacy import up_convert
from mqcore.log.replica import Isolation
from mqcore.server.admin import (
    AdminApis,
    create_requested,
    creation_errors,
    request_limit,
    throttle_time,
)
from mqcore.server.admin import create_topic as admin_create_topic
from mqcore.server.auth import (
    CLUSTER,
    CREATE,
    DESCRIBE,
    NOT_ASKED,
    READ,
    TOPIC,
    WRITE,
    Access,
    Authorizer,
)
from mqcore.server.common import (
    NO_TIME,
    ZERO_UUID,
    CloseConnection,
    KafkaError,
    Session,
    error_code,
    topic_id,
)
from mqcore.server.defaults import CONSUMER_HEARTBEAT_INTERVAL, CONSUMER_SESSION_TIMEOUT
from mqcore.server.delayed import NOT_YET, Delayed, Purgatory, resolve
from mqcore.server.fetchwire import FetchAnswer, FetchedPartition, FetchedTopic
from mqcore.server.groups import INITIAL_REBALANCE_DELAY, WAKE_KEY, GroupCoordinator
from mqcore.server.producewire import ProduceAnswer, ProducedPartition, ProducedTopic
from mqcore.server.protocol import APIS, CONNECTION_APIS, Api, api_keys, build
from mqcore.server.quota import MutationQuota, QuotaExceeded
from mqcore.server.txnapis import TxnApis
from mqcore.store import Store

if TYPE_CHECKING:
    from mqcore.cluster.replicas import ReplicaManager

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3  # ListOffsets' special timestamps
MAX_EPOCH = 0x7FFF
# the leader epoch a node of one leads every partition at: its appends carry it and
# OffsetForLeaderEpoch fences by it (Metadata answers -1, no epoch, so clients check none)
LEADER_EPOCH = 0
# the offsets topic as consume.offsets makes it on one node (compacted, no query indexes)
OFFSETS_CONFIGS = state_topic_configs(OFFSETS_SEGMENT_BYTES)
OFFSETS_COMMIT_TIMEOUT = 5.0  # seconds: Kafka's offsets.commit.timeout.ms
KEYLESS = "a compacted topic takes only records with a key"  # a keyless record's record error

Handler = Callable[[Api, Any, Session], Any]


class Broker:
    """The request handlers over one open Store. `host`/`port` are what Metadata advertises."""

    def __init__(
        self,
        store: Store,
        host: str,
        port: int,
        *,
        node_id: int = 0,
        cluster_id: str = "",
        auto_create_topics: bool = True,
        default_partitions: int = 1,
        authorizer: Authorizer | None = None,
        group_initial_rebalance_delay: float = INITIAL_REBALANCE_DELAY,
        group_consumer_session_timeout: float = CONSUMER_SESSION_TIMEOUT,
        group_consumer_heartbeat_interval: float = CONSUMER_HEARTBEAT_INTERVAL,
        execute: Callable[[Callable[[], None]], None] | None = None,
        quota: MutationQuota | None = None,
        cluster: ReplicaManager | None = None,
        default_replication_factor: int = 1,
    ):
        self.store = store
        # a broker of a cluster (docs/cluster.md): partitions led, followed and created
        # through the cluster's state; None: the one-node server
        self.cluster = cluster
        self.default_replication_factor = default_replication_factor
        self.authorizer = authorizer  # None: no ACLs, every request allowed
        self.log = store.log
        self.host, self.port = host, port
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self.closed = False
        # KIP-599's mutation quota: partitions a principal may create per second (admin.py)
        self.quota = quota if quota is not None else MutationQuota()
        # requests that wait (fetches for min_bytes, joins and syncs for the rebalance) wait in
        # the purgatory without a thread; `execute` runs their checks (the server's request
        # threads; a thread per check for a Broker used alone). Blocking callers of handle()
        # sleep on _appended instead, which every append wakes too.
        self.purgatory = Purgatory(execute or _thread_per_call)
        self._appended = threading.Condition()
        self._generation = 0
        self.log.add_append_listener(self._on_append)
        if cluster is not None:
            cluster.on_progress = self._on_progress
        # consumer groups; commits and offset fetches checked against the ACLs
        self.groups = GroupCoordinator(
            store, node_id, host, port, access=self.access,
            initial_rebalance_delay=group_initial_rebalance_delay,
            consumer_session_timeout=group_consumer_session_timeout,
            consumer_heartbeat_interval=group_consumer_heartbeat_interval,
            wake=lambda: self.purgatory.wake(WAKE_KEY),
            locate=self._group_coordinator if cluster is not None else None,
            locate_txn=(lambda: self.txn_apis.locate()) if cluster is not None else None,
            replicated=self._offsets_replicated if cluster is not None else None,
        )  # fmt: skip
        self._coordinating = False  # on a cluster: whether this broker leads the offsets
        self.txn_apis = TxnApis(self, LEADER_EPOCH)  # Kafka's transactions (server/txnapis.py)
        self.handlers: dict[int, Handler] = {
            0: self.produce,
            1: self.fetch,
            2: self.list_offsets,
            23: self.offset_for_leader_epoch,
            3: self.metadata,
            18: self.api_versions,
            19: self.create_topics,
            22: self.init_producer_id,
            **self.groups.handlers(),
            **self.txn_apis.handlers(),
            68: self.groups.consumer.heartbeat,  # KIP-848 (server/consumergroups.py)
            69: self.groups.consumer.describe,
        }
        admin = AdminApis(self)
        self.handlers.update({
            20: admin.delete_topics,
            21: admin.delete_records,
            32: admin.describe_configs,
            33: admin.alter_configs,
            37: admin.create_partitions,
            44: admin.incremental_alter_configs,
            60: admin.describe_cluster,
        })  # fmt: skip
        assert set(self.handlers) == set(APIS) - CONNECTION_APIS

    def close(self) -> None:
        """Stop listening for appends and answer every waiting fetch, JoinGroup and SyncGroup
        (those in the purgatory through its executor, which must still run)."""
        self.closed = True
        self.groups.close()
        self.txn_apis.close()
        self.log.remove_append_listener(self._on_append)
        with self._appended:
            self._appended.notify_all()
        self.purgatory.close()

    def _on_append(self, topic: str, partition: int, *_: Any) -> None:
        with self._appended:
            self._generation += 1
            self._appended.notify_all()
        self.purgatory.wake((topic, partition))

    def _on_progress(self, topic: str, partition: int) -> None:
        """A partition's high watermark moved or its leader changed (cluster mode): the
        fetches and acks=all produces waiting on it look again; the groups move with the
        offsets topic's leader."""
        if topic == OFFSETS_TOPIC and self.cluster is not None:
            here = self.groups.here()
            if here and not self._coordinating:
                self.groups.take_over()
            self._coordinating = here
        self._on_append(topic, partition)

    def _offsets_replicated(self, respond: Callable[[Any], Any]) -> Any:
        """An offset commit on a cluster, answered once every in-sync replica of the offsets
        topic has it (Kafka's commits are acks=all appends): `respond(None)`, or
        respond(code) when the coordinator lost its leadership (NOT_COORDINATOR), the ISR fell
        below min.insync.replicas, or OFFSETS_COMMIT_TIMEOUT passed (REQUEST_TIMED_OUT)."""
        cluster = self.cluster
        assert cluster is not None
        last = self.log.replica(OFFSETS_TOPIC, 0).log_end_offset - 1  # the commit's batch

        def poll(final: bool) -> Any:
            try:
                if cluster.committed(OFFSETS_TOPIC, 0, last):
                    return respond(None)
            except NotLeaderOrFollowerError:
                return respond(ErrorCode.not_coordinator)
            except MQCoreError as e:
                return respond(error_code(e))
            return respond(ErrorCode.request_timed_out) if final else NOT_YET

        done = poll(False)
        if done is not NOT_YET:
            return done
        deadline = time.monotonic() + OFFSETS_COMMIT_TIMEOUT
        return Delayed(poll, lambda: self._wait_blocking(poll, deadline), deadline=deadline,
                       keys=[(OFFSETS_TOPIC, 0)])  # fmt: skip

    def _group_coordinator(self) -> tuple[int, str, int] | None:
        """(node, host, port) of the cluster's group coordinator: the leader of the offsets
        topic, made (replicated) when a client first looks for it; None while it has none."""
        assert self.cluster is not None
        broker = self.cluster.internal_leader(OFFSETS_TOPIC, OFFSETS_CONFIGS)
        return None if broker is None else (broker.node_id, broker.host, broker.port)

    def _wait_blocking(self, poll: Callable[[bool], Any], deadline: float) -> Any:
        """A Delayed's poll waited for in this thread: at each append or progress until it
        answers or the deadline."""
        while True:
            generation = self._generation
            wait = deadline - time.monotonic()
            got = poll(wait <= 0 or self.closed)
            if got is not NOT_YET:
                return got
            with self._appended:
                if self._generation == generation and not self.closed:
                    self._appended.wait(wait)

    def begin(self, found: Api, body: Any, session: Session) -> Any:
        """The response body to one request (None: no response, as for acks=0), or a Delayed
        to hand to `purgatory` when the request waits (server/delayed.py)."""
        return self.handlers[found.key](found, body, session)

    def handle(self, found: Api, body: Any, session: Session) -> Any:
        """The response body to one request, waited for in this thread if it waits."""
        return resolve(self.begin(found, body, session))

    # -- authorization (server.auth; docs/server.md "Security") ---------------------------------

    def access(self, session: Session) -> Access:
        """The session's principal's grants (server.auth.Access: the same check the HTTP API
        and the console make)."""
        return Access(self.authorizer, session.principal)

    def allowed(self, session: Session, operation: str, topic: str) -> bool:
        return self.access(session).topic(operation, topic)

    def authorize(self, session: Session, operation: str, topic: str) -> None:
        """TopicAuthorizationError (TOPIC_AUTHORIZATION_FAILED) unless the session's
        principal may."""
        self.access(session).check_topic(operation, topic)

    # -- cluster --------------------------------------------------------------------------------

    def api_versions(self, found: Api, body: Any, session: Session) -> Any:
        return build(
            found.response, error_code=ErrorCode.none, api_keys=api_keys(found),
            throttle_time=NO_TIME,
        )  # fmt: skip

    def metadata(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        brokers = tuple(build(m.MetadataResponseBroker, node_id=n, host=h, port=p, rack=r)
                        for n, h, p, r in self.live_brokers())  # fmt: skip
        known = self.store.topics() if self.cluster is None else self.cluster.topics()
        if body.topics is None:  # all topics: those the principal may not describe are left out
            names: Iterable[str] = [n for n in known if self.allowed(session, DESCRIBE, n)]
            create = False
        else:
            names = [t.name for t in body.topics if t.name is not None]
            # v0-v3 had no flag: those versions always auto-created
            create = getattr(body, "allow_auto_topic_creation", True)
        ops = getattr(body, "include_topic_authorized_operations", False)  # v8+
        topics = tuple(self._topic_metadata(m, name, create, session, ops) for name in names)
        if body.topics is not None:  # v10+ may name a topic by ID (KIP-516; KIP-848 consumers)
            topics += tuple(self._topic_by_id(found, t.topic_id, session, ops)
                            for t in body.topics if t.name is None)  # fmt: skip
        cluster_ops = NOT_ASKED  # v8-v10 only: DescribeCluster answers it from v11 on
        if getattr(body, "include_cluster_authorized_operations", False):
            cluster_ops = self.access(session).kafka_operations(CLUSTER)
        return build(
            found.response, throttle_time=NO_TIME, brokers=brokers, cluster_id=self.cluster_id,
            controller_id=self.controller_id(), topics=topics,
            cluster_authorized_operations=cluster_ops,
        )  # fmt: skip

    def live_brokers(self) -> list[tuple[int, str, int, str | None]]:
        """(node ID, host, port, rack) of each live broker: this one alone on a node of one,
        the cluster's registered brokers otherwise (Metadata, DescribeCluster)."""
        if self.cluster is None:
            return [(self.node_id, self.host, self.port, None)]
        live = self.cluster.brokers()
        return [(b.node_id, b.host, b.port, b.rack) for _, b in sorted(live.items())]

    def controller_id(self) -> int:
        return self.node_id if self.cluster is None else self.cluster.controller_id()

    def _topic_metadata(
        self, m: Any, name: str, create: bool, session: Session, ops: bool = False
    ) -> Any:
        """One topic's Metadata; with `ops`, the principal's authorized operations on it,
        unless it may not describe it (Kafka's). When the request allows auto-creation
        (`create`), a missing topic is made if the server auto-creates topics, and
        `__consumer_offsets` whatever it does, as Kafka's broker makes its internal topic (a
        client reading commits, such as Burrow, names it before any group committed)."""
        if self.cluster is not None:
            return self._cluster_topic_metadata(m, name, create, session, ops)
        code, count, authorized = ErrorCode.none, 0, NOT_ASKED
        try:
            self.authorize(session, DESCRIBE, name)
            if ops:
                authorized = self.access(session).kafka_operations(TOPIC, name)
            validate_name(name)
            if not self.log.has_topic(name):  # a dict lookup (topics() sorts every name)
                if create and name == OFFSETS_TOPIC:
                    self.store.offset_store().topic()
                elif not (create and self.auto_create_topics) or not self.allowed(
                    session, CREATE, name
                ):
                    raise UnknownTopicError(name)
                else:
                    try:
                        self._create(name, self.default_partitions, {}, session)
                    except TopicExistsError:
                        pass  # created meanwhile by another connection, with another count
            count = self.store.partitions(name)  # UnknownTopicError if deleted meanwhile
        except MQCoreError as e:
            code = error_code(e)
        partitions = tuple(
            build(
                m.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=p,
                leader_id=self.node_id,
                leader_epoch=-1,
                replica_nodes=(self.node_id,),
                isr_nodes=(self.node_id,),
                offline_replicas=(),
            )  # fmt: skip
            for p in range(count)
        )
        return build(
            m.MetadataResponseTopic, error_code=code, name=name, topic_id=topic_id(name),
            is_internal=name.startswith("__"), partitions=partitions,
            topic_authorized_operations=authorized,
        )  # fmt: skip

    def _cluster_topic_metadata(
        self, m: Any, name: str, create: bool, session: Session, ops: bool
    ) -> Any:
        """One topic's Metadata on a cluster: each partition's leader, leader epoch,
        replicas, ISR and the replicas not alive, as this broker last heard from the
        cluster's state (LEADER_NOT_AVAILABLE while a partition has no live leader)."""
        assert self.cluster is not None
        code, authorized = ErrorCode.none, NOT_ASKED
        parts: dict[int, Any] = {}
        try:
            self.authorize(session, DESCRIBE, name)
            if ops:
                authorized = self.access(session).kafka_operations(TOPIC, name)
            validate_name(name)
            if not self.cluster.has_topic(name):
                if not (create and (self.auto_create_topics or name == OFFSETS_TOPIC)) or not (
                    name == OFFSETS_TOPIC or self.allowed(session, CREATE, name)
                ):
                    raise UnknownTopicError(name)
                self._create_in_cluster(name, -1, -1, {}, session)
            parts = self.cluster.partitions(name)
        except TopicExistsError:
            parts = self.cluster.partitions(name)
        except MQCoreError as e:
            code = error_code(e)
        live = set(self.cluster.brokers())
        partitions = []
        for p, meta in parts.items():
            state = meta.state
            leader = state.leader if state is not None else -1
            if leader not in live:  # Kafka's MetadataCache: a dead leader is no leader, so
                leader = -1  # clients look again soon instead of waiting at its door
            partitions.append(build(
                m.MetadataResponsePartition,
                error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
                partition_index=p, leader_id=leader,
                leader_epoch=state.leader_epoch if state is not None else -1,
                replica_nodes=meta.replicas, isr_nodes=state.isr if state is not None else (),
                offline_replicas=tuple(r for r in meta.replicas if r not in live),
            ))  # fmt: skip
        return build(
            m.MetadataResponseTopic, error_code=code, name=name, topic_id=topic_id(name),
            is_internal=name.startswith("__"), partitions=tuple(partitions),
            topic_authorized_operations=authorized,
        )  # fmt: skip

    def _create_in_cluster(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str],
        session: Session | None = None,
        *,
        assignment: dict[int, list[int]] | None = None,
    ) -> int:
        """A topic created in the cluster: -1 partitions or replication factor for the
        server's defaults, the internal offsets topic with its own; bounded by this broker's
        store's partition limits (every broker holding a replica has the same) and, for a
        client's (`session`), metered by its mutation quota as on a node of one. Returns the
        count."""
        assert self.cluster is not None
        self.cluster.check_creatable(name)  # TOPIC_ALREADY_EXISTS first, as Kafka
        live = len(self.cluster.brokers())
        if name == OFFSETS_TOPIC:  # Kafka's offsets.topic.replication.factor: min(3, brokers)
            partitions, replication_factor = 1, min(INTERNAL_REPLICATION_FACTOR, max(live, 1))
            configs = dict(OFFSETS_CONFIGS)
        if partitions == -1:
            partitions = self.default_partitions
        if assignment is not None:
            replication_factor = len(next(iter(assignment.values())))
        if replication_factor == -1:
            replication_factor = min(self.default_replication_factor, max(live, 1))
        if partitions < 1:
            raise KafkaError(ErrorCode.invalid_partitions, "partitions must be >= 1")
        if replication_factor < 1:
            raise KafkaError(ErrorCode.invalid_replication_factor,
                             f"replication factor {replication_factor} must be >= 1")  # fmt: skip
        if replication_factor > live:
            raise KafkaError(
                ErrorCode.invalid_replication_factor,
                f"replication factor {replication_factor} is larger than the {live} live brokers",
            )
        with creation_errors():
            self.log.check_limits(name, partitions)
        if session is not None:
            self.quota.admit(session.principal)
        self.cluster.create_topic(name, partitions, replication_factor, configs,
                                  assignment=assignment)  # fmt: skip
        if session is not None:
            self.quota.record(session.principal, partitions)
        return partitions

    def _topic_by_id(self, found: Api, wanted: Any, session: Session, ops: bool) -> Any:
        """The topic whose ID (common.topic_id) is `wanted`; UNKNOWN_TOPIC_ID when there is
        none, or the principal may not describe it (an ID does not reveal a name)."""
        for name in self.store.topics():
            if topic_id(name) == wanted and self.allowed(session, DESCRIBE, name):
                return self._topic_metadata(found.module, name, False, session, ops)
        return build(
            found.module.MetadataResponseTopic, error_code=ErrorCode.unknown_topic_id,
            name=None if found.version >= 12 else "", topic_id=wanted, is_internal=False,
            partitions=(), topic_authorized_operations=NOT_ASKED,
        )  # fmt: skip

    def _create(
        self, name: str, partitions: int, settings: dict[str, Any], session: Session
    ) -> TopicConfig:
        """A topic created for a client: metered by its principal's mutation quota, bounded
        by the store's partition limits (admin.create_topic)."""
        return admin_create_topic(self, name, partitions, settings, session)

    def create_topics(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        results = []
        too_many = request_limit(self, body.topics)  # the whole request, as Kafka refuses it
        throttle = 0
        for t in body.topics:
            code, message, cfg = ErrorCode.none, None, None
            try:
                if too_many is not None:
                    raise too_many
                self.authorize(session, CREATE, t.name)
                if self.cluster is not None:
                    cfg = self._create_requested_in_cluster(t, body.validate_only, session)
                else:
                    cfg = create_requested(self, t, body.validate_only, session)
            except MQCoreError as e:
                code, message = error_code(e), str(e)
                if isinstance(e, QuotaExceeded):
                    throttle = max(throttle, e.throttle_ms)
            results.append(
                build(
                    m.CreatableTopicResult,
                    name=t.name,
                    topic_id=topic_id(t.name) if cfg else ZERO_UUID,
                    error_code=code,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=cfg.partitions if cfg else -1,
                    replication_factor=(self._replication_factor(t.name) if cfg else -1),
                    configs=None,
                )  # fmt: skip
            )
        return build(found.response, throttle_time=throttle_time(throttle), topics=tuple(results))

    def _create_requested_in_cluster(
        self, t: Any, validate_only: bool, session: Session
    ) -> TopicConfig:
        """One topic of a CreateTopics request on a cluster: placed by the controller's rules,
        or as its replica assignment says (then num_partitions and replication_factor must be
        -1, as Kafka requires; the assignment is checked: INVALID_REPLICA_ASSIGNMENT)."""
        assignment: dict[int, list[int]] | None = None
        if t.assignments:
            if t.num_partitions != -1 or t.replication_factor != -1:
                raise KafkaError(ErrorCode.invalid_request,
                                 "give a replica assignment or num_partitions and "
                                 "replication_factor, not both")  # fmt: skip
            assignment = {}
            for a in t.assignments:
                if a.partition_index in assignment:
                    raise InvalidReplicaAssignmentError(
                        f"partition {a.partition_index} is assigned twice"
                    )
                assignment[a.partition_index] = list(a.broker_ids)
            checked_assignment(assignment, self.cluster.brokers() if self.cluster else ())
        if t.num_partitions == 0 or t.num_partitions < -1:
            raise KafkaError(ErrorCode.invalid_partitions, "partitions must be >= 1")
        validate_name(t.name)
        if t.name.startswith("__"):
            raise KafkaError(ErrorCode.invalid_topic_exception, f"{t.name!r} is internal")
        configs = {c.name: c.value for c in t.configs}
        settings = dict(topic_setting(k, v) for k, v in configs.items())
        count = self.default_partitions if t.num_partitions == -1 else t.num_partitions
        if assignment is not None:
            count = len(assignment)
        cfg = self.store.new_topic_config(count, **settings)
        assert self.cluster is not None
        if self.cluster.has_topic(t.name):
            raise TopicExistsError(f"topic {t.name!r} already exists")
        if validate_only:
            with creation_errors():
                self.log.check_limits(t.name, count)
        else:
            self._create_in_cluster(t.name, count, t.replication_factor, configs, session,
                                    assignment=assignment)  # fmt: skip
        return cfg

    def _replication_factor(self, topic: str) -> int:
        if self.cluster is None:
            return 1
        try:
            parts = self.cluster.partitions(topic)
        except MQCoreError:
            return -1
        return len(next(iter(parts.values())).replicas) if parts else -1

    # -- producing ------------------------------------------------------------------------------

    def init_producer_id(self, found: Api, body: Any, session: Session) -> Any:
        if body.transactional_id is not None:
            return self.txn_apis.init_producer_id(found, body, session)
        pid = getattr(body, "producer_id", -1)
        epoch = getattr(body, "producer_epoch", -1)
        try:
            if pid >= 0 and 0 <= epoch < MAX_EPOCH:
                # KIP-360: a producer bumps its epoch to reset its sequences after an error
                epoch += 1
                self.log.register_producer(pid, epoch)
            else:
                epoch = 0
                # a cluster's IDs come in blocks from the coordinator: unique across brokers
                fresh = None if self.cluster is None else self.cluster.next_producer_id()
                pid = self.log.register_producer(fresh, 0)
            code = ErrorCode.none
        except CoordinatorError:  # no ID block while ZooKeeper is away: the client retries
            pid, epoch, code = -1, -1, ErrorCode.coordinator_load_in_progress
        except MQCoreError as e:
            pid, epoch, code = -1, -1, error_code(e)
        return build(
            found.response, throttle_time=NO_TIME, error_code=code, producer_id=pid,
            producer_epoch=epoch,
        )  # fmt: skip

    def produce(self, found: Api, body: Any, session: Session) -> ProduceAnswer | Delayed | None:
        """Append each partition's batch; None for acks=0 (no response; the connection closes
        on an error, so the client learns of it, as Kafka's broker does)."""
        failed = False
        answer = ProduceAnswer([])
        waits: list[tuple[ProducedPartition, str, int, int]] = []  # acks=all on a cluster
        for t in body.topic_data:
            topic = ProducedTopic(t.name, [])
            answer.topics.append(topic)
            for p in t.partition_data:
                got = ProducedPartition(p.index)
                topic.partitions.append(got)
                try:
                    transactional = body.transactional_id is not None
                    if body.acks not in (0, 1, -1):
                        raise KafkaError(ErrorCode.invalid_required_acks, f"acks={body.acks}")
                    if transactional:  # Kafka's write on the transactional ID first
                        self.access(session).check_transactional_id(WRITE, body.transactional_id)
                    self.authorize(session, WRITE, t.name)
                    if p.records is None:
                        raise InvalidRecordError("a produce request without records")
                    records = p.records
                    if getattr(body, "message_sets", False):  # Produce v0-v2: magic 0 or 1
                        records = up_convert(records, self.log.clock())
                    if transactional:  # KIP-890: only a partition of its open transaction
                        self.txn_apis.verify_produce(body.transactional_id, records, t.name,
                                                     p.index)  # fmt: skip
                    if self.cluster is not None:
                        info = self.cluster.append(t.name, p.index, records, body.acks,
                                                   transactional=transactional)  # fmt: skip
                        if body.acks == -1:
                            waits.append((got, t.name, p.index, info.last_offset))
                    else:
                        info = self.log.replica(t.name, p.index).append_as_leader(
                            records, LEADER_EPOCH, transactional=transactional
                        )
                    got.base_offset, got.log_start_offset = info.first_offset, info.log_start_offset
                    got.log_append_time_ms = info.log_append_time
                except MQCoreError as e:
                    got.error_code, got.error_message = int(error_code(e)), str(e)
                    if isinstance(e, MissingKeyError):  # Kafka names each keyless record
                        got.record_errors = tuple((i, KEYLESS) for i in e.indexes)
                    failed = True
        if body.acks == 0:
            if failed:
                raise CloseConnection("a produce with acks=0 failed")
            return None
        if waits:
            return self._await_replicas(answer, waits, body.timeout_ms / 1000)
        return answer

    def _await_replicas(
        self,
        answer: ProduceAnswer,
        waits: list[tuple[ProducedPartition, str, int, int]],
        timeout: float,
    ) -> ProduceAnswer | Delayed:
        """acks=all on a cluster: the answer once every in-sync replica has each partition's
        batch (the high watermark passed it), REQUEST_TIMED_OUT for those still short at the
        request's timeout, the leader's refusal (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS_
        AFTER_APPEND) for those it gave up on (Kafka's DelayedProduce)."""
        cluster = self.cluster
        assert cluster is not None
        pending = list(waits)

        def poll(final: bool) -> Any:
            still = []
            for w in pending:
                got, topic, partition, last = w
                try:
                    if not cluster.committed(topic, partition, last):
                        if final:
                            raise KafkaError(
                                ErrorCode.request_timed_out,
                                f"{topic}-{partition}: not replicated in time",
                            )
                        still.append(w)
                except MQCoreError as e:
                    got.error_code, got.error_message = int(error_code(e)), str(e)
            pending[:] = still
            return NOT_YET if still else answer

        done = poll(False)
        if done is not NOT_YET:
            return answer
        deadline = time.monotonic() + timeout
        keys = [(topic, partition) for _, topic, partition, _ in waits]
        return Delayed(poll, lambda: self._wait_blocking(poll, deadline), deadline=deadline,
                       keys=keys)  # fmt: skip

    # -- fetching -------------------------------------------------------------------------------

    def fetch(self, found: Api, body: Any, session: Session) -> FetchAnswer | Delayed:
        """Whole stored batches from each partition's fetch offset; short of min_bytes, a
        Delayed that answers when appends to those partitions bring them, or at max_wait. The
        records stay file regions until the connection sends them (server/fetchwire.py)."""
        deadline = time.monotonic() + body.max_wait.total_seconds()
        answer = self._fetch_once(body, session)
        if answer.size >= body.min_bytes or deadline <= time.monotonic() or self.closed:
            return answer
        answer.close()

        def poll(final: bool) -> Any:
            got = self._fetch_once(body, session)
            if got.size >= body.min_bytes or final or self.closed:
                return got
            got.close()
            return NOT_YET

        keys = [(t.topic, p.partition) for t in body.topics for p in t.partitions]
        return Delayed(poll, lambda: self._fetch_waiting(body, session, deadline),
                       deadline=deadline, keys=keys)  # fmt: skip

    def _fetch_waiting(self, body: Any, session: Session, deadline: float) -> FetchAnswer:
        """A fetch waited for in this thread: polled at each append until min_bytes or the
        deadline."""
        while True:
            generation = self._generation
            answer = self._fetch_once(body, session)
            wait = deadline - time.monotonic()
            if answer.size >= body.min_bytes or wait <= 0 or self.closed:
                return answer
            answer.close()
            with self._appended:
                if self._generation == generation and not self.closed:
                    self._appended.wait(wait)

    def _fetch_once(self, body: Any, session: Session) -> FetchAnswer:
        budget = getattr(body, "max_bytes", 0x7FFFFFFF)
        committed = getattr(body, "isolation_level", 0) == 1
        answer = FetchAnswer([])
        for t in body.topics:
            topic = FetchedTopic(t.topic)
            answer.topics.append(topic)
            for p in t.partitions:
                got = FetchedPartition(p.partition, 0, -1, -1, -1)
                got.fetch_offset, got.max_bytes = p.fetch_offset, p.partition_max_bytes
                try:
                    # v4+: isolation_level 1 is read_committed (to the last stable offset,
                    # with the aborted transactions for the consumer to skip)
                    isolation: Isolation = "log_stable" if committed else "log_end"
                    if self.cluster is not None:
                        handle, isolation = self._cluster_fetch_log(body, t.topic, p, session)
                    else:
                        self.authorize(session, READ, t.topic)
                        handle = self.log.replica(t.topic, p.partition)
                    # the response stays within max_bytes (fetch.max.bytes) and each partition
                    # within its own bound; KIP-74: only the first batch of the first partition
                    # with records comes whole past them, so a consumer is never stuck behind
                    # one large batch (librdkafka drops a response larger than it asked for)
                    limit = max(min(p.partition_max_bytes, budget - answer.size), 0)
                    read = handle.read(p.fetch_offset, limit, isolation, min_one=not answer.size)
                    got.records = read.region if read.region is not None else read.data
                    if self.cluster is None:
                        got.high_watermark = read.log_end_offset
                        stable = self.store.last_stable_offset(t.topic, p.partition)
                        got.last_stable_offset = min(read.log_end_offset, stable)
                    else:
                        got.high_watermark = handle.high_watermark
                        got.last_stable_offset = handle.last_stable_offset
                    if committed:
                        got.aborted = [(a.producer_id, a.first_offset) for a in read.aborted]
                    got.log_start_offset = read.log_start_offset
                except MQCoreError as e:
                    got.error_code = int(error_code(e))
                    if isinstance(e, OffsetOutOfRangeError) and self.cluster is not None:
                        handle = self.log.replica(t.topic, p.partition)
                        got.high_watermark = got.last_stable_offset = handle.high_watermark
                        got.log_start_offset = handle.log_start_offset
                    elif isinstance(e, OffsetOutOfRangeError):
                        end = self.store.end_offset(t.topic, p.partition)
                        got.high_watermark = got.last_stable_offset = end
                        got.log_start_offset = self.store.start_offset(t.topic, p.partition)
                topic.partitions.append(got)
                answer.size += got.size
        return answer

    def _cluster_fetch_log(
        self, body: Any, topic: str, p: Any, session: Session
    ) -> tuple[ReplicaLog, Isolation]:
        """The log a fetch reads on a cluster and how far: a follower's (replica_id >= 0,
        which needs CLUSTER_ACTION) to the log end, after telling the leader where it is; a
        consumer's to the high watermark, from the leader only, fenced by its epoch."""
        assert self.cluster is not None
        replica = getattr(body, "replica_id", -1)
        current = getattr(p, "current_leader_epoch", -1)  # v9+
        if replica >= 0:
            self._check_cluster_action(session)
            start = getattr(p, "log_start_offset", -1)  # v5+: the follower's log start
            handle = self.cluster.follower_fetch(replica, topic, p.partition, p.fetch_offset,
                                                 current, start)  # fmt: skip
            return handle, "log_end"
        self.authorize(session, READ, topic)
        committed = getattr(body, "isolation_level", 0) == 1
        handle = self.cluster.leader_log(topic, p.partition, current)
        return handle, "committed" if committed else "high_watermark"

    def _check_cluster_action(self, session: Session) -> None:
        """A replica's request (Fetch, OffsetForLeaderEpoch) needs Kafka's CLUSTER_ACTION,
        which no ACL line grants: with ACLs on, replication is refused (docs/cluster.md)."""
        if not self.access(session).kafka_operations(CLUSTER):
            raise KafkaError(ErrorCode.cluster_authorization_failed,
                             "a replica's request needs CLUSTER_ACTION")  # fmt: skip

    def list_offsets(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        # v2+: a read_committed consumer's latest offset is the last stable offset (Kafka)
        committed = getattr(body, "isolation_level", 0) == 1
        topics = []
        for t in body.topics:
            out = []
            for p in t.partitions:
                code, ts, offset, epoch = ErrorCode.none, -1, -1, -1
                try:
                    self.authorize(session, READ, t.name)
                    if self.cluster is not None:  # the leader answers, fenced by the epoch
                        current = getattr(p, "current_leader_epoch", -1)
                        handle = self.cluster.leader_log(t.name, p.partition_index, current)
                        epoch = self.cluster.leader_epoch(t.name, p.partition_index)
                        end = handle.last_stable_offset if committed else handle.high_watermark
                        if p.timestamp == LATEST:  # what a consumer may read: to the HW/LSO
                            ts, offset = -1, end
                        else:
                            ts, offset = self._offset_for(t.name, p.partition_index, p.timestamp)
                            if offset >= end:
                                ts, offset = -1, -1
                    elif committed and p.timestamp == LATEST:
                        ts, offset = -1, self.store.last_stable_offset(t.name, p.partition_index)
                    else:
                        ts, offset = self._offset_for(t.name, p.partition_index, p.timestamp)
                except MQCoreError as e:
                    code = error_code(e)
                out.append(
                    build(
                        m.ListOffsetsPartitionResponse,
                        partition_index=p.partition_index,
                        error_code=code,
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=epoch,
                    )  # fmt: skip
                )
            topics.append(build(m.ListOffsetsTopicResponse, name=t.name, partitions=tuple(out)))
        return build(found.response, throttle_time=NO_TIME, topics=tuple(topics))

    def offset_for_leader_epoch(self, found: Api, body: Any, session: Session) -> Any:
        """Where each asked leader epoch ends in a partition's log (ReplicaLog's epoch cache,
        Kafka's rules): what a follower asks before it truncates (KIP-101, KIP-279) and a
        consumer asks to find a truncated log (KIP-320). This node leads every partition at
        LEADER_EPOCH: a current_leader_epoch below it is FENCED_LEADER_EPOCH, above it
        UNKNOWN_LEADER_EPOCH (-1: no check). A replica's request (replica_id >= 0) needs
        Kafka's CLUSTER_ACTION, which no ACL line grants; a consumer's, describe on the
        topic."""
        m = found.module
        replica = getattr(body, "replica_id", -1)  # v3+; -1 (consumer) or -2 (debug) before
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                code, epoch, end = ErrorCode.none, -1, -1
                try:
                    if replica >= 0:
                        self._check_cluster_action(session)
                    else:
                        self.authorize(session, DESCRIBE, t.topic)
                    current = getattr(p, "current_leader_epoch", -1)  # v2+
                    if self.cluster is not None:  # fenced by the partition's leader epoch
                        epoch, end = self.cluster.end_offset_for_epoch(
                            t.topic, p.partition, p.leader_epoch, current
                        )
                    else:
                        if 0 <= current < LEADER_EPOCH:
                            raise KafkaError(ErrorCode.fenced_leader_epoch, f"epoch {current}")
                        if current > LEADER_EPOCH:
                            raise KafkaError(ErrorCode.unknown_leader_epoch, f"epoch {current}")
                        epoch, end = self.log.replica(t.topic, p.partition).end_offset_for_epoch(
                            p.leader_epoch
                        )
                except MQCoreError as e:
                    code = error_code(e)
                parts.append(build(m.EpochEndOffset, error_code=code, partition=p.partition,
                                   leader_epoch=epoch, end_offset=end))  # fmt: skip
            topics.append(build(m.OffsetForLeaderTopicResult, topic=t.topic,
                                partitions=tuple(parts)))  # fmt: skip
        return build(found.response, throttle_time=NO_TIME, topics=tuple(topics))

    def _offset_for(self, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) ListOffsets answers: the log start or end for EARLIEST or
        LATEST (timestamp -1); for MAX_TIMESTAMP the first message with the partition's largest
        timestamp; else the first message with a timestamp >= `timestamp`; (-1, -1) when no
        message is."""
        if timestamp == EARLIEST:
            return -1, self.store.start_offset(topic, partition)
        if timestamp == LATEST:
            return -1, self.store.end_offset(topic, partition)
        if timestamp == MAX_TIMESTAMP:  # KIP-734: the (first) message with the largest one
            timestamp = self.log.partition(topic, partition).max_timestamp()
            if timestamp < 0:
                return -1, -1
        elif timestamp < 0:
            raise KafkaError(ErrorCode.invalid_request, f"ListOffsets timestamp {timestamp}")
        offset = self.store.offset_for_time(topic, partition, timestamp)
        if offset is None:
            return -1, -1
        m = self.store.get(topic, partition, offset)
        return (m.timestamp if m is not None else -1), offset


def _thread_per_call(fn: Callable[[], None]) -> None:
    """The purgatory's executor for a Broker without a server: each check on a thread."""
    threading.Thread(target=fn, name="mqcore-delayed", daemon=True).start()
