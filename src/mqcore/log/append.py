"""What an append writes: record headers, the metadata an append answers, the fitting
encoder and the partitioner. Shared by the Store facade, producers, transactions, delays and
the consumption model's internal topics, so each is written once.

A batch longer than the topic's max_message_bytes is split: uncompressed, the encoder stops at
the first record that does not fit and the next batch starts there (every record encoded
once); compressed, a batch's size is known only afterwards, so it is halved until its pieces
fit. An idempotent producer's pieces get consecutive sequences.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqcore import compression as codecs
from mqcore._ext.batch import EncodedBatch, encode_batch
from mqcore._ext.hashing import kafka_partition
from mqcore.clock import now_ms
from mqcore.config import TopicConfig
from mqcore.errors import InvalidRecordError, MissingKeyError, RecordTooLargeError
from mqcore.query.ids import encode_msg_id, parse_uid, uid_text
from mqcore.storage.partition import check_timestamps
from mqcore.storage.producer_state import check_producer_fields, next_sequence

HeadersArg = Mapping[str, bytes | None] | Sequence[tuple[str, bytes | None]] | None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where `append` put a message, and its IDs (docs/format.md "Message IDs")."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    unique_id: str | None = None
    duplicate: bool = False  # an idempotent resend: nothing written, these are the original's

    @property
    def msg_id(self) -> str:
        """The store ID: decodes to (topic, partition, offset) with no index."""
        return encode_msg_id(self.topic, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Where `append_batch` put a batch: offsets base_offset .. base_offset + count - 1."""

    partition: int
    base_offset: int
    count: int
    topic: str = ""
    uids: bytes | None = field(default=None, repr=False)  # 16 bytes a message, zeros: none
    duplicate: bool = False  # an idempotent resend: nothing written, these are the original's

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    def msg_id(self, i: int) -> str:
        """The store ID of the batch's i-th message."""
        if not 0 <= i < self.count:
            raise IndexError(f"message {i} of a batch of {self.count}")
        return encode_msg_id(self.topic, self.partition, self.base_offset + i)

    def unique_id(self, i: int) -> str | None:
        """The unique ID of the batch's i-th message (made as strings only when asked for)."""
        if not 0 <= i < self.count:
            raise IndexError(f"message {i} of a batch of {self.count}")
        if self.uids is None:
            return None
        raw = self.uids[16 * i : 16 * i + 16]
        return None if raw == bytes(16) else uid_text(raw)

    @property
    def unique_ids(self) -> list[str | None]:
        return [self.unique_id(i) for i in range(self.count)]

    @property
    def msg_ids(self) -> list[str]:
        return [self.msg_id(i) for i in range(self.count)]


RESERVED_HEADERS = ("tag", "keys", "uid")


def message_headers(
    headers: HeadersArg,
    tag: str | None = None,
    properties: Mapping[str, object] | None = None,
    keys: str | bytes | Sequence[str | bytes] | None = None,
    unique_id: str | None = None,
) -> list[tuple[str, bytes | None]] | HeadersArg:
    """The record headers of one message: the caller's headers, then its tag, properties,
    extra keys and unique ID as the reserved headers `tag`, `keys` and `uid`."""
    if tag is None and not properties and not keys and unique_id is None:
        return headers
    out: list[tuple[str, bytes | None]] = []
    if headers is not None:
        out.extend(headers.items() if isinstance(headers, Mapping) else headers)
    if tag is not None:
        if not isinstance(tag, str) or not tag or " " in tag:
            raise InvalidRecordError(f"a tag must be a non-empty str without spaces, not {tag!r}")
        out.append(("tag", _utf8(tag, "tag")))
    for name, value in (properties or {}).items():
        if not isinstance(name, str) or not name or name in RESERVED_HEADERS:
            raise InvalidRecordError(
                f"property name {name!r} is empty, not a str, or reserved ({RESERVED_HEADERS})"
            )
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise InvalidRecordError(
                f"property {name!r} must be a str, int or float, not {type(value).__name__}"
            )
        out.append((name, _utf8(str(value), f"property {name!r}")))
    if isinstance(keys, (str, bytes)):
        keys = keys.split()  # RocketMQ's KEYS: one string of space-separated words
    elif keys is not None and not isinstance(keys, Sequence):
        raise InvalidRecordError(f"keys must be a str, bytes or a list of words, not {keys!r}")
    if keys:
        words = [_key_word(k) for k in keys]
        if any(not w or b" " in w for w in words):
            raise InvalidRecordError(f"extra keys must be non-empty and without spaces: {keys!r}")
        out.append(("keys", b" ".join(words)))
    if unique_id is not None:
        out.append(("uid", parse_uid(unique_id)))
    return out


