"""Append throughput: mqcore `append_batch` against raw write() of the same encoded bytes and
against SQLite inserts in one transaction; single-message `append` against autocommit INSERT.

Every round writes a fresh batch at the end of a growing file or store (never overwriting), in
a scratch directory on the same filesystem for every side. The mqcore side includes encoding;
the raw side writes bytes encoded once beforehand by the same encoder, as a default topic
stores them (a generated `uid` header per record), so both sides write the same number of bytes.
The topic allows 2 MiB batches: 1000 x 1 KiB with their unique IDs are 1.05 MB, just above
Kafka's default max_message_bytes, which would split every batch in two.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest
from benchdata import (
    SEED,
    SEGMENT_BYTES,
    T0_MS,
    prime_page_cache,
    record,
    run_counted,
    sqlite_connect,
    values_of,
)
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore
from mqcore._ext.batch import encode_batch
from mqcore._ext.filespace import reserve

BATCH = 1000
DISTINCT_BATCHES = 8  # rounds cycle through these, so no round reuses the previous batch
SIZES = {"1KiB": 1024, "100B": 100}
# rounds per side: ~93 MB of 1 KiB batches, ~56 MB of 100 B batches (see prime_page_cache)
ROUNDS = {"1KiB": 80, "100B": 500}
WARMUP = 10
SINGLE_ROUNDS = {"os": (20, 500), "always": (5, 40)}  # (rounds, appends per round)
SINGLE_VALUE = 100
MAX_BATCH = 2 << 20


@dataclass
class BatchSet:
    """DISTINCT_BATCHES batches of BATCH values, and each one encoded once (for the raw side)."""

    values: list[list[bytes]]
    encoded: list[bytes]  # as a default topic stores them: a generated `uid` header each
    encoded_plain: list[bytes]  # as a topic with unique_ids=False stores them

    def raw(self, plain: bool) -> list[bytes]:
        return self.encoded_plain if plain else self.encoded

    def batch_bytes(self, plain: bool = False) -> int:
        return len(self.raw(plain)[0])

    def total_bytes(self, rounds: int) -> int:
        return (rounds + WARMUP) * self.batch_bytes()


@pytest.fixture(scope="module")
def batch_sets() -> dict[str, BatchSet]:
    out = {}
    for name, size in SIZES.items():
        values = [values_of(BATCH, size, SEED + i) for i in range(DISTINCT_BATCHES)]
        encoded = [encode_batch(v, now_ms=T0_MS, uid_ms=T0_MS).tobytes() for v in values]
        plain = [encode_batch(v, now_ms=T0_MS).tobytes() for v in values]
        assert len(set(map(len, encoded))) == 1 and len(set(map(len, plain))) == 1
        out[name] = BatchSet(values, encoded, plain)
    return out


def _log_bytes(store_dir: str, topic: str) -> int:
    part = os.path.join(store_dir, f"{topic}-0")
    return sum(
        os.path.getsize(os.path.join(part, n)) for n in os.listdir(part) if n.endswith(".log")
    )


# "default": the topic as created with no options (a unique ID per record, the key index);
# "plain": the Kafka-equivalent engine alone (unique_ids=False, key_index=False)
TOPIC_KINDS = {"default": {}, "plain": {"unique_ids": False, "key_index": False}}


@pytest.mark.parametrize(
    ("flush", "kind"), [("os", "default"), ("interval", "default"), ("os", "plain")]
)
@pytest.mark.parametrize("size", list(SIZES))
def test_append_batch_mqcore(
    benchmark: BenchmarkFixture,
    scratch: str,
    batch_sets: dict[str, BatchSet],
    size: str,
    flush: str,
    kind: str,
) -> None:
    """store.append_batch(topic, values, partition=0): encode + CRC + writev + index upkeep."""
    data, rounds, plain = batch_sets[size], ROUNDS[size], kind == "plain"
    prime_page_cache(scratch, data.total_bytes(rounds))
    path = os.path.join(scratch, "store")
    store = mqcore.open(path, flush=flush)
    try:
        store.create_topic(
            "t", segment_bytes=SEGMENT_BYTES, max_message_bytes=MAX_BATCH, **TOPIC_KINDS[kind]
        )
        batches = itertools.cycle(data.values)
        benchmark.group = f"append-batch-{size}"
        case = f"append/{size}/mqcore-{flush}" + ("-plain" if plain else "")
        record(benchmark, case, nbytes=data.batch_bytes(plain), messages=BATCH)
        calls = run_counted(
            benchmark, lambda: store.append_batch("t", next(batches), partition=0), rounds, WARMUP
        )
        assert store.end_offset("t", 0) == calls * BATCH
    finally:
        store.close()
    assert _log_bytes(path, "t") == calls * data.batch_bytes(plain)


@pytest.mark.parametrize(
    ("kind", "reserved"), [("default", False), ("plain", False), ("plain", True)]
)
@pytest.mark.parametrize("size", list(SIZES))
def test_append_batch_raw_write(
    benchmark: BenchmarkFixture,
    scratch: str,
    batch_sets: dict[str, BatchSet],
    size: str,
    kind: str,
    reserved: bool,
) -> None:
    """os.write() of the already-encoded batch bytes to one growing O_APPEND file: the bytes a
    default topic stores, or those of a plain one. `reserved` first reserves the whole volume
    with fallocate(KEEP_SIZE), as a segment reserves the space ahead of its appends
    (preallocate_bytes): the best a plain write() can do, shown next to the naive one."""
    data, rounds, plain = batch_sets[size], ROUNDS[size], kind == "plain"
    prime_page_cache(scratch, data.total_bytes(rounds))
    path = os.path.join(scratch, "raw.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if reserved:
        volume = data.batch_bytes(plain) * (rounds + WARMUP + 2)
        assert reserve(fd, 0, volume) == 0, "the scratch filesystem cannot reserve space"
    encoded = itertools.cycle(data.raw(plain))
    benchmark.group = f"append-batch-{size}"
    case = f"append/{size}/raw-write" + ("-plain" if plain else "")
    case += "-reserved" if reserved else ""
    record(benchmark, case, nbytes=data.batch_bytes(plain), messages=BATCH)
    try:
        calls = run_counted(benchmark, lambda: os.write(fd, next(encoded)), rounds, WARMUP)
    finally:
        os.close(fd)
    assert os.path.getsize(path) == calls * data.batch_bytes(plain)


@pytest.mark.parametrize("size", list(SIZES))
def test_append_batch_sqlite(
    benchmark: BenchmarkFixture, scratch: str, batch_sets: dict[str, BatchSet], size: str
) -> None:
    """executemany INSERT of the batch in one transaction (WAL, synchronous=OFF)."""
    data, rounds = batch_sets[size], ROUNDS[size]
    prime_page_cache(scratch, 2 * data.total_bytes(rounds))  # WAL + database file
    con = sqlite_connect(os.path.join(scratch, "append.sqlite"), "OFF")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, value BLOB)")
    rows = itertools.cycle([[(v,) for v in values] for values in data.values])

    def insert() -> None:
        with con:
            con.executemany("INSERT INTO t (value) VALUES (?)", next(rows))

    benchmark.group = f"append-batch-{size}"
    record(benchmark, f"append/{size}/sqlite-tx", nbytes=data.batch_bytes(), messages=BATCH)
    try:
        calls = run_counted(benchmark, insert, rounds, WARMUP)
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == calls * BATCH
    finally:
        con.close()


@pytest.mark.parametrize("flush", ["os", "always"])
def test_append_single_mqcore(benchmark: BenchmarkFixture, scratch: str, flush: str) -> None:
    """One store.append(topic, value) per message; "always" fdatasyncs before returning."""
    rounds, per_round = SINGLE_ROUNDS[flush]
    values = values_of(per_round, SINGLE_VALUE, SEED)
    store = mqcore.open(os.path.join(scratch, "store"), flush=flush)

    def append_all() -> None:
        for v in values:
            store.append("t", v, partition=0)

    benchmark.group = f"append-single-{flush}"
    record(
        benchmark,
        f"single/{flush}/mqcore",
        nbytes=per_round * SINGLE_VALUE,
        messages=per_round,
        ops=per_round,
    )
    try:
        store.create_topic("t", segment_bytes=SEGMENT_BYTES)
        calls = run_counted(benchmark, append_all, rounds, 1)
        assert store.end_offset("t", 0) == calls * per_round
    finally:
        store.close()


@pytest.mark.parametrize("flush", ["os", "always"])
def test_append_single_sqlite(benchmark: BenchmarkFixture, scratch: str, flush: str) -> None:
    """One autocommit INSERT per message, WAL; synchronous=OFF for "os", FULL for "always"."""
    rounds, per_round = SINGLE_ROUNDS[flush]
    values = values_of(per_round, SINGLE_VALUE, SEED)
    con = sqlite_connect(
        os.path.join(scratch, "single.sqlite"),
        "FULL" if flush == "always" else "OFF",
        autocommit=True,
    )
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, value BLOB)")

    def insert_all() -> None:
        for v in values:
            con.execute("INSERT INTO t (value) VALUES (?)", (v,))

    benchmark.group = f"append-single-{flush}"
    record(
        benchmark,
        f"single/{flush}/sqlite",
        nbytes=per_round * SINGLE_VALUE,
        messages=per_round,
        ops=per_round,
    )
    try:
        calls = run_counted(benchmark, insert_all, rounds, 1)
        assert con.execute("SELECT count(*) FROM t").fetchone()[0] == calls * per_round
    finally:
        con.close()
