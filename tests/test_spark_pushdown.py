"""Pushdown of key and msg_id lookups and of a value needle, and mqcore's extra columns
(includeExtras): the same rows as the query without pushdown, fewer records read. Spark
queries run on the test run's one local[2] session; the record counts come from the reader
itself (what it planned, what its decoder built)."""

from __future__ import annotations

import contextlib
import datetime
import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from conftest import SPARK_BASE_TS, SPARK_CODECS, spark_arrow_schema

import mqcore
import mqcore.spark
from mqcore.query import engine
from mqcore.query.ids import encode_msg_id

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import datasource as ds  # noqa: E402

from mqcore.spark.plan import OffsetRange, checked_range, split_ranges  # noqa: E402
from mqcore.spark.source import (  # noqa: E402
    MqcoreDataSource,
    MqcorePushdownDataSource,
    MqcorePushdownReader,
)

RARE = b"rare-key"
NEEDLE = "needle-7f3"
RARE_BATCHES = {(0, 10), (1, 41)}  # (partition, batch): the batches whose first key is RARE
NEEDLE_BATCHES = {(0, 5), (0, 33), (1, 17), (1, 50)}  # ... whose last value holds NEEDLE
BATCHES = 60
Row = tuple[Any, ...]


def make_pushdown_store(path: str) -> None:
    """Topic "keyed": 2 partitions of many small segments (every codec), keys from a small set
    plus RARE in two batches, a record whose extra `keys` word is RARE (an index hit that is
    not its key), tags on some records, NEEDLE in four batches. Topic "unindexed": the same
    kind of records without a key index."""
    rng = random.Random(23)
    with mqcore.open(path, flush="os") as st:
        st.create_topic("keyed", partitions=2, segment_bytes=2500, key_index_entries=256)
        st.create_topic("unindexed", partitions=1, segment_bytes=2500, key_index=False)
        for topic, parts in (("keyed", 2), ("unindexed", 1)):
            for p in range(parts):
                for i in range(BATCHES):
                    n = rng.randrange(1, 14)
                    keys = [rng.choice([None, b"", b"k%d" % rng.randrange(12)]) for _ in range(n)]
                    values = [
                        rng.choice([None, b"", b"v%d" % rng.randrange(999), rng.randbytes(24)])
                        for _ in range(n)
                    ]
                    if (p, i) in RARE_BATCHES:
                        keys[0] = RARE
                    if (p, i) in NEEDLE_BATCHES:
                        values[-1] = b"before " + NEEDLE.encode() + b" after"
                    st.append_batch(
                        topic,
                        values,
                        keys=keys,
                        partition=p,
                        timestamps=[SPARK_BASE_TS + 1000 * i + j for j in range(n)],
                        compression=SPARK_CODECS[i % len(SPARK_CODECS)],
                        tags=[rng.choice([None, "red", "blue"]) for _ in range(n)],
                    )
                    if i == 25:
                        st.append(topic, b"decoy", key=b"k1", keys=[RARE], partition=p)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("spark-pushdown") / "store")
    make_pushdown_store(path)
    return path


@pytest.fixture(scope="module")
def session(spark: SparkSession) -> SparkSession:
    mqcore.spark.register(spark)
    return spark


@contextlib.contextmanager
def pushdown_on(session: SparkSession) -> Iterator[None]:
    session.conf.set(mqcore.spark.PUSHDOWN_CONF, "true")
    mqcore.spark.register(session)
    try:
        yield
    finally:
        session.conf.set(mqcore.spark.PUSHDOWN_CONF, "false")
        mqcore.spark.register(session)


def load(session: SparkSession, path: str, **options: str) -> DataFrame:
    reader = session.read.format("mqcore")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(path)


def rows(df: DataFrame) -> list[Row]:
    """Every column through Arrow, timestamps as microseconds, in (topic, partition, offset)
    order."""
    table = df.toArrow()
    columns = [
        c.cast(pa.int64()) if name == "timestamp" else c
        for name, c in zip(table.column_names, table.columns, strict=True)
    ]
    out = [tuple(r) for r in zip(*(c.to_pylist() for c in columns), strict=True)]
    return sorted(out, key=lambda r: (r[2], r[3], r[4]))