def _utf8(text: str, what: str) -> bytes:
    """`text` as UTF-8; InvalidRecordError naming `what` for text that has none (a lone
    surrogate, as a command line's undecodable byte becomes)."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidRecordError(f"{what} is not valid text (UTF-8): {text!r}") from None


def _key_word(word: object) -> bytes:
    """One extra key as bytes: a str (UTF-8) or bytes-like; bytes(5) would be five zero bytes."""
    if isinstance(word, str):
        return _utf8(word, "keys word")
    if isinstance(word, (bytes, bytearray, memoryview)):
        return bytes(word)
    raise InvalidRecordError(f"keys must be str or bytes words, not {type(word).__name__}")


def slice_of(seq: Sequence[Any] | None, lo: int, hi: int | None = None) -> Sequence[Any] | None:
    """seq[lo:hi] as a list (seq itself when that is all of it; None stays None)."""
    if seq is None or (lo == 0 and hi is None):
        return seq
    return list(seq[lo:hi])


def advanced(producer: tuple[int, int, int] | None, count: int) -> tuple[int, int, int] | None:
    """An idempotent producer's fields for the piece that starts `count` records later."""
    if producer is None or count == 0:
        return producer
    return (*producer[:2], next_sequence(producer[2], count))


def producer_fields(producer: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """encode_batch's producer_id, producer_epoch, base_sequence (-1s: not idempotent)."""
    if producer is None:
        return (-1, -1, -1)
    check_producer_fields(*producer)
    return producer


# Upper bound of what a one-record batch adds to its key, value and headers: the 61-byte batch
# header, the record's varints (length, attributes, deltas, lengths: at most 5 bytes each) and a
# generated `uid` header; past it comes a margin for a codec's worst case (snappy: n/6 + 32)
_ONE_RECORD_OVERHEAD = 61 + 8 * 5 + 3 + 16 + 10
_CODEC_SLACK = 1024


def refuse_keyless(cfg: TopicConfig, topic: str, keys: Sequence[object] | None, count: int) -> None:
    """MissingKeyError naming the records of `count` without a key (`keys` None: all of them)
    when `topic` (settings `cfg`) is compacted: compaction keeps the latest record per key and
    drops keyless ones, so Kafka refuses them at the append (LogValidator), and so does every
    append of mqcore (the wire's, the Store's, its producers')."""
    if not cfg.compacted:
        return
    missing = tuple(range(count) if keys is None else (i for i, k in enumerate(keys) if k is None))
    if missing:
        shown = ", ".join(map(str, missing[:3])) + (", ..." if len(missing) > 3 else "")
        raise MissingKeyError(
            f"topic {topic!r} is compacted (cleanup_policy={cfg.cleanup_policy!r}): every "
            f"record needs a key, and {len(missing)} of {count} have none (record {shown}); "
            "nothing was written",
            missing,
        )


def check_message(
    cfg: TopicConfig,
    topic: str,
    value: bytes,
    key: bytes | None = None,
    headers: HeadersArg = None,
    timestamp: int | None = None,
    *,
    compression: str | None = None,
    now: int | None = None,
) -> None:
    """Raise what appending this one message to `topic` (settings `cfg`) would raise for the
    message itself, without writing: RecordTooLargeError (with `size` and `limit`) when even a
    batch holding only it exceeds max_message_bytes (append_batch splits longer lists, so this
    is the only size it refuses), InvalidRecordError when its CreateTime `timestamp` is
    outside message_timestamp_after_max_ms / before_max_ms of `now`, MissingKeyError when
    it has no key and the topic is compacted. Lets a caller refuse a whole input before any of
    it is written. A message far below the limit is not encoded."""
    refuse_keyless(cfg, topic, (key,), 1)
    now = now_ms() if now is None else now
    if timestamp is not None and cfg.timestamp_type == "CreateTime":
        check_timestamps(cfg, topic, timestamp, timestamp, now)
    codec = codecs.codec_id(compression if compression is not None else cfg.compression)
    bound = len(value) + (0 if key is None else len(key)) + _ONE_RECORD_OVERHEAD
    if headers:
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        bound += sum(4 * len(n) + (0 if v is None else len(v)) + 10 for n, v in pairs)
    if codec:
        bound += bound // 5 + _CODEC_SLACK
    if bound <= cfg.max_message_bytes:
        return
    check_size(encode_one(cfg, value, key, headers, timestamp, now, codec), cfg, topic)


def encode_one(
    cfg: TopicConfig,
    value: bytes | None,
    key: bytes | None,
    headers: HeadersArg,
    timestamp: int | None,
    now: int,
    codec: int,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> EncodedBatch:
    """One message as the batch `append` writes for it under topic settings `cfg`
    (`producer`: producer id, epoch, base sequence; -1s when not idempotent)."""
    producer_id, producer_epoch, base_sequence = producer
    return encode_batch(
        [value],
        None if key is None else [key],
        None if headers is None else [headers],
        None if timestamp is None else [timestamp],
        now,
        codec,
        now if cfg.timestamp_type == "LogAppendTime" else -1,
        producer_id,
        producer_epoch,
        base_sequence,
        compress=codecs.compress,
        uid_ms=now if cfg.unique_ids else -1,
        index=cfg.key_index,
    )


def check_size(batch: EncodedBatch, cfg: TopicConfig, topic: str) -> None:
    """RecordTooLargeError (with `size` and `limit`) for a batch over max_message_bytes."""
    if batch.size > cfg.max_message_bytes:
        raise RecordTooLargeError(
            f"message of {batch.size} bytes (as a record batch) exceeds max_message_bytes="
            f"{cfg.max_message_bytes} of topic {topic!r}; nothing was written",
            batch.size,
            cfg.max_message_bytes,
        )


def log_append_time(cfg: TopicConfig, now: int) -> int:
    """The LogAppendTime the encoder stamps (-1: the topic keeps CreateTime)."""
    return now if cfg.timestamp_type == "LogAppendTime" else -1


def merged_headers(
    n: int,
    headers: Sequence[HeadersArg] | None,
    tags: Sequence[str | None] | None,
    properties: Sequence[Mapping[str, object] | None] | None,
    unique_ids: Sequence[str | None] | None,
) -> list[Any]:
    """Each of `n` messages' headers with its tag, properties and unique ID (message_headers)."""
    for name, seq in (("headers", headers), ("tags", tags), ("properties", properties)):
        if seq is not None and len(seq) != n:
            raise InvalidRecordError(f"{len(seq)} {name} for {n} values")
    if unique_ids is not None and len(unique_ids) != n:
        raise InvalidRecordError(f"{len(unique_ids)} unique_ids for {n} values")
    return [
        message_headers(
            None if headers is None else headers[i],
            None if tags is None else tags[i],
            None if properties is None else properties[i],
            None,
            None if unique_ids is None else unique_ids[i],
        )
        for i in range(n)
    ]


def encode_fitting(
    values: list[Any],
    keys: Sequence[Any] | None,
    headers: Sequence[Any] | None,
    timestamps: Sequence[int] | None,
    now: int,
    codec: int,
    cfg: TopicConfig,
    topic: str,
    producer: tuple[int, int, int] | None = None,
) -> list[EncodedBatch]:
    """Encode into batches of at most max_message_bytes (see the module docstring)."""
    if keys is not None and len(keys) != len(values):
        raise InvalidRecordError(f"{len(keys)} keys for {len(values)} values")
    batches: list[EncodedBatch] = []
    start, n = 0, len(values)
    while start < n or not batches:  # an empty batch: the encoder's error
        batch = encode_batch(
            values if start == 0 else values[start:],
            slice_of(keys, start),
            slice_of(headers, start),
            slice_of(timestamps, start),
            now,
            codec,
            log_append_time(cfg, now),
            *producer_fields(advanced(producer, start)),
            compress=codecs.compress,
            uid_ms=now if cfg.unique_ids else -1,
            index=cfg.key_index,
            max_bytes=cfg.max_message_bytes,
        )
        if batch.size > cfg.max_message_bytes and batch.count > 1:
            half = start + batch.count // 2  # compressed: halve, each half fits or halves
            batches += encode_fitting(
                values[start:half],
                slice_of(keys, start, half),
                slice_of(headers, start, half),
                slice_of(timestamps, start, half),
                now,
                codec,
                cfg,
                topic,
                advanced(producer, start),
            )
            start = half
            continue
        check_size(batch, cfg, topic)
        batches.append(batch)
        start += batch.count
    return batches


def key_partition(key: object, count: int) -> int:
    """The partition of `count` a keyed message goes to: murmur2(key) as Kafka's default
    partitioner computes it (the one key routing: appends, `mqcore produce`, the Spark sink)."""
    if isinstance(key, str):
        raise InvalidRecordError("keys must be bytes-like or None, not str")
    try:
        return int(kafka_partition(key, count))  # type: ignore[arg-type]
    except TypeError:
        raise InvalidRecordError(
            f"keys must be bytes-like or None, not {type(key).__name__}"
        ) from None


class Router:
    """The partitioner of appends with partition=None: key_partition for keyed messages, round
    robin per topic for null keys."""

    def __init__(self) -> None:
        # next() of an itertools.count is one C call: threads never get the same number
        self._round_robin: dict[str, itertools.count[int]] = {}

    def partition(self, topic: str, key: object, count: int) -> int:
        """The partition of `topic` (of `count`) a message with `key` goes to."""
        if key is not None:
            if type(key) is bytes:  # the common key: no checks to make, one call less
                return int(kafka_partition(key, count))
            return key_partition(key, count)
        counter = self._round_robin.setdefault(topic, itertools.count())
        return next(counter) % count

    def group(self, topic: str, keys: Sequence[object], count: int) -> dict[int, list[int]]:
        """Indexes of `keys` grouped by partition (append_batch with partition=None)."""
        groups: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(self.partition(topic, k, count), []).append(i)
        return groups
