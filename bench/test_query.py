"""Queries (issue 3) against SQLite holding the same messages: `find_by_key` against a SELECT
on an indexed key column, `get_by_id` (decode the store ID, then fetch) against a primary-key
SELECT (each also cold: the first lookups after opening, against a fresh connection's), and a
full-scan `search(contains=...)` against a Python loop over `Store.read()` and
against SQLite's `instr()` over the value column.

Keys, IDs and rows come from fixed-seed generators, so every run asks the same questions. The
stores are written just before they are read, so every side reads from the page cache.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator

import pytest
from benchdata import (
    ABSENT_NEEDLE,
    COLD_LOOKUPS,
    KEY_MESSAGES,
    KEY_TOPIC,
    SCAN_TOPIC,
    SEED,
    KeyData,
    ScanData,
    build_key_data,
    build_scan_data,
    cold_open,
    cold_sqlite,
    record,
)
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore
from mqcore.query.ids import encode_msg_id

LOOKUPS_PER_ROUND = 2000
SCAN_CASES = ["200B", "1KiB"]
READ_CHUNK = 1000  # records per Store.read() call in the Python loop


@pytest.fixture(scope="module")
def key_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyData]:
    data = build_key_data(str(tmp_path_factory.mktemp("query-keys")))
    try:
        yield data
    finally:
        data.store.close()
        data.sqlite.close()


@pytest.fixture(scope="module")
def scan_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ScanData]]:
    built: dict[str, ScanData] = {}
    try:
        for case in SCAN_CASES:
            built[case] = build_scan_data(str(tmp_path_factory.mktemp(f"query-{case}")), case)
        yield built
    finally:
        for data in built.values():
            data.store.close()
            data.sqlite.close()


def random_offsets(count: int) -> list[int]:
    rng = random.Random(SEED + 17)
    return [rng.randrange(KEY_MESSAGES) for _ in range(count)]


def lookup_keys(data: KeyData, count: int) -> list[bytes]:
    """Keys of random messages: each has one to a few messages (about two on average)."""
    return [data.keys[o] for o in random_offsets(count)]


FIND_SQL = "SELECT id, ts, key, value FROM m WHERE key = ?"
GET_SQL = "SELECT ts, key, value FROM m WHERE id = ?"
INSTR_SQL = "SELECT id FROM s WHERE instr(value, ?) > 0"


def python_scan(data: ScanData, needle: bytes) -> int:
    """Messages whose value holds `needle`, by reading every message with Store.read()."""
    read = data.store.read
    offset = found = 0
    while True:
        messages = read(SCAN_TOPIC, 0, offset, READ_CHUNK)
        if not messages:
            return found
        for m in messages:
            value = m.value
            if value is not None and needle in value:
                found += 1
        offset = messages[-1].offset + 1


def test_query_answers_agree(key_data: KeyData, scan_data: dict[str, ScanData]) -> None:
    """Each pair of sides gives the same answers to sample questions."""
    store, con = key_data.store, key_data.sqlite
    for key in lookup_keys(key_data, 300):
        rows = con.execute(FIND_SQL, (key,)).fetchall()
        r = store.find_by_key(KEY_TOPIC, key)
        assert r.complete and len(rows) >= 1
        assert [(m.offset, m.timestamp, m.key, m.value) for m in r] == rows
    for offset in random_offsets(300):
        m = store.get_by_id(encode_msg_id(KEY_TOPIC, 0, offset))
        assert (
            m is not None
            and (m.timestamp, m.key, m.value) == con.execute(GET_SQL, (offset,)).fetchone()
        )
    for data in scan_data.values():
        r = data.store.search(SCAN_TOPIC, contains=ABSENT_NEEDLE)
        assert r.complete and len(r) == 0 and r.scanned_records == data.messages
        assert data.sqlite.execute(INSTR_SQL, (ABSENT_NEEDLE,)).fetchall() == []
        present = b'"cust-0012' if data.case == "1KiB" else b"payments-11.internal"
        r = data.store.search(SCAN_TOPIC, contains=present, limit=100_000)
        assert r.complete and len(r) > 100
        assert python_scan(data, present) == len(r)
        ids = [row[0] for row in data.sqlite.execute(INSTR_SQL, (present,))]
        assert ids == [m.offset for m in r]
    assert python_scan(scan_data["200B"], ABSENT_NEEDLE) == 0


def test_find_by_key_mqcore(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """store.find_by_key(topic, key): key index probe, then each hit read and checked."""
    keys, find = lookup_keys(key_data, LOOKUPS_PER_ROUND), key_data.store.find_by_key

    def lookups() -> None:
        for key in keys:
            find(KEY_TOPIC, key)

    benchmark.group = "find-by-key"
    record(benchmark, "find-by-key/mqcore", ops=LOOKUPS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=10, warmup_rounds=1, iterations=1)


def test_find_by_key_sqlite(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """SELECT id, ts, key, value FROM m WHERE key = ? (an index on key) for the same keys."""
    keys, execute = lookup_keys(key_data, LOOKUPS_PER_ROUND), key_data.sqlite.execute

    def lookups() -> None:
        for key in keys:
            execute(FIND_SQL, (key,)).fetchall()

    benchmark.group = "find-by-key"
    record(benchmark, "find-by-key/sqlite", ops=LOOKUPS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=10, warmup_rounds=1, iterations=1)


def test_get_by_id_mqcore(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """store.get_by_id(msg_id) for random messages: decode the ID, then fetch the record."""
    ids = [encode_msg_id(KEY_TOPIC, 0, o) for o in random_offsets(LOOKUPS_PER_ROUND)]
    get = key_data.store.get_by_id

    def lookups() -> None:
        for msg_id in ids:
            get(msg_id)

    benchmark.group = "get-by-id"
    record(benchmark, "get-by-id/mqcore", ops=LOOKUPS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=15, warmup_rounds=1, iterations=1)


def test_get_by_id_sqlite(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """SELECT ts, key, value FROM m WHERE id = ? (INTEGER PRIMARY KEY) for the same messages."""
    offsets, execute = random_offsets(LOOKUPS_PER_ROUND), key_data.sqlite.execute

    def lookups() -> None:
        for offset in offsets:
            execute(GET_SQL, (offset,)).fetchone()

    benchmark.group = "get-by-id"
    record(benchmark, "get-by-id/sqlite", ops=LOOKUPS_PER_ROUND)
    benchmark.pedantic(lookups, rounds=15, warmup_rounds=1, iterations=1)


def cold_message_offsets(count: int) -> list[int]:
    """A random message in each of `count` distinct random batches (of 1000) of the key store."""
    rng = random.Random(SEED + 19)
    return [b * 1000 + rng.randrange(1000) for b in rng.sample(range(KEY_MESSAGES // 1000), count)]


def test_find_by_key_cold_mqcore(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """find_by_key for the keys of messages in COLD_LOOKUPS distinct batches, each round on a
    store opened anew (read-only; the open not timed): first reads of their batches."""
    keys = [key_data.keys[o] for o in cold_message_offsets(COLD_LOOKUPS)]

    def lookups(store: mqcore.Store) -> None:
        for key in keys:
            store.find_by_key(KEY_TOPIC, key)

    benchmark.group = "find-by-key-cold"
    record(benchmark, "find-by-key-cold/mqcore", ops=COLD_LOOKUPS)
    with cold_open(key_data.store) as fresh:
        benchmark.pedantic(lookups, setup=fresh, rounds=10, warmup_rounds=0, iterations=1)


def test_find_by_key_cold_sqlite(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """The same keys through a connection opened for the round (not timed)."""
    keys = [key_data.keys[o] for o in cold_message_offsets(COLD_LOOKUPS)]

    def lookups(con: sqlite3.Connection) -> None:
        for key in keys:
            con.execute(FIND_SQL, (key,)).fetchall()

    benchmark.group = "find-by-key-cold"
    record(benchmark, "find-by-key-cold/sqlite", ops=COLD_LOOKUPS)
    with cold_sqlite(key_data.sqlite) as fresh:
        benchmark.pedantic(lookups, setup=fresh, rounds=10, warmup_rounds=0, iterations=1)


def test_get_by_id_cold_mqcore(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """get_by_id for messages in COLD_LOOKUPS distinct batches, on a store opened anew."""
    ids = [encode_msg_id(KEY_TOPIC, 0, o) for o in cold_message_offsets(COLD_LOOKUPS)]

    def lookups(store: mqcore.Store) -> None:
        for msg_id in ids:
            store.get_by_id(msg_id)

    benchmark.group = "get-by-id-cold"
    record(benchmark, "get-by-id-cold/mqcore", ops=COLD_LOOKUPS)
    with cold_open(key_data.store) as fresh:
        benchmark.pedantic(lookups, setup=fresh, rounds=10, warmup_rounds=0, iterations=1)


def test_get_by_id_cold_sqlite(benchmark: BenchmarkFixture, key_data: KeyData) -> None:
    """The same messages by primary key through a connection opened for the round."""
    offsets = cold_message_offsets(COLD_LOOKUPS)

    def lookups(con: sqlite3.Connection) -> None:
        for offset in offsets:
            con.execute(GET_SQL, (offset,)).fetchone()

    benchmark.group = "get-by-id-cold"
    record(benchmark, "get-by-id-cold/sqlite", ops=COLD_LOOKUPS)
    with cold_sqlite(key_data.sqlite) as fresh:
        benchmark.pedantic(lookups, setup=fresh, rounds=10, warmup_rounds=0, iterations=1)


def record_scan(benchmark: BenchmarkFixture, data: ScanData, side: str) -> None:
    benchmark.group = f"search-{data.case}"
    record(
        benchmark,
        f"search/{data.case}/{side}",
        nbytes=data.log_bytes,
        messages=data.messages,
        payload_bytes=data.value_bytes,
    )


@pytest.mark.parametrize("case", SCAN_CASES)
def test_search_contains_mqcore(
    benchmark: BenchmarkFixture, scan_data: dict[str, ScanData], case: str
) -> None:
    """store.search(topic, contains=needle) for a needle in no value: a full scan."""
    data = scan_data[case]

    def scan() -> int:
        r = data.store.search(SCAN_TOPIC, contains=ABSENT_NEEDLE)
        assert r.complete
        return len(r)

    record_scan(benchmark, data, "mqcore")
    assert benchmark.pedantic(scan, rounds=5, warmup_rounds=1, iterations=1) == 0


@pytest.mark.parametrize("case", SCAN_CASES)
def test_search_contains_python_read(
    benchmark: BenchmarkFixture, scan_data: dict[str, ScanData], case: str
) -> None:
    """`needle in m.value` for every message of Store.read(), READ_CHUNK at a time."""
    data = scan_data[case]
    record_scan(benchmark, data, "python-read")
    found = benchmark.pedantic(
        python_scan, args=(data, ABSENT_NEEDLE), rounds=3, warmup_rounds=1, iterations=1
    )
    assert found == 0


@pytest.mark.parametrize("case", SCAN_CASES)
def test_search_contains_sqlite(
    benchmark: BenchmarkFixture, scan_data: dict[str, ScanData], case: str
) -> None:
    """SELECT id FROM s WHERE instr(value, ?) > 0: SQLite reads every row's BLOB."""
    data = scan_data[case]

    def scan() -> int:
        return len(data.sqlite.execute(INSTR_SQL, (ABSENT_NEEDLE,)).fetchall())

    record_scan(benchmark, data, "sqlite-instr")
    assert benchmark.pedantic(scan, rounds=3, warmup_rounds=1, iterations=1) == 0


# a pattern no value matches: every value goes through the regex engine (the kernel cannot skip
# a batch for a regex), so the round measures decoding plus one regex search per message
REGEX = rb"timeout after \d{5,}ms|status=9\d\d"


def regex_scan(data: ScanData) -> int:
    r = data.store.search(SCAN_TOPIC, regex=REGEX)
    assert r.complete
    return len(r)


@pytest.mark.parametrize("case", SCAN_CASES)
def test_search_regex_mqcore(
    benchmark: BenchmarkFixture, scan_data: dict[str, ScanData], case: str
) -> None:
    """store.search(topic, regex=REGEX), a full scan: every value is matched."""
    data = scan_data[case]
    benchmark.group = f"search-regex-{data.case}"
    record(
        benchmark,
        f"search-regex/{data.case}/mqcore",
        nbytes=data.log_bytes,
        messages=data.messages,
        payload_bytes=data.value_bytes,
    )
    found = benchmark.pedantic(regex_scan, args=(data,), rounds=3, warmup_rounds=1, iterations=1)
    assert found == 0
