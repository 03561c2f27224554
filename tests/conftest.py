"""Shared fixtures: a fresh store directory per test, and a guard against swallowed errors."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

import mqcore


def _import_root() -> str | None:
    """The directory a child process needs on PYTHONPATH to import the mqcore these tests
    imported: the source tree's src/ (PYTHONPATH=src or an editable install), or None for an
    installed copy, which the child finds in site-packages as the tests did."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mqcore.__file__)))
    installed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    installed.update(site.getsitepackages())
    return None if any(os.path.realpath(root) == os.path.realpath(d) for d in installed) else root


IMPORT_ROOT = _import_root()


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
    if IMPORT_ROOT is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [IMPORT_ROOT, env.get("PYTHONPATH")]))
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
