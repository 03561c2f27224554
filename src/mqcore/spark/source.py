"""The "mqcore" Python data source: Spark's Kafka source over a store directory, no broker.

What runs where (docs/spark.md "What runs where"): Spark creates MqcoreDataSource in a Python
planner process on the driver, where schema() checks the options; reader() and partitions()
open the store read-only there to resolve offsets and cut the ranges; each task's read() opens
the store read-only on its executor and yields pyarrow RecordBatches that the Cython decoder
built (Store.iter_arrow): no Python object per record. Streaming (streamReader(),
streamWriter()) lives in mqcore.spark.stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import mqcore
from mqcore.errors import InvalidConfigError
from mqcore.spark.extras import EXTRA_COLUMNS, add_extras
from mqcore.spark.options import (
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_stream_options,
    parse_write_options,
)
from mqcore.spark.plan import OffsetRange, checked_range, plan_read
from mqcore.spark.pushdown import Pushdown
from mqcore.spark.sink import MqcoreArrowWriter, sink_columns
from mqcore.spark.stream import MqcoreStreamReader, MqcoreStreamWriter

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore.store import Store

NAME = "mqcore"


def kafka_spark_schema(include_headers: bool = False, include_extras: bool = False) -> StructType:
    """Spark's Kafka source schema, field for field (every field nullable); with
    include_extras, mqcore's msg_id and tag strings after it."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    if include_extras:
        fields += [StructField(name, StringType()) for name in EXTRA_COLUMNS]
    return StructType(fields)


class MqcoreDataSource(DataSource):
    """spark.read / readStream .format("mqcore") and df.write / writeStream .format("mqcore"):
    the Kafka source's and sink's options and columns over a store."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        # called by load(): bad options fail there, as Kafka's do. load() cannot tell a batch
        # read from a stream, so options only a stream takes (startingOffsets=latest, groupId)
        # pass here and a batch read refuses them when it is planned.
        try:
            opts = parse_read_options(self.options)
        except InvalidConfigError as batch_error:
            try:
                opts = parse_stream_options(self.options).read
            except InvalidConfigError as stream_error:
                stream_only = any(k.lower() == "groupid" for k in self.options)
                raise (stream_error if stream_only else batch_error) from None
        return kafka_spark_schema(opts.include_headers, opts.include_extras)

    def reader(self, schema: StructType) -> MqcoreReader:
        opts = parse_read_options(self.options)
        _check_schema(schema, opts)
        return MqcoreReader(opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = parse_write_options(self.options)
        if overwrite:
            raise InvalidConfigError(
                "the mqcore sink only appends (a log is never overwritten): use .mode('append')"
            )
        return MqcoreArrowWriter(opts, _sink_columns(schema, opts))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        opts = parse_stream_options(self.options)
        _check_schema(schema, opts.read)
        return MqcoreStreamReader(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        opts = parse_write_options(self.options, streaming=True)
        if overwrite:
            raise InvalidConfigError(
                "the mqcore sink only appends (a log is never overwritten): use "
                ".outputMode('append'), not 'complete'"
            )
        return MqcoreStreamWriter(opts, _sink_columns(schema, opts))


class MqcorePushdownDataSource(MqcoreDataSource):
    """The same source with a reader that takes filters (spark.sql.python.filterPushdown)."""

    def reader(self, schema: StructType) -> MqcorePushdownReader:
        opts = parse_read_options(self.options)
        _check_schema(schema, opts)
        return MqcorePushdownReader(opts)


def _sink_columns(schema: StructType, opts: WriteOptions) -> list[str]:
    """The sink columns of `schema`, checked, and the store and `topic` option checked."""
    columns = sink_columns(schema, opts)
    with mqcore.open(opts.path, read_only=True) as store:  # StoreError when it is not one
        if opts.topic is not None:
            store.partitions(opts.topic)  # UnknownTopicError naming it
    return columns


def _check_schema(schema: StructType, opts: ReadOptions) -> None:
    want = kafka_spark_schema(opts.include_headers, opts.include_extras)
    if schema != want:
        raise InvalidConfigError(
            f"the mqcore source has the fixed schema of Spark's Kafka source and takes no "
            f"other: drop .schema(...) (asked for {schema.simpleString()}, it reads "
            f"{want.simpleString()})"
        )


class MqcoreReader(DataSourceReader):
    """Plans offset ranges from the store's indexes and reads them as Arrow batches."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.pushdown = Pushdown()
        # rows the decoder built in this process before the pushed filters dropped any: what
        # a plan read (tests compare plans with it; Spark's tasks each count their own)
        self.rows_decoded = 0

    def partitions(self) -> Sequence[InputPartition]:
        with mqcore.open(self.opts.path, read_only=True) as store:
            ranges = plan_read(store, self.opts, self.pushdown.narrow)
        return [InputPartition(rng) for rng in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # PySpark 4.1 hands read() None for a plan without partitions, later ones
        # InputPartition(None): nothing to read either way
        rng = getattr(partition, "value", None)
        if not isinstance(rng, OffsetRange):
            return
        opts = self.opts
        with mqcore.open(opts.path, read_only=True) as store:
            rng = checked_range(store, rng, opts)  # retention may have run since planning
            for batch in self._coalesced(self._filtered(store, rng)):
                if opts.include_extras:
                    batch = add_extras(batch, rng.topic, rng.partition, opts.include_headers)
                yield batch

    def _filtered(self, store: Store, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
        """The decoder's batches of the range (only its pieces; with a value needle, only
        batches holding it), each cut down to the rows the pushed filters keep."""
        opts, push = self.opts, self.pushdown
        t, p = rng.topic, rng.partition
        limits: dict[str, Any] = {
            "include_headers": opts.include_headers or opts.include_extras,
            "max_records": opts.max_records_per_batch,
            "max_bytes": opts.max_bytes_per_batch,
        }
        for lo, hi in rng.spans():
            if push.needles:
                needle = max(push.needles, key=len)
                batches = store.iter_arrow_holding(t, p, lo, hi, needle, **limits)
            else:
                batches = store.iter_arrow(t, p, lo, hi, **limits)
            for batch in batches:
                self.rows_decoded += batch.num_rows
                kept = push.filter_batch(batch)
                if kept.num_rows:
                    yield kept

    def _coalesced(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches, small neighbours (pieces of a lookup, filtered rows) joined up to the
        batch bounds, so Spark gets few batches."""
        max_rows, max_bytes = self.opts.max_records_per_batch, self.opts.max_bytes_per_batch
        pending: list[pa.RecordBatch] = []
        rows = size = 0
        for batch in batches:
            if pending and (rows + batch.num_rows > max_rows or size + batch.nbytes > max_bytes):
                yield _joined(pending)
                pending, rows, size = [], 0, 0
            pending.append(batch)
            rows, size = rows + batch.num_rows, size + batch.nbytes
        if pending:
            yield _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    import pyarrow as pa

    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class MqcorePushdownReader(MqcoreReader):
    """MqcoreReader that answers partition, offset, timestamp and topic comparisons from the
    store's indexes, key and msg_id lookups from the key index and the ID itself, and a value
    needle with the search kernel; Spark evaluates every filter it hands back."""

    def pushFilters(self, filters: list[Any]) -> list[Any]:  # noqa: N802 - Spark's name
        return self.pushdown.push(filters)
