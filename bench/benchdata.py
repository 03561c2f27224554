"""Data and helpers shared by the benchmarks: seeded payloads, page-cache priming, SQLite
connections, and the 200k-message store (plus the same rows in SQLite) that the lookup and scan
benchmarks query.

Every benchmark records what one round moves in `benchmark.extra_info` (`case`, `bytes`,
`messages`, `ops`), so `bench/ratios.py` can turn the JSON into MB/s, msgs/s and the target ratios.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mqcore

SEED = 20240502
T0_MS = 1_700_000_000_000
LOOKUP_MESSAGES = 200_000
LOOKUP_VALUE_BYTES = 100
LOOKUP_TOPIC = "lookup"
# Kafka's default segment size is 1 GiB; 64 MiB makes the 1 KiB append run roll once
# (a realistic cost to include) while most rounds are plain appends.
SEGMENT_BYTES = 64 << 20


def values_of(count: int, size: int, seed: int) -> list[bytes]:
    """`count` random (incompressible) values of `size` bytes, the same for every run."""
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def record(
    benchmark: Any, case: str, *, nbytes: int = 0, messages: int = 0, ops: int = 0, **extra: Any
) -> None:
    """What one round of `benchmark` moves: bytes, messages and operations (for ratios.py)."""
    benchmark.extra_info.update(case=case, bytes=nbytes, messages=messages, ops=ops, **extra)


def run_counted(benchmark: Any, fn: Callable[[], object], rounds: int, warmup_rounds: int) -> int:
    """benchmark.pedantic(fn, ...) with one call per round; returns how often fn ran (warm-up
    included; a single call under --benchmark-disable), so tests can check the work was done."""
    calls = [0]

    def counted() -> None:
        calls[0] += 1
        fn()

    benchmark.pedantic(counted, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
    return calls[0]


def prime_page_cache(directory: str, nbytes: int) -> None:
    """Write and delete `nbytes` in `directory` so the next writes land in recycled page cache.

    On this Firecracker VM the first touch of guest memory the host has not backed yet costs
    about 4 ms per MiB (10x a plain copy), and it hits whichever benchmark happens to run when the
    recycled pages run out. Priming right before each write benchmark gives every side (mqcore,
    raw write(), SQLite) the same warm pages, so the figures compare the code, not the VM.
    """
    path = os.path.join(directory, "prime.tmp")
    block = b"\0" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(nbytes // len(block) + 1):
            os.write(fd, block)
    finally:
        os.close(fd)
        os.unlink(path)


def sqlite_connect(path: str, synchronous: str, autocommit: bool = False) -> sqlite3.Connection:
    """A WAL-mode connection; `synchronous` OFF matches flush="os", FULL matches "always"."""
    con = sqlite3.connect(
        path, isolation_level=None if autocommit else "DEFERRED", check_same_thread=False
    )
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(f"PRAGMA synchronous={synchronous}")
    return con


@dataclass
class LookupData:
    """One store of LOOKUP_MESSAGES 100 B messages and the same rows in SQLite."""

    store: mqcore.Store
    sqlite: sqlite3.Connection
    batch: int
    log_bytes: int
    value_bytes: int
    first_ts: int
    last_ts: int


def message_timestamp(i: int) -> int:
    """Ten messages per millisecond: timestamps repeat, as they do in a real stream."""
    return T0_MS + i // 10


def build_lookup_data(directory: str, batch: int) -> LookupData:
    """Append LOOKUP_MESSAGES messages in batches of `batch`; insert the same rows in SQLite."""
    values = values_of(LOOKUP_MESSAGES, LOOKUP_VALUE_BYTES, SEED + batch)
    store = mqcore.open(os.path.join(directory, "store"), flush="os")
    store.create_topic(LOOKUP_TOPIC, segment_bytes=SEGMENT_BYTES)
    con = sqlite_connect(os.path.join(directory, "lookup.sqlite"), "OFF")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, value BLOB)")
    for lo in range(0, LOOKUP_MESSAGES, batch):
        chunk = values[lo : lo + batch]
        stamps = [message_timestamp(i) for i in range(lo, lo + len(chunk))]
        store.append_batch(LOOKUP_TOPIC, chunk, partition=0, timestamps=stamps)
        with con:
            con.executemany(
                "INSERT INTO t (id, ts, value) VALUES (?, ?, ?)",
                zip(range(lo, lo + len(chunk)), stamps, chunk, strict=True),
            )
    con.execute("CREATE INDEX t_ts ON t (ts)")
    con.execute("ANALYZE")
    store.flush()
    part_dir = os.path.join(directory, "store", f"{LOOKUP_TOPIC}-0")
    log_bytes = sum(
        os.path.getsize(os.path.join(part_dir, n))
        for n in os.listdir(part_dir)
        if n.endswith(".log")
    )
    return LookupData(
        store,
        con,
        batch,
        log_bytes,
        LOOKUP_MESSAGES * LOOKUP_VALUE_BYTES,
        message_timestamp(0),
        message_timestamp(LOOKUP_MESSAGES - 1),
    )
