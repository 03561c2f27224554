"""Compaction: latest record per key with offsets unchanged, tombstones kept for
delete_retention_ms after the pass that first saw them, a model-based test against a dict,
readers of swapped-out segments, the swap's crash points, encode_batch's offset deltas, and
the appends a compacted topic refuses (records without a key)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from conftest import PausedScan, child_env, run_cli
from crashchild import run_child
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore._ext.batch import decode_messages, encode_batch, read_batch_info
from mqcore.crashpoints import CRASH_POINTS
from mqcore.errors import InvalidConfigError, InvalidRecordError, MissingKeyError
from mqcore.storage import cleaner
from mqcore.storage.logdir import CLEAN_SHUTDOWN

T0 = 1_700_000_000_000
DAY = 86_400_000
SEG = 600


def compacted_topic(store: mqcore.Store, name: str = "t", **config: object) -> None:
    store.create_topic(
        name, segment_bytes=SEG, key_index_entries=64, cleanup_policy="compact", **config
    )


def append_keyless(store: mqcore.Store, value: bytes | None, **kw: object) -> int:
    """A record without a key in compacted topic "t", as one gets there: written while the
    topic's policy was delete (a compacted topic refuses it); its offset."""
    policy = store.topic_config("t").cleanup_policy
    store.alter_topic_config("t", cleanup_policy="delete")
    md = store.append("t", value, **kw)  # type: ignore[arg-type]
    store.alter_topic_config("t", cleanup_policy=policy)
    return md.offset


def records(store: mqcore.Store, topic: str = "t") -> list[tuple[int, bytes | None, bytes | None]]:
    start = store.start_offset(topic)
    return [(m.offset, m.key, m.value) for m in store.read(topic, 0, start, 100_000)]


