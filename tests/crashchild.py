"""The crash-child harness, written once: run a writer in a child process that dies mid-work
(at a named crash point, or by the parent's SIGKILL once it printed enough), then let the test
reopen what it left. Every crash, power-loss and kill test runs its children through run_child.

The child imports the mqcore these tests imported (conftest.child_env) and the helper modules
beside this file (powerloss, the workloads). It prints what it acknowledged, one line each; the
test compares the reopened store with those lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from conftest import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
KILLED = -signal.SIGKILL


@dataclass
class Child:
    """How a child ended: its exit status (negative: the signal), what it printed, and its
    whole lines (a line cut by the kill is dropped: it was never acknowledged)."""

    returncode: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return [ln.strip() for ln in self.out[: self.out.rfind("\n") + 1].splitlines()]


def helper_env() -> dict[str, str]:
    """conftest.child_env with this directory on PYTHONPATH (powerloss, the workloads)."""
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")]))
    return env


def child_argv(program: str, *args: str) -> list[str]:
    """A script file runs as itself; any other text is a Python snippet run with -c."""
    code = [program] if program.endswith(".py") and "\n" not in program else ["-c", program]
    return [sys.executable, *code, *args]


def run_child(
    program: str,
    *args: str,
    crash_at: str | None = None,
    kill_when: Callable[[list[str]], bool] | None = None,
    expect: int | None = None,
    timeout: float = 120,
) -> Child:
    """Run `program` with `args` to its end. `crash_at` ("point" or "point:N") sets
    MQCORE_CRASH_AT so mqcore.crashpoints kills it there; `kill_when(lines)` makes the parent
    SIGKILL it once the lines read so far satisfy it. Asserts the exit status: `expect`, or by
    default SIGKILL when a kill was asked for and 0 otherwise (stderr in the message)."""
    env = helper_env()
    if crash_at is not None:
        env["MQCORE_CRASH_AT"] = crash_at
    read: list[str] = []
    with subprocess.Popen(
        child_argv(program, *args),
        stdin=subprocess.PIPE,  # open until the child ends: a child may wait on it to be killed
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            if kill_when is None:
                out, err = proc.communicate(timeout=timeout)
            else:
                while not kill_when([ln.strip() for ln in read]):
                    line = proc.stdout.readline().decode()
                    if not line:
                        break
                    read.append(line)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout)
                # read through the buffered pipe: readline() may hold lines already read from
                # the fd, which communicate() (reading the fd itself) would lose
                out, err = proc.stdout.read(), proc.stderr.read()
        finally:
            if proc.poll() is None:  # a timeout or a failed check: leave no child behind
                proc.kill()
                proc.wait()
    child = Child(proc.returncode, "".join(read) + out.decode(), err.decode())
    if expect is None:
        expect = KILLED if crash_at is not None or kill_when is not None else 0
    assert child.returncode == expect, (child.returncode, child.err[-3000:], child.out[-300:])
    return child
