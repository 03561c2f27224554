"""mqcore's query options of the Spark source (issue 35; spark/query.py): key, keys, msgId,
uniqueId, tag, where (SQL92), contains and regex, answered in the reader by the store's engine.
Each answer is compared with a brute-force filter of every record (written here, in Python,
from what the options mean), at the reader (no JVM) over many seeded combinations with offset
and time bounds, and through Spark's one local[2] session: a batch read, a reused DataFrame
that sees appends made after its first query, and a streaming read."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import SPARK_BASE_TS, SPARK_CODECS

import mqcore
from mqcore.errors import InvalidConfigError
from mqcore.query.ids import encode_msg_id

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from pyspark.sql import SparkSession  # noqa: E402

from mqcore.spark.options import parse_read_options  # noqa: E402
from mqcore.spark.source import MqcoreDataSource  # noqa: E402

TOPIC = "events"
REGIONS = ["eu", "us", "apac"]
Pred = Callable[[Any], bool]


def make_store(path: str, seed: int = 35) -> list[Any]:
    """Topic `events`: 3 partitions of small segments (every codec), keys from a small set,
    some records also carrying a `keys` word, tags, properties region and amount, values
    with words to search; every record returned as stored."""
    rng = random.Random(seed)
    with mqcore.open(path, create=True, flush="os") as st:
        st.create_topic(TOPIC, partitions=3, segment_bytes=3000, key_index_entries=128)
        for i in range(90):
            p, n = i % 3, rng.randrange(1, 9)
            keys = [rng.choice([None, b"k%d" % rng.randrange(15)]) for _ in range(n)]
            values = [rng.choice([b"alpha %d" % i, b"beta gamma", None, b"delta-%d" % j])
                      for j in range(n)]  # fmt: skip
            props = [{"region": rng.choice(REGIONS), "amount": rng.randrange(100)}
                     if rng.random() < 0.8 else None for _ in range(n)]  # fmt: skip
            st.append_batch(TOPIC, values, keys=keys, partition=p,
                            timestamps=[SPARK_BASE_TS + 1000 * i + j for j in range(n)],
                            compression=SPARK_CODECS[i % len(SPARK_CODECS)],
                            tags=[rng.choice([None, "red", "blue"]) for _ in range(n)],
                            properties=props)  # fmt: skip
            if i % 17 == 0:
                st.append(TOPIC, b"decoy", key=b"k1", keys=["k3"], partition=p)
        return [m for p in range(3) for m in st.read(TOPIC, p, 0, 1_000_000)]


@pytest.fixture(scope="module")
def query_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Any]]:
    path = str(tmp_path_factory.mktemp("spark-query") / "store")
    return path, make_store(path)


def key_words(m: Any) -> set[bytes]:
    """The keys a record is found by: its key and the words of its `keys` header."""
    words = set((m.header("keys") or b"").split())
    return words | ({m.key} if m.key is not None else set())


def brute(options: dict[str, str]) -> Pred:
    """What the query options mean, as a predicate on one record (no store code)."""
    tests: list[Pred] = []
    if "key" in options:
        tests.append(lambda m: options["key"].encode() in key_words(m))
    if "keys" in options:
        wanted = {k.encode() for k in json.loads(options["keys"])}
        tests.append(lambda m: bool(wanted & key_words(m)))
    if "msgId" in options:
        tests.append(lambda m: encode_msg_id(m.topic, m.partition, m.offset) == options["msgId"])
    if "uniqueId" in options:
        tests.append(lambda m: m.unique_id == options["uniqueId"])
    if "tag" in options:
        tests.append(lambda m: m.tag == options["tag"])
    if "contains" in options:
        tests.append(lambda m: m.value is not None and options["contains"].encode() in m.value)
    if "regex" in options:  # only the two patterns the test uses
        pattern = options["regex"]
        assert pattern == "delta-[0-3]$"
        tests.append(lambda m: m.value is not None and m.value[:-1] == b"delta-"
                     and m.value[-1:] in b"0123")  # fmt: skip
    if "where" in options:
        assert options["where"] == "region = 'eu' AND amount > 50"
        tests.append(lambda m: m.properties.get("region") == "eu"
                     and int(m.properties.get("amount", -1)) > 50)  # fmt: skip
    return lambda m: all(t(m) for t in tests)


def reader_rows(options: dict[str, str]) -> list[tuple[int, int]]:
    """(partition, offset) of every row the source's reader yields, without Spark."""
    source = MqcoreDataSource(options)
    reader = source.reader(source.schema())
    out = []
    for part in reader.partitions():
        for batch in reader.read(part):
            out += list(zip(batch.column("partition").to_pylist(),
                            batch.column("offset").to_pylist(), strict=True))  # fmt: skip
    return sorted(out)


