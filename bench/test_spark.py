"""Spark (issue 5): the same count and the same filter over 2,000,000 messages through the
mqcore source, from Parquet files holding the same rows, and from a row-yielding Python data
source (the BASELINE below: what a plain Python source that yields tuples gives).

One local[2] session serves the module.
The store (2 partitions of ~200-byte log lines with keys, as `bench/test_query.py` writes
them) is built once per session; the Parquet files are written once from the store's own Arrow
batches, so they hold exactly the same rows and columns (the Kafka source's seven). Each side
reads its 2 partitions / 2 files with 2 tasks. A fourth side, "arrow-floor", is a Python
source yielding Arrow batches it already holds: what Spark's Python data source API costs by
itself (Arrow to the JVM, rows, the query), under any Python source; it runs the count, the
filter and the group-by (its rows repeat the first 65,536 of each partition, so its filter
finds its own number of matches, floor_matches). Parquet's count
reads no column (row-group metadata); Python sources have no column pruning, so every side
above hands Spark all seven columns. Queries, each a Spark action:
  count    df.count()
  filter   df.where("contains(value, X'...')").count(): Spark evaluates it on every row
           (no source gets it: Spark pushes no filter for a binary column's contains)
  key      df.where("key = X'...'").count(): Spark evaluates it on every row of the mqcore
           source (no filter reaches its reader since the DataFrame-reuse fix: docs/spark.md);
           Parquet gets it pushed (row-group statistics; keys are spread, so they skip nothing)
A second, smaller data set (600,000 messages in 4 partitions, Parquet one file each) runs the
filter, then groupBy("partition").count() (4 tasks and a shuffle: where a query's fixed cost
shows), mqcore against Parquet.
"""

from __future__ import annotations

import datetime
import os
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from benchdata import SEED, SEGMENT_BYTES, log_line, message_timestamp, record
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore

pyspark = pytest.importorskip("pyspark", reason="PySpark is not installed")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceReader,
    InputPartition,
)
from pyspark.sql.types import StructType  # noqa: E402

import mqcore.spark  # noqa: E402
from mqcore.spark.source import kafka_spark_schema  # noqa: E402

SPARK_MESSAGES = 2_000_000
SPARK_PARTITIONS = 2
SPARK_TOPIC = "logs"
SMALL_MESSAGES = 600_000  # the group-by benchmark: 4 partitions, 4 tasks
SMALL_PARTITIONS = 4
SPARK_KEYS = 100_000  # distinct keys: 20 messages each
NEEDLE = b"payments-11.internal"  # in about 1 line of 60
LOOKUP_KEY = b"cust-%06d" % 4242
BATCH = 1000  # messages per append_batch
ROWS_READ_CHUNK = 1000
FLOOR_ROWS = 65536  # the arrow-floor source's batch, yielded over and over
UTC = datetime.timezone.utc
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class SparkData:
    store_path: str
    parquet_path: str
    messages: int
    needle_matches: int
    key_matches: int
    log_bytes: int


def key_of(i: int) -> bytes:
    return b"cust-%06d" % (i * 7919 % SPARK_KEYS)


