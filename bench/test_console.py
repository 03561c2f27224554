"""The operations console (issue 22) over real HTTP on a 2,000,000-message store, each query
side by side with the same question asked of the Store in process (the BASELINE: what the
console adds is HTTP, the page or JSON around the rows, and the escaped HTML of each row).

The console runs as `mqcore console STORE --http 127.0.0.1:0` in a process of its own (read-only,
as it is deployed; in the benchmark's process it would share one GIL with the client), and the
client keeps one HTTP/1.1 connection open, as a browser does. Goals (issue 22): a search by key
answers in under 100 ms, a content scan delivers its first page in under 1 s.

  key/lookup-page   GET /ui/lookup?q=KEY: the lookup box, the key searched in every topic
                    with a key index, the page rendered with its rows
  key/lookup-page-new-connections   the same, a new connection for each request
  key/rows          GET /ui/topics/logs/rows?key=KEY: the browser's key search, the one call
                    its script makes (the key index answers it whole)
  key/store         BASELINE: store.find_by_key("logs", KEY) in process
  scan/first-rows   the browser's content search as its script runs it: GET .../rows?contains=
                    with the previous chunk's cursor until a chunk brings rows
  scan/first-page   the same until the page (50 rows) is full or the scan ends; the needle is
                    in 20 messages, so the first page is a scan of the whole topic
  scan/store        BASELINE: store.search("logs", contains=NEEDLE, limit=50) in process

Figures: bench/README.md "Console".
"""

from __future__ import annotations

import http.client
import json
import random
import re
import selectors
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from benchdata import SEED, SEGMENT_BYTES, log_line, message_timestamp, record
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")

MESSAGES = 2_000_000
PARTITIONS = 2
TOPIC = "logs"
KEYS = 100_000  # distinct keys: 20 messages each
BATCH = 1000
NEEDLE = b"console-needle-7f3a"  # in NEEDLE_EVERY-th messages only: 20 of them
NEEDLE_EVERY = 100_000
PAGE = 50  # the browser's default page
LOOKUPS = 50  # keys per key benchmark, one request each per round
ROUNDS = 10


def key_of(i: int) -> bytes:
    return b"cust-%06d" % (i * 7919 % KEYS)


@dataclass
class ConsoleData:
    path: str
    store: mqcore.Store  # read-only, for the baselines and the truth
    url: str
    process: subprocess.Popen[str]
    needle_matches: int


def build(path: str) -> int:
    """MESSAGES log lines of ~200 bytes with keys, in batches of 1000 to the partitions in turn;
    every NEEDLE_EVERY-th line carries NEEDLE. Returns how many carry it."""
    rng = random.Random(SEED + 41)
    found = 0
    with mqcore.open(path, flush="os") as store:
        store.create_topic(TOPIC, partitions=PARTITIONS, segment_bytes=SEGMENT_BYTES)
        for lo in range(0, MESSAGES, BATCH):
            values = [log_line(rng, i) for i in range(lo, lo + BATCH)]
            for i in range(lo, lo + BATCH):
                if i % NEEDLE_EVERY == NEEDLE_EVERY // 2:
                    values[i - lo] += b" " + NEEDLE
                    found += 1
            stamps = [message_timestamp(i) for i in range(lo, lo + BATCH)]
            keys = [key_of(i) for i in range(lo, lo + BATCH)]
            store.append_batch(
                TOPIC, values, keys, partition=lo // BATCH % PARTITIONS, timestamps=stamps
            )
    return found


def start_console(path: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while sel.select(timeout=60):
            line = proc.stdout.readline()
            if not line:
                break
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            if found:
                return proc, found.group(0)
    proc.kill()
    proc.wait()
    raise RuntimeError("mqcore console printed no URL")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleData]:
    """The store, built once for the module, and `mqcore console` serving it."""
    path = str(tmp_path_factory.mktemp("console") / "store")
    matches = build(path)
    proc, url = start_console(path)
    try:
        with mqcore.open(path, read_only=True) as store:
            yield ConsoleData(path, store, url, proc, matches)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)  # and close its pipe


class Client:
    """GETs over one kept-alive HTTP/1.1 connection, as a browser's tab makes them."""

    def __init__(self, url: str):
        parts = urllib.parse.urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)

    def get(self, path: str) -> bytes:
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        body = response.read()
        assert response.status == 200, (path, response.status, body[:300])
        return body

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def client(data: ConsoleData) -> Iterator[Client]:
    c = Client(data.url)
    try:
        yield c
    finally:
        c.close()


def lookup_keys() -> list[bytes]:
    rng = random.Random(SEED + 43)
    return [key_of(rng.randrange(MESSAGES)) for _ in range(LOOKUPS)]


def rows_path(**fields: str | int) -> str:
    return f"/ui/topics/{TOPIC}/rows?" + urllib.parse.urlencode(fields)


