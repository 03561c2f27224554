"""Retention by time and by size on real segments: whole segments from the start, never the
active one, the log start offset moving forward, readers that still hold deleted segments,
reopening, and a crash at every retention crash point."""

from __future__ import annotations

import os

import pytest
from conftest import PausedScan
from crashchild import KILLED, run_child

import mqcore
from mqcore.errors import InvalidConfigError, OffsetOutOfRangeError
from mqcore.storage.logdir import CLEAN_SHUTDOWN
from mqcore.storage.retention import expired_prefix

T0 = 1_700_000_000_000
DAY = 86_400_000
SEG = 400  # segment_bytes: a few records per segment


def fill(store: mqcore.Store, topic: str, n: int, **config: object) -> None:
    """`n` records at T0 + i ms, in small segments."""
    store.create_topic(topic, segment_bytes=SEG, key_index_entries=64, **config)
    for i in range(n):
        store.append(topic, b"value-%03d" % i, key=b"k%d" % i, timestamp=T0 + i)


def part_dir(store: mqcore.Store, topic: str) -> str:
    return os.path.join(store.path, f"{topic}-0")


def logs(store: mqcore.Store, topic: str) -> list[str]:
    return sorted(n for n in os.listdir(part_dir(store, topic)) if n.endswith(".log"))


def values(store: mqcore.Store, topic: str) -> list[bytes | None]:
    start = store.start_offset(topic)
    return [m.value for m in store.read(topic, 0, start, 10_000)]


def max_timestamps(store: mqcore.Store, topic: str) -> list[int]:
    """Each segment's largest record timestamp, from its records (every segment holds some)."""
    bases = store.segment_offsets(topic)
    msgs = store.read(topic, 0, store.start_offset(topic), 1 << 20)
    ends = [*bases[1:], 1 << 62]
    return [max(m.timestamp for m in msgs if lo <= m.offset < hi)
            for lo, hi in zip(bases, ends, strict=True)]  # fmt: skip


def segment_sizes(store: mqcore.Store, topic: str) -> list[int]:
    """The byte size of each segment's log file, oldest first."""
    return [os.path.getsize(os.path.join(part_dir(store, topic), n)) for n in logs(store, topic)]


def test_time_retention_deletes_expired_prefix(store: mqcore.Store) -> None:
    fill(store, "t", 60, retention_ms=DAY)
    bases = store.segment_offsets("t")
    assert len(bases) > 5
    stamps = max_timestamps(store, "t")
    now = T0 + DAY + 30  # records with timestamp < T0 + 30 have expired
    expect = next(i for i, ts in enumerate(stamps) if ts >= now - DAY)
    report = store.apply_retention("t", now=now)
    assert len(report.deleted_segments) == expect > 0
    assert report.start_offsets == {("t", 0): bases[expect]}
    assert store.start_offset("t") == bases[expect]
    assert store.segment_offsets("t") == bases[expect:]
    assert logs(store, "t") == [f"{b:020d}.log" for b in bases[expect:]]
    assert not [n for n in os.listdir(part_dir(store, "t")) if n.endswith(".deleted")]
    assert values(store, "t") == [b"value-%03d" % i for i in range(bases[expect], 60)]
    # below the new start: reads raise, gets and time lookups say "none there"
    with pytest.raises(OffsetOutOfRangeError):
        store.read("t", 0, 0)
    with pytest.raises(OffsetOutOfRangeError):
        list(store.iter_arrow("t", 0, 0))
    assert store.get("t", 0, 0) is None
    assert store.offset_for_time("t", 0, T0) == bases[expect]
    assert store.find_by_key("t", b"k0").messages == []
    # a second pass at the same time deletes nothing
    assert store.apply_retention("t", now=now).deleted_segments == []


def test_deleted_bytes_are_the_segment_sizes(store: mqcore.Store) -> None:
    fill(store, "t", 40, retention_ms=DAY)
    sizes = segment_sizes(store, "t")
    report = store.apply_retention("t", now=T0 + DAY + 20)
    assert report.deleted_bytes == sum(sizes[: len(report.deleted_segments)])