def build_spark_data(
    directory: str, messages: int = SPARK_MESSAGES, partitions: int = SPARK_PARTITIONS
) -> SparkData:
    """The store (batches of 1000 to the partitions in turn) and the Parquet copy of it, one
    file per partition."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(SEED + 29)
    store_path = os.path.join(directory, "store")
    needle_matches = key_matches = 0
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic(
            SPARK_TOPIC, partitions=partitions, segment_bytes=SEGMENT_BYTES, unique_ids=False
        )
        for lo in range(0, messages, BATCH):
            values = [log_line(rng, i) for i in range(lo, lo + BATCH)]
            keys = [key_of(i) for i in range(lo, lo + BATCH)]
            needle_matches += sum(NEEDLE in v for v in values)
            key_matches += keys.count(LOOKUP_KEY)
            stamps = [message_timestamp(i) for i in range(lo, lo + BATCH)]
            partition = lo // BATCH % partitions
            store.append_batch(SPARK_TOPIC, values, keys, partition=partition, timestamps=stamps)
    parquet_path = os.path.join(directory, "parquet")
    os.makedirs(parquet_path)
    log_bytes = 0
    with mqcore.open(store_path, read_only=True) as store:
        for p in range(partitions):
            end = store.end_offset(SPARK_TOPIC, p)
            table = pa.Table.from_batches(list(store.iter_arrow(SPARK_TOPIC, p, 0, end)))
            pq.write_table(table, os.path.join(parquet_path, f"part-{p}.parquet"))
            part_dir = os.path.join(store_path, f"{SPARK_TOPIC}-{p}")
            log_bytes += sum(
                os.path.getsize(os.path.join(part_dir, n))
                for n in os.listdir(part_dir)
                if n.endswith(".log")
            )
    return SparkData(store_path, parquet_path, messages, needle_matches, key_matches, log_bytes)


# -- the BASELINE: a row-yielding Python data source (not mqcore's source) -----------------------


class RowsBaselineSource(DataSource):
    """BASELINE for the benchmark, not mqcore's source: a Python data source over the same
    store whose read() yields one tuple per message (Store.read, then the Kafka columns, the
    timestamp as a datetime), as a source written without Arrow does."""

    @classmethod
    def name(cls) -> str:
        return "mqcore_rows_baseline"

    def schema(self) -> StructType:
        return kafka_spark_schema()

    def reader(self, schema: StructType) -> RowsBaselineReader:
        return RowsBaselineReader(self.options["path"], self.options["topic"])


class RowsBaselineReader(DataSourceReader):
    def __init__(self, path: str, topic: str) -> None:
        self.path, self.topic = path, topic

    def partitions(self) -> Sequence[InputPartition]:
        with mqcore.open(self.path, read_only=True) as store:
            return [InputPartition(p) for p in store.available_partitions(self.topic)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        with mqcore.open(self.path, read_only=True) as store:
            offset = 0
            while True:
                messages = store.read(self.topic, partition.value, offset, ROWS_READ_CHUNK)
                if not messages:
                    return
                for m in messages:
                    ts = EPOCH + datetime.timedelta(milliseconds=m.timestamp)
                    yield (m.key, m.value, m.topic, m.partition, m.offset, ts, m.timestamp_type)
                offset = messages[-1].offset + 1


class ArrowFloorSource(DataSource):
    """Not a real source: yields the first 64k records of each partition, decoded once per
    task, over and over up to the partition's size. What Spark's Python data source API costs
    with no reading at all (the Arrow transfer to the JVM and the count): the floor under any
    Python source, mqcore's included."""

    @classmethod
    def name(cls) -> str:
        return "mqcore_arrow_floor"

    def schema(self) -> StructType:
        return kafka_spark_schema()

    def reader(self, schema: StructType) -> ArrowFloorReader:
        return ArrowFloorReader(self.options["path"], self.options["topic"])


