"""The active segment's key index grows with its data (issue 17: every partition reserved a
42-44 MiB sparse .keyindex, so a 21 MiB store tarred to 904 MiB).

Lookups after each growth are compared with a brute-force read of the log.
"""

from __future__ import annotations

import os
import random
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import run_cli
from crashchild import run_child

import mqcore
from mqcore._ext.keyindex import KeyTable, file_size
from mqcore.storage.keyindex import GROWTH, INITIAL_ENTRIES, slots_for


def keyindex_files(path: str, topic: str, partition: int = 0) -> list[str]:
    d = os.path.join(path, f"{topic}-{partition}")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".keyindex"))


def header(path: str) -> KeyTable:
    with open(path, "rb") as f:
        return KeyTable(f.read(), False)


def brute_force(store: mqcore.Store, topic: str) -> dict[bytes, list[tuple[int, int]]]:
    """(partition, offset) of every record by key, from a plain read of the log."""
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for p in range(store.partitions(topic)):
        offset = store.start_offset(topic, p)
        while True:
            batch = store.read(topic, p, offset, 5000)
            if not batch:
                break
            for m in batch:
                words = {w for k, v in m.headers if k == "keys" for w in (v or b"").split()}
                for w in words | ({m.key} if m.key is not None else set()):
                    where[w].append((p, m.offset))
            offset = batch[-1].offset + 1
    return where


def lookups(
    store: mqcore.Store, topic: str, keys: list[bytes]
) -> dict[bytes, list[tuple[int, int]]]:
    return {
        k: sorted((m.partition, m.offset) for m in store.find_by_key(topic, k, limit=100_000))
        for k in keys
    }


def test_a_new_partition_costs_kilobytes_not_megabytes(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s")
    with mqcore.open(path) as s:
        s.create_topic("t", partitions=4)
        s.append("t", b"v", key=b"k", partition=0)
    for p in range(1, 4):  # never written: no key index file at all (made at the first entry)
        assert keyindex_files(path, "t", p) == []
    (ki,) = keyindex_files(path, "t", 0)
    st = os.stat(ki)
    assert st.st_size <= 64 << 10, st.st_size  # was 44,040,256 bytes
    assert st.st_blocks * 512 <= 64 << 10
    table = header(ki)
    assert table.key_capacity == INITIAL_ENTRIES
    assert st.st_size == file_size(slots_for(INITIAL_ENTRIES), INITIAL_ENTRIES, INITIAL_ENTRIES)
    total = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(path) for n in ns)
    assert total < 512 << 10


def test_the_key_index_grows_as_it_fills_and_answers_like_the_log(tmp_path: object) -> None:
    """Keys, `keys` header words and tags across several growths in one segment:
    every lookup equals the brute-force answer after each step, after a clean reopen and in a
    read-only open."""
    path = os.path.join(str(tmp_path), "s")
    rng = random.Random(17)
    keys = [b"key-%d" % i for i in range(3000)]
    with mqcore.open(path) as s:
        s.create_topic("t", partitions=1, segment_bytes=1 << 30)
        capacities = []
        for step in range(5):
            for _ in range(3 * (step + 1)):
                n = 300
                s.append_batch(
                    "t",
                    [b"v%d" % rng.getrandbits(32) for _ in range(n)],
                    keys=[rng.choice(keys) for _ in range(n)],
                    headers=[
                        [("keys", rng.choice(keys))] if rng.random() < 0.3 else [] for _ in range(n)
                    ],
                    tags=[rng.choice(["a", "b", None]) for _ in range(n)],
                    partition=0,
                )
            sample = rng.sample(keys, 60)
            truth = brute_force(s, "t")  # one read of the log per step, not one per key
            assert lookups(s, "t", sample) == {k: truth.get(k, []) for k in sample}
            s.flush()
            capacities.append(header(keyindex_files(path, "t")[-1]).key_capacity)
        assert len(keyindex_files(path, "t")) == 1  # grew in place of rolling
        assert capacities == sorted(capacities) and capacities[-1] > 8 * INITIAL_ENTRIES
        expected = brute_force(s, "t")
        tag_a = sorted(m.offset for m in s.search("t", tag="a", limit=1_000_000))
    table = header(keyindex_files(path, "t")[-1])
    assert table.content_valid() and table.chain_problem() is None
    assert table.key_count <= table.key_capacity < GROWTH * table.key_count + INITIAL_ENTRIES
    for read_only in (False, True):
        with mqcore.open(path, read_only=read_only) as s:
            assert lookups(s, "t", keys) == {k: expected.get(k, []) for k in keys}
            assert sorted(m.offset for m in s.search("t", tag="a", limit=1_000_000)) == tag_a
    status, out, err = run_cli("verify", path, "--deep")
    assert status == 0, out + err


