"""One DataFrame queried again and again (issue 16, item 1): PySpark keeps a Python data
source's read plan per DataFrame, so every query of a reused DataFrame must answer what a
fresh DataFrame answers, whatever the queries before it filtered, with filter pushdown on or
off, after appends and after retention. Each answer is compared with the store read directly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import mqcore
import mqcore.spark

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from pyspark.errors import PySparkException  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

T0 = 1_700_000_000_000
Key = tuple[str, int, int]  # topic, partition, offset
Record = tuple[str, int, int, bytes | None, bytes | None, int]  # + key, value, timestamp (ms)


def fill(path: str, topic: str, partitions: dict[int, int], start: int = 0, **config: Any) -> None:
    """Append records to `topic` (created when missing): `partitions` maps a partition to how
    many; the i-th record overall has key k<i % 40>, value v<i>, timestamp T0 + 5 i."""
    with mqcore.open(path, flush="os") as st:
        if topic not in st.topics():
            st.create_topic(topic, partitions=3, segment_bytes=2000, **config)
        i = start
        for p, n in sorted(partitions.items()):
            for _ in range(n):
                st.append(topic, b"v%d" % i, key=b"k%d" % (i % 40), partition=p,
                          timestamp=T0 + 5 * i)  # fmt: skip
                i += 1


def stored(path: str, *topics: str) -> list[Record]:
    """Every record of the topics, through Store.read (the answer Spark must match)."""
    out: list[Record] = []
    with mqcore.open(path, read_only=True) as st:
        for t in topics:
            for p in st.available_partitions(t):
                for m in st.read(t, p, st.start_offset(t, p), 1_000_000):
                    out.append((t, p, m.offset, m.key, m.value, m.timestamp))
    return out


def spark_records(df: DataFrame) -> list[Record]:
    table = df.select("topic", "partition", "offset", "key", "value", "timestamp").toArrow()
    cols = [c.to_pylist() for c in table.columns[:5]]
    millis = table.column("timestamp").cast(pa.int64()).to_pylist()
    return sorted((*row, us // 1000) for *row, us in zip(*cols, millis, strict=True))


# each query: (name, what it does to the DataFrame, the same test on a stored record)
Query = tuple[str, Callable[[DataFrame], DataFrame], Callable[[Record], bool]]
QUERIES: list[Query] = [
    (
        "a time window",
        lambda df: df.filter(
            f"timestamp >= timestamp_millis({T0 + 500}) "
            f"AND timestamp < timestamp_millis({T0 + 1200})"
        ),
        lambda r: T0 + 500 <= r[5] < T0 + 1200,
    ),
    ("everything", lambda df: df, lambda r: True),
    ("one key", lambda df: df.filter(F.col("key") == b"k7"), lambda r: r[3] == b"k7"),
    ("all rows again", lambda df: df.select("*"), lambda r: True),
    (
        "partition and offsets",
        lambda df: df.filter("partition = 1 AND offset >= 3"),
        lambda r: r[1] == 1 and r[2] >= 3,
    ),
    ("a count without a filter", lambda df: df, lambda r: True),
]


def check_queries(df: DataFrame, want: list[Record]) -> None:
    """Every query of QUERIES on the one DataFrame, in order, against the store."""
    for name, query, keep in QUERIES:
        expected = sorted(r for r in want if keep(r))
        assert expected, f"{name}: the test store must hold matches"
        if query(df) is df:  # the df.count()
            assert df.count() == len(expected), name
        else:
            assert spark_records(query(df)) == expected, name
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets == sorted(r[2] for r in want), "select('offset').collect()"


@pytest.fixture(params=[False, True], ids=["pushdown-off", "pushdown-on"])
def pushdown_session(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[SparkSession]:
    """The shared session with Spark's Python filter pushdown off or on."""
    before = spark.conf.get(mqcore.spark.PUSHDOWN_CONF, "false")
    spark.conf.set(mqcore.spark.PUSHDOWN_CONF, str(request.param).lower())
    mqcore.spark.register(spark)
    try:
        yield spark
    finally:
        spark.conf.set(mqcore.spark.PUSHDOWN_CONF, before)
        mqcore.spark.register(spark)