def as_dict(recs: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    """What a consumer rebuilding a table from the log ends with."""
    table: dict[bytes, bytes] = {}
    for _, key, value in recs:
        if key is None:
            continue
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


# -- encode_batch offset deltas -------------------------------------------------------------


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_encode_batch_keeps_given_offset_deltas(codec: int) -> None:
    from mqcore import compression

    batch = encode_batch(
        [b"a", None, b"c"],
        [b"k1", b"k2", None],
        [[("h", b"x")], [], [("n", None)]],
        [T0 + 5, T0 + 1, T0 + 9],
        codec=codec,
        compress=compression.compress,
        offset_deltas=[1, 4, 7],
        last_offset_delta=9,
    )
    batch.set_base_offset(100)
    data = batch.tobytes()
    info = read_batch_info(data, 0, True)
    assert info is not None
    assert (info.base_offset, info.last_offset, info.records_count) == (100, 109, 3)
    assert info.codec == codec
    out: list[mqcore.Message] = []
    pos, nxt = decode_messages(data, 0, "t", 0, 0, 100, out)
    assert (pos, nxt) == (len(data), 110)
    assert [(m.offset, m.timestamp, m.key, m.value, m.headers) for m in out] == [
        (101, T0 + 5, b"k1", b"a", (("h", b"x"),)),
        (104, T0 + 1, b"k2", None, ()),
        (107, T0 + 9, None, b"c", (("n", None),)),
    ]
    out = []
    decode_messages(data, 0, "t", 0, 105, 100, out)
    assert [m.offset for m in out] == [107]


def test_encode_batch_offset_deltas_default_last_delta_and_key_hits() -> None:
    batch = encode_batch([b"a", b"b"], [b"k", b"j"], offset_deltas=[3, 8], index=True)
    assert batch.last_offset_delta == 8 and batch.count == 2
    assert batch.key_hits  # the key index sees both records


@pytest.mark.parametrize(
    ("deltas", "last", "match"),
    [
        ([0, 0], -1, "offset_deltas\\[1\\]=0 must be above 0"),
        ([2, 1], -1, "must be above 2"),
        ([-1, 3], -1, "must be above -1"),
        ([0, 1 << 31], -1, "at most 2147483647"),
        ([0], -1, "1 offset_deltas for 2 values"),
        ([0, "1"], -1, "must be an int"),
        ([0, True], -1, "must be an int"),
        ([0, 5], 4, "below the last record's delta 5"),
        (7, -1, "must be a sequence"),
        (None, 3, "last_offset_delta needs offset_deltas"),
    ],
)
def test_encode_batch_rejects_bad_offset_deltas(deltas: object, last: int, match: str) -> None:
    with pytest.raises(InvalidRecordError, match=match):
        encode_batch([b"a", b"b"], offset_deltas=deltas, last_offset_delta=last)


# -- keys ---------------------------------------------------------------------------------


def test_every_append_refuses_keyless_records_to_a_compacted_topic(store_path: str) -> None:
    """Compaction drops records without a key, so Kafka refuses them at the append; so does
    every append of mqcore (the Store's, a producer's, a transaction's, a delay's, the CLI's
    check), naming the records, before anything is written or parked."""
    with mqcore.open(store_path, flush="os", auto_create_topics=True,
                     cleanup_policy="delete,compact") as store:  # fmt: skip
        store.create_topic("t", partitions=2)
        sends = [
            lambda: store.append("t", b"v"),
            lambda: store.append("t", None, partition=1),
            lambda: store.append_batch("t", [b"a", b"b", b"c"], [b"k", None, None]),
            lambda: store.append_batch("t", [b"a", b"b"], [b"k", None], partition=None),
            lambda: store.append_batch("t", [b"a", b"b"]),
            lambda: store.append("t", b"v", delay_ms=60_000),
            lambda: store.producer().append("t", b"v"),
            lambda: store.begin().append("t", b"v"),
            lambda: store.append("made", b"v"),  # auto-created with the store's policy
            lambda: mqcore.store.check_message(store.topic_config("t"), "t", b"v"),
        ]
        indexes = []
        for send in sends:
            with pytest.raises(MissingKeyError, match="compacted") as refused:
                send()
            indexes.append(refused.value.indexes)
        assert indexes == [(0,), (0,), (1, 2), (1,), (0, 1), (0,), (0,), (0,), (0,), (0,)]
        assert [store.end_offset("t", p) for p in (0, 1)] == [0, 0]
        assert "made" not in store.topics()
        store.append_batch("t", [b"a", None], [b"k1", b"k2"])  # keyed, and a tombstone: taken
        store.alter_topic_config("t", cleanup_policy="delete")
        assert store.append("t", b"v", partition=0).offset == 2  # no longer compacted


def test_mqcore_produce_refuses_unkeyed_lines_for_a_compacted_topic(store_path: str) -> None:
    """A stream stops at the line without a key, naming it and how to give one."""
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("t", cleanup_policy="compact")
    rc, _, err = run_cli("produce", store_path, "t", "-K", "|", stdin=b"a|1\n2\nb|3\n")
    assert rc == 1 and "line 2 has no key" in err and "--key-separator" in err, err
    rc, _, err = run_cli("produce", store_path, "t", "-K", "|", stdin=b"b|3\n")
    assert rc == 0, err
    with mqcore.open(store_path, read_only=True) as store:
        assert [(m.key, m.value) for m in store.read("t", 0, 0, 10)] == [(b"a", b"1"), (b"b", b"3")]


# -- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("delete_retention_ms", -1),
        ("delete_retention_ms", "1"),
        ("min_cleanable_dirty_ratio", 1.5),
        ("min_cleanable_dirty_ratio", -0.1),
        ("min_cleanable_dirty_ratio", True),
        ("min_cleanable_dirty_ratio", "0.5"),
    ],
)
def test_bad_compaction_config_is_refused(store: mqcore.Store, field: str, value: object) -> None:
    with pytest.raises(InvalidConfigError, match=field):
        store.create_topic("t", **{field: value})


def test_compaction_config_defaults() -> None:
    cfg = mqcore.config.TopicConfig()
    assert cfg.delete_retention_ms == DAY
    assert cfg.min_cleanable_dirty_ratio == 0.5


