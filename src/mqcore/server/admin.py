"""The admin APIs of `mqcore serve` that read and change topics as a whole: DescribeConfigs,
IncrementalAlterConfigs, DescribeCluster, DeleteRecords, DeleteTopics and CreatePartitions
(what an AdminClient's describe_configs, incremental_alter_configs, describe_cluster,
delete_records, delete_topics and create_partitions send).

Topic settings are TopicConfig's fields under Kafka's config names (config.KAFKA_CONFIG_NAMES);
a setting mqcore fixes at creation is described read-only and refused by alter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from mqcore.cluster.assign import checked_assignment
from mqcore.config import (
    FIXED_AT_CREATION,
    LIST_SETTINGS,
    TopicConfig,
    config_field,
    kafka_config_name,
    setting_text,
    split_list,
    topic_setting,
    validate_name,
)
from mqcore.errors import (
    InvalidConfigError,
    InvalidReplicaAssignmentError,
    MQCoreError,
    PartitionLimitError,
    TopicExistsError,
    UnknownTopicError,
)
from mqcore.log.internal import refuse_internal
from mqcore.server.auth import CLUSTER, CREATE, DESCRIBE, NOT_ASKED
from mqcore.server.common import (
    NO_TIME,
    KafkaError,
    Session,
    error_code,
    topic_id,
)
from mqcore.server.protocol import Api, build
from mqcore.server.quota import QuotaExceeded

if TYPE_CHECKING:
    from mqcore.server.broker import Broker

TOPIC, BROKER = 2, 4  # Kafka's ConfigResource types
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs operations
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5  # DescribeConfigs config_source
# DescribeConfigs config_type (v3+): BOOLEAN, STRING, LONG, DOUBLE; LIST for LIST_SETTINGS
_TYPES = {"bool": 1, "str": 2, "int": 5, "float": 6}
LIST_TYPE = 7
_DEFAULTS = TopicConfig()


@contextlib.contextmanager
def creation_errors() -> Iterator[None]:
    """Kafka's code for a creation that failed on a file (EMFILE, ENOSPC), nothing of it
    kept: KAFKA_STORAGE_ERROR. (A partition limit's PartitionLimitError is POLICY_VIOLATION
    through common.error_code, what Kafka's controller answers past its bounds.)"""
    try:
        yield
    except OSError as e:
        raise KafkaError(ErrorCode.kafka_storage_error, f"creating partitions failed: {e}") from e


def create_topic(
    broker: Broker, name: str, partitions: int, settings: dict[str, Any], session: Session
) -> TopicConfig:
    """Create a topic for a client (CreateTopics, Metadata's auto-creation): admitted by the
    principal's mutation quota (server/quota.py), bounded by the store's partition limits."""
    quota = broker.quota
    quota.admit(session.principal)
    with creation_errors():
        broker.store.create_topic(name, partitions, **settings)
    quota.record(session.principal, partitions)
    return broker.store.topic_config(name)


def create_requested(broker: Broker, t: Any, validate_only: bool, session: Session) -> TopicConfig:
    """One topic of a CreateTopics request (`t`), checked as Kafka checks it and created (or
    only checked and bounded, for validate_only); its settings."""
    count = requested_count(broker, t)
    settings = dict(topic_setting(c.name, c.value) for c in t.configs)
    validate_name(t.name)
    if broker.log.has_topic(t.name):
        raise TopicExistsError(f"topic {t.name!r} already exists")
    if not validate_only:
        return create_topic(broker, t.name, count, settings, session)
    cfg = broker.store.new_topic_config(count, **settings)
    with creation_errors():
        broker.log.check_limits(t.name, count)
    return cfg


def requested_count(broker: Broker, t: Any) -> int:
    """The partitions a CreateTopics topic asks for, checked as Kafka's controller checks it:
    a replica assignment (num_partitions and replication_factor -1 then, INVALID_REQUEST
    otherwise) gives one partition per entry, its partition indexes 0..n-1; else the count
    (-1: the server's default) with replication factor 1 or -1."""
    if t.assignments:
        if t.replication_factor != -1 or t.num_partitions != -1:
            raise KafkaError(
                ErrorCode.invalid_request,
                "a replica assignment was given: num_partitions and replication_factor must be -1",
            )
        indexes = [a.partition_index for a in t.assignments]
        if sorted(indexes) != list(range(len(indexes))):
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"assigned partitions {sorted(indexes)}: each of 0..n-1 exactly once",
            )
        check_assignments(broker.node_id, [a.broker_ids for a in t.assignments])
        return len(indexes)
    if t.replication_factor not in (-1, 1):
        raise KafkaError(
            ErrorCode.invalid_replication_factor,
            f"replication factor {t.replication_factor}: a single node keeps 1",
        )
    if t.num_partitions == 0 or t.num_partitions < -1:
        raise KafkaError(ErrorCode.invalid_partitions, "partitions must be >= 1")
    return broker.default_partitions if t.num_partitions == -1 else t.num_partitions


