"""The first hour with real logs (issue 32): a regex with a required literal against
`contains=` of that literal over the same few million access-log lines, and a time window read
in time order (the merge of query/merge.py) against the same window partition by partition.

The store holds ACCESS_LINES nginx-style lines of about 100 bytes in 4 partitions (a client's
lines in one partition, as `mqcore produce --key` puts them), one clock for all: LINES_PER_MS
lines a millisecond, so the log spans about 10 minutes. It is built once per module, from a
fixed seed, and read from the page cache. Figures: bench/README.md "The first hour with real
logs".
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from benchdata import record
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore

TOPIC = "access"
PARTITIONS = 4
ACCESS_LINES = 2_400_000
LINES_PER_MS = 4
T0 = 1_717_236_000_000  # 2024-06-01T10:00:00Z
BATCH = 1000
# a literal in about 1 line in 200, and a regex that needs it
LITERAL = b'"DELETE /api/orders/'
REGEX = rb'"DELETE /api/orders/[0-9]+ HTTP/1\.1" 5[0-9][0-9]'
NO_LITERAL = rb"[0-9]{3} [0-9]{6,}"  # no literal of two bytes: every line goes to RE2
WINDOW = (T0 + 120_000, T0 + 150_000)  # 30 s: 120,000 lines
PAGE = 1000


class AccessLog:
    """The built store and what a round reads."""

    def __init__(self, store: mqcore.Store, log_bytes: int, literal_lines: int) -> None:
        self.store = store
        self.log_bytes = log_bytes
        self.literal_lines = literal_lines


def access_line(rng: random.Random, i: int) -> tuple[bytes, bytes]:
    """(client, line): an nginx combined-log line of about 100 bytes."""
    client = b"10.0.%d.%d" % (rng.randrange(4), rng.randrange(64))
    method = rng.choices([b"GET", b"POST", b"PUT", b"DELETE"], [80, 14, 5, 1])[0]
    path = rng.choice([b"/api/orders/", b"/api/items/", b"/static/app.js?v=", b"/health?n="])
    status = rng.choices([200, 201, 304, 404, 500, 503], [70, 8, 10, 8, 2, 2])[0]
    line = b'%s - - "%s %s%d HTTP/1.1" %d %d %dms' % (
        client, method, path, rng.randrange(100_000), status, rng.randrange(50_000),
        rng.randrange(900),
    )  # fmt: skip
    return client, line


def build_access_log(path: str) -> AccessLog:
    rng = random.Random(32)
    store = mqcore.open(path, flush="os")
    store.create_topic(TOPIC, partitions=PARTITIONS, segment_bytes=256 << 20)
    literal_lines = 0
    for start in range(0, ACCESS_LINES, BATCH):
        lines = [access_line(rng, start + j) for j in range(BATCH)]
        literal_lines += sum(LITERAL in line for _, line in lines)
        stamps = [T0 + (start + j) // LINES_PER_MS for j in range(BATCH)]
        store.append_batch(TOPIC, [line for _, line in lines],
                           keys=[client for client, _ in lines], timestamps=stamps)  # fmt: skip
    store.flush()
    log_bytes = sum(
        store.search(TOPIC, contains=b"\x00\x01\x02", partition=p).scanned_bytes
        for p in range(PARTITIONS)
    )
    return AccessLog(store, log_bytes, literal_lines)


@pytest.fixture(scope="module")
def access(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AccessLog]:
    data = build_access_log(str(tmp_path_factory.mktemp("first-hour") / "store"))
    try:
        yield data
    finally:
        data.store.close()


def full_scan(data: AccessLog, **query: object) -> mqcore.QueryResult:
    r = data.store.search(TOPIC, limit=100_000, **query)  # type: ignore[arg-type]
    assert r.complete
    return r


def scan_round(benchmark: BenchmarkFixture, data: AccessLog, side: str) -> None:
    benchmark.group = "first-hour-regex"
    record(benchmark, f"first-hour-regex/{side}", nbytes=data.log_bytes, messages=ACCESS_LINES)


def test_contains_the_literal(benchmark: BenchmarkFixture, access: AccessLog) -> None:
    """search(contains=LITERAL): the kernel's CRC-and-needle pass, the lines holding it."""
    scan_round(benchmark, access, "contains")
    r = benchmark.pedantic(full_scan, args=(access,), kwargs={"contains": LITERAL},
                           rounds=5, warmup_rounds=1, iterations=1)  # fmt: skip
    assert len(r) == access.literal_lines
    benchmark.extra_info["scanned_bytes"] = r.scanned_bytes


