"""spark.read.format("mqcore") on the test run's one local[2] session: the Kafka source schema,
every column equal to Store.read, the Kafka options, errors that name the problem, splitting,
filters (Spark's own, with its pushdown setting on or off), writing, and the workers' Python."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import SPARK_BASE_TS, spark_arrow_schema

import mqcore
import mqcore.spark

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from pyspark.errors import PySparkException  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import datasource as ds  # noqa: E402

from mqcore.spark.options import parse_stream_options  # noqa: E402
from mqcore.spark.plan import OffsetRange  # noqa: E402
from mqcore.spark.source import MqcoreDataSource, kafka_spark_schema  # noqa: E402
from mqcore.spark.stream import MqcoreStreamReader  # noqa: E402

KAFKA_DDL = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
    "timestamp:timestamp,timestampType:int{}>"
)
HEADERS_DDL = ",headers:array<struct<key:string,value:binary>>"
Row = tuple[Any, ...]
Ranges = dict[tuple[str, int], tuple[int, int]]


def load(spark: SparkSession, path: str, **options: str) -> DataFrame:
    reader = spark.read.format("mqcore")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(path)


def rows(df: DataFrame) -> list[Row]:
    """The rows through Arrow, timestamps as integer microseconds, in offset order."""
    table = df.toArrow()
    cols = {name: table.column(name) for name in table.column_names}
    cols["timestamp"] = cols["timestamp"].cast(pa.int64())
    values = [c.to_pylist() for c in cols.values()]
    out = [tuple(row) for row in zip(*values, strict=True)]
    if "headers" in cols:
        out = [r[:7] + (None if r[7] is None else [(h["key"], h["value"]) for h in r[7]],)
               for r in out]  # fmt: skip
    return sorted(out, key=lambda r: (r[2], r[3], r[4]))


def store_rows(path: str, ranges: Ranges, headers: bool) -> list[Row]:
    """The same records through Store.read, in the same shape."""
    out: list[Row] = []
    with mqcore.open(path, read_only=True) as st:
        for (t, p), (start, end) in sorted(ranges.items()):
            for m in st.read(t, p, start, 1_000_000):
                if m.offset >= end:
                    break
                row: Row = (
                    m.key,
                    m.value,
                    m.topic,
                    m.partition,
                    m.offset,
                    m.timestamp * 1000,
                    m.timestamp_type,
                )
                # Spark's Kafka source: null headers for a record that has none
                out.append(row + (list(m.headers) or None,) if headers else row)
    return out


def whole(path: str, *topics: str) -> Ranges:
    with mqcore.open(path, read_only=True) as st:
        return {
            (t, p): (st.start_offset(t, p), st.end_offset(t, p))
            for t in topics
            for p in st.available_partitions(t)
        }


def first_at_or_after(path: str, t: str, p: int, ts: int) -> int:
    with mqcore.open(path, read_only=True) as st:
        hits = [m.offset for m in st.read(t, p, 0, 1_000_000) if m.timestamp >= ts]
        return min(hits) if hits else st.end_offset(t, p)


def offset_set(path: str, ranges: Ranges) -> set[tuple[Any, ...]]:
    return {(t, p, o) for (t, p), (a, b) in ranges.items() for o in range(a, b)}


def read_offsets(df: DataFrame) -> set[tuple[Any, ...]]:
    table = df.select("topic", "partition", "offset").toArrow()
    return set(zip(*(c.to_pylist() for c in table.columns), strict=True))


# -- schema and content --------------------------------------------------------------------------


def test_schema_is_the_kafka_source_schema(session: SparkSession, spark_store: str) -> None:
    df = load(session, spark_store, subscribe="events")
    assert df.schema.simpleString() == KAFKA_DDL.format("")
    assert all(f.nullable for f in df.schema.fields)
    with_headers = load(session, spark_store, subscribe="events", includeHeaders="true")
    assert with_headers.schema.simpleString() == KAFKA_DDL.format(HEADERS_DDL)
    assert with_headers.schema == kafka_spark_schema(True)


@pytest.mark.parametrize("headers", [False, True])
def test_batch_read_equals_store_read(
    session: SparkSession, spark_store: str, headers: bool
) -> None:
    df = load(
        session,
        spark_store,
        subscribe="events,audit,other",
        includeHeaders=str(headers).lower(),
    )
    got = rows(df)
    want = store_rows(spark_store, whole(spark_store, "events", "audit", "other"), headers)
    assert got == want
    # the store covers what the test means to cover
    assert {r[3] for r in got if r[2] == "events"} == {0, 1, 2}
    assert any(r[0] is None for r in got) and any(r[1] is None for r in got)
    assert {r[6] for r in got if r[2] == "audit"} == {1}
    assert {r[6] for r in got if r[2] == "events"} == {0}
    if headers:
        assert any(v is None for r in got for _, v in r[7] or ())
        assert any(k == "\u00fc" for r in got for k, _ in r[7] or ())


def test_splitting_gives_the_same_rows(session: SparkSession, spark_store: str) -> None:
    plain = load(session, spark_store, subscribe="events")
    assert plain.rdd.getNumPartitions() == 3  # Kafka's default: one per topic-partition
    want = rows(plain)
    for options, at_least in (({"minPartitions": "8"}, 8), ({"maxRecordsPerPartition": "20"}, 6)):
        df = load(session, spark_store, subscribe="events", **options)
        assert df.rdd.getNumPartitions() >= at_least
        assert rows(df) == want


def test_small_batches_keep_sparks_arrow_schema(spark_store: str) -> None:
    """read() itself: bounded batches, each exactly the Arrow schema Spark checks against."""
    source = MqcoreDataSource({"path": spark_store, "subscribe": "events", "includeHeaders": "true",
                               "maxRecordsPerBatch": "7"})  # fmt: skip
    schema = source.schema()
    reader = source.reader(schema)
    want = spark_arrow_schema(schema)
    parts = reader.partitions()
    batches = [b for part in parts for b in reader.read(part)]
    assert batches and all(b.schema.equals(want) and 0 < b.num_rows <= 7 for b in batches)
    assert sum(b.num_rows for b in batches) == len(
        store_rows(spark_store, whole(spark_store, "events"), False)
    )


def test_a_record_without_headers_has_null_headers(tmp_path: Path) -> None:
    """includeHeaders: a record with no header has headers = null, as in Spark's Kafka source
    (not an empty list), in the batches of a batch read and of a stream alike."""
    path = str(tmp_path / "store")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", partitions=2, unique_ids=False)  # no generated uid header
        for i in range(40):
            headers = [("h", b"%d" % i)] * (i % 3) if i % 4 else None
            st.append("t", b"v%d" % i, headers=headers, partition=i % 2)
    want = {(r[3], r[4]): r[7] for r in store_rows(path, whole(path, "t"), True)}
    assert None in want.values() and [("h", b"1")] in want.values()
    options = {"path": path, "subscribe": "t", "includeHeaders": "true", "maxRecordsPerBatch": "6"}
    source = MqcoreDataSource(options)
    reader = source.reader(source.schema())
    batch_read = [b for part in reader.partitions() for b in reader.read(part)]
    stream = MqcoreStreamReader(parse_stream_options({**options, "startingOffsets": "earliest"}))
    streamed = list(stream.read(ds.InputPartition(OffsetRange("t", 1, 0, 20))))
    for batches, count in ((batch_read, 40), (streamed, 20)):
        got = {}
        for b in batches:
            columns = [b.column(c).to_pylist() for c in ("partition", "offset", "headers")]
            for p, o, h in zip(*columns, strict=True):
                got[(p, o)] = None if h is None else [(x["key"], x["value"]) for x in h]
        assert len(got) == count and got == {k: v for k, v in want.items() if k in got}


# -- options -------------------------------------------------------------------------------------


def test_offsets_json(session: SparkSession, spark_store: str) -> None:
    df = load(
        session,
        spark_store,
        subscribe="events",
        startingOffsets='{"events":{"0":4,"1":-2,"2":10}}',
        endingOffsets='{"events":{"0":9,"1":3,"2":-1}}',
    )
    end2 = whole(spark_store, "events")[("events", 2)][1]
    ranges = {("events", 0): (4, 9), ("events", 1): (0, 3), ("events", 2): (10, end2)}
    assert rows(df) == store_rows(spark_store, ranges, False)


def test_timestamps_and_their_precedence(session: SparkSession, spark_store: str) -> None:
    t1, t2 = SPARK_BASE_TS + 6_000, SPARK_BASE_TS + 30_000
    df = load(
        session,
        spark_store,
        subscribe="events",
        startingTimestamp=str(t1),  # wins over the two below
        startingOffsetsByTimestamp='{"events":{"0":0,"1":0,"2":0}}',
        startingOffsets="earliest",
        endingOffsetsByTimestamp=f'{{"events":{{"0":{t2},"1":{t2},"2":{t2}}}}}',
    )
    ranges = {
        ("events", p): (
            first_at_or_after(spark_store, "events", p, t1),
            first_at_or_after(spark_store, "events", p, t2),
        )
        for p in range(3)
    }
    assert read_offsets(df) == offset_set(spark_store, ranges)


def test_subscribe_pattern_and_assign(session: SparkSession, spark_store: str) -> None:
    everything = whole(spark_store, "events", "audit", "other")
    df = load(session, spark_store, subscribePattern="ev.*|oth.*")
    want = {k: v for k, v in everything.items() if k[0] != "audit"}
    assert read_offsets(df) == offset_set(spark_store, want)
    df = load(session, spark_store, assign='{"events":[1],"audit":[0]}')
    want = {k: everything[k] for k in (("events", 1), ("audit", 0))}
    assert read_offsets(df) == offset_set(spark_store, want)


def test_pattern_skips_internal_topics(session: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "internal")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t")
        st.append("t", b"v", partition=0)
        with st.consumer("g", "t") as c:  # creates and writes __consumer_offsets
            assert len(c.poll()) == 1
            c.commit()
        assert "__consumer_offsets" in st.topics()
    rows_read = load(session, path, subscribePattern=".*").select("topic").collect()
    assert [r.topic for r in rows_read] == ["t"]  # Kafka's consumer excludes internal topics
    named = load(session, path, subscribe="__consumer_offsets").count()
    assert named >= 1  # naming one still reads it


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options subscribe, subscribePattern, assign is required"),
        ({"subscribe": "events", "startingOffset": "earliest"}, "did you mean 'startingOffsets'"),
    ],
)
def test_bad_options_fail_at_load(
    session: SparkSession, spark_store: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(PySparkException, match=message):
        load(session, spark_store, **options)


def test_planning_errors_name_the_problem(session: SparkSession, spark_store: str) -> None:
    with pytest.raises(PySparkException, match="topic 'nope' does not exist"):
        load(session, spark_store, subscribe="nope").count()
    # load() cannot tell a batch read from a stream (one schema() for both): a stream's
    # startingOffsets=latest passes it and a batch read refuses it when planned
    with pytest.raises(PySparkException, match="cannot be 'latest'"):
        load(session, spark_store, subscribe="events", startingOffsets="latest").count()
    with pytest.raises(PySparkException, match="must name every partition read"):
        load(session, spark_store, subscribe="events", endingOffsets='{"events":{"0":1}}').count()
    with pytest.raises(PySparkException, match="fixed schema of Spark's Kafka source"):
        session.read.format("mqcore").schema("value binary").option("subscribe", "events").load(
            spark_store
        ).count()


def test_data_loss_through_spark(session: SparkSession, tmp_path: Path) -> None:
    path = str(tmp_path / "trimmed")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", segment_bytes=600, key_index=False)
        for i in range(40):
            st.append("t", b"x%d" % i * 20, timestamp=SPARK_BASE_TS + i)
    part = os.path.join(path, "t-0")
    for name in os.listdir(part):
        if name.startswith("00000000000000000000."):
            os.unlink(os.path.join(part, name))  # what retention does
    first = whole(path, "t")[("t", 0)][0]
    assert first > 0
    from_zero = {"subscribe": "t", "startingOffsets": '{"t":{"0":0}}'}
    with pytest.raises(PySparkException, match=f"log starts at {first} .*retention point"):
        load(session, path, **from_zero).count()
    df = load(session, path, failOnDataLoss="false", **from_zero)
    assert rows(df) == store_rows(path, {("t", 0): (first, 40)}, False)


# -- filters -------------------------------------------------------------------------------------


WHERE = [
    "partition = 1 AND offset >= 5 AND offset < 30",
    "partition IN (0, 2) AND NOT offset = 3 AND topic = 'events' AND value IS NOT NULL",
    f"timestamp >= timestamp_millis({SPARK_BASE_TS + 25_000}) AND offset <= 70",
    f"timestamp < timestamp_millis({SPARK_BASE_TS + 9_000}) OR partition = 2",
    "offset > 100000",
]


def test_filters_give_the_same_rows_with_sparks_pushdown_on_or_off(
    session: SparkSession, spark_store: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """The source takes no filter (a reused DataFrame would carry one query's filters into the
    next): with spark.sql.python.filterPushdown.enabled on, Spark still evaluates every one."""
    want = {w: rows(load(session, spark_store, subscribe="events").where(w)) for w in WHERE}
    session.conf.set(mqcore.spark.PUSHDOWN_CONF, "true")
    mqcore.spark.register(session)
    try:
        for w in WHERE:
            assert rows(load(session, spark_store, subscribe="events").where(w)) == want[w], w
        load(session, spark_store, subscribe="events").where(WHERE[0]).explain()
        filters = [line for line in capfd.readouterr().out.splitlines() if " Filter " in line]
        assert filters and all("partition" in f and "offset" in f for f in filters), filters
    finally:
        session.conf.set(mqcore.spark.PUSHDOWN_CONF, "false")
        mqcore.spark.register(session)
    assert want[WHERE[0]] and not want[WHERE[-1]]
    for _, _, _, p, o, *_ in want[WHERE[0]]:
        assert p == 1 and 5 <= o < 30


# -- writing -------------------------------------------------------------------------------------


@pytest.fixture
def sink_path(tmp_path: Path) -> str:
    path = str(tmp_path / "sink")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("sink", partitions=2)
        st.create_topic("side", partitions=1)
    return path


def staged(path: str) -> list[str]:
    return [n for n in os.listdir(path) if n.startswith(".mqcore-spark-")]


def test_write_then_read_round_trip(session: SparkSession, sink_path: str) -> None:
    utc = datetime.timezone.utc
    data = [
        (
            b"k%d" % (i % 3) if i % 4 else None,
            None if i == 5 else b"v%d" % i,
            [("h", b"%d" % i), ("n", None)] if i % 2 else [],
            i % 2 if i % 3 else None,
            datetime.datetime.fromtimestamp((SPARK_BASE_TS + i) / 1000, utc),
        )
        for i in range(30)
    ]
    df = session.createDataFrame(
        data,
        "key binary, value binary, headers array<struct<key:string,value:binary>>, "
        "partition int, timestamp timestamp",
    )
    df.repartition(3).write.format("mqcore").mode("append").option("topic", "sink").save(sink_path)
    assert staged(sink_path) == []
    with mqcore.open(sink_path, read_only=True) as st:
        got = [m for p in (0, 1) for m in st.read("sink", p, 0, 1000)]
    assert len(got) == 30
    by_time = {m.timestamp - SPARK_BASE_TS: m for m in got}
    for i, (key, value, headers, partition, _ts) in enumerate(data):
        m = by_time[i]
        assert (m.key, m.value) == (key, value)
        assert [(k, v) for k, v in m.headers if k != "uid"] == headers
        if partition is not None:
            assert m.partition == partition
    # and back through the source
    back = load(session, sink_path, subscribe="sink", includeHeaders="true")
    assert rows(back) == store_rows(sink_path, whole(sink_path, "sink"), True)


def test_write_strings_by_topic_column(session: SparkSession, sink_path: str) -> None:
    df = session.createDataFrame(
        [("a", "one", "sink"), ("b", "two", "side"), (None, "three", "side")],
        "key string, value string, topic string",
    )
    df.write.format("mqcore").mode("append").save(sink_path)
    with mqcore.open(sink_path, read_only=True) as st:
        side = [(m.key, m.value) for m in st.read("side", 0, 0, 10)]
        sink = [(m.key, m.value) for p in (0, 1) for m in st.read("sink", p, 0, 10)]
    assert sorted(side, key=str) == sorted([(b"b", b"two"), (None, b"three")], key=str)
    assert sink == [(b"a", b"one")]


def test_a_failed_job_appends_nothing(session: SparkSession, sink_path: str) -> None:
    def failing(tasks: int) -> DataFrame:
        # the task holding id 150 fails at that row, after staging the batches before it
        return session.range(0, 2000, 1, tasks).selectExpr(
            "CAST(CAST(id AS STRING) AS BINARY) AS value",
            "IF(id = 150, raise_error('boom'), 0) AS partition",
        )

    def write(df: DataFrame) -> None:
        df.write.format("mqcore").mode("append").option("topic", "sink").save(sink_path)

    for tasks in (1, 2):
        with pytest.raises(PySparkException, match="boom"):
            write(failing(tasks))
        with mqcore.open(sink_path, read_only=True) as st:
            assert [st.end_offset("sink", p) for p in (0, 1)] == [0, 0]
        if tasks == 1:
            # abort ran after the only task ended: nothing it staged is left
            assert staged(sink_path) == []


@pytest.mark.parametrize(
    ("columns", "mode", "options", "message"),
    [
        ("key binary", "append", {"topic": "sink"}, "needs a 'value' column"),
        ("value binary", "append", {}, "needs a 'topic' column or the 'topic' option"),
        ("value binary, partition bigint", "append", {"topic": "sink"}, "'partition' is bigint"),
        ("value binary", "overwrite", {"topic": "sink"}, "only appends"),
        ("value binary", "append", {"topic": "nope"}, "topic 'nope' does not exist"),
        ("value binary", "append", {"topic": "sink", "topics": "x"}, "unknown option 'topics'"),
    ],
)
def test_write_errors_name_the_problem(
    session: SparkSession,
    sink_path: str,
    columns: str,
    mode: str,
    options: dict[str, str],
    message: str,
) -> None:
    df = session.createDataFrame([], columns)
    writer = df.write.format("mqcore").mode(mode)
    for name, value in options.items():
        writer = writer.option(name, value)
    with pytest.raises(PySparkException, match=message):
        writer.save(sink_path)


def test_demo_spark_step_agrees_with_the_store(
    spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`make demo`'s last step on a small demo store: its Spark SQL answers equal what a plain
    read of the store gives; its partition filter is Spark's, over all three input partitions
    (the source takes no filter)."""
    import io
    import re as regex
    from collections import Counter

    import mqcore.spark
    from mqcore import demo

    path = str(tmp_path / "demo")
    demo.run(path, 3000, 7, io.StringIO())
    try:
        found = demo.step_spark(path, demo.Printer(io.StringIO()), spark)
    finally:
        mqcore.spark.register(spark)
    with mqcore.open(path, read_only=True) as store:

        def values(topic: str) -> list[bytes]:
            return [
                m.value or b""
                for p in range(store.partitions(topic))
                for m in store.read(topic, p, 0, 1_000_000)
            ]

        status_of = regex.compile(rb'" ([0-9]{3}) ')
        status: Counter[str] = Counter()
        for v in values(demo.ACCESS):
            hit = status_of.search(v)
            status[hit.group(1).decode() if hit else ""] += 1
        events = [json.loads(v) for v in values(demo.EVENTS)]
        errors = Counter(e["host"] for e in events if e["level"] == "ERROR")
        bounded = min(1000, store.end_offset(demo.ACCESS, 1))
    assert found.status_counts == dict(status)
    assert found.errors_per_host == dict(errors)
    assert found.bounded_count == bounded
    assert found.input_partitions == (3, 1)


