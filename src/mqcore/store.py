"""The public Store: the facade users import (`mqcore.open()`). It composes the log
(mqcore.log.Log: files, partitions, appends, recovery, flushing) with the consumption model
(consume/, produce/) and the query engine. What is on disk after each append under each flush
policy is the log's promise: log/manager.py and docs/operations.md "Durability".
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mqcore._ext import lookup
from mqcore._ext.batch import Message
from mqcore._ext.lookup import KEY_KIND
from mqcore.arrow import new_columns, to_record_batch
from mqcore.clock import Clock, now_ms
from mqcore.config import (
    REQUEST_PARTITIONS,
    TOPIC_PARTITIONS,
    FlushPolicy,
    PartitionLimits,
    TopicConfig,
    validate_name,
)
from mqcore.consume.expiry import OFFSETS_RETENTION_MS, RETENTION_CHECK_MS, GroupExpiry
from mqcore.errors import (
    GroupNotEmptyError,
    GroupTypeError,
    InvalidConfigError,
    OffsetOutOfRangeError,
)
from mqcore.log.append import (
    RESERVED_HEADERS,
    BatchMetadata,
    HeadersArg,
    RecordMetadata,
    check_message,
    check_size,
    encode_one,
    message_headers,
)
from mqcore.log.internal import SkippedRecord, refuse_internal
from mqcore.log.manager import Log
from mqcore.log.trace import TraceEvent, Tracer, sample_rate
from mqcore.produce.delay import DELAY_STATE_TOPIC, DELAY_TOPIC, DelayManager, pop_options
from mqcore.produce.producer import Producer
from mqcore.produce.sender import Outgoing, Sender, append_plain, no_sequence, write_one
from mqcore.produce.transactions import (
    HALF_TOPIC,
    OP_TOPIC,
    Transaction,
    TransactionInfo,
    TransactionManager,
)
from mqcore.query import engine
from mqcore.query.engine import QueryResult
from mqcore.query.ids import decode_msg_id
from mqcore.query.keyed import find_indexed
from mqcore.query.keyfilter import run_key_search
from mqcore.query.merge import run_time_scan
from mqcore.storage import cleaner, retention
from mqcore.storage.cleaner import CompactionReport
from mqcore.storage.partition import Partition
from mqcore.storage.retention import RetentionReport
from mqcore.storage.segment import MAX_DECOMPRESSED
from mqcore.storage.txnindex import READ_UNCOMMITTED, check_isolation

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore.consume.consumer import Consumer
    from mqcore.consume.group import ConsumeState, PartitionLag
    from mqcore.consume.offsets import OffsetStore
    from mqcore.consume.pulllog import PullEntry
    from mqcore.consume.share import RecordSource, ShareConsumer, ShareGroups, ShareLag
    from mqcore.consume.sharestate import ShareStateStore

# the parked logs of transactions and delays and their bookkeeping: trimmed by resolution
# (produce/trim.py), never by retention or compaction
TRIMMED_BY_RESOLUTION = frozenset({HALF_TOPIC, OP_TOPIC, DELAY_TOPIC, DELAY_STATE_TOPIC})

__all__ = [
    "RESERVED_HEADERS",
    "BatchMetadata",
    "HeadersArg",
    "QueryResult",
    "RecordMetadata",
    "Store",
    "check_message",
    "check_size",
    "encode_one",
    "message_headers",
    "open",
]


def committed_only(parts: Sequence[Partition], messages: list[Message]) -> list[Message]:
    """The `messages` (of `parts`) a read_committed reader sees: each partition's below its
    last stable offset and outside its aborted transactions' batches."""
    by_number = {p.partition: p for p in parts}
    spans: dict[int, list[tuple[int, int]]] = {}
    for m in messages:
        if m.partition not in spans:
            offsets = [x.offset for x in messages if x.partition == m.partition]
            part = by_number[m.partition]
            spans[m.partition] = part.committed_spans(min(offsets), max(offsets) + 1)
    return [m for m in messages if any(a <= m.offset < b for a, b in spans[m.partition])]


def committed_result(parts: Sequence[Partition], result: QueryResult) -> QueryResult:
    """`result` with only what a read_committed reader sees (a page may then hold fewer than
    its limit; its cursor is the same)."""
    if result.messages:
        result.messages = committed_only(parts, result.messages)
    return result