def test_regex_with_a_literal(benchmark: BenchmarkFixture, access: AccessLog) -> None:
    """search(regex=REGEX): the literal prefilters in the kernel, RE2 runs on its lines."""
    scan_round(benchmark, access, "regex-literal")
    r = benchmark.pedantic(full_scan, args=(access,), kwargs={"regex": REGEX},
                           rounds=5, warmup_rounds=1, iterations=1)  # fmt: skip
    assert 0 < len(r) < access.literal_lines
    benchmark.extra_info["scanned_bytes"] = r.scanned_bytes  # the log's bytes, each once


def test_regex_without_a_literal(benchmark: BenchmarkFixture, access: AccessLog) -> None:
    """search(regex=NO_LITERAL): every line decoded and matched by RE2 (what every regex
    cost before the prefilter)."""
    scan_round(benchmark, access, "regex-no-literal")
    r = benchmark.pedantic(full_scan, args=(access,), kwargs={"regex": NO_LITERAL},
                           rounds=1, warmup_rounds=0, iterations=1)  # fmt: skip
    assert r.scanned_records == ACCESS_LINES
    benchmark.extra_info["scanned_bytes"] = r.scanned_bytes


def window_pages(data: AccessLog, order: str, limit: int, **query: object) -> int:
    """Every page of the window's query, by cursor; how many messages."""
    found, cursor = 0, None
    while True:
        r = data.store.search(TOPIC, start=WINDOW[0], end=WINDOW[1], limit=limit,  # type: ignore[arg-type]
                              cursor=cursor, order=order, **query)  # fmt: skip
        found += len(r)
        if r.complete:
            return found
        cursor = r.cursor


@pytest.mark.parametrize("order", ["time", "partition"])
def test_window_first_page(benchmark: BenchmarkFixture, access: AccessLog, order: str) -> None:
    """The first PAGE messages of the 30 s window: what `mqcore query --from --to` and the
    console show first."""
    benchmark.group = "first-hour-window-page"
    record(benchmark, f"first-hour-window-page/{order}", messages=PAGE)

    def page() -> int:
        r = access.store.search(TOPIC, start=WINDOW[0], end=WINDOW[1], limit=PAGE, order=order)
        return len(r)

    assert benchmark.pedantic(page, rounds=20, warmup_rounds=2, iterations=1) == PAGE


@pytest.mark.parametrize("order", ["time", "partition"])
def test_window_paged_to_its_end(
    benchmark: BenchmarkFixture, access: AccessLog, order: str
) -> None:
    """All 120,000 messages of the window, in pages of 10,000 by cursor."""
    benchmark.group = "first-hour-window-all"
    record(benchmark, f"first-hour-window-all/{order}", messages=120_000)
    found = benchmark.pedantic(window_pages, args=(access, order, 10_000),
                               rounds=5, warmup_rounds=1, iterations=1)  # fmt: skip
    assert found == (WINDOW[1] - WINDOW[0]) * LINES_PER_MS


@pytest.mark.parametrize("order", ["time", "partition"])
def test_window_sparse_filter(benchmark: BenchmarkFixture, access: AccessLog, order: str) -> None:
    """The window's lines holding LITERAL (about 1 in 200), pages of PAGE: the merge reads
    each partition's window for its few matches."""
    benchmark.group = "first-hour-window-sparse"
    record(benchmark, f"first-hour-window-sparse/{order}", messages=120_000)
    found = benchmark.pedantic(window_pages, args=(access, order, PAGE),
                               kwargs={"contains": LITERAL}, rounds=10, warmup_rounds=1,
                               iterations=1)  # fmt: skip
    assert 200 < found < 1200
