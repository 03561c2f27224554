"""Reads over a store of 200k 100 B messages (appended in batches of 100, or of 1000) and over
the same rows in SQLite: random `get` by offset against a primary-key SELECT, `offset_for_time`
against an indexed timestamp column, sequential scans with `read` and `read_arrow`, and the
first `get` in a batch after opening (cold) against a fresh SQLite connection's first SELECTs.

Offsets and timestamps come from a fixed-seed generator, so every run asks the same questions.
"""

from __future__ import annotations

import random
import sqlite3

import pytest
from benchdata import (
    COLD_LOOKUPS,
    LOOKUP_MESSAGES,
    LOOKUP_TOPIC,
    SEED,
    LookupData,
    cold_open,
    cold_sqlite,
    record,
)
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore

GETS_PER_ROUND = 2000
TIME_LOOKUPS_PER_ROUND = 500
SLOW_SQL_TIME_LOOKUPS = 20  # min(id) WHERE ts >= ? scans rows: milliseconds each
BATCHES = [100, 1000]


def random_offsets(count: int) -> list[int]:
    rng = random.Random(SEED)
    return [rng.randrange(LOOKUP_MESSAGES) for _ in range(count)]


def random_timestamps(data: LookupData, count: int) -> list[int]:
    rng = random.Random(SEED + 1)
    return [rng.randint(data.first_ts, data.last_ts) for _ in range(count)]


def test_lookup_answers_agree(lookup_data: dict[int, LookupData]) -> None:
    """Both stores hold the same rows: mqcore's answers equal SQLite's for sample questions."""
    for data in lookup_data.values():
        for offset in random_offsets(200):
            row = data.sqlite.execute("SELECT value FROM t WHERE id=?", (offset,)).fetchone()
            message = data.store.get(LOOKUP_TOPIC, 0, offset)
            assert message is not None and message.value == row[0]
        for ts in random_timestamps(data, 20):
            exact = data.sqlite.execute("SELECT min(id) FROM t WHERE ts >= ?", (ts,)).fetchone()
            by_index = data.sqlite.execute(
                "SELECT id FROM t WHERE ts >= ? ORDER BY ts, id LIMIT 1", (ts,)
            ).fetchone()
            assert data.store.offset_for_time(LOOKUP_TOPIC, 0, ts) == exact[0] == by_index[0]


