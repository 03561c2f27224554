"""The recovery-point checkpoint has several writers (topic deletions, flush(), the interval
flusher, close) and stays one whole file (issue 32): deleting many topics at once while the
flusher runs left the second of two writers without its `.tmp` to rename (FileNotFoundError),
which the flusher kept and raised from every later call until a restart (librdkafka's test
0045 deletes 100 topics in one request)."""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from crashchild import run_child

import mqcore

CHECKPOINT = "mqcore-recovery-point-checkpoint"
TOPICS = 100


def parse_checkpoint(text: str) -> dict[tuple[str, int], int]:
    """Kafka's offset checkpoint text, parsed here without mqcore: version 0, the entry count,
    then `topic partition offset` per line. Raises ValueError unless the file is whole."""
    lines = text.split("\n")
    if len(lines) < 3 or lines[0] != "0" or lines[-1] != "":
        raise ValueError(f"not a whole checkpoint: {text[:80]!r}")
    count, rows = int(lines[1]), lines[2:-1]
    if count != len(rows):
        raise ValueError(f"{count} entries announced, {len(rows)} present: {text[:80]!r}")
    points = {}
    for row in rows:
        topic, partition, offset = row.split(" ")
        points[(topic, int(partition))] = int(offset)
    return points


def read_checkpoint(path: str) -> dict[tuple[str, int], int]:
    with open(os.path.join(path, CHECKPOINT), encoding="ascii") as f:
        return parse_checkpoint(f.read())


@pytest.fixture
def watched(store_path: str) -> Iterator[list[str]]:
    """A thread that reads the checkpoint over and over while the test runs: what it saw
    that was not a whole checkpoint file (a rename of a `.tmp` another writer had just
    truncated shows one)."""
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                read_checkpoint(store_path)
            except FileNotFoundError:
                pass
            except ValueError as e:
                seen.append(str(e))
            stop.wait(0.0005)  # leave the GIL to the writers between reads

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def make_topics(store: mqcore.Store) -> None:
    store.create_topic("kept", partitions=2)
    for i in range(TOPICS):
        store.create_topic(f"gone-{i}", partitions=2)
        store.append(f"gone-{i}", b"x", partition=i % 2)


def delete_all_while_flushing(store: mqcore.Store) -> None:
    """Delete the topics from four threads at once while a fifth calls flush() in a loop (the
    interval flusher runs too): every writer of the checkpoint at the same time."""
    done = threading.Event()

    def flush_until_done() -> None:
        store.flush()
        while not done.is_set():
            store.flush()

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        flusher = pool.submit(flush_until_done)
        deletions = [pool.submit(store.delete_topic, f"gone-{i}") for i in range(TOPICS)]
        try:
            for d in deletions:
                d.result()
        finally:
            done.set()
        flusher.result()  # its error, if it met one


def test_deleting_many_topics_while_the_flusher_runs(store_path: str, watched: list[str]) -> None:
    """Every deletion succeeds, the store goes on working (no error kept by the flusher),
    the checkpoint was a whole file whenever it was read, and after a reopen it names exactly
    the partitions left, at their end offsets."""
    with mqcore.open(store_path, flush="interval", flush_interval_ms=1) as store:
        make_topics(store)
        delete_all_while_flushing(store)
        assert store.topics() == ["kept"]
        store.append("kept", b"after", partition=0)
        store.create_topic("new")
        store.append("new", b"still works")
        store.flush()
    assert watched == []
    assert read_checkpoint(store_path) == {("kept", 0): 1, ("kept", 1): 0, ("new", 0): 1}
    with mqcore.open(store_path, flush="interval", flush_interval_ms=1) as store:
        assert store.topics() == ["kept", "new"]
        assert [m.value for m in store.read("kept", 0)] == [b"after"]
        assert store.recovery[("kept", 0)].recovered_segments == []


DELETER = """
import concurrent.futures, sys, threading
import mqcore

store = mqcore.open(sys.argv[1], flush="interval", flush_interval_ms=1)
for i in range(int(sys.argv[2])):
    store.create_topic(f"gone-{i}", partitions=2)
    store.append(f"gone-{i}", b"x", partition=0)
print("made", flush=True)

def flush_forever():
    while True:
        store.flush()

threading.Thread(target=flush_forever, daemon=True).start()
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    for i in pool.map(store.delete_topic, [f"gone-{i}" for i in range(int(sys.argv[2]))]):
        print("deleted", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("after", [5, 30, 60])
def test_a_kill_among_checkpoint_writers_leaves_a_whole_checkpoint(
    tmp_path: Path, after: int
) -> None:
    """A writer killed while four deletions and flush() write the checkpoint at once leaves a
    whole checkpoint file (or none), and the store opens with the topics not yet deleted."""
    path = str(tmp_path / "s")
    run_child(DELETER, path, "80", kill_when=lambda lines: len(lines) > after)
    points = read_checkpoint(path)
    assert all(offset in (0, 1) for offset in points.values())
    with mqcore.open(path) as store:
        left = store.topics()
        assert len(left) <= 80 - after
        assert all(store.end_offset(t, 0) == 1 for t in left)
    assert set(read_checkpoint(path)) == {(t, p) for t in left for p in (0, 1)}
