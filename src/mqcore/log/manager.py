"""The log directory manager: the featureless core below the consumption model.

A `Log` owns one store directory: its lock and topic list, every partition (opened and
recovered at load, from the recovery checkpoint), the interval flusher, the background task
thread that runs maintenance, the recovery checkpoint and the clean-shutdown marker. It
appends encoded batches and knows nothing of consumers, transactions or delays: those sit
above it (consume/, produce/) and reach it only through the public names here; the `Store`
facade composes them. A broker embeds a `Log` (docs/embedding.md).

Durability after `append_records`/`append` returns, by flush policy (docs/operations.md
"Durability"):
  always    fdatasync'd before the call returns (group commit across threads): survives a
            process kill and a power loss.
  interval  in the page cache at once; fdatasync'd by the background flusher within
            flush_interval_ms or flush_messages: survives a process kill; a power loss loses at
            most that window.
  os        page cache only, flushed by the kernel, by flush() and at close: survives a process
            kill; a power loss may lose anything since the last flush.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from mqcore import compression as codecs
from mqcore._ext.batch import EncodedBatch
from mqcore.clock import Clock, now_ms
from mqcore.config import FlushPolicy, PartitionLimits, TopicConfig, validate_name
from mqcore.crashpoints import crash_point
from mqcore.errors import (
    CorruptIndexError,
    InvalidConfigError,
    MQCoreError,
    NotLeaderOrFollowerError,
    ProducerFencedError,
    ReadOnlyStoreError,
    StoreClosedError,
    StoreError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.log.append import BatchMetadata, HeadersArg, Router, encode_fitting
from mqcore.log.changes import TopicChanges
from mqcore.log.internal import SkipLog, is_internal, refuse_internal
from mqcore.log.replica import ReplicaLog
from mqcore.storage import durable
from mqcore.storage.cache import SegmentCache
from mqcore.storage.flusher import Flusher
from mqcore.storage.logdir import LogDirectory
from mqcore.storage.partition import NOT_LEADING, Partition, RecoveryReport, has_segments
from mqcore.storage.producer_state import BatchRecord, check_producer_fields
from mqcore.storage.segment import ReserveBudget
from mqcore.tasks import BackgroundTasks

_log = logging.getLogger("mqcore")

MIN_OPEN_SEGMENTS = 8  # the fewest sealed segments a store keeps open (a read spans several)
READ_ONLY_OPEN_PATIENCE = 10.0  # seconds a read-only open retries while a writer changes files

# listener(topic, partition, base_offset, count, uids, now): after every append that wrote
AppendListener = Callable[[str, int, int, int, "bytes | None", int], None]


class Log:
    """A directory of topics and partitions of Kafka v2 segments, opened and recovered."""

    def __init__(
        self,
        path: str,
        *,
        read_only: bool = False,
        create: bool = True,
        flush_policy: FlushPolicy | None = None,
        verify_crc: bool = True,
        auto_create_topics: bool = False,
        topic_defaults: TopicConfig | None = None,
        max_open_segments: int = 1000,
        full_recovery: bool = False,
        clock: Clock = now_ms,
        limits: PartitionLimits | None = None,
    ):
        if (
            isinstance(max_open_segments, bool)
            or not isinstance(max_open_segments, int)
            or not MIN_OPEN_SEGMENTS <= max_open_segments <= 1 << 30
        ):
            raise InvalidConfigError(
                f"max_open_segments must be an int in [{MIN_OPEN_SEGMENTS}, 2**30], not "
                f"{max_open_segments!r}"
            )
        if not isinstance(create, bool):
            raise InvalidConfigError(f"create must be a bool, not {create!r}")
        if not isinstance(full_recovery, bool) or (full_recovery and read_only):
            raise InvalidConfigError(
                f"full_recovery must be a bool, and goes with a writable open: {full_recovery!r}"
            )
        if not callable(clock):
            raise InvalidConfigError(f"clock must be callable, returning ms: {clock!r}")
        self.flush_policy = flush_policy if flush_policy is not None else FlushPolicy()
        # sealed segments open at once (their maps; they keep no descriptor): docs/operations.md
        self._segment_cache = SegmentCache(max_open_segments)
        # disk reserved past the active segments, all partitions together (storage/segment.py)
        self._reserve_budget = ReserveBudget()
        self.read_only = read_only
        self.auto_create_topics = auto_create_topics
        self.verify_crc = verify_crc
        self.topic_defaults = topic_defaults if topic_defaults is not None else TopicConfig()
        self.clock = clock
        self.router = Router()
        self._full_recovery = full_recovery
        self._dir = LogDirectory(path, writable=not read_only, create=create)
        self.path = self._dir.path
        self._lock = threading.RLock()  # publishing topic changes, replica handles, close
        self._checkpoint_lock = threading.Lock()  # one writer of the checkpoint at a time
        self.limits = limits if limits is not None else PartitionLimits()
        self._changes = TopicChanges(self._dir.path)  # who changes which topic (log/changes.py)
        self._deleting: dict[str, int] = {}  # deletions in progress: topic -> partitions
        self._configs: dict[str, TopicConfig] = {}
        self._topic_appends: dict[str, int] = {}  # batches written per topic since open
        # topic -> partition number -> Partition; a read-only store of a Kafka log directory
        # may lack some numbers (a broker holds only some partitions of a topic)
        self._partitions: dict[str, dict[int, Partition]] = {}
        self._listeners: list[AppendListener] = []
        self._replicas: dict[Partition, ReplicaLog] = {}  # Log.replica's handles
        self._closed = False
        self._flusher: Flusher | None = None
        # a new store starts its flusher and task thread at its first write, not at open
        # (start_background): until then they would have nothing to do, and a thread's start
        # and join cost 0.1-2 ms each on a 2-core VM
        self._background_deferred = False
        self._tasks_wanted = False
        # what stopped the background tasks for good: every later call raises it
        self._fault: StoreClosedError | None = None
        self.tasks = BackgroundTasks(on_stop=self._tasks_stopped)
        self.skipped = SkipLog()  # internal records a reader could not parse (log/internal.py)
        self.recovery: dict[tuple[str, int], RecoveryReport] = {}
        self.stray_directories: list[str] = []
        self.missing_partitions: dict[str, int] = {}  # topic -> declared partitions missing
        try:
            self._load()
        except BaseException:
            # a failed open must not look open: __del__ would close() it, writing the clean
            # marker over a store that was never recovered
            self._closed = True
            self._abandon_partitions()
            self._dir.release()
            raise

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
        # A new store holds nothing yet: its topic list needs no fsync (a power loss leaves it
        # or an empty directory, which opens as the same empty store; the first create_topic
        # writes it durably), and it needs no checkpoint before close() or the flusher writes
        # one (none reads as every point 0, as an empty one does) (operations.md "Store
        # lifecycle").
        self._dir.save_topics(self._configs, sync=not self._dir.fresh)
        if not self._dir.fresh:
            self.checkpoint()
        self._dir.mark_open()
        self._background_deferred = self._dir.fresh
        if not self._background_deferred:
            self._start_flusher()

    def _open_partitions(self, live: bool) -> None:
        clean = self._dir.was_clean() and not self._full_recovery
        try:
            points: dict[tuple[str, int], int] | None = self._dir.load_recovery_points()
        except CorruptIndexError:
            points = None  # scan everything: slower, never wrong
        if not self.read_only:
            self._dir.clear_clean_marker()
        self._configs = self._dir.load_topics()
        if not self.read_only:
            self._dir.finish_deletions()  # the topic list saved after this drops their entries
        # what is not opened: directories no topic declares, and declared partitions whose
        # directory is gone (an open never creates one: an empty partition would hide a loss)
        self.stray_directories = list(self._dir.stray)
        self.missing_partitions = {}
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
                    if all(part.same_files() for part in self.all_partitions()):
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
        for part in self.all_partitions():
            part.abandon()
        self._partitions = {}
        self.recovery = {}

    def _create_partitions(
        self, topic: str, numbers: range, cfg: TopicConfig, made: list[str]
    ) -> dict[int, Partition]:
        """New partitions `numbers` of `topic`, each with its first segment; `made` collects
        the directories made (the caller removes them if the creation fails). They are made
        durable by one fsync of the store directory, before mqcore-topics.json declares them
        (an open never recreates a declared partition's directory); the names in each by
        fsyncs side by side (durable.sync_dirs), or under flush="os" by the partition's first
        flush (docs/operations.md "Store lifecycle"). A directory already there (a stray left
        by a crash) is opened as it is."""
        for p in numbers:
            directory = self._dir.partition_dir(topic, p)
            if not os.path.lexists(directory):
                os.mkdir(directory)
                made.append(directory)
        if made:
            self._dir.fsync_dir()
        fresh = set(made)
        parts: dict[int, Partition] = {}
        try:
            for p in numbers:
                part = parts[p] = self._new_partition(topic, p, cfg)
                if part.directory in fresh:
                    part.create()
                else:
                    part.open(0, clean=True)
            if self.flush_policy.for_topic(cfg).mode != "os":
                durable.sync_dirs(made)  # each one's first segment, all at once
        except BaseException:
            for part in parts.values():
                part.abandon()  # its descriptors, before the directories go
            raise
        return parts

    def _grow(
        self, topic: str, numbers: range, cfg: TopicConfig, crash_at: str | None = None
    ) -> None:
        """Make partitions `numbers` of `topic` and declare it with `cfg` (a new topic, or
        more partitions), all or nothing: a failure at any step (EMFILE at partition k, a full
        disk writing the topic list) closes what was opened and removes the directories made,
        and the store goes on as before. The limits are checked first, counting what other
        creations in progress reserved."""
        made: list[str] = []
        with self._changes.reserving(len(numbers), lambda r: self._check_limits(topic, cfg, r)):
            try:
                parts = self._create_partitions(topic, numbers, cfg, made)
                if crash_at is not None:
                    crash_point(crash_at)
                self._declare(topic, cfg, parts)
            except BaseException:
                with contextlib.suppress(OSError):  # strays at worst: the next creation reuses them
                    self._dir.remove_trees(made)
                raise

    def check_limits(self, topic: str, partitions: int) -> None:
        """PartitionLimitError unless `topic` may have `partitions` in all now (a new topic or
        more partitions): what a creation checks first, for a request's validate_only."""
        with self._changes.committing():
            self._check_limits(topic, self.new_topic_config(partitions), self._changes.reserved)

    def _check_limits(self, topic: str, cfg: TopicConfig, reserved: int) -> None:
        """PartitionLimitError unless `topic` may have `cfg.partitions` (PartitionLimits);
        internal topics count towards the store's total but are never refused."""
        if is_internal(topic):
            return
        old = self._configs.get(topic)
        adding = cfg.partitions - (old.partitions if old is not None else 0)
        total = sum(c.partitions for c in self._configs.values()) + reserved
        self.limits.check(topic, adding, cfg.partitions, total)

    def _declare(self, topic: str, cfg: TopicConfig, parts: dict[int, Partition]) -> None:
        """Write the topic list with `topic` as `cfg`, then publish its new partitions; the
        partitions are closed if the write fails (the caller removes their directories)."""
        with self._changes.committing():
            configs = {**self._configs, topic: cfg}
            try:
                self._dir.save_topics(configs, self._deleting)
            except BaseException:
                for part in parts.values():
                    part.abandon()
                raise
            grown = {**self._partitions.get(topic, {}), **parts}
            with self._lock:
                if topic in self._configs:  # more partitions: the lookups find them first
                    self._partitions = {**self._partitions, topic: grown}
                    self._configs = configs
                else:  # a new topic: whoever finds its partitions finds its config
                    self._configs = configs
                    self._partitions = {**self._partitions, topic: grown}
                for part in grown.values():
                    part.reconfigure(cfg)
        if cfg.timed_flush and not self._background_deferred:
            self._start_flusher()

    def _new_partition(self, topic: str, p: int, cfg: TopicConfig) -> Partition:
        return Partition(
            topic,
            p,
            self._dir.partition_dir(topic, p),
            cfg,
            self.flush_policy,
            writable=not self.read_only,
            cache=self._segment_cache,
            clock=self.clock,
            reserve_budget=self._reserve_budget,
        )

    def start_tasks(self) -> None:
        """Start the background thread of the tasks registered so far (maintenance, delayed
        delivery, transaction check-back); a read-only log runs none."""
        if self.read_only:
            return
        if self._background_deferred:
            self._tasks_wanted = True  # at the first write (start_background)
        else:
            self.tasks.start()

    def start_background(self) -> None:
        """Start what a new store deferred to its first write: the flusher (flush="interval")
        and the task thread if start_tasks asked for it. Every write path calls it while
        `_background_deferred` is set (Log._write, the replica handles' appends)."""
        with self._lock:
            if self._closed or not self._background_deferred:
                return
            self._background_deferred = False
            self._start_flusher()
            if self._tasks_wanted:
                self.tasks.start()

    def _start_flusher(self) -> None:
        """Start the flusher if there is none and it has work: the passes of
        flush="interval", or under "os" a topic's flush_after_ms (the appends of "always" are
        synced already). A topic created or changed later may start it too (_declare)."""
        policy = self.flush_policy
        timed = policy.mode == "os" and any(c.timed_flush for c in self._configs.values())
        wanted = policy.mode == "interval" or timed
        with self._lock:
            if self._flusher is not None or self._closed or not wanted:
                return
            interval = policy.interval_ms if policy.mode == "interval" else None
            flusher = Flusher(interval, self._flush_all, self.checkpoint, self._flush_timed)
            flusher.start()
            self._flusher = flusher

    def close(self) -> None:
        """Stop the tasks, flush everything, seal active segments, write checkpoints and the
        clean marker."""
        if not self._closed:
            # before the lock and before the log looks closed: a task finishes its run with
            # the log still usable (a task may take the lock itself), and a topic change in
            # progress finishes (its partitions land, and are closed below)
            self.tasks.stop()
            self._changes.close()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._flusher is not None:
                self._flusher.stop()
            for part in self.all_partitions():
                part.close()
            if not self.read_only:
                # one directory fsync makes both names durable (the marker's): the marker may
                # reach the disk with the older checkpoint, whose lower recovery points only
                # cost a longer scan at the next unclean open (operations.md "Store lifecycle")
                self.checkpoint(sync_dir_now=False)
                self._dir.write_clean_marker()
            self._dir.release()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """The log's lock (reentrant): held while a topic change is published (log/changes.py:
        never for the change's slow part) and while replica handles are made."""
        return self._lock

    def check_open(self) -> None:
        """StoreClosedError once closed or once the background tasks stopped; the flusher's
        error once it failed."""
        if self._closed:
            raise StoreClosedError(f"store {self.path} is closed")
        if self._fault is not None:
            raise self._fault
        if self._flusher is not None and self._flusher.error is not None:
            raise self._flusher.error

    def _tasks_stopped(self, error: BaseException) -> None:
        """The task thread ended on something no task may raise (tasks.py): the store stops
        serving rather than run on without retention, delays and check-back."""
        self._fault = StoreClosedError(
            f"store {self.path} stopped: its background tasks ended on {error!r}; close it and "
            "open it again"
        )

    def check_writable(self) -> None:
        self.check_open()
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.path} was opened read-only")

    # -- topics ---------------------------------------------------------------------------------

    def new_topic_config(self, partitions: int | None = None, **config: Any) -> TopicConfig:
        """The settings create_topic(name, partitions, **config) gives a new topic: the
        defaults with `config` applied (validated: InvalidConfigError)."""
        return self.topic_defaults.with_changes(
            partitions=self.topic_defaults.partitions if partitions is None else partitions,
            **config,
        )

    def create_topic(self, name: str, partitions: int | None = None, **config: Any) -> None:
        """Create a topic, internal names included (idempotent with the same partition count);
        its partitions exist on disk and in mqcore-topics.json (durably) when this returns."""
        self.check_writable()
        validate_name(name)
        cfg = self.new_topic_config(partitions, **config)
        with self._changes.changing(name):
            existing = self._configs.get(name)
            if existing is not None:
                if existing.partitions != cfg.partitions:
                    raise TopicExistsError(
                        f"topic {name!r} exists with {existing.partitions} partitions, "
                        f"not {cfg.partitions}"
                    )
                return
            self._grow(name, range(cfg.partitions), cfg)

    def internal_topic(self, name: str, partitions: int = 1, **config: Any) -> str:
        """Create internal topic `name` (a `__` name) on first use, whatever
        auto_create_topics says; returns the name. They hold the consumption model's state."""
        if name not in self._configs:
            self.create_topic(name, partitions, **config)
        return name

    def alter_topic_config(self, topic: str, **changes: Any) -> TopicConfig:
        """Change settings of an existing topic (Store.alter_topic_config says what and when);
        returns its new settings."""
        return self.update_topic_config(topic, lambda _old: changes)

    def update_topic_config(
        self, topic: str, changes_of: Callable[[TopicConfig], dict[str, Any]]
    ) -> TopicConfig:
        """alter_topic_config with the changes computed from the settings as they are, under
        the topic's change: no other change comes between the read and the write (an
        IncrementalAlterConfigs APPEND to a list setting)."""
        self.check_writable()
        with self._changes.changing(topic):
            old = self._existing(topic)
            changes = changes_of(old)
            new = old.with_changes(**changes)
            old.changes_allowed(changes)
            if new == old:
                return old
            self._declare(topic, new, {})  # on disk first: a failed write changes nothing
        return new

    def _existing(self, topic: str) -> TopicConfig:
        """The settings of `topic`, looked up while a change holds it (changing): a topic
        deleted by a change before this one is UnknownTopicError, never a KeyError."""
        self.check_writable()
        cfg = self._configs.get(topic)
        if cfg is None:
            validate_name(topic)
            raise UnknownTopicError(f"topic {topic!r} does not exist in {self.path}")
        return cfg

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its messages (Store.delete_topic says what a caller sees).

        The steps, each durable before the next (docs/operations.md "Deleting a topic"): the
        topic leaves mqcore-topics.json, which names it as `deleting` (the commit point: an
        open after a crash finishes what follows); its partitions close (a reader in the
        middle of a read keeps the mappings it holds and then gets an error, never a crash);
        their directories are renamed to Kafka's `<topic>-<n>.<hex>-delete`; the topic list
        is saved without the `deleting` entry; the directories are removed."""
        self.check_writable()
        # the topic held throughout: the name cannot be created again before its old
        # directories are renamed (a maintenance pass never takes a change, so waiting for one
        # is safe); other topics change meanwhile, and appends and reads go on
        with self._changes.changing(name):
            cfg = self._existing(name)
            parts = self._forget(name, cfg)
            for part in parts.values():
                with part.maintenance:  # a retention or compaction pass of it finishes first
                    part.close(deleted=True)
            retired = self._dir.retire_partitions(name, cfg.partitions)
            crash_point("delete_topic.after_rename")
            with self._changes.committing():
                del self._deleting[name]
                self._dir.save_topics(self._configs, self._deleting)
            self._dir.remove_trees(retired)
            self.checkpoint()

    def _forget(self, name: str, cfg: TopicConfig) -> dict[int, Partition]:
        """The commit point of a deletion: the topic list names `name` as deleting, durably,
        and no lookup finds it any more. Returns its partitions (still open)."""
        with self._changes.committing():
            configs = {t: c for t, c in self._configs.items() if t != name}
            self._dir.save_topics(configs, {**self._deleting, name: cfg.partitions})
            self._deleting[name] = cfg.partitions
            crash_point("delete_topic.after_save")
            with self._lock:
                parts = self._partitions[name]
                # partitions first: a lookup that finds them finds their config (_config_of)
                self._partitions = {t: ps for t, ps in self._partitions.items() if t != name}
                self._configs = configs
                self._replicas = {k: v for k, v in self._replicas.items() if k.topic != name}
                # a consumer that drained the topic looks again, and finds it gone
                self._topic_appends[name] = self._topic_appends.get(name, 0) + 1
        return parts

    def add_partitions(self, topic: str, count: int, validate_only: bool = False) -> TopicConfig:
        """Grow `topic` to `count` partitions (Kafka's CreatePartitions); returns its new
        settings. The count only grows; the new partitions' directories exist before
        mqcore-topics.json declares them (a crash in between leaves empty stray directories
        that the next add_partitions reuses). Keys route by the count: after this, a key may
        go to another partition than before. `validate_only`: check, change nothing."""
        self.check_writable()
        with self._changes.changing(topic):
            old = self._existing(topic)
            if isinstance(count, bool) or not isinstance(count, int) or count <= old.partitions:
                raise InvalidConfigError(
                    f"topic {topic!r} has {old.partitions} partitions: the count can only grow, "
                    f"so {count!r} is not a new count (give more than {old.partitions})"
                )
            new = old.with_changes(partitions=count)  # validates the upper bound
            if validate_only:
                self.check_limits(topic, count)
                return new
            self._grow(topic, range(old.partitions, count), new, "add_partitions.after_dirs")
        return new

    def topics(self) -> list[str]:
        """Every topic, internal ones included, sorted."""
        self.check_open()
        return sorted(self._partitions)

    def has_topic(self, topic: str) -> bool:
        return topic in self._configs

    def config(self, topic: str) -> TopicConfig:
        """The topic's settings (UnknownTopicError for a topic the log does not hold)."""
        self.partitions_of(topic)  # the open check, and the errors for an unknown topic
        return self._config_of(topic)

    def partitions_and_config(
        self, topic: str, create: bool = False
    ) -> tuple[dict[int, Partition], TopicConfig]:
        """partitions_of(topic, create) and config(topic) with one check (the first step of a
        lookup or an append: its common case makes no further call)."""
        parts = self._partitions.get(topic)
        flusher = self._flusher
        # check_open's conditions, inline (keep them the same as check_open's)
        if (
            parts is None
            or self._closed
            or self._fault is not None
            or (flusher is not None and flusher.error is not None)
        ):
            parts = self.partitions_of(topic, create)  # the errors, or the creation
        return parts, self._config_of(topic)

    def _config_of(self, topic: str) -> TopicConfig:
        """The config of a topic just found in _partitions (deleted since: UnknownTopicError)."""
        cfg = self._configs.get(topic)
        if cfg is None:
            raise UnknownTopicError(f"topic {topic!r} was deleted from {self.path}")
        return cfg

    def partitions_of(self, topic: str, create: bool = False) -> dict[int, Partition]:
        """The topic's open partitions by number (do not change the dict). With `create` an
        unknown topic is created when auto_create_topics allows it."""
        # lookups are microseconds: skip the call when nothing can be wrong
        if self._closed or self._flusher is not None or self._fault is not None:
            self.check_open()
        parts = self._partitions.get(topic)
        if parts is None:
            if create and self.auto_create_topics:
                refuse_internal(topic)  # auto-creation makes user topics only
                self.create_topic(topic)
                return self.partitions_of(topic)  # deleted at once by another thread: unknown
            validate_name(topic)
            raise UnknownTopicError(f"topic {topic!r} does not exist in {self.path}")
        return parts

    def partition(self, topic: str, partition: int, create: bool = False) -> Partition:
        """One partition; UnknownTopicError / UnknownPartitionError naming what is missing."""
        parts = self.partitions_of(topic, create)
        count = self._config_of(topic).partitions
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

    def find_partition(self, topic: str, partition: int) -> Partition | None:
        """The partition, or None when the log does not hold it (no error, no open check)."""
        return self._partitions.get(topic, {}).get(partition)

    def all_partitions(self) -> list[Partition]:
        """Every open partition, by topic then number."""
        return [parts[p] for _, parts in sorted(self._partitions.items()) for p in sorted(parts)]

    def topic_partitions(self) -> dict[str, dict[int, Partition]]:
        """topic -> number -> Partition, a snapshot of the mapping (the lookup kernels take it)."""
        return self._partitions

    def query_parts(self, topic: str, partition: int | None) -> list[Partition]:
        """The partitions a query of `topic` (or of one `partition`) reads, in number order."""
        if self._closed or self._flusher is not None or self._fault is not None:
            self.check_open()
        parts = self._partitions.get(topic)
        if parts is None or partition is not None:
            parts = self.partitions_of(topic)  # raises for a topic the log does not hold
            if partition is not None:
                return [self.partition(topic, partition)]
        if len(parts) == 1:
            return list(parts.values())
        return [parts[p] for p in sorted(parts)]

    def appends_to(self, topic: str) -> int:
        """Batches appended to `topic` since open (a consumer skips a topic it found drained
        until this moves)."""
        return self._topic_appends.get(topic, 0)

    # -- appending ------------------------------------------------------------------------------

    def add_append_listener(self, listener: AppendListener) -> None:
        """Call listener(topic, partition, base_offset, count, uids, now) after each append
        that wrote (not for an idempotent duplicate): how consumers wake and trace records."""
        # a new list each time: an append in another thread walks the one it read
        self._listeners = [*self._listeners, listener]

    def remove_append_listener(self, listener: AppendListener) -> None:
        """Stop calling `listener` (added by add_append_listener); nothing if it is not there."""
        self._listeners = [f for f in self._listeners if f != listener]

    def append(
        self,
        part: Partition,
        batches: Sequence[EncodedBatch],
        producer: tuple[int, int, int] | None = None,
        now: int = -1,
    ) -> tuple[int, BatchRecord | None]:
        """Write encoded batches to `part` at consecutive offsets: (base offset, None), or for
        an idempotent producer's resend (base offset of the original, its record) with nothing
        written. The producer's sequence is checked under the partition lock."""
        if producer is not None:
            state = part.producer_state
            if state is None:
                raise ReadOnlyStoreError(f"{part.topic}-{part.partition} keeps no producer state")
            with part.locked():
                base, dup = state.append(batches, *producer, lambda b: self._write(part, b))
            if dup is not None:
                return base, dup
        elif len(batches) == 1:
            base = self._write(part, batches[0])  # Partition.append takes the lock itself
        else:
            with part.locked():  # consecutive offsets across the pieces of a split batch
                base = self._write(part, batches[0])
                for extra in batches[1:]:
                    self._write(part, extra)
        if self._listeners:
            uids = batches[0].uids
            if uids is not None and len(batches) > 1:
                uids = b"".join(b.uids or b"" for b in batches)
            self._notify(part, base, sum(b.count for b in batches), uids, now)
        return base, None

    def _notify(self, part: Partition, base: int, count: int, uids: bytes | None, now: int) -> None:
        for listener in self._listeners:
            listener(part.topic, part.partition, base, count, uids, now)

    def replica(self, topic: str, partition: int) -> ReplicaLog:
        """The embedding handle of one partition (docs/embedding.md): one per partition, kept
        for the log's life (it holds the leader-epoch cache and the high watermark). Its
        appends wake waiting consumers and the flusher like the log's own."""
        part = self.partition(topic, partition)
        handle = self._replicas.get(part)  # no lock on the way of every produce and fetch
        if handle is not None:
            return handle
        with self._lock:
            handle = self._replicas.get(part)
            if handle is None:

                def appended(base: int, count: int, now: int) -> None:
                    if self._background_deferred:
                        self.start_background()
                    self._topic_appends[topic] = self._topic_appends.get(topic, 0) + 1
                    self._written(part)
                    self._notify(part, base, count, None, now)

                handle = ReplicaLog(part, clock=self.clock, on_append=appended)
                self._replicas[part] = handle
        return handle

    def _write(self, part: Partition, batch: EncodedBatch) -> int:
        if self._background_deferred:
            self.start_background()
        with part.locked():  # the role checked and the batch appended as one step (follow())
            if part.leader_epoch == NOT_LEADING:  # its leader's appends reach it by replication
                raise NotLeaderOrFollowerError(
                    f"{part.topic}-{part.partition} is led by another broker: this replica "
                    "takes only what it copies from its leader"
                )
            if part.leader_epoch >= 0:
                batch.set_leader_epoch(part.leader_epoch)
            base = part.append(batch)
        appends = self._topic_appends
        appends[part.topic] = appends.get(part.topic, 0) + 1
        self._written(part)
        return base

    def _written(self, part: Partition) -> None:
        """Tell the flusher of an append to `part`: a whole pass once it holds flush_messages
        unsynced (flush="interval"), a timed sync when its topic has flush_after_ms."""
        flusher = self._flusher
        if flusher is None:
            return
        if part.unflushed_messages >= self.flush_policy.messages and flusher.interval is not None:
            flusher.wake()
        if part.config.timed_flush:
            due = part.flush_due()
            if due is not None:
                flusher.reschedule(due)

    def append_records(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        producer: tuple[int, int, int] | None = None,
    ) -> BatchMetadata:
        """Encode messages for one partition (split to fit max_message_bytes) and append them
        at consecutive offsets. Internal topics included: the write path of mqcore's own state
        (the public appends refuse those, log/internal.py)."""
        self.check_writable()
        part = self.partition(topic, partition)
        cfg = part.config
        values = values if type(values) is list else list(values)
        codec = codecs.codec_id(compression if compression is not None else cfg.compression)
        now = self.clock()
        batches = encode_fitting(values, keys, headers, timestamps, now, codec, cfg, topic,
                                 producer)  # fmt: skip
        base, dup = self.append(part, batches, producer, now)
        if dup is not None:
            return BatchMetadata(partition, base, len(values), topic, None, True)
        uids = batches[0].uids
        if uids is not None and len(batches) > 1:
            uids = b"".join(b.uids or b"" for b in batches)
        return BatchMetadata(partition, base, len(values), topic, uids)

    # -- producer ids (storage/producer_state.py) ----------------------------------------------

    def register_producer(self, producer_id: int | None, epoch: int) -> int:
        """Check (or, for None, allocate durably) an idempotent producer's id and epoch: an id
        is never handed out twice, an epoch older than one the log has seen is fenced."""
        self.check_writable()
        with self._lock:
            states = [p.producer_state for p in self.all_partitions()]
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
        return producer_id

    # -- durability -----------------------------------------------------------------------------

    def flush(self) -> None:
        """fdatasync every partition and advance the recovery checkpoint."""
        self.check_writable()
        self._flush_all()
        self.checkpoint()

    def sync_partitions(self, partitions: Iterable[tuple[str, int]]) -> None:
        """fdatasync these (topic, partition)s, and the names of their new segments, now,
        whatever the flush policy: for a step that relies on what they hold (a commit past a
        nacked message's retry copy, docs/consume.md "Durability")."""
        for topic, partition in partitions:
            self.partition(topic, partition).flush()

    def _flush_all(self) -> None:
        for part in self.all_partitions():
            if not part.closed:
                part.flush()

    def _flush_timed(self) -> float | None:
        """The flusher's timed round: fdatasync the partitions whose flush_after_ms has come
        (Partition.flush_due); returns the seconds until the next one is due (None: none)."""
        now = time.monotonic()
        nearest: float | None = None
        for part in self.all_partitions():
            due = part.flush_due()
            if due is None:
                continue
            if due <= now:
                part.flush()
            elif nearest is None or due < nearest:
                nearest = due
        return None if nearest is None else nearest - now

    def checkpoint(self, sync: bool = True, sync_dir_now: bool = True) -> None:
        """Write every partition's recovery point (what recovery may skip) durably; `sync` and
        `sync_dir_now` as for durable.write_atomic.

        Its writers (the flusher, flush(), topic deletions, open and close) take turns: two at
        once shared the one `.tmp` file, so the second rename found it gone, or renamed a file
        the other had just truncated. The points are read in the same turn, so a later write
        never carries an older view (a deleted topic's entries coming back)."""
        with self._checkpoint_lock:
            points = {(p.topic, p.partition): p.recovery_point for p in self.all_partitions()}
            self._dir.save_recovery_points(points, sync=sync, sync_dir_now=sync_dir_now)

    def iter_partitions(self, topic: str | None = None) -> Iterator[Partition]:
        """Partitions of `topic` (or of every topic) in order, a snapshot taken under the lock."""
        with self._lock:
            topics = sorted(self._partitions) if topic is None else [topic]
            snap = [part for t in topics for _, part in sorted(self.partitions_of(t).items())]
        return iter(snap)


__all__ = ["MIN_OPEN_SEGMENTS", "AppendListener", "Log"]
