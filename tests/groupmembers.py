"""Consumer group members in their own OS processes (tests/group_member.py), for the group
tests of `mqcore serve` (test_server_groups.py, test_server_consumer_protocol.py): a `Child`
runs one and reads what it prints; `wait_until` is their bounded wait."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import child_env

WAIT = 30.0  # seconds a bounded wait gives something that should happen soon
HERE = os.path.dirname(os.path.abspath(__file__))


def wait_until(what: Callable[[], Any], timeout: float = WAIT, why: str = "") -> Any:
    """Poll `what` until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {why or what}")
        time.sleep(0.02)


class Child:
    """A group member in its own process (tests/group_member.py: BOOTSTRAP GROUP TOPIC
    SESSION_MS, then its optional PROTOCOL and STALL_AFTER), its output read by a thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, session_ms: int, *extra: str):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "group_member.py"), bootstrap, group, topic,
             str(session_ms), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=child_env(), text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def assigned(self) -> set[int]:
        """Its latest assignment (the last "assigned" line)."""
        last = [ln for ln in list(self.lines) if ln.startswith("assigned ")]
        text = last[-1][len("assigned ") :] if last else ""
        return {int(p) for p in text.split(",") if p}

    def messages(self) -> list[tuple[int, int, str]]:
        """(partition, offset, value) of each message it processed, in order."""
        out = []
        for ln in list(self.lines):
            if ln.startswith("msg "):
                _, p, o, v = ln.split(" ", 3)
                out.append((int(p), int(o), v))
        return out

    def processed(self) -> list[str]:
        return [v for _, _, v in self.messages()]

    def close(self) -> None:
        """Close stdin (the member leaves the group and exits), bounded; kill if it hangs."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)
        self.reader.join(WAIT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
