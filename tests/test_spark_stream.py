"""Structured Streaming over mqcore: spark.readStream.format("mqcore") with Kafka's offsets,
read limits, Trigger.AvailableNow, restarts, new partitions, failOnDataLoss and the groupId
commit; df.writeStream.format("mqcore") appending each micro-batch once. The reader and writer
are also driven directly (no Spark) where Spark cannot make a case happen on demand: clocks,
a locked store, a commit cut short by a crash."""

from __future__ import annotations

import glob
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import make_spark_store

import mqcore
import mqcore.spark
from mqcore._ext.hashing import kafka_partition
from mqcore.consume.offsets import OffsetStore
from mqcore.errors import InvalidConfigError, OffsetOutOfRangeError, UnknownPartitionError

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from pyspark.errors import PySparkException  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.datasource import InputPartition  # noqa: E402
from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from mqcore.spark import stream  # noqa: E402
from mqcore.spark.options import (  # noqa: E402
    WriteOptions,
    parse_stream_options,
    parse_write_options,
)
from mqcore.spark.plan import OffsetRange  # noqa: E402
from mqcore.spark.source import MqcoreDataSource  # noqa: E402
from mqcore.spark.stream import (  # noqa: E402
    READ_LIMITS,
    MqcoreStreamReader,
    MqcoreStreamWriter,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)

# read limits and Trigger.AvailableNow as Kafka's source has them need PySpark 4.2+; on 4.1 a
# stream reads everything available per micro-batch (test_spark.py::test_stream_reader_versions)
needs_read_limits = pytest.mark.skipif(
    not READ_LIMITS, reason="read limits and AvailableNow need PySpark 4.2+"
)
Row = tuple[Any, ...]


