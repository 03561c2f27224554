"""Every read path honours the log start (issue 20's review): after DeleteRecords
(ReplicaLog.delete_records_before) moves it, inside a segment and inside a batch, the records
below it are still in the `.log` until retention removes their segment, but no lookup, query or
read answers with them, in the writing store and after a reopen. Each answer is compared with a
brute-force answer over the records from the log start on."""

from __future__ import annotations

import random

import pytest

import mqcore
from mqcore.errors import OffsetOutOfRangeError

T0 = 1_700_000_000_000
N = 120


Record = tuple[int, int, bytes, str, str]


def fill(store: mqcore.Store) -> list[Record]:
    """Batches of 1-7 records, keys repeating, timestamps going back and forth: (offset,
    timestamp, key, unique id, store id) of each."""
    rng = random.Random(5)
    store.create_topic("t", segment_bytes=1500, index_interval_bytes=64)
    out: list[Record] = []
    while len(out) < N:
        n = rng.randint(1, 7)
        keys = [b"k%d" % rng.randrange(12) for _ in range(n)]
        stamps = [T0 + rng.randrange(-30, 300) for _ in range(n)]
        values = [b"value %d" % (len(out) + i) for i in range(n)]
        md = store.append_batch("t", values, keys=keys, timestamps=stamps, partition=0)
        for i in range(n):
            m = store.get("t", 0, md.base_offset + i)
            assert m is not None and m.unique_id is not None
            out.append((m.offset, stamps[i], keys[i], m.unique_id, m.msg_id))
    return out


def check(store: mqcore.Store, records: list[Record], start: int) -> None:
    kept = [r for r in records if r[0] >= start]
    assert store.start_offset("t", 0) == start
    for off, _ts, _key, uid, msg_id in records:
        below = off < start
        got = store.get("t", 0, off)
        assert (got is None) == below, off
        by_id = store.get_by_id(msg_id)
        assert (by_id is None) == below, off
        assert [m.offset for m in store.find_by_unique_id(uid).messages] == (
            [] if below else [off]
        ), off
    for key in sorted({r[2] for r in records}):
        want = [r[0] for r in kept if r[2] == key]
        assert [m.offset for m in store.find_by_key("t", key, limit=2 * N).messages] == want, key
    for ts in sorted({r[1] for r in records} | {T0 - 100, T0 + 1000}):
        want = min((r[0] for r in kept if r[1] >= ts), default=None)
        assert store.offset_for_time("t", 0, ts) == want, ts
    got = [m.offset for m in store.search("t", contains=b"value", limit=2 * N).messages]
    assert got == [r[0] for r in kept]
    assert [m.offset for m in store.read("t", 0, start, 2 * N)] == [r[0] for r in kept]
    if start:
        with pytest.raises(OffsetOutOfRangeError):
            store.read("t", 0, start - 1, 1)


@pytest.mark.parametrize("where", [0.0, 0.31, 0.5, 0.77, 1.0])
def test_no_read_path_answers_below_the_log_start(tmp_path: object, where: float) -> None:
    path = str(tmp_path)
    with mqcore.open(path) as store:
        records = fill(store)
        start = int(where * N)
        log = store.log.replica("t", 0)
        log.update_high_watermark(store.end_offset("t", 0))
        assert log.delete_records_before(start) == start
        check(store, records, start)
    with mqcore.open(path, read_only=True) as store:
        check(store, records, start)
