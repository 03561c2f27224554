"""df.write.format("mqcore").mode("append"): Spark's Kafka sink columns into a store.

A store has one writer process (its lock), and a job's tasks run in many; so tasks stage and
the driver appends:
  write()   (each task attempt) the rows, as given, into its own Arrow IPC file at the top of
            the store directory, `.mqcore-spark-<job>-<attempt>.arrow` (Kafka ignores files
            there; mqcore reads only partition directories), and returns its name;
  commit()  (the driver, once every task succeeded) opens the store for writing, checks every
            staged row's topic before appending anything, appends the files of the successful
            attempts as record batches, then deletes every staging file of the job;
  abort()   (the driver, after a failed task) deletes them: nothing becomes visible.
A retried task's earlier attempt never reaches commit, so nothing is appended twice.
The streaming sink (mqcore.spark.stream) stages, checks topics and appends rows with the same
functions (stage_batches, read_staged, check_topics, append_rows).
"""

from __future__ import annotations

import contextlib
import glob
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import mqcore
from mqcore.errors import InvalidConfigError, InvalidRecordError, UnknownTopicError
from mqcore.log.internal import refuse_internal
from mqcore.spark.options import WriteOptions

if TYPE_CHECKING:
    import pyarrow as pa

STAGING_PREFIX = ".mqcore-spark-"
ROWS_PER_APPEND = 10_000  # rows per append_batch (a larger batch is split to fit anyway)

_BYTES = (BinaryType(), StringType())
_HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
# the Kafka sink's columns and the types each may have; `timestamp` is mqcore's addition
SINK_COLUMNS: dict[str, tuple[DataType, ...]] = {
    "key": _BYTES,
    "value": _BYTES,
    "topic": (StringType(),),
    "partition": (IntegerType(),),
    "headers": (_HEADERS,),
    "timestamp": (TimestampType(),),
}


def sink_columns(schema: StructType, opts: WriteOptions) -> list[str]:
    """The sink columns present in `schema`, checked; other columns are ignored, as Kafka's
    sink ignores them."""
    present = {f.name: f.dataType for f in schema.fields if f.name in SINK_COLUMNS}
    if "value" not in present:
        raise InvalidConfigError(
            f"the mqcore sink needs a 'value' column (binary or string); the data has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}"
        )
    if opts.topic is None and "topic" not in present:
        raise InvalidConfigError(
            "the mqcore sink needs a 'topic' column or the 'topic' option to know where rows go"
        )
    for name, dtype in present.items():
        allowed = SINK_COLUMNS[name]
        if dtype not in allowed:
            raise InvalidConfigError(
                f"column {name!r} is {dtype.simpleString()}; the mqcore sink takes "
                f"{' or '.join(t.simpleString() for t in allowed)}"
            )
    return [name for name in SINK_COLUMNS if name in present]


@dataclass
class StagedFile(WriterCommitMessage):
    """What one successful task attempt staged: a file name in the store directory."""

    name: str | None
    rows: int


class MqcoreArrowWriter(DataSourceArrowWriter):
    """Stages each task's rows; the driver appends them all at commit."""

    def __init__(self, opts: WriteOptions, columns: list[str]) -> None:
        self.opts = opts
        self.columns = columns
        self.job = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        name = f"{STAGING_PREFIX}{self.job}-{uuid.uuid4().hex}.arrow"
        return stage_batches(iterator, self.opts.path, name, self.columns)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        try:
            tables = read_staged(self.opts.path, staged_names(messages))
            with mqcore.open(self.opts.path) as store:
                check_topics(store, tables, self.opts.topic)
                for table in tables:
                    self._append(store, table)
        finally:
            self._remove_staged()

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self._remove_staged()

    def _remove_staged(self) -> None:
        for path in glob.glob(
            os.path.join(glob.escape(self.opts.path), f"{STAGING_PREFIX}{self.job}-*")
        ):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _append(self, store: mqcore.Store, table: pa.Table) -> None:
        import pyarrow.compute as pc

        now_ms = store.log.clock()
        if self.opts.topic is not None:
            groups = [(self.opts.topic, table)]
        else:
            groups = [
                (t, table.filter(pc.equal(table.column("topic"), t)))
                for t in pc.unique(table.column("topic")).to_pylist()
            ]
        for topic, rows in groups:
            for start in range(0, rows.num_rows, ROWS_PER_APPEND):
                chunk = rows.slice(start, ROWS_PER_APPEND)
                for partition, part_rows in _by_partition(chunk):
                    append_rows(store, topic, partition, part_rows, now_ms)


