"""`python -m mqcore.demo`: write a realistic log stream into a store, then read it back.

    python -m mqcore.demo [--path DIR] [--messages N] [--seed S] [--no-spark]

Writes nginx access-log lines to `access-logs` (3 partitions, keyed by client IP, 4 MiB
segments so the log rolls) and JSON application events with `service`/`level` headers to
`app-events` (2 partitions, keyed by trace id, zstd-compressed), timestamps spread over one
simulated hour. Then it reads them back by offset (`read`, `get`), by time
(`offset_for_time`), as Arrow (`read_arrow`), closes and reopens the store, and finally
simulates a crash mid-write to show recovery cutting the torn tail. When PySpark is installed
(`mqcore[spark]`; `--no-spark` skips it), it ends with Spark SQL over the store through the
"mqcore" data source on a local Spark. Every step prints what it found and how long it took.
The messages are deterministic for a given seed; their generated unique IDs and the timings
are not.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import mqcore

BASE_TS = 1_714_564_800_000  # 2024-05-01T12:00:00Z: the start of the simulated hour
HOUR_MS = 3_600_000
BATCH = 1000  # messages per append_batch call
ACCESS, EVENTS = "access-logs", "app-events"
MIN_MESSAGES = 20

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
METHODS = (("GET", 82), ("POST", 12), ("PUT", 3), ("DELETE", 2), ("HEAD", 1))
STATUSES = (
    (200, 78),
    (201, 3),
    (204, 2),
    (301, 2),
    (304, 5),
    (400, 2),
    (401, 1),
    (403, 1),
    (404, 4),
    (429, 1),
    (500, 0.6),
    (502, 0.3),
    (503, 0.1),
)
AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4_1) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/17.4.1 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "curl/8.7.1",
    "python-requests/2.31.0",
    "kube-probe/1.29",
)
PRODUCTS = (
    "espresso-machine",
    "coffee-grinder",
    "milk-frother",
    "pour-over-kit",
    "kettle",
    "french-press",
    "travel-mug",
    "descaler",
    "filter-papers",
    "cold-brew-jar",
)
SEARCHES = ("arabica", "decaf", "grinder+burr", "gift+card", "espresso", "oat+milk", "kettle")
SERVICES = ("gateway", "auth", "checkout", "payments", "inventory", "search")
LEVELS = (("DEBUG", 8), ("INFO", 75), ("WARN", 12), ("ERROR", 5))
EVENT_TEXT = {
    "DEBUG": ("cache hit for key {sku}", "span {span} started", "config reloaded ({n} keys)"),
    "INFO": (
        "order {order} placed with {n} items",
        "user {user} logged in",
        "search '{term}' returned {n} hits",
        "reserved {n} units of {sku}",
        "payment authorized for order {order}",
        "request served in {ms} ms",
    ),
    "WARN": (
        "retrying call to {dep} (attempt {n})",
        "slow query on {table}: {ms} ms",
        "rate limit at 90% for client {user}",
    ),
    "ERROR": (
        "payment gateway timeout after {ms} ms",
        "could not reserve {sku}: out of stock",
        "upstream {dep} returned 503",
        "invalid token for user {user}",
    ),
}


@dataclass
class Stream:
    """Parallel lists for append_batch (one topic's messages, in write order)."""

    values: list[bytes]
    keys: list[bytes]
    timestamps: list[int]
    headers: list[list[tuple[str, bytes]]] | None = None

    @property
    def payload_bytes(self) -> int:
        return sum(map(len, self.values)) + sum(map(len, self.keys))


@dataclass
class DemoReport:
    """What the demo wrote and found, for the caller (and the tests) to check."""

    path: str
    written: dict[str, int] = field(default_factory=dict)
    read_back: dict[str, int] = field(default_factory=dict)
    levels: dict[str, int] = field(default_factory=dict)
    time_hits: list[tuple[int, int | None]] = field(default_factory=list)
    arrow_rows: int | None = None
    truncated_bytes: int = 0
    spark: SparkFindings | None = None


# -- the data -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def clf_time(second: int) -> str:
    """nginx's $time_local for a UTC second: 01/May/2024:12:00:00 +0000 (locale-independent)."""
    t = time.gmtime(second)
    return (
        f"{t.tm_mday:02d}/{MONTHS[t.tm_mon - 1]}/{t.tm_year}:"
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000"
    )


@functools.lru_cache(maxsize=8192)
def _iso_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def iso_time(ts_ms: int) -> str:
    """2024-05-01T12:00:00.123Z"""
    return f"{_iso_second(ts_ms // 1000)}.{ts_ms % 1000:03d}Z"


def num(rng: random.Random, low: int, high: int) -> int:
    """A uniform int in [low, high]; randint's speed matters for 200k messages."""
    return low + int(rng.random() * (high - low + 1))


def spread_timestamps(rng: random.Random, n: int) -> list[int]:
    """n timestamps across the hour, rising overall with up to 0.5 s of jitter (out of order,
    as timestamps from many producers are)."""
    step = HOUR_MS / n
    return [max(BASE_TS, BASE_TS + int(i * step) + num(rng, -500, 500)) for i in range(n)]


def _weighted(rng: random.Random, table: Sequence[tuple[Any, float]], n: int) -> list[Any]:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table], k=n)