def test_each_query_of_a_reused_dataframe_answers_what_the_store_holds(
    pushdown_session: SparkSession, tmp_path: Path
) -> None:
    """Filtered and unfiltered queries in turn, then appends (one partition was empty when the
    DataFrame first ran), then retention that moves the start offsets: the same DataFrame
    answers every query as the store does, as Kafka's source resolves earliest and latest at
    each run."""
    path = str(tmp_path / "store")
    fill(path, "web", {0: 120, 1: 90}, retention_bytes=2500, retention_ms=-1)
    df = pushdown_session.read.format("mqcore").option("subscribe", "web").load(path)
    check_queries(df, stored(path, "web"))

    fill(path, "web", {0: 9, 2: 30}, start=210)
    check_queries(df, stored(path, "web"))

    with mqcore.open(path) as st:
        st.apply_retention("web")
        moved = [st.start_offset("web", p) for p in range(3)]
    assert moved[0] > 0 and moved[1] > 0, "retention must move the start offsets"
    check_queries(df, stored(path, "web"))


def test_a_reused_split_dataframe_reads_each_record_once(
    pushdown_session: SparkSession, tmp_path: Path
) -> None:
    """With minPartitions the plan cuts partitions into pieces: a reused plan's pieces still
    cover the log once, after appends and retention, and the write of a reused DataFrame writes
    what the store holds."""
    path = str(tmp_path / "store")
    fill(path, "web", {0: 150, 1: 40}, retention_bytes=1, retention_ms=-1)
    df = (
        pushdown_session.read.format("mqcore")
        .option("subscribe", "web")
        .option("minPartitions", "7")
        .load(path)
    )
    assert df.filter(F.col("key") == b"k3").count() == 5
    fill(path, "web", {0: 25, 2: 12}, start=190)
    with mqcore.open(path) as st:
        st.apply_retention("web")
    want = stored(path, "web")
    assert spark_records(df) == sorted(want)
    out = str(tmp_path / "parquet")
    df.write.parquet(out)
    assert pushdown_session.read.parquet(out).count() == len(want)


def test_a_reused_pattern_dataframe_reads_topics_created_since(
    pushdown_session: SparkSession, tmp_path: Path
) -> None:
    """subscribePattern names the topics that exist when a query runs, as a fresh DataFrame
    does; explicit per-partition offsets stay what they say, and data loss against them is
    still an error."""
    path = str(tmp_path / "store")
    fill(path, "web-a", {0: 30})
    df = pushdown_session.read.format("mqcore").option("subscribePattern", "web-.*").load(path)
    assert df.filter("offset < 3").count() == 3
    fill(path, "web-b", {1: 17}, start=30)
    fill(path, "web-a", {2: 4}, start=47)
    assert spark_records(df) == sorted(stored(path, "web-a", "web-b"))


def test_explicit_offsets_of_a_reused_dataframe_stay_fixed(
    pushdown_session: SparkSession, tmp_path: Path
) -> None:
    """Explicit offsets are not late-bound: appends past them are not read, and retention past
    the starting offset is data loss for the reused DataFrame as for a fresh one."""
    path = str(tmp_path / "store")
    fill(path, "web", {0: 120}, retention_bytes=1, retention_ms=-1)
    starting = '{"web":{"0":10,"1":-2,"2":-2}}'
    ending = '{"web":{"0":100,"1":-1,"2":-1}}'
    df = (
        pushdown_session.read.format("mqcore")
        .option("subscribe", "web")
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .load(path)
    )
    assert df.count() == 90
    fill(path, "web", {0: 10, 1: 6}, start=120)
    assert df.count() == 96
    with mqcore.open(path) as st:
        st.apply_retention("web")
        assert st.start_offset("web", 0) > 10
    with pytest.raises(PySparkException, match="retention point"):
        df.count()
    fresh = (
        pushdown_session.read.format("mqcore")
        .option("subscribe", "web")
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .load(path)
    )
    with pytest.raises(PySparkException, match="retention point"):
        fresh.count()


def test_a_reused_dataframe_reads_a_topic_deleted_and_created_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The workers keep a read-only handle per store (mqcore.handles): a DataFrame queried
    after its topic was deleted and created again with other records reads the new records,
    twice in a row, and after an append the new one too."""
    mqcore.spark.register(spark)
    path = str(tmp_path / "store")
    fill(path, "web", {0: 50, 1: 20, 2: 10})
    df = spark.read.format("mqcore").option("subscribe", "web").load(path)
    assert spark_records(df) == stored(path, "web")
    with mqcore.open(path) as st:
        st.delete_topic("web")
    fill(path, "web", {1: 7}, start=1000)
    want = stored(path, "web")
    assert len(want) == 7
    assert spark_records(df) == want
    assert spark_records(df) == want
    fill(path, "web", {2: 1}, start=2000)
    assert spark_records(df) == stored(path, "web") and df.count() == 8
