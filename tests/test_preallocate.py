"""Reserved space past the active segment's end (docs/format.md "Reserved space"): appends land
in blocks fallocate(FALLOC_FL_KEEP_SIZE) reserved; the file size, and so what readers and Kafka
tools see, is only the bytes written; the reserve is handed back on roll, on close and, after a
writer was killed, at the next writable open. Each reservation follows the partition's write
rate (a slow partition holds RESERVE_MIN, a busy one up to preallocate_bytes), and a store's
reservations together stay within its budget.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli
from crashchild import KILLED, run_child

import mqcore
from mqcore._ext.filespace import reserve
from mqcore.errors import InvalidConfigError
from mqcore.storage import segment

MiB = 1 << 20
MB_BATCH = [b"v" * 1000] * 1000  # 1 MB: written back to back, a rate of hundreds of MB/s


def _log(path: str, topic: str = "t", partition: int = 0) -> list[Path]:
    return sorted(Path(path, f"{topic}-{partition}").glob("*.log"))


def _allocated(file: Path) -> int:
    return os.stat(file).st_blocks * 512


def _supported(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    with open(probe, "wb") as f:
        return reserve(f.fileno(), 0, 4096) == 0


@pytest.fixture
def reserving(tmp_path: Path) -> None:
    if not _supported(tmp_path):
        pytest.skip("the filesystem under the test directory does not reserve space")


def test_reserve_keeps_the_size(tmp_path: Path, reserving: None) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 5000)
    with open(f, "r+b") as fh:
        assert reserve(fh.fileno(), 5000, 8 * MiB) == 0
        assert os.fstat(fh.fileno()).st_size == 5000
        assert _allocated(f) >= 8 * MiB
        assert f.read_bytes() == b"x" * 5000  # reading stops at the size, not the reserve
        os.ftruncate(fh.fileno(), 5000)  # truncating to its own size hands the blocks back
    assert _allocated(f) < MiB


def test_reserve_reports_errors_as_errno(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        assert reserve(w, 0, 4096) != 0  # a pipe has no blocks to reserve
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "f", "wb") as fh:
        with pytest.raises(ValueError, match="bad range"):
            reserve(fh.fileno(), -1, 10)
        with pytest.raises(ValueError, match="bad range"):
            reserve(fh.fileno(), 0, 0)


def test_active_segment_reserves_and_hands_back(store_path: str, reserving: None) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=1, preallocate_bytes=4 * MiB, segment_bytes=64 * MiB)
        for _ in range(3):  # the first reservation covers one batch; the rate then asks more
            s.append_batch("t", MB_BATCH)
        (log,) = _log(store_path)
        size = os.path.getsize(log)
        assert 3_000_000 < size < 3_300_000
        assert _allocated(log) >= size + MiB  # reserved past the end (4 MiB at that rate)
        # readers and other tools see exactly the batches written
        assert [m.value for m in s.read("t", 0, 0, max_records=5000)] == MB_BATCH * 3
    assert os.path.getsize(log) == size
    assert _allocated(log) < size + MiB  # close handed the reserve back
    code, out, err = run_cli("verify", store_path)
    assert code == 0, out + err


def test_roll_hands_back_the_sealed_segments_reserve(store_path: str, reserving: None) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=1, preallocate_bytes=2 * MiB, segment_bytes=300_000)
        for _ in range(6):
            s.append_batch("t", [b"r" * 1000] * 100)
        logs = _log(store_path)
        assert len(logs) >= 3
        for sealed in logs[:-1]:
            assert _allocated(sealed) < os.path.getsize(sealed) + MiB
        # the reserve never runs past the roll size: at most segment_bytes in all
        assert _allocated(logs[-1]) <= 300_000 + 200_000


def test_turned_off(store_path: str, reserving: None) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=1, preallocate_bytes=0)
        s.append_batch("t", [b"o" * 1000] * 100)
        (log,) = _log(store_path)
        assert _allocated(log) < os.path.getsize(log) + MiB
    with pytest.raises(InvalidConfigError, match="preallocate_bytes"):
        with mqcore.open(store_path) as s:
            s.create_topic("u", preallocate_bytes=-1)


_KILLED_WRITER = """
import os, signal, sys
import mqcore
s = mqcore.open(sys.argv[1], flush="always")
s.create_topic("t", partitions=1, preallocate_bytes=8 << 20)
for i in range(50):  # back to back: at this rate the reservation grows to 8 MiB
    s.append_batch("t", [b"k%d" % i] * 20000, partition=0)
print("acked", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_writers_reserve_is_handed_back_at_the_next_open(
    store_path: str, reserving: None
) -> None:
    child = run_child(_KILLED_WRITER, store_path, expect=KILLED, timeout=60)
    assert child.out == "acked\n"
    (log,) = _log(store_path)
    size = os.path.getsize(log)
    assert _allocated(log) >= 8 * MiB  # the dead writer's reserve is still there
    with mqcore.open(store_path, read_only=True) as ro:  # a reader changes nothing
        assert ro.end_offset("t", 0) == 50 * 20000
    assert _allocated(log) >= 8 * MiB
    with mqcore.open(store_path) as s:
        assert os.path.getsize(log) == size
        assert _allocated(log) < size + MiB  # handed back before anything else
        values = [m.value for m in s.read("t", 0, 0, max_records=50 * 20000)]
        assert values == [b"k%d" % i for i in range(50) for _ in range(20000)]


def test_slow_partition_reserves_in_proportion(store_path: str, reserving: None) -> None:
    """A partition written a message now and then holds RESERVE_MIN past its end, not the
    topic's preallocate_bytes: 1,000 of them cost 64 MiB of disk, not 16 GB (issue 20)."""
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=4)  # the default preallocate_bytes, 16 MiB
        for p in range(4):
            s.append("t", b"x" * 100, partition=p)
        for p in range(4):
            (log,) = _log(store_path, partition=p)
            assert _allocated(log) <= os.path.getsize(log) + segment.RESERVE_MIN + 4096


def test_a_stores_reservations_stay_within_its_budget(
    store_path: str, reserving: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Busy partitions each grow their reservation towards preallocate_bytes, but together
    they hold no more than the store's budget (STORE_RESERVE_BYTES); a write that finds it
    spent goes on without a reservation."""
    monkeypatch.setattr(segment, "STORE_RESERVE_BYTES", 3 * MiB)
    parts = 6
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=parts, preallocate_bytes=4 * MiB, segment_bytes=64 * MiB)
        for _ in range(3):
            for p in range(parts):
                s.append_batch("t", MB_BATCH, partition=p)
        logs = [_log(store_path, partition=p)[0] for p in range(parts)]
        ahead = sum(_allocated(log) - os.path.getsize(log) for log in logs)
        assert ahead <= 3 * MiB + parts * 64 * 1024  # the budget, plus extent slack
        for p in range(parts):
            assert [m.value for m in s.read("t", p, 0, max_records=5000)] == MB_BATCH * 3
    assert all(_allocated(log) < os.path.getsize(log) + MiB for log in logs)
