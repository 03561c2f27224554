"""Disk full: a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored, so writes fail with EFBIG as they
would with ENOSPC) makes appends fail with a clean OSError, never a crash or a partial batch; the
store then closes, reopens with every acknowledged message, and appends once space is back.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli
from crashchild import run_child

import mqcore

WORKLOAD = os.path.join(os.path.dirname(__file__), "disk_full_workload.py")


@pytest.mark.parametrize(
    ("limit", "indexes"),
    [
        (100_000, "small"),  # the log write itself hits the limit mid-segment
        (200_000, "default"),  # the offset index's 10 MiB preallocation hits it first
    ],
)
def test_disk_full_is_a_clean_error(tmp_path: Path, limit: int, indexes: str) -> None:
    path = str(tmp_path / "store")
    child = run_child(WORKLOAD, path, str(limit), str(1 << 20), indexes)
    assert child.err == ""
    lines = child.out.splitlines()
    errors = [line for line in lines if line.startswith("E ")]
    assert errors == ["E OSError 27"], lines[-5:]  # EFBIG
    assert "UNEXPECTED" not in lines
    assert lines[-1] == "DONE"
    acked = [line.split() for line in lines if line.startswith("A ")]
    offsets = [int(a[1]) for a in acked]
    assert offsets == list(range(len(offsets)))  # no offset skipped or reused by the failures
    assert acked[-1][2] == "after-4"
    with mqcore.open(path) as s:
        assert s.end_offset("t") == len(acked)
        for _, offset, value in acked:
            msg = s.get("t", 0, int(offset))
            assert msg is not None and msg.value == value.encode()
        s.append("t", b"reopened", partition=0)
    code, out, err = run_cli("verify", path)
    assert code == 0, out + err