def test_stream_reader_versions(spark_store: str) -> None:
    """Streaming reads work on PySpark 4.1 and later; the read-limit options need 4.2, where
    Spark passes Python streams their limits, and are refused on 4.1 rather than ignored."""
    from mqcore.errors import InvalidConfigError
    from mqcore.spark import stream

    source = MqcoreDataSource({"path": spark_store, "subscribe": "events"})
    schema = source.schema()
    assert isinstance(source.streamReader(schema), stream.MqcoreStreamReader)
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger"):
        limited = MqcoreDataSource({"path": spark_store, "subscribe": "events", name: "10"})
        if stream.READ_LIMITS:
            assert isinstance(limited.streamReader(schema), stream.MqcoreStreamReader)
        else:
            with pytest.raises(InvalidConfigError, match=f"{name} need PySpark 4.2 or later"):
                limited.streamReader(schema)


# -- the workers' Python ---------------------------------------------------------------------------


def test_workers_that_cannot_import_mqcore_are_named_at_register(
    session: SparkSession, spark_store: str
) -> None:
    """A script run with a virtualenv's python without activating it: Spark starts its workers
    with python3, which lacks mqcore. Here a real worker runs the virtualenv's base
    interpreter: without the check the read fails inside it with a traceback; register() says
    so first, in one sentence naming PYSPARK_PYTHON."""
    import subprocess
    import sys

    from mqcore.errors import InvalidConfigError

    bare = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run(
        [bare, "-c", "import pyarrow, cramjam"], capture_output=True, check=False
    )
    if bare == sys.executable or probe.returncode == 0:
        pytest.skip("needs a Python without mqcore's dependencies (run the tests in a venv)")
    sc = session.sparkContext
    saved = sc.pythonExec
    sc.pythonExec = bare
    try:
        session.dataSource.register(MqcoreDataSource)  # what register() did before the check
        with pytest.raises(PySparkException, match="No module named") as failed:
            load(session, spark_store, subscribe="events").count()
        assert "Traceback" in str(failed.value) and "PYSPARK_PYTHON" not in str(failed.value)
        with pytest.raises(InvalidConfigError) as refused:
            mqcore.spark.register(session)
    finally:
        sc.pythonExec = saved
        mqcore.spark.register(session)
    text = str(refused.value)
    assert text.startswith(f"Spark's Python workers run {bare!r} (PYSPARK_PYTHON")
    assert "cannot import mqcore (ModuleNotFoundError: No module named" in text
    assert "set PYSPARK_PYTHON to a Python that has mqcore" in text
    assert "\n" not in text and ". " not in text.replace(sys.executable, "")