def _request_path(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        return f"/api/orders/{num(rng, 100000, 999999)}"
    if r < 0.55:
        return f"/products/{PRODUCTS[num(rng, 0, len(PRODUCTS) - 1)]}"
    if r < 0.70:
        return f"/static/js/app.{rng.getrandbits(32):08x}.js"
    if r < 0.80:
        return f"/search?q={SEARCHES[num(rng, 0, len(SEARCHES) - 1)]}&page={num(rng, 1, 5)}"
    if r < 0.90:
        return "/api/cart"
    return ("/", "/login", "/healthz", "/favicon.ico")[num(rng, 0, 3)]


def _response_bytes(rng: random.Random, status: int) -> int:
    if status in (204, 304):
        return 0
    if status >= 300:
        return num(rng, 150, 600)
    return int(rng.lognormvariate(8.5, 1.2))


def access_logs(rng: random.Random, n: int) -> Stream:
    """nginx 'combined' lines; the client IP is the key (one client's requests stay in order)."""
    clients = [
        f"{num(rng, 1, 223)}.{num(rng, 0, 255)}.{num(rng, 0, 255)}.{num(rng, 1, 254)}"
        for _ in range(2000)
    ]
    ips = rng.choices(clients, weights=[1 / (i + 1) for i in range(len(clients))], k=n)
    methods = _weighted(rng, METHODS, n)
    statuses = _weighted(rng, STATUSES, n)
    agents = rng.choices(AGENTS, k=n)
    stamps = spread_timestamps(rng, n)
    values = []
    for ip, method, status, agent, ts in zip(ips, methods, statuses, agents, stamps, strict=True):
        referer = "-" if rng.random() < 0.6 else f"https://shop.example.com{_request_path(rng)}"
        line = (
            f'{ip} - - [{clf_time(ts // 1000)}] "{method} {_request_path(rng)} HTTP/1.1" '
            f'{status} {_response_bytes(rng, status)} "{referer}" "{agent}"'
        )
        values.append(line.encode())
    return Stream(values, [ip.encode() for ip in ips], stamps)


def _event_message(rng: random.Random, level: str) -> str:
    return rng.choice(EVENT_TEXT[level]).format(
        sku=f"sku-{num(rng, 1000, 9999)}",
        span=f"{rng.getrandbits(32):08x}",
        n=num(rng, 1, 12),
        order=num(rng, 100000, 999999),
        user=f"u{num(rng, 1, 50000)}",
        term=rng.choice(SEARCHES),
        ms=num(rng, 20, 5000),
        dep=rng.choice(SERVICES),
        table=rng.choice(("orders", "stock", "sessions")),
    )


def app_events(rng: random.Random, n: int) -> Stream:
    """JSON events of a few services; traces of 1-6 events share a trace id, the key."""
    stamps = spread_timestamps(rng, n)
    levels = _weighted(rng, LEVELS, n)
    services = rng.choices(SERVICES, k=n)
    # message texts come from a pool per level: formatting 200k fresh ones would dominate
    pool = {lvl: [json.dumps(_event_message(rng, lvl)) for _ in range(500)] for lvl, _ in LEVELS}
    values, keys, headers = [], [], []
    trace, left = "", 0
    for ts, level, service in zip(stamps, levels, services, strict=True):
        if left == 0:
            trace, left = f"{rng.getrandbits(128):032x}", num(rng, 1, 6)
        left -= 1
        text = pool[level][num(rng, 0, 499)]
        latency = round(rng.lognormvariate(3.0, 0.9), 1)
        # the fields are plain ASCII and the message is JSON-escaped: an f-string is valid JSON
        values.append(
            f'{{"time":"{iso_time(ts)}","service":"{service}","level":"{level}",'
            f'"trace_id":"{trace}","message":{text},"latency_ms":{latency},'
            f'"host":"{service}-{num(rng, 0, 3)}"}}'.encode()
        )
        keys.append(trace.encode())
        headers.append([("service", service.encode()), ("level", level.encode())])
    return Stream(values, keys, stamps, headers)


# -- printing -----------------------------------------------------------------------------------


def rate(count: float, seconds: float, unit: str) -> str:
    """'1.23 M msgs/s' style throughput."""
    per = count / max(seconds, 1e-9)
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per >= div:
            return f"{per / div:.2f} {prefix}{unit}/s"
    return f"{per:.0f} {unit}/s"


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def short(b: bytes | None, width: int = 96) -> str:
    text = "(null)" if b is None else b.decode("utf-8", "backslashreplace")
    return text if len(text) <= width else text[: width - 3] + "..."


class Printer:
    """Numbered steps and aligned detail lines on one stream."""

    def __init__(self, out: TextIO):
        self.out = out
        self.step = 0

    def title(self, text: str) -> None:
        self.step += 1
        self.out.write(f"\n{self.step}. {text}\n")

    def line(self, text: str = "") -> None:
        self.out.write(f"   {text}\n" if text else "\n")


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """(fn(*args), seconds it took)."""
    t0 = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - t0


# -- the steps ----------------------------------------------------------------------------------


def prepare(path: str) -> None:
    """Wipe `path` for a fresh store, refusing to delete a directory mqcore did not make."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise SystemExit(f"mqcore demo: {path} exists and is not a directory")
    names = set(os.listdir(path))
    if names and not names & {"mqcore-topics.json", ".mqcore.lock"}:
        raise SystemExit(
            f"mqcore demo: {path} is not empty and is not an mqcore store; "
            f"refusing to delete it (pick another --path)"
        )
    shutil.rmtree(path)


def write(
    store: mqcore.Store, p: Printer, topic: str, stream: Stream, compression: str | None
) -> float:
    """append_batch in batches of BATCH, routed by key; returns the seconds it took."""

    def run() -> int:
        batches = 0
        for i in range(0, len(stream.values), BATCH):
            j = i + BATCH
            mds = store.append_batch(
                topic,
                stream.values[i:j],
                keys=stream.keys[i:j],
                headers=None if stream.headers is None else stream.headers[i:j],
                partition=None,
                timestamps=stream.timestamps[i:j],
                compression=compression,
            )
            batches += len(mds) if isinstance(mds, list) else 1
        return batches

    batches, secs = timed(run)
    n = len(stream.values)
    p.line(
        f"{topic:<12} {n:>9,} msgs  {mb(stream.payload_bytes):>8}  as {batches:,} record "
        f"batches in {secs:.2f} s  {rate(n, secs, ' msgs')}  "
        f"{rate(stream.payload_bytes, secs, 'B')}"
    )
    return secs


def on_disk(path: str, topic: str) -> tuple[int, int]:
    """(bytes in .log files, number of segments) of a topic."""
    total = segments = 0
    for name in os.listdir(path):
        if name.rsplit("-", 1)[0] == topic and os.path.isdir(os.path.join(path, name)):
            for f in os.listdir(os.path.join(path, name)):
                if f.endswith(".log"):
                    total += os.path.getsize(os.path.join(path, name, f))
                    segments += 1
    return total, segments


def read_all(store: mqcore.Store, topic: str, levels: Counter[str] | None) -> tuple[int, int]:
    """Read every partition from its start with `read`; returns (messages, value bytes)."""
    count = size = 0
    for part in range(store.partitions(topic)):
        offset, end = store.start_offset(topic, part), store.end_offset(topic, part)
        while offset < end:
            page = store.read(topic, part, offset, max_records=5000)
            if not page:
                break
            for m in page:
                size += len(m.value or b"")
                if levels is not None:
                    levels[(m.header("level") or b"?").decode()] += 1
            count += len(page)
            offset = page[-1].offset + 1
    return count, size


def step_read(store: mqcore.Store, p: Printer, report: DemoReport, rng: random.Random) -> None:
    p.title("Reading back by offset: read() every partition from its start, get() at random")
    levels: Counter[str] = Counter()
    for topic in (ACCESS, EVENTS):
        (count, size), secs = timed(read_all, store, topic, levels if topic == EVENTS else None)
        report.read_back[topic] = count
        p.line(
            f"read  {topic:<12} {count:>9,} msgs  {mb(size):>8}  in {secs:.2f} s  "
            f"{rate(count, secs, ' msgs')}  {rate(size, secs, 'B')}"
        )
    report.levels = dict(levels)
    p.line(
        "app-events by 'level' header: "
        + ", ".join(f"{lvl} {levels[lvl]:,}" for lvl, _ in LEVELS if levels[lvl])
    )
    targets = []
    for part in range(store.partitions(ACCESS)):
        start, end = store.start_offset(ACCESS, part), store.end_offset(ACCESS, part)
        targets += [(part, rng.randrange(start, end)) for _ in range(700 if end > start else 0)]
    rng.shuffle(targets)
    found, secs = timed(lambda: [store.get(ACCESS, part, off) for part, off in targets])
    assert all(
        m is not None and m.offset == off for m, (_, off) in zip(found, targets, strict=True)
    )
    p.line(
        f"get   {len(targets):,} random offsets of {ACCESS} in {secs * 1000:.1f} ms  "
        f"{rate(len(targets), secs, ' gets')}"
    )
    if found:
        m = found[0]
        p.line(f"      e.g. {ACCESS}/{m.partition} @ {m.offset}: {short(m.value, 80)}")


def step_time(store: mqcore.Store, p: Printer, report: DemoReport) -> None:
    p.title(f"Reading by time: offset_for_time() on {ACCESS}/0 (first offset with ts >= T)")
    for minutes in (0, 15, 30, 45, 59.99, 75):
        ts = BASE_TS + int(minutes * 60_000)
        offset, secs = timed(store.offset_for_time, ACCESS, 0, ts)
        report.time_hits.append((ts, offset))
        label = iso_time(ts)[11:19]
        if offset is None:
            p.line(f"{label}  -> None: nothing at or after it ({secs * 1e6:.0f} us)")
            continue
        m = store.get(ACCESS, 0, offset)
        assert m is not None
        p.line(
            f"{label}  -> offset {offset:>7,} ({secs * 1e6:.0f} us)  "
            f"ts {iso_time(m.timestamp)[11:23]}  {short(m.value, 60)}"
        )


def step_arrow(store: mqcore.Store, p: Printer, report: DemoReport) -> None:
    p.title("Reading as Arrow: read_arrow() in Spark's Kafka-source columns")
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError:
        p.line("skipped: pyarrow is not installed (pip install 'mqcore[arrow]')")
        return
    batches, secs = timed(
        lambda: [store.read_arrow(ACCESS, part) for part in range(store.partitions(ACCESS))]
    )
    rows = sum(b.num_rows for b in batches)
    size = sum(b.nbytes for b in batches)
    report.arrow_rows = rows
    p.line(
        f"read_arrow {ACCESS}: {rows:,} rows, {mb(size)} of Arrow buffers in {secs:.2f} s  "
        f"{rate(rows, secs, ' rows')}  {rate(size, secs, 'B')}"
    )
    p.line("columns: " + ", ".join(f"{f.name} {f.type}" for f in batches[0].schema))
    table = pa.Table.from_batches(batches)
    lines = table.column("value").cast(pa.string())
    for cls in ("4", "5"):
        hits = pc.sum(pc.match_substring_regex(lines, f'" {cls}\\d\\d ')).as_py() or 0
        p.line(f"{cls}xx responses (pyarrow.compute over the value column): {hits:,}")


def step_reopen(path: str, p: Printer) -> None:
    p.title("Closing and reopening: a clean shutdown needs no recovery")
    store, secs = timed(mqcore.open, path)
    with store:
        recovered = sum(len(r.recovered_segments) for r in store.recovery.values())
        for topic in store.topics():
            ends = [store.end_offset(topic, part) for part in range(store.partitions(topic))]
            size, segments = on_disk(path, topic)
            p.line(
                f"{topic:<12} partitions {len(ends)}  segments {segments:>2}  "
                f"end offsets {ends}  {mb(size)} on disk"
            )
        p.line(f"opened in {secs * 1000:.1f} ms; segments scanned by recovery: {recovered}")


def step_crash(path: str, p: Printer, report: DemoReport) -> None:
    """Append half a batch header to a closed store's active segment and drop the clean marker:
    exactly what a writer killed in the middle of a write leaves behind."""
    p.title("Simulating a crash mid-write: recovery cuts the torn tail")
    part_dir = os.path.join(path, f"{ACCESS}-0")
    logs = sorted(f for f in os.listdir(part_dir) if f.endswith(".log"))
    active = os.path.join(part_dir, logs[-1])
    with open(os.path.join(part_dir, logs[0]), "rb") as src:
        torn = src.read(40)  # the first 40 bytes of a batch: its length promises far more
    with open(active, "ab") as dst:
        dst.write(torn)
    os.unlink(os.path.join(path, "mqcore-clean-shutdown"))
    p.line(
        f"wrote {len(torn)} stray bytes at the end of {ACCESS}-0/{logs[-1]} and removed "
        f"the clean-shutdown marker"
    )
    store, secs = timed(mqcore.open, path)
    with store:
        rep = store.recovery[(ACCESS, 0)]
        scanned = sum(len(r.recovered_segments) for r in store.recovery.values())
        report.truncated_bytes = sum(r.truncated_bytes for r in store.recovery.values())
        p.line(
            f"reopened in {secs * 1000:.1f} ms: recovery scanned {scanned} active "
            f"segment(s), CRC-checked every batch in them, cut {rep.truncated_bytes} bytes "
            f"from {ACCESS}-0; end offset still {store.end_offset(ACCESS, 0):,}"
        )


@dataclass
class SparkFindings:
    """What the Spark SQL step computed, for the tests to check against the store."""

    status_counts: dict[str, int]
    errors_per_host: dict[str, int]
    bounded_count: int
    input_partitions: tuple[int, int]  # the whole topic, and the bounded read


STATUS_SQL = """
SELECT regexp_extract(CAST(value AS STRING), '" ([0-9]{3}) ', 1) AS status,
       date_trunc('minute', timestamp) AS minute, count(*) AS n
FROM access GROUP BY status, minute
"""
ERRORS_SQL = """
SELECT get_json_object(CAST(value AS STRING), '$.host') AS host, count(*) AS errors
FROM events WHERE get_json_object(CAST(value AS STRING), '$.level') = 'ERROR'
GROUP BY host ORDER BY errors DESC, host
"""


def step_spark(path: str, p: Printer, spark: Any) -> SparkFindings:
    """Spark SQL over the store through the "mqcore" data source: status codes per minute of
    the access lines, errors per host of the JSON events, and one read bounded by Kafka's
    options (partition 1's first 1000 offsets), showing the input partitions it never read.
    (Bounds go in the options, not in a filter: docs/spark.md "Reusing a DataFrame".)"""
    import mqcore.spark

    mqcore.spark.register(spark)
    where = os.path.abspath(path)

    def topic(name: str) -> Any:
        return spark.read.format("mqcore").option("subscribe", name).load(where)

    topic(ACCESS).createOrReplaceTempView("access")
    topic(EVENTS).createOrReplaceTempView("events")
    per_minute, secs = timed(lambda: spark.sql(STATUS_SQL).collect())
    status: dict[str, int] = {}
    for row in per_minute:
        status[row["status"]] = status.get(row["status"], 0) + row["n"]
    minutes = len({row["minute"] for row in per_minute})
    p.line(
        f"status codes per minute over {ACCESS}: {len(per_minute)} (status, minute) groups "
        f"over {minutes} minutes in {secs:.2f} s; totals "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(status.items()))
    )
    worst, secs = timed(lambda: spark.sql(ERRORS_SQL).collect())
    errors = {row["host"]: row["errors"] for row in worst}
    top = ", ".join(f"{h} {n}" for h, n in list(errors.items())[:3])
    p.line(f"ERROR events per host over {EVENTS} in {secs:.2f} s: {top}, ...")
    with mqcore.open(where, read_only=True) as store:
        ending = min(1000, store.end_offset(ACCESS, 1))
    narrow = (
        spark.read.format("mqcore")
        .option("assign", json.dumps({ACCESS: [1]}))
        .option("endingOffsets", json.dumps({ACCESS: {"1": ending}}))
        .load(where)
    )
    parts = (topic(ACCESS).rdd.getNumPartitions(), narrow.rdd.getNumPartitions())
    count, secs = timed(narrow.count)
    p.line(
        f"bounded read: assign partition 1, endingOffsets {ending} counted {count:,} rows in "
        f"{secs:.2f} s from {parts[1]} input partition(s) instead of {parts[0]}: the other "
        f"partitions and offsets were never read"
    )
    return SparkFindings(status, errors, count, parts)


SPARK_LOG = os.path.join(tempfile.gettempdir(), "mqcore-demo-spark.log")


def spark_session(log_path: str = SPARK_LOG) -> Any:
    """A local session for the demo; None without PySpark.

    The JVM's own stderr (its start-up warnings and log4j output) goes to `log_path`, so the
    demo's output is the demo's: the JVM inherits the descriptor it starts with, and a failure
    still reaches the demo as the exception Py4J raises."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    # Spark's Python workers must run this interpreter (it has mqcore), not the first python3
    # on PATH
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log_path, "wb") as log:
            os.dup2(log.fileno(), 2)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("mqcore-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    session.sparkContext.setLogLevel("ERROR")
    return session


CONSOLE_URL = "http://127.0.0.1:8080/ui/"  # where `mqcore console` listens by default


def cli_command() -> str:
    """How to run this interpreter's `mqcore` command from here: `mqcore` when the shell finds
    this one (an activated venv or an install on PATH), else its path (`.venv/bin/mqcore` after
    `make demo`), else `python -m mqcore.cli` with this interpreter."""
    script = os.path.join(os.path.dirname(sys.executable), "mqcore")
    found = shutil.which("mqcore")
    if found is not None and os.path.realpath(found) == os.path.realpath(script):
        return "mqcore"
    if os.path.isfile(script) and os.access(script, os.X_OK):
        relative = os.path.relpath(script)
        return relative if not relative.startswith("..") else script
    return f"{sys.executable} -m mqcore.cli"


def run(path: str, messages: int, seed: int, out: TextIO, spark: Any = None) -> DemoReport:
    """The whole demo; returns what it wrote and found. With a SparkSession, it ends with a
    Spark SQL analysis of the stream read through the data source."""
    prepare(path)
    report = DemoReport(os.path.abspath(path))
    p = Printer(out)
    out.write(
        f"mqcore {mqcore.__version__} demo: {messages:,} messages into {path} (seed {seed})\n"
    )
    rng = random.Random(seed)
    n_access = messages * 3 // 5
    p.title("Generating a simulated hour of logs (not timed as part of mqcore)")
    (access, events), secs = timed(
        lambda: (access_logs(rng, n_access), app_events(rng, messages - n_access))
    )
    p.line(
        f"{len(access.values):,} nginx access lines + {len(events.values):,} JSON app events "
        f"in {secs:.2f} s"
    )
    p.line(f"e.g. {short(access.values[0])}")
    p.line(f"e.g. {short(events.values[0])}")

    p.title("Appending with append_batch (flush='interval': group commit in the background)")
    with mqcore.open(path) as store:
        store.create_topic(ACCESS, partitions=3, segment_bytes=4 << 20)
        store.create_topic(EVENTS, partitions=2, compression="zstd")
        total = write(store, p, ACCESS, access, None)
        total += write(store, p, EVENTS, events, None)
        _, secs = timed(store.flush)
        p.line(f"flush() (fdatasync of every partition + checkpoint) in {secs * 1000:.1f} ms")
        for topic in (ACCESS, EVENTS):
            report.written[topic] = sum(
                store.end_offset(topic, part) for part in range(store.partitions(topic))
            )
            size, segments = on_disk(path, topic)
            raw = (access if topic == ACCESS else events).payload_bytes
            p.line(
                f"{topic:<12} on disk: {mb(size)} in {segments} segment files "
                f"({size / raw:.2f} x the payload; "
                f"codec {store.topic_config(topic).compression})"
            )
        step_read(store, p, report, rng)
        step_time(store, p, report)
        step_arrow(store, p, report)
    step_reopen(path, p)
    step_crash(path, p, report)
    if spark is not None:
        p.title("Spark SQL over the store: spark.read.format('mqcore'), no broker")
        p.line(f"(Spark's own start-up messages and log: {SPARK_LOG})")
        report.spark = step_spark(path, p, spark)
    cli = cli_command()
    out.write(
        f"\nDone. Look around with the CLI:\n"
        f"   {cli} topics {path}\n"
        f"   {cli} consume {path} {EVENTS} -n 3 --json\n"
        f"   {cli} query {path} {EVENTS} --where \"level = 'ERROR'\" --limit 3\n"
    )
    activate = os.path.join(os.path.dirname(sys.executable), "activate")
    if cli != "mqcore" and os.path.isfile(activate):
        shown = os.path.relpath(activate)
        shown = shown if not shown.startswith("..") else activate
        out.write(f"   (or run `source {shown}` once, then plain `mqcore ...`)\n")
    # printed, not started: the demo never blocks (`make demo` runs it non-interactively)
    out.write(
        f"Browse it: {cli} console {path}\n"
        f"   then open {CONSOLE_URL} (read-only; Ctrl-C stops it; docs/console.md)\n"
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqcore.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--path", default="./demo-data", help="store directory, wiped first (default ./demo-data)"
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=200_000,
        help=f"messages in total, at least {MIN_MESSAGES} (default 200000)",
    )
    parser.add_argument("--seed", type=int, default=2024, help="random seed (default 2024)")
    parser.add_argument(
        "--no-spark",
        action="store_true",
        help="skip the Spark SQL step (it runs when PySpark is installed)",
    )
    args = parser.parse_args(argv)
    if args.messages < MIN_MESSAGES:
        parser.error(f"--messages must be at least {MIN_MESSAGES}")
    spark = None if args.no_spark else spark_session()
    try:
        run(args.path, args.messages, args.seed, sys.stdout, spark)
    finally:
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