def test_growth_stops_at_the_capacity_and_the_segment_rolls(tmp_path: object) -> None:
    """key_index_entries bounds the table: it grows 1024 -> 3000, then the segment
    rolls as before (each record takes two entries: its key and its unique ID)."""
    path = os.path.join(str(tmp_path), "s")
    with mqcore.open(path) as s:
        s.create_topic("t", partitions=1, key_index_entries=3000)
        for i in range(3500):
            s.append("t", b"v", key=b"k%d" % i)
        probe = [b"k0", b"k1499", b"k1500", b"k3499"]
        assert lookups(s, "t", probe) == {k: [(0, int(k[1:]))] for k in probe}
    files = keyindex_files(path, "t")
    assert len(files) == 3
    assert [header(f).key_capacity for f in files] == [3000, 3000, 1024]
    assert [header(f).key_count for f in files] == [3000, 3000, 1000]


def test_one_batch_larger_than_the_capacity_still_fits(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s")
    with mqcore.open(path) as s:
        s.create_topic("t", partitions=1, key_index_entries=100)
        s.append_batch("t", [b"x"] * 250, keys=[b"k%d" % i for i in range(250)])
        s.append("t", b"y", key=b"after")
        assert [m.offset for m in s.find_by_key("t", b"k249")] == [249]
        assert [m.offset for m in s.find_by_key("t", b"after")] == [250]


WRITER = textwrap.dedent(
    """
    import sys, mqcore
    s = mqcore.open(sys.argv[1], flush=sys.argv[2])
    s.create_topic("t", partitions=1)
    i = 0
    while True:
        s.append_batch("t", [b"v"] * 50, keys=[b"k%d" % (i + j) for j in range(50)])
        i += 50
        print(i, flush=True)
    """
)


@pytest.mark.parametrize("flush", ["always", "os"])
@pytest.mark.parametrize("point", ["keyindex.after_grow_file", "keyindex.after_grow_copy"])
def test_a_writer_killed_while_the_table_grows_leaves_a_store_that_answers(
    tmp_path: object, point: str, flush: str
) -> None:
    """SIGKILL inside the third growth (the new file in place, empty or filled): the reopened
    store's lookups equal the log's, and every acknowledged append is there."""
    path = os.path.join(str(tmp_path), "s")
    child = run_child(WRITER, path, flush, crash_at=f"{point}:3")
    acknowledged = int(child.lines[-1])
    with mqcore.open(path) as s:
        expected = brute_force(s, "t")
        assert s.end_offset("t", 0) >= acknowledged >= 4 * INITIAL_ENTRIES // 2 - 50
        assert all(b"k%d" % i in expected for i in range(acknowledged))
        assert lookups(s, "t", sorted(expected)) == dict(expected)
        s.append("t", b"v", key=b"after")
        assert len(s.find_by_key("t", b"after")) == 1


@pytest.mark.parametrize("flush", ["os", "interval"])
def test_close_msyncs_the_key_index_a_seal_left_unsynced(tmp_path: Path, flush: str) -> None:
    """docs/operations.md: `.keyindex` files are msync'd when a segment is sealed and at close.
    Under flush="os" a seal (close seals the active segment) stores the header without a sync,
    and close then found the table unchanged and skipped its msync: the sealed table reached
    the disk only by writeback, so a power loss made the next open rebuild it."""
    from mqcore.storage import durable

    synced: list[str] = []
    durable.observer = synced.append
    try:
        with mqcore.open(str(tmp_path / "s"), flush=flush) as store:
            store.create_topic("t")
            store.append_batch(
                "t", [b"v%d" % i for i in range(50)], keys=[b"k%d" % i for i in range(50)]
            )
    finally:
        durable.observer = None
    assert any(p.endswith(".keyindex") for p in synced), synced
