"""Generated unique IDs are indexed by one run entry per batch (docs/format.md "Key index"):
`find_by_unique_id` must still find every ID, as a brute-force read of the log does, across
batches, segments, reopen, rebuild, crash, producer-supplied IDs, a clock that goes back,
counter wrap-around and runs longer than the entry's 16-bit count.
"""

from __future__ import annotations

import itertools
import os
import random
import struct
import textwrap
from collections import defaultdict

import pytest
from crashchild import run_child

import mqcore
from mqcore._ext.keyindex import KeyTable
from mqcore.log.append import BatchMetadata


def v7(ms: int, counter: int, node: int) -> bytes:
    """A UUIDv7 with mqcore's layout (encode.pyx), written out independently here."""
    c = counter & 0xFFFFFFFF
    return (
        struct.pack(">Q", ms)[2:]
        + bytes(
            [
                0x70 | (c >> 28) & 0x0F,
                (c >> 20) & 0xFF,
                0x80 | (c >> 14) & 0x3F,
                (c >> 6) & 0xFF,
                ((c & 0x3F) << 2) | (node >> 40) & 0x03,
            ]
        )
        + struct.pack(">Q", node & ((1 << 40) - 1))[3:]
    )


def uid_at(r: BatchMetadata, i: int) -> str:
    """The i-th generated unique ID of an append (every record of these batches has one)."""
    u = r.unique_id(i)
    assert u is not None
    return u


def text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def brute_force(store: mqcore.Store) -> dict[str, list[tuple[str, int, int]]]:
    """Every unique ID in the store: where its records are, from a plain read of the log."""
    where: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for topic in store.topics():
        for p in range(store.partitions(topic)):
            offset = store.start_offset(topic, p)
            while batch := store.read(topic, p, offset, 5000):
                for m in batch:
                    uid = m.header("uid")
                    if uid is not None and len(uid) == 16:
                        where[text(uid)].append((topic, p, m.offset))
                offset = batch[-1].offset + 1
    return where


def found(store: mqcore.Store, uid: str) -> list[tuple[str, int, int]]:
    r = store.find_by_unique_id(uid, limit=100)
    return sorted((m.topic, m.partition, m.offset) for m in r.messages)


def assert_every_id_found(store: mqcore.Store, misses: list[str]) -> int:
    expected = brute_force(store)
    for uid, places in expected.items():
        assert found(store, uid) == sorted(places), uid
    for uid in misses:
        assert found(store, uid) == expected.get(uid, []), uid
    return len(expected)


def near_misses(store: mqcore.Store, rng: random.Random) -> list[str]:
    """IDs of the stored runs' ms and node but other counters (just past a run, far off),
    and IDs of other nodes: what a run entry must not answer with a wrong record."""
    out = []
    for uid in rng.sample(sorted(brute_force(store)), 20):
        raw = bytes.fromhex(uid.replace("-", ""))
        if raw[6] >> 4 != 7:
            continue
        ms = int.from_bytes(raw[:6], "big")
        node = ((raw[10] & 3) << 40) | int.from_bytes(raw[11:], "big")
        c = ((raw[6] & 15) << 28) | (raw[7] << 20) | ((raw[8] & 63) << 14)
        c |= (raw[9] << 6) | (raw[10] >> 2)
        assert v7(ms, c, node) == raw  # the layout above is mqcore's
        for other in (c + 1, c - 1, c + 5000, c + (1 << 31)):
            out.append(text(v7(ms, other, node)))
        out.append(text(v7(ms, c, node ^ 1)))
    return out


def mixed_workload(store: mqcore.Store, rng: random.Random, clock: list[int]) -> None:
    """Batches of every shape into two topics: runs (no headers), batches with headers (some
    carrying producer IDs, some copying a generated one), timestamps, compression, singles."""
    supplied = [v7(1_700_000_000_000 + i, i * 7, 12345) for i in range(200)]
    for step in range(120):
        topic = rng.choice(["a", "b"])
        n = rng.choice([1, 2, 7, 50, 300])
        values = [b"v%d-%d" % (step, i) for i in range(n)]
        shape = rng.randrange(6)
        clock[0] += rng.choice([0, 0, 1, 3, -50])  # the wall clock also goes back
        if shape == 0:
            store.append_batch(topic, values, partition=rng.randrange(2))
        elif shape == 1:
            headers = [
                {"uid": rng.choice(supplied)} if rng.random() < 0.3 else {"x": b"y"}
                for _ in range(n)
            ]
            store.append_batch(topic, values, headers=headers, partition=0)
        elif shape == 2:
            ts = [clock[0] - rng.randrange(1000) for _ in range(n)]
            store.append_batch(topic, values, timestamps=ts, partition=1)
        elif shape == 3:
            store.append_batch(topic, values, compression="gzip", partition=0)
        elif shape == 4:
            store.append_batch(topic, values, keys=[b"k%d" % (i % 5) for i in range(n)])
        else:
            store.append(topic, values[0], partition=0)