def test_compact_needs_a_compact_policy(store: mqcore.Store) -> None:
    store.create_topic("plain")
    with pytest.raises(InvalidConfigError, match="cleanup_policy='delete'"):
        store.compact("plain")


# -- one pass ------------------------------------------------------------------------------


def test_compaction_keeps_latest_per_key_with_offsets(store: mqcore.Store) -> None:
    compacted_topic(store)
    written = []
    for i in range(80):
        key = None if i % 10 == 9 else b"k%d" % (i % 7)
        kw = dict(timestamp=T0 + i, headers={"i": b"%d" % i})
        if key is None:
            offset = append_keyless(store, b"v%d" % i, **kw)
        else:
            offset = store.append("t", b"v%d" % i, key=key, **kw).offset  # type: ignore[arg-type]
        written.append((offset, key, b"v%d" % i))
    before = records(store)
    active_base = store.segment_offsets("t")[-1]
    report = store.compact("t", now=T0 + 1000)
    assert report.cleaned_segments and report.records_removed > 0
    after = records(store)
    latest = {k: o for o, k, _ in written if k is not None}
    expect = [
        r for r in before if r[0] >= active_base or (r[1] is not None and latest[r[1]] == r[0])
    ]
    assert after == expect  # offsets unchanged, gaps where records went
    assert as_dict(after) == as_dict(before)
    # timestamps and headers ride along; gets land on survivors and miss the gaps
    for offset, _, value in after:
        m = store.get("t", 0, offset)
        assert m is not None and m.value == value
        assert m.timestamp == T0 + offset and m.header("i") == b"%d" % offset
    gone = sorted(set(range(active_base)) - {o for o, _, _ in after})
    assert gone and all(store.get("t", 0, o) is None for o in gone)
    # the key index was rebuilt for the new segments: a key lookup finds only the survivors
    found = store.find_by_key("t", b"k3").messages
    assert [m.offset for m in found] == [o for o, k, _ in after if k == b"k3"]
    assert store.start_offset("t") == 0 and store.end_offset("t") == 80
    assert store.dirty_ratio("t") == 0.0
    # a second pass at once has nothing to remove and rewrites nothing
    again = store.compact("t", now=T0 + 2000)
    assert again.cleaned_segments == [] and again.records_removed == 0
    assert records(store) == after


def test_compaction_keeps_codec_and_log_append_time(store: mqcore.Store) -> None:
    compacted_topic(store, "z", timestamp_type="LogAppendTime")
    for i in range(40):
        store.append_batch(
            "z", [b"a%d" % i, b"b%d" % i], [b"x", b"y%d" % (i % 3)], compression="zstd"
        )
    report = store.compact("z", now=T0)
    assert report.cleaned_segments
    directory = os.path.join(store.path, "z-0")
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".log")):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):  # Kafka v2 batch header: length at 8, attributes at 21
            length, attributes = int.from_bytes(data[pos + 8 : pos + 12], "big"), data[pos + 22]
            assert attributes & 7 == 4 and attributes >> 3 & 1 == 1  # zstd, LogAppendTime
            pos += 12 + length
        assert pos == len(data)
    assert as_dict(records(store, "z")) == {
        b"x": b"a39",
        b"y0": b"b39",
        b"y1": b"b37",
        b"y2": b"b38",
    }