def messages(path: str, topic: str) -> list[Any]:
    with mqcore.open(path, read_only=True) as st:
        return [m for p in st.available_partitions(topic) for m in st.read(topic, p, 0, 1_000_000)]


def reader_for(path: str, topic: str, filters: list[Any], **options: str) -> MqcorePushdownReader:
    source = MqcorePushdownDataSource({"path": path, "subscribe": topic, **options})
    reader = source.reader(source.schema())
    rest = reader.pushFilters(filters)
    assert list(rest) == [], rest
    return reader


def read_all(reader: Any) -> tuple[list[pa.RecordBatch], list[OffsetRange]]:
    parts = reader.partitions()
    return [b for part in parts for b in reader.read(part)], [part.value for part in parts]


def offsets_of(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    return sorted(
        (p, o)
        for b in batches
        for p, o in zip(
            b.column("partition").to_pylist(), b.column("offset").to_pylist(), strict=True
        )
    )


# -- the same rows through Spark ----------------------------------------------------------------


KEY_QUERIES = [
    "key = X'{rare}'",
    "key IN (X'{rare}', X'6B33', X'')",
    "key <=> X'6B35' AND offset < 200",
    f"key = X'6B31' AND timestamp >= timestamp_millis({SPARK_BASE_TS + 30_000})",
    "key = X'{rare}' AND partition = 1",
    "key = X'6E6F6E65'",  # "none": no record has it
    "NOT key = X'6B31' AND offset < 40",  # NOT of a key goes back to Spark
]


@pytest.mark.parametrize("topic", ["keyed", "unindexed"])
def test_key_pushdown_gives_the_rows_of_the_query_without_it(
    session: SparkSession, store_path: str, topic: str, capfd: pytest.CaptureFixture[str]
) -> None:
    queries = [q.format(rare=RARE.hex().upper()) for q in KEY_QUERIES]
    want = {q: rows(load(session, store_path, subscribe=topic).where(q)) for q in queries}
    with pushdown_on(session):
        for q in queries:
            assert rows(load(session, store_path, subscribe=topic).where(q)) == want[q], q
        load(session, store_path, subscribe=topic).where(queries[1]).explain()
    filters = [line for line in capfd.readouterr().out.splitlines() if " Filter " in line]
    assert not any("key" in f and "isnotnull" not in f for f in filters), filters
    rare = want[queries[0]]
    holding = 2 if topic == "keyed" else 1  # RARE_BATCHES of the topic's partitions
    assert len(rare) == holding and {r[0] for r in rare} == {RARE}  # no decoy among them
    assert not want[queries[5]] and want[queries[2]] and want[queries[3]]


def test_extras_columns_equal_the_store(session: SparkSession, store_path: str) -> None:
    """includeExtras: msg_id (the store ID) and tag after the Kafka columns (and headers)."""
    df = load(session, store_path, subscribe="keyed", includeExtras="true")
    assert df.columns[-2:] == ["msg_id", "tag"] and df.columns[:7] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"
    ]  # fmt: skip
    got = {(r[3], r[4]): (r[-2], r[-1]) for r in rows(df)}
    want = {
        (m.partition, m.offset): (
            encode_msg_id(m.topic, m.partition, m.offset),
            None if m.header("tag") is None else m.header("tag").decode(),
        )
        for m in messages(store_path, "keyed")
    }
    assert got == want
    assert {t for _, t in got.values()} == {None, "red", "blue"}
    both = load(session, store_path, subscribe="keyed", includeExtras="true", includeHeaders="true")
    assert both.columns[7:] == ["headers", "msg_id", "tag"]
    assert {(r[3], r[4]): (r[-2], r[-1]) for r in rows(both)} == want


