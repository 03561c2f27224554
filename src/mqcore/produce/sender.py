"""The one definition of `append` and `append_batch`: the Store, an idempotent Producer and a
Transaction are Senders that differ only in their send hooks.

What a Sender does before the hook, for all three: the open and writable checks, the refusal of
internal topics, the record headers of tags, properties, extra keys and unique IDs
(log/append.py), the column length checks, parking in the timer log for `deliver_at` /
`delay_ms` (delay.py), and the choice of partition by the log's one router (murmur2 of the key,
or round robin for a keyless message or a keyless batch). The hooks then write: the Store a
plain append, a Producer an append stamped with its id, epoch and sequence, a Transaction a
half message parked in `__txn_half`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from mqcore import compression as codecs
from mqcore.errors import InvalidRecordError
from mqcore.log.append import (
    BatchMetadata,
    HeadersArg,
    RecordMetadata,
    check_size,
    encode_one,
    merged_headers,
    message_headers,
    producer_fields,
    refuse_keyless,
)
from mqcore.log.internal import refuse_internal
from mqcore.produce.delay import PendingMetadata, check_delay
from mqcore.query.ids import uid_text

if TYPE_CHECKING:
    from mqcore.log.manager import Log
    from mqcore.produce.delay import DelayManager


# not frozen: a frozen dataclass sets each field through object.__setattr__, 2 µs a message
# on the single-append path; nothing changes one after it is made
@dataclass(slots=True)
class Outgoing:
    """What a send hook writes: messages of `topic` for `partition` (-1: routed), headers
    built and column lengths checked."""

    topic: str
    partition: int
    values: list[bytes | None]
    keys: Sequence[bytes | None] | None
    headers: Sequence[Any] | None
    timestamps: Sequence[int | None] | None
    compression: str | None = None
    sequence: int | None = None  # an idempotent producer's resend: its base sequence
    sequences: Mapping[int, int] | None = None  # ... of a routed batch, per partition

    def part(self, partition: int, idx: list[int]) -> Outgoing:
        """The messages at indexes `idx`, for `partition` (with its resend sequence)."""
        return Outgoing(
            self.topic,
            partition,
            [self.values[i] for i in idx],
            None if self.keys is None else [self.keys[i] for i in idx],
            None if self.headers is None else [self.headers[i] for i in idx],
            None if self.timestamps is None else [self.timestamps[i] for i in idx],
            self.compression,
            None if self.sequences is None else self.sequences.get(partition),
        )


One = TypeVar("One")  # what a sender's append of one message answers
Batch = TypeVar("Batch")  # ... its append_batch to one partition
Routed = TypeVar("Routed")  # ... its append_batch of keyed messages routed over partitions


class Sender(Generic[One, Batch, Routed]):
    """`append` and `append_batch` over `self.log`, with the send hooks of a subclass."""

    log: Log
    _delays: DelayManager | None = None  # parks delayed sends; None: this sender has none
    _action = "append to"  # how an internal topic's refusal names the write

    @overload
    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        tag: str | None = None,
        properties: Mapping[str, object] | None = None,
        keys: str | bytes | Sequence[str | bytes] | None = None,
        unique_id: str | None = None,
        deliver_at: None = None,
        delay_ms: None = None,
        sequence: int | None = None,
    ) -> One: ...

    @overload
    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        tag: str | None = None,
        properties: Mapping[str, object] | None = None,
        keys: str | bytes | Sequence[str | bytes] | None = None,
        unique_id: str | None = None,
        deliver_at: int,
        delay_ms: None = None,
    ) -> PendingMetadata: ...

    @overload
    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        tag: str | None = None,
        properties: Mapping[str, object] | None = None,
        keys: str | bytes | Sequence[str | bytes] | None = None,
        unique_id: str | None = None,
        deliver_at: None = None,
        delay_ms: int,
    ) -> PendingMetadata: ...

    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        tag: str | None = None,
        properties: Mapping[str, object] | None = None,
        keys: str | bytes | Sequence[str | bytes] | None = None,
        unique_id: str | None = None,
        deliver_at: int | None = None,
        delay_ms: int | None = None,
        sequence: int | None = None,
    ) -> One | PendingMetadata:
        """Append one message; returns where it went and its IDs. `value=None` writes a
        tombstone. `tag`, `properties`, extra `keys` (words indexed like the key: a list, or one
        space-separated string as RocketMQ writes them) and a producer's
        `unique_id` travel as record headers (message_headers). With `deliver_at` (ms) or
        `delay_ms` the message waits in the timer log and a PendingMetadata comes back (the
        Store's appends only). `sequence` resends an idempotent producer's earlier message
        (Producer only). Internal topics (`__` names) are refused: InternalTopicError."""
        self.log.check_writable()
        refuse_internal(topic, self._action)
        headers = message_headers(headers, tag, properties, keys, unique_id)
        if key is None:
            self._refuse_keyless(topic, None, 1)
        if deliver_at is not None or delay_ms is not None:
            return self._park_delayed(topic, [value], [key], [headers], partition, [timestamp],
                                      deliver_at, delay_ms)[0]  # fmt: skip
        if partition is None:
            log = self.log
            # auto-creates the topic when allowed
            count = log.partitions_and_config(topic, create=True)[1].partitions
            partition = log.router.partition(topic, key, count)
        out = Outgoing(topic, partition, [value], [key], [headers], [timestamp], None, sequence)
        return self._send_one(out)

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int = 0,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        deliver_at: None = None,
        delay_ms: None = None,
        base_sequence: int | None = None,
    ) -> Batch: ...

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: None = None,
        headers: Sequence[HeadersArg] | None = None,
        *,
        partition: None,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        deliver_at: None = None,
        delay_ms: None = None,
        base_sequence: int | None = None,
    ) -> Batch: ...

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        headers: Sequence[HeadersArg] | None = None,
        *,
        partition: None,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        deliver_at: None = None,
        delay_ms: None = None,
        base_sequence: Mapping[int, int] | None = None,
    ) -> Routed: ...

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int | None = 0,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        deliver_at: int | Sequence[int],
        delay_ms: None = None,
    ) -> list[PendingMetadata]: ...

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int | None = 0,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        deliver_at: None = None,
        delay_ms: int | Sequence[int],
    ) -> list[PendingMetadata]: ...

    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int | None = 0,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        deliver_at: int | Sequence[int] | None = None,
        delay_ms: int | Sequence[int] | None = None,
        base_sequence: int | Mapping[int, int] | None = None,
    ) -> Batch | Routed | list[PendingMetadata]:
        """Append messages as one Kafka record batch with consecutive offsets.

        A batch above the topic's max_message_bytes is split into several batches (still
        consecutive offsets); a single message above it is refused. `partition=None` routes by
        key like Kafka's producer: with keys, the messages are grouped per partition and a list
        of BatchMetadata (one per partition, ascending) comes back; without keys the whole batch
        goes to the next partition in round robin. `deliver_at`/`delay_ms` (one int for the
        batch or one per message) park the messages in the timer log: a list of
        PendingMetadata, one per message, comes back (docs/consume.md; the Store's appends
        only). `base_sequence` resends an idempotent producer's batch (Producer only): an int
        for one partition, {partition: sequence} when routed. Internal topics (`__` names) are
        refused: InternalTopicError.
        """
        log = self.log
        log.check_writable()
        refuse_internal(topic, self._action)
        values = values if type(values) is list else list(values)
        for name, col in (("keys", keys), ("timestamps", timestamps)):
            if col is not None and len(col) != len(values):
                raise InvalidRecordError(f"{len(col)} {name} for {len(values)} values")
        if tags is not None or properties is not None or unique_ids is not None:
            headers = merged_headers(len(values), headers, tags, properties, unique_ids)
        elif headers is not None and len(headers) != len(values):
            raise InvalidRecordError(f"{len(headers)} headers for {len(values)} values")
        if keys is None or None in keys:
            self._refuse_keyless(topic, keys, len(values))
        if deliver_at is not None or delay_ms is not None:
            return self._park_delayed(topic, values, keys, headers, partition, timestamps,
                                      deliver_at, delay_ms)  # fmt: skip
        # auto-creates the topic when allowed
        count = log.partitions_and_config(topic, create=True)[1].partitions
        if partition is None and keys is not None:
            if base_sequence is not None and not isinstance(base_sequence, Mapping):
                raise InvalidRecordError(
                    "a keyed batch routed over partitions takes base_sequence as "
                    "{partition: sequence}, not one int"
                )
            groups = log.router.group(topic, keys, count)
            routed = Outgoing(topic, -1, values, keys, headers, timestamps, compression, None,
                              base_sequence)  # fmt: skip
            return self._send_routed(routed, groups)
        if base_sequence is not None and isinstance(base_sequence, Mapping):  # ABC: slow
            raise InvalidRecordError("base_sequence is a mapping only for a routed batch")
        if partition is None:
            partition = log.router.partition(topic, None, count)
        return self._send_batch(Outgoing(topic, partition, values, keys, headers, timestamps,
                                         compression, base_sequence))  # fmt: skip

    def _refuse_keyless(self, topic: str, keys: Sequence[bytes | None] | None, n: int) -> None:
        """MissingKeyError when `topic` is compacted (or would be, made by auto-creation) and
        some of the `n` messages have no key, before anything is parked or written (a
        transaction's or a delay's messages too: their relay must never meet a refusal)."""
        log = self.log
        if log.has_topic(topic):
            refuse_keyless(log.config(topic), topic, keys, n)
        elif log.auto_create_topics:
            refuse_keyless(log.topic_defaults, topic, keys, n)

    # -- the hooks ------------------------------------------------------------------------------

    def _send_one(self, out: Outgoing) -> One:
        """Write one message (out.values[0], its headers built) to out.partition."""
        raise NotImplementedError

    def _send_batch(self, out: Outgoing) -> Batch:
        """Write messages (headers built, lengths checked) to out.partition as one batch."""
        raise NotImplementedError

    def _send_routed(self, out: Outgoing, groups: dict[int, list[int]]) -> Routed:
        """Keyed messages routed over partitions (`groups`: partition -> their indexes; the
        sequence, when given, is out.sequences): one _send_batch per partition, ascending."""
        return cast(
            Routed, [self._send_batch(out.part(p, idx)) for p, idx in sorted(groups.items())]
        )

    # -- delayed messages -----------------------------------------------------------------------

    def _park_delayed(
        self,
        topic: str,
        values: list[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Any] | None,
        partition: int | None,
        timestamps: Sequence[int | None] | None,
        deliver_at: object,
        delay_ms: object,
    ) -> list[PendingMetadata]:
        """Park messages in the timer log, each with the partition it will go to (routed now:
        the placement is fixed at send time)."""
        if self._delays is None:
            raise InvalidRecordError(
                f"a {type(self).__name__}'s messages cannot be delayed (deliver_at, delay_ms)"
            )
        log = self.log
        due = check_delay(deliver_at, delay_ms, log.clock(), self._delays.options.delay_max_ms,
                          len(values))  # fmt: skip
        assert due is not None
        return self._delays.park(topic, values, keys, headers,
                                 self.route_each(topic, keys, len(values), partition),
                                 timestamps, due)  # fmt: skip

    def route_each(
        self, topic: str, keys: Sequence[bytes | None] | None, n: int, partition: int | None
    ) -> list[int]:
        """The partition of each of `n` messages, as append_batch routes them (the partition
        given; else by key; else one round-robin choice for the whole batch). Each exists."""
        log = self.log
        log.partitions_of(topic, create=True)  # auto-creates the topic when allowed
        count = log.config(topic).partitions
        if partition is None and keys is not None:
            parts = [log.router.partition(topic, k, count) for k in keys]
        else:
            chosen = log.router.partition(topic, None, count) if partition is None else partition
            parts = [chosen] * n
        for p in set(parts):
            log.partition(topic, p)  # UnknownPartitionError for one the topic lacks
        return parts


def write_one(log: Log, out: Outgoing, producer: tuple[int, int, int] | None) -> RecordMetadata:
    """One message as a one-record batch, encoded in the caller's thread holding no lock and
    appended (`producer`: an idempotent producer's id, epoch and sequence)."""
    topic, partition = out.topic, out.partition
    part = log.partition(topic, partition, create=True)  # auto-creates when allowed
    cfg = part.config
    now = log.clock()
    codec = codecs.codec_id(cfg.compression)
    batch = encode_one(cfg, out.values[0], out.keys[0] if out.keys else None,
                       out.headers[0] if out.headers else None,
                       out.timestamps[0] if out.timestamps else None, now, codec,
                       producer_fields(producer))  # fmt: skip
    check_size(batch, cfg, topic)
    base, dup = log.append(part, [batch], producer, now)
    if dup is not None:
        return RecordMetadata(topic, partition, base, dup.max_timestamp, None, True)
    uids = batch.uids
    uid = uid_text(uids) if uids is not None and uids != bytes(16) else None
    return RecordMetadata(topic, partition, base, batch.max_timestamp, uid)


def append_plain(log: Log, out: Outgoing, producer: tuple[int, int, int] | None) -> BatchMetadata:
    """Messages for one partition as batches of at most max_message_bytes (Log.append_records)."""
    timestamps = cast("Sequence[int] | None", out.timestamps)  # a batch's are ints (encoder)
    return log.append_records(out.topic, out.partition, out.values, out.keys, out.headers,
                              timestamps, out.compression, producer)  # fmt: skip


def no_sequence(sender: object, sequence: int | None) -> None:
    """InvalidRecordError for a `sequence`/`base_sequence` given to a sender that has none."""
    if sequence is not None:
        raise InvalidRecordError(
            f"sequence {sequence!r}: only an idempotent producer (store.producer()) resends "
            f"with a sequence, not a {type(sender).__name__}"
        )


__all__ = ["Outgoing", "Sender", "append_plain", "no_sequence", "write_one"]
