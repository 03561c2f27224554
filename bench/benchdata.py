"""Data and helpers shared by the benchmarks: seeded payloads, page-cache priming, SQLite
connections, the 200k-message store (plus the same rows in SQLite) that the lookup and scan
benchmarks query, and the keyed and log-line stores (plus SQLite copies) of the query benchmarks.

Every benchmark records what one round moves in `benchmark.extra_info` (`case`, `bytes`,
`messages`, `ops`), so `bench/ratios.py` can turn the JSON into MB/s, msgs/s and the target ratios.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


# first lookups per round of the cold benchmarks, each in a batch no other lookup of the round
# touches (for mqcore: the first read of that batch by the store handle the round opened)
COLD_LOOKUPS = 100

Setup = Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]


@contextmanager
def cold_open(store: mqcore.Store) -> Iterator[Setup]:
    """A pedantic `setup` that opens `store`'s directory anew, read-only, for each round (the
    previous round's handle closed first), so every lookup of a round is a first one."""
    opened: list[mqcore.Store] = []

    def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
        while opened:
            opened.pop().close()
        opened.append(mqcore.open(store.path, read_only=True))
        return (opened[-1],), {}

    try:
        yield fresh
    finally:
        while opened:
            opened.pop().close()


@contextmanager
def cold_sqlite(con: sqlite3.Connection) -> Iterator[Setup]:
    """cold_open's counterpart: a new connection to `con`'s database file for each round."""
    path = con.execute("PRAGMA database_list").fetchone()[2]
    opened: list[sqlite3.Connection] = []

    def fresh() -> tuple[tuple[Any, ...], dict[str, Any]]:
        while opened:
            opened.pop().close()
        opened.append(sqlite3.connect(path, check_same_thread=False))
        # the schema, read at the first statement, as mqcore's open reads its metadata
        opened[-1].execute("SELECT count(*) FROM sqlite_master").fetchone()
        return (opened[-1],), {}

    try:
        yield fresh
    finally:
        while opened:
            opened.pop().close()


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


# -- query benchmarks (test_query.py) ----------------------------------------------------------

KEY_MESSAGES = 1_000_000
KEY_TOPIC = "orders"
KEY_VALUE_BYTES = 100
SCAN_TOPIC = "logs"
SCAN_BYTES = 256 << 20  # values per scan store: a full scan reads about this much
# absent from every generated value: a search for it scans everything
ABSENT_NEEDLE = b"SegmentChecksumMismatch"


def customer_key(n: int) -> bytes:
    return b"cust-%08d" % n


def segment_log_bytes(store_dir: str, topic: str, partition: int = 0) -> int:
    part_dir = os.path.join(store_dir, f"{topic}-{partition}")
    return sum(
        os.path.getsize(os.path.join(part_dir, n))
        for n in os.listdir(part_dir)
        if n.endswith(".log")
    )


@dataclass
class KeyData:
    """KEY_MESSAGES 100 B messages keyed from a pool of as many keys (so a key has about one to
    three messages), and the same rows in SQLite with an index on the key column."""

    store: mqcore.Store
    sqlite: sqlite3.Connection
    keys: list[bytes]  # the key of every message, by offset
    log_bytes: int


def build_key_data(directory: str) -> KeyData:
    """Append KEY_MESSAGES messages in batches of 1000; insert the same rows in SQLite."""
    rng = random.Random(SEED + 11)
    path = os.path.join(directory, "store")
    store = mqcore.open(path, flush="os")
    store.create_topic(KEY_TOPIC, segment_bytes=SEGMENT_BYTES)
    con = sqlite_connect(os.path.join(directory, "keys.sqlite"), "OFF")
    con.execute(
        "CREATE TABLE m (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, key BLOB, value BLOB)"
    )
    keys = [customer_key(rng.randrange(KEY_MESSAGES)) for _ in range(KEY_MESSAGES)]
    for lo in range(0, KEY_MESSAGES, 1000):
        values = [rng.randbytes(KEY_VALUE_BYTES) for _ in range(1000)]
        chunk = keys[lo : lo + 1000]
        stamps = [message_timestamp(i) for i in range(lo, lo + 1000)]
        store.append_batch(KEY_TOPIC, values, chunk, partition=0, timestamps=stamps)
        with con:
            con.executemany(
                "INSERT INTO m (id, ts, key, value) VALUES (?, ?, ?, ?)",
                zip(range(lo, lo + 1000), stamps, chunk, values, strict=True),
            )
    con.execute("CREATE INDEX m_key ON m (key)")
    con.execute("ANALYZE")
    store.flush()
    return KeyData(store, con, keys, segment_log_bytes(path, KEY_TOPIC))