def test_msg_id_pushdown_reads_just_those_records(session: SparkSession, store_path: str) -> None:
    everything = messages(store_path, "keyed")
    picked = [everything[3], everything[-5]]
    ids = [encode_msg_id(m.topic, m.partition, m.offset) for m in picked]
    other_topic = encode_msg_id("unindexed", 0, 1)
    queries = [
        f"msg_id = '{ids[0]}'",
        f"msg_id IN ('{ids[0]}', '{ids[1]}', '{other_topic}', 'not-an-id', 'm1-AAAA')",
        f"msg_id = '{ids[1]}' AND key IS NULL",
        f"msg_id = '{ids[0]}' AND msg_id = '{ids[1]}'",
    ]
    options = {"subscribe": "keyed", "includeExtras": "true"}
    want = {q: rows(load(session, store_path, **options).where(q)) for q in queries}
    with pushdown_on(session):
        for q in queries:
            assert rows(load(session, store_path, **options).where(q)) == want[q], q
    assert [r[4] for r in want[queries[1]]] == [m.offset for m in picked]
    assert not want[queries[3]]
    reader = reader_for(store_path, "keyed", [ds.In(("msg_id",), tuple(ids))], includeExtras="true")
    batches, plan = read_all(reader)
    assert sum(r.size for r in plan) == 2 and reader.rows_decoded == 2
    assert offsets_of(batches) == sorted((m.partition, m.offset) for m in picked)


# -- records read --------------------------------------------------------------------------------


def test_key_lookup_plans_only_the_batches_that_may_hold_the_key(store_path: str) -> None:
    everything = messages(store_path, "keyed")
    reader = reader_for(store_path, "keyed", [ds.EqualTo(("key",), RARE)])
    batches, plan = read_all(reader)
    assert offsets_of(batches) == sorted((m.partition, m.offset) for m in everything
                                         if m.key == RARE)  # fmt: skip
    planned = sum(r.size for r in plan)
    # two batches hold RARE as a key (one record each, at their start), two a decoy's word
    assert 0 < planned <= 4 and reader.rows_decoded == planned
    with mqcore.open(store_path, read_only=True) as st:
        bases = {p: st.segment_offsets("keyed", p) for p in (0, 1)}
    assert min(len(b) for b in bases.values()) >= 6  # many segments, of which few are read

    def segment(p: int, offset: int) -> tuple[int, int]:
        return p, max(b for b in bases[p] if b <= offset)

    hit_segments = {
        segment(m.partition, m.offset) for m in everything if m.key == RARE or m.value == b"decoy"
    }
    read_segments = {
        segment(r.partition, o) for r in plan for lo, hi in r.spans() for o in range(lo, hi)
    }
    assert read_segments <= hit_segments


