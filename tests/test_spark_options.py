"""The mqcore Spark source without Spark: option parsing (Kafka's names, defaults, precedence
and errors), offset resolution against real stores, Spark's input-partition split (checked
against a transcription of KafkaOffsetRangeCalculator and Spark's own cases) with
segment-boundary cuts, and the read slots a reused plan resolves again when it runs."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SPARK_BASE_TS
from hypothesis import given, settings
from hypothesis import strategies as hs

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
from mqcore.spark.plan import (
    OffsetRange,
    Piece,
    ReadSlot,
    checked_range,
    java_round,
    kafka_split,
    plan_read,
    plan_slots,
    read_ranges,
    split_ranges,
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
        ({"subscribePattern": "("}, "bad option 'subscribePattern'"),
        ({"subscribePattern": "(a)\\1"}, "RE2 syntax"),
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


def test_a_pathological_subscribe_pattern_costs_linear_time() -> None:
    """subscribePattern is a user's regex matched against every topic name: with Python's
    backtracking `re`, `(a+)+$` against a 40-character name that almost matches ran for
    minutes. It goes through RE2 like every user pattern (query/pattern.py)."""
    import time

    p = parse(subscribePattern="(a+)+b").subscription
    started = time.monotonic()
    assert not p.matches("a" * 240 + "c")
    assert p.matches("a" * 240 + "b")
    assert time.monotonic() - started < 1.0  # Python's re: 2**240 steps


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


def test_split_cuts_are_sparks_or_nearby_segment_starts(ro: mqcore.Store) -> None:
    """Each cut of a real store's split is Spark's, or the segment base offset nearest to it
    within a quarter of the smaller piece beside it."""
    bases = ro.segment_offsets("events", 2)
    assert len(bases) > 3, "the test store must roll segments"
    for options in ({"minPartitions": str(len(bases))}, {"maxRecordsPerPartition": "9"}):
        opts = parse_read_options({"path": ro.path, "assign": '{"events":[2]}', **options})
        whole = [OffsetRange("events", 2, 0, ro.end_offset("events", 2))]
        spark = kafka_split(whole, opts.min_partitions, opts.max_records_per_partition)
        got = plan_read(ro, opts)
        assert len(got) == len(spark) > 1 and spans(got) == spans(spark)
        edges = [got[0].start, *(r.end for r in got)]
        moved = 0
        for k, (mine, theirs) in enumerate(zip(edges, [spark[0].start, *(r.end for r in spark)],
                                               strict=True)):  # fmt: skip
            if mine != theirs:
                moved += 1
                room = min(theirs - edges[k - 1], spark[k].end - theirs) // 4
                assert mine in bases and abs(mine - theirs) <= room
        if "minPartitions" in options:
            assert moved, "some cut should land on a segment start"
        else:
            assert all(r.size <= 9 for r in got)


# -- Spark's rule --------------------------------------------------------------------------------


def spark_get_ranges(
    ranges: list[tuple[str, int, int]], min_partitions: int | None, max_records: int | None
) -> list[tuple[str, int, int]]:
    """KafkaOffsetRangeCalculator.getRanges (Spark 4.1) transcribed line by line, on (topic,
    from, until) triples; Scala's math.round as Java's Math.round (nearest, ties up)."""
    from decimal import ROUND_HALF_UP, Decimal

    def part_count(size: int, total: int, parts: int) -> int:
        x = Decimal(size / total * parts).to_integral_value(rounding=ROUND_HALF_UP)
        return max(int(x), 1)

    def divided(parts: int, r: tuple[str, int, int]) -> list[tuple[str, int, int]]:
        tp, start, until = r
        remaining, out = until - start, []
        for part in range(parts):
            this = remaining // (parts - part)
            remaining -= this
            end = min(start + this, until)
            out.append((tp, start, end))
            start = end
        return out

    offset_ranges = [r for r in ranges if r[2] - r[1] > 0]
    if (min_partitions is None or len(offset_ranges) >= min_partitions) and max_records is None:
        return offset_ranges
    if max_records is not None:
        offset_ranges = [
            d
            for r in offset_ranges
            for d in divided(-(-(r[2] - r[1]) // max_records), r)
            if d[2] - d[1] > 0
        ]
    if min_partitions is None or min_partitions <= len(offset_ranges):
        return offset_ranges
    total = sum(r[2] - r[1] for r in offset_ranges)
    unsplit = [r for r in offset_ranges if part_count(r[2] - r[1], total, min_partitions) == 1]
    unsplit_tps = {r[0] for r in unsplit}
    split_total = total - sum(r[2] - r[1] for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for r in offset_ranges:
        parts = 1 if r[0] in unsplit_tps else part_count(r[2] - r[1], split_total, split_min)
        out += [d for d in divided(parts, r) if d[2] - d[1] > 0]
    return out


def as_triples(ranges: list[OffsetRange]) -> list[tuple[str, int, int]]:
    return [(r.topic, r.start, r.end) for r in ranges]


def as_ranges(triples: list[tuple[str, int, int]]) -> list[OffsetRange]:
    return [OffsetRange(t, 1, a, b) for t, a, b in triples]


# KafkaOffsetRangeCalculatorSuite's cases: (minPartitions, input, Spark's answer)
SPARK_CASES = [
    (3, [("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)], [("t1", 1, 2), ("t2", 1, 2), ("t3", 1, 2)]),
    (4, [("t1", 1, 5)], [("t1", 1, 2), ("t1", 2, 3), ("t1", 3, 4), ("t1", 4, 5)]),
    (4, [("t1", 1, 5), ("t2", 1, 21)],
     [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
    (4, [("t1", 1, 1), ("t2", 1, 21)],  # SPARK-30656
     [("t2", 1, 6), ("t2", 6, 11), ("t2", 11, 16), ("t2", 16, 21)]),
    (4, [("t1", 1, 2), ("t2", 1, 1001)],  # SPARK-30656
     [("t1", 1, 2), ("t2", 1, 334), ("t2", 334, 667), ("t2", 667, 1001)]),
    (1, [("t1", 1, 5), ("t2", 1, 21)], [("t1", 1, 5), ("t2", 1, 21)]),
    (3, [("t1", 1, 11)], [("t1", 1, 4), ("t1", 4, 7), ("t1", 7, 11)]),
    (4, [("t1", 1, 5), ("t2", 1, 21), ("t3", 1, 1)],
     [("t1", 1, 5), ("t2", 1, 7), ("t2", 7, 14), ("t2", 14, 21)]),
    (6, [("t1", 0, 10), ("t2", 0, 10), ("t3", 0, 1)],  # SPARK-28489
     [("t1", 0, 3), ("t1", 3, 6), ("t1", 6, 10), ("t2", 0, 3), ("t2", 3, 6), ("t2", 6, 10),
      ("t3", 0, 1)]),
    (9, [("t1", 0, 10000), ("t2", 0, 15000), ("t3", 0, 20000)],  # SPARK-36576
     [("t1", 0, 5000), ("t1", 5000, 10000), ("t2", 0, 5000), ("t2", 5000, 10000),
      ("t2", 10000, 15000), ("t3", 0, 5000), ("t3", 5000, 10000), ("t3", 10000, 15000),
      ("t3", 15000, 20000)]),
    (6, [("t1", 0, 500), ("t2", 0, 12000), ("t3", 0, 15001)],  # SPARK-36576
     [("t1", 0, 500), ("t2", 0, 6000), ("t2", 6000, 12000), ("t3", 0, 5000),
      ("t3", 5000, 10000), ("t3", 10000, 15001)]),
    (6, [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 10000)],  # SPARK-36576
     [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 2500), ("t3", 2500, 5000), ("t3", 5000, 7500),
      ("t3", 7500, 10000)]),
    (4, [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 2)],  # SPARK-46798
     [("t1", 0, 1), ("t2", 0, 1), ("t3", 0, 1), ("t3", 1, 2)]),
]  # fmt: skip


@pytest.mark.parametrize(("min_partitions", "given", "want"), SPARK_CASES)
def test_split_gives_sparks_answers(
    min_partitions: int, given: list[tuple[str, int, int]], want: list[tuple[str, int, int]]
) -> None:
    assert spark_get_ranges(given, min_partitions, None) == want
    assert as_triples(kafka_split(as_ranges(given), min_partitions, None)) == want
    # with no segment near a cut, the plan is Spark's
    assert as_triples(split_ranges(as_ranges(given), lambda t, p: [], min_partitions, None)) == want


@settings(max_examples=400, deadline=None)
@given(
    sizes=hs.lists(hs.tuples(hs.integers(0, 50), hs.integers(0, 4000)), min_size=1, max_size=7),
    min_partitions=hs.none() | hs.integers(1, 40),
    max_records=hs.none() | hs.integers(1, 3000),
)
def test_split_is_sparks_rule_on_any_ranges(
    sizes: list[tuple[int, int]], min_partitions: int | None, max_records: int | None
) -> None:
    given_ranges = [(f"t{i}", start, start + size) for i, (start, size) in enumerate(sizes)]
    want = spark_get_ranges(given_ranges, min_partitions, max_records)
    assert as_triples(kafka_split(as_ranges(given_ranges), min_partitions, max_records)) == want


def test_split_rounds_like_java() -> None:
    """Spark's getPartCount rounds with Java's Math.round: the nearest integer, ties up;
    0.49999999999999994 rounds to 0 there, where floor(x + 0.5) gives 1."""
    x = 0.49999999999999994
    assert math.floor(x + 0.5) == 1
    assert [java_round(v) for v in (0.5, 1.5, 2.4999, x, 7.0, 2.5000000000000004)] == [
        1, 2, 2, 0, 7, 3
    ]  # fmt: skip


# -- read slots: a plan that outlives its query ------------------------------------------------


def slot_offsets(st: mqcore.Store, opts: ReadOptions, slots: list[ReadSlot]) -> list[tuple]:
    """Every (topic, partition, offset) the slots read now, in slot order (repeats kept)."""
    return [
        (r.topic, r.partition, o)
        for slot in slots
        for r in read_ranges(st, opts, slot)
        for o in range(r.start, r.end)
    ]


def fresh_offsets(st: mqcore.Store, opts: ReadOptions) -> list[tuple]:
    return sorted((r.topic, r.partition, o) for r in plan_read(st, opts)
                  for o in range(r.start, r.end))  # fmt: skip


def test_slots_leave_the_outer_ends_open_and_keep_the_cuts(ro: mqcore.Store) -> None:
    opts = parse_read_options({"path": ro.path, "subscribe": "events", "minPartitions": "6"})
    slots = plan_slots(ro, opts)
    pieces = plan_read(ro, opts)
    assert [s.piece for s in slots] == [
        Piece(
            r.topic,
            r.partition,
            None if i == 0 or pieces[i - 1].partition != r.partition else r.start,
            None if i + 1 == len(pieces) or pieces[i + 1].partition != r.partition else r.end,
        )
        for i, r in enumerate(pieces)
    ]
    assert slots[0].planned == {("events", 0), ("events", 1), ("events", 2)}
    assert all(s.planned is None for s in slots[1:])
    assert slot_offsets(ro, opts, slots) == fresh_offsets(ro, opts)


@pytest.mark.parametrize(
    "options",
    [
        {"subscribe": "t"},
        {"subscribe": "t", "minPartitions": "5"},
        {"subscribe": "t", "maxRecordsPerPartition": "7"},
        {"subscribePattern": "t.*", "minPartitions": "4"},
        {
            "subscribe": "t",
            "startingTimestamp": str(SPARK_BASE_TS + 20),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        {"subscribe": "t", "endingTimestamp": str(SPARK_BASE_TS + 1000)},
    ],
)
def test_a_reused_plan_reads_what_a_fresh_plan_reads(
    tmp_path: Path, options: dict[str, str]
) -> None:
    """Slots planned once, read after appends (to a partition empty when planned, too), a new
    topic and retention: each offset of a fresh plan once, and nothing else."""
    path = str(tmp_path / "store")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", partitions=3, segment_bytes=500, retention_bytes=1, retention_ms=-1)
        for i in range(60):
            st.append("t", b"%d" % i, partition=i % 2, timestamp=SPARK_BASE_TS + i)
        opts = parse_read_options({"path": path, **options})
        slots = plan_slots(st, opts)
        assert sorted(slot_offsets(st, opts, slots)) == fresh_offsets(st, opts)
        for i in range(60, 100):
            st.append("t", b"%d" % i, partition=i % 3, timestamp=SPARK_BASE_TS + i)
        st.create_topic("t2", partitions=1)
        st.append("t2", b"new", timestamp=SPARK_BASE_TS + 500)
        got = slot_offsets(st, opts, slots)
        assert sorted(got) == fresh_offsets(st, opts) and len(set(got)) == len(got)
        st.apply_retention("t")
        assert st.start_offset("t", 0) > 0
        got = slot_offsets(st, opts, slots)
        assert sorted(got) == fresh_offsets(st, opts) and len(set(got)) == len(got)


def test_an_empty_plan_is_one_slot_that_reads_what_appears(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", partitions=2)
        opts = parse_read_options({"path": path, "subscribe": "t"})
        slots = plan_slots(st, opts)
        assert slots == [ReadSlot(None, frozenset())]
        assert slot_offsets(st, opts, slots) == []
        st.append("t", b"x", partition=1)
        assert slot_offsets(st, opts, slots) == [("t", 1, 0)]


def test_a_reused_plan_checks_per_partition_offsets_as_planning_does(tmp_path: Path) -> None:
    """Explicit offsets stay as given (no late binding); a topic that appears under a pattern
    but is missing from them is refused, as a fresh plan refuses it."""
    path = str(tmp_path / "store")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("t", partitions=1)
        for i in range(10):
            st.append("t", b"%d" % i)
        opts = parse_read_options(
            {"path": path, "subscribePattern": "t.*", "startingOffsets": '{"t":{"0":4}}'}
        )
        slots = plan_slots(st, opts)
        st.append("t", b"10")
        assert slot_offsets(st, opts, slots) == [("t", 0, o) for o in range(4, 11)]
        st.create_topic("t2", partitions=1)
        with pytest.raises(InvalidConfigError, match="must name every partition read"):
            slot_offsets(st, opts, slots)
        with pytest.raises(InvalidConfigError, match="must name every partition read"):
            plan_read(st, opts)