def test_size_retention_keeps_at_least_retention_bytes(store: mqcore.Store) -> None:
    fill(store, "t", 60, retention_ms=-1, retention_bytes=1500)
    sizes = segment_sizes(store, "t")
    assert sum(sizes) > 1500
    report = store.apply_retention("t", now=T0)
    left = segment_sizes(store, "t")
    n = len(report.deleted_segments)
    assert left == sizes[n:]
    # Kafka's rule: the rest stays at or above the limit, and one more deletion would cross it
    assert sum(left) >= 1500
    assert sum(left) - left[0] < 1500
    assert store.start_offset("t") == store.segment_offsets("t")[0]


def test_expired_prefix_rules() -> None:
    class Seg:
        def __init__(self, size: int, ts: int) -> None:
            self.size, self.max_timestamp = size, ts

    segs = [Seg(100, 10), Seg(100, 20), Seg(100, 30), Seg(50, 40)]
    assert expired_prefix(segs, -1, -1, 1000) == 0  # type: ignore[arg-type]
    assert expired_prefix(segs, 975, -1, 1000) == 2  # type: ignore[arg-type]
    assert expired_prefix(segs, -1, 150, 1000) == 2  # type: ignore[arg-type]
    assert expired_prefix(segs, -1, 151, 1000) == 1  # type: ignore[arg-type]
    assert expired_prefix(segs, 0, -1, 1000) == 4  # type: ignore[arg-type]
    assert expired_prefix(segs, -1, 0, 1000) == 4  # type: ignore[arg-type]


def test_active_segment_is_never_deleted(store: mqcore.Store) -> None:
    fill(store, "t", 30, retention_ms=DAY)
    store.append("t", b"recent", timestamp=T0 + 5 * DAY)  # the active segment is young
    active = store.segment_offsets("t")[-1]
    store.apply_retention("t", now=T0 + 5 * DAY)
    assert store.segment_offsets("t") == [active]  # it holds expired records too: they stay
    assert logs(store, "t") == [f"{active:020d}.log"]
    old = [b"value-%03d" % i for i in range(active, 30)]
    assert values(store, "t") == [*old, b"recent"]


def test_everything_expired_rolls_and_keeps_an_empty_active_segment(
    store: mqcore.Store, store_path: str
) -> None:
    fill(store, "t", 30, retention_ms=DAY)
    end = store.end_offset("t")
    report = store.apply_retention("t", now=T0 + 2 * DAY)
    assert report.start_offsets[("t", 0)] == end
    assert store.start_offset("t") == store.end_offset("t") == end
    assert logs(store, "t") == [f"{end:020d}.log"]
    assert store.read("t", 0, end) == []
    with pytest.raises(OffsetOutOfRangeError):
        store.read("t", 0, end - 1)
    md = store.append("t", b"after", timestamp=T0 + 2 * DAY)
    assert md.offset == end
    store.close()
    with mqcore.open(store_path, flush="os") as again:
        assert again.start_offset("t") == end
        assert again.end_offset("t") == end + 1
        assert values(again, "t") == [b"after"]


def test_reopen_after_retention(store: mqcore.Store, store_path: str) -> None:
    fill(store, "t", 60, retention_ms=DAY)
    store.apply_retention("t", now=T0 + DAY + 25)
    start, end, got = store.start_offset("t"), store.end_offset("t"), values(store, "t")
    store.close()
    for clean in (True, False):
        if not clean:  # as after a crash: every segment is recovered from the recovery point
            os.unlink(os.path.join(store_path, CLEAN_SHUTDOWN))
        with mqcore.open(store_path, flush="os") as again:
            assert (again.start_offset("t"), again.end_offset("t")) == (start, end)
            assert values(again, "t") == got


def test_only_delete_policy_topics_are_touched(store: mqcore.Store) -> None:
    fill(store, "kept", 30, retention_ms=DAY, cleanup_policy="compact")
    fill(store, "gone", 30, retention_ms=DAY, cleanup_policy="compact,delete")
    report = store.apply_retention(now=T0 + 3 * DAY)
    assert store.start_offset("kept") == 0
    assert store.start_offset("gone") == store.end_offset("gone") == 30
    assert {tp for tp in report.start_offsets} == {("gone", 0)}