@pytest.mark.parametrize("batch", BATCHES)
def test_get_mqcore(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """store.get(topic, 0, offset) at GETS_PER_ROUND random offsets."""
    data, offsets = lookup_data[batch], random_offsets(GETS_PER_ROUND)
    get = data.store.get

    def lookups() -> None:
        for offset in offsets:
            get(LOOKUP_TOPIC, 0, offset)

    benchmark.group = f"get-batch{batch}"
    record(benchmark, f"get/batch{batch}/mqcore", ops=GETS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=15, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("batch", BATCHES)
def test_get_sqlite(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """SELECT value FROM t WHERE id=? (INTEGER PRIMARY KEY) at the same offsets."""
    data, offsets = lookup_data[batch], random_offsets(GETS_PER_ROUND)
    execute = data.sqlite.execute

    def lookups() -> None:
        for offset in offsets:
            execute("SELECT value FROM t WHERE id=?", (offset,)).fetchone()

    benchmark.group = f"get-batch{batch}"
    record(benchmark, f"get/batch{batch}/sqlite", ops=GETS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=15, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("batch", BATCHES)
def test_offset_for_time_mqcore(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """store.offset_for_time at random timestamps: time index floor, headers, then records."""
    data = lookup_data[batch]
    stamps = random_timestamps(data, TIME_LOOKUPS_PER_ROUND)
    find = data.store.offset_for_time

    def lookups() -> None:
        for ts in stamps:
            find(LOOKUP_TOPIC, 0, ts)

    benchmark.group = f"offset-for-time-batch{batch}"
    record(benchmark, f"time/batch{batch}/mqcore", ops=TIME_LOOKUPS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=10, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("batch", BATCHES)
def test_offset_for_time_sqlite_ts_index(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """SELECT id ... WHERE ts >= ? ORDER BY ts, id LIMIT 1: one index seek. Equals Kafka's rule
    only while timestamps rise with offsets (true here, not in general)."""
    data = lookup_data[batch]
    stamps = random_timestamps(data, TIME_LOOKUPS_PER_ROUND)
    execute = data.sqlite.execute
    sql = "SELECT id FROM t WHERE ts >= ? ORDER BY ts, id LIMIT 1"

    def lookups() -> None:
        for ts in stamps:
            execute(sql, (ts,)).fetchone()

    benchmark.group = f"offset-for-time-batch{batch}"
    record(benchmark, f"time/batch{batch}/sqlite-ts-index", ops=TIME_LOOKUPS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=10, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("batch", BATCHES)
def test_offset_for_time_sqlite_min_id(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """SELECT min(id) FROM t WHERE ts >= ?: Kafka's rule for any timestamp order; SQLite
    answers it by walking the table, so fewer lookups per round."""
    data = lookup_data[batch]
    stamps = random_timestamps(data, SLOW_SQL_TIME_LOOKUPS)
    execute = data.sqlite.execute

    def lookups() -> None:
        for ts in stamps:
            execute("SELECT min(id) FROM t WHERE ts >= ?", (ts,)).fetchone()

    benchmark.group = f"offset-for-time-batch{batch}"
    record(benchmark, f"time/batch{batch}/sqlite-min-id", ops=SLOW_SQL_TIME_LOOKUPS)
    benchmark.pedantic(lookups, rounds=3, warmup_rounds=0, iterations=1)


@pytest.mark.parametrize("batch", BATCHES)
def test_scan_read(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """store.read(max_records=500) from offset 0 to the end: every message as a Message."""
    data = lookup_data[batch]
    read = data.store.read

    def scan() -> int:
        offset, seen = 0, 0
        while True:
            messages = read(LOOKUP_TOPIC, 0, offset, 500)
            if not messages:
                return seen
            seen += len(messages)
            offset = messages[-1].offset + 1

    benchmark.group = "scan"
    record(
        benchmark,
        f"scan/batch{batch}/read",
        nbytes=data.log_bytes,
        messages=LOOKUP_MESSAGES,
        payload_bytes=data.value_bytes,
    )
    assert benchmark.pedantic(scan, rounds=5, warmup_rounds=1, iterations=1) == LOOKUP_MESSAGES


@pytest.mark.parametrize("batch", BATCHES)
def test_scan_read_arrow(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """store.read_arrow(topic, 0, 0, None): the whole partition as one pyarrow RecordBatch."""
    data = lookup_data[batch]

    def scan() -> int:
        return int(data.store.read_arrow(LOOKUP_TOPIC, 0, 0, None).num_rows)

    benchmark.group = "scan"
    record(
        benchmark,
        f"scan/batch{batch}/read_arrow",
        nbytes=data.log_bytes,
        messages=LOOKUP_MESSAGES,
        payload_bytes=data.value_bytes,
    )
    assert benchmark.pedantic(scan, rounds=5, warmup_rounds=1, iterations=1) == LOOKUP_MESSAGES


def cold_offsets(batch: int, count: int) -> list[int]:
    """One random offset in each of `count` distinct random batches of `batch` records."""
    rng = random.Random(SEED + 3)
    return [
        b * batch + rng.randrange(batch) for b in rng.sample(range(LOOKUP_MESSAGES // batch), count)
    ]


@pytest.mark.parametrize("batch", BATCHES)
def test_get_cold_mqcore(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """The first get in each of COLD_LOOKUPS batches after opening: every round opens the store
    anew (read-only, beside the fixture's writer; the open is not timed), so no batch has been
    read by this handle (no memo: CRC and record checks on each first read)."""
    data, offsets = lookup_data[batch], cold_offsets(batch, COLD_LOOKUPS)

    def lookups(store: mqcore.Store) -> None:
        get = store.get
        for offset in offsets:
            get(LOOKUP_TOPIC, 0, offset)

    benchmark.group = f"get-cold-batch{batch}"
    record(benchmark, f"get-cold/batch{batch}/mqcore", ops=COLD_LOOKUPS)
    with cold_open(data.store) as fresh:
        benchmark.pedantic(lookups, setup=fresh, rounds=15, warmup_rounds=0, iterations=1)


@pytest.mark.parametrize("batch", BATCHES)
def test_get_cold_sqlite(
    benchmark: BenchmarkFixture, lookup_data: dict[int, LookupData], batch: int
) -> None:
    """The same offsets through a SQLite connection opened for the round (not timed): its page
    cache empty, the file in the OS page cache as mqcore's is."""
    data, offsets = lookup_data[batch], cold_offsets(batch, COLD_LOOKUPS)

    def lookups(con: sqlite3.Connection) -> None:
        execute = con.execute
        for offset in offsets:
            execute("SELECT value FROM t WHERE id=?", (offset,)).fetchone()

    benchmark.group = f"get-cold-batch{batch}"
    record(benchmark, f"get-cold/batch{batch}/sqlite", ops=COLD_LOOKUPS)
    with cold_sqlite(data.sqlite) as fresh:
        benchmark.pedantic(lookups, setup=fresh, rounds=15, warmup_rounds=0, iterations=1)
