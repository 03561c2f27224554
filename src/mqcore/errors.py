"""Every exception mqcore raises on purpose.

Pure Python so that both the kernels (`mqcore._ext`) and the layers above import it. Each error
names what was wrong (a topic, a file and position, a size against its limit) so a caller can act
on it without reading our code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqcore.query.engine import QueryResult

__all__ = [
    "MQCoreError",
    "StoreError",
    "StoreClosedError",
    "StoreLockedError",
    "NotAStoreError",
    "StoreChangedError",
    "ReadOnlyStoreError",
    "InvalidTopicError",
    "InternalTopicError",
    "UnknownTopicError",
    "TopicExistsError",
    "UnknownPartitionError",
    "InvalidConfigError",
    "PartitionLimitError",
    "RecordTooLargeError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "MissingKeyError",
    "OffsetOutOfRangeError",
    "CorruptRecordError",
    "CorruptIndexError",
    "UnsupportedCodecError",
    "CodecError",
    "SelectorSyntaxError",
    "InvalidMessageIdError",
    "MessageNotFoundError",
    "SegmentDamagedError",
    "InvalidGroupError",
    "GroupNotEmptyError",
    "UnknownGroupError",
    "ConsumerClosedError",
    "CommitFailedError",
    "GroupTypeError",
    "InvalidRecordStateError",
    "NoOffsetForPartitionError",
    "ProducerFencedError",
    "OutOfOrderSequenceError",
    "TransactionStateError",
    "ProducerClosedError",
    "ProtocolError",
    "AuthenticationError",
    "UnsupportedVersionError",
    "AuthorizationError",
    "TopicAuthorizationError",
    "GroupAuthorizationError",
    "TransactionalIdAuthorizationError",
    "CoordinatorError",
    "NodeIdTakenError",
    "StaleStateError",
    "NotControllerError",
    "QueryInterrupted",
    "ImplausibleTimeWarning",
]


class MQCoreError(Exception):
    """Base of every error mqcore raises on purpose."""


class StoreError(MQCoreError):
    """A store-level problem: the directory, its lock, its metadata."""


class StoreClosedError(StoreError):
    """The store (or the object read through it) was used after `close()`."""


class StoreLockedError(StoreError):
    """Another process holds the writer lock of the store directory.

    `path` is the store, `holder` who holds it ("pid 123"), for callers that word their own
    advice (the `mqcore` commands say what to do instead of the operation refused)."""

    def __init__(self, message: str, path: str | None = None, holder: str | None = None):
        super().__init__(message)
        self.path = path
        self.holder = holder


class NotAStoreError(StoreError):
    """The path is not a store: missing, not a directory, or a directory that holds neither
    mqcore's topic metadata nor a Kafka log directory's files. Reading commands, `read_only=True`
    and `create=False` raise it instead of creating anything."""


class StoreChangedError(StoreError):
    """A read-only store went back to a segment file that its writer has since replaced or
    removed (compaction, retention): reopen the store to read the log as it is now."""


class ReadOnlyStoreError(StoreError):
    """A write was attempted on a store opened with `read_only=True`."""


class InvalidConfigError(MQCoreError, ValueError):
    """A configuration value is out of its allowed range or of the wrong type."""


class InvalidReplicaAssignmentError(InvalidConfigError):
    """A replica assignment given for a topic's partitions names a broker the cluster does
    not have, a broker twice, or replication factors that differ (Kafka's
    INVALID_REPLICA_ASSIGNMENT)."""


class PartitionLimitError(InvalidConfigError):
    """A creation would pass a bound on partitions (per call, per topic or per store; the
    store options of docs/operations.md "Limits"); nothing was created. `limit` names the
    option, `bound` is its value."""

    def __init__(self, message: str, limit: str = "", bound: int = 0):
        super().__init__(message)
        self.limit = limit
        self.bound = bound


class InvalidTopicError(MQCoreError, ValueError):
    """A topic name breaks Kafka's rule: [a-zA-Z0-9._-], 1..249 characters, not '.' or '..'."""


class InternalTopicError(InvalidTopicError):
    """A topic whose name starts with `__` is internal: only mqcore writes it (Kafka refuses
    produce requests to its internal topics the same way)."""


class UnknownTopicError(MQCoreError, KeyError):
    """The topic does not exist (and the store was not opened with auto_create_topics=True)."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0]) if self.args else "unknown topic"


class TopicExistsError(MQCoreError, ValueError):
    """`create_topic` named a topic that already exists with a different partition count."""


class UnknownPartitionError(MQCoreError, ValueError):
    """The partition number is outside 0..partitions-1 of its topic."""


class RecordTooLargeError(MQCoreError, ValueError):
    """A record batch is larger than the topic's max_message_bytes; nothing was written.

    `size` and `limit` (bytes, when known) are the batch's size and that limit."""

    def __init__(self, message: str, size: int | None = None, limit: int | None = None):
        super().__init__(message)
        self.size = size
        self.limit = limit


