"""What the request handlers of `mqcore serve` share: the connection's Session, Kafka's error
codes for mqcore's exceptions and topic IDs (Kafka's names for topic settings are
mqcore.config's)."""

from __future__ import annotations

import datetime
import functools
import uuid
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from mqcore.errors import (
    CodecError,
    CoordinatorError,
    CorruptRecordError,
    FencedLeaderEpochError,
    GroupAuthorizationError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidReplicaAssignmentError,
    InvalidTimestampError,
    InvalidTopicError,
    MQCoreError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionLimitError,
    ProducerFencedError,
    ReadOnlyStoreError,
    RecordTooLargeError,
    StoreClosedError,
    TopicAuthorizationError,
    TopicExistsError,
    TransactionalIdAuthorizationError,
    UnknownLeaderEpochError,
    UnknownPartitionError,
    UnknownTopicError,
)

NO_TIME = datetime.timedelta(0)
ZERO_UUID = uuid.UUID(int=0)
_TOPIC_IDS = uuid.uuid5(uuid.NAMESPACE_URL, "mqcore:topic")  # the namespace of topic_id


@functools.lru_cache(maxsize=65536)
def topic_id(name: str) -> uuid.UUID:
    """The ID Metadata gives topic `name` and KIP-848 assignments name it by: a UUID derived
    from the name (version 5), since the store keeps no topic IDs. Stable across restarts, as
    Kafka's are; unlike Kafka's, a topic deleted and made again under its name has the same ID
    (docs/server.md "One node")."""
    return uuid.uuid5(_TOPIC_IDS, name)


class KafkaError(MQCoreError):
    """A request refused with a Kafka error code that no other mqcore exception carries."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class CloseConnection(Exception):
    """The connection must close without a response (a failed produce with acks=0)."""


def error_code(e: BaseException) -> ErrorCode:
    """Kafka's error code for an mqcore exception (unknown_server_error for anything else)."""
    if isinstance(e, KafkaError):
        return e.code
    for kind, code in _CODES:
        if isinstance(e, kind):
            return code
    return ErrorCode.unknown_server_error


# most specific first: InvalidTimestampError is an InvalidRecordError, InternalTopicError an
# InvalidTopicError
_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (TopicAuthorizationError, ErrorCode.topic_authorization_failed),
    (GroupAuthorizationError, ErrorCode.group_authorization_failed),
    (TransactionalIdAuthorizationError, ErrorCode.transactional_id_authorization_failed),
    (UnknownTopicError, ErrorCode.unknown_topic_or_partition),
    (UnknownPartitionError, ErrorCode.unknown_topic_or_partition),
    (RecordTooLargeError, ErrorCode.message_too_large),
    (InvalidTimestampError, ErrorCode.invalid_timestamp),
    (CorruptRecordError, ErrorCode.corrupt_message),
    (CodecError, ErrorCode.corrupt_message),  # records that do not decompress
    (InvalidRecordError, ErrorCode.invalid_record),
    (OutOfOrderSequenceError, ErrorCode.out_of_order_sequence_number),
    (ProducerFencedError, ErrorCode.invalid_producer_epoch),
    (OffsetOutOfRangeError, ErrorCode.offset_out_of_range),
    (InvalidTopicError, ErrorCode.invalid_topic_exception),
    (TopicExistsError, ErrorCode.topic_already_exists),
    (PartitionLimitError, ErrorCode.policy_violation),  # Kafka's answer past its bounds
    (InvalidReplicaAssignmentError, ErrorCode.invalid_replica_assignment),
    (InvalidConfigError, ErrorCode.invalid_config),
    (ReadOnlyStoreError, ErrorCode.kafka_storage_error),
    (StoreClosedError, ErrorCode.kafka_storage_error),
    (NotLeaderOrFollowerError, ErrorCode.not_leader_or_follower),
    (CoordinatorError, ErrorCode.request_timed_out),  # ZooKeeper away: retriable
    (FencedLeaderEpochError, ErrorCode.fenced_leader_epoch),
    (UnknownLeaderEpochError, ErrorCode.unknown_leader_epoch),
    (NotEnoughReplicasAfterAppendError, ErrorCode.not_enough_replicas_after_append),
    (NotEnoughReplicasError, ErrorCode.not_enough_replicas),
)


@dataclass(slots=True)
class Session:
    """One connection as the handlers see it: who is on the other end. `principal` is
    "User:ANONYMOUS" until SASL authenticates someone."""

    peer: Any
    client_id: str | None = None
    principal: str = "User:ANONYMOUS"


def client_host(session: Any) -> str:
    """Kafka's client_host of a group member: "/" and the peer's address."""
    peer = getattr(session, "peer", None)
    if isinstance(peer, tuple) and peer:
        return f"/{peer[0]}"
    return ""
