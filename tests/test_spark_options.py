"""The mqcore Spark source without Spark: option parsing (Kafka's names, defaults, precedence
and errors), offset resolution against real stores, Kafka's input-partition split with
segment-boundary cuts, and the filter arithmetic of pushdown."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SPARK_BASE_TS, make_spark_store

import mqcore
from mqcore.errors import (
    InvalidConfigError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.spark.options import (
    DEFAULT_MAX_RECORDS_PER_BATCH,
    EARLIEST,
    LATEST,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)
from mqcore.spark.plan import OffsetRange, checked_range, plan_read, split_ranges
from mqcore.spark.pushdown import (
    EVERYTHING,
    HIGH,
    LOW,
    Pushdown,
    complement,
    filter_intervals,
    intersect,
    union,
)

# -- parsing ------------------------------------------------------------------------------------


def parse(**options: str) -> ReadOptions:
    return parse_read_options({"path": "/data/store", **options})


def test_defaults_are_kafkas_batch_defaults() -> None:
    o = parse(subscribe="a")
    assert o.subscription.kind == "subscribe" and o.subscription.topics == ("a",)
    assert (o.starting.kind, o.ending.kind) == ("earliest", "latest")
    assert o.starting_strategy == "error"
    assert o.fail_on_data_loss is True and o.include_headers is False
    assert o.min_partitions is None and o.max_records_per_partition is None
    assert o.max_records_per_batch == DEFAULT_MAX_RECORDS_PER_BATCH


def test_option_names_are_case_insensitive_and_values_trimmed() -> None:
    o = parse_read_options(
        {
            "PATH": " /s ",
            "SUBSCRIBE": " a , b,,a ",
            "startingoffsets": " EARLIEST ",
            "INCLUDEHEADERS": "True",
            "minpartitions": "4",
        }
    )
    assert o.path == "/s"
    assert o.subscription.topics == ("a", "b")
    assert o.starting.kind == "earliest"
    assert o.include_headers is True and o.min_partitions == 4


def test_kafka_consumer_and_streaming_options_are_accepted_and_ignored() -> None:
    o = parse(
        subscribe="a",
        **{"kafka.bootstrap.servers": "host:9092", "maxOffsetsPerTrigger": "10"},
    )
    assert o.subscription.topics == ("a",)


def test_unknown_option_is_refused_with_a_suggestion() -> None:
    with pytest.raises(
        InvalidConfigError, match=r"'startingOffset'.*did you mean 'startingOffsets'"
    ):
        parse(subscribe="a", startingOffset="earliest")


def test_path_is_required_and_absolute() -> None:
    with pytest.raises(InvalidConfigError, match="'path'"):
        parse_read_options({"subscribe": "a"})
    with pytest.raises(InvalidConfigError, match="must be an absolute path, not 'data'"):
        parse_read_options({"subscribe": "a", "path": "data"})


def test_write_options() -> None:
    assert parse_write_options({"path": "/s", "TOPIC": " t ", "kafka.acks": "all"}) == (
        WriteOptions("/s", "t")
    )
    assert parse_write_options({"path": "/s"}).topic is None
    with pytest.raises(InvalidConfigError, match="unknown option 'subscribe'"):
        parse_write_options({"path": "/s", "subscribe": "t"})
    with pytest.raises(InvalidConfigError, match="option 'topic'"):
        parse_write_options({"path": "/s", "topic": "a/b"})
    with pytest.raises(InvalidConfigError, match=r"\.save\('/data/store'\)"):
        parse_write_options({"topic": "t"})


@pytest.mark.parametrize(
    "options",
    [{}, {"subscribe": "a", "assign": '{"a":[0]}'}, {"subscribe": "a", "subscribePattern": "a"}],
)
def test_exactly_one_strategy(options: dict[str, str]) -> None:
    with pytest.raises(InvalidConfigError, match="exactly one of the options subscribe"):
        parse(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": " , "}, "names no topic"),
        ({"subscribe": "a/b"}, "outside"),
        ({"subscribePattern": "("}, "not a valid regular expression"),
        ({"subscribePattern": " "}, "is empty"),
        ({"assign": "[0]"}, "must be a JSON object"),
        ({"assign": '{"a":0}'}, "needs a list of partition numbers"),
        ({"assign": '{"a":[-1]}'}, "needs a list of partition numbers"),
        ({"assign": '{"a":[true]}'}, "needs a list of partition numbers"),
        ({"assign": "{}"}, "names no partition"),
        ({"assign": "{", "x": "1"}, "unknown option 'x'"),
        ({"assign": "{"}, "must be a JSON object"),
    ],
)
def test_bad_subscription(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        parse(**options)


def test_assign_and_pattern() -> None:
    o = parse(assign='{"b":[1,0],"a":[2]}')
    assert o.subscription.assigned == (("a", 2), ("b", 0), ("b", 1))
    p = parse(subscribePattern="ev.*").subscription
    assert p.matches("events") and not p.matches("xevents") and not p.matches("e")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "latest"}, "'startingOffsets' cannot be 'latest'"),
        ({"endingOffsets": "earliest"}, "'endingOffsets' cannot be 'earliest'"),
        ({"startingOffsets": '{"a":{"0":-1}}'}, "a-0 cannot be -1"),
        ({"endingOffsets": '{"a":{"0":-2}}'}, "a-0 cannot be -2"),
        ({"startingOffsets": '{"a":{"0":-3}}'}, "offset -3 of a-0 is negative"),
        ({"startingOffsets": "soon"}, "must be a JSON object"),
        ({"startingOffsets": '{"a":{"x":1}}'}, "partition 'x'"),
        ({"startingOffsets": '{"a":{"0":1.5}}'}, "maps partition '0' to 1.5"),
        ({"startingOffsets": '{"a":[1]}'}, "needs an object of partition -> number"),
        ({"startingTimestamp": "yesterday"}, "'startingTimestamp' must be an integer"),
        ({"endingTimestamp": "-5"}, "timestamp in ms >= 0"),
        ({"startingOffsetsByTimestamp": '{"a":{"0":-1}}'}, "timestamp -1 of a-0 is negative"),
        ({"startingOffsetsByTimestampStrategy": "maybe"}, "one of error, latest"),
        ({"failOnDataLoss": "yes"}, "must be true or false"),
        ({"minPartitions": "0"}, "positive integer"),
        ({"maxRecordsPerPartition": "-4"}, "positive integer"),
        ({"maxBytesPerBatch": "lots"}, "must be an integer"),
    ],
)
def test_bad_range_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        parse(subscribe="a", **options)


def test_special_offsets_allowed_on_their_side() -> None:
    o = parse(
        subscribe="a",
        startingOffsets='{"a":{"0":-2,"1":5}}',
        endingOffsets='{"a":{"0":-1,"1":9}}',
    )
    assert o.starting.offsets == {("a", 0): EARLIEST, ("a", 1): 5}
    assert o.ending.offsets == {("a", 0): LATEST, ("a", 1): 9}


def test_timestamp_options_take_precedence_like_kafka() -> None:
    every = {
        "startingTimestamp": "100",
        "startingOffsetsByTimestamp": '{"a":{"0":200}}',
        "startingOffsets": '{"a":{"0":3}}',
    }
    assert parse(subscribe="a", **every).starting.kind == "timestamp"
    assert parse(subscribe="a", **every).starting.timestamp == 100
    del every["startingTimestamp"]
    by_ts = parse(subscribe="a", **every).starting
    assert by_ts.kind == "timestamps" and by_ts.offsets == {("a", 0): 200}
    del every["startingOffsetsByTimestamp"]
    assert parse(subscribe="a", **every).starting.kind == "offsets"
    # the same order on the ending side; a lower-precedence option is not even parsed
    o = parse(subscribe="a", endingTimestamp="7", endingOffsets="not json")
    assert o.ending.kind == "timestamp" and o.ending.timestamp == 7


# -- resolving against a store -------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("spark") / "store")
    make_spark_store(path)
    return path


@pytest.fixture
def ro(spark_store: str) -> Iterator[mqcore.Store]:
    with mqcore.open(spark_store, read_only=True) as st:
        yield st


def plan(st: mqcore.Store, **options: str) -> list[OffsetRange]:
    return plan_read(st, parse_read_options({"path": st.path, **options}))


def spans(ranges: list[OffsetRange]) -> dict[tuple[str, int], tuple[int, int]]:
    """Per topic-partition: (first offset, end) covered by its pieces, which must touch."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for r in ranges:
        key = (r.topic, r.partition)
        if key in out:
            assert out[key][1] == r.start, "pieces of a partition must be contiguous"
            out[key] = (out[key][0], r.end)
        else:
            out[key] = (r.start, r.end)
    return out