def test_tombstones_live_for_delete_retention_after_first_pass(store: mqcore.Store) -> None:
    compacted_topic(store, delete_retention_ms=1000)
    for i in range(30):
        store.append("t", b"v%d" % i, key=b"k%d" % (i % 3), timestamp=T0)
    md = store.append("t", None, key=b"k1", timestamp=T0)
    for i in range(30):  # push the tombstone into a sealed segment
        store.append("t", b"w%d" % i, key=b"other%d" % (i % 2), timestamp=T0)
    store.compact("t", now=T0 + 10)
    assert (md.offset, b"k1", None) in records(store)  # first seen: kept
    seg_base = max(b for b in store.segment_offsets("t") if b <= md.offset)
    mark = os.path.join(store.path, "t-0", f"{seg_base:020d}.cleanmark")
    assert cleaner.read_cleanmark(mark) == T0 + 10
    report = store.compact("t", now=T0 + 10 + 999)
    assert report.tombstones_removed == 0
    assert (md.offset, b"k1", None) in records(store)
    report = store.compact("t", now=T0 + 10 + 1000)
    assert report.tombstones_removed == 1
    assert b"k1" not in {k for _, k, _ in records(store)}
    assert cleaner.read_cleanmark(mark) == T0 + 10  # the clock is the first pass's


def test_cleanmark_format_and_damage(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "x.cleanmark")
    cleaner.write_cleanmark(path, 123456, 789)
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == 28 and data[:8] == b"MQCM\x01\0\0\0"
    assert int.from_bytes(data[8:16], "big") == 123456
    assert int.from_bytes(data[16:24], "big") == 789
    assert cleaner.read_cleanmark(path) == 123456
    assert cleaner.read_cleanmark_fields(path) == (123456, 789)
    assert not os.path.exists(path + ".tmp")
    for bad in (data[:-1], data + b"\0", data[:9] + b"\xff" + data[10:], b"", b"XQCM" + data[4:]):
        with open(path, "wb") as f:
            f.write(bad)
        assert cleaner.read_cleanmark(path) is None
    assert cleaner.read_cleanmark(path + ".missing") is None


def test_dirty_ratio_drives_the_background_task(store_path: str) -> None:
    with mqcore.open(store_path, flush="os", compaction_check_interval_ms=777) as s:
        tasks = s.log.tasks
        assert tasks.interval_ms("compaction") == 777
        compacted_topic(s, min_cleanable_dirty_ratio=0.9)
        for i in range(60):  # distinct keys: the cleaned segments keep their bytes
            s.append("t", b"v%d" % i, key=b"k%d" % i)
        assert s.dirty_ratio("t") == 1.0
        tasks.run_task("compaction")  # what the worker thread runs
        assert s.dirty_ratio("t") == 0.0
        cleaned = records(s)
        for i in range(12):  # a little new dirt: under 0.9 of the sealed bytes
            s.append("t", b"n%d" % i, key=b"n%d" % i)
        ratio = s.dirty_ratio("t")
        assert 0 < ratio < 0.9
        report = tasks.run_task("compaction")
        assert isinstance(report, cleaner.CompactionReport) and report.segments_seen == 0
        assert records(s)[: len(cleaned)] == cleaned


def test_compaction_progress(store: mqcore.Store) -> None:
    compacted_topic(store)
    for i in range(60):
        store.append("t", b"v%d" % i, key=b"k%d" % (i % 4))
    sealed = len(store.segment_offsets("t")) - 1
    calls: list[tuple[int, int]] = []
    store.compact("t", now=T0, progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (0, sealed) and calls[-1] == (sealed, sealed)
    assert len(calls) == sealed + 1


def test_reader_keeps_reading_a_swapped_out_segment(store: mqcore.Store) -> None:
    compacted_topic(store)
    for i in range(60):
        store.append("t", b"v%d" % i, key=b"k%d" % (i % 3))
    part = store.log.partition("t", 0)
    old = list(part.segments[:-1])
    directory = os.path.join(store.path, "t-0")
    reader = PausedScan(part)
    store.compact("t", now=T0)
    assert all(seg not in part.segments for seg in old)
    assert f"{old[1].base_offset:020d}.log" not in os.listdir(directory)  # merged: removed
    assert len(records(store)) < 60  # new readers see the compacted log
    got = [m.offset for m in reader.finish()]
    assert got == list(range(60))  # the old reader saw the old segments whole
    assert all(seg.fd == -1 for seg in old)
    assert not [n for n in os.listdir(directory) if n.endswith(".deleted")]


# -- model-based ---------------------------------------------------------------------------

KEYS = [b"a", b"b", b"c", b"d", b"e"]
op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.binary(min_size=0, max_size=30)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.none()),
    st.tuples(st.just("keyless"), st.none(), st.binary(max_size=10)),
    st.tuples(st.just("roll"), st.none(), st.none()),
    st.tuples(st.just("compact"), st.integers(0, 3), st.none()),
    st.tuples(st.just("reopen"), st.booleans(), st.none()),
)


