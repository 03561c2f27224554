"""spark.readStream / df.writeStream .format("mqcore"): Spark's Kafka streaming source, and a
streaming sink, over a store directory (docs/spark.md "Streaming").

Reading. An offset is Kafka's checkpoint shape, {"topic": {"0": next offset, ...}}; Spark keeps
it in the query's checkpoint. Per micro-batch, in a Python planner process on the driver:
  latestOffset(start, limit)  the end of the next batch: the log ends (or the AvailableNow
                              target), cut by the read limits the way Kafka's source cuts them
                              (PySpark 4.1 calls latestOffset() alone: the log ends, no
                              limits, so the limit options are refused there);
  partitions(start, end)      offset ranges, failOnDataLoss applied (a partition that appeared
                              since `start` is read from offset 0), split like a batch read;
  commit(end)                 Spark is done before `end`: with groupId it becomes the group's
                              committed offsets (monitoring only: a restart resumes from the
                              checkpoint, never from the group);
and read(partition) in each task yields Arrow batches from Store.iter_arrow, as a batch read.

Writing. Tasks stage their rows as the batch sink does (mqcore.spark.sink). commit(messages,
batchId) appends each batch id of a query once: a marker file per query records the last batch
appended, and before appending, the batch is recorded as prepared (its staging files and each
target partition's end offset), so a commit cut short by a crash is completed, not repeated,
when Spark replays the batch.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

import mqcore
from mqcore.clock import now_ms
from mqcore.consume.offsets import OffsetAndMetadata, OffsetStore
from mqcore.errors import (
    InvalidConfigError,
    OffsetOutOfRangeError,
    StoreError,
    StoreLockedError,
    UnknownPartitionError,
)
from mqcore.handles import shared_store
from mqcore.log.append import key_partition
from mqcore.spark.batches import range_batches, task_store
from mqcore.spark.options import StreamOptions, TopicPartition, WriteOptions
from mqcore.spark.plan import (
    OffsetRange,
    checked_range,
    latest,
    resolve_bound,
    split_ranges,
    topic_partitions,
)
from mqcore.spark.sink import (
    ROWS_PER_APPEND,
    STAGING_PREFIX,
    StagedFile,
    append_rows,
    check_topics,
    read_staged,
    stage_batches,
    staged_names,
)
from mqcore.storage import durable

if TYPE_CHECKING:
    import pyarrow as pa

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    READ_LIMITS = True  # PySpark 4.2+: latestOffset(start, limit), getDefaultReadLimit()
except ImportError:  # PySpark 4.1: latestOffset() alone; AvailableNow runs as one batch
    READ_LIMITS = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in for the 4.2+ mixin."""


Offsets = dict[TopicPartition, int]

COMMIT_METADATA = "mqcore.spark"  # the metadata string of the groupId commits
STREAM_STAGING = f"{STAGING_PREFIX}stream-"  # + query id: marker .json, staging -<uuid>.arrow
MARKER_FORMAT = 1
_QUERY_ID = re.compile(r"[0-9A-Za-z-]{1,64}")