def check_assignments(node_id: int, replicas: Sequence[Sequence[int]]) -> None:
    """INVALID_REPLICA_ASSIGNMENT unless each partition's replicas are exactly this node (the
    only broker of a single-node cluster: Kafka refuses an empty list, a broker named twice
    and a broker that is not registered)."""
    for brokers in replicas:
        if list(brokers) != [node_id]:
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"replicas {list(brokers)}: this cluster is one broker, node {node_id}, so "
                f"each partition's replicas are [{node_id}]",
            )


def throttle_time(ms: int) -> datetime.timedelta:
    """A response's throttle_time: how long the client waits before it retries (KIP-599)."""
    return datetime.timedelta(milliseconds=ms)


def request_limit(broker: Broker, topics: Sequence[Any]) -> PartitionLimitError | None:
    """The refusal (POLICY_VIOLATION) for every topic of a CreateTopics asking for more
    partitions in all than max_partitions_per_request (Kafka's controller refuses such a
    request whole)."""
    asked = sum(
        len(t.assignments) or max(t.num_partitions, 0) or broker.default_partitions for t in topics
    )
    try:
        broker.store.log.limits.check_request(asked)
    except PartitionLimitError as e:
        return e
    return None


def cluster_operations(broker: Broker, body: Any, session: Session) -> int:
    """DescribeCluster's cluster_authorized_operations: the principal's, when asked."""
    if not body.include_cluster_authorized_operations:
        return NOT_ASKED
    return broker.access(session).kafka_operations(CLUSTER)


def config_type(f: dataclasses.Field[Any]) -> int:
    """DescribeConfigs' config_type of a TopicConfig field (a list setting is Kafka's LIST)."""
    return LIST_TYPE if f.name in LIST_SETTINGS else _TYPES.get(str(f.type), 0)