class Model:
    """Every record ever written with whether it is still in the log, and each segment's
    tombstone clock: what compaction must leave, computed from the rules alone."""

    def __init__(self, delete_retention: int) -> None:
        self.records: list[tuple[int, bytes | None, bytes | None]] = []
        self.present: list[bool] = []
        self.first_clean: dict[int, int] = {}
        self.delete_retention = delete_retention

    def append(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        self.records.append((offset, key, value))
        self.present.append(True)

    def compact(self, bases: list[int], after: list[int], now: int) -> None:
        """A pass over segments `bases` (the last one active) that left segments `after`."""
        sealed, active_base = bases[:-1], bases[-1]
        latest = {k: o for o, k, _ in self.records if k is not None}
        tombstones_left: set[int] = set()
        for i, (offset, key, value) in enumerate(self.records):
            if offset >= active_base or not self.present[i]:
                continue
            base = max(b for b in sealed if b <= offset)
            mark = self.first_clean.get(base)
            expired = mark is not None and now >= mark + self.delete_retention
            if key is None or latest[key] != offset or (value is None and expired):
                self.present[i] = False
            elif value is None:
                tombstones_left.add(base)
        # merged segments: the clock of the tombstones they hold (one, by the grouping rule),
        # else the newest member's
        marks: dict[int, int] = {}
        ends = [*after[1:], active_base]
        for new_base, end in zip(after[:-1], ends[:-1], strict=True):
            members = [b for b in sealed if new_base <= b < end]
            clocks = {self.first_clean.get(b, now) for b in members if b in tombstones_left}
            assert len(clocks) <= 1, clocks
            marks[new_base] = (
                clocks.pop() if clocks else max(self.first_clean.get(b, now) for b in members)
            )
        self.first_clean = marks

    def visible(self) -> list[tuple[int, bytes | None, bytes | None]]:
        return [r for r, p in zip(self.records, self.present, strict=True) if p]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(op, min_size=1, max_size=60))
def test_model_based_compaction(ops: list[tuple[str, object, object]]) -> None:
    retention = 100
    model = Model(retention)
    now = T0
    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "s")
        s = mqcore.open(path, flush="os")
        try:
            s.create_topic(
                "t",
                segment_bytes=300,
                key_index_entries=64,
                cleanup_policy="compact",
                delete_retention_ms=retention,
            )
            for kind, a, b in ops:
                if kind == "keyless":  # refused, but one written before the topic compacted
                    with pytest.raises(MissingKeyError):
                        s.append("t", b, timestamp=now)  # type: ignore[arg-type]
                    model.append(append_keyless(s, b, timestamp=now), None, b)  # type: ignore[arg-type]
                elif kind in ("put", "delete"):
                    value = None if kind == "delete" else b
                    md = s.append("t", value, key=a, timestamp=now)  # type: ignore[arg-type]
                    model.append(md.offset, a, value)  # type: ignore[arg-type]
                elif kind == "roll":
                    part = s.log.partition("t", 0)
                    with part.locked():
                        if part.active.size:
                            part.roll()
                elif kind == "compact":
                    now += [0, 50, 100, 1000][a]  # type: ignore[index]
                    bases = s.segment_offsets("t")
                    s.compact("t", now=now)
                    after = s.segment_offsets("t")
                    assert after[-1] == bases[-1] and set(after) <= set(bases)
                    model.compact(bases, after, now)
                else:
                    s.close()
                    if a:
                        os.unlink(os.path.join(path, CLEAN_SHUTDOWN))
                    s = mqcore.open(path, flush="os")
                got = records(s)
                assert got == model.visible()
                assert as_dict(got) == as_dict(model.records)
            assert s.end_offset("t") == len(model.records)
            for offset, key, value in model.visible():
                m = s.get("t", 0, offset)
                assert m is not None and (m.key, m.value) == (key, value)
        finally:
            s.close()


