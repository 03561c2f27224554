"""A read-only process beside a live writer that appends, rolls, compacts and deletes: every
open at any moment sees a consistent prefix of each partition (docs/operations.md "Readers
beside a writer"): no hole, no stranger, no key missing from the compacted topic, no false
corruption report and no exception that is not mqcore's.

Runs MQCORE_LIVE_READER_SECONDS (default 8) seconds of opens; longer under MQCORE_SOAK_SECONDS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import child_env

import mqcore

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = 40


def seconds() -> float:
    soak = os.environ.get("MQCORE_SOAK_SECONDS")
    return float(soak) if soak else float(os.environ.get("MQCORE_LIVE_READER_SECONDS", "8"))


def check_open(path: str) -> tuple[int, int]:
    """Open read-only, read both topics whole, check them; (plain records, compacted keys)."""
    with mqcore.open(path, read_only=True) as s:
        start, end = s.start_offset("plain", 0), s.end_offset("plain", 0)
        got = s.read("plain", 0, start, 1 << 30)
        assert [m.offset for m in got] == list(range(start, end)), "hole in plain"
        for m in got:
            assert m.value == b"p%d" % m.offset + b"." * 40, (m.offset, m.value)
        latest: dict[bytes, int] = {}
        cstart = s.start_offset("compacted", 0)
        for m in s.read("compacted", 0, cstart, 1 << 30):
            assert m.key is not None and m.value is not None
            name, version = m.value.split(b":")
            assert name == m.key
            assert int(version) >= latest.get(m.key, -1), "a key went back in time"
            latest[m.key] = int(version)
        assert sorted(latest) == sorted(b"k%d" % i for i in range(KEYS)), (
            f"keys missing: {sorted(set(b'k%d' % i for i in range(KEYS)) - set(latest))}"
        )
        return len(got), len(latest)


def test_reader_beside_a_compacting_deleting_writer(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    writer = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "live_writer.py"), path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert writer.stdout is not None and writer.stdin is not None
    try:
        assert writer.stdout.readline() == b"READY\n"
        opens, failures = 0, []
        deadline = time.monotonic() + seconds()
        while time.monotonic() < deadline:
            try:
                check_open(path)
            except (AssertionError, Exception) as e:  # noqa: BLE001 - collected below
                failures.append(f"{type(e).__module__}.{type(e).__name__}: {e}")
            opens += 1
    finally:
        out, err = writer.communicate(b"", timeout=60)  # stdin closes: the writer stops
    assert writer.returncode == 0, err.decode()
    assert out.startswith(b"DONE"), out
    rounds = int(out.split()[1])
    print(f"{opens} opens beside {rounds} writer rounds; {len(failures)} failures")
    assert not failures, f"{len(failures)} of {opens} opens failed: " + "; ".join(
        sorted(set(failures))[:8]
    )
    assert rounds > 100 and opens > 20


def test_consumer_poll_pins_what_it_reads(tmp_path: Path, monkeypatch: Any) -> None:
    """A consumer's fetch picked its segments under the lock but did not pin them: retention
    (in this process) closing a segment between that moment and the read made poll() raise
    StoreClosedError. The race is made exact here: retention runs inside the fetch, right when
    it starts reading the first segment."""
    from mqcore.storage.segment import LogSegment

    with mqcore.open(str(tmp_path / "s"), flush="os", retention_check_interval_ms=1 << 40) as s:
        s.create_topic("t", partitions=1, segment_bytes=2048, retention_ms=1000)
        for i in range(60):
            s.append("t", b"v%d" % i + b"." * 60, timestamp=10_000 + i)
        assert len(s.segment_offsets("t", 0)) > 2
        real_view = LogSegment.view
        fired: list[int] = []

        def view_after_retention(seg: LogSegment, start: int, limit: int) -> memoryview:
            if not fired:
                fired.append(s.apply_retention("t", now=1 << 50).deleted_bytes)
            return real_view(seg, start, limit)

        consumer = s.consumer("g", ["t"], auto_offset_reset="earliest")
        monkeypatch.setattr(LogSegment, "view", view_after_retention)
        got = consumer.poll(max_records=1000, timeout_ms=0)
        monkeypatch.undo()
        consumer.close()
    assert fired and fired[0] > 0  # retention did take the segments the fetch had picked
    assert [m.offset for m in got] == list(range(60))  # ...and the fetch read them whole