def random_options(rng: random.Random, everything: list[Any]) -> dict[str, str]:
    options: dict[str, str] = {}
    lookup = rng.choice([None, "key", "keys", "msgId", "uniqueId"])
    picked = rng.choice(everything)
    if lookup == "key":
        options["key"] = f"k{rng.randrange(16)}"
    elif lookup == "keys":
        options["keys"] = json.dumps([f"k{rng.randrange(16)}" for _ in range(rng.randrange(1, 4))])
    elif lookup == "msgId":
        options["msgId"] = encode_msg_id(picked.topic, picked.partition, picked.offset)
    elif lookup == "uniqueId":
        options["uniqueId"] = picked.unique_id or str(uuid.uuid4())
    for name, value in (("tag", rng.choice(["red", "blue"])), ("contains", "a"),
                        ("regex", "delta-[0-3]$"),
                        ("where", "region = 'eu' AND amount > 50")):  # fmt: skip
        if rng.random() < 0.3:
            options[name] = value
    if not options:
        options["tag"] = "red"
    return options


@pytest.mark.parametrize("seed", range(4))
def test_the_reader_answers_every_query_as_brute_force(
    query_store: tuple[str, list[Any]], seed: int
) -> None:
    path, everything = query_store
    rng = random.Random(seed)
    for _ in range(25):
        options = random_options(rng, everything)
        bounds: dict[str, str] = {}
        roll = rng.random()
        if roll < 0.3:  # offsets per partition
            starts = {str(p): rng.randrange(0, 40) for p in range(3)}
            bounds["startingOffsets"] = json.dumps({TOPIC: starts})
        elif roll < 0.6:  # a time window
            lo = SPARK_BASE_TS + 1000 * rng.randrange(0, 45)
            bounds["startingTimestamp"] = str(lo)
            bounds["endingTimestamp"] = str(lo + 1000 * rng.randrange(1, 45))
        read = {"path": path, "subscribe": TOPIC, "minPartitions": str(rng.choice([1, 5])),
                **bounds, **options}  # fmt: skip
        plain = set(reader_rows({k: v for k, v in read.items() if k not in options}))
        keep = brute(options)
        want = sorted((m.partition, m.offset) for m in everything
                      if (m.partition, m.offset) in plain and keep(m))  # fmt: skip
        assert reader_rows(read) == want, read


def test_query_options_are_checked_at_load(query_store: tuple[str, list[Any]]) -> None:
    path, _ = query_store
    base = {"path": path, "subscribe": TOPIC}
    for bad, words in (({"key": "a", "msgId": "m1-x"}, "lookup"),
                       ({"keys": "k1"}, "JSON array"), ({"keys": "[]"}, "JSON array"),
                       ({"msgId": "not-an-id"}, "msgId"), ({"uniqueId": "zz"}, "uniqueId"),
                       ({"where": "region = "}, "where"), ({"regex": "("}, "regex")):  # fmt: skip
        with pytest.raises(InvalidConfigError) as e:
            parse_read_options({**base, **bad})
        assert words.lower() in str(e.value).lower(), (bad, str(e.value))


