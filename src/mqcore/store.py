"""The public Store: topics, appends, reads. It orchestrates; the storage layer owns the files.

Durability after `append` returns, by flush policy (docs/operations.md "Durability"):
  always    fdatasync'd before append returns (group commit across threads): survives a process
            kill and a power loss.
  interval  in the page cache at once; fdatasync'd by the background flusher within
            flush_interval_ms or flush_messages: survives a process kill; a power loss loses at
            most that window.
  os        page cache only, flushed by the kernel, by flush() and at close: survives a process
            kill; a power loss may lose anything since the last flush.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from mqcore import compression as codecs
from mqcore._ext import lookup
from mqcore._ext.batch import EncodedBatch, Message, encode_batch
from mqcore._ext.hashing import kafka_partition
from mqcore.arrow import new_columns, to_record_batch
from mqcore.config import FlushPolicy, TopicConfig, validate_name
from mqcore.consume.delay import (
    DELAY_STATE_TOPIC,
    DELAY_TOPIC,
    DelayManager,
    PendingMetadata,
    check_delay,
    pop_options,
)
from mqcore.consume.internal import SkipLog, SkippedRecord, is_internal, refuse_internal
from mqcore.consume.producer import Producer
from mqcore.consume.trace import TraceEvent, Tracer, sample_rate
from mqcore.consume.transactions import (
    HALF_TOPIC,
    OP_TOPIC,
    Transaction,
    TransactionInfo,
    TransactionManager,
)
from mqcore.errors import (
    CorruptIndexError,
    InvalidConfigError,
    InvalidRecordError,
    MQCoreError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    ReadOnlyStoreError,
    RecordTooLargeError,
    StoreClosedError,
    StoreError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.query import engine
from mqcore.query.engine import QueryResult
from mqcore.query.ids import decode_msg_id, encode_msg_id, parse_uid, uid_text
from mqcore.storage import cleaner, retention
from mqcore.storage.cache import SegmentCache
from mqcore.storage.cleaner import CompactionReport
from mqcore.storage.flusher import Flusher
from mqcore.storage.logdir import LogDirectory
from mqcore.storage.partition import Partition, RecoveryReport, check_timestamps, has_segments
from mqcore.storage.producer_state import BatchRecord, check_producer_fields, next_sequence
from mqcore.storage.retention import RetentionReport
from mqcore.storage.segment import MAX_DECOMPRESSED
from mqcore.tasks import BackgroundTasks

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore.consume.consumer import Consumer
    from mqcore.consume.group import ConsumeState, PartitionLag


_log = logging.getLogger("mqcore")

HeadersArg = Mapping[str, bytes | None] | Sequence[tuple[str, bytes | None]] | None
MIN_OPEN_SEGMENTS = 8  # the fewest sealed segments a store keeps open (a read spans several)
READ_ONLY_OPEN_PATIENCE = 10.0  # seconds a read-only open retries while a writer changes files
# the parked logs of transactions and delays and their bookkeeping: trimmed by resolution
# (consume/trim.py), never by retention or compaction
TRIMMED_BY_RESOLUTION = frozenset({HALF_TOPIC, OP_TOPIC, DELAY_TOPIC, DELAY_STATE_TOPIC})


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


def _slice(seq: Sequence[Any] | None, lo: int, hi: int | None = None) -> Sequence[Any] | None:
    """seq[lo:hi] as a list (seq itself when that is all of it; None stays None)."""
    if seq is None or (lo == 0 and hi is None):
        return seq
    return list(seq[lo:hi])


def _advanced(producer: tuple[int, int, int] | None, count: int) -> tuple[int, int, int] | None:
    """An idempotent producer's fields for the piece that starts `count` records later."""
    if producer is None or count == 0:
        return producer
    return (*producer[:2], next_sequence(producer[2], count))