def test_default_plan_is_one_range_per_partition(ro: mqcore.Store) -> None:
    ranges = plan(ro, subscribe="events,audit")
    assert [(r.topic, r.partition) for r in ranges] == [
        ("audit", 0),
        ("events", 0),
        ("events", 1),
        ("events", 2),
    ]
    for r in ranges:
        assert (r.start, r.end) == (0, ro.end_offset(r.topic, r.partition))


def test_pattern_and_assign_choose_partitions(ro: mqcore.Store) -> None:
    assert {r.topic for r in plan(ro, subscribePattern="ev.*|oth.*")} == {"events", "other"}
    assert plan(ro, subscribePattern="nothing.*") == []
    ranges = plan(ro, assign='{"events":[2,0]}')
    assert [(r.topic, r.partition) for r in ranges] == [("events", 0), ("events", 2)]


def test_unknown_topics_and_partitions_are_named(ro: mqcore.Store) -> None:
    with pytest.raises(UnknownTopicError, match="'nope'"):
        plan(ro, subscribe="events,nope")
    with pytest.raises(UnknownPartitionError, match="partition 7"):
        plan(ro, assign='{"events":[7]}')


def test_offsets_json_must_name_every_partition(ro: mqcore.Store) -> None:
    with pytest.raises(InvalidConfigError, match=r"names events-0, the subscription reads "):
        plan(ro, subscribe="events", startingOffsets='{"events":{"0":1}}')
    ranges = plan(
        ro,
        subscribe="events",
        startingOffsets='{"events":{"0":3,"1":-2,"2":5}}',
        endingOffsets='{"events":{"0":9,"1":4,"2":-1}}',
    )
    assert spans(ranges) == {
        ("events", 0): (3, 9),
        ("events", 1): (0, 4),
        ("events", 2): (5, ro.end_offset("events", 2)),
    }