# -- crash points --------------------------------------------------------------------------

COMPACT_POINTS = [p for p in CRASH_POINTS if p.startswith("compact.")]
CHILD = """
import sys, mqcore
with mqcore.open(sys.argv[1], flush="os") as s:
    s.compact("t", now=int(sys.argv[2]))
"""


def _build(path: str) -> None:
    with mqcore.open(path, flush="os") as s:
        compacted_topic(s)
        for i in range(240):  # survivors fill several merged segments
            key = None if i % 11 == 10 else b"k%d" % (i % 40)
            value = None if i % 13 == 12 else b"value-%d-%s" % (i, b"x" * 20)
            kw = dict(timestamp=T0 + i, headers={"i": b"%d" % i})
            if key is None:
                append_keyless(s, value, **kw)
            else:
                s.append("t", value, key=key, **kw)  # type: ignore[arg-type]


def _segment_records(path: str) -> tuple[list[int], list[tuple[int, bytes | None, bytes | None]]]:
    with mqcore.open(path, flush="os") as s:
        return s.segment_offsets("t"), records(s)


def test_every_compaction_point_is_listed() -> None:
    assert COMPACT_POINTS == [
        "compact.after_cleaned",
        "compact.after_swap",
        "compact.after_deleted",
        "compact.after_final",
        "compact.before_unlink",
    ]


@pytest.mark.parametrize("point", COMPACT_POINTS)
@pytest.mark.parametrize("nth", [1, 2])
def test_crash_at_every_swap_step_leaves_old_or_new(tmp_path: object, point: str, nth: int) -> None:
    root = str(tmp_path)
    old_path, new_path, crash_path = (os.path.join(root, n) for n in ("old", "new", "crash"))
    _build(old_path)
    shutil.copytree(old_path, new_path)
    shutil.copytree(old_path, crash_path)
    now = T0 + 5000
    with mqcore.open(new_path, flush="os") as s:
        s.compact("t", now=now)
    bases, old = _segment_records(old_path)
    new_bases, new = _segment_records(new_path)
    assert 3 <= len(new_bases) < len(bases)  # segments were merged, into several groups
    assert old != new
    run_child(CHILD, crash_path, str(now), crash_at=f"{point}:{nth}")
    with mqcore.open(crash_path, flush="os") as s:
        crashed_bases = s.segment_offsets("t")
        got = records(s)
        # range by range of the new segments: the old segments and records, or the new segment
        # and the compacted records, never neither or a mix
        ends = [*new_bases[1:], 1 << 62]
        new_groups = 0
        for lo, hi in zip(new_bases, ends, strict=True):
            was = ([b for b in bases if lo <= b < hi], [r for r in old if lo <= r[0] < hi])
            will = ([lo], [r for r in new if lo <= r[0] < hi])
            mine = ([b for b in crashed_bases if lo <= b < hi], [r for r in got if lo <= r[0] < hi])
            assert mine in (was, will), (lo, mine)
            new_groups += mine == will != was
        # groups before the crashing one are new; the crashing one is new once committed
        if point == "compact.before_unlink":  # reached once per old segment of a group
            assert 1 <= new_groups <= nth
        else:
            assert new_groups == nth - 1 + (point != "compact.after_cleaned")
        assert as_dict(got) == as_dict(old)
        for offset, key, value in got:
            m = s.get("t", 0, offset)
            assert m is not None and (m.key, m.value) == (key, value)
        for k in (b"k0", b"k3"):
            assert [m.offset for m in s.find_by_key("t", k).messages] == [
                o for o, kk, _ in got if kk == k
            ]
        names = os.listdir(os.path.join(crash_path, "t-0"))
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted", ".tmp"))]
        # finishing the pass gives exactly what an uninterrupted one gave
        s.compact("t", now=now)
        assert records(s) == new