LOG_LEVELS = ("INFO", "INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
LOG_SOURCES = (
    "c.e.orders.OrderService",
    "c.e.billing.InvoiceJob",
    "c.e.gateway.HttpFilter",
    "c.e.auth.TokenCache",
    "c.e.search.IndexWriter",
)
LOG_TEXTS = (
    "processed order {a} for customer {b} in {c} ms (items={d}, total={e}.{f:02d} EUR)",
    "GET /api/v2/orders/{a}?expand=items,customer HTTP/1.1 200 {c} ms bytes={b} ua=okhttp/4.{d}",
    "token refreshed for user {b} scope=read:orders,write:cart expires_in={c}s client=web-{d}",
    "retrying request {a} to payments-{d}.internal after {c} ms: connection reset by peer",
    "flushed {d} segments ({b} bytes) to index shard {e} in {c} ms, queue depth {f}",
)
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
    "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu order cart "
    "invoice shipment warehouse parcel customer address street city postcode country"
).split()


def log_line(rng: random.Random, i: int) -> bytes:
    """An application log line of about 200 bytes, as a logging framework writes it."""
    ms = i * 7
    s, ms = divmod(ms, 1000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    r = rng.getrandbits(64)
    text = LOG_TEXTS[r % 5].format(
        a=r >> 40, b=(r >> 8) % 100_000_000, c=r % 997, d=(r >> 16) % 12, e=(r >> 24) % 500,
        f=(r >> 32) % 100,
    )  # fmt: skip
    return (
        f"2024-05-02T{h % 24:02d}:{m:02d}:{s:02d}.{ms:03d}Z {LOG_LEVELS[r % 7]:5} "
        f"[worker-{(r >> 4) % 16}] {LOG_SOURCES[(r >> 12) % 5]} - {text} "
        f"host=ip-10-0-{(r >> 20) % 256}-{(r >> 28) % 256} trace={rng.getrandbits(64):016x}"
    ).encode()


def json_bodies(rng: random.Random, count: int) -> list[bytes]:
    """`count` JSON fragments of about 1 KiB: order lines and a free-text note."""
    out = []
    for _ in range(count):
        items = ",".join(
            f'{{"sku":"SKU-{rng.randrange(100_000):05d}","qty":{rng.randint(1, 9)},'
            f'"price":{rng.randrange(200)}.{rng.randrange(100):02d}}}'
            for _ in range(rng.randint(3, 12))
        )
        note = " ".join(rng.choice(WORDS) for _ in range(160))
        out.append(f'"items":[{items}],"note":"{note}"'.encode())
    return out


def json_value(i: int, rng: random.Random, bodies: list[bytes]) -> bytes:
    """A 1 KiB JSON order document (a distinct head on one of the shared bodies)."""
    head = b'{"id":%d,"customer":"%s","status":"%s",' % (
        i,
        customer_key(rng.randrange(KEY_MESSAGES)),
        rng.choice((b"new", b"paid", b"shipped", b"returned")),
    )
    doc = head + bodies[rng.randrange(len(bodies))]
    return doc[:1022] + b'"}' if len(doc) >= 1022 else doc + b" " * (1022 - len(doc)) + b'"}'


@dataclass
class ScanData:
    """A single-partition store of about SCAN_BYTES of values, and the same values in SQLite."""

    case: str
    store: mqcore.Store
    sqlite: sqlite3.Connection
    messages: int
    log_bytes: int
    value_bytes: int


def build_scan_data(directory: str, case: str) -> ScanData:
    """`case` "200B": log lines of about 200 bytes; "1KiB": 1 KiB JSON documents."""
    rng = random.Random(SEED + 13)
    bodies = json_bodies(rng, 512)
    path = os.path.join(directory, "store")
    store = mqcore.open(path, flush="os")
    store.create_topic(SCAN_TOPIC, segment_bytes=SEGMENT_BYTES)
    con = sqlite_connect(os.path.join(directory, "scan.sqlite"), "OFF")
    con.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, value BLOB)")
    count = value_bytes = 0
    while value_bytes < SCAN_BYTES:
        if case == "200B":
            values = [log_line(rng, count + j) for j in range(1000)]
        else:
            values = [json_value(count + j, rng, bodies) for j in range(1000)]
        stamps = [message_timestamp(count + j) for j in range(1000)]
        store.append_batch(SCAN_TOPIC, values, partition=0, timestamps=stamps)
        with con:
            con.executemany(
                "INSERT INTO s (id, value) VALUES (?, ?)",
                zip(range(count, count + 1000), values, strict=True),
            )
        count += 1000
        value_bytes += sum(map(len, values))
    store.flush()
    return ScanData(case, store, con, count, segment_log_bytes(path, SCAN_TOPIC), value_bytes)