class InvalidRecordError(MQCoreError, TypeError):
    """A key, value, header or timestamp handed to append is of the wrong type or range."""


class InvalidTimestampError(InvalidRecordError):
    """A CreateTime timestamp outside what the topic accepts (message_timestamp_after_max_ms
    ahead of the clock, message_timestamp_before_max_ms behind it): Kafka's INVALID_TIMESTAMP."""


class MissingKeyError(InvalidRecordError):
    """Records without a key for a compacted topic (cleanup_policy with compact), which
    compaction could only drop: Kafka refuses them (INVALID_RECORD), and so does mqcore;
    nothing of the append was written. `indexes` are the keyless records' positions in what
    was appended (over the wire: in the batch, Kafka's record_errors)."""

    def __init__(self, message: str, indexes: tuple[int, ...] = ()):
        super().__init__(message)
        self.indexes = indexes


class OffsetOutOfRangeError(MQCoreError, IndexError):
    """An offset is negative or outside [start_offset, end_offset] of its partition."""


class CorruptRecordError(MQCoreError):
    """Bytes on disk are not a valid record batch: bad length, magic, CRC or offsets.

    `path` and `position` name where; the store never skips such bytes silently.
    """

    def __init__(self, message: str, path: str | None = None, position: int | None = None):
        where = ""
        if path is not None:
            where = f" in {path}" + (f" at position {position}" if position is not None else "")
        super().__init__(message + where)
        self.path = path
        self.position = position


class CorruptIndexError(MQCoreError):
    """An index file is inconsistent with its segment (recovery rebuilds it)."""


class UnsupportedCodecError(MQCoreError, ValueError):
    """A compression codec name or attribute value that Kafka v2 does not define."""


class CodecError(MQCoreError):
    """A compressed payload could not be decompressed (corrupt or truncated stream)."""


class SelectorSyntaxError(MQCoreError, ValueError):
    """A SQL92 property selector does not parse; `column` (1-based) is where the mistake is."""

    def __init__(self, message: str, text: str = "", column: int = 1):
        shown = repr(text)
        if len(text) > 120:  # a long selector: the part around the mistake
            start = max(0, column - 41)
            shown = f"{text[start : start + 80]!r} (from column {start + 1} of {len(text):,})"
        super().__init__(f"{message} at column {column} of selector {shown}")
        self.text = text
        self.column = column


class InvalidMessageIdError(MQCoreError, ValueError):
    """A store ID (msg_id) or unique ID text that does not decode."""


class MessageNotFoundError(MQCoreError, LookupError):
    """No message at the offset asked for (the `mqcore get` command exits 1 with it)."""


class SegmentDamagedError(MQCoreError):
    """`mqcore dump` met damage in the file it dumps (listed in its output; exit status 1)."""


class InvalidGroupError(InvalidTopicError):
    """A consumer group name that breaks the topic-name rule (groups name internal topics)."""


class GroupNotEmptyError(InvalidGroupError):
    """The consumer group has members (`store.consumer()` members in this process, or Kafka
    clients of `mqcore serve`), which would overwrite what is asked with their next commit:
    deleting or altering its offsets waits until they leave, as Kafka's NON_EMPTY_GROUP. A
    subclass of InvalidGroupError, which `delete_group` raised for this before."""


class UnknownGroupError(MQCoreError, LookupError):
    """No consumer group of that name left a trace in the store (no committed offset, no retry
    or dead-letter topic)."""


class ConsumerClosedError(MQCoreError):
    """A consumer, producer or transaction used after close()."""


class CommitFailedError(MQCoreError):
    """A commit for partitions this consumer no longer owns (a rebalance moved them)."""


class GroupTypeError(MQCoreError):
    """A group name used by one kind of group (a consumer group: committed offsets or members;
    a share group: share state or members) asked for as the other kind. Kafka keeps one type
    per group ID as well (its GROUP_ID_NOT_FOUND: "is not a consumer group"); the two kinds
    would otherwise share the dead-letter topic `__dlq.<group>`."""


class InvalidRecordStateError(MQCoreError):
    """A share-group acknowledgement for a record this member does not hold (its lock expired,
    it was acknowledged already, or it was never delivered to this member), or a poll in
    explicit mode while records of the last poll are still unacknowledged (Kafka's
    INVALID_RECORD_STATE)."""


class NoOffsetForPartitionError(MQCoreError, LookupError):
    """No committed offset and auto_offset_reset="none", or the position fell out of the log."""


