"""Arrow output (`Store.read_arrow`, `Store.iter_arrow`): Spark's Kafka-source schema exactly,
valid arrays, and the same records as `Store.read` for any range, codec, segment roll and bound."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import mqcore
from mqcore.errors import OffsetOutOfRangeError

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def spark_kafka_schema(include_headers: bool) -> pa.Schema:
    """What Spark's Arrow conversion makes of the Kafka source schema, written out here
    independently: every field nullable (StructType.add's default), non-large binary and
    string, int32/int64, timestamps in microseconds in UTC, the list's child named "element"."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(pa.field("element", header))))
    return pa.schema(fields)


def assert_spark_schema(schema: pa.Schema, include_headers: bool) -> None:
    want = spark_kafka_schema(include_headers)
    assert schema.equals(want, check_metadata=True), f"{schema}\n!=\n{want}"
    assert schema.names == want.names
    assert all(f.nullable for f in schema)
    if include_headers:
        element = schema.field("headers").type.value_field
        assert element.name == "element" and element.nullable
        assert [(f.name, f.type, f.nullable) for f in element.type] == [
            ("key", pa.string(), True),
            ("value", pa.binary(), True),
        ]


def rows_of(rb: pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows with the timestamp as integer microseconds (no datetime conversion)."""
    cols = {name: rb.column(name).to_pylist() for name in rb.schema.names if name != "timestamp"}
    cols["timestamp"] = rb.column("timestamp").cast(pa.int64()).to_pylist()
    return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


def rows_from_read(
    store: mqcore.Store, topic: str, partition: int, start: int, end: int, include_headers: bool
) -> list[dict[str, Any]]:
    """The same range through Store.read, as the rows read_arrow must produce."""
    out = []
    offset = start
    while offset < end:
        page = [m for m in store.read(topic, partition, offset, 113) if m.offset >= offset]
        if not page:
            break
        for m in page:
            if m.offset >= end:
                break
            row: dict[str, Any] = {
                "key": m.key,
                "value": m.value,
                "topic": m.topic,
                "partition": m.partition,
                "offset": m.offset,
                "timestampType": m.timestamp_type,
                "timestamp": m.timestamp * 1000,
            }
            if include_headers:
                row["headers"] = [{"key": k, "value": v} for k, v in m.headers]
            out.append(row)
        offset = page[-1].offset + 1
    return out


def fill_topic(
    store: mqcore.Store,
    topic: str,
    seed: int,
    batches: int = 60,
    partitions: int = 1,
    **config: Any,
) -> int:
    """Append batches in every codec (with null/empty keys and values, repeated and null
    headers, timestamps that go backwards) to partition 0; returns the record count."""
    rng = random.Random(seed)
    store.create_topic(topic, partitions=partitions, **config)
    base_ts = time.time_ns() // 1_000_000 - 600_000
    count = 0
    for i in range(batches):
        n = rng.randrange(1, 25)
        values = [
            rng.choice(
                [
                    None,
                    b"",
                    b"line %d " % rng.randrange(10**6) * rng.randrange(1, 9),
                    rng.randbytes(rng.randrange(300)),
                ]
            )
            for _ in range(n)
        ]
        keys = [rng.choice([None, b"", b"key-%d" % rng.randrange(20)]) for _ in range(n)]
        headers = [
            [
                (rng.choice(["a", "a", "b", "\u00fc"]), rng.choice([None, b"", b"hv"]))
                for _ in range(rng.randrange(3))
            ]
            for _ in range(n)
        ]
        stamps = [base_ts + rng.randrange(-5000, 5000) for _ in range(n)]
        store.append_batch(
            topic,
            values,
            keys=keys,
            headers=headers,
            partition=0,
            timestamps=stamps,
            compression=CODECS[i % 5],
        )
        count += n
    return count


@pytest.fixture
def filled(store: mqcore.Store) -> tuple[mqcore.Store, int]:
    """Topic "t" of several segments (segment_bytes 8000) in all five codecs."""
    return store, fill_topic(store, "t", seed=1, segment_bytes=8000)


@pytest.mark.parametrize("include_headers", [False, True])
def test_schema_is_spark_kafka_source(
    filled: tuple[mqcore.Store, int], include_headers: bool
) -> None:
    store, _ = filled
    rb = store.read_arrow("t", 0, 0, 10, include_headers=include_headers)
    assert_spark_schema(rb.schema, include_headers)
    rb.validate(full=True)
    for batch in store.iter_arrow("t", 0, 0, None, include_headers=include_headers, max_records=50):
        assert_spark_schema(batch.schema, include_headers)


@pytest.mark.parametrize("include_headers", [False, True])
def test_whole_partition_equals_read(
    filled: tuple[mqcore.Store, int], include_headers: bool
) -> None:
    store, count = filled
    segments = list((Path(store.path) / "t-0").glob("*.log"))
    assert len(segments) >= 3, "the fixture should span several segments"
    assert store.end_offset("t", 0) == count
    rb = store.read_arrow("t", 0, 0, None, include_headers=include_headers)
    rb.validate(full=True)
    assert rb.num_rows == count
    assert rows_of(rb) == rows_from_read(store, "t", 0, 0, count, include_headers)
    assert rb.column("key").null_count > 0 and rb.column("value").null_count > 0
    assert set(rb.column("partition").to_pylist()) == {0}


def test_random_ranges_equal_read(filled: tuple[mqcore.Store, int]) -> None:
    """[start, end) for random bounds, inside batches, across rolls: end is exclusive."""
    store, count = filled
    rng = random.Random(5)
    for _ in range(40):
        start = rng.randrange(count + 1)
        end = rng.randrange(start, count + 1)
        headers = rng.random() < 0.5
        rb = store.read_arrow("t", 0, start, end, include_headers=headers)
        rb.validate(full=True)
        assert rb.num_rows == end - start
        assert rb.column("offset").to_pylist() == list(range(start, end))
        assert rows_of(rb) == rows_from_read(store, "t", 0, start, end, headers)


@pytest.mark.parametrize("include_headers", [False, True])
def test_empty_ranges(filled: tuple[mqcore.Store, int], include_headers: bool) -> None:
    store, count = filled
    for start, end in ((0, 0), (17, 17), (count, None), (count, count)):
        rb = store.read_arrow("t", 0, start, end, include_headers=include_headers)
        assert rb.num_rows == 0
        assert_spark_schema(rb.schema, include_headers)
        rb.validate(full=True)
        assert list(store.iter_arrow("t", 0, start, end, include_headers=include_headers)) == []


def test_empty_topic(store: mqcore.Store) -> None:
    store.create_topic("empty")
    rb = store.read_arrow("empty", 0)
    assert rb.num_rows == 0
    assert_spark_schema(rb.schema, False)


def test_bad_ranges_raise(filled: tuple[mqcore.Store, int]) -> None:
    store, count = filled
    with pytest.raises(OffsetOutOfRangeError):
        store.read_arrow("t", 0, 10, 5)
    with pytest.raises(OffsetOutOfRangeError):
        store.read_arrow("t", 0, count + 1, count + 5)
    with pytest.raises(OffsetOutOfRangeError):
        store.read_arrow("t", 0, -1, 3)


def test_end_past_the_log_stops_at_its_end(filled: tuple[mqcore.Store, int]) -> None:
    store, count = filled
    rb = store.read_arrow("t", 0, count - 3, count + 100)
    assert rb.column("offset").to_pylist() == [count - 3, count - 2, count - 1]


@pytest.mark.parametrize(
    ("max_records", "max_bytes"),
    [
        (1, 1 << 30),
        (7, 1 << 30),
        (100, 1 << 30),
        (1 << 16, 1),
        (1 << 16, 500),
        (13, 2000),
    ],
)
@pytest.mark.parametrize("include_headers", [False, True])
def test_iter_arrow_bounds_concatenate_to_whole(
    filled: tuple[mqcore.Store, int], max_records: int, max_bytes: int, include_headers: bool
) -> None:
    store, count = filled
    start, end = 5, count - 4
    batches = list(
        store.iter_arrow(
            "t",
            0,
            start,
            end,
            include_headers=include_headers,
            max_records=max_records,
            max_bytes=max_bytes,
        )
    )
    assert len(batches) > 1
    for rb in batches:
        rb.validate(full=True)
        assert 1 <= rb.num_rows <= max_records
        assert rb.num_rows == 1 or data_bytes(rb) <= max_bytes
    whole = pa.Table.from_batches(batches).combine_chunks().to_batches()
    assert sum(rb.num_rows for rb in batches) == end - start
    assert rows_of(whole[0]) == rows_from_read(store, "t", 0, start, end, include_headers)
    assert rows_of(whole[0]) == rows_of(
        store.read_arrow("t", 0, start, end, include_headers=include_headers)
    )


def data_bytes(rb: pa.RecordBatch) -> int:
    """Key and value bytes of a batch (the part of a row max_bytes bounds)."""
    total = 0
    for name in ("key", "value"):
        total += sum(len(v) for v in rb.column(name).to_pylist() if v is not None)
    return total


def test_iter_arrow_default_bounds_one_batch(filled: tuple[mqcore.Store, int]) -> None:
    store, count = filled
    batches = list(store.iter_arrow("t", 0))
    assert len(batches) == 1 and batches[0].num_rows == count


def test_tombstones_and_empty_values_stay_distinct(store: mqcore.Store) -> None:
    store.create_topic("tomb")
    store.append_batch(
        "tomb", [None, b"", b"x", None], keys=[b"", None, b"k", b"k"], timestamps=[5, 4, 3, 2]
    )
    rb = store.read_arrow("tomb", 0)
    assert rb.column("value").to_pylist() == [None, b"", b"x", None]
    assert rb.column("key").to_pylist() == [b"", None, b"k", b"k"]
    assert rb.column("value").null_count == 2 and rb.column("key").null_count == 1
    assert rb.column("timestamp").cast(pa.int64()).to_pylist() == [5000, 4000, 3000, 2000]
    assert rb.column("timestampType").to_pylist() == [0, 0, 0, 0]


def test_headers_keep_order_repeats_and_nulls(store: mqcore.Store) -> None:
    store.create_topic("hdr", unique_ids=False)  # exactly the headers written, no generated uid
    hdrs = [("a", b"1"), ("a", None), ("\u00e9", b""), ("a", b"3")]
    store.append_batch("hdr", [b"v", b"w"], headers=[hdrs, None], compression="zstd")
    rb = store.read_arrow("hdr", 0, include_headers=True)
    rb.validate(full=True)
    assert rb.column("headers").to_pylist() == [[{"key": k, "value": v} for k, v in hdrs], []]


def test_generated_uid_header_is_the_last_arrow_header(store: mqcore.Store) -> None:
    """A topic with unique IDs (the default) shows the generated ("uid", 16 bytes) header last,
    after the caller's, with the bytes Store.read's unique_id names."""
    store.create_topic("uids")
    hdrs = [("a", b"1"), ("a", None)]
    store.append_batch("uids", [b"v", b"w"], headers=[hdrs, None], compression="zstd")
    rows = store.read_arrow("uids", 0, include_headers=True).column("headers").to_pylist()
    msgs = store.read("uids", 0, 0)
    assert [row[:-1] for row in rows] == [[{"key": k, "value": v} for k, v in hdrs], []]
    assert [row[-1]["key"] for row in rows] == ["uid", "uid"]
    assert [row[-1]["value"].hex() for row in rows] == [
        m.unique_id.replace("-", "") for m in msgs if m.unique_id is not None
    ]


def test_header_keys_that_are_not_utf8(store: mqcore.Store) -> None:
    """Header keys are UTF-8 strings in Arrow (Spark's schema); bytes that are not valid UTF-8
    read as U+FFFD replacements, as Java's String decoding shows them, and the array is valid.
    Store.read keeps them losslessly as surrogate escapes."""
    store.create_topic("badkeys", unique_ids=False)  # only the header keys under test
    keys = ["ok", "\udcff\udcfe", "a\udce9b", "\u00e9"]
    store.append("badkeys", b"v", headers=[(k, b"x") for k in keys])
    rb = store.read_arrow("badkeys", 0, include_headers=True)
    rb.validate(full=True)
    got = [h["key"] for h in rb.column("headers").to_pylist()[0]]
    assert got == [k.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for k in keys]
    assert got[1] == "\ufffd\ufffd" and got[2] == "a\ufffdb"
    message = store.read("badkeys", 0, 0)[0]
    assert [k for k, _ in message.headers] == keys


def test_log_append_time_topic(store: mqcore.Store) -> None:
    """Every row reads the batch's append time (type 1), not the producer's timestamps."""
    store.create_topic("lat", timestamp_type="LogAppendTime", segment_bytes=2000)
    before = time.time_ns() // 1_000_000
    for i in range(12):
        store.append_batch(
            "lat", [b"x" * 100] * 5, timestamps=[1, 2, 3, 4, 5], compression=CODECS[i % 5]
        )
    after = time.time_ns() // 1_000_000
    count = store.end_offset("lat", 0)
    rb = store.read_arrow("lat", 0, include_headers=True)
    rb.validate(full=True)
    assert rb.column("timestampType").to_pylist() == [1] * count
    micros = rb.column("timestamp").cast(pa.int64()).to_pylist()
    assert all(before * 1000 <= us <= after * 1000 for us in micros)
    assert rows_of(rb) == rows_from_read(store, "lat", 0, 0, count, True)
    # one append time per batch: the five records of a batch share it
    assert all(len(set(micros[i : i + 5])) == 1 for i in range(0, count, 5))


def test_other_partitions_and_after_reopen(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("multi", partitions=3)
        for p in range(3):
            store.append_batch("multi", [b"p%d-%d" % (p, i) for i in range(p + 2)], partition=p)
    with mqcore.open(store_path, read_only=True) as store:
        for p in range(3):
            rb = store.read_arrow("multi", p)
            rb.validate(full=True)
            assert rb.column("partition").to_pylist() == [p] * (p + 2)
            assert rb.column("topic").to_pylist() == ["multi"] * (p + 2)
            assert rb.column("value").to_pylist() == [b"p%d-%d" % (p, i) for i in range(p + 2)]


@pytest.mark.parametrize("include_headers", [False, True])
def test_pooled_buffers_never_alias_live_batches(
    store: mqcore.Store, include_headers: bool
) -> None:
    """Column buffers of 64 KiB and more come from a pool of blocks given back by batches that
    were dropped (arrowcols.pyx): batches still held keep their bytes while later scans take
    pooled blocks, and a small batch after large ones copies out of its large block."""
    store.create_topic("big")
    rng = random.Random(7)
    for _ in range(12):
        values = [rng.randbytes(rng.randrange(150, 450)) for _ in range(1000)]
        keys = [b"k%d" % rng.randrange(10**6) for _ in range(1000)]
        store.append_batch("big", values, keys=keys, headers=[[("h", b"v")]] * 1000)
    end = store.end_offset("big", 0)
    want = rows_from_read(store, "big", 0, 0, end, include_headers)
    kept = []
    for scan in range(4):
        batches = list(store.iter_arrow("big", 0, 0, None, include_headers=include_headers,
                                        max_records=3000))  # fmt: skip
        assert [r for b in batches for r in rows_of(b)] == want
        if scan % 2 == 0:
            kept.append(batches)  # held while the next scans run; the others go to the pool
        small = store.read_arrow("big", 0, end - 5, end, include_headers=include_headers)
        assert rows_of(small) == want[-5:]
        kept.append([small])
    for batches in kept:
        for b in batches:
            b.validate(full=True)
        assert [r for b in batches for r in rows_of(b)] in (want, want[-5:])


@pytest.mark.parametrize("first_null", [0, 1, 7, 8, 9, 16, 63, 64, 130])
def test_validity_when_the_first_null_comes_late(store: mqcore.Store, first_null: int) -> None:
    """The decoder keeps a column's validity bitmap only from its first null on: the rows
    before that null must still read as valid, whatever byte of the bitmap it falls in, and
    a column without nulls hands Arrow no bitmap."""
    rng = random.Random(first_null)
    store.create_topic("v")
    n = 200
    keys: list[bytes | None] = [b"k%d" % i for i in range(n)]
    keys[first_null] = None
    for i in range(first_null + 1, n):
        keys[i] = None if rng.random() < 0.3 else keys[i]
    values = [b"v%d" % i for i in range(n)]
    for lo in range(0, n, 50):  # several record batches into one Arrow batch
        store.append_batch("v", values[lo : lo + 50], keys[lo : lo + 50], partition=0)
    (rb,) = store.iter_arrow("v", 0, 0, None)
    rb.validate(full=True)
    assert rb.column("key").to_pylist() == keys
    assert rb.column("value").null_count == 0 and rb.column("value").buffers()[0] is None
    assert rb.column("value").to_pylist() == values