class ArrowFloorReader(DataSourceReader):
    def __init__(self, path: str, topic: str) -> None:
        self.path, self.topic = path, topic

    def partitions(self) -> Sequence[InputPartition]:
        with mqcore.open(self.path, read_only=True) as store:
            return [
                InputPartition((p, store.end_offset(self.topic, p)))
                for p in store.available_partitions(self.topic)
            ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        p, size = partition.value
        with mqcore.open(self.path, read_only=True) as store:
            (batch,) = store.iter_arrow(self.topic, p, 0, FLOOR_ROWS, max_records=FLOOR_ROWS)
        sent = 0
        while sent < size:
            piece = batch.slice(0, min(batch.num_rows, size - sent))
            sent += piece.num_rows
            yield piece


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark_data(tmp_path_factory: pytest.TempPathFactory) -> SparkData:
    return build_spark_data(str(tmp_path_factory.mktemp("spark")))


@pytest.fixture(scope="module")
def small_spark_data(tmp_path_factory: pytest.TempPathFactory) -> SparkData:
    """600,000 messages in 4 partitions: where a query's fixed cost shows."""
    return build_spark_data(
        str(tmp_path_factory.mktemp("spark-small")), SMALL_MESSAGES, SMALL_PARTITIONS
    )


@pytest.fixture(scope="module")
def bench_session() -> Iterator[SparkSession]:
    """local[2], filter pushdown on; the Python workers run this interpreter and import mqcore
    and this module (the baseline source) from where this process does."""
    roots = [os.path.dirname(os.path.dirname(os.path.abspath(mqcore.__file__))),
             os.path.dirname(os.path.abspath(__file__))]  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYTHONPATH")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, saved["PYTHONPATH"]]))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("mqcore-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config(mqcore.spark.PUSHDOWN_CONF, "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    mqcore.spark.register(spark)
    spark.dataSource.register(RowsBaselineSource)
    spark.dataSource.register(ArrowFloorSource)
    try:
        yield spark
    finally:
        spark.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def frame(spark: SparkSession, data: SparkData, side: str) -> DataFrame:
    if side == "mqcore":
        return spark.read.format("mqcore").option("subscribe", SPARK_TOPIC).load(data.store_path)
    if side == "parquet":
        return spark.read.parquet(data.parquet_path)
    source = "mqcore_rows_baseline" if side == "rows" else "mqcore_arrow_floor"
    return spark.read.format(source).option("topic", SPARK_TOPIC).load(data.store_path)


def run_query(spark: SparkSession, data: SparkData, side: str, query: str) -> int:
    df = frame(spark, data, side)
    if query == "filter":
        df = df.where(f"contains(value, X'{NEEDLE.hex()}')")
    elif query == "key":
        df = df.where(f"key = X'{LOOKUP_KEY.hex()}'")
    return df.count()


def expected(data: SparkData, query: str, side: str = "mqcore") -> int:
    if side == "arrow-floor" and query == "filter":
        return sum(floor_matches(data).values())
    return {"count": data.messages, "filter": data.needle_matches, "key": data.key_matches}[query]


def floor_matches(data: SparkData) -> dict[int, int]:
    """The needle's matches per partition in what the arrow-floor source yields: its first
    65,536 records over and over, up to the partition's size."""
    found = {}
    with mqcore.open(data.store_path, read_only=True) as store:
        for p in store.available_partitions(SPARK_TOPIC):
            size = store.end_offset(SPARK_TOPIC, p)
            head = [NEEDLE in (m.value or b"") for m in store.read(SPARK_TOPIC, p, 0, FLOOR_ROWS)]
            whole, rest = divmod(size, len(head))
            found[p] = whole * sum(head) + sum(head[:rest])
    return found


# -- benchmarks ----------------------------------------------------------------------------------


def test_spark_answers_agree(bench_session: SparkSession, spark_data: SparkData) -> None:
    """Every side gives the store's answer to every query; Parquet holds the same rows."""
    assert spark_data.needle_matches > 1000 and spark_data.key_matches == 20
    for side in ("mqcore", "parquet", "rows"):
        for query in ("count", "filter", "key"):
            assert run_query(bench_session, spark_data, side, query) == expected(spark_data, query)
    sample = "offset < 300 AND partition = 1"
    got = {
        side: frame(bench_session, spark_data, side).where(sample).orderBy("offset").collect()
        for side in ("mqcore", "parquet", "rows")
    }
    assert len(got["mqcore"]) == 300 and got["mqcore"] == got["parquet"] == got["rows"]


SIDES = {"mqcore": (5, 1), "parquet": (5, 1), "rows": (3, 0), "arrow-floor": (5, 1)}
QUERIES = [(query, side) for query in ("count", "filter") for side in SIDES]


@pytest.mark.parametrize(("query", "side"), QUERIES)
def test_spark_query(
    benchmark: BenchmarkFixture,
    bench_session: SparkSession,
    spark_data: SparkData,
    query: str,
    side: str,
) -> None:
    """One Spark action over the 2,000,000 messages."""
    rounds, warmup = SIDES[side]  # the row source is slow: three rounds, no warm-up
    benchmark.group = f"spark-{query}"
    record(benchmark, f"spark/{query}/{side}", messages=spark_data.messages,
           nbytes=spark_data.log_bytes)  # fmt: skip
    found = benchmark.pedantic(
        run_query,
        args=(bench_session, spark_data, side, query),
        rounds=rounds,
        warmup_rounds=warmup,
        iterations=1,
    )
    assert found == expected(spark_data, query, side)


@pytest.mark.parametrize("side", ["mqcore", "parquet"])
def test_spark_key_lookup(
    benchmark: BenchmarkFixture, bench_session: SparkSession, spark_data: SparkData, side: str
) -> None:
    """key = X: mqcore plans the batches its key index names; Parquet filters every row group."""
    benchmark.group = "spark-key"
    record(benchmark, f"spark/key/{side}", messages=spark_data.messages, ops=1)
    found = benchmark.pedantic(
        run_query,
        args=(bench_session, spark_data, side, "key"),
        rounds=5,
        warmup_rounds=1,
        iterations=1,
    )
    assert found == spark_data.key_matches


def group_query(spark: SparkSession, data: SparkData, side: str) -> dict[int, int]:
    """contains(value, NEEDLE), then the matches per partition: Spark's filter on every row,
    an aggregation and a shuffle (two stages)."""
    df = frame(spark, data, side)  # Parquet: a file per partition, rows carry the partition
    rows = df.where(f"contains(value, X'{NEEDLE.hex()}')").groupBy("partition").count().collect()
    return {r["partition"]: r["count"] for r in rows}


@pytest.mark.parametrize("side", ["mqcore", "parquet", "arrow-floor"])
def test_spark_filter_groupby_small(
    benchmark: BenchmarkFixture, bench_session: SparkSession, small_spark_data: SparkData, side: str
) -> None:
    """contains-filter, group by partition, count: 600,000 messages in 4 partitions (4 tasks)."""
    benchmark.group = "spark-filter-groupby-600k"
    record(benchmark, f"spark/filter-groupby-600k/{side}", messages=small_spark_data.messages,
           nbytes=small_spark_data.log_bytes)  # fmt: skip
    found = benchmark.pedantic(
        group_query,
        args=(bench_session, small_spark_data, side),
        rounds=7,
        warmup_rounds=1,
        iterations=1,
    )
    if side == "arrow-floor":
        assert found == floor_matches(small_spark_data)
    else:
        assert sum(found.values()) == small_spark_data.needle_matches
    assert len(found) == SMALL_PARTITIONS


# -- query options (issue 35): the store's engine in the reader vs Spark's own filter ----------

LEVELS = ("INFO", "WARN", "DEBUG")  # with "ERROR" on 1 record in 20: `where` is 5 % selective


@dataclass
class QueryData:
    store_path: str
    messages: int
    key_matches: int
    error_matches: int
    needle_matches: int


@pytest.fixture(scope="module")
def query_data(tmp_path_factory: pytest.TempPathFactory) -> QueryData:
    """2,000,000 log lines in 2 partitions, keyed as `spark_data` (20 records a key), each
    with a `level` property: ERROR on every 20th record (5 %)."""
    rng = random.Random(SEED + 35)
    path = os.path.join(str(tmp_path_factory.mktemp("spark-query")), "store")
    key_matches = error_matches = needle_matches = 0
    with mqcore.open(path, flush="os") as store:
        store.create_topic(SPARK_TOPIC, partitions=SPARK_PARTITIONS, segment_bytes=SEGMENT_BYTES)
        for lo in range(0, SPARK_MESSAGES, BATCH):
            values = [log_line(rng, i) for i in range(lo, lo + BATCH)]
            keys = [key_of(i) for i in range(lo, lo + BATCH)]
            levels = ["ERROR" if i % 20 == 7 else LEVELS[i % 3] for i in range(lo, lo + BATCH)]
            key_matches += keys.count(LOOKUP_KEY)
            error_matches += levels.count("ERROR")
            needle_matches += sum(NEEDLE in v for v in values)
            store.append_batch(SPARK_TOPIC, values, keys, partition=lo // BATCH % SPARK_PARTITIONS,
                               timestamps=[message_timestamp(i) for i in range(lo, lo + BATCH)],
                               properties=[{"level": v} for v in levels])  # fmt: skip
    return QueryData(path, SPARK_MESSAGES, key_matches, error_matches, needle_matches)


SPARK_FILTERS = {  # Spark's own filter on the same DataFrame's columns
    "key": f"key = X'{LOOKUP_KEY.hex()}'",
    "where": "exists(headers, h -> h.key = 'level' AND h.value = CAST('ERROR' AS BINARY))",
    "contains": f"CAST(value AS STRING) LIKE '%{NEEDLE.decode()}%'",
}
QUERY_OPTIONS = {"key": LOOKUP_KEY.decode(), "where": "level = 'ERROR'",
                 "contains": NEEDLE.decode()}  # fmt: skip


def query_count(spark: SparkSession, data: QueryData, query: str, side: str) -> int:
    """One count: the option answered in the reader, or Spark's filter over every record."""
    reader = spark.read.format("mqcore").option("subscribe", SPARK_TOPIC)
    if query == "where":
        reader = reader.option("includeHeaders", "true")
    if side == "option":
        return reader.option(query, QUERY_OPTIONS[query]).load(data.store_path).count()
    return reader.load(data.store_path).where(SPARK_FILTERS[query]).count()


def query_expected(data: QueryData, query: str) -> int:
    return {"key": data.key_matches, "where": data.error_matches,
            "contains": data.needle_matches}[query]  # fmt: skip


@pytest.mark.parametrize("side", ["option", "spark-filter"])
@pytest.mark.parametrize("query", ["key", "where", "contains"])
def test_spark_query_option(
    benchmark: BenchmarkFixture,
    bench_session: SparkSession,
    query_data: QueryData,
    query: str,
    side: str,
) -> None:
    """The same count two ways: the query option (the key index, the SQL92 kernel, the
    needle scan, in the reader) against Spark's filter on the same DataFrame's rows."""
    benchmark.group = f"spark-option-{query}"
    record(benchmark, f"spark/option/{query}/{side}", messages=query_data.messages, ops=1)
    found = benchmark.pedantic(query_count, args=(bench_session, query_data, query, side),
                               rounds=3, warmup_rounds=1, iterations=1)  # fmt: skip
    assert found == query_expected(query_data, query)