class ProducerFencedError(MQCoreError):
    """An idempotent producer's epoch is older than the one the log has seen for its id."""


class OutOfOrderSequenceError(MQCoreError):
    """An idempotent producer's batch sequence leaves a gap or goes back past the kept window:
    a lost or reordered batch, refused so the log never holds it out of order."""


class TransactionStateError(MQCoreError):
    """A transaction call in the wrong state (send after commit, commit after rollback, ...)."""


class ProducerClosedError(MQCoreError):
    """An idempotent producer was used after close()."""


class ProtocolError(MQCoreError):
    """A Kafka protocol request `mqcore serve` cannot take: a frame too large, an API or
    version it does not serve, bytes that do not parse as the request they claim to be.
    `api_key` and `api_version` are the header's (-1 when not read)."""

    def __init__(self, message: str, api_key: int = -1, api_version: int = -1) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version


class UnsupportedVersionError(ProtocolError):
    """A request of an API, or of a version of it, `mqcore serve` does not serve (its
    connection closes, as Kafka's broker closes it; the refusal is logged at warning)."""


class AuthenticationError(MQCoreError):
    """SASL authentication failed: unknown user, wrong password or proof, a mechanism not
    enabled, or bytes that are not the mechanism's messages (`mqcore serve`, docs/server.md
    "Security")."""


class AuthorizationError(MQCoreError):
    """The principal may not do this (the ACLs of `mqcore serve`, docs/server.md "Security"):
    answered TOPIC_/GROUP_AUTHORIZATION_FAILED over the Kafka protocol and 403 over HTTP.
    `resource` names the topic or group, `operation` what was refused."""

    def __init__(self, message: str, resource: str = "", operation: str = "") -> None:
        super().__init__(message)
        self.resource = resource
        self.operation = operation


class TopicAuthorizationError(AuthorizationError):
    """No grant lets the principal do this to the topic."""


class GroupAuthorizationError(AuthorizationError):
    """No grant lets the principal do this to the consumer or share group."""


class TransactionalIdAuthorizationError(AuthorizationError):
    """No grant lets the principal do this with the Kafka transactional ID."""


class CoordinatorError(MQCoreError):
    """The cluster's coordination service (ZooKeeper) did not answer in time, or this node's
    session with it ended: nothing was changed that the error does not name."""


class NodeIdTakenError(CoordinatorError):
    """Another live broker is registered under this node ID (Kafka refuses the second the
    same way): two processes must never act as one node."""


class StaleStateError(CoordinatorError):
    """A conditional update lost: the state changed since it was read, or the writer is no
    longer the controller (a newer one was elected). Read the state again and decide anew."""


class NotControllerError(CoordinatorError):
    """Asked of a broker that does not hold the controller's term now (Kafka's
    NOT_CONTROLLER): ask the controller, whose ID the cluster's state names."""


class ReplicationError(MQCoreError):
    """A replicated partition refused a request for a reason of the cluster's (Kafka's
    retriable errors): ask again after refreshing who leads it."""


class NotLeaderOrFollowerError(ReplicationError):
    """This broker does not lead the partition (or is not one of its replicas): the cluster's
    metadata names the leader (Kafka's NOT_LEADER_OR_FOLLOWER)."""


class FencedLeaderEpochError(ReplicationError):
    """The request named a leader epoch older than the partition's (Kafka's
    FENCED_LEADER_EPOCH): the sender's metadata is stale."""


class UnknownLeaderEpochError(ReplicationError):
    """The request named a leader epoch newer than this broker knows (Kafka's
    UNKNOWN_LEADER_EPOCH): this broker's state is behind; retry."""


class NotEnoughReplicasError(ReplicationError):
    """Fewer in-sync replicas than the topic's min.insync.replicas: an acks=all write is
    refused and nothing was appended (Kafka's NOT_ENOUGH_REPLICAS)."""


class NotEnoughReplicasAfterAppendError(ReplicationError):
    """An acks=all write was appended on the leader but the in-sync replicas fell below
    min.insync.replicas before it was committed (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND):
    it may be on the log; an idempotent producer's retry does not duplicate it."""


class QueryInterrupted(KeyboardInterrupt):
    """A scan stopped by Ctrl-C (KeyboardInterrupt). `result` holds the messages found so far,
    reason "interrupted" and the cursor that resumes the scan where it stopped.

    A KeyboardInterrupt, not an MQCoreError: code that does not look for it still stops, and
    `except Exception` does not swallow it."""

    def __init__(self, result: QueryResult) -> None:
        super().__init__("query interrupted")
        self.result = result


class ImplausibleTimeWarning(UserWarning):
    """A time bound in ms that lies before 2001 or after 2100: most likely seconds or
    microseconds given where milliseconds were meant (the query still runs as asked)."""