def test_a_key_with_many_hits_reads_whole_segments(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    everything = messages(store_path, "keyed")
    want = sorted((m.partition, m.offset) for m in everything if m.key == b"k3")
    few = reader_for(store_path, "keyed", [ds.EqualTo(("key",), b"k3")])
    few_batches, few_plan = read_all(few)
    monkeypatch.setattr(engine, "KEY_SPAN_MAX_HITS", 1)
    many = reader_for(store_path, "keyed", [ds.EqualTo(("key",), b"k3")])
    many_batches, many_plan = read_all(many)
    assert offsets_of(few_batches) == offsets_of(many_batches) == want
    assert sum(r.size for r in few_plan) < sum(r.size for r in many_plan)


def test_a_topic_without_key_index_plans_everything(store_path: str) -> None:
    everything = messages(store_path, "unindexed")
    reader = reader_for(store_path, "unindexed", [ds.EqualTo(("key",), RARE)])
    batches, plan = read_all(reader)
    assert sum(r.size for r in plan) == reader.rows_decoded == len(everything)
    assert offsets_of(batches) == [(m.partition, m.offset) for m in everything if m.key == RARE]


def test_value_needle_decodes_only_the_batches_holding_it(store_path: str) -> None:
    """StringContains on value (Spark never builds it for a binary column; a caller of
    pushFilters may): the search kernel passes over the batches without the needle."""
    everything = messages(store_path, "keyed")
    for needle in (NEEDLE, "after", "v1", "", "no such text"):
        raw = needle.encode()
        want = sorted((m.partition, m.offset) for m in everything
                      if m.value is not None and raw in m.value)  # fmt: skip
        for batch_rows in ("3", "65536"):
            reader = reader_for(
                store_path, "keyed", [ds.StringContains(("value",), needle)],
                maxRecordsPerBatch=batch_rows,
            )  # fmt: skip
            batches, _ = read_all(reader)
            assert offsets_of(batches) == want, (needle, batch_rows)
            assert all(b.num_rows <= int(batch_rows) for b in batches)
            if needle in (NEEDLE, "no such text"):
                # each of the four batches decoded from its needle (its last record) on
                assert reader.rows_decoded == len(want) <= 4
    with_key = reader_for(
        store_path,
        "keyed",
        [ds.StringContains(("value",), "v"), ds.In(("key",), (b"k2", RARE)),
         ds.GreaterThan(("offset",), 30)],
    )  # fmt: skip
    batches, _ = read_all(with_key)
    assert offsets_of(batches) == sorted(
        (m.partition, m.offset)
        for m in everything
        if m.key in (b"k2", RARE) and m.offset > 30 and m.value and b"v" in m.value
    )


def test_extras_batches_keep_sparks_arrow_schema(store_path: str) -> None:
    for headers in ("false", "true"):
        source = MqcoreDataSource({"path": store_path, "subscribe": "keyed",
                                   "includeExtras": "true", "includeHeaders": headers,
                                   "maxRecordsPerBatch": "11"})  # fmt: skip
        schema = source.schema()
        want = spark_arrow_schema(schema)
        reader = source.reader(schema)
        batches, plan = read_all(reader)
        assert batches and all(b.schema.equals(want) for b in batches)
        assert sum(b.num_rows for b in batches) == sum(r.size for r in plan)


def test_pieces_split_and_survive_the_range_check(store_path: str) -> None:
    rng = OffsetRange("keyed", 0, 2, 50, ((2, 5), (10, 11), (20, 40), (45, 50)))
    assert rng.size == 29
    parts = split_ranges([rng], lambda t, p: [0, 30], 4, None)
    assert len(parts) == 4 and sum(r.size for r in parts) == 29
    assert [s for r in parts for s in r.spans()] == [(2, 5), (10, 11), (20, 23), (23, 30),
                                                     (30, 37), (37, 40), (45, 50)]  # fmt: skip
    assert max(r.size for r in split_ranges([rng], lambda t, p: [], None, 10)) <= 10
    source = MqcoreDataSource({"path": store_path, "subscribe": "keyed", "failOnDataLoss": "false"})
    opts = source.reader(source.schema()).opts
    with mqcore.open(store_path, read_only=True) as st:
        end = st.end_offset("keyed", 0)
        past = OffsetRange("keyed", 0, end - 3, end + 9, ((end - 3, end - 1), (end + 2, end + 9)))
        assert checked_range(st, past, opts).spans() == ((end - 3, end - 1),)


def test_timestamp_and_key_pushdown_plan_against_spark_filters(store_path: str) -> None:
    """The filters Spark sends with a key lookup (IsNotNull(key) and the lookup): the lookup is
    taken, IsNotNull(key) goes back."""
    source = MqcorePushdownDataSource({"path": store_path, "subscribe": "keyed"})
    reader = source.reader(source.schema())
    since = datetime.datetime.fromtimestamp((SPARK_BASE_TS + 40_000) / 1000, datetime.timezone.utc)
    not_null = ds.IsNotNull(("key",))
    rest = reader.pushFilters(
        [not_null, ds.EqualTo(("key",), b"k4"), ds.GreaterThanOrEqual(("timestamp",), since)]
    )
    assert list(rest) == [not_null] and list(rest)[0] is not_null
    batches, _ = read_all(reader)
    assert offsets_of(batches) == sorted(
        (m.partition, m.offset)
        for m in messages(store_path, "keyed")
        if m.key == b"k4" and m.timestamp >= SPARK_BASE_TS + 40_000
    )