def test_a_batch_of_generated_ids_takes_one_key_index_entry(tmp_path: object) -> None:
    """The point of run entries: 1000 generated IDs make one entry, not 1000."""
    with mqcore.open(str(tmp_path)) as store:
        store.create_topic("t")
        r = store.append_batch("t", [b"x"] * 1000, partition=0)
        table = store.log.partition("t", 0).segments[0].key_table()
        assert table is not None and table.key_count == 1
        assert [m.offset for m in store.find_by_unique_id(uid_at(r, 999))] == [999]


def test_find_by_unique_id_equals_the_log_across_segments_reopen_and_rebuild(
    tmp_path: object,
) -> None:
    path = str(tmp_path)
    clock = [1_700_000_000_000]
    rng = random.Random(20)
    with mqcore.open(path, clock=lambda: clock[0]) as store:
        for topic in ("a", "b"):
            store.create_topic(topic, partitions=2, segment_bytes=16 << 10)
        mixed_workload(store, rng, clock)
        assert len(store.log.partition("a", 0).segments) > 3
        misses = near_misses(store, rng)
        live = assert_every_id_found(store, misses)
    with mqcore.open(path) as store:  # sealed and closed tables, trusted as written
        assert assert_every_id_found(store, misses) == live
    with mqcore.open(path, read_only=True) as store:
        assert assert_every_id_found(store, misses) == live
    for d in os.listdir(path):
        if os.path.isdir(os.path.join(path, d)):
            for f in os.listdir(os.path.join(path, d)):
                if f.endswith(".keyindex"):
                    os.unlink(os.path.join(path, d, f))
    with mqcore.open(path) as store:  # every table rebuilt from the log
        assert assert_every_id_found(store, misses) == live


def test_a_rebuild_finds_runs_across_counter_wraparound(tmp_path: object) -> None:
    """IDs whose counter wraps from 2**32 - 1 to 0 inside one batch (stored as producer IDs:
    the encoder makes an entry each, the rebuild sees a run and makes one entry)."""
    path = str(tmp_path)
    uids = [v7(1_700_000_000_123, (1 << 32) - 3 + i, 0x2AB_CDEF_0123) for i in range(6)]
    with mqcore.open(path) as store:
        store.create_topic("t")
        store.append_batch("t", [b"v"] * 6, headers=[{"uid": u} for u in uids], partition=0)
        table = store.log.partition("t", 0).segments[0].key_table()
        assert table is not None and table.key_count == 6
    os.unlink(os.path.join(path, "t-0", "00000000000000000000.keyindex"))
    with mqcore.open(path) as store:
        table = store.log.partition("t", 0).segments[0].key_table()
        assert table is not None and table.key_count == 1  # one run entry
        for i, u in enumerate(uids):
            assert found(store, text(u)) == [("t", 0, i)]
        assert found(store, text(v7(1_700_000_000_123, 3, 0x2AB_CDEF_0123))) == []
        assert found(store, text(v7(1_700_000_000_123, (1 << 32) - 4, 0x2AB_CDEF_0123))) == []


def test_a_run_longer_than_the_entry_count_field(tmp_path: object) -> None:
    """70,000 IDs in one batch: the entry's count saturates at 65,535 ("at least")."""
    with mqcore.open(str(tmp_path)) as store:
        store.create_topic("t", max_message_bytes=8 << 20)
        r = store.append_batch("t", [b""] * 70_000, partition=0)
        assert r.count == 70_000 and store.end_offset("t", 0) == 70_000
        for i in (0, 65_534, 65_535, 69_999):
            assert found(store, uid_at(r, i)) == [("t", 0, i)]
        raw = bytes.fromhex(uid_at(r, 69_999).replace("-", ""))
        ms = int.from_bytes(raw[:6], "big")
        node = ((raw[10] & 3) << 40) | int.from_bytes(raw[11:], "big")
        first = bytes.fromhex(uid_at(r, 0).replace("-", ""))
        c0 = ((first[6] & 15) << 28) | (first[7] << 20) | ((first[8] & 63) << 14)
        c0 |= (first[9] << 6) | (first[10] >> 2)
        assert found(store, text(v7(ms, c0 + 70_000, node))) == []  # past the run