def test_kafka_isolation_level_reads_committed_records_only(
    session: SparkSession, tmp_path: Path
) -> None:
    """A store holding Kafka transactions (tests/test_txn_log.py's model: committed, aborted
    and still open ones) read with kafka.isolation.level=read_committed gives exactly the
    committed records below the last stable offset, twice on the same DataFrame; the default
    (read_uncommitted, as Spark's Kafka source) gives every record; neither a marker."""
    import random

    from test_txn_log import Model, random_ops

    path = str(tmp_path / "txns")
    models = []
    with mqcore.open(path, create=True, flush="os") as st:
        st.create_topic("t", partitions=2, segment_bytes=4096)
        for p in range(2):
            model = Model()
            replica = st.log.replica("t", p)
            for batch in random_ops(random.Random(20 + p), model, 90):
                replica.append_as_follower(batch)
            models.append(model)
        st.log.replica("t", 1).append_as_follower(models[1].data(7, 3, True))  # left open
        assert st.last_stable_offset("t", 1) == models[1].lso < models[1].end
    committed = load(session, path, subscribe="t", **{"kafka.isolation.level": "read_committed"})
    for _ in range(2):  # the same DataFrame queried twice
        got = sorted((r["partition"], r["offset"], r["value"]) for r in committed.collect())
        assert got == sorted((p, o, v) for p, m in enumerate(models) for o, v in m.committed())
    everything = load(session, path, subscribe="t")
    got = sorted((r["partition"], r["offset"], r["value"]) for r in everything.collect())
    assert got == sorted((p, o, v) for p, m in enumerate(models) for o, v in m.uncommitted())
    with pytest.raises(Exception, match="kafka.isolation.level"):
        load(session, path, subscribe="t", **{"kafka.isolation.level": "committed"}).collect()