def first_offset_at_or_after(st: mqcore.Store, t: str, p: int, ts: int) -> int | None:
    """Brute force: Kafka's offsetsForTimes over every message."""
    hits = [m.offset for m in st.read(t, p, 0, 100_000) if m.timestamp >= ts]
    return min(hits) if hits else None


def test_timestamps_resolve_to_the_first_offset_with_timestamp_at_or_after(
    ro: mqcore.Store,
) -> None:
    for ts in (SPARK_BASE_TS - 1, SPARK_BASE_TS + 7_300, SPARK_BASE_TS + 40_000):
        ranges = plan(ro, subscribe="events", startingTimestamp=str(ts))
        got = spans(ranges)
        for p in range(3):
            want = first_offset_at_or_after(ro, "events", p, ts)
            assert want is not None
            assert got[("events", p)] == (want, ro.end_offset("events", p))
    lo, hi = SPARK_BASE_TS + 5_000, SPARK_BASE_TS + 20_000
    by_ts = json.dumps({"events": {"0": lo, "1": hi, "2": lo}})
    ranges = plan(ro, subscribe="events", startingOffsetsByTimestamp=by_ts, endingTimestamp=str(hi))
    got = spans(ranges)
    for p, start in ((0, lo), (1, hi), (2, lo)):
        first = first_offset_at_or_after(ro, "events", p, start)
        end = first_offset_at_or_after(ro, "events", p, hi)
        assert first is not None and end is not None
        if first < end:
            assert got[("events", p)] == (first, end)
        else:
            assert ("events", p) not in got