class AdminApis:
    """The handlers, over the Broker's store."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = broker.store

    def describe_configs(self, found: Api, body: Any, session: Session) -> Any:
        m = found.module
        results = []
        for r in body.resources:
            code, message, configs = ErrorCode.none, None, ()
            try:
                if r.resource_type == TOPIC:
                    self.broker.authorize(session, DESCRIBE, r.resource_name)
                    configs = self._topic_configs(m, r.resource_name, r.configuration_keys)
                elif r.resource_type != BROKER:  # a broker has no settings to show
                    raise KafkaError(ErrorCode.invalid_request, f"resource type {r.resource_type}")
            except MQCoreError as e:
                code, message = error_code(e), str(e)
            results.append(
                build(
                    m.DescribeConfigsResult,
                    error_code=code,
                    error_message=message,
                    resource_type=r.resource_type,
                    resource_name=r.resource_name,
                    configs=configs,
                )  # fmt: skip
            )
        return build(found.response, throttle_time=NO_TIME, results=tuple(results))

    def _topic_configs(self, m: Any, topic: str, keys: tuple[str, ...] | None) -> tuple[Any, ...]:
        cluster = self.broker.cluster
        if cluster is not None:  # as the cluster has them, whether a replica is here or not
            cfg = cluster.topic_config(topic)
        elif topic not in self.store.topics():
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        else:
            cfg = self.store.topic_config(topic)
        out = []
        for f in dataclasses.fields(TopicConfig):
            if f.name == "partitions":
                continue
            name = kafka_config_name(f.name)
            if keys is not None and name not in keys:
                continue
            value = getattr(cfg, f.name)
            default = getattr(_DEFAULTS, f.name)
            out.append(
                build(
                    m.DescribeConfigsResourceResult,
                    name=name,
                    value=setting_text(value),
                    read_only=f.name in FIXED_AT_CREATION,
                    is_default=value == default,
                    config_source=DEFAULT_CONFIG if value == default else DYNAMIC_TOPIC_CONFIG,
                    is_sensitive=False,
                    synonyms=(),
                    config_type=config_type(f),
                    documentation=None,
                )  # fmt: skip
            )
        return tuple(out)

    def incremental_alter_configs(self, found: Api, body: Any, session: Session) -> Any:
        return self._alter_configs(found, body, session, self._changes)

    def alter_configs(self, found: Api, body: Any, session: Session) -> Any:
        """AlterConfigs, the form IncrementalAlterConfigs replaced (kafka-python's
        alter_configs, librdkafka's AlterConfigs): the configs given are the topic's whole
        set, so every other setting that can change goes back to its default, as Kafka
        replaces a topic's overrides."""
        return self._alter_configs(found, body, session, self._replacement)

    def _alter_configs(
        self,
        found: Api,
        body: Any,
        session: Session,
        changes_of: Callable[[Any, TopicConfig], dict[str, Any]],
    ) -> Any:
        """Both alter APIs: each resource's configs turned into changes by `changes_of`
        (given the topic's settings as they are when written), checked, and applied or, with
        validate_only, only checked; a resource's answer names what was wrong."""
        m = found.module
        out = []
        for r in body.resources:
            code, message = ErrorCode.none, None
            try:
                if r.resource_type != TOPIC:
                    raise KafkaError(
                        ErrorCode.invalid_request, "only topic settings can be changed"
                    )
                # changing a topic's settings is managing it, as creating it is
                self.broker.authorize(session, CREATE, r.resource_name)
                names = [c.name for c in r.configs]
                if len(set(names)) < len(names):  # Kafka refuses the resource whole
                    raise KafkaError(ErrorCode.invalid_request, f"a config named twice: {names}")
                cluster = self.broker.cluster
                if cluster is not None:  # the cluster's overrides; each replica applies them
                    cluster.update_topic_config(
                        r.resource_name, functools.partial(changes_of, r.configs),
                        validate_only=body.validate_only,
                    )  # fmt: skip
                elif body.validate_only:
                    current = self.store.topic_config(r.resource_name)
                    changes = changes_of(r.configs, current)
                    current.changes_allowed(changes)
                    dataclasses.replace(current, **changes)  # validates the values
                else:  # computed from the settings as they are when written (APPEND)
                    self.store.update_topic_config(
                        r.resource_name, functools.partial(changes_of, r.configs)
                    )
            except MQCoreError as e:
                code, message = error_code(e), str(e)
            except TypeError as e:  # a value of the wrong type for its field
                code, message = ErrorCode.invalid_config, str(e)
            out.append(
                build(
                    m.AlterConfigsResourceResponse,
                    error_code=code,
                    error_message=message,
                    resource_type=r.resource_type,
                    resource_name=r.resource_name,
                )  # fmt: skip
            )
        return build(found.response, throttle_time=NO_TIME, responses=tuple(out))

    @staticmethod
    def _replacement(configs: Any, current: TopicConfig) -> dict[str, Any]:
        """AlterConfigs' changes: the settings given, every other changeable one at its
        default (a null value too). Those fixed at creation keep their value unless given:
        they have no default to go back to (the topic's files are sized by them)."""
        changes = {
            f.name: getattr(_DEFAULTS, f.name)
            for f in dataclasses.fields(TopicConfig)
            if f.name not in FIXED_AT_CREATION
        }
        for c in configs:
            if c.value is None:
                config_field(c.name)  # an unknown name is still INVALID_CONFIG
            else:
                field, value = topic_setting(c.name, c.value)
                changes[field] = value
        return changes

    def _changes(self, configs: Any, current: TopicConfig) -> dict[str, Any]:
        """The changes of one resource's operations, in order (an APPEND reads the ones
        before it)."""
        changes: dict[str, Any] = {}
        for c in configs:
            field, value = self._change(c, current, changes)
            changes[field] = value
        return changes

    @staticmethod
    def _change(c: Any, current: TopicConfig, changes: dict[str, Any]) -> tuple[str, Any]:
        """One operation of IncrementalAlterConfigs as (field, new value), `changes` holding
        those before it in the request. APPEND adds the items the list lacks, SUBTRACT takes
        out those it has (Kafka's ConfigAdminManager), on list settings only."""
        if c.config_operation == SET:
            return topic_setting(c.name, c.value)
        field = config_field(c.name)
        if c.config_operation == DELETE:  # back to the default
            return field, getattr(_DEFAULTS, field)
        if c.config_operation not in (APPEND, SUBTRACT):
            raise KafkaError(ErrorCode.invalid_request, f"config operation {c.config_operation}")
        if field not in LIST_SETTINGS:
            raise InvalidConfigError(f"{c.name} is not a list: APPEND and SUBTRACT apply to lists")
        items = split_list(str(changes.get(field, getattr(current, field))))
        given = split_list(c.value or "")
        if c.config_operation == APPEND:
            return field, ",".join(items + [v for v in given if v not in items])
        for v in given:
            if v in items:
                items.remove(v)
        return field, ",".join(items)

    def describe_cluster(self, found: Api, body: Any, session: Session) -> Any:
        b = self.broker
        brokers = tuple(
            build(found.module.DescribeClusterBroker, broker_id=n, host=h, port=p, rack=r)
            for n, h, p, r in b.live_brokers()
        )
        return build(
            found.response, throttle_time=NO_TIME, error_code=ErrorCode.none,
            error_message=None, endpoint_type=1, cluster_id=b.cluster_id,
            controller_id=b.controller_id(), brokers=brokers,
            cluster_authorized_operations=cluster_operations(b, body, session),
        )  # fmt: skip

    def delete_records(self, found: Api, body: Any, session: Session) -> Any:
        """Kafka's DeleteRecords: move each partition's log start up to the offset (-1: the
        high watermark), durably; whole segments below it are deleted. On a cluster the
        partition's leader moves its own (NOT_LEADER_OR_FOLLOWER elsewhere) and answers once
        every in-sync replica's log start is there too (REQUEST_TIMED_OUT after `timeout`):
        ReplicaManager.delete_records."""
        m = found.module
        topics = []
        for t in body.topics:
            out = []
            for p in t.partitions:
                code, low = ErrorCode.none, -1
                try:
                    self.broker.authorize(session, CREATE, t.name)  # managing the topic
                    cluster = self.broker.cluster
                    if cluster is None:
                        handle = self.store.log.replica(t.name, p.partition_index)
                        end = handle.update_high_watermark(handle.log_end_offset)  # one node
                        low = handle.delete_records_before(end if p.offset == -1 else p.offset)
                    else:  # the leader's, then its in-sync replicas' (within the timeout)
                        low = cluster.delete_records(
                            t.name, p.partition_index, p.offset,
                            timeout=max(body.timeout.total_seconds(), 0.0),
                        )  # fmt: skip
                except MQCoreError as e:
                    code = error_code(e)
                out.append(
                    build(
                        m.DeleteRecordsPartitionResult,
                        partition_index=p.partition_index,
                        low_watermark=low,
                        error_code=code,
                    )  # fmt: skip
                )
            topics.append(build(m.DeleteRecordsTopicResult, name=t.name, partitions=tuple(out)))
        return build(found.response, throttle_time=NO_TIME, topics=tuple(topics))

    def delete_topics(self, found: Api, body: Any, session: Session) -> Any:
        """Kafka's DeleteTopics: each topic deleted, durably, when the response is sent (on a
        node of one there is no replica to wait for, so `timeout` is not needed; on a
        cluster's broker the deletion waits for every replica's broker within it, else
        REQUEST_TIMED_OUT while it goes on). v6 may name a topic by its ID (the one Metadata
        gives: common.topic_id); an ID of no topic is UNKNOWN_TOPIC_ID."""
        m = found.module
        cluster = self.broker.cluster
        if hasattr(body, "topic_names"):  # v1-v5: names only
            wanted = [(name, None) for name in body.topic_names]
        else:
            names = cluster.topics() if cluster is not None else self.store.topics()
            by_id = {topic_id(n): n for n in names}
            wanted = [(t.name or by_id.get(t.topic_id), t.topic_id) for t in body.topics]
        seen = Counter(name for name, _ in wanted if name is not None)
        results: list[tuple[str | None, Any, Any, str | None]] = []
        marked: list[str] = []  # on a cluster: every topic marked first, then one wait
        for name, asked_id in wanted:
            code, message = ErrorCode.none, None
            try:
                if name is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"no topic has ID {asked_id}")
                if seen[name] > 1:
                    raise KafkaError(ErrorCode.invalid_request, f"topic {name!r} named twice")
                self.broker.authorize(session, CREATE, name)  # managing the topic
                if cluster is None:
                    self.store.delete_topic(name)
                else:  # every replica, through the controller (docs/cluster.md)
                    refuse_internal(name, "delete")
                    cluster.mark_for_deletion(name)
                    marked.append(name)
            except MQCoreError as e:
                code, message = error_code(e), str(e)
            results.append((name, asked_id, code, message))
        if marked:
            assert cluster is not None
            left = set(cluster.await_deleted(marked, max(body.timeout.total_seconds(), 0.0)))
            why = ("marked for deletion, but not every broker holding one of its replicas "
                   "deleted them in time (one that is down holds the deletion until it "
                   "returns)")  # fmt: skip
            results = [(n, i, ErrorCode.request_timed_out, why) if n in left else (n, i, c, w)
                       for n, i, c, w in results]  # fmt: skip
        out = [
            build(
                m.DeletableTopicResult,
                name=name,
                topic_id=asked_id if name is None else topic_id(name),
                error_code=code,
                error_message=message,
            )  # fmt: skip
            for name, asked_id, code, message in results
        ]
        return build(found.response, throttle_time=NO_TIME, responses=tuple(out))

    def create_partitions(self, found: Api, body: Any, session: Session) -> Any:
        """Kafka's CreatePartitions: grow each topic to `count` partitions (validate_only:
        check only); replica assignments, one per new partition, may name only this node."""
        m = found.module
        seen = Counter(t.name for t in body.topics)
        out = []
        throttle = 0
        for t in body.topics:
            code, message = ErrorCode.none, None
            try:
                if seen[t.name] > 1:
                    raise KafkaError(ErrorCode.invalid_request, f"topic {t.name!r} named twice")
                self.broker.authorize(session, CREATE, t.name)  # managing the topic
                if self.broker.cluster is not None:
                    self._add_partitions_in_cluster(t, body.validate_only, session)
                else:
                    self._add_partitions(t, body.validate_only, session)
            except MQCoreError as e:
                code, message = error_code(e), str(e)
                if isinstance(e, QuotaExceeded):
                    throttle = max(throttle, e.throttle_ms)
            out.append(
                build(
                    m.CreatePartitionsTopicResult,
                    name=t.name,
                    error_code=code,
                    error_message=message,
                )  # fmt: skip
            )
        return build(found.response, throttle_time=throttle_time(throttle), results=tuple(out))

    def _add_partitions_in_cluster(self, t: Any, validate_only: bool, session: Session) -> None:
        """CreatePartitions on a cluster: the new partitions placed by the controller's
        rules, or as the request's assignments say (one replica list per new partition,
        checked against the registered brokers and the topic's replication factor:
        INVALID_REPLICA_ASSIGNMENT), metered by the mutation quota."""
        cluster = self.broker.cluster
        assert cluster is not None
        given = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
        cluster.refuse_marked(t.name, "add partitions to")  # INVALID_TOPIC_EXCEPTION, as Kafka
        before = len(cluster.partitions(t.name))
        if t.count <= before:
            why = f"topic {t.name!r} has {before} partitions, {t.count} asked"
            raise KafkaError(ErrorCode.invalid_partitions, why)
        if given is not None:
            factor = len(next(iter(cluster.partitions(t.name).values())).replicas)
            added = dict(enumerate(given, start=before))
            if len(given) != t.count - before:
                raise InvalidReplicaAssignmentError(
                    f"{len(given)} replica lists for {t.count - before} new partitions"
                )
            checked_assignment(added, cluster.brokers(), before, factor)
        with creation_errors():
            self.store.log.check_limits(t.name, t.count)
        if validate_only:
            return
        self.broker.quota.admit(session.principal)
        cluster.add_partitions(t.name, t.count, assignment=given)
        self.broker.quota.record(session.principal, t.count - before)

    def _add_partitions(self, t: Any, validate_only: bool, session: Session) -> None:
        """Grow topic `t.name` to `t.count` partitions, metered and bounded as a creation
        (create_topic); an assignment needs one entry per new partition, each this node."""
        topic, count = t.name, t.count
        quota = self.broker.quota
        if not validate_only:
            quota.admit(session.principal)
        before = self.store.partitions(topic)
        if t.assignments is not None and count > before:  # a count too low: INVALID_PARTITIONS
            if len(t.assignments) != count - before:
                raise KafkaError(
                    ErrorCode.invalid_replica_assignment,
                    f"{count - before} partitions to add, {len(t.assignments)} assignments",
                )
            check_assignments(self.broker.node_id, [a.broker_ids for a in t.assignments])
        try:
            with creation_errors():
                self.store.add_partitions(topic, count, validate_only=validate_only)
        except PartitionLimitError:
            raise  # a bound: POLICY_VIOLATION (common.error_code)
        except InvalidConfigError as e:  # the count: Kafka's code for it
            raise KafkaError(ErrorCode.invalid_partitions, str(e)) from None
        if not validate_only:
            quota.record(session.principal, count - before)
