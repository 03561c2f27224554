"""Hostile files and settings around a store (issue 16, item 4): each costs bounded time and
never takes the store down or writes outside it."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

import mqcore
from mqcore.errors import InvalidRecordError, StoreError, StoreLockedError


def small_store(path: str, n: int = 200) -> None:
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t", partitions=1, segment_bytes=4096)
        for i in range(n):
            s.append("t", b"value-%d" % i + b"." * 40, key=b"k%d" % (i % 9))


def test_deleting_the_lock_file_does_not_admit_a_second_writer(tmp_path: Path) -> None:
    """The writer lock was a flock on `.mqcore.lock`: deleting the file let a second writer
    lock a new one and both wrote (the store then refused to open: offsets going backwards).
    The lock is on the directory itself now."""
    path = str(tmp_path / "s")
    with mqcore.open(path) as first:
        os.unlink(os.path.join(path, ".mqcore.lock"))
        with pytest.raises(StoreLockedError, match="open for writing by another process"):
            mqcore.open(path)
        first.create_topic("t")
        first.append("t", b"still the only writer")
    with mqcore.open(path) as again:  # released at close
        assert again.read("t")[0].value == b"still the only writer"


def test_a_lock_file_symlink_is_never_written_through(tmp_path: Path) -> None:
    """A `.mqcore.lock` that is a symbolic link made every writable open truncate and
    overwrite its target."""
    path = tmp_path / "s"
    path.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"do not touch")
    os.symlink(victim, path / ".mqcore.lock")
    with mqcore.open(str(path)) as s:
        s.create_topic("t")
    assert victim.read_bytes() == b"do not touch"
    assert not os.path.islink(path / ".mqcore.lock")


@pytest.mark.parametrize("read_only", [False, True])
def test_a_segment_symlink_is_refused(tmp_path: Path, read_only: bool) -> None:
    """A `.log` that is a symbolic link, and an unclean open: recovery truncated the link's
    target (to 0 bytes, when it was not a log). A store's files are never followed."""
    path = str(tmp_path / "s")
    small_store(path)
    os.unlink(os.path.join(path, "mqcore-clean-shutdown"))
    log = sorted(n for n in os.listdir(os.path.join(path, "t-0")) if n.endswith(".log"))[-1]
    victim = tmp_path / "elsewhere.bin"
    victim.write_bytes(b"not a log at all " * 100)
    os.unlink(os.path.join(path, "t-0", log))
    os.symlink(victim, os.path.join(path, "t-0", log))
    with pytest.raises(StoreError, match="symbolic link"):
        mqcore.open(path, read_only=read_only)
    assert victim.read_bytes() == b"not a log at all " * 100


def test_a_partition_directory_symlink_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    small_store(path)
    elsewhere = str(tmp_path / "elsewhere")
    shutil.move(os.path.join(path, "t-0"), elsewhere)
    os.symlink(elsewhere, os.path.join(path, "t-0"))
    with pytest.raises(StoreError, match="symbolic link"):
        mqcore.open(path)


@pytest.mark.parametrize("with_metadata", [True, False])
def test_a_stray_directory_is_reported_not_acted_on(tmp_path: Path, with_metadata: bool) -> None:
    """A stray `t-999999` (holding a `.log`) made a writable open create partition directories
    up to that number until it ran out of descriptors. Only partitions the metadata declares
    are opened (without metadata, a Kafka log directory: only those present), and nothing is
    created."""
    path = str(tmp_path / "s")
    small_store(path)
    stray = os.path.join(path, "t-999999")
    shutil.copytree(os.path.join(path, "t-0"), stray)
    if not with_metadata:
        os.unlink(os.path.join(path, "mqcore-topics.json"))
    before = sorted(os.listdir(path))
    started = time.monotonic()
    with mqcore.open(path) as s:
        assert len(s.read("t", 0, 0, 1000)) == 200
        if with_metadata:
            assert s.stray_directories == [stray]
            assert s.available_partitions("t") == [0]
        else:  # a Kafka log directory: the partitions present, numbered as found
            assert s.available_partitions("t") == [0, 999999]
    assert time.monotonic() - started < 30  # it took minutes and then failed (EMFILE)
    after = sorted(os.listdir(path))
    assert [n for n in after if n not in before and not n.startswith("mqcore-")] == []


def test_far_future_timestamps_are_refused(tmp_path: Path) -> None:
    """One record stamped 2**62 kept time retention from ever deleting its segment and every
    later one. Kafka 4's message.timestamp.after.max.ms (an hour) refuses it."""
    with mqcore.open(str(tmp_path / "s"), flush="os") as s:
        s.create_topic("t")
        now = time.time_ns() // 1_000_000
        with pytest.raises(InvalidRecordError, match="message_timestamp_after_max_ms=3600000"):
            s.append("t", b"x", timestamp=2**62)
        with pytest.raises(InvalidRecordError, match="ahead of the clock"):
            s.append_batch("t", [b"a", b"b"], timestamps=[now, now + 2 * 3_600_000])
        assert s.end_offset("t") == 0  # nothing of the refused batch was written
        s.append("t", b"soon", timestamp=now + 30 * 60_000)
        s.append("t", b"old", timestamp=1000)  # any age, by default
        s.create_topic("fresh", message_timestamp_before_max_ms=60_000)
        with pytest.raises(InvalidRecordError, match="message_timestamp_before_max_ms=60000"):
            s.append("fresh", b"old", timestamp=now - 3_600_000)
        s.create_topic("stamped", timestamp_type="LogAppendTime")
        assert s.append("stamped", b"x", timestamp=2**62).timestamp < 2**62  # the log's time


def test_far_future_record_no_longer_holds_retention_off(tmp_path: Path) -> None:
    with mqcore.open(str(tmp_path / "s"), flush="os") as s:
        s.create_topic("t", segment_bytes=1024, retention_ms=60_000)
        now = time.time_ns() // 1_000_000
        old = now - 3_600_000
        for i in range(40):
            try:
                s.append("t", b"v%d" % i + b"." * 50, timestamp=2**62 if i == 5 else old)
            except InvalidRecordError:
                pass
        report = s.apply_retention("t")
        assert report.deleted_segments and s.start_offset("t") == s.end_offset("t")


def test_a_crafted_sparse_index_is_damage_found_at_once(tmp_path: Path) -> None:
    """A 4 GiB sparse `.index` beside a small log made a read-only open read all of it (21 s):
    an index longer than its log could need is damage, and the log is read instead."""
    path = str(tmp_path / "s")
    small_store(path)
    d = os.path.join(path, "t-0")
    index = sorted(n for n in os.listdir(d) if n.endswith(".index"))[0]
    os.truncate(os.path.join(d, index), 4 << 30)
    for read_only in (True, False):
        started = time.monotonic()
        with mqcore.open(path, read_only=read_only) as s:
            got = s.read("t", 0, 0, 1000)
            assert [m.value for m in got] == [b"value-%d" % i + b"." * 40 for i in range(200)]
        assert time.monotonic() - started < 5, read_only
    assert os.path.getsize(os.path.join(d, index)) < 1 << 20  # the writable open rebuilt it