def read_stream(spark: SparkSession, path: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("mqcore")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(path)


class Batches:
    """A foreachBatch sink: every micro-batch's rows (Arrow), kept on the driver."""

    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.tables.append(df.toArrow())

    def rows(self, *columns: str) -> list[Row]:
        """The rows of every batch; timestamps as integer microseconds, headers as pairs."""
        out: list[Row] = []
        for table in self.tables:
            cols = []
            for name in columns:
                column = table.column(name)
                if pa.types.is_timestamp(column.type):
                    column = column.cast(pa.int64())
                values = column.to_pylist()
                if name == "headers":
                    values = [[(h["key"], h["value"]) for h in hs] for hs in values]
                cols.append(values)
            out.extend(zip(*cols, strict=True))
        return out


def run_available_now(df: DataFrame, sink: Batches, checkpoint: str) -> Any:
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def store_rows(path: str, topic: str, start: dict[int, int] | None = None) -> list[Row]:
    """(key, value, topic, partition, offset, timestamp us, timestampType, headers) per record
    through Store.read, as the stream's Arrow rows look."""
    out: list[Row] = []
    with mqcore.open(path, read_only=True) as st:
        for p in st.available_partitions(topic):
            offset = (start or {}).get(p, st.start_offset(topic, p))
            for m in st.read(topic, p, offset, 1_000_000):
                out.append(
                    (m.key, m.value, m.topic, m.partition, m.offset, m.timestamp * 1000,
                     m.timestamp_type, list(m.headers))
                )  # fmt: skip
    return out


def reader(path: str, **options: str) -> MqcoreStreamReader:
    return MqcoreStreamReader(parse_stream_options({"path": path, **options}))


def make_store(path: str, counts: dict[int, int], topic: str = "t", **config: Any) -> None:
    with mqcore.open(path, flush="os") as st:
        st.create_topic(topic, partitions=len(counts), **config)
        append(st, topic, counts)


def append(st: mqcore.Store, topic: str, counts: dict[int, int]) -> None:
    for p, n in counts.items():
        base = st.end_offset(topic, p)
        st.append_batch(topic, [b"%s-%d-%d" % (topic.encode(), p, base + i) for i in range(n)],
                        partition=p)  # fmt: skip


def make_segmented_store(path: str, n: int) -> None:
    """Topic "t" of `n` records, one batch each, in segments of about eight records, with
    retention_bytes=1: apply_retention() deletes every segment but the active one."""
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", segment_bytes=600, retention_bytes=1, key_index=False)
        for i in range(n):
            st.append("t", b"record %d" % i + b"." * 20, partition=0)


# -- options, offsets and the read-limit arithmetic (no Spark) ---------------------------------


def test_stream_options() -> None:
    o = parse_stream_options({"path": "/s", "subscribe": "a"})
    assert o.read.starting.kind == "latest"  # Kafka's streaming default
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger, o.group_id) == (None,) * 3
    assert o.max_trigger_delay_ms == 15 * 60 * 1000
    o = parse_stream_options(
        {
            "path": "/s",
            "subscribe": "a",
            "startingOffsets": '{"a":{"0":-1,"1":-2}}',
            "maxOffsetsPerTrigger": "100",
            "MINOFFSETSPERTRIGGER": "10",
            "maxTriggerDelay": "30s",
            "groupId": "billing",
            "groupIdPrefix": "ignored",
            "kafka.group.id": "ignored",
        }
    )
    assert o.read.starting.offsets == {("a", 0): -1, ("a", 1): -2}
    assert (o.max_offsets_per_trigger, o.min_offsets_per_trigger) == (100, 10)
    assert (o.max_trigger_delay_ms, o.group_id) == (30_000, "billing")
    for text, ms in (("250", 250), ("250ms", 250), ("2m", 120_000), ("1h", 3_600_000)):
        got = parse_stream_options({"path": "/s", "subscribe": "a", "maxTriggerDelay": text})
        assert got.max_trigger_delay_ms == ms
    bad = [
        ({"endingOffsets": "latest"}, "'endingOffsets' is not valid for a streaming read"),
        ({"EndingTimestamp": "5"}, "'endingTimestamp' is not valid for a streaming read"),
        ({"maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be a positive integer"),
        ({"maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({"groupId": "g" * 32768}, "option 'groupId': group name is 32768 bytes long"),
        ({"maxOffsetPerTrigger": "5"}, "did you mean 'maxOffsetsPerTrigger'"),
    ]
    for extra, message in bad:
        with pytest.raises(InvalidConfigError, match=message):
            parse_stream_options({"path": "/s", "subscribe": "a", **extra})
    # load() cannot tell a stream from a batch read: stream-only options pass schema(), and a
    # batch reader refuses them when planned
    for extra in ({"startingOffsets": "latest"}, {"groupId": "g"}):
        source = MqcoreDataSource({"path": "/s", "subscribe": "a", **extra})
        assert source.schema().fieldNames()[0] == "key"
        with pytest.raises(InvalidConfigError):
            source.reader(source.schema())
    with pytest.raises(InvalidConfigError, match="'groupId'"):
        MqcoreDataSource({"path": "/s", "subscribe": "a", "groupId": "g" * 32768}).schema()
    # Kafka's rule for a group ID: any non-empty string, slashes and commas included
    assert parse_stream_options({"path": "/s", "subscribe": "a", "groupId": "a/b, c"}).group_id == (
        "a/b, c"
    )
    assert parse_write_options(
        {"path": "/s", "checkpointLocation": "/c"}, streaming=True
    ) == WriteOptions("/s", None, "/c")
    with pytest.raises(InvalidConfigError, match="unknown option 'checkpointLocation'"):
        parse_write_options({"path": "/s", "checkpointLocation": "/c"})


def test_min_offsets_per_trigger_above_max_is_refused() -> None:
    """Kafka's source refuses minOffsetsPerTrigger > maxOffsetsPerTrigger (Spark's
    KafkaMicroBatchSourceSuite); equal values are fine."""
    limits = {"path": "/s", "subscribe": "a", "maxOffsetsPerTrigger": "10"}
    with pytest.raises(InvalidConfigError, match=r"'minOffsetsPerTrigger' \(11\) must not be "
                       r"higher than 'maxOffsetsPerTrigger' \(10\)"):  # fmt: skip
        parse_stream_options({**limits, "minOffsetsPerTrigger": "11"})
    source = MqcoreDataSource({**limits, "minOffsetsPerTrigger": "11"})
    with pytest.raises(InvalidConfigError, match="must not be higher"):
        source.streamReader(source.schema())
    same = parse_stream_options({**limits, "minOffsetsPerTrigger": "10"})
    assert (same.min_offsets_per_trigger, same.max_offsets_per_trigger) == (10, 10)


def test_offsets_are_kafkas_checkpoint_shape() -> None:
    offsets = {("b", 10): 7, ("b", 2): 5, ("a", 0): 0}
    text = json.dumps(offsets_to_json(offsets))
    assert text == '{"a": {"0": 0}, "b": {"2": 5, "10": 7}}'  # sorted: the same text each time
    assert offsets_from_json(json.loads(text)) == offsets
    for bad in ([1], {"a": [1]}, {"a": {"x": 1}}, {"a": {"0": -1}}, {"a": {"0": True}}):
        with pytest.raises(InvalidConfigError, match="streaming offset"):
            offsets_from_json(bad)


def test_rate_limit_is_kafkas_proportional_split() -> None:
    a, b, c = ("t", 0), ("t", 1), ("t", 2)
    # backlogs 90 and 30 share 40 as 30 and 10
    assert rate_limit(40, {a: 0, b: 0}, {a: 90, b: 30}, {}) == {a: 30, b: 10}
    # a share below one rounds up (no starving), above one down; never past the end
    assert rate_limit(10, {a: 0, b: 0, c: 5}, {a: 1000, b: 1, c: 5}, {}) == {a: 9, b: 1, c: 5}
    assert rate_limit(1000, {a: 3}, {a: 10}, {}) == {a: 10}
    # a partition missing from the start begins at its earliest offset
    assert rate_limit(20, {a: 0}, {a: 30, b: 40}, {b: 30}) == {a: 15, b: 35}
    # nothing new: the ends as they are
    assert rate_limit(5, {a: 7}, {a: 7}, {}) == {a: 7}


# -- the reader driven directly ----------------------------------------------------------------


def test_reader_offsets_limits_and_available_now(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make_store(path, {0: 30, 1: 10})
    assert reader(path, subscribe="t").initialOffset() == {"t": {"0": 30, "1": 10}}
    r = reader(path, subscribe="t", startingOffsets="earliest")
    start = r.initialOffset()
    assert start == {"t": {"0": 0, "1": 0}}
    # PySpark 4.1's latestOffset(): everything there is
    assert r.latestOffset() == {"t": {"0": 30, "1": 10}}
    assert r.reportLatestOffset() == {"t": {"0": 30, "1": 10}}
    if not READ_LIMITS:
        return
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    assert r.getDefaultReadLimit() == ReadAllAvailable()
    assert r.latestOffset(start, ReadMaxRows(8)) == {"t": {"0": 6, "1": 2}}
    assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 30, "1": 10}}

    # minOffsetsPerTrigger waits for enough new records, or for maxTriggerDelay
    now = [1_000_000]
    m = reader(path, subscribe="t", startingOffsets="earliest", minOffsetsPerTrigger="50",
               maxTriggerDelay="10s")  # fmt: skip
    m.clock = lambda: now[0]
    assert m.getDefaultReadLimit() == ReadMinRows(50)
    begin = m.initialOffset()
    assert m.latestOffset(begin, ReadMinRows(50)) == {"t": {"0": 30, "1": 10}}  # first fires
    assert m.latestOffset(begin, ReadMinRows(50)) == begin  # 40 new < 50: wait
    now[0] += 9_999
    assert m.latestOffset(begin, ReadMinRows(50)) == begin
    now[0] += 1
    assert m.latestOffset(begin, ReadMinRows(50)) == {"t": {"0": 30, "1": 10}}  # delay passed
    with mqcore.open(path, flush="os") as st:
        append(st, "t", {1: 10})
    assert m.latestOffset(begin, ReadMinRows(50)) == {"t": {"0": 30, "1": 20}}  # 50 new: fire

    # both limits: ReadMaxRows from Spark, minOffsetsPerTrigger applied by the reader
    both = reader(path, subscribe="t", startingOffsets="earliest", minOffsetsPerTrigger="5",
                  maxOffsetsPerTrigger="10", maxTriggerDelay="1h")  # fmt: skip
    both.clock = lambda: now[0]
    assert both.getDefaultReadLimit() == ReadMaxRows(10)
    assert both.latestOffset(begin, ReadMaxRows(10)) == {"t": {"0": 6, "1": 4}}
    near = {"t": {"0": 28, "1": 19}}
    assert both.latestOffset(near, ReadMaxRows(10)) == near  # 3 new < 5 within the delay

    # AvailableNow: the target is the ends when it began; it never waits for minOffsets
    a = reader(path, subscribe="t", startingOffsets="earliest", minOffsetsPerTrigger="1000")
    a.clock = lambda: now[0]
    a.prepareForTriggerAvailableNow()
    with mqcore.open(path, flush="os") as st:
        append(st, "t", {0: 5})
    target = {"t": {"0": 30, "1": 20}}
    assert a.latestOffset(begin, ReadMinRows(1000)) == target
    assert a.latestOffset(target, ReadMinRows(1000)) == target  # done: the query ends


def test_reader_partitions_read_and_data_loss(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make_segmented_store(path, 40)
    r = reader(path, subscribe="t", maxRecordsPerPartition="15", includeHeaders="true",
               maxRecordsPerBatch="7")  # fmt: skip
    parts = r.partitions({"t": {"0": 3}}, {"t": {"0": 40}})
    edges = [(p.value.start, p.value.end) for p in parts]
    assert len(edges) == 3 and edges[0][0] == 3 and edges[-1][1] == 40
    assert all(a[1] == b[0] for a, b in itertools.pairwise(edges))
    assert all(e - s <= 15 for s, e in edges)
    batches = [b for p in parts for b in r.read(p)]
    assert max(b.num_rows for b in batches) <= 7
    with mqcore.open(path, read_only=True) as st:
        want = st.read_arrow("t", 0, 3, 40, include_headers=True)
    assert pa.Table.from_batches(batches).equals(pa.Table.from_batches([want]))
    assert list(r.read(InputPartition(None))) == []

    with mqcore.open(path) as st:
        st.apply_retention("t")  # deletes every sealed segment
        first = st.start_offset("t", 0)
    assert 3 < first < 40
    message = rf"data loss in t-0: offsets from 3 .* the log starts at {first} \(its retention"
    with pytest.raises(OffsetOutOfRangeError, match=message):
        r.partitions({"t": {"0": 3}}, {"t": {"0": 40}})
    with pytest.raises(OffsetOutOfRangeError, match=message):
        list(r.read(parts[0]))  # planned before retention ran
    lenient = reader(path, subscribe="t", failOnDataLoss="false")
    parts = lenient.partitions({"t": {"0": 3}}, {"t": {"0": 40}})
    assert [(p.value.start, p.value.end) for p in parts] == [(first, 40)]
    assert sum(b.num_rows for b in lenient.read(InputPartition(OffsetRange("t", 0, 3, 40)))) == (
        40 - first
    )
    # a partition that left the subscription is data loss too
    with pytest.raises(OffsetOutOfRangeError, match=r"data loss: t-1 is no longer in the store"):
        r.partitions({"t": {"0": 39, "1": 5}}, {"t": {"0": 40}})
    assert lenient.partitions({"t": {"0": 39, "1": 5}}, {"t": {"0": 40}})[0].value.start == 39


def test_pattern_skips_internal_topics_and_new_partitions_start_at_zero(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make_store(path, {0: 3}, topic="s1")
    r = reader(path, subscribePattern=".*", groupId="g")
    start = r.initialOffset()
    r.commit(start)  # creates __consumer_offsets, which the pattern must not take
    with mqcore.open(path, flush="os") as st:
        assert "__consumer_offsets" in st.topics()
        st.create_topic("s2", partitions=2)
        append(st, "s2", {0: 2, 1: 1})
    end = r.latestOffset(start, None)
    assert end == {"s1": {"0": 3}, "s2": {"0": 2, "1": 1}}
    ranges = [p.value for p in r.partitions(start, end)]
    assert [(x.topic, x.partition, x.start, x.end) for x in ranges] == [
        ("s2", 0, 0, 2),
        ("s2", 1, 0, 1),
    ]


def test_group_commit_and_a_locked_store(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make_store(path, {0: 8, 1: 4})
    r = reader(path, subscribe="t", startingOffsets="earliest", groupId="spark-job")
    r.commit({"t": {"0": 5, "1": 4}})
    with mqcore.open(path, flush="os") as st:  # the writer: the reader cannot commit now
        offsets = OffsetStore(st.log).group_offsets("spark-job")
        assert {tp: om.offset for tp, om in offsets.items()} == {("t", 0): 5, ("t", 1): 4}
        assert offsets[("t", 0)].metadata == stream.COMMIT_METADATA
        with pytest.warns(RuntimeWarning, match="open for writing in another process"):
            r.commit({"t": {"0": 8, "1": 4}})
        assert OffsetStore(st.log).committed("spark-job", "t", 0).offset == 5  # type: ignore[union-attr]
    r.stop()  # retries what the lock held back
    with mqcore.open(path, flush="os") as st:
        consumer = st.consumer("spark-job", "t")
        try:
            assert consumer.committed("t", 0) == 8
            assert {tp: n for tp, n in consumer.lag().items() if tp[0] == "t"} == {
                ("t", 0): 0,
                ("t", 1): 0,
            }
        finally:
            consumer.close()


# -- the sink driven directly ------------------------------------------------------------------


def sink_store(tmp_path: Path) -> str:
    path = str(tmp_path / "sink")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("out", partitions=3)
    return path


def writer(path: str, **options: str) -> MqcoreStreamWriter:
    source = MqcoreDataSource({"path": path, "checkpointLocation": "/ck/q1", **options})
    schema = StructType([StructField("key", BinaryType()), StructField("value", StringType())])
    w = source.streamWriter(schema, False)
    assert isinstance(w, MqcoreStreamWriter)
    return w


def task(w: MqcoreStreamWriter, rows: Sequence[tuple[bytes | None, str]]) -> Any:
    batch = pa.RecordBatch.from_pydict(
        {"key": pa.array([k for k, _ in rows], pa.binary()), "value": [v for _, v in rows]}
    )
    return w.write(iter([batch]))


def out_rows(path: str) -> list[tuple[int, bytes | None, bytes | None]]:
    with mqcore.open(path, read_only=True) as st:
        return [(m.partition, m.key, m.value) for p in range(3) for m in st.read("out", p, 0, 1000)]


def staging(path: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".arrow"))


def test_sink_commit_is_idempotent_per_batch_id(tmp_path: Path) -> None:
    path = sink_store(tmp_path)
    w = writer(path, topic="out")
    rows = [(b"k%d" % (i % 4), f"v{i}") for i in range(10)] + [(None, "n1"), (None, "n2")]
    w.commit([task(w, rows[:6]), task(w, rows[6:]), task(w, [])], 0)
    first = out_rows(path)
    assert sorted(str(v) for _, _, v in first) == sorted(str(v.encode()) for _, v in rows)
    for p, key, _ in first:
        if key is not None:
            assert p == kafka_partition(key, 3)  # Kafka's producer's partition
    assert staging(path) == []
    # Spark replays batch 0 after a restart: its tasks stage again, the commit appends nothing
    w.commit([task(w, rows)], 0)
    assert out_rows(path) == first and staging(path) == []
    # an aborted batch leaves nothing, a later one appends
    w.abort([task(w, [(None, "lost")]), None], 1)
    assert out_rows(path) == first and staging(path) == []
    w.commit([task(w, [(None, "next")])], 1)
    assert len(out_rows(path)) == len(first) + 1
    marker = glob.glob(os.path.join(path, ".mqcore-spark-stream-*.json"))
    assert len(marker) == 1
    with open(marker[0]) as f:
        assert json.load(f)["batch"] == 1
    # another query (checkpoint) keeps its own batch ids
    other = writer(path, topic="out", checkpointLocation="/ck/q2")
    other.commit([task(other, [(None, "q2")])], 0)
    assert len(out_rows(path)) == len(first) + 2
    # a partition the topic lacks fails the commit before anything is appended
    schema = StructType(
        [StructField("value", BinaryType()), StructField("partition", IntegerType())]
    )
    source = MqcoreDataSource({"path": path, "checkpointLocation": "/ck/q3", "topic": "out"})
    bad = source.streamWriter(schema, False)
    rows_to_7 = pa.RecordBatch.from_pydict(
        {"value": pa.array([b"x", b"y"]), "partition": pa.array([0, 7], pa.int32())}
    )
    with pytest.raises(UnknownPartitionError, match="partition 7 of topic 'out'"):
        bad.commit([bad.write(iter([rows_to_7]))], 0)
    assert len(out_rows(path)) == len(first) + 2 and staging(path) == []


def test_a_commit_cut_short_is_completed_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = sink_store(tmp_path)
    w = writer(path, topic="out")
    rows = [(b"k%d" % (i % 5), f"v{i}") for i in range(40)]
    monkeypatch.setattr(stream, "ROWS_PER_APPEND", 4)
    calls = [0]
    real = stream.append_rows

    def crash_on_the_fifth(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == 5:
            raise OSError("power cut")
        real(*args)

    monkeypatch.setattr(stream, "append_rows", crash_on_the_fifth)
    with pytest.raises(OSError, match="power cut"):
        w.commit([task(w, rows[:25]), task(w, rows[25:])], 3)
    partial = out_rows(path)
    assert 0 < len(partial) < 40
    assert len(staging(path)) == 2  # the prepared batch keeps its files
    monkeypatch.setattr(stream, "append_rows", real)
    # another writer appended meanwhile: its records stay, ours are not confused with them
    with mqcore.open(path, flush="os") as st:
        st.append("out", b"foreign", partition=0)
    # the restarted query replays batch 3 (tasks stage again, maybe in another order)
    w.commit([task(w, rows[25:]), task(w, rows[:25])], 3)
    got = out_rows(path)
    ours = sorted(str(v) for _, _, v in got if v != b"foreign")
    assert ours == sorted(str(v.encode()) for _, v in rows)
    assert len(got) == 41 and staging(path) == []
    w.commit([task(w, rows)], 3)
    assert len(out_rows(path)) == 41


# -- through Spark ----------------------------------------------------------------------------


@needs_read_limits
def test_available_now_reads_what_store_read_reads_in_limited_batches(
    session: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "events")
    make_spark_store(path)
    sink = Batches()
    options = {"startingOffsets": "earliest", "includeHeaders": "true"}
    df = read_stream(session, path, subscribe="events", maxOffsetsPerTrigger="110",
                     groupId="analytics", **options)  # fmt: skip
    query = run_available_now(df, sink, str(tmp_path / "ck"))
    got = sink.rows("key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                    "headers")  # fmt: skip
    want = store_rows(path, "events")
    assert sorted(got, key=lambda r: (r[3], r[4])) == sorted(want, key=lambda r: (r[3], r[4]))
    # the batches are Kafka's maxOffsetsPerTrigger cuts
    with mqcore.open(path, read_only=True) as st:
        ends = {("events", p): st.end_offset("events", p) for p in range(3)}
    position, expected = dict.fromkeys(ends, 0), []
    while position != ends:
        nxt = rate_limit(110, position, ends, {})
        expected.append(sum(nxt.values()) - sum(position.values()))
        position = nxt
    assert [t.num_rows for t in sink.tables] == expected and len(expected) >= 3
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == expected
    # groupId: the stream's position is the group's committed offsets, nothing left to lag
    with mqcore.open(path, flush="os") as st:
        consumer = st.consumer("analytics", "events")
        try:
            assert {p: consumer.committed("events", p) for p in range(3)} == {
                p: ends[("events", p)] for p in range(3)
            }
            assert all(n == 0 for tp, n in consumer.lag().items() if tp[0] == "events")
        finally:
            consumer.close()


def keyed(st: mqcore.Store, topic: str, counts: dict[int, int]) -> None:
    """Records whose value names them (topic/partition/offset), with a key and a header."""
    for p, n in counts.items():
        base = st.end_offset(topic, p)
        for o in range(base, base + n):
            value = f"{topic}/{p}/{o}".encode()
            st.append(topic, value, key=b"k%d" % (o % 7), headers=[("h", value)], partition=p)


def test_a_stream_across_a_restart_copies_each_message_once(
    session: SparkSession, tmp_path: Path
) -> None:
    """A query from one store into another while records are appended, stopped, and restarted
    from its checkpoint: every record after the start is copied once, including a partition
    created mid-stream and the last batch, which Spark runs again after the restart as if the
    driver had died between the sink's commit and Spark's own."""
    src, dst, checkpoint = str(tmp_path / "src"), str(tmp_path / "dst"), str(tmp_path / "ck")
    with mqcore.open(src, flush="os") as st:
        st.create_topic("s1", partitions=2)
        keyed(st, "s1", {0: 10, 1: 10})  # before the start: not read (startingOffsets latest)
    with mqcore.open(dst, flush="os") as st:
        st.create_topic("out", partitions=3)

    def start(df: DataFrame) -> Any:
        return (
            df.select("key", "value", "headers")
            .writeStream.format("mqcore")
            .option("topic", "out")
            .option("checkpointLocation", checkpoint)
        )

    df = read_stream(session, src, subscribePattern="s.*", includeHeaders="true")
    query = start(df).trigger(processingTime="100 milliseconds").start(dst)
    try:
        query.processAllAvailable()  # the start is fixed: the log ends now
        with mqcore.open(src, flush="os") as st:
            keyed(st, "s1", {0: 7, 1: 3})
            st.create_topic("s2", partitions=2)  # new partitions mid-stream: read from 0
            keyed(st, "s2", {0: 2, 1: 3})
            st.create_topic("x", partitions=1)  # not subscribed
            keyed(st, "x", {0: 2})
        query.processAllAvailable()
    finally:
        query.stop()
    last = max(p["batchId"] for p in query.recentProgress if p["numInputRows"])
    commits = os.path.join(checkpoint, "commits")
    assert str(last) in os.listdir(commits)
    for name in (str(last), f".{last}.crc"):
        if os.path.exists(os.path.join(commits, name)):
            os.unlink(os.path.join(commits, name))
    with mqcore.open(src, flush="os") as st:
        keyed(st, "s1", {0: 5})
        keyed(st, "s2", {1: 1})
    df = read_stream(session, src, subscribePattern="s.*", includeHeaders="true")
    if READ_LIMITS:
        again = start(df).trigger(availableNow=True).start(dst)
        again.awaitTermination()
    else:  # PySpark 4.1 runs AvailableNow as one batch: here, only the replayed one
        again = start(df).trigger(processingTime="100 milliseconds").start(dst)
        try:
            again.processAllAvailable()
        finally:
            again.stop()
    assert last in [p["batchId"] for p in again.recentProgress]  # the replayed batch

    with mqcore.open(src, read_only=True) as st:
        first = {("s1", 0): 10, ("s1", 1): 10, ("s2", 0): 0, ("s2", 1): 0}
        want = sorted(
            (m.key, m.value)
            for (t, p), start_at in first.items()
            for m in st.read(t, p, start_at, 1000)
        )
    with mqcore.open(dst, read_only=True) as st:
        copied = [m for p in range(3) for m in st.read("out", p, 0, 1000)]
    assert sorted((m.key, m.value) for m in copied) == want  # each once: no gap, no duplicate
    for m in copied:
        assert m.key is not None and m.partition == kafka_partition(m.key, 3)
        assert [v for k, v in m.headers if k == "h"] == [m.value]
    assert [n for n in os.listdir(dst) if n.endswith(".arrow")] == []


def test_data_loss_fails_the_query_naming_the_retention_point(
    session: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "s")
    make_segmented_store(path, 40)
    with mqcore.open(path) as st:
        st.apply_retention("t")
        first = st.start_offset("t", 0)
    df = read_stream(session, path, subscribe="t", startingOffsets='{"t":{"0":0}}')
    with pytest.raises(PySparkException, match=rf"data loss in t-0.* log starts at {first}"):
        run_available_now(df, Batches(), str(tmp_path / "ck"))


def test_stream_sink_refuses_complete_mode(session: SparkSession, tmp_path: Path) -> None:
    path = sink_store(tmp_path)
    with pytest.raises(InvalidConfigError, match="only appends"):
        MqcoreDataSource({"path": path}).streamWriter(
            StructType([StructField("value", BinaryType())]), True
        )