def test_progress_counts_segments(store: mqcore.Store) -> None:
    fill(store, "a", 20, retention_ms=DAY)
    fill(store, "b", 20, retention_ms=DAY)
    total = len(store.segment_offsets("a")) + len(store.segment_offsets("b"))
    calls: list[tuple[int, int]] = []
    store.apply_retention(now=T0, progress=lambda d, t: calls.append((d, t)))
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_reader_in_progress_keeps_reading_deleted_segments(store: mqcore.Store) -> None:
    """A scan pinned the segments when it started: retention takes them out of the log and
    renames their files at once, but closes and unlinks them only when the scan ends."""
    fill(store, "t", 60, retention_ms=DAY)
    part = store.log.partition("t", 0)
    first_segments = list(part.segments)
    directory = part_dir(store, "t")
    reader = PausedScan(part)  # held after the first segment while retention runs
    report = store.apply_retention("t", now=T0 + 3 * DAY)
    names = set(os.listdir(directory))
    assert report.deleted_segments  # everything expired: all old segments left the log
    assert part.segments[0] not in first_segments
    # still open by the reader: renamed to .deleted, not unlinked
    assert f"{first_segments[0].base_offset:020d}.log.deleted" in names
    assert f"{first_segments[-1].base_offset:020d}.log.deleted" in names
    got = [m.value for m in reader.finish()]
    assert got == [b"value-%03d" % i for i in range(60)]
    assert all(seg.fd == -1 for seg in first_segments)
    assert not [n for n in os.listdir(directory) if n.endswith(".deleted")]
    assert store.start_offset("t") == store.end_offset("t") == 60


def test_background_task_is_registered(store_path: str) -> None:
    with mqcore.open(store_path, flush="os", retention_check_interval_ms=1234) as s:
        tasks = s.log.tasks
        assert tasks.interval_ms("retention") == 1234
        assert "compaction" in tasks.names()
        fill(s, "t", 30, retention_ms=0)
        tasks.run_task("retention")  # what the worker thread runs: everything expired by now
        assert s.start_offset("t") == 30


@pytest.mark.parametrize("bad", [0, -5, True, "300"])
def test_bad_check_interval_is_refused(store_path: str, bad: object) -> None:
    with pytest.raises(InvalidConfigError, match="retention_check_interval_ms"):
        mqcore.open(store_path, retention_check_interval_ms=bad)


def test_read_only_store_refuses_retention(store: mqcore.Store, store_path: str) -> None:
    fill(store, "t", 10)
    store.close()
    with mqcore.open(store_path, read_only=True) as ro:
        with pytest.raises(mqcore.errors.ReadOnlyStoreError):
            ro.apply_retention()


CHILD = """
import sys, mqcore
with mqcore.open(sys.argv[1], flush="os") as s:
    s.apply_retention("t", now=int(sys.argv[2]))
"""


@pytest.mark.parametrize("point", ["retention.after_deleted", "retention.before_unlink"])
@pytest.mark.parametrize("nth", [1, 3])
def test_crash_during_retention_finishes_at_reopen(store_path: str, point: str, nth: int) -> None:
    now = T0 + DAY + 35
    with mqcore.open(store_path, flush="os") as s:
        fill(s, "t", 60, retention_ms=DAY)
        bases = s.segment_offsets("t")
        stamps = max_timestamps(s, "t")
    start = bases[next(i for i, ts in enumerate(stamps) if ts >= now - DAY)]
    expect_killed = point == "retention.after_deleted" and nth == 1 or point.endswith("unlink")
    run_child(CHILD, store_path, str(now), crash_at=f"{point}:{nth}",
              expect=KILLED if expect_killed else 0)  # fmt: skip
    with mqcore.open(store_path, flush="os") as s:
        assert s.start_offset("t") == start
        assert values(s, "t") == [b"value-%03d" % i for i in range(start, 60)]
        names = os.listdir(part_dir(s, "t"))
        assert not [n for n in names if n.endswith((".deleted", ".swap", ".cleaned"))]
        assert s.segment_offsets("t") == [b for b in bases if b >= start]