def test_no_matching_timestamp_follows_the_strategy(ro: mqcore.Store) -> None:
    late = str(4 * 10**12)  # in 2096: after every record, LogAppendTime ones included
    with pytest.raises(OffsetOutOfRangeError, match=r"no message of audit-0 has a timestamp >="):
        plan(ro, subscribe="audit", startingTimestamp=late)
    assert (
        plan(
            ro,
            subscribe="audit",
            startingTimestamp=late,
            startingOffsetsByTimestampStrategy="latest",
        )
        == []
    )
    # an ending timestamp nothing reaches means latest
    assert spans(plan(ro, subscribe="other", endingTimestamp=late)) == {("other", 0): (0, 1)}


def test_start_after_end_is_refused(ro: mqcore.Store) -> None:
    with pytest.raises(InvalidConfigError, match=r"starting offset 3 .* after ending offset 2"):
        plan(
            ro,
            subscribe="events",
            startingOffsets='{"events":{"0":3,"1":0,"2":0}}',
            endingOffsets='{"events":{"0":2,"1":1,"2":1}}',
        )


def test_offsets_past_the_end_obey_fail_on_data_loss(ro: mqcore.Store) -> None:
    past = '{"other":{"0":50}}'
    with pytest.raises(OffsetOutOfRangeError, match=r"up to 50 .* the log ends at 1"):
        plan(ro, subscribe="other", endingOffsets=past)
    assert spans(plan(ro, subscribe="other", endingOffsets=past, failOnDataLoss="false")) == {
        ("other", 0): (0, 1)
    }


@pytest.fixture
def trimmed(tmp_path: Path) -> Iterator[mqcore.Store]:
    """A store whose oldest segment was deleted, as retention does: it starts at offset > 0."""
    path = str(tmp_path / "trimmed")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", segment_bytes=600, key_index=False)
        for i in range(40):
            st.append("t", b"x" * 60, timestamp=SPARK_BASE_TS + i)
    part = os.path.join(path, "t-0")
    for name in os.listdir(part):
        if name.startswith("00000000000000000000."):
            os.unlink(os.path.join(part, name))
    with mqcore.open(path, read_only=True) as st:
        assert st.start_offset("t", 0) > 0
        yield st


def test_data_loss_names_the_retention_point(trimmed: mqcore.Store) -> None:
    first = trimmed.start_offset("t", 0)
    with pytest.raises(OffsetOutOfRangeError, match=f"log starts at {first} .*retention point"):
        plan(trimmed, subscribe="t", startingOffsets='{"t":{"0":0}}')
    got = plan(trimmed, subscribe="t", startingOffsets='{"t":{"0":0}}', failOnDataLoss="false")
    assert spans(got) == {("t", 0): (first, 40)}
    # earliest is the retention point itself: no loss
    assert spans(plan(trimmed, subscribe="t")) == {("t", 0): (first, 40)}
    # a task re-checks its planned range: retention that ran after planning is data loss too
    opts = parse_read_options({"path": trimmed.path, "subscribe": "t"})
    with pytest.raises(OffsetOutOfRangeError, match="retention point"):
        checked_range(trimmed, OffsetRange("t", 0, 1, 40), opts)


# -- splitting -----------------------------------------------------------------------------------


def no_segments(topic: str, partition: int) -> list[int]:
    return [0]