class Store(Sender[RecordMetadata, BatchMetadata, list[BatchMetadata]]):
    """A directory of topics and partitions of Kafka v2 segments. Use `mqcore.open()`.

    `append` and `append_batch` are defined once for the Store, producers and transactions
    (produce/sender.py); the Store's send hooks append plain batches."""

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
        clock: Clock = now_ms,
        max_partitions: int | None = None,
        max_partitions_per_topic: int = TOPIC_PARTITIONS,
        max_partitions_per_request: int = REQUEST_PARTITIONS,
        offsets_retention_ms: int = OFFSETS_RETENTION_MS,
        offsets_retention_check_interval_ms: int = RETENTION_CHECK_MS,
        **topic_defaults: Any,
    ):
        rate = sample_rate(trace)
        txn_delay_options = pop_options(topic_defaults)  # produce/delay.py TxnDelayOptions
        # a group's first member and the check of the group's type (group_type) are one step
        self._group_types = threading.Lock()
        # coordinators above the store that hold consumer-group members of their own
        # (add_member_source: mqcore serve's Kafka group coordinator)
        self._member_sources: list[Callable[[str], int]] = []
        intervals = _maintenance_intervals(
            retention_check_interval_ms, compaction_check_interval_ms
        )
        self._expiry = GroupExpiry(
            offsets_retention_ms, offsets_retention_check_interval_ms, clock
        )  # fmt: skip
        self.log = Log(
            path,
            read_only=read_only,
            create=create,
            flush_policy=FlushPolicy(flush, flush_interval_ms, flush_messages),
            verify_crc=verify_crc,
            auto_create_topics=auto_create_topics,
            topic_defaults=TopicConfig(partitions=default_partitions).with_changes(
                **topic_defaults
            ),
            max_open_segments=max_open_segments,
            full_recovery=full_recovery,
            clock=clock,
            limits=PartitionLimits(
                max_partitions_per_request, max_partitions_per_topic, max_partitions
            ),
        )
        self._tracer = Tracer(self.log, rate) if rate > 0 else None
        if self._tracer is not None:
            self.log.add_append_listener(self._tracer.on_append)
        try:
            if not read_only:
                retention_ms, compaction_ms = intervals
                self.log.tasks.add("retention", retention_ms, self.apply_retention)
                self.log.tasks.add("compaction", compaction_ms, self._compact_dirty)
                if self._expiry.check_interval_ms > 0:
                    self.log.tasks.add(
                        "group_expiry", self._expiry.check_interval_ms, self.expire_groups
                    )
                self.log.start_tasks()
            self._txn_delay_setup(txn_delay_options)
        except BaseException:
            self.log.close()
            raise

    # the log's settings and open report, as Store attributes (they were defined here first)
    path = property(lambda self: self.log.path)
    read_only = property(lambda self: self.log.read_only)
    flush_policy = property(lambda self: self.log.flush_policy)
    verify_crc = property(lambda self: self.log.verify_crc)
    auto_create_topics = property(lambda self: self.log.auto_create_topics)
    topic_defaults = property(lambda self: self.log.topic_defaults)
    recovery = property(lambda self: self.log.recovery)
    stray_directories = property(lambda self: self.log.stray_directories)
    missing_partitions = property(lambda self: self.log.missing_partitions)

    def close(self) -> None:
        """Flush everything, seal active segments, write checkpoints and the clean marker."""
        self.log.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # a store dropped without close(): warn like an unclosed file, then close what we can
        # (at interpreter exit the directory or the modules we need may already be gone)
        log = getattr(self, "log", None)
        if log is not None and not log.closed:
            warnings.warn(f"store {self.path} was not closed", ResourceWarning, stacklevel=1)
            with contextlib.suppress(Exception):
                self.close()

    # -- topics ---------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int | None = None, **config: Any) -> None:
        """Create a topic (idempotent when it exists with the same partition count).

        `config` takes TopicConfig fields (segment_bytes, segment_ms, max_message_bytes,
        timestamp_type, compression, retention_ms, ...); unset ones come from the store defaults.
        A name starting with `__` is internal (InternalTopicError): mqcore creates those. Past
        a bound on partitions (the options max_partitions, max_partitions_per_topic,
        max_partitions_per_request): PartitionLimitError. All or nothing: a failure partway
        (EMFILE, ENOSPC) leaves no directory and no open file of the topic.
        """
        self.log.check_writable()
        validate_name(name)
        refuse_internal(name, "create")
        self.log.create_topic(name, partitions, **config)

    def new_topic_config(self, partitions: int | None = None, **config: Any) -> TopicConfig:
        """The settings create_topic(name, partitions, **config) gives a new topic: the store's
        defaults with `config` applied (validated: InvalidConfigError)."""
        return self.log.new_topic_config(partitions, **config)

    def alter_topic_config(self, topic: str, **changes: Any) -> TopicConfig:
        """Change settings of an existing topic; returns its new settings.

        The new settings are validated whole, written to `mqcore-topics.json` (durably, like
        create_topic) and then used by the topic's partitions: by the next append (size and
        timestamp checks, compression, unique IDs, timestamp type), the next roll (segment_ms,
        index_interval_bytes from the next segment) and the next retention or compaction pass.
        A setting fixed at creation (config.FIXED_AT_CREATION: the partition count and what
        sizes files already open) is refused with InvalidConfigError naming it. Internal topics
        are refused: InternalTopicError."""
        self.log.check_writable()
        refuse_internal(topic, "alter")
        return self.log.alter_topic_config(topic, **changes)

    def update_topic_config(
        self, topic: str, changes_of: Callable[[TopicConfig], dict[str, Any]]
    ) -> TopicConfig:
        """alter_topic_config(topic, **changes_of(current settings)), read and written with no
        other change of the topic between them (Kafka's IncrementalAlterConfigs APPEND and
        SUBTRACT of list settings)."""
        self.log.check_writable()
        refuse_internal(topic, "alter")
        return self.log.update_topic_config(topic, changes_of)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its messages (Kafka's DeleteTopics); the name may be created
        again afterwards, as a new topic whose offsets start at 0.

        Crash-safe: once mqcore-topics.json no longer lists it the deletion is done, and an
        open after a crash finishes removing its directories (docs/operations.md "Deleting a
        topic"). A reader or consumer of it gets UnknownTopicError from then on (a read in
        progress may end with StoreClosedError instead); retention, compaction and the flusher
        skip it. Consumer-group offsets of the topic stay until the group is deleted, as in
        Kafka. Internal topics are refused (InternalTopicError), unknown ones raise
        UnknownTopicError."""
        self.log.check_writable()
        refuse_internal(name, "delete")
        self.log.delete_topic(name)

    def add_partitions(self, topic: str, count: int, *, validate_only: bool = False) -> TopicConfig:
        """Grow `topic` to `count` partitions in all (Kafka's CreatePartitions); returns its new
        settings. The count only grows (InvalidConfigError naming the current count otherwise).
        Keys are routed by the partition count, so from now on a key may go to a different
        partition than its earlier messages: per-key order holds only within each era, as in
        Kafka. Internal topics are refused (InternalTopicError). `validate_only`: every check,
        no change (CreatePartitions' validate_only). Bounded and all or nothing as
        create_topic."""
        self.log.check_writable()
        refuse_internal(topic, "add partitions to")
        return self.log.add_partitions(topic, count, validate_only)

    def skipped_records(self) -> list[SkippedRecord]:
        """Records of internal topics that a reader could not parse and skipped (each also
        logged once as a warning): junk written by something other than mqcore."""
        return list(self.log.skipped.records)

    def topics(self) -> list[str]:
        return self.log.topics()

    def partitions(self, topic: str) -> int:
        """The topic's partition count (some may be absent from a Kafka log directory)."""
        return self.log.config(topic).partitions

    def available_partitions(self, topic: str) -> list[int]:
        """Partition numbers this store holds: all of them, except in a read-only store of a
        Kafka log directory that has only some partitions of the topic."""
        return sorted(self.log.partitions_of(topic))

    def topic_config(self, topic: str) -> TopicConfig:
        return self.log.config(topic)

    # -- appending: the send hooks of append and append_batch (produce/sender.py) -------------

    def _send_one(self, out: Outgoing) -> RecordMetadata:
        if out.sequence is not None:
            no_sequence(self, out.sequence)
        return write_one(self.log, out, None)

    def _send_batch(self, out: Outgoing) -> BatchMetadata:
        if out.sequence is not None:
            no_sequence(self, out.sequence)
        return append_plain(self.log, out, None)

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
        with an optional tag and SQL92 filter; see docs (consumers) for `options`.
        GroupTypeError when `group` is a share group."""
        from mqcore.consume.consumer import Consumer

        state = self._consume_state()
        with self._group_types:
            self._refuse_group_type(group, "share")
            return Consumer(self.log, state, self._tracer, group, topics, tag, where, **options)

    def group_type(self, group: str) -> str | None:
        """ "consumer" when `group` has committed offsets or members of a consumer group here
        (in this process or, through `add_member_source`, of `mqcore serve`'s Kafka clients),
        "share" when it has share-group state or members, None when the name is free. A name
        keeps its type until its consumer offsets are deleted (`delete_group`); a share group
        keeps it as long as its state does. Kafka keeps one type per group ID too."""
        from mqcore.consume.group import validate_group
        from mqcore.consume.offsets import OffsetStore

        self.log.check_open()
        validate_group(group)
        share = self._share
        if share is not None and share.has_members(group):
            return "share"
        if self.group_members(group):
            return "consumer"
        consume = self._consume
        offsets = OffsetStore(self.log) if consume is None else consume.offsets
        if any(key[0] == group for key in offsets.all_offsets()):
            return "consumer"
        return "share" if self._share_states().group_snapshots(group) else None

    def group_members(self, group: str) -> int:
        """How many members consumer group `group` has now: its `consumer()`s in this process
        and those of every member source (`add_member_source`). Members are not stored: a
        read-only store beside the writer sees none."""
        consume = self._consume
        coord = None if consume is None else consume.groups.get(group)
        here = 0 if coord is None else len(coord.members())
        return here + sum(source(group) for source in list(self._member_sources))

    def add_member_source(self, source: Callable[[str], int]) -> None:
        """Have `source(group)` (how many members of consumer group `group` it holds) counted
        by `group_members`, and so by `group_type`, `delete_group` and `alter_group_offsets`:
        a coordinator above the store (mqcore serve's, for its Kafka clients) registers itself,
        so a group whose members are elsewhere is neither taken for a free name nor reset
        under them. It is called with the store's group lock held (`delete_group`,
        `alter_group_offsets`, a new consumer's type check), so it must not call back into
        the store's group methods; it may take its own lock (reentrant, when the coordinator
        calls `group_type` while holding it, as mqcore serve's does)."""
        self._member_sources.append(source)

    def remove_member_source(self, source: Callable[[str], int]) -> None:
        """Stop counting `source` (its coordinator is closing)."""
        with contextlib.suppress(ValueError):
            self._member_sources.remove(source)

    def _refuse_group_type(self, group: str, other: str) -> None:
        if self.group_type(group) == other:
            asked = "consumer" if other == "share" else "share"
            raise GroupTypeError(
                f"group {group!r} is a {other} group here; a {asked} group needs another name"
            )

    def _consume_state(self) -> ConsumeState:
        """The groups' coordinators and committed offsets, made by the first use."""
        from mqcore.consume.group import ConsumeState
        from mqcore.consume.offsets import OffsetStore

        self.log.check_writable()
        with self.log.lock:
            if self._consume is None:
                state = self._consume = ConsumeState(OffsetStore(self.log), self.partitions)
                self.log.add_append_listener(state.on_append)
            return self._consume

    def offset_store(self) -> OffsetStore:
        """The committed offsets of every group (consume/offsets.py), the one instance that
        `consumer()` commits through: `mqcore serve` commits and fetches wire consumers'
        offsets through it, so both kinds of consumer, `group_lag()` and `mqcore groups` see
        the same offsets."""
        return self._consume_state().offsets

    def delete_group(self, group: str) -> int:
        """Delete every committed offset of `group` (one batch of tombstones in
        `__consumer_offsets`, durable when this returns), as Kafka's DeleteGroups; returns
        how many. Refused while the group has members (`group_members`): GroupNotEmptyError."""
        from mqcore.consume.group import validate_group

        validate_group(group)
        state = self._consume_state()
        with self._group_types:
            self._refuse_members(group, "deleting its offsets")
            return state.offsets.delete_group(group)

    def alter_group_offsets(
        self, group: str, offsets: Mapping[tuple[str, int], int], metadata: str = ""
    ) -> None:
        """Commit `offsets` ({(topic, partition): offset}, each with `metadata`) for consumer
        group `group` from outside it, as Kafka's AdminClient.alterConsumerGroupOffsets and
        `kafka-consumer-groups --reset-offsets`: one batch in `__consumer_offsets`, durable when
        this returns. Refused while the group has members, whose next commit would overwrite
        it (GroupNotEmptyError), and for a share group's name (GroupTypeError); an offset past
        its partition's end: OffsetOutOfRangeError."""
        from mqcore.consume.group import validate_group
        from mqcore.consume.offsets import OffsetAndMetadata

        validate_group(group)
        state = self._consume_state()
        stamp = self.log.clock()
        commits = {}
        for (topic, partition), offset in offsets.items():
            end = self.end_offset(topic, partition)
            if not 0 <= offset <= end:
                raise OffsetOutOfRangeError(
                    f"offset {offset} of {topic}-{partition} is outside 0..{end}"
                )
            commits[(topic, partition)] = OffsetAndMetadata(offset, metadata, stamp)
        with self._group_types:
            self._refuse_group_type(group, "share")
            self._refuse_members(group, "altering its offsets")
            state.offsets.commit(group, commits)

    def _refuse_members(self, group: str, doing: str) -> None:
        members = self.group_members(group)
        if members:
            raise GroupNotEmptyError(
                f"group {group!r} has {members} member{'s' * (members != 1)}; stop them before "
                f"{doing}"
            )

    def expire_groups(self, now: int | None = None) -> list[str]:
        """Delete the committed offsets of every consumer group abandoned for
        `offsets_retention_ms` (Kafka's offsets.retention.minutes, 7 days): no member now (in
        this process or of a member source), and none seen and no commit for the retention
        (consume/expiry.py says how it counts). Returns the groups expired; they leave
        group_lag(), `mqcore groups` and the Kafka listings. The background task
        "group_expiry" runs it every `offsets_retention_check_interval_ms`; expiry listeners
        (add_group_expiry_listener) hear of every pass."""
        from mqcore.consume.offsets import OFFSETS_TOPIC

        self.log.check_writable()
        if not self.log.has_topic(OFFSETS_TOPIC):
            return []
        state = self._consume_state()
        when = self.log.clock() if now is None else now
        with self._group_types:  # no member joins between the check and the tombstones
            expired = self._expiry.expire(state.offsets, self.group_members, when)
        self._expiry.tell(expired)
        return expired

    def add_group_expiry_listener(self, listener: Callable[[list[str]], None]) -> None:
        """Call `listener(expired)` after every expiry pass, with the groups whose offsets
        it deleted (maybe none): mqcore serve's coordinator forgets its empty groups."""
        self._expiry.listeners.append(listener)

    def remove_group_expiry_listener(self, listener: Callable[[list[str]], None]) -> None:
        with contextlib.suppress(ValueError):
            self._expiry.listeners.remove(listener)

    def group_lag(self, group: str | None = None) -> dict[str, list[PartitionLag]]:
        """Committed offset, end offset and lag of each partition every group (or `group`)
        committed, from `__consumer_offsets`; {} when nothing was committed. Read-only it is
        the state as of the open, so it works beside the writer (`mqcore groups`). Members
        are not listed: groups coordinate inside the writer's process and store no membership
        (docs/consume.md "Consumer groups")."""
        from mqcore.consume.group import group_lags, validate_group
        from mqcore.consume.offsets import OffsetStore

        self.log.check_open()
        if group is not None:
            validate_group(group)
        consume = self._consume
        offsets = (OffsetStore(self.log) if consume is None else consume.offsets).all_offsets()
        if group is not None:
            offsets = {k: v for k, v in offsets.items() if k[0] == group}
        return group_lags(offsets, self._end_or_none)

    _share: ShareGroups | None = None  # created by the first share_consumer()
    _states: ShareStateStore | None = None  # the share state, replayed once (_share_states)
    _share_source: RecordSource | None = None  # None: this store's own partitions
    _share_confirm: Callable[[], None] | None = None

    def host_share_groups(
        self, source: RecordSource, confirm: Callable[[], None] | None = None
    ) -> None:
        """Serve share groups from `source` instead of this store's partitions, and after each
        sync of their state call `confirm` (raising if the state is not safe): what a cluster's
        share coordinator does (`mqcore serve --coordinator`: each partition read from its
        leader below the high watermark, the state acknowledged once replicated). Forgets the
        share groups open so far (reset_share_groups)."""
        with self.log.lock:
            self._share_source, self._share_confirm = source, confirm
        self.reset_share_groups()

    def reset_share_groups(self) -> None:
        """Forget every open share group (their members are gone: they join again) and replay
        `__share_group_state` at its next use: its log changed under this store, as a
        cluster's broker's does when the share coordinator moves to or from it."""
        with self.log.lock:
            self._share = None
            self._states = None

    def _share_states(self) -> ShareStateStore:
        """The one replay of `__share_group_state` this store keeps: the open share groups'
        (which write through it), else one made on first use and handed to them later, so
        group_type (each JoinGroup and OffsetCommit of `mqcore serve`) and share_group_lag
        do not replay the topic at every call."""
        from mqcore.consume.sharestate import ShareStateStore

        with self.log.lock:
            if self._share is not None:
                return self._share.store
            if self._states is None:
                self._states = ShareStateStore(self.log)
            return self._states

    def share_consumer(
        self,
        group: str,
        topics: str | Sequence[str],
        tag: str | None = None,
        where: str | None = None,
        **options: Any,
    ) -> ShareConsumer:
        """A member of share group `group` reading `topics`: any number of members, each
        record acknowledged on its own (docs/consume.md "Share groups"; `options`: record_lock_ms,
        explicit_ack, delivery_count_limit, max_in_flight_records, dead_letter,
        auto_offset_reset)."""
        from mqcore.consume.share import ShareConsumer, ShareGroups

        state = self._consume_state()
        with self.log.lock:
            if self._share is None:
                self._share = ShareGroups(self.log, state, self._tracer, self._states,
                                          self._share_source, self._share_confirm)  # fmt: skip
            groups = self._share
        with self._group_types:
            self._refuse_group_type(group, "consumer")
            return ShareConsumer(self.log, groups, group, topics, tag, where, **options)

    def share_group_lag(self, group: str | None = None) -> dict[str, list[ShareLag]]:
        """Records available (never delivered, or released) and in flight (acquired) per
        share-partition of every share group (or `group`): live for groups open in this
        process, else from `__share_group_state` (read-only stores too)."""
        from mqcore.consume.group import validate_group
        from mqcore.consume.share import LogSource, share_lags

        self.log.check_open()
        if group is not None:
            validate_group(group)
        if self._share is not None:
            return self._share.lag(group)
        source = self._share_source or LogSource(self.log)
        return share_lags(source, self._share_states(), {}, group)

    def share_pull_log(
        self,
        group: str,
        *,
        member: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> list[PullEntry]:
        """A share group's pull log (`__pull.<group>`): each record a member received, in
        order, and how each ended, for the records not yet behind every share-partition's
        start. Narrowed to one member, or to one record (who got it, when, how many times,
        and how it ended). Read-only stores too."""
        from mqcore.consume.group import validate_group
        from mqcore.consume.pulllog import PullLog

        self.log.check_open()
        validate_group(group)
        if self._share is not None:
            self._share.write_pending(group)
        return [
            e
            for e in PullLog(self.log, group).entries()
            if (member is None or e.member == member)
            and (topic is None or e.topic == topic)
            and (partition is None or e.partition == partition)
            and (offset is None or e.offset == offset)
        ]

    def share_deliveries(self, topic: str, partition: int, offset: int) -> list[PullEntry]:
        """What every share group did with one record, from their pull logs: who got it,
        when, how many times, how it ended (`mqcore trace` shows these beside trace events)."""
        from mqcore.consume.pulllog import PULL_PREFIX, PullLog

        if self._share is not None:
            self._share.write_pending()
        out: list[PullEntry] = []
        for name in self.log.topics():
            if name.startswith(PULL_PREFIX):
                out += [
                    e
                    for e in PullLog(self.log, name[len(PULL_PREFIX) :]).entries()
                    if e.offset == offset and e.partition == partition and e.topic == topic
                ]
        return out

    def history(self, *messages: Message) -> list[TraceEvent]:
        """Everything recorded about these messages (one message, or its copies that kept its
        unique ID), oldest first: the trace events of their unique IDs (with `trace=` on and
        the message sampled) and, always, what share groups did with each, from their pull
        logs (`share_delivered`, `share_accepted`, ...). A share group's own trace events
        (delivered, acknowledged) say again what its pull log says, so they are left out for
        the groups whose pull log names the record (`mqcore trace`, the console's detail)."""
        from mqcore.query.ids import parse_uid, uid_text

        uids: dict[str, None] = {}
        pulled: list[tuple[str, PullEntry]] = []
        for m in messages:
            uid = "" if m.unique_id is None else uid_text(parse_uid(m.unique_id))
            if uid:
                uids[uid] = None
            pulled += [(uid, e) for e in self.share_deliveries(m.topic, m.partition, m.offset)]
        shared = {e.group for _, e in pulled}
        events = [e for uid in uids for e in self.trace(uid) if e.group not in shared]
        events += [e.trace_event(uid) for uid, e in pulled]
        events.sort(key=lambda e: e.time)
        return events

    def _end_or_none(self, topic: str, partition: int) -> int | None:
        part = self.log.find_partition(topic, partition)
        return None if part is None else part.end_offset

    # -- transactions and delayed messages (produce/transactions.py, produce/delay.py) ---------

    _delays: DelayManager  # Sender's parking of delayed sends: the Store has one

    def _txn_delay_setup(self, options: Any) -> None:
        self._txns = TransactionManager(self.log, self._tracer, options)
        self._delays = DelayManager(self.log, self._tracer, options)
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

    def open_transactions(self) -> list[str]:
        """Ids of the transactions with half messages and no decision yet, sorted."""
        return self._txns.unresolved()

    def pending_delays(self) -> int:
        """How many delayed messages wait for delivery."""
        return self._delays.pending()

    def deliver_due(self, now: int | None = None) -> int:
        """Deliver every delayed message due at `now` (ms, default the clock); how many."""
        return self._delays.deliver_due(now)

    # -- idempotent producers (mqcore/produce/producer.py, storage/producer_state.py) ----------

    def producer(self, producer_id: int | None = None, epoch: int = 0) -> Producer:
        """An idempotent producer: stamps (producer id, epoch, sequence) on every batch, so the
        log refuses duplicates and gaps. `producer_id=None` allocates a fresh id, durably, never
        handed out again; an epoch older than one the log has seen for the id is fenced."""
        producer_id = self.log.register_producer(producer_id, epoch)
        return Producer(self.log, producer_id, epoch)

    # -- querying (mqcore/query/engine.py) ------------------------------------------------------

    def get_by_id(self, msg_id: str, *, isolation_level: str = READ_UNCOMMITTED) -> Message | None:
        """The message a store ID names, or None when it is not (or no longer) there
        (read_committed: nor when a read_committed reader would not see it, as `get`)."""
        log = self.log
        log.check_open()
        committed = check_isolation(isolation_level)
        m = lookup.get_by_id(log.topic_partitions(), msg_id, decode_msg_id, MAX_DECOMPRESSED)
        if m is None or not committed:
            return m
        kept = committed_only([self.log.partition(m.topic, m.partition)], [m])
        return kept[0] if kept else None

    def find_by_unique_id(
        self,
        unique_id: str,
        *,
        start: int | None = None,
        end: int | None = None,
        limit: int = 1,
        topics: Callable[[str], bool] | None = None,
        isolation_level: str = READ_UNCOMMITTED,
    ) -> QueryResult:
        """Messages carrying this unique ID, in any topic that keeps a key index (normally
        one message), or in those `topics(name)` accepts (a caller's ACLs: the others are not
        searched, so neither their messages nor their existence shows). `isolation_level`
        as `read`'s."""
        committed = check_isolation(isolation_level)
        parts = [
            part
            for part in self.log.all_partitions()
            if part.config.key_index and (topics is None or topics(part.topic))
        ]
        result = engine.find_unique(parts, unique_id, start, end, limit)
        return committed_result(parts, result) if committed else result

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
        isolation_level: str = READ_UNCOMMITTED,
    ) -> QueryResult:
        """Messages whose key (or a word of their `keys` header) equals `key`, from the key
        index, each checked against the stored record. `isolation_level` as `search`'s."""
        committed = check_isolation(isolation_level)
        # all of a topic's partitions (the kernel orders a dict of them by number), or one
        parts: list[Partition] | dict[int, Partition]
        if partition is None:
            parts, cfg = self.log.partitions_and_config(topic)
        else:
            part = self.log.partition(topic, partition)
            parts, cfg = [part], part.config
        if not cfg.key_index:
            raise InvalidConfigError(
                f"topic {topic!r} keeps no key index (key_index=False): find_by_key needs it; "
                "search() scans instead"
            )
        result = find_indexed(parts, key, KEY_KIND, start, end, limit, cursor)
        if committed:
            return committed_result(list(parts.values()) if isinstance(parts, dict) else parts,
                                    result)  # fmt: skip
        return result

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
        threads: int | None = None,
        order: str = "partition",
        start_ts: int | None = None,
        end_ts: int | None = None,
        isolation_level: str = READ_UNCOMMITTED,
    ) -> QueryResult:
        """Messages with start <= timestamp < end, in ms since the epoch (None: unbounded), in
        any order of timestamps in the log: search() with only the time filter (`order` as
        there). `start_ts` and `end_ts` are the deprecated names of `start` and `end` (removed
        in the next release)."""
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
            threads=threads,
            order=order,
            isolation_level=isolation_level,
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
        threads: int | None = None,
        key: bytes | str | None = None,
        order: str = "partition",
        isolation_level: str = READ_UNCOMMITTED,
    ) -> QueryResult:
        """Messages whose value contains `contains` / matches `regex`, with tag `tag`, whose
        properties satisfy the SQL92 selector `where`, within [start, end) ms, and with `key`
        (as key or `keys` word: the key index's hits, then the filters). `threads`: how many
        threads the scan may read with (None: 2 on a machine with two CPUs or more; the
        segments after the one being read are scanned ahead, the answer is the same).
        `order`: "partition" (partition by partition, each in offset order) or "time" (merged
        across partitions by timestamp; its cursors are its own: docs/query.md).
        `isolation_level` as `read`'s: read_committed leaves out what a read_committed
        reader would not see (a page may then hold fewer than `limit`; its cursor is the
        same)."""
        spec = engine.make_spec(start, end, contains, regex, tag, where)
        order = engine.check_order(order)
        committed = check_isolation(isolation_level)
        parts = self.log.query_parts(topic, partition)
        if key is not None:
            if not self.log.partitions_and_config(topic)[1].key_index:
                raise InvalidConfigError(
                    f"topic {topic!r} keeps no key index (key_index=False): a search by key "
                    "needs it; search without key= scans instead"
                )
            result = run_key_search(parts, key, spec, order, limit, max_scan, timeout, cursor)
        else:
            run = engine.run_scan if order == engine.PARTITION_ORDER else run_time_scan
            result = run(parts, spec, limit, max_scan, timeout, cursor, threads)
        return committed_result(parts, result) if committed else result

    def trace(self, unique_id: str) -> list[TraceEvent]:
        """What happened to the message with this unique ID, oldest event first: appended,
        delivered to a group, committed, nacked, retried, dead-lettered (needs `trace=` on)."""
        self.log.check_open()
        return Tracer(self.log, 0.0).events(unique_id)

    # -- reading --------------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        partition: int = 0,
        offset: int = 0,
        max_records: int = 500,
        *,
        isolation_level: str = READ_UNCOMMITTED,
    ) -> list[Message]:
        """Up to max_records messages from `offset` on (offset == end_offset gives []).
        `isolation_level`: "read_uncommitted" (the default, as Kafka's consumer: every record
        but the transactions' control markers) or "read_committed" (only below the last
        stable offset, without the records of aborted transactions: docs/format.md
        "Transactions")."""
        part = self.log.partition(topic, partition)
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 0:
            raise InvalidConfigError(f"max_records must be an int >= 0, not {max_records!r}")
        committed = check_isolation(isolation_level)
        return part.read(offset, max_records, self.verify_crc, committed=committed)

    def get(
        self, topic: str, partition: int, offset: int, *, isolation_level: str = READ_UNCOMMITTED
    ) -> Message | None:
        """The message at `offset`, or None when there is none there (read_committed: nor
        when it is at or past the last stable offset or in an aborted transaction)."""
        part = self.log.partition(topic, partition)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise OffsetOutOfRangeError(f"offset must be an int, not {type(offset).__name__}")
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset} is negative")
        committed = check_isolation(isolation_level)
        return part.get(offset, self.verify_crc, committed=committed)

    def last_stable_offset(self, topic: str, partition: int = 0) -> int:
        """The first offset of the partition's oldest open transaction, or its end offset:
        where a read_committed reader stops."""
        return self.log.partition(topic, partition).last_stable_offset

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The earliest offset whose timestamp is >= `timestamp` (ms), or None."""
        return self.log.partition(topic, partition).offset_for_time(timestamp, self.verify_crc)

    def start_offset(self, topic: str, partition: int = 0) -> int:
        return self.log.partition(topic, partition).start_offset

    def end_offset(self, topic: str, partition: int = 0) -> int:
        return self.log.partition(topic, partition).end_offset

    def segment_offsets(self, topic: str, partition: int = 0) -> list[int]:
        """Base offsets of the partition's segments, oldest first (where Spark splits a read)."""
        part = self.log.partition(topic, partition)
        with part.locked():
            return [seg.base_offset for seg in part.segments]

    def disk_bytes(self, topic: str, partition: int = 0) -> int:
        """Disk space the partition's files take: blocks allocated (st_blocks * 512), not their
        apparent sizes, which count the sparse, preallocated tails of an open segment's files
        (20 MiB for a topic of 16 messages). The one "size on disk" (`mqcore stats`, the
        console)."""
        directory = self.log.partition(topic, partition).directory
        try:
            with os.scandir(directory) as entries:
                return sum(allocated_bytes(e.stat()) for e in entries if e.is_file())
        except FileNotFoundError:  # retention or a delete took the directory meanwhile
            return 0

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
        isolation_level: str = READ_UNCOMMITTED,
    ) -> Iterator[pa.RecordBatch]:
        """RecordBatches of offsets [start, end) in bounded pieces (Spark-sized); with
        read_committed, only below the last stable offset and without the records of aborted
        transactions (as `read`)."""
        committed = check_isolation(isolation_level)
        part = self.log.partition(topic, partition)
        stop = self._arrow_range(part, start, end)
        yield from self._arrow_batches(
            part,
            part.committed_spans(start, stop) if committed else [(start, stop)],
            include_headers,
            lambda cols, offset, last: self._fill(
                part, cols, offset, last, max_records, max_bytes
            ),  # fmt: skip
        )

    @staticmethod
    def _arrow_range(part: Partition, start: int, end: int | None) -> int:
        """The end of an Arrow read of [start, end) (None: the log's end), checked."""
        stop = part.end_offset if end is None else end
        if stop < start:
            raise OffsetOutOfRangeError(f"end offset {stop} is before start offset {start}")
        if start < stop:
            part.check_offset(start)
        return stop

    @staticmethod
    def _arrow_batches(
        part: Partition,
        spans: list[tuple[int, int]],
        include_headers: bool,
        fill: Callable[[Any, int, int], tuple[int, bool]],
    ) -> Iterator[pa.RecordBatch]:
        """The RecordBatches `fill(cols, offset, last)` makes of each span [lo, hi), one
        builder's worth at a time (fill returns the next offset and whether it is done)."""
        for lo, hi in spans:
            offset = lo
            while offset < hi:
                cols = new_columns(include_headers)
                offset, done = fill(cols, offset, hi - 1)
                if cols.num_rows:
                    yield to_record_batch(cols, part.topic, part.partition)
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
            yield from self.iter_arrow(topic, partition, start, end,
                                       include_headers=include_headers, max_records=max_records,
                                       max_bytes=max_bytes)  # fmt: skip
            return
        part = self.log.partition(topic, partition)
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

    def iter_arrow_matching(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        end: int | None = None,
        *,
        contains: bytes | str | None = None,
        regex: str | bytes | None = None,
        tag: str | None = None,
        where: str | None = None,
        include_headers: bool = False,
        max_records: int = 65536,
        max_bytes: int = 64 << 20,
        isolation_level: str = READ_UNCOMMITTED,
    ) -> Iterator[pa.RecordBatch]:
        """The records of offsets [start, end) (end None: the log's end) that match every
        filter given, by `search`'s rules, as RecordBatches of iter_arrow's schema and bounds.
        The scan kernel adds each match to the Arrow columns as it finds it; a regex, or a
        selector beyond the kernel, is tested in Python on the kernel's candidates (as
        `search` does)."""
        from mqcore.arrow import messages_batch

        spec = engine.make_spec(None, None, contains, regex, tag, where)
        committed = check_isolation(isolation_level)
        part = self.log.partition(topic, partition)
        stop = self._arrow_range(part, start, end)
        if spec.filters_in_python:
            page: list[Message] = []
            for m in engine.scan_messages(part, spec, start, stop, self.verify_crc, committed):
                page.append(m)
                if len(page) >= max_records:
                    yield messages_batch(page, include_headers)
                    page = []
            if page:
                yield messages_batch(page, include_headers)
            return
        yield from self._arrow_batches(
            part,
            part.committed_spans(start, stop) if committed else [(start, stop)],
            include_headers,
            lambda cols, offset, last: engine.fill_matching(
                part, cols, spec, offset, last, max_records, max_bytes, self.verify_crc
            ),  # fmt: skip
        )

    def key_spans(
        self, topic: str, partition: int, key: bytes | str, start: int, end: int
    ) -> list[tuple[int, int]]:
        """Offset spans [lo, hi) in [start, end) holding every message whose key may be `key`,
        from the key index (a superset, to be checked); segments without a key index, or with
        many candidates, come back whole. Only the key tables are read."""
        _raw, hashed = engine.key_hash(key)
        return engine.key_spans(
            self.log.partition(topic, partition), hashed, start, end, engine.KEY_SPAN_MAX_HITS
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
        isolation_level: str = READ_UNCOMMITTED,
    ) -> pa.RecordBatch:
        """Offsets [start, end) as one RecordBatch in Spark's Kafka-source schema (an
        `isolation_level` as `read`'s)."""
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
                isolation_level=isolation_level,
            )
        )
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=kafka_schema(include_headers))
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]

    # -- retention and compaction (storage/retention.py, storage/cleaner.py) -------------------

    def _maintained(self, topic: str | None, wanted: Callable[[str], bool]) -> list[Partition]:
        """Partitions of `topic` (or of every topic) whose cleanup policy `wanted` accepts; never
        those of the topics trimmed by resolution, whatever their stored settings say (a store
        made by an older mqcore created them with the store's topic defaults)."""
        self.log.check_writable()
        return [
            part
            for part in self.log.iter_partitions(topic)  # a topic created meanwhile: next pass
            if wanted(part.config.cleanup_policy) and part.topic not in TRIMMED_BY_RESOLUTION
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
        report = retention.apply(parts, self.log.clock() if now is None else now, progress)
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
                f"topic {topic!r} has cleanup_policy={self.log.config(topic).cleanup_policy!r}; "
                "compaction needs 'compact' or 'compact,delete'"
            )
        parts = self._maintained(topic, cleaner.applies)
        return cleaner.compact(
            parts, self.log.clock() if now is None else now, self.verify_crc, progress
        )

    def dirty_ratio(self, topic: str, partition: int = 0) -> float:
        """Share of the partition's sealed bytes no compaction pass has cleaned yet."""
        return cleaner.dirty_ratio(self.log.partition(topic, partition))

    def _compact_dirty(self, now: int | None = None) -> CompactionReport:
        """The background task: compact each partition whose dirty ratio reached its topic's
        min_cleanable_dirty_ratio."""
        report = CompactionReport()
        for part in self._maintained(None, cleaner.applies):
            ratio = cleaner.dirty_bytes(part)
            if ratio[1] and ratio[0] / ratio[1] >= part.config.min_cleanable_dirty_ratio:
                report.merge(
                    cleaner.compact(
                        [part], self.log.clock() if now is None else now, self.verify_crc, None
                    )
                )
        return report

    # -- durability -----------------------------------------------------------------------------

    def flush(self) -> None:
        """fdatasync every partition and advance the recovery checkpoint."""
        self.log.flush()


def allocated_bytes(st: os.stat_result) -> int:
    """Bytes of disk a file takes: its blocks (st_blocks counts 512-byte units everywhere);
    its size rounded up to 512 where the platform does not say."""
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else (st.st_size + 511) // 512 * 512


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