def scan_chunks(client: Client, until_full: bool) -> tuple[int, int, str]:
    """The browser's content search as its script runs it: one chunk after the other with the
    previous chunk's cursor, page_left and scan_left shrinking as rows and records come;
    stops at the first chunk with rows, or (until_full) when the page is full or the scan
    ends. Returns (rows, chunks, last reason)."""
    shown = chunks = scanned = 0
    cursor: str | None = None
    reason = ""
    while True:
        fields: dict[str, str | int] = {"contains": NEEDLE.decode(), "limit": PAGE}
        if cursor is not None:
            fields.update(cursor=cursor, page_left=PAGE - shown, scan_left=10_000_000 - scanned)
        answer = json.loads(client.get(rows_path(**fields)))
        chunks += 1
        shown += answer["count"]
        scanned += answer["scanned_records"]
        reason, cursor = answer["reason"], answer["cursor"]
        if shown and not until_full:
            return shown, chunks, reason
        if shown >= PAGE or reason != "timeout":
            return shown, chunks, reason


def test_console_answers_agree(data: ConsoleData, client: Client) -> None:
    """The console's answers are the Store's: the same messages for keys and for the scan."""
    for key in lookup_keys()[:20]:
        truth = data.store.find_by_key(TOPIC, key, limit=100)
        assert truth.complete and len(truth) == MESSAGES // KEYS
        page = client.get("/ui/lookup?" + urllib.parse.urlencode({"q": key.decode()})).decode()
        shown = re.findall(r'data-partition="(\d+)" data-offset="(\d+)"', page)
        assert sorted((int(p), int(o)) for p, o in shown) == sorted(
            (m.partition, m.offset) for m in truth
        )
        answer = json.loads(client.get(rows_path(key=key.decode(), limit=100)))
        assert answer["count"] == len(truth) and answer["reason"] == "exhausted"
    truth = data.store.search(TOPIC, contains=NEEDLE, limit=PAGE)
    assert truth.complete and len(truth) == data.needle_matches == MESSAGES // NEEDLE_EVERY
    assert scan_chunks(client, until_full=True)[::2] == (len(truth), "exhausted")


def run_lookups(benchmark: BenchmarkFixture, case: str, fn: object) -> None:
    benchmark.group = "console-key"
    record(benchmark, case, ops=LOOKUPS)
    benchmark.pedantic(fn, rounds=ROUNDS, warmup_rounds=1, iterations=1)


def test_console_key_lookup_page(
    benchmark: BenchmarkFixture, data: ConsoleData, client: Client
) -> None:
    paths = ["/ui/lookup?" + urllib.parse.urlencode({"q": k.decode()}) for k in lookup_keys()]

    def lookups() -> None:
        for path in paths:
            client.get(path)

    run_lookups(benchmark, "console-key/lookup-page", lookups)


def test_console_key_lookup_page_new_connections(
    benchmark: BenchmarkFixture, data: ConsoleData
) -> None:
    """The same lookups, each on a connection of its own (as curl or urllib ask): no
    keep-alive, so no response waits on the client's delayed ACK (bench/README.md "Console")."""
    paths = ["/ui/lookup?" + urllib.parse.urlencode({"q": k.decode()}) for k in lookup_keys()]

    def lookups() -> None:
        for path in paths:
            client = Client(data.url)
            client.get(path)
            client.close()

    run_lookups(benchmark, "console-key/lookup-page-new-connections", lookups)


def test_console_key_rows(benchmark: BenchmarkFixture, data: ConsoleData, client: Client) -> None:
    paths = [rows_path(key=k.decode(), limit=PAGE) for k in lookup_keys()]

    def lookups() -> None:
        for path in paths:
            client.get(path)

    run_lookups(benchmark, "console-key/rows", lookups)


def test_console_key_store(benchmark: BenchmarkFixture, data: ConsoleData) -> None:
    """BASELINE: the same keys through Store.find_by_key in process."""
    keys, find = lookup_keys(), data.store.find_by_key

    def lookups() -> None:
        for key in keys:
            find(TOPIC, key, limit=100)

    run_lookups(benchmark, "console-key/store", lookups)


@pytest.mark.parametrize("until_full", [False, True], ids=["first-rows", "first-page"])
def test_console_scan(
    benchmark: BenchmarkFixture, data: ConsoleData, client: Client, until_full: bool
) -> None:
    benchmark.group = "console-scan"
    record(benchmark, f"console-scan/{'first-page' if until_full else 'first-rows'}", ops=1)
    benchmark.pedantic(
        scan_chunks, args=(client, until_full), rounds=ROUNDS, warmup_rounds=1, iterations=1
    )


def test_console_scan_store(benchmark: BenchmarkFixture, data: ConsoleData) -> None:
    """BASELINE: the first page of the same search through Store.search in process (one call,
    no chunks)."""
    benchmark.group = "console-scan"
    record(benchmark, "console-scan/store", ops=1)
    benchmark.pedantic(
        data.store.search,
        args=(TOPIC,),
        kwargs={"contains": NEEDLE, "limit": PAGE},
        rounds=ROUNDS,
        warmup_rounds=1,
        iterations=1,
    )