def _producer_fields(producer: tuple[int, int, int] | None) -> tuple[int, int, int]:
    """encode_batch's producer_id, producer_epoch, base_sequence (-1s: not idempotent)."""
    if producer is None:
        return (-1, -1, -1)
    check_producer_fields(*producer)
    return producer


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# Upper bound of what a one-record batch adds to its key, value and headers: the 61-byte batch
# header, the record's varints (length, attributes, deltas, lengths: at most 5 bytes each) and a
# generated `uid` header; past it comes a margin for a codec's worst case (snappy: n/6 + 32)
_ONE_RECORD_OVERHEAD = 61 + 8 * 5 + 3 + 16 + 10
_CODEC_SLACK = 1024


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
    outside message_timestamp_after_max_ms / before_max_ms of `now`. Lets a caller refuse a
    whole input before any of it is written. A message far below the limit is not encoded."""
    now = _now_ms() if now is None else now
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


class Store:
    """A directory of topics and partitions of Kafka v2 segments. Use `mqcore.open()`."""

    def __init__(
        self,
        path: str,
        *,
        read_only: bool = False,
        create: bool = True,
        flush: str = "interval",
        flush_interval_ms: int = 500,
        flush_messages: int = 10_000,
        auto_create_topics: bool = False,
        default_partitions: int = 1,
        verify_crc: bool = True,
        trace: bool | float = False,
        retention_check_interval_ms: int = 300_000,
        compaction_check_interval_ms: int = 15_000,
        max_open_segments: int = 1000,
        full_recovery: bool = False,
        **topic_defaults: Any,
    ):
        rate = sample_rate(trace)
        txn_delay_options = pop_options(topic_defaults)  # consume/delay.py TxnDelayOptions
        self._maintenance_intervals = _maintenance_intervals(
            retention_check_interval_ms, compaction_check_interval_ms
        )
        self.flush_policy = FlushPolicy(flush, flush_interval_ms, flush_messages)
        if (
            isinstance(max_open_segments, bool)
            or not isinstance(max_open_segments, int)
            or not MIN_OPEN_SEGMENTS <= max_open_segments <= 1 << 30
        ):
            raise InvalidConfigError(
                f"max_open_segments must be an int in [{MIN_OPEN_SEGMENTS}, 2**30], not "
                f"{max_open_segments!r}"
            )
        # sealed segments open at once (their maps; they keep no descriptor): docs/operations.md
        self._segment_cache = SegmentCache(max_open_segments)
        self.read_only = read_only
        self.auto_create_topics = auto_create_topics
        self.verify_crc = verify_crc
        self.topic_defaults = TopicConfig(partitions=default_partitions).with_changes(
            **topic_defaults
        )
        if not isinstance(create, bool):
            raise InvalidConfigError(f"create must be a bool, not {create!r}")
        if not isinstance(full_recovery, bool) or (full_recovery and read_only):
            raise InvalidConfigError(
                f"full_recovery must be a bool, and goes with a writable open: {full_recovery!r}"
            )
        self._full_recovery = full_recovery
        self._dir = LogDirectory(path, writable=not read_only, create=create)
        self.path = self._dir.path
        self._lock = threading.RLock()
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._topic_appends: dict[str, int] = {}  # batches written per topic since open
        # topic -> partition number -> Partition; a read-only store of a Kafka log directory
        # may lack some numbers (a broker holds only some partitions of a topic)
        self._partitions: dict[str, dict[int, Partition]] = {}
        self._closed = False
        self._flusher: Flusher | None = None
        self._tasks = BackgroundTasks()
        self._tracer = Tracer(self, rate) if rate > 0 else None
        self._skipped = SkipLog()  # internal records a reader could not parse (consume/internal)
        self.recovery: dict[tuple[str, int], RecoveryReport] = {}
        try:
            self._load()
        except BaseException:
            # a failed open must not look open: __del__ would close() it, writing the clean
            # marker over a store that was never recovered
            self._closed = True
            self._abandon_partitions()
            self._dir.release()
            raise
        self._txn_delay_setup(txn_delay_options)

    # -- opening and closing ------------------------------------------------------------------

    def _load(self) -> None:
        if self.read_only:
            self._load_read_only()
        else:
            self._open_partitions(live=False)
        for path in self.stray_directories:
            _log.warning("%s: not a partition of any topic in mqcore-topics.json; not opened", path)
        for topic, count in self.missing_partitions.items():
            _log.warning("%s: %d of the %d partitions of topic %r have no directory; not "
                         "opened", self.path, count, self._configs[topic].partitions,
                         topic)  # fmt: skip
        if self.read_only:
            return
        self._dir.save_topics(self._configs)
        self._checkpoint()
        self._dir.mark_open()
        if self.flush_policy.mode == "interval":
            self._flusher = Flusher(
                self.flush_policy.interval_ms, self._flush_quietly, self._checkpoint
            )
            self._flusher.start()
        self._register_maintenance()
        self._tasks.start()

    def _open_partitions(self, live: bool) -> None:
        clean = self._dir.was_clean() and not self._full_recovery
        try:
            points: dict[tuple[str, int], int] | None = self._dir.load_recovery_points()
        except CorruptIndexError:
            points = None  # scan everything: slower, never wrong
        if not self.read_only:
            self._dir.clear_clean_marker()
        self._configs = self._dir.load_topics()
        # what is not opened: directories no topic declares, and declared partitions whose
        # directory is gone (an open never creates one: an empty partition would hide a loss)
        self.stray_directories = list(self._dir.stray)
        self.missing_partitions: dict[str, int] = {}  # topic -> declared partitions missing
        present = self._dir.partition_numbers()
        for topic, cfg in self._configs.items():
            parts: dict[int, Partition] = {}
            self._partitions[topic] = parts
            numbers = sorted(p for p in present.get(topic, ()) if p < cfg.partitions)
            if len(numbers) < cfg.partitions and not self.read_only:
                self.missing_partitions[topic] = cfg.partitions - len(numbers)
            for p in numbers:  # an absent one: reads of it raise UnknownPartitionError
                directory = self._dir.partition_dir(topic, p)
                if self.read_only and not has_segments(directory):
                    continue
                part = self._new_partition(topic, p, cfg)
                point = None if points is None else points.get((topic, p), 0)
                parts[p] = part
                self.recovery[(topic, p)] = part.open(point, clean, live, self._full_recovery)

    def _load_read_only(self) -> None:
        """Open a consistent view beside whatever a writer is doing (docs/operations.md
        "Readers beside a writer").

        With a live writer every segment is trusted and each partition ends at its last whole
        batch (recovery is the writer's job; a half-written batch is just not visible yet).
        The writer may roll, delete or replace files while this open reads them: a file that
        vanished, a mapping cut short, damage that is the writer's own work in progress, or a
        file replaced after it was opened (Partition.same_files) means the open saw a moment
        that is already gone, so it lets go of everything and opens again, for at most
        READ_ONLY_OPEN_PATIENCE seconds. Without a live writer nothing moves, and an error is
        the store's own."""
        deadline = time.monotonic() + READ_ONLY_OPEN_PATIENCE
        pause = 0.001
        while True:
            state = self._dir.writer_state()
            why: BaseException | str = "its writer is still recovering it"
            if state != "opening":  # a writer still opening may yet cut or remove files
                try:
                    self._open_partitions(live=state == "open")
                    if all(
                        part.same_files()
                        for ps in self._partitions.values()
                        for part in ps.values()
                    ):
                        return
                    why = "a file was replaced while it was being opened"
                except (OSError, ValueError, MQCoreError) as e:
                    if state is None and self._dir.writer_state() is None:
                        if isinstance(e, MQCoreError):
                            raise
                        raise StoreError(f"cannot open {self.path} read-only: {e}") from e
                    why = e
                self._abandon_partitions()
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{self.path} kept changing under its writer for {READ_ONLY_OPEN_PATIENCE} s "
                    f"while a read-only open tried to take a consistent view (last: {why})"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _abandon_partitions(self) -> None:
        for parts in self._partitions.values():
            for part in parts.values():
                part.abandon()
        self._partitions = {}
        self.recovery = {}

    def _new_partition(self, topic: str, p: int, cfg: TopicConfig) -> Partition:
        return Partition(
            topic,
            p,
            self._dir.partition_dir(topic, p),
            cfg,
            self.flush_policy,
            writable=not self.read_only,
            cache=self._segment_cache,
        )

    def close(self) -> None:
        """Flush everything, seal active segments, write checkpoints and the clean marker."""
        if not self._closed:
            # before the lock and before the store looks closed: a task finishes its run with
            # the store still usable (a task may take the store lock itself)
            self._tasks.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._flusher is not None:
                self._flusher.stop()
            for parts in self._partitions.values():
                for part in parts.values():
                    part.close()
            if not self.read_only:
                self._checkpoint()
                self._dir.write_clean_marker()
            self._dir.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # a store dropped without close(): warn like an unclosed file, then close what we can
        # (at interpreter exit the directory or the modules we need may already be gone)
        if not getattr(self, "_closed", True):
            warnings.warn(f"store {self.path} was not closed", ResourceWarning, stacklevel=1)
            with contextlib.suppress(Exception):
                self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if self._flusher is not None and self._flusher.error is not None:
            raise self._flusher.error

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.path} was opened read-only")

    # -- topics ---------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int | None = None, **config: Any) -> None:
        """Create a topic (idempotent when it exists with the same partition count).

        `config` takes TopicConfig fields (segment_bytes, segment_ms, max_message_bytes,
        timestamp_type, compression, retention_ms, ...); unset ones come from the store defaults.
        A name starting with `__` is internal (InternalTopicError): mqcore creates those.
        """
        self._check_writable()
        validate_name(name)
        refuse_internal(name, "create")
        self._create_topic(name, partitions, **config)

    def new_topic_config(self, partitions: int | None = None, **config: Any) -> TopicConfig:
        """The settings create_topic(name, partitions, **config) gives a new topic: the store's
        defaults with `config` applied (validated: InvalidConfigError)."""
        return self.topic_defaults.with_changes(
            partitions=self.topic_defaults.partitions if partitions is None else partitions,
            **config,
        )

    def _create_topic(self, name: str, partitions: int | None = None, **config: Any) -> None:
        """create_topic without the internal-name guard (for _internal_topic)."""
        cfg = self.new_topic_config(partitions, **config)
        with self._lock:
            existing = self._configs.get(name)
            if existing is not None:
                if existing.partitions != cfg.partitions:
                    raise TopicExistsError(
                        f"topic {name!r} exists with {existing.partitions} partitions, "
                        f"not {cfg.partitions}"
                    )
                return
            parts = {p: self._new_partition(name, p, cfg) for p in range(cfg.partitions)}
            for part in parts.values():
                part.open(0, clean=True)
            self._configs[name] = cfg
            self._partitions[name] = parts
            self._dir.save_topics(self._configs)

    def _internal_topic(self, name: str, partitions: int = 1, **config: Any) -> str:
        """Create internal topic `name` (a `__` name) on first use, whatever auto_create_topics
        says; returns the name. Internal topics hold the consumption model's state."""
        if name not in self._configs:
            self._check_writable()
            validate_name(name)
            self._create_topic(name, partitions, **config)
        return name

    def alter_topic_config(self, topic: str, **changes: Any) -> TopicConfig:
        """Change settings of an existing topic; returns its new settings.

        The new settings are validated whole, written to `mqcore-topics.json` (durably, like
        create_topic) and then used by the topic's partitions: by the next append (size and
        timestamp checks, compression, unique IDs, timestamp type), the next roll (segment_ms,
        index_interval_bytes from the next segment) and the next retention or compaction pass.
        A setting fixed at creation (config.FIXED_AT_CREATION: the partition count and what
        sizes files already open) is refused with InvalidConfigError naming it. Internal topics
        are refused: InternalTopicError."""
        self._check_writable()
        refuse_internal(topic, "alter")
        self._parts(topic)
        with self._lock:
            old = self._configs[topic]
            new = old.with_changes(**changes)
            old.changes_allowed(changes)
            if new == old:
                return old
            configs = dict(self._configs)
            configs[topic] = new
            self._dir.save_topics(configs)  # on disk first: a failed write changes nothing
            self._configs = configs
            for part in self._partitions[topic].values():
                part.reconfigure(new)
        return new

    def skipped_records(self) -> list[SkippedRecord]:
        """Records of internal topics that a reader could not parse and skipped (each also
        logged once as a warning): junk written by something other than mqcore."""
        return list(self._skipped.records)

    def topics(self) -> list[str]:
        self._check_open()
        return sorted(self._partitions)

    def partitions(self, topic: str) -> int:
        """The topic's partition count (some may be absent from a Kafka log directory)."""
        self._parts(topic)
        return self._configs[topic].partitions

    def available_partitions(self, topic: str) -> list[int]:
        """Partition numbers this store holds: all of them, except in a read-only store of a
        Kafka log directory that has only some partitions of the topic."""
        return sorted(self._parts(topic))

    def topic_config(self, topic: str) -> TopicConfig:
        self._parts(topic)
        return self._configs[topic]

    def _parts(self, topic: str, create: bool = False) -> dict[int, Partition]:
        self._check_open()
        parts = self._partitions.get(topic)
        if parts is None:
            if create and self.auto_create_topics:
                self.create_topic(topic)
                return self._partitions[topic]
            validate_name(topic)
            raise UnknownTopicError(f"topic {topic!r} does not exist in {self.path}")
        return parts

    def _partition(self, topic: str, partition: int, create: bool = False) -> Partition:
        parts = self._parts(topic, create)
        count = self._configs[topic].partitions
        if (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not 0 <= partition < count
        ):
            raise UnknownPartitionError(
                f"partition {partition!r} is outside 0..{count - 1} of topic {topic!r}"
            )
        part = parts.get(partition)
        if part is None:
            raise UnknownPartitionError(
                f"partition {partition} of topic {topic!r} is not in {self.path} (it holds "
                f"partitions {sorted(parts)} of {count})"
            )
        return part

    # -- appending ------------------------------------------------------------------------------

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
        _producer: tuple[int, int, int] | None = None,
    ) -> RecordMetadata: ...

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
        _producer: tuple[int, int, int] | None = None,
    ) -> RecordMetadata | PendingMetadata:
        """Append one message; returns where it went and its IDs. `value=None` writes a
        tombstone. `tag`, `properties`, extra `keys` (words indexed like the key: a list, or one
        space-separated string as RocketMQ writes them) and a producer's
        `unique_id` travel as record headers (message_headers). With `deliver_at` (ms) or
        `delay_ms` the message waits in the timer log and a PendingMetadata comes back.
        Internal topics (`__` names) are refused: InternalTopicError."""
        self._check_writable()
        refuse_internal(topic)
        headers = message_headers(headers, tag, properties, keys, unique_id)
        if deliver_at is not None or delay_ms is not None:
            return self._delayed(topic, [value], [key], [headers], partition, [timestamp],
                                 deliver_at, delay_ms)[0]  # fmt: skip
        self._parts(topic, create=True)  # auto-creates the topic when allowed
        if partition is None:
            partition = self._choose_partition(topic, key, self._configs[topic].partitions)
        part = self._partition(topic, partition)
        cfg = part.config
        now = _now_ms()
        batch = encode_one(
            cfg, value, key, headers, timestamp, now, codecs.codec_id(cfg.compression),
            _producer_fields(_producer),
        )  # fmt: skip
        check_size(batch, cfg, topic)
        if _producer is not None:
            base, dup = self._write_idempotent(part, [batch], _producer)
            if dup is not None:
                return RecordMetadata(topic, partition, base, dup.max_timestamp, None, True)
        else:
            base = self._write(part, batch)
        uids = batch.uids
        uid = uid_text(uids) if uids is not None and uids != bytes(16) else None
        md = RecordMetadata(topic, partition, base, batch.max_timestamp, uid)
        if self._tracer is not None and uid is not None and not topic.startswith("__"):
            self._tracer.record([TraceEvent(uid, "appended", now, topic, partition, base)])
        return md

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
        _producer: tuple[int, int, int] | None = None,
    ) -> BatchMetadata: ...

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
    ) -> BatchMetadata: ...

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
    ) -> list[BatchMetadata]: ...

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
        _producer: tuple[int, int, int] | None = None,
    ) -> BatchMetadata | list[BatchMetadata] | list[PendingMetadata]:
        """Append messages as one Kafka record batch with consecutive offsets.

        A batch above the topic's max_message_bytes is split into several batches (still
        consecutive offsets); a single message above it is refused. `partition=None` routes by
        key like Kafka's producer: with keys, the messages are grouped per partition and a list
        of BatchMetadata (one per partition, ascending) comes back; without keys the whole batch
        goes to the next partition in round robin. `deliver_at`/`delay_ms` (one int for the
        batch or one per message) park the messages in the timer log: a list of
        PendingMetadata, one per message, comes back (docs/consume.md). Internal topics (`__`
        names) are refused: InternalTopicError.
        """
        self._check_writable()
        refuse_internal(topic)
        self._parts(topic, create=True)  # auto-creates the topic when allowed
        values = values if type(values) is list else list(values)
        if tags is not None or properties is not None or unique_ids is not None:
            headers = self._merged_headers(len(values), headers, tags, properties, unique_ids)
        if deliver_at is not None or delay_ms is not None:
            return self._delayed(topic, values, keys, headers, partition, timestamps,
                                 deliver_at, delay_ms)  # fmt: skip
        if partition is None and keys is not None:
            return self._append_routed(
                topic,
                values,
                keys,
                headers,
                timestamps,
                compression,
                self._configs[topic].partitions,
            )
        if partition is None:
            partition = self._choose_partition(topic, None, self._configs[topic].partitions)
        return self._write_batch(topic, values, keys, headers, partition, timestamps, compression,
                                 _producer)  # fmt: skip

    def _append_internal(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int = 0,
        timestamps: Sequence[int] | None = None,
    ) -> BatchMetadata:
        """Append to internal topic `topic` (made by _internal_topic): the write path of
        mqcore's own state (consume/), which the public appends refuse."""
        if not is_internal(topic):
            raise InvalidConfigError(f"_append_internal is for internal topics, not {topic!r}")
        self._check_writable()
        return self._write_batch(topic, list(values), keys, headers, partition, timestamps)

    def _write_batch(
        self,
        topic: str,
        values: list[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[HeadersArg] | None,
        partition: int,
        timestamps: Sequence[int] | None,
        compression: str | None = None,
        _producer: tuple[int, int, int] | None = None,
    ) -> BatchMetadata:
        """Encode and write one partition's batch (split to fit max_message_bytes)."""
        part = self._partition(topic, partition)
        cfg = part.config
        codec = codecs.codec_id(compression if compression is not None else cfg.compression)
        now = _now_ms()
        batches = self._encode_fitting(
            values, keys, headers, timestamps, now, codec, cfg, topic, _producer
        )
        if _producer is not None:
            base, dup = self._write_idempotent(part, batches, _producer)
            if dup is not None:
                return BatchMetadata(partition, base, len(values), topic, None, True)
        else:
            with part._lock:  # consecutive offsets across the pieces of a split batch
                base = self._write(part, batches[0])
                for extra in batches[1:]:
                    self._write(part, extra)
        uids = batches[0].uids
        if uids is not None and len(batches) > 1:
            uids = b"".join(b.uids or b"" for b in batches)
        md = BatchMetadata(partition, base, len(values), topic, uids)
        if self._tracer is not None and uids is not None and not topic.startswith("__"):
            self._tracer.record(
                TraceEvent(uid, "appended", now, topic, partition, base + i)
                for i, uid in enumerate(md.unique_ids)
                if uid is not None
            )
        return md

    @staticmethod
    def _merged_headers(
        n: int,
        headers: Sequence[HeadersArg] | None,
        tags: Sequence[str | None] | None,
        properties: Sequence[Mapping[str, object] | None] | None,
        unique_ids: Sequence[str | None] | None,
    ) -> list[Any]:
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

    def _append_routed(
        self,
        topic: str,
        values: list[bytes | None],
        keys: Sequence[bytes | None],
        headers: Sequence[HeadersArg] | None,
        timestamps: Sequence[int] | None,
        compression: str | None,
        count: int,
    ) -> list[BatchMetadata]:
        if len(keys) != len(values):
            raise InvalidRecordError(f"{len(keys)} keys for {len(values)} values")
        groups: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(self._choose_partition(topic, k, count), []).append(i)
        out = []
        for p in sorted(groups):
            idx = groups[p]
            md = self.append_batch(
                topic,
                [values[i] for i in idx],
                [keys[i] for i in idx],
                None if headers is None else [headers[i] for i in idx],
                p,
                None if timestamps is None else [timestamps[i] for i in idx],
                compression,
            )
            out.append(md)
        return out

    def _encode_fitting(
        self,
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
        """Encode into batches of at most max_message_bytes (an idempotent producer's pieces get
        consecutive sequences).

        Uncompressed, the encoder stops at the first record that does not fit and the next
        batch starts there, so every record is encoded once. A compressed size is known only
        afterwards: such a batch is halved until its pieces fit.
        """
        if keys is not None and len(keys) != len(values):
            raise InvalidRecordError(f"{len(keys)} keys for {len(values)} values")
        batches: list[EncodedBatch] = []
        start, n = 0, len(values)
        while start < n or not batches:  # an empty batch: the encoder's error
            batch = encode_batch(
                values if start == 0 else values[start:],
                _slice(keys, start),
                _slice(headers, start),
                _slice(timestamps, start),
                now,
                codec,
                self._log_append_time(cfg, now),
                *_producer_fields(_advanced(producer, start)),
                compress=codecs.compress,
                uid_ms=now if cfg.unique_ids else -1,
                index=cfg.key_index,
                max_bytes=cfg.max_message_bytes,
            )
            if batch.size > cfg.max_message_bytes and batch.count > 1:
                half = start + batch.count // 2  # compressed: halve, each half fits or halves
                batches += self._encode_fitting(
                    values[start:half],
                    _slice(keys, start, half),
                    _slice(headers, start, half),
                    _slice(timestamps, start, half),
                    now,
                    codec,
                    cfg,
                    topic,
                    _advanced(producer, start),
                )
                start = half
                continue
            check_size(batch, cfg, topic)
            batches.append(batch)
            start += batch.count
        return batches

    @staticmethod
    def _log_append_time(cfg: TopicConfig, now: int) -> int:
        return now if cfg.timestamp_type == "LogAppendTime" else -1

    def _write(self, part: Partition, batch: EncodedBatch) -> int:
        base = part.append(batch)
        appends = self._topic_appends  # lets a consumer skip a topic it found drained
        appends[part.topic] = appends.get(part.topic, 0) + 1
        if self._flusher is not None and part.unflushed_messages >= self.flush_policy.messages:
            self._flusher.wake()
        consume = self._consume
        if consume is not None and consume.waiters:
            consume.wake()  # a poll waits for data (consume/consumer.py)
        return base

    # -- consumer groups (mqcore/consume/: consumer.py, group.py, offsets.py, retry.py) ---------

    _consume: ConsumeState | None = None  # created by the first consumer()

    def consumer(
        self,
        group: str,
        topics: str | Sequence[str],
        tag: str | None = None,
        where: str | None = None,
        **options: Any,
    ) -> Consumer:
        """A member of consumer group `group` reading `topics` (and the group's retry topic),
        with an optional tag and SQL92 filter; see docs (consumers) for `options`."""
        from mqcore.consume.consumer import Consumer
        from mqcore.consume.group import ConsumeState
        from mqcore.consume.offsets import OffsetStore

        self._check_writable()
        with self._lock:
            if self._consume is None:
                self._consume = ConsumeState(OffsetStore(self), self.partitions)
        return Consumer(self, self._consume, group, topics, tag, where, **options)

    def group_lag(self, group: str | None = None) -> dict[str, list[PartitionLag]]:
        """Committed offset, end offset and lag of each partition every group (or `group`)
        committed, from `__consumer_offsets`; {} when nothing was committed. Read-only it is
        the state as of the open, so it works beside the writer (`mqcore groups`). Members
        are not listed: groups coordinate inside the writer's process and store no membership
        (docs/consume.md "Consumer groups")."""
        from mqcore.consume.group import group_lags, validate_group
        from mqcore.consume.offsets import OffsetStore

        self._check_open()
        if group is not None:
            validate_group(group)
        consume = self._consume
        offsets = (OffsetStore(self) if consume is None else consume.offsets).all_offsets()
        if group is not None:
            offsets = {k: v for k, v in offsets.items() if k[0] == group}
        return group_lags(offsets, self._end_or_none)

    def _end_or_none(self, topic: str, partition: int) -> int | None:
        part = self._partitions.get(topic, {}).get(partition)
        return None if part is None else part.end_offset

    def _choose_partition(self, topic: str, key: object, count: int) -> int:
        """murmur2(key) like Kafka's default partitioner; round robin for null keys."""
        if key is not None:
            if isinstance(key, str):
                raise InvalidRecordError("keys must be bytes-like or None, not str")
            try:
                return int(kafka_partition(key, count))  # type: ignore[arg-type]
            except TypeError:
                raise InvalidRecordError(
                    f"keys must be bytes-like or None, not {type(key).__name__}"
                ) from None
        counter = self._round_robin.setdefault(topic, itertools.count())
        return next(counter) % count

    # -- transactions and delayed messages (consume/transactions.py, consume/delay.py) ---------

    def _txn_delay_setup(self, options: Any) -> None:
        self._txns = TransactionManager(self, options)
        self._delays = DelayManager(self, options)
        if not self.read_only:
            self._txns.register()
            self._delays.register()

    def begin(self, transaction_id: str | None = None) -> Transaction:
        """Start a transaction: its messages stay in `__txn_half` until commit() (a context
        manager: commit on a clean exit, rollback on an exception)."""
        return self._txns.begin(transaction_id)

    def set_transaction_checker(self, fn: Callable[[TransactionInfo], str] | None) -> None:
        """Register fn(TransactionInfo) -> "commit" | "rollback" | "unknown", asked about
        transactions left unresolved for transaction_timeout_ms (e.g. by a crashed producer)."""
        if fn is not None and not callable(fn):
            raise InvalidConfigError(f"the transaction checker must be callable, not {fn!r}")
        self._txns.checker = fn

    def check_transactions(self, now: int | None = None) -> dict[str, str]:
        """Resolve what can be resolved now (`now` in ms, default the clock): roll forward
        interrupted commits, check back timed-out transactions. {transaction id: outcome}."""
        return self._txns.check(now)

    def deliver_due(self, now: int | None = None) -> int:
        """Deliver every delayed message due at `now` (ms, default the clock); how many."""
        return self._delays.deliver_due(now)

    def _delayed(self, topic: str, values: Sequence[bytes | None], keys: Any, headers: Any,
                 partition: int | None, timestamps: Any, deliver_at: Any,
                 delay_ms: Any) -> list[PendingMetadata]:  # fmt: skip
        opts = self._delays.options
        due = check_delay(deliver_at, delay_ms, _now_ms(), opts.delay_max_ms, len(values))
        assert due is not None
        return self._delays.append(topic, values, keys, headers, partition, timestamps, due)

    # -- idempotent producers (mqcore/consume/producer.py, storage/producer_state.py) ----------

    def producer(self, producer_id: int | None = None, epoch: int = 0) -> Producer:
        """An idempotent producer: stamps (producer id, epoch, sequence) on every batch, so the
        log refuses duplicates and gaps. `producer_id=None` allocates a fresh id, durably, never
        handed out again; an epoch older than one the log has seen for the id is fenced."""
        self._check_writable()
        with self._lock:
            states = [p.producer_state for ps in self._partitions.values() for p in ps.values()]
            if producer_id is None:
                seen = [pid for st in states if st for pid in st.producers]
                producer_id = max([self._dir.load_next_producer_id(), *(i + 1 for i in seen)])
                self._dir.save_next_producer_id(producer_id + 1)
            check_producer_fields(producer_id, epoch)
            epochs = [st.known_epoch(producer_id) for st in states if st]
            known = max((e for e in epochs if e is not None), default=-1)
            if epoch < known:
                raise ProducerFencedError(
                    f"producer {producer_id} epoch {epoch} is fenced: the log has epoch {known}"
                )
            if producer_id >= self._dir.load_next_producer_id():
                self._dir.save_next_producer_id(producer_id + 1)  # never allocate a used id
        return Producer(self, producer_id, epoch)

    def _write_idempotent(
        self, part: Partition, batches: list[EncodedBatch], producer: tuple[int, int, int]
    ) -> tuple[int, BatchRecord | None]:
        """Check the producer's sequence and write, under the partition lock."""
        if part.producer_state is None:
            raise ReadOnlyStoreError(f"{part.topic}-{part.partition} keeps no producer state")
        with part._lock:
            return part.producer_state.append(batches, *producer, lambda b: self._write(part, b))

    # -- querying (mqcore/query/engine.py) ------------------------------------------------------

    def _query_parts(self, topic: str, partition: int | None) -> list[Partition]:
        if self._closed or self._flusher is not None:
            self._check_open()
        parts = self._partitions.get(topic)
        if parts is None or partition is not None:
            parts = self._parts(topic)  # raises for a topic the store does not hold
            if partition is not None:
                return [self._partition(topic, partition)]
        if len(parts) == 1:
            return list(parts.values())
        return [parts[p] for p in sorted(parts)]

    def get_by_id(self, msg_id: str) -> Message | None:
        """The message a store ID names, or None when it is not (or no longer) there."""
        if self._closed or self._flusher is not None:
            self._check_open()
        return lookup.get_by_id(self._partitions, msg_id, decode_msg_id, MAX_DECOMPRESSED)

    def find_by_unique_id(
        self, unique_id: str, *, start: int | None = None, end: int | None = None, limit: int = 1
    ) -> QueryResult:
        """Messages carrying this unique ID, in any topic that keeps a key index (normally
        one message)."""
        self._check_open()
        parts = [self._partitions[t][p] for t in sorted(self._partitions)
                 if self._configs[t].key_index
                 for p in sorted(self._partitions[t])]  # fmt: skip
        return engine.find_unique(parts, unique_id, start, end, limit)

    def find_by_key(
        self,
        topic: str,
        key: bytes | str,
        *,
        start: int | None = None,
        end: int | None = None,
        limit: int = 1000,
        partition: int | None = None,
        cursor: str | None = None,
    ) -> QueryResult:
        """Messages whose key (or a word of their `keys` header) equals `key`, from the key
        index, each checked against the stored record."""
        # all of a topic's partitions, in number order (the kernel orders a dict of them), or
        # _query_parts' checks and errors
        parts: list[Partition] | dict[int, Partition] | None = self._partitions.get(topic)
        if parts is None or partition is not None or self._closed or self._flusher is not None:
            parts = self._query_parts(topic, partition)
        if not self._configs[topic].key_index:
            raise InvalidConfigError(
                f"topic {topic!r} keeps no key index (key_index=False): find_by_key needs it; "
                "search() scans instead"
            )
        return engine.find_indexed(parts, key, lookup.KEY_KIND, start, end, limit, cursor)

    def range(
        self,
        topic: str,
        start: int | None = None,
        end: int | None = None,
        partition: int | None = None,
        *,
        limit: int = 1000,
        max_scan: int = 10_000_000,
        timeout: float | None = None,
        cursor: str | None = None,
        start_ts: int | None = None,
        end_ts: int | None = None,
    ) -> QueryResult:
        """Messages with start <= timestamp < end, in ms since the epoch (None: unbounded), in
        any order of timestamps in the log: search() with only the time filter. `start_ts` and
        `end_ts` are the deprecated names of `start` and `end` (removed in the next release)."""
        start = engine.renamed("range", "start", start, "start_ts", start_ts)
        end = engine.renamed("range", "end", end, "end_ts", end_ts)
        return self.search(
            topic,
            partition=partition,
            start=start,
            end=end,
            limit=limit,
            max_scan=max_scan,
            timeout=timeout,
            cursor=cursor,
        )

    def search(
        self,
        topic: str,
        contains: bytes | str | None = None,
        regex: str | bytes | None = None,
        tag: str | None = None,
        where: str | None = None,
        partition: int | None = None,
        *,
        start: int | None = None,
        end: int | None = None,
        limit: int = 1000,
        max_scan: int = 10_000_000,
        timeout: float | None = None,
        cursor: str | None = None,
    ) -> QueryResult:
        """Messages whose value contains `contains` / matches `regex`, with tag `tag`, whose
        properties satisfy the SQL92 selector `where`, within [start, end) ms."""
        spec = engine.make_spec(start, end, contains, regex, tag, where)
        return engine.run_scan(
            self._query_parts(topic, partition), spec, limit, max_scan, timeout, cursor
        )

    def trace(self, unique_id: str) -> list[TraceEvent]:
        """What happened to the message with this unique ID, oldest event first: appended,
        delivered to a group, committed, nacked, retried, dead-lettered (needs `trace=` on)."""
        self._check_open()
        return Tracer(self, 0.0).events(unique_id)

    # -- reading --------------------------------------------------------------------------------

    def read(
        self, topic: str, partition: int = 0, offset: int = 0, max_records: int = 500
    ) -> list[Message]:
        """Up to max_records messages from `offset` on (offset == end_offset gives [])."""
        part = self._partition(topic, partition)
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 0:
            raise InvalidConfigError(f"max_records must be an int >= 0, not {max_records!r}")
        return part.read(offset, max_records, self.verify_crc)

    def get(self, topic: str, partition: int, offset: int) -> Message | None:
        """The message at `offset`, or None when there is none there."""
        part = self._partition(topic, partition)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise OffsetOutOfRangeError(f"offset must be an int, not {type(offset).__name__}")
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset} is negative")
        return part.get(offset, self.verify_crc)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The earliest offset whose timestamp is >= `timestamp` (ms), or None."""
        return self._partition(topic, partition).offset_for_time(timestamp, self.verify_crc)

    def start_offset(self, topic: str, partition: int = 0) -> int:
        return self._partition(topic, partition).start_offset

    def end_offset(self, topic: str, partition: int = 0) -> int:
        return self._partition(topic, partition).end_offset

    def segment_offsets(self, topic: str, partition: int = 0) -> list[int]:
        """Base offsets of the partition's segments, oldest first (where Spark splits a read)."""
        part = self._partition(topic, partition)
        with part._lock:
            return [seg.base_offset for seg in part.segments]

    def iter_arrow(
        self,
        topic: str,
        partition: int = 0,
        start: int = 0,
        end: int | None = None,
        *,
        include_headers: bool = False,
        max_records: int = 65536,
        max_bytes: int = 64 << 20,
    ) -> Iterator[pa.RecordBatch]:
        """RecordBatches of offsets [start, end) in bounded pieces (Spark-sized)."""
        part = self._partition(topic, partition)
        stop = part.end_offset if end is None else end
        if stop < start:
            raise OffsetOutOfRangeError(f"end offset {stop} is before start offset {start}")
        if start < stop:
            part.check_offset(start)
        offset = start
        while offset < stop:
            cols = new_columns(include_headers)
            offset, done = self._fill(part, cols, offset, stop - 1, max_records, max_bytes)
            if cols.num_rows:
                yield to_record_batch(cols, topic, partition)
            if done:
                break

    def iter_arrow_holding(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        needle: bytes,
        *,
        include_headers: bool = False,
        max_records: int = 65536,
        max_bytes: int = 64 << 20,
    ) -> Iterator[pa.RecordBatch]:
        """iter_arrow of [start, end) that decodes only the batches holding a value that
        contains `needle`, each from the first such record on (the search kernel passes the
        other batches over): a superset of the matching records, which the caller filters."""
        if not needle:  # every non-null value holds it
            limits = {"max_records": max_records, "max_bytes": max_bytes}
            yield from self.iter_arrow(
                topic, partition, start, end, include_headers=include_headers, **limits
            )
            return
        part = self._partition(topic, partition)
        if end < start:
            raise OffsetOutOfRangeError(f"end offset {end} is before start offset {start}")
        if start < end:
            part.check_offset(start)
        offset = start
        while offset < end:
            cols = new_columns(include_headers)
            offset, done = engine.fill_holding(
                part, cols, bytes(needle), offset, end - 1, max_records, max_bytes, self.verify_crc
            )
            if cols.num_rows:
                yield to_record_batch(cols, topic, partition)
            if done:
                break

    def key_spans(
        self, topic: str, partition: int, key: bytes | str, start: int, end: int
    ) -> list[tuple[int, int]]:
        """Offset spans [lo, hi) in [start, end) holding every message whose key may be `key`,
        from the key index (a superset, to be checked); segments without a key index, or with
        many candidates, come back whole. Only the key tables are read."""
        _raw, hashed = engine.key_hash(key)
        return engine.key_spans(
            self._partition(topic, partition), hashed, start, end, engine.KEY_SPAN_MAX_HITS
        )

    def _fill(
        self, part: Partition, cols: Any, offset: int, last: int, max_rows: int, max_bytes: int
    ) -> tuple[int, bool]:
        state: dict[str, Any] = {"next": offset, "done": True}

        def decode(buf: memoryview, file_pos: int, seg: Any) -> tuple[int, bool]:
            pos, nxt, past, full = cols.add(
                buf,
                0,
                state["next"],
                last,
                max_rows,
                max_bytes,
                self.verify_crc,
                seg.log_path,
                file_pos,
            )
            state["next"] = nxt
            if full:
                state["done"] = False
            return pos, past or full or nxt > last

        part.scan(offset, decode)
        return int(state["next"]), bool(state["done"]) or state["next"] > last

    def read_arrow(
        self,
        topic: str,
        partition: int = 0,
        start: int = 0,
        end: int | None = None,
        *,
        include_headers: bool = False,
    ) -> pa.RecordBatch:
        """Offsets [start, end) as one RecordBatch in Spark's Kafka-source schema."""
        import pyarrow as pa

        from mqcore.arrow import kafka_schema

        batches = list(
            self.iter_arrow(
                topic,
                partition,
                start,
                end,
                include_headers=include_headers,
                max_records=1 << 30,
                max_bytes=(1 << 31) - 2,
            )
        )
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=kafka_schema(include_headers))
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]

    # -- retention and compaction (storage/retention.py, storage/cleaner.py) -------------------

    def _register_maintenance(self) -> None:
        retention_ms, compaction_ms = self._maintenance_intervals
        self._tasks.add("retention", retention_ms, self.apply_retention)
        self._tasks.add("compaction", compaction_ms, self._compact_dirty)

    def _maintained(self, topic: str | None, wanted: Callable[[str], bool]) -> list[Partition]:
        """Partitions of `topic` (or of every topic) whose cleanup policy `wanted` accepts; never
        those of the topics trimmed by resolution, whatever their stored settings say (a store
        made by an older mqcore created them with the store's topic defaults)."""
        self._check_writable()
        with self._lock:  # a topic created meanwhile waits for the next pass
            topics = sorted(self._partitions) if topic is None else [topic]
            return [
                part
                for t in topics
                for _, part in sorted(self._parts(t).items())
                if wanted(self._configs[t].cleanup_policy) and t not in TRIMMED_BY_RESOLUTION
            ]

    def apply_retention(
        self,
        topic: str | None = None,
        *,
        now: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> RetentionReport:
        """Delete expired whole segments (by retention_ms and retention_bytes) of `topic`, or of
        every topic whose cleanup_policy has "delete"; the log start offsets move forward.
        `progress(done, total)` is called per partition, counted in segments. The internal
        topics of transactions and delays are trimmed by resolution instead: the prefix whose
        transactions are all resolved, whose delayed messages are all delivered."""
        parts = self._maintained(topic, retention.applies)
        report = retention.apply(parts, _now_ms() if now is None else now, progress)
        if topic is None or topic in (HALF_TOPIC, OP_TOPIC):
            report.merge(self._txns.trim())
        if topic is None or topic in (DELAY_TOPIC, DELAY_STATE_TOPIC):
            report.merge(self._delays.trim())
        return report

    def compact(
        self,
        topic: str,
        *,
        now: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> CompactionReport:
        """Compact a topic whose cleanup_policy has "compact": keep the latest record per key,
        tombstones until delete_retention_ms after the pass that first saw them; offsets never
        change. `progress(done, total)` is called per sealed segment."""
        if not cleaner.applies(self.topic_config(topic).cleanup_policy):
            raise InvalidConfigError(
                f"topic {topic!r} has cleanup_policy={self._configs[topic].cleanup_policy!r}; "
                "compaction needs 'compact' or 'compact,delete'"
            )
        parts = self._maintained(topic, cleaner.applies)
        return cleaner.compact(parts, _now_ms() if now is None else now, self.verify_crc, progress)

    def dirty_ratio(self, topic: str, partition: int = 0) -> float:
        """Share of the partition's sealed bytes no compaction pass has cleaned yet."""
        return cleaner.dirty_ratio(self._partition(topic, partition))

    def _compact_dirty(self, now: int | None = None) -> CompactionReport:
        """The background task: compact each partition whose dirty ratio reached its topic's
        min_cleanable_dirty_ratio."""
        report = CompactionReport()
        for part in self._maintained(None, cleaner.applies):
            ratio = cleaner.dirty_bytes(part)
            if ratio[1] and ratio[0] / ratio[1] >= part.config.min_cleanable_dirty_ratio:
                report.merge(
                    cleaner.compact(
                        [part], _now_ms() if now is None else now, self.verify_crc, None
                    )
                )
        return report

    # -- durability -----------------------------------------------------------------------------

    def flush(self) -> None:
        """fdatasync every partition and advance the recovery checkpoint."""
        self._check_writable()
        self._flush_quietly()
        self._checkpoint()

    def _flush_quietly(self) -> None:
        for parts in list(self._partitions.values()):
            for part in list(parts.values()):
                if not part.closed:
                    part.flush()

    def _checkpoint(self) -> None:
        points = {
            (t, p.partition): p.recovery_point
            for t, parts in self._partitions.items()
            for p in parts.values()
        }
        self._dir.save_recovery_points(points)


def _maintenance_intervals(retention_ms: object, compaction_ms: object) -> tuple[int, int]:
    for name, value in (
        ("retention_check_interval_ms", retention_ms),
        ("compaction_check_interval_ms", compaction_ms),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**40:
            raise InvalidConfigError(f"{name} must be an int in [1, 2**40], not {value!r}")
    return int(retention_ms), int(compaction_ms)  # type: ignore[call-overload]


def open(path: str, **options: Any) -> Store:  # noqa: A001 - mirrors io.open for stores
    """Open the store at `path`, making one there when it is not a store yet (as
    sqlite3.connect does). With `create=False` or `read_only=True` nothing is created: a path
    that is not a store raises NotAStoreError. See Store for the options."""
    return Store(path, **options)
