"""The "mqcore" Python data source: Spark's Kafka source over a store directory, no broker.

What runs where (docs/spark.md "What runs where"): Spark creates MqcoreDataSource in a Python
planner process on the driver, where schema() checks the options; reader() and partitions()
read the store there to check the bounds and cut the ranges into tasks (ReadSlots); each
task's read() reads it on its executor, resolves its range against the log as it is then (a
reused DataFrame's plan is reused by Spark), and yields pyarrow RecordBatches that the Cython
decoder built (Store.iter_arrow): no Python object per record. Both read through the worker
process's kept read-only handle (handles.py), reopened whenever the store changed on disk.
Streaming (streamReader(), streamWriter()) lives in mqcore.spark.stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

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
from mqcore.handles import shared_store
from mqcore.spark.batches import range_batches, task_store
from mqcore.spark.extras import EXTRA_COLUMNS
from mqcore.spark.options import (
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_stream_options,
    parse_write_options,
)
from mqcore.spark.plan import ReadSlot, plan_slots, read_ranges
from mqcore.spark.sink import MqcoreArrowWriter, sink_columns
from mqcore.spark.stream import MqcoreStreamReader, MqcoreStreamWriter

if TYPE_CHECKING:
    import pyarrow as pa

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
    """Plans the read's tasks from the store's indexes and reads them as Arrow batches.

    PySpark reuses one reader and its partitions() for every query of a DataFrame, so the
    reader holds only the options, and each task resolves its range when it runs (plan.py,
    docs/spark.md "Reusing a DataFrame"). It takes no filters: Spark evaluates them all."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with shared_store(self.opts.path) as store:
            slots = plan_slots(store, self.opts)
        return [InputPartition(slot) for slot in slots]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        slot = partition.value
        if not isinstance(slot, ReadSlot):
            raise TypeError(f"an mqcore batch task needs a ReadSlot, not {slot!r}")
        with task_store(self.opts.path) as store:
            for rng in read_ranges(store, self.opts, slot):
                yield from range_batches(store, rng, self.opts)
