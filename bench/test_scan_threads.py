"""Scans on one core and on two (issue 36): `search` over one partition of five large
segments, `threads=1` against `threads=2` in the same run. With two threads the segment after
the one being read is scanned ahead on a helper thread. The ratio (time on one thread / time
on two) is the figure; two cores read memory about 1.8 times as fast as one on the test VM
when it is quiet (bench/README.md).

    .venv/bin/python -m pytest -q -p no:cacheprovider bench/test_scan_threads.py \\
        --benchmark-columns=min,median,max,rounds
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore

TOPIC = "lines"
SEGMENT_BYTES = 64 << 20
SEGMENTS = 5
ABSENT = b"no line holds this"


@pytest.fixture(scope="module")
def five_segments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mqcore.Store]:
    """One partition of five 64 MiB segments of ~200-byte log lines (plus the active one)."""
    path = tempfile.mkdtemp(prefix="bench-threads-", dir=tmp_path_factory.getbasetemp())
    try:
        with mqcore.open(path, create=True) as st:
            st.create_topic(TOPIC, segment_bytes=SEGMENT_BYTES)
            base = time.time_ns() // 1_000_000 - 3_600_000
            n = 0
            while len(st.log.partition(TOPIC, 0).segments) <= SEGMENTS:
                values = [b"2026-12-08T01:00:00Z INFO request %09d served by node-%d in %d ms "
                          b"path=/api/orders/%d status=200 bytes=%d" % (n + i, i % 7, i % 997,
                          n + i, i * 13 % 65536) for i in range(2000)]  # fmt: skip
                stamps = [base + (n + i) // 100 for i in range(2000)]
                st.append_batch(TOPIC, values, partition=0, timestamps=stamps)
                n += 2000
        with mqcore.open(path, read_only=True) as st:
            yield st
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("threads", [1, 2])
def test_search_threads(
    benchmark: BenchmarkFixture, five_segments: mqcore.Store, threads: int
) -> None:
    """search(contains=) of a needle no line holds: every byte of the five segments once."""
    benchmark.group = "scan-threads-search"

    def scan() -> int:
        r = five_segments.search(TOPIC, contains=ABSENT, max_scan=1 << 40, threads=threads)
        assert r.complete
        return int(r.scanned_bytes)

    scanned = benchmark.pedantic(scan, rounds=5, warmup_rounds=1, iterations=1)
    assert scanned > SEGMENTS * SEGMENT_BYTES * 0.9


@pytest.mark.parametrize("threads", [1, 2])
def test_search_tag_threads(
    benchmark: BenchmarkFixture, five_segments: mqcore.Store, threads: int
) -> None:
    """search(tag=) of a tag no line has: every record of the five segments decoded once."""
    benchmark.group = "scan-threads-tag"

    def scan() -> int:
        r = five_segments.search(TOPIC, tag="absent", max_scan=1 << 40, threads=threads)
        assert r.complete
        return int(r.scanned_records)

    assert benchmark.pedantic(scan, rounds=5, warmup_rounds=1, iterations=1) > 1_000_000