def test_split_follows_kafkas_rules() -> None:
    ranges = [OffsetRange("a", 0, 0, 100), OffsetRange("a", 1, 0, 300), OffsetRange("b", 0, 5, 5)]
    assert split_ranges(ranges, no_segments, None, None) == ranges[:2]  # empty dropped
    assert split_ranges(ranges, no_segments, 2, None) == ranges[:2]  # enough already
    # minPartitions: pieces in proportion to size (1 and 3 of 4)
    got = split_ranges(ranges, no_segments, 4, None)
    assert [(r.partition, r.start, r.end) for r in got] == [
        (0, 0, 100),
        (1, 0, 100),
        (1, 100, 200),
        (1, 200, 300),
    ]
    # maxRecordsPerPartition: ceil(size / max) pieces of at most max records
    got = split_ranges(ranges, no_segments, None, 120)
    assert [r.size for r in got] == [100, 100, 100, 100]
    assert max(r.size for r in split_ranges(ranges, no_segments, 9, 120)) <= 120


def test_cuts_move_to_nearby_segment_boundaries() -> None:
    def bases(topic: str, partition: int) -> list[int]:
        return [0, 90, 140, 215, 500]

    got = split_ranges([OffsetRange("a", 0, 0, 400)], bases, 4, None)
    # even cuts 100, 200, 300; 90 and 215 are within a quarter piece (25), 300 has none near
    assert [(r.start, r.end) for r in got] == [(0, 90), (90, 215), (215, 300), (300, 400)]
    # unless that breaks maxRecordsPerPartition
    got = split_ranges([OffsetRange("a", 0, 0, 400)], bases, None, 100)
    assert [(r.start, r.end) for r in got] == [(0, 100), (100, 200), (200, 300), (300, 400)]


