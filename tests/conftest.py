"""Shared fixtures: a fresh store directory per test, and a guard against swallowed errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import mqcore

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    """A path for a new store (the directory does not exist yet)."""
    return str(tmp_path / "store")


@pytest.fixture
def store(store_path: str) -> Iterator[mqcore.Store]:
    """An open store with flush="os" (fast); closed after the test."""
    s = mqcore.open(store_path, flush="os")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(autouse=True)
def no_unraisable_errors(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Fail a test whose run printed 'Exception ignored' (an error swallowed in __del__, a
    callback or a thread): fastavro's habit, since such errors hide real bugs."""
    yield
    _out, err = capfd.readouterr()
    sys.stderr.write(err)
    assert "Exception ignored" not in err, err


def file_bytes(path: str) -> dict[str, bytes]:
    """Every file under `path` with its content: proves that an error or a reader wrote nothing."""
    files = {}
    for root, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = f.read()
    return files


def child_env() -> dict[str, str]:
    """Environment for subprocesses that import mqcore (writer processes killed by tests)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(*argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run the `mqcore` command as a subprocess: (exit status, stdout, stderr). No run may
    end in a traceback: every failure is a one-line error or a usage message."""
    proc = subprocess.run(
        [sys.executable, "-m", "mqcore.cli", *argv],
        env=child_env(),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=120,
        check=False,
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert "Traceback" not in err, err
    return proc.returncode, out, err
