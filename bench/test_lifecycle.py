"""Store lifecycle: open a new store, create a topic, (append one message,) close, against
SQLite creating a database, a table, (inserting one row,) and closing it.

Each round works on a directory of its own that did not exist before, as a fresh store does.
Both sides make what they created durable before the round ends: mqcore's `create_topic` and
`close` always sync (docs/operations.md "Store lifecycle"), SQLite runs in WAL mode with
synchronous=FULL, the mode whose commits survive a power loss. mqcore keeps its default flush
policy (interval). The time is mostly fsyncs: `strace -f -e trace=fsync,fdatasync` counts
them (bench/README.md lists them per side).
"""

from __future__ import annotations

import itertools
import os

import pytest
from benchdata import record, run_counted, sqlite_connect
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore

ROUNDS = 60
WARMUP = 5
VALUE = b"v" * 100


@pytest.mark.parametrize("append", [False, True], ids=["create", "append"])
def test_lifecycle_mqcore(benchmark: BenchmarkFixture, scratch: str, append: bool) -> None:
    """mqcore.open(new dir) + create_topic + (one append +) close."""
    names = (os.path.join(scratch, f"s{i}") for i in itertools.count())

    def lifecycle() -> None:
        store = mqcore.open(next(names))
        store.create_topic("t")
        if append:
            store.append("t", VALUE, key=b"k")
        store.close()

    what = "append" if append else "create"
    benchmark.group = f"lifecycle-{what}"
    record(benchmark, f"lifecycle/{what}/mqcore", ops=1)
    calls = run_counted(benchmark, lifecycle, ROUNDS, WARMUP)
    last = mqcore.open(os.path.join(scratch, f"s{calls - 1}"), read_only=True)
    try:
        assert last.topics() == ["t"]
        assert last.end_offset("t", 0) == (1 if append else 0)
    finally:
        last.close()


@pytest.mark.parametrize("append", [False, True], ids=["create", "append"])
def test_lifecycle_sqlite(benchmark: BenchmarkFixture, scratch: str, append: bool) -> None:
    """sqlite3.connect(new file) in WAL mode, synchronous=FULL + CREATE TABLE + (one INSERT +)
    close."""
    names = (os.path.join(scratch, f"s{i}.sqlite") for i in itertools.count())

    def lifecycle() -> None:
        con = sqlite_connect(next(names), "FULL", autocommit=True)
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k BLOB, value BLOB)")
        if append:
            con.execute("INSERT INTO t (k, value) VALUES (?, ?)", (b"k", VALUE))
        con.close()

    what = "append" if append else "create"
    benchmark.group = f"lifecycle-{what}"
    record(benchmark, f"lifecycle/{what}/sqlite", ops=1)
    calls = run_counted(benchmark, lifecycle, ROUNDS, WARMUP)
    con = sqlite_connect(os.path.join(scratch, f"s{calls - 1}.sqlite"), "FULL")
    try:
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == (1 if append else 0)
    finally:
        con.close()