def test_split_plan_covers_the_same_offsets(ro: mqcore.Store) -> None:
    whole = spans(plan(ro, subscribe="events"))
    pieces = sum(-(-(end - start) // 10) for start, end in whole.values())
    for options, low, high in (
        ({"minPartitions": "7"}, 6, 8),  # Kafka's rounding: about minPartitions
        ({"maxRecordsPerPartition": "10"}, pieces, pieces),
    ):
        ranges = plan(ro, subscribe="events", **options)
        assert spans(ranges) == whole
        assert low <= len(ranges) <= high
    assert all(r.size <= 10 for r in plan(ro, subscribe="events", maxRecordsPerPartition="10"))


def test_split_cuts_of_a_real_store_are_kafkas_or_segment_starts(ro: mqcore.Store) -> None:
    bases = ro.segment_offsets("events", 2)
    assert len(bases) > 3, "the test store must roll segments"
    end = ro.end_offset("events", 2)
    parts = len(bases)
    even, position, remaining = [], 0, end
    for i in range(parts - 1):  # Kafka's cuts: remaining // pieces left
        step = remaining // (parts - i)
        remaining -= step
        position += step
        even.append(position)
    ranges = plan(ro, assign='{"events":[2]}', minPartitions=str(parts))
    inner = [r.start for r in ranges[1:]]
    assert len(inner) == parts - 1
    for cut, kafka in zip(inner, even, strict=True):
        near = [b for b in bases if abs(b - kafka) <= end // (4 * parts)]
        assert cut == (min(near, key=lambda b: abs(b - kafka)) if near else kafka)
    assert set(inner) & set(bases), "some cut should land on a segment start"


# -- pushdown arithmetic -------------------------------------------------------------------------


def test_interval_operations() -> None:
    a = ((0, 10), (20, 30))
    assert intersect(a, ((5, 25),)) == ((5, 10), (20, 25))
    assert union(a, ((8, 21), (40, 41))) == ((0, 30), (40, 41))
    assert complement(a) == ((LOW, 0), (10, 20), (30, HIGH))
    assert complement(complement(a)) == a
    assert intersect(a, complement(a)) == ()


@pytest.fixture
def filters() -> Any:
    return pytest.importorskip("pyspark.sql.datasource", reason="PySpark is not installed")


def test_filters_answered_exactly_become_intervals(filters: Any) -> None:
    ds = filters
    utc = datetime.timezone.utc
    t0 = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=utc)  # SPARK_BASE_TS
    assert filter_intervals(ds.EqualTo(("partition",), 2)) == ("partition", ((2, 3),))
    assert filter_intervals(ds.GreaterThan(("offset",), 5)) == ("offset", ((6, HIGH),))
    assert filter_intervals(ds.LessThanOrEqual(("offset",), 5)) == ("offset", ((LOW, 6),))
    assert filter_intervals(ds.In(("offset",), (3, 1, 2, 9))) == ("offset", ((1, 4), (9, 10)))
    assert filter_intervals(ds.Not(ds.EqualTo(("partition",), 1))) == (
        "partition",
        ((LOW, 1), (2, HIGH)),
    )
    assert filter_intervals(ds.GreaterThanOrEqual(("timestamp",), t0)) == (
        "timestamp",
        ((SPARK_BASE_TS * 1000, HIGH),),
    )
    assert filter_intervals(ds.IsNotNull(("offset",))) == ("offset", EVERYTHING)
    for other in (
        ds.EqualTo(("value",), b"x"),
        ds.EqualTo(("offset",), 1.5),
        ds.EqualTo(("offset",), True),
        ds.In(("partition",), (1, None)),
        ds.GreaterThan(("timestamp",), t0.replace(tzinfo=None)),
        ds.StringContains(("topic",), "ev"),
        ds.EqualTo(("headers", "key"), "a"),
    ):
        assert filter_intervals(other) is None


def test_push_returns_the_filters_it_did_not_take_by_reference(filters: Any) -> None:
    ds = filters
    taken = [ds.EqualTo(("partition",), 1), ds.GreaterThanOrEqual(("offset",), 4)]
    left = [ds.StringStartsWith(("value",), "x"), ds.EqualTo(("offset",), 1.5)]
    push = Pushdown()
    rest = push.push([left[0], taken[0], left[1], taken[1]])
    assert len(rest) == 2 and all(a is b for a, b in zip(rest, left, strict=True))
    assert push.partitions == ((1, 2),) and push.offsets == ((4, HIGH),)
    topic = Pushdown()
    assert topic.push([ds.IsNotNull(("topic",)), ds.EqualTo(("topic",), "t")]) == []
    assert topic.keeps("t", 0) and not topic.keeps("u", 0)
    assert Pushdown().push([ds.IsNull(("topic",))]) == []
    nothing = Pushdown()
    nothing.push([ds.IsNull(("topic",))])
    assert not nothing.keeps("t", 0)


def test_narrow_reads_only_what_the_filters_can_match(filters: Any, ro: mqcore.Store) -> None:
    ds = filters
    push = Pushdown()
    utc = datetime.timezone.utc
    since = datetime.datetime.fromtimestamp((SPARK_BASE_TS + 20_000) / 1000, tz=utc)
    push.push(
        [
            ds.In(("partition",), (0, 2)),
            ds.Not(ds.In(("topic",), ("audit",))),
            ds.LessThan(("offset",), 60),
            ds.GreaterThanOrEqual(("timestamp",), since),
        ]
    )
    opts = parse_read_options({"path": ro.path, "subscribePattern": ".*"})
    ranges = plan_read(ro, opts, push.narrow)
    want = {}
    for t, p in (("events", 0), ("events", 2), ("other", 0)):
        first = first_offset_at_or_after(ro, t, p, SPARK_BASE_TS + 20_000)
        assert first is not None
        if first < min(60, ro.end_offset(t, p)):
            want[(t, p)] = (first, min(60, ro.end_offset(t, p)))
    assert spans(ranges) == want
    assert ("other", 0) in want and ("audit", 0) not in want
