"""The read-only store handle a Spark worker process keeps (mqcore.spark.handles): reused while
the store is unchanged on disk, and never answering from a stale view after an append, a roll,
retention, a topic deleted and created again, a live writer's appends, or the store's removal.
Every answer is compared with a fresh read-only open of the same directory. No Spark needed."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import mqcore
from mqcore import handles
from mqcore.errors import NotAStoreError
from mqcore.handles import close_shared_stores, shared_store
from mqcore.store import Store

View = dict[str, list[tuple[int, int, int, list[bytes | None]]]]


@pytest.fixture(autouse=True)
def no_kept_handles() -> Iterator[None]:
    close_shared_stores()
    yield
    close_shared_stores()


def view(store: Store) -> View:
    """Every topic's partitions: (partition, start, end, values), what a Spark read depends on."""
    out: View = {}
    for t in store.topics():
        rows = []
        for p in store.available_partitions(t):
            start, end = store.start_offset(t, p), store.end_offset(t, p)
            values = [m.value for m in store.read(t, p, start, end - start)] if end > start else []
            rows.append((p, start, end, values))
        out[t] = rows
    return out


def current(path: str) -> View:
    """What the kept handle answers now."""
    with shared_store(path) as store:
        return view(store)


def fresh_view(path: str) -> View:
    with mqcore.open(path, read_only=True) as store:
        return view(store)


def append(path: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    with mqcore.open(path, flush="os") as store:
        for v in values:
            store.append(topic, v, partition=partition)


def make(path: str, **config: object) -> None:
    with mqcore.open(path) as store:
        store.create_topic("t", partitions=2, segment_bytes=1000, **config)
    append(path, "t", [b"a%d" % i for i in range(20)])


def test_an_unchanged_store_keeps_its_handle(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make(path)
    with shared_store(path) as first:
        pass
    with shared_store(path) as again:
        assert again is first and not first.log.closed
        assert view(first) == fresh_view(path)


def test_appends_rolls_and_new_partitions_are_seen(tmp_path: Path) -> None:
    """The same handle call after appends (the active segment grows, then rolls: segment_bytes
    is 1000) and after the first records of the other partition answers what a fresh open does."""
    path = str(tmp_path / "s")
    make(path)
    before = current(path)
    append(path, "t", [b"b"])
    assert current(path) == fresh_view(path) != before
    append(path, "t", [b"c%d" % i for i in range(100)])
    append(path, "t", [b"d%d" % i for i in range(7)], partition=1)
    got = current(path)
    assert got == fresh_view(path)
    assert got["t"][1][2] == 7 and got["t"][0][2] == 121


def test_retention_is_seen(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make(path, retention_bytes=1, retention_ms=-1)
    append(path, "t", [b"x" * 100 for _ in range(40)])
    assert current(path)["t"][0][1] == 0
    with mqcore.open(path) as store:
        store.apply_retention("t")
        moved = store.start_offset("t", 0)
    assert moved > 0
    got = current(path)
    assert got == fresh_view(path) and got["t"][0][1] == moved


def test_a_topic_deleted_and_created_again_is_read_anew(tmp_path: Path) -> None:
    """Same name, same partition count, fewer records and other values: no record of the old
    topic comes back."""
    path = str(tmp_path / "s")
    make(path)
    old = current(path)
    with mqcore.open(path) as store:
        store.delete_topic("t")
        store.create_topic("t", partitions=2, segment_bytes=1000)
    append(path, "t", [b"new%d" % i for i in range(3)])
    got = current(path)
    assert got == fresh_view(path) != old
    assert got["t"][0][3] == [b"new0", b"new1", b"new2"]


def test_a_live_writer_appends_are_seen(tmp_path: Path) -> None:
    """The writer keeps the store open between the reads (no close, no clean-shutdown marker
    written in between): each append is still seen by the next call."""
    path = str(tmp_path / "s")
    make(path)
    with mqcore.open(path, flush="os") as writer:
        for i in range(30):
            writer.append("t", b"live%d" % i, partition=1)
            got = current(path)
            assert got["t"][1][2] == i + 1
            assert got["t"][1][3][-1] == b"live%d" % i
    assert current(path) == fresh_view(path)


def test_a_removed_store_is_not_served(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make(path)
    current(path)
    shutil.rmtree(path)
    with pytest.raises(NotAStoreError):
        current(path)
    make(path)  # a new store at the same path: its records, not the kept ones
    append(path, "t", [b"z"])
    assert current(path) == fresh_view(path)


def test_handles_of_many_stores_are_bounded(tmp_path: Path) -> None:
    """Beyond MAX_STORES paths the least recently used handle is closed, not leaked."""
    from mqcore.handles import MAX_STORES

    paths = [str(tmp_path / f"s{i}") for i in range(MAX_STORES + 2)]
    for p in paths:
        make(p)
    handles = []
    for p in paths:
        with shared_store(p) as h:
            handles.append(h)
    assert [h.log.closed for h in handles] == [True, True] + [False] * MAX_STORES
    assert current(paths[0]) == fresh_view(paths[0])


def deleted_files_held(path: str) -> set[str]:
    """Files under `path` this process still holds, open or mapped, although they were
    deleted: their disk space is not free yet."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            held.add(os.readlink(f"/proc/self/fd/{fd}"))
    with open("/proc/self/maps") as maps:
        held.update(line.split(None, 5)[-1].strip() for line in maps if "/" in line)
    return {f for f in held if f.startswith(path) and f.endswith(" (deleted)")}


def wait_for(what: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_an_idle_handle_lets_retention_free_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open store keeps the segments it read open, so their disk space outlives retention's
    deletion; an idle Spark worker must not pin them: a handle nobody borrowed for
    IDLE_SECONDS is closed. A handle lent for longer than that stays open while lent."""
    monkeypatch.setattr(handles, "IDLE_SECONDS", handles.IDLE_SECONDS)  # put back afterwards
    # the reaper, started by an earlier test, takes 0.2 s at once (it waited out its 7.5 s)
    handles.set_idle_seconds(0.2)
    path = str(tmp_path / "s")
    make(path, retention_bytes=1, retention_ms=-1)
    append(path, "t", [b"x" * 100 for _ in range(40)])
    with shared_store(path) as store:
        assert len(view(store)["t"][0][3]) == 60  # every segment read, so every one open
        with mqcore.open(path) as writer:
            writer.apply_retention("t")
        assert deleted_files_held(path)  # what retention deleted, this handle still holds
        time.sleep(0.5)  # longer than IDLE_SECONDS, while lent
        assert not store.log.closed and len(view(store)["t"][0][3]) == 60
    # closed by the background thread: wait for what counts, the files let go (the store
    # says it is closed as its close begins)
    wait_for(lambda: not deleted_files_held(path))
    assert store.log.closed
    assert current(path) == fresh_view(path)  # opened again, as the store is now


def test_a_handle_replaced_while_lent_closes_when_given_back(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make(path)
    with shared_store(path) as old:
        append(path, "t", [b"new"])
        with shared_store(path) as new:  # the store changed: a new handle
            assert new is not old and not old.log.closed
            assert view(new) == fresh_view(path)
        assert view(old)["t"][0][2] == 20  # the task holding the old one reads on
    assert old.log.closed and not new.log.closed