def stage_batches(
    iterator: Iterator[pa.RecordBatch], directory: str, name: str, columns: list[str]
) -> StagedFile:
    """A task's rows, sink columns only, into the Arrow IPC file `name` in the store
    directory (created only when there is a row)."""
    import pyarrow as pa

    path = os.path.join(directory, name)
    rows = 0
    out: Any = None
    try:
        for batch in iterator:
            if not batch.num_rows:
                continue
            staged = pa.RecordBatch.from_arrays(
                [_staged_column(batch, c) for c in columns], names=columns
            )
            if out is None:
                out = pa.ipc.new_file(path, staged.schema)
            out.write_batch(staged)
            rows += staged.num_rows
    finally:
        if out is not None:
            out.close()
    return StagedFile(name if out is not None else None, rows)


def staged_names(messages: Sequence[WriterCommitMessage | None]) -> list[str]:
    """The staging files the successful task attempts name, in task order."""
    return [m.name for m in messages if isinstance(m, StagedFile) and m.name]


def read_staged(directory: str, names: Sequence[str]) -> list[pa.Table]:
    import pyarrow as pa

    return [pa.ipc.open_file(os.path.join(directory, n)).read_all() for n in names]


def check_topics(store: mqcore.Store, tables: Sequence[pa.Table], topic: str | None) -> None:
    """Every topic the rows name (or the `topic` option) must exist: checked before the first
    append."""
    import pyarrow.compute as pc

    if topic is not None:
        store.partitions(topic)  # UnknownTopicError naming it
        refuse_internal(topic)  # before any row: a refusal after some rows would leave half
        return
    for table in tables:
        topics = table.column("topic")
        if topics.null_count:
            raise InvalidRecordError(
                "a row has a null topic; set the 'topic' option to give such rows one"
            )
        for name in pc.unique(topics).to_pylist():
            refuse_internal(name)
            if name not in store.topics():
                raise UnknownTopicError(
                    f"topic {name!r} of the data does not exist in {store.path}; nothing "
                    f"was written"
                )


def _staged_column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """The column as staged: string keys and values become their UTF-8 bytes, as Kafka's sink
    writes them."""
    import pyarrow as pa

    column = batch.column(name)
    if name in ("key", "value") and pa.types.is_string(column.type):
        return column.cast(pa.binary())
    return column


def _by_partition(table: pa.Table) -> list[tuple[int | None, pa.Table]]:
    """Rows per explicit partition; rows with a null (or no) partition are routed by key."""
    import pyarrow.compute as pc

    if "partition" not in table.column_names:
        return [(None, table)]
    column = table.column("partition")
    out: list[tuple[int | None, pa.Table]] = [
        (p, table.filter(pc.equal(column, p)))
        for p in pc.unique(column).to_pylist()
        if p is not None
    ]
    if column.null_count:
        out.append((None, table.filter(pc.is_null(column))))
    return out


def append_rows(
    store: mqcore.Store, topic: str, partition: int | None, rows: pa.Table, now_ms: int
) -> None:
    """Append staged rows to one topic: to `partition`, or routed by key when None."""
    import pyarrow as pa

    names = rows.column_names
    values = rows.column("value").to_pylist()
    keys = rows.column("key").to_pylist() if "key" in names else None
    headers = None
    if "headers" in names:
        headers = [
            [(h["key"], h["value"]) for h in hs or ()] for hs in rows.column("headers").to_pylist()
        ]
    timestamps = None
    if "timestamp" in names:
        micros = rows.column("timestamp").cast(pa.int64()).to_pylist()
        timestamps = [now_ms if m is None else m // 1000 for m in micros]
    if partition is None and keys is not None:
        store.append_batch(topic, values, keys, headers, partition=None, timestamps=timestamps)
    elif partition is None:
        store.append_batch(topic, values, None, headers, partition=None, timestamps=timestamps)
    else:
        store.append_batch(topic, values, keys, headers, partition, timestamps)
