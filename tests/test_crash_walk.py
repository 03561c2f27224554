"""Crash walk: kill a writer at every crash point, reopen, and check nothing acknowledged is lost.

tests/crash_workload.py runs in a child with MQCORE_CRASH_AT set and prints each acknowledged
append and commit; the parent reopens the store and checks every acknowledged message is there
with its value, except what retention or compaction legitimately removed, that committed
offsets did not go back, and that `mqcore verify` passes on the reopened store.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli
from crashchild import run_child

import mqcore
from mqcore.crashpoints import CRASH_POINTS, WALKED_ELSEWHERE

WORKLOAD = os.path.join(os.path.dirname(__file__), "crash_workload.py")

# later visits, so the crash lands after acknowledged data rather than at the first step
LATER_VISITS = [
    ("append.after_write", 25),
    ("append.after_index", 45),
    ("roll.after_new_segment", 6),
    ("index.after_trim", 7),
    ("checkpoint.after_fsync", 4),
    ("checkpoint.after_rename", 5),
    ("producer_snapshot.after_write", 4),
]
CASES = [(p, 1) for p in CRASH_POINTS if p not in WALKED_ELSEWHERE] + LATER_VISITS


def test_walk_lists_every_point() -> None:
    """A new crash point fails here until the walk covers it (CASES is built from the tuple)."""
    assert {p for p, _ in CASES} == set(CRASH_POINTS) - WALKED_ELSEWHERE
    assert len(set(CRASH_POINTS)) == len(CRASH_POINTS)


def _parse(
    stdout: str,
) -> tuple[list[tuple[str, int, str, str | None]], int | None, set[str], set[int]]:
    acked: list[tuple[str, int, str, str | None]] = []
    commit = None
    marks: set[str] = set()
    shared: set[int] = set()
    for line in stdout.splitlines():
        f = line.split()
        if f[0] == "A":
            acked.append((f[1], int(f[3]), f[4], f[5] if len(f) > 5 else None))
        elif f[0] == "C":
            commit = int(f[3])
        elif f[0] == "H":
            shared.update(int(o) for o in f[1:])
        else:
            marks.add(f[0])
    return acked, commit, marks, shared


@pytest.mark.parametrize(("point", "nth"), CASES)
def test_crash_and_reopen(tmp_path: Path, point: str, nth: int) -> None:
    path = str(tmp_path / "store")
    child = run_child(WORKLOAD, path, crash_at=f"{point}:{nth}")
    assert child.err == "", child.err
    acked, commit, marks, shared = _parse(child.out)
    assert "DONE" not in marks
    with mqcore.open(path) as s:
        topics = s.topics()
        r_start = s.start_offset("r") if "r" in topics else 0
        if "R" in marks:
            assert r_start == s.end_offset("r")  # retention finished: everything had expired
        elif "S" not in marks:
            assert r_start == 0  # retention never started
        compacted = "K" in marks
        last_of_key = {}
        for topic, offset, _, key in acked:
            if key is not None:
                last_of_key[(topic, key)] = offset
        for topic, offset, value, key in acked:
            msg = s.get(topic, 0, offset)
            if topic == "r" and offset < r_start:
                assert msg is None
                continue
            if msg is None and compacted and key is not None:
                assert last_of_key[(topic, key)] > offset, (topic, offset, key)
                continue
            assert msg is not None, (point, topic, offset)
            assert msg.value == value.encode()
            if topic == "k":  # the key index a growth replaced answers for every key
                assert [m.offset for m in s.find_by_key("k", key or "")] == [offset]
        if commit is not None:
            c = s.consumer("g", ["t"])
            committed = c.committed("t", 0)
            c.close()
            assert committed is not None and committed >= commit
        if shared:  # accepted by a share commit that returned: never delivered again
            sc = s.share_consumer("sg", "t", explicit_ack=True)
            again = sc.poll(max_records=1000)
            for m in again:
                sc.acknowledge(m, "release")
            sc.close()
            assert not shared & {m.offset for m in again}, (point, sorted(shared))
    code, out, err = run_cli("verify", path)
    assert code == 0, out + err
