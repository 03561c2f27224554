"""mqcore's extra columns (includeExtras: msg_id and tag) and lookups by key and msg_id through
Spark, which evaluates every filter itself (the source takes none): each answer equals the
store's. Spark queries run on the test run's one local[2] session."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from conftest import SPARK_BASE_TS, SPARK_CODECS, spark_arrow_schema

import mqcore
import mqcore.spark
from mqcore.query.ids import encode_msg_id

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from mqcore.spark.source import MqcoreDataSource  # noqa: E402

RARE = b"rare-key"
RARE_BATCHES = {(0, 10), (1, 41)}  # (partition, batch): the batches whose first key is RARE
BATCHES = 60
Row = tuple[Any, ...]


def make_extras_store(path: str) -> None:
    """Topic "keyed": 2 partitions of many small segments (every codec), keys from a small set
    plus RARE in two batches, a record whose extra `keys` word is RARE (not its key), tags on
    some records. Topic "unindexed": the same kind of records without a key index."""
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
def extras_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("spark-extras") / "store")
    make_extras_store(path)
    return path


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


def read_all(reader: Any) -> list[pa.RecordBatch]:
    return [b for part in reader.partitions() for b in reader.read(part)]


# -- through Spark ------------------------------------------------------------------------------


def test_extras_columns_equal_the_store(session: SparkSession, extras_store: str) -> None:
    """includeExtras: msg_id (the store ID) and tag after the Kafka columns (and headers)."""
    df = load(session, extras_store, subscribe="keyed", includeExtras="true")
    assert df.columns[-2:] == ["msg_id", "tag"] and df.columns[:7] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType"
    ]  # fmt: skip
    got = {(r[3], r[4]): (r[-2], r[-1]) for r in rows(df)}
    want = {
        (m.partition, m.offset): (
            encode_msg_id(m.topic, m.partition, m.offset),
            None if m.header("tag") is None else m.header("tag").decode(),
        )
        for m in messages(extras_store, "keyed")
    }
    assert got == want
    assert {t for _, t in got.values()} == {None, "red", "blue"}
    both = load(
        session, extras_store, subscribe="keyed", includeExtras="true", includeHeaders="true"
    )
    assert both.columns[7:] == ["headers", "msg_id", "tag"]
    assert {(r[3], r[4]): (r[-2], r[-1]) for r in rows(both)} == want


LOOKUPS: list[tuple[str, Any]] = [
    ("key = X'{rare}'", lambda m: m.key == RARE),
    ("key IN (X'{rare}', X'6B33', X'')", lambda m: m.key in (RARE, b"k3", b"")),
    ("key <=> X'6B35' AND offset < 200", lambda m: m.key == b"k5" and m.offset < 200),
    (
        f"key = X'6B31' AND timestamp >= timestamp_millis({SPARK_BASE_TS + 30_000})",
        lambda m: m.key == b"k1" and m.timestamp >= SPARK_BASE_TS + 30_000,
    ),
    ("NOT key = X'6B31' AND offset < 40", lambda m: m.key not in (None, b"k1") and m.offset < 40),
]


@pytest.mark.parametrize("topic", ["keyed", "unindexed"])
def test_key_lookups_answer_what_the_store_holds(
    session: SparkSession, extras_store: str, topic: str
) -> None:
    everything = messages(extras_store, topic)
    df = load(session, extras_store, subscribe=topic)
    for where, keep in LOOKUPS:
        query = where.format(rare=RARE.hex().upper())
        got = [(r[3], r[4]) for r in rows(df.where(query))]
        assert got == sorted((m.partition, m.offset) for m in everything if keep(m)), query
    rare = [m for m in everything if m.key == RARE]
    assert len(rare) == (2 if topic == "keyed" else 1)  # RARE_BATCHES; the decoy is not one


def test_msg_id_lookups_answer_what_the_store_holds(
    session: SparkSession, extras_store: str
) -> None:
    everything = messages(extras_store, "keyed")
    picked = [everything[3], everything[-5]]
    ids = [encode_msg_id(m.topic, m.partition, m.offset) for m in picked]
    other_topic = encode_msg_id("unindexed", 0, 1)
    df = load(session, extras_store, subscribe="keyed", includeExtras="true")
    one = rows(df.where(f"msg_id = '{ids[0]}'"))
    assert [(r[3], r[4]) for r in one] == [(picked[0].partition, picked[0].offset)]
    listed = df.where(f"msg_id IN ('{ids[0]}', '{ids[1]}', '{other_topic}', 'not-an-id')")
    assert [(r[3], r[4]) for r in rows(listed)] == sorted((m.partition, m.offset) for m in picked)
    assert not rows(df.where(f"msg_id = '{ids[0]}' AND msg_id = '{ids[1]}'"))


# -- the reader itself ----------------------------------------------------------------------------


def test_extras_batches_keep_sparks_arrow_schema(extras_store: str) -> None:
    for headers in ("false", "true"):
        source = MqcoreDataSource({"path": extras_store, "subscribe": "keyed",
                                   "includeExtras": "true", "includeHeaders": headers,
                                   "maxRecordsPerBatch": "11"})  # fmt: skip
        schema = source.schema()
        want = spark_arrow_schema(schema)
        reader = source.reader(schema)
        batches = read_all(reader)
        assert batches and all(b.schema.equals(want) and b.num_rows <= 11 for b in batches)
        assert sum(b.num_rows for b in batches) == len(messages(extras_store, "keyed"))
