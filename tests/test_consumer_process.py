"""Consumers in real processes killed with SIGKILL: what was not committed is delivered again,
nothing is lost, and every commit that returned survives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import child_env

import mqcore

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")

CHILD = textwrap.dedent(
    """
    import sys, mqcore
    path, mode = sys.argv[1], sys.argv[2]
    store = mqcore.open(path, flush="os")
    c = store.consumer("g", "t")
    if mode == "half":
        first = c.poll(60)
        c.commit()
        second = c.poll(60)
        for m in first + second:
            print(m.partition, m.offset, flush=True)
        print("uncommitted", len(second), flush=True)
        sys.stdin.readline()  # killed here, before a second commit
    else:
        while True:
            msgs = c.poll(7)
            if not msgs:
                break
            c.commit()
            print("committed", c.committed("t", 0), c.committed("t", 1), flush=True)
        print("done", flush=True)
        sys.stdin.readline()
    """
)


def spawn(path: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, path, mode],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)  # reaps it and closes the pipes
    assert proc.returncode == -signal.SIGKILL


def make(path: str, n: int) -> set[tuple[int, int]]:
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t", partitions=2)
        for p in range(2):
            store.append_batch("t", [f"{p}-{i}".encode() for i in range(n)], partition=p)
    return {(p, i) for p in range(2) for i in range(n)}


def test_killed_before_commit_redelivers_and_loses_nothing(store_path: str) -> None:
    everything = make(store_path, 100)
    proc = spawn(store_path, "half")
    assert proc.stdout is not None
    seen: list[tuple[int, int]] = []
    while True:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        if line.startswith("uncommitted"):
            assert int(line.split()[1]) == 60
            break
        p, o = map(int, line.split())
        seen.append((p, o))
    kill(proc)
    assert len(seen) == 120
    committed, uncommitted = set(seen[:60]), set(seen[60:])
    with mqcore.open(store_path, flush="os") as store:
        c = store.consumer("g", "t")
        again = set()
        while msgs := c.poll(500):
            again |= {(m.partition, m.offset) for m in msgs}
        c.commit()
        c.close()
    assert uncommitted <= again  # delivered again
    assert not committed & again  # what was committed is not
    assert committed | again == everything  # none lost


def test_commits_survive_kill_9(store_path: str) -> None:
    make(store_path, 50)
    proc = spawn(store_path, "loop")
    assert proc.stdout is not None
    last = None
    for _ in range(6):
        line = proc.stdout.readline()
        assert line.startswith("committed"), line + (proc.stderr.read() if proc.stderr else "")
        last = tuple(int(x) if x != "None" else None for x in line.split()[1:])
    kill(proc)  # mid-loop: the commits that returned were printed after they were durable
    with mqcore.open(store_path, flush="os") as store:
        c = store.consumer("g", "t")
        now = (c.committed("t", 0), c.committed("t", 1))
        assert now[0] is not None and last is not None
        assert (now[0] or 0) + (now[1] or 0) >= (last[0] or 0) + (last[1] or 0)
        c.close()
    proc = spawn(store_path, "loop")
    assert proc.stdout is not None
    lines = []
    while not (line := proc.stdout.readline()).startswith("done"):
        assert line, proc.stderr.read() if proc.stderr else ""
        lines.append(line)
    kill(proc)
    with mqcore.open(store_path, flush="os") as store:
        c = store.consumer("g", "t")
        assert (c.committed("t", 0), c.committed("t", 1)) == (50, 50)
        assert c.poll() == []
        c.close()