def test_a_version_2_key_index_still_opens_and_answers(tmp_path: object) -> None:
    """A table written before run entries (an entry per ID, version 2) is trusted as it is;
    the first insert makes it version 3, which older readers rebuild instead of trusting."""
    path = str(tmp_path)
    with mqcore.open(path) as store:
        store.create_topic("t")
        # headers: the encoder gives every generated ID its own entry, as version 2 did
        r = store.append_batch("t", [b"v"] * 40, headers=[{"x": b"1"}] * 40, partition=0)
        ids = [uid_at(r, i) for i in range(40)]
    ki = os.path.join(path, "t-0", "00000000000000000000.keyindex")
    with open(ki, "r+b") as f:
        assert f.read(6)[4:] == b"\x00\x03"
        f.seek(4)
        f.write(b"\x00\x02")  # the version is outside the content CRC
    before = os.stat(ki)
    with mqcore.open(path, read_only=True) as store:
        for i, uid in enumerate(ids):
            assert found(store, uid) == [("t", 0, i)]
    with mqcore.open(path) as store:
        table = store.log.partition("t", 0).segments[0].key_table()
        assert table is not None and table.key_count == 40  # opened, not rebuilt
        assert os.stat(ki).st_ino == before.st_ino
        with open(ki, "rb") as f:
            assert f.read(6)[4:] == b"\x00\x02"
        r2 = store.append_batch("t", [b"w"] * 5, partition=0)
        with open(ki, "rb") as f:
            assert f.read(6)[4:] == b"\x00\x03"
        assert found(store, uid_at(r2, 4)) == [("t", 0, 44)]
        for i, uid in enumerate(ids):
            assert found(store, uid) == [("t", 0, i)]


def test_key_table_probe_uid_against_brute_force_on_random_runs() -> None:
    """KeyTable.probe_uid alone: random runs (wrapping, overlapping ms and nodes) inserted the
    way a rebuild lists them; each probe's candidates must contain every record that carries
    the ID and name no record outside a run that could carry it."""
    from mqcore._ext.batch import encode_batch
    from mqcore._ext.keyindex import batch_hits, file_size, init_header

    rng = random.Random(7)
    slots, cap = 64, 512
    buf = bytearray(file_size(slots, cap, 16))
    init_header(buf, slots, cap, 16)
    table = KeyTable(buf, True)
    owner: dict[bytes, list[int]] = defaultdict(list)
    rel = 0
    for _ in range(60):
        ms, node = 1_000 + rng.randrange(3), rng.choice([5, 6, 1 << 41])
        c = rng.choice([rng.randrange(1 << 32), (1 << 32) - rng.randrange(1, 5)])
        n = rng.randrange(1, 9)
        uids = [v7(ms, c + i, node) for i in range(n)]
        raw = encode_batch([b"v"] * n, headers=[{"uid": u} for u in uids], now_ms=5).tobytes()
        hits, _base, _size = batch_hits(raw, 0, 1 << 20)
        assert KeyTable.count_hits(hits) == (1, 0)  # one run entry for the batch
        table.insert(hits, rel, rel)
        for i, u in enumerate(uids):
            owner[u].append(rel + i)
        rel += n
    for u, offsets in owner.items():
        got = {r for r, _p, _lo, _hi in table.probe_uid(u, 1000)}
        assert set(offsets) <= got
        assert all(rel_at in itertools.chain(*owner.values()) for rel_at in got)
    assert table.probe_uid(v7(999, 1, 5), 1000) == []


WRITER = textwrap.dedent(
    """
    import sys, mqcore
    path, flush = sys.argv[1], sys.argv[2]
    with mqcore.open(path, flush=flush) as s:
        s.create_topic("t", segment_bytes=64 << 10)
        i = 0
        while True:
            r = s.append_batch("t", [b"x%d" % i] * (1 + i % 40), partition=0)
            for j in range(r.count):
                print(r.base_offset + j, r.unique_id(j), flush=False)
            sys.stdout.flush()
            i += 1
    """
)


@pytest.mark.parametrize("flush", ["always", "os"])
def test_every_acknowledged_id_is_found_after_kill_9(tmp_path: object, flush: str) -> None:
    """SIGKILL a writer of default-topic batches: the reopened store finds every ID it
    acknowledged (the active segment's table is rebuilt from the log) and nothing else."""
    path = os.path.join(str(tmp_path), "s")
    child = run_child(WRITER, path, flush, kill_when=lambda lines: len(lines) > 3000)
    acked = [ln.split() for ln in child.lines]
    assert len(acked) > 3000
    with mqcore.open(path) as store:
        assert len(store.log.partition("t", 0).segments) > 1
        for offset, uid in acked:
            assert found(store, uid) == [("t", 0, int(offset))]
        assert_every_id_found(store, [])
