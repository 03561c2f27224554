"""The read-only store handle a Spark worker process keeps (mqcore.spark.handles): reused while
the store is unchanged on disk, and never answering from a stale view after an append, a roll,
retention, a topic deleted and created again, a live writer's appends, or the store's removal.
Every answer is compared with a fresh read-only open of the same directory. No Spark needed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import mqcore
from mqcore.errors import NotAStoreError
from mqcore.spark.handles import close_shared_stores, shared_store
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
    first = shared_store(path)
    assert shared_store(path) is first
    assert view(first) == fresh_view(path)


def test_appends_rolls_and_new_partitions_are_seen(tmp_path: Path) -> None:
    """The same handle call after appends (the active segment grows, then rolls: segment_bytes
    is 1000) and after the first records of the other partition answers what a fresh open does."""
    path = str(tmp_path / "s")
    make(path)
    before = view(shared_store(path))
    append(path, "t", [b"b"])
    assert view(shared_store(path)) == fresh_view(path) != before
    append(path, "t", [b"c%d" % i for i in range(100)])
    append(path, "t", [b"d%d" % i for i in range(7)], partition=1)
    got = view(shared_store(path))
    assert got == fresh_view(path)
    assert got["t"][1][2] == 7 and got["t"][0][2] == 121


def test_retention_is_seen(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make(path, retention_bytes=1, retention_ms=-1)
    append(path, "t", [b"x" * 100 for _ in range(40)])
    assert view(shared_store(path))["t"][0][1] == 0
    with mqcore.open(path) as store:
        store.apply_retention("t")
        moved = store.start_offset("t", 0)
    assert moved > 0
    got = view(shared_store(path))
    assert got == fresh_view(path) and got["t"][0][1] == moved


def test_a_topic_deleted_and_created_again_is_read_anew(tmp_path: Path) -> None:
    """Same name, same partition count, fewer records and other values: no record of the old
    topic comes back."""
    path = str(tmp_path / "s")
    make(path)
    old = view(shared_store(path))
    with mqcore.open(path) as store:
        store.delete_topic("t")
        store.create_topic("t", partitions=2, segment_bytes=1000)
    append(path, "t", [b"new%d" % i for i in range(3)])
    got = view(shared_store(path))
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
            got = view(shared_store(path))
            assert got["t"][1][2] == i + 1
            assert got["t"][1][3][-1] == b"live%d" % i
    assert view(shared_store(path)) == fresh_view(path)


def test_a_removed_store_is_not_served(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    make(path)
    shared_store(path)
    shutil.rmtree(path)
    with pytest.raises(NotAStoreError):
        shared_store(path)
    make(path)  # a new store at the same path: its records, not the kept ones
    append(path, "t", [b"z"])
    assert view(shared_store(path)) == fresh_view(path)


def test_handles_of_many_stores_are_bounded(tmp_path: Path) -> None:
    """Beyond MAX_STORES paths the least recently used handle is closed, not leaked."""
    from mqcore.spark.handles import MAX_STORES

    paths = [str(tmp_path / f"s{i}") for i in range(MAX_STORES + 2)]
    for p in paths:
        make(p)
    handles = [shared_store(p) for p in paths]
    assert [h.log.closed for h in handles] == [True, True] + [False] * MAX_STORES
    assert view(shared_store(paths[0])) == fresh_view(paths[0])