def test_a_reused_dataframe_with_query_options_answers_each_query_afresh(
    session: SparkSession, tmp_path: Path
) -> None:
    """The options belong to the DataFrame: every action runs them again on the store as it
    is then (records appended after the first query are found by the second), and Spark's
    own filters on top narrow them further."""
    path = str(tmp_path / "store")
    everything = make_store(path, seed=7)
    df = (session.read.format("mqcore").option("subscribe", TOPIC).option("key", "k3")
          .option("tag", "red").load(path))  # fmt: skip
    keep = brute({"key": "k3", "tag": "red"})
    first = sorted((r.partition, r.offset) for r in df.collect())
    assert first == sorted((m.partition, m.offset) for m in everything if keep(m))
    assert df.count() == len(first)
    with mqcore.open(path) as st:
        for p in range(3):
            st.append_batch(TOPIC, [b"late"], keys=[b"k3"], partition=p, tags=["red"])
        everything = [m for p in range(3) for m in st.read(TOPIC, p, 0, 1_000_000)]
    second = sorted((r.partition, r.offset) for r in df.collect())
    assert second == sorted((m.partition, m.offset) for m in everything if keep(m))
    assert len(second) == len(first) + 3
    narrowed = sorted((r.partition, r.offset) for r in df.where("partition = 1").collect())
    assert narrowed == [x for x in second if x[0] == 1]


EXTRAS = [{}, {"includeHeaders": "true"}, {"includeExtras": "true"},
          {"includeHeaders": "true", "includeExtras": "true"}]  # fmt: skip


@pytest.mark.parametrize("extra", EXTRAS)
def test_a_querys_rows_are_the_plain_reads_rows(
    query_store: tuple[str, list[Any]], extra: dict[str, str]
) -> None:
    """The matches' Arrow rows (built from the engine's messages) equal, column by column,
    those the Cython decoder builds for a plain read of the same records (headers, nulls,
    timestamps and the extra columns included)."""
    path, everything = query_store
    base = {"path": path, "subscribe": TOPIC, "maxRecordsPerBatch": "7", **extra}

    def table_rows(options: dict[str, str]) -> list[tuple[Any, ...]]:
        source = MqcoreDataSource(options)
        reader = source.reader(source.schema())
        out = []
        for part in reader.partitions():
            for batch in reader.read(part):
                out += [tuple(r.values()) for r in batch.to_pylist()]
        return sorted(out, key=lambda r: (r[3], r[4]))

    plain = table_rows(base)
    for options in ({"tag": "red"}, {"keys": '["k1", "k3"]'},
                    {"where": "region = 'eu' AND amount > 50"}):  # fmt: skip
        keep = brute(options)
        wanted = {(m.partition, m.offset) for m in everything if keep(m)}
        assert table_rows({**base, **options}) == [r for r in plain if (r[3], r[4]) in wanted]


def test_a_stream_with_query_options_gets_the_matches_of_each_micro_batch(
    session: SparkSession, tmp_path: Path
) -> None:
    """spark.readStream with `tag` and `where`: the micro-batches hold exactly the matching
    records, those of the first run and those appended before the second (from the
    checkpoint), each once."""
    import pyarrow as pa

    path = str(tmp_path / "store")
    everything = make_store(path, seed=11)
    options = {"tag": "blue", "where": "region = 'eu' AND amount > 50"}
    keep = brute(options)
    tables: list[pa.Table] = []

    def run() -> None:
        reader = session.readStream.format("mqcore").option("subscribe", TOPIC) \
            .option("startingOffsets", "earliest")  # fmt: skip
        for name, value in options.items():
            reader = reader.option(name, value)
        query = (reader.load(path).writeStream
                 .foreachBatch(lambda df, _: tables.append(df.toArrow()))
                 .option("checkpointLocation", str(tmp_path / "ck")).start())  # fmt: skip
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    def seen() -> list[tuple[int, int]]:
        pairs = []
        for t in tables:
            pairs += zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                         strict=True)  # fmt: skip
        return sorted(pairs)

    run()
    assert seen() == sorted((m.partition, m.offset) for m in everything if keep(m))
    with mqcore.open(path) as st:
        for p in range(3):
            st.append_batch(TOPIC, [b"late", b"late"], partition=p, tags=["blue", "red"],
                            properties=[{"region": "eu", "amount": 99}] * 2)  # fmt: skip
        everything = [m for p in range(3) for m in st.read(TOPIC, p, 0, 1_000_000)]
    run()
    assert seen() == sorted((m.partition, m.offset) for m in everything if keep(m))