# -- offsets ----------------------------------------------------------------------------------


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """{(topic, partition): offset} in Kafka's checkpoint shape, topics and partitions sorted
    (Spark compares offsets as JSON text: the same offsets must give the same text)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def offsets_from_json(data: object) -> Offsets:
    """The offsets of a checkpoint ({"topic": {"0": n}}, also what Kafka's source writes)."""
    if not isinstance(data, dict):
        raise InvalidConfigError(
            f'a streaming offset must be a JSON object like {{"topic": {{"0": 12}}}}, not '
            f"{json.dumps(data)}"
        )
    out: Offsets = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise InvalidConfigError(
                f"streaming offset of topic {topic!r} must map partitions to offsets, not "
                f"{json.dumps(parts)}"
            )
        for key, offset in parts.items():
            good = isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0
            if not (isinstance(key, str) and key.isdigit() and good):
                raise InvalidConfigError(
                    f"streaming offset of topic {topic!r} maps partition {key!r} to "
                    f"{json.dumps(offset)}; partitions are numbers in quotes and offsets "
                    f"integers >= 0"
                )
            out[(topic, int(key))] = offset
    return out


def rate_limit(
    limit: int, begin: Mapping[TopicPartition, int], until: Offsets, earliest: Offsets
) -> Offsets:
    """Kafka's maxOffsetsPerTrigger: each partition advances by its share of `limit` in
    proportion to its backlog (a share below 1 rounds up, so no partition starves; above 1
    down), never past `until`. A partition missing from `begin` starts at `earliest`."""
    sizes: Offsets = {}
    for tp, end in until.items():
        start = begin.get(tp, earliest.get(tp))
        if start is not None and end - start > 0:
            sizes[tp] = end - start
    total = sum(sizes.values())
    if total < 1:
        return dict(until)
    out: Offsets = {}
    for tp, end in until.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = end
            continue
        share = limit * (size / total)
        step = int(-(-share // 1)) if share < 1 else int(share // 1)
        out[tp] = min(end, (begin[tp] if tp in begin else earliest[tp]) + step)
    return out


# -- reading ----------------------------------------------------------------------------------


class MqcoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Kafka's micro-batch source over a store: offsets from the partition ends, read limits,
    Trigger.AvailableNow, failOnDataLoss, and an optional consumer-group commit."""

    def __init__(self, opts: StreamOptions) -> None:
        self.opts = opts
        self._target: Offsets | None = None  # Trigger.AvailableNow: the ends when it began
        self._latest: Offsets | None = None  # the ends seen last, for reportLatestOffset
        self._last_trigger_ms = 0  # Kafka's: the first trigger never waits for minOffsets
        self._group_committed: Offsets = {}
        self._group_pending: Offsets | None = None  # a commit the writer lock held back
        self.clock = now_ms  # tests drive maxTriggerDelay with their own clock
        if not READ_LIMITS:
            limited = [
                name
                for name, value in (
                    ("maxOffsetsPerTrigger", opts.max_offsets_per_trigger),
                    ("minOffsetsPerTrigger", opts.min_offsets_per_trigger),
                )
                if value is not None
            ]
            if limited:
                raise InvalidConfigError(
                    f"{' and '.join(limited)} need PySpark 4.2 or later: PySpark 4.1 passes "
                    f"a Python stream no read limit, so every micro-batch reads all that is "
                    f"available; drop the option or upgrade PySpark"
                )

    def _open(self) -> contextlib.AbstractContextManager[mqcore.Store]:
        """The driver process's kept read-only handle, lent for one call (mqcore.handles): the
        driver asks for the log's ends at every trigger, and an open each time paid the open;
        the handle is reopened when the store changed and closed after 30 s unused."""
        return shared_store(self.opts.read.path)

    def _log_ends(self, store: mqcore.Store) -> Offsets:
        read = self.opts.read
        return {tp: latest(store, *tp, read.committed)
                for tp in topic_partitions(store, read.subscription)}  # fmt: skip

    def initialOffset(self) -> dict[str, dict[str, int]]:  # noqa: N802 - Spark's names
        """Where a new query starts: startingOffsets / startingTimestamp / ... (default
        latest). A restarted query starts from its checkpoint instead."""
        read = self.opts.read
        with self._open() as store:
            tps = topic_partitions(store, read.subscription)
            starts = resolve_bound(store, read.starting, tps, read.starting_strategy, True,
                                   committed=read.committed)  # fmt: skip
        return offsets_to_json(starts)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Trigger.AvailableNow: fix the target at the log ends now; later appends, and
        partitions that appear later, wait for the next run."""
        with self._open() as store:
            self._target = self._log_ends(store)

    def getDefaultReadLimit(self) -> Any:  # noqa: N802
        """ReadMaxRows(maxOffsetsPerTrigger), else ReadMinRows(minOffsetsPerTrigger), else
        everything. Python's read limits cannot be combined, so when both options are set
        latestOffset applies minOffsetsPerTrigger (and maxTriggerDelay) itself."""
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(  # noqa: N802
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch. Spark calls it only once every batch before
        `start` is done, so `start` is also committed to the groupId here. PySpark 4.1 passes
        no start and no limit: everything available."""
        begin = None if start is None else offsets_from_json(start)
        with self._open() as store:
            latest = self._log_ends(store) if self._target is None else dict(self._target)
            earliest = {
                tp: store.start_offset(*tp)
                for tp in latest
                if begin is not None and tp not in begin
            }
        self._latest = latest
        if begin is None:
            return offsets_to_json(latest)
        self._commit_group(begin)
        return offsets_to_json(self._limited(begin, latest, earliest, limit))

    def _limited(self, begin: Offsets, latest: Offsets, earliest: Offsets, limit: Any) -> Offsets:
        kind = type(limit).__name__
        if limit is None or kind == "ReadAllAvailable":
            return latest
        opts = self.opts
        most = limit.max_rows if kind == "ReadMaxRows" else opts.max_offsets_per_trigger
        least = limit.min_rows if kind == "ReadMinRows" else opts.min_offsets_per_trigger
        # AvailableNow must finish: it never waits for minOffsetsPerTrigger
        if least is not None and self._target is None and self._wait(least, begin, latest):
            return begin
        if most is not None:
            return rate_limit(most, begin, latest, earliest)
        return latest

    def _wait(self, least: int, begin: Offsets, latest: Offsets) -> bool:
        """Kafka's minOffsetsPerTrigger rule: skip this trigger while fewer records than
        `least` are new, unless maxTriggerDelay has passed since the last batch fired."""
        now = self.clock()
        if now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        new = sum(end - begin.get(tp, 0) for tp, end in latest.items())
        if new < least:
            return True
        self._last_trigger_ms = now
        return False

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:  # noqa: N802
        """The log ends seen by the last latestOffset (Spark shows them in the progress)."""
        return None if self._latest is None else offsets_to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Offset ranges [start, end) per partition, checked against the log and split."""
        begin, stop = offsets_from_json(start), offsets_from_json(end)
        opts = self.opts.read
        with self._open() as store:
            for t, p in sorted(set(begin) - set(stop)):
                if opts.fail_on_data_loss:
                    raise OffsetOutOfRangeError(
                        f"data loss: {t}-{p} is no longer in the store (the stream had read "
                        f"it up to offset {begin[(t, p)]}); set failOnDataLoss=false to go on "
                        f"without it"
                    )
            ranges = [
                # a partition new since `start` is read from its beginning, as in Kafka
                checked_range(store, OffsetRange(t, p, begin.get((t, p), 0), e), opts)
                for (t, p), e in sorted(stop.items())
            ]
            ranges = split_ranges(
                ranges, store.segment_offsets, opts.min_partitions, opts.max_records_per_partition
            )
        return [InputPartition(rng) for rng in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # PySpark 4.1 hands read() None for a plan without partitions, later ones
        # InputPartition(None): nothing to read either way
        rng = getattr(partition, "value", None)
        if not isinstance(rng, OffsetRange):
            return
        opts = self.opts.read
        with task_store(opts.path) as store:
            rng = checked_range(store, rng, opts)  # retention may have run since planning
            yield from range_batches(store, rng, opts)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_group(offsets_from_json(end))

    def stop(self) -> None:
        if self._group_pending is not None:
            self._commit_group(self._group_pending)

    def _commit_group(self, position: Offsets) -> None:
        """With groupId: `position` becomes the group's committed offsets (what changed since
        the last commit), through a brief writable open of the store. When another process
        holds the store's writer lock, the commit is skipped with a warning; the next one
        carries the newer position."""
        group = self.opts.group_id
        if group is None:
            return
        changed = {tp: off for tp, off in position.items() if self._group_committed.get(tp) != off}
        if not changed:
            return
        try:
            with mqcore.open(self.opts.read.path) as store:
                now = now_ms()
                OffsetStore(store.log).commit(
                    group,
                    {
                        tp: OffsetAndMetadata(off, COMMIT_METADATA, now)
                        for tp, off in changed.items()
                    },
                )
        except StoreLockedError:
            self._group_pending = dict(position)
            warnings.warn(
                f"groupId {group!r}: {self.opts.read.path} is open for writing in another "
                f"process, so the stream's position was not committed this time; the next "
                f"commit after that writer closes carries it",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        self._group_committed.update(changed)
        self._group_pending = None


# -- writing ----------------------------------------------------------------------------------


@dataclass
class StreamStagedFile(StagedFile):
    """A staged file of one task of a streaming query, and the query it belongs to."""

    query: str


def _query_id(opts: WriteOptions) -> str:
    """This task's query: Spark's query id (kept in the checkpoint, so a restart keeps it),
    else one derived from the checkpointLocation option."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    qid = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    if qid and _QUERY_ID.fullmatch(qid):
        return qid
    if qid:
        return hashlib.sha1(qid.encode(), usedforsecurity=False).hexdigest()[:32]
    return _checkpoint_id(opts, "its tasks")


def _checkpoint_id(opts: WriteOptions, where: str) -> str:
    if opts.checkpoint_location is None:
        raise InvalidConfigError(
            f"the mqcore streaming sink cannot tell which query {where} belong to: Spark sets "
            f"the query id on a streaming query's tasks, or give the checkpointLocation option"
        )
    text = opts.checkpoint_location.rstrip("/")
    return "cp" + hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:32]


def _marker_path(directory: str, query: str) -> str:
    return os.path.join(directory, f"{STREAM_STAGING}{query}.json")


def read_marker(directory: str, query: str) -> dict[str, Any] | None:
    """The query's sink marker: {"batch": N, "state": "committed" | "prepared", ...}."""
    path = _marker_path(directory, query)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as e:
        raise StoreError(f"{path} is not an mqcore streaming-sink marker: {e}") from None
    batch = data.get("batch") if isinstance(data, dict) else None
    state = data.get("state") if isinstance(data, dict) else None
    if not isinstance(batch, int) or state not in ("committed", "prepared"):
        raise StoreError(f"{path} is not an mqcore streaming-sink marker: {data!r}")
    return data


def _write_marker(directory: str, query: str, data: dict[str, Any]) -> None:
    """Replace the marker atomically and durably (write, fsync, rename, fsync the dir)."""
    path = _marker_path(directory, query)
    body = json.dumps({"format": MARKER_FORMAT, "query": query, **data}, sort_keys=True)
    durable.write_atomic(path, body.encode())


def _remove_staged(directory: str, query: str) -> None:
    """Delete the query's staging files, except those a prepared batch still needs."""
    marker = read_marker(directory, query)
    keep = set(marker.get("files", ())) if marker and marker["state"] == "prepared" else set()
    pattern = os.path.join(glob.escape(directory), f"{STREAM_STAGING}{query}-*.arrow")
    for path in glob.glob(pattern):
        if os.path.basename(path) not in keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


Routed = list[tuple[str, int, "pa.Table"]]


def route(store: mqcore.Store, tables: Sequence[pa.Table], topic: str | None, batch: int) -> Routed:
    """Every staged row's partition, decided before anything is appended and the same each
    time for the same files and batch id: the partition column; else murmur2 of the key, as
    Kafka's producer; else round robin from `batch`. Rows keep their order per partition."""
    import pyarrow as pa

    counts: dict[str, int] = {}
    turns: dict[str, int] = {}
    pieces: dict[TopicPartition, list[pa.Table]] = {}
    for table in tables:
        n, names = table.num_rows, table.column_names
        topics = [topic] * n if topic is not None else table.column("topic").to_pylist()
        parts = table.column("partition").to_pylist() if "partition" in names else [None] * n
        keys = table.column("key").to_pylist() if "key" in names else [None] * n
        rows: dict[TopicPartition, list[int]] = {}
        for i in range(n):
            t = topics[i]
            if t not in counts:
                counts[t] = store.partitions(t)
            p, key = parts[i], keys[i]
            if p is None and key is not None:
                p = key_partition(key, counts[t])
            elif p is None:
                turn = turns.get(t, 0)
                turns[t] = turn + 1
                p = (batch + turn) % counts[t]
            elif not 0 <= p < counts[t]:
                raise UnknownPartitionError(
                    f"a row names partition {p} of topic {t!r}, which has {counts[t]} "
                    f"partitions; nothing was written"
                )
            rows.setdefault((t, p), []).append(i)
        for tp, index in rows.items():
            pieces.setdefault(tp, []).append(table.take(pa.array(index, pa.int64())))
    return [(t, p, pa.concat_tables(ts)) for (t, p), ts in sorted(pieces.items())]


def _append_all(store: mqcore.Store, topic: str, partition: int, rows: pa.Table) -> None:
    now = now_ms()
    for start in range(0, rows.num_rows, ROWS_PER_APPEND):
        append_rows(store, topic, partition, rows.slice(start, ROWS_PER_APPEND), now)


def _already_appended(
    store: mqcore.Store, topic: str, partition: int, base: int, rows: pa.Table
) -> int:
    """How many of `rows` an interrupted commit appended from offset `base` (the records
    there equal to the rows, key and value, one after the other)."""
    n = rows.num_rows
    if n == 0 or base >= store.end_offset(topic, partition):
        return 0
    values = rows.column("value").to_pylist()
    keys = rows.column("key").to_pylist() if "key" in rows.column_names else [None] * n
    done = 0
    for m in store.read(topic, partition, base, n):
        if m.offset != base + done or m.key != keys[done] or m.value != values[done]:
            break
        done += 1
        if done == n:
            break
    return done


class MqcoreStreamWriter(DataSourceStreamArrowWriter):
    """Stages each task's rows; the driver appends a micro-batch once per batch id."""

    def __init__(self, opts: WriteOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamStagedFile:
        query = _query_id(self.opts)
        name = f"{STREAM_STAGING}{query}-{uuid.uuid4().hex}.arrow"
        staged = stage_batches(iterator, self.opts.path, name, self.columns)
        return StreamStagedFile(staged.name, staged.rows, query)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Append the batch unless this query already appended batch `batchId` (Spark replays
        a batch after a restart when its own commit log missed it); first complete a batch a
        crash left prepared."""
        query = self._query(messages)
        if query is None:
            return  # no task staged anything: there is nothing to append
        directory = self.opts.path
        names = staged_names(messages)
        try:
            marker = read_marker(directory, query)
            prepared = marker is not None and marker["state"] == "prepared"
            done = -1 if marker is None else marker["batch"]
            if not prepared and (batchId <= done or not names):
                return
            with mqcore.open(directory) as store:
                if marker is not None and prepared:
                    self._complete(store, query, marker)
                if batchId > done and names:
                    self._append(store, query, batchId, names)
        finally:
            _remove_staged(directory, query)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        query = self._query(messages)
        if query is not None:
            _remove_staged(self.opts.path, query)

    def _query(self, messages: Sequence[WriterCommitMessage | None]) -> str | None:
        queries = {m.query for m in messages if isinstance(m, StreamStagedFile)}
        if len(queries) > 1:
            raise StoreError(f"commit messages of several streaming queries: {sorted(queries)}")
        if queries:
            return queries.pop()
        return None if self.opts.checkpoint_location is None else _checkpoint_id(self.opts, "")

    def _append(self, store: mqcore.Store, query: str, batch: int, names: list[str]) -> None:
        directory, topic = self.opts.path, self.opts.topic
        tables = read_staged(directory, names)
        check_topics(store, tables, topic)
        routed = route(store, tables, topic, batch)
        targets = [[t, p, store.end_offset(t, p), rows.num_rows] for t, p, rows in routed]
        prepared = {"batch": batch, "state": "prepared", "files": names, "topic": topic}
        _write_marker(directory, query, {**prepared, "targets": targets})
        for t, p, rows in routed:
            _append_all(store, t, p, rows)
        store.flush()  # the rows are durable before the marker says so
        _write_marker(directory, query, {"batch": batch, "state": "committed"})

    def _complete(self, store: mqcore.Store, query: str, marker: dict[str, Any]) -> None:
        """Finish the appends of a batch a crash interrupted, exactly: per target partition,
        the rows not yet found after its recorded end offset."""
        directory, batch = self.opts.path, marker["batch"]
        try:
            tables = read_staged(directory, marker["files"])
        except FileNotFoundError as e:
            raise StoreError(
                f"cannot complete batch {batch} of streaming query {query}: its staging file "
                f"{e.filename} is gone; {_marker_path(directory, query)} says which partitions "
                f"it was appending to"
            ) from None
        routed = route(store, tables, marker["topic"], batch)
        planned = {(t, p): (base, n) for t, p, base, n in marker["targets"]}
        if {(t, p): rows.num_rows for t, p, rows in routed} != {
            tp: n for tp, (_, n) in planned.items()
        }:
            raise StoreError(
                f"cannot complete batch {batch} of streaming query {query}: its staging files "
                f"no longer route as recorded in {_marker_path(directory, query)}"
            )
        for t, p, rows in routed:
            base = planned[(t, p)][0]
            done = _already_appended(store, t, p, base, rows)
            if done < rows.num_rows:
                _append_all(store, t, p, rows.slice(done))
        store.flush()
        _write_marker(directory, query, {"batch": batch, "state": "committed"})