# Imports mqcore once, then for each "path now k" line on stdin forks a process that opens the
# store and compacts it, SIGKILLing itself before its k-th rename; prints that process's exit
# status (-9 killed, 0 finished). A fork of an idle process is a fresh writer as a new
# interpreter is, without the half second of start-up each of the walk's ~50 steps paid.
RENAME_CHILD = """
import os, signal, sys, traceback
import mqcore


def compact_until_rename(path, now, k):
    with mqcore.open(path, flush="os") as s:
        real, calls = os.rename, [0]

        def rename(src, dst):
            calls[0] += 1
            if calls[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            real(src, dst)

        os.rename = rename
        s.compact("t", now=now)


for line in sys.stdin:
    path, now, k = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            compact_until_rename(path, int(now), int(k))
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def test_crash_between_any_two_renames(tmp_path: object) -> None:
    """Finer than the named points: the child dies before its k-th rename of the pass, for
    every k through the first two swaps (inside a step: some files renamed, others not)."""
    root = str(tmp_path)
    old_path, new_path = os.path.join(root, "old"), os.path.join(root, "new")
    _build(old_path)
    shutil.copytree(old_path, new_path)
    now = T0 + 5000
    with mqcore.open(new_path, flush="os") as s:
        s.compact("t", now=now)
    bases, old = _segment_records(old_path)
    new_bases, new = _segment_records(new_path)
    ends = [*new_bases[1:], 1 << 62]
    k, finished = 0, False
    with (
        open(os.path.join(root, "child.err"), "w+") as errors,
        subprocess.Popen(
            [sys.executable, "-c", RENAME_CHILD],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        ) as child,
    ):  # leaving closes the child's stdin: it ends its loop and exits
        assert child.stdin is not None and child.stdout is not None
        while not finished:
            k += 1
            crash_path = os.path.join(root, f"crash{k}")
            shutil.copytree(old_path, crash_path)
            child.stdin.write(f"{crash_path} {now} {k}\n")
            child.stdin.flush()
            status = child.stdout.readline().strip()
            errors.seek(0)
            assert status in ("0", "-9"), (status, errors.read())
            finished = status == "0" or k >= 80
            check_rename_crash(crash_path, k, now, bases, old, new_bases, new, ends)
    assert k > 20  # the pass really renamed that many files before it finished


def check_rename_crash(
    crash_path: str,
    k: int,
    now: int,
    bases: list[int],
    old: list[tuple[int, bytes | None, bytes | None]],
    new_bases: list[int],
    new: list[tuple[int, bytes | None, bytes | None]],
    ends: list[int],
) -> None:
    """The store a child killed before its k-th rename left: each range of the compacted
    layout is wholly old or wholly new, reads agree, and finishing the pass gives `new`."""
    with mqcore.open(crash_path, flush="os") as s:
        crashed_bases, got = s.segment_offsets("t"), records(s)
        for lo, hi in zip(new_bases, ends, strict=True):
            was = ([b for b in bases if lo <= b < hi], [r for r in old if lo <= r[0] < hi])
            will = ([lo], [r for r in new if lo <= r[0] < hi])
            mine = (
                [b for b in crashed_bases if lo <= b < hi],
                [r for r in got if lo <= r[0] < hi],
            )
            assert mine in (was, will), (k, lo, mine)
        for offset, key, value in got:
            m = s.get("t", 0, offset)
            assert m is not None and (m.key, m.value) == (key, value)
        for seg in s.log.partition("t", 0).segments:  # indexes match their logs
            assert seg.offset_index.entries == 0 or seg.position_for(seg.next_offset - 1) < (
                seg.size
            )
        s.compact("t", now=now)
        assert records(s) == new
    shutil.rmtree(crash_path)
