"""`mqcore serve` and the store it is given (issue 32.3): a path that is not a store is made
only with --create (tests/test_cli_not_a_store.py has the refusals), and while it serves, a
command refused the writer lock names it ("mqcore serve on HOST:PORT, pid N") and says what
to do instead: produce through it with a Kafka client, or stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import child_env, run_cli

import mqcore
from mqcore.errors import StoreLockedError
from mqcore.storage.logdir import describe_holder

pytest.importorskip("kio", reason="mqcore serve needs the server extra")
WAIT = 60.0


def serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "serve", *args, "--listen", "127.0.0.1:0"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    """(store path, bootstrap address, pid) of a `mqcore serve --create` of a new path."""
    path = str(tmp_path / "data")
    with serve(path, "--create") as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once it listens
        assert line.startswith(f"mqcore: serving {path} to Kafka clients on "), line
        try:
            yield path, line.split()[-1], proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(WAIT) == 0


def test_create_makes_a_store_and_the_lock_names_the_server(
    served: tuple[str, str, int],
) -> None:
    path, bootstrap, pid = served
    holder = f"mqcore serve on {bootstrap}, pid {pid}"
    rc, out, err = run_cli("produce", path, "orders", "--create", "--value", "x")
    assert rc == 1 and out == ""
    assert err == (
        f"mqcore: error: {path} is open for writing by another process ({holder}), and mqcore "
        f"produce needs its writer lock: produce through it with a Kafka client (kcat -P -b "
        f"{bootstrap} -t orders), or stop it and run this again\n"
    )
    # the other commands that need the lock name it too, and the API's error carries it
    rc, _, err = run_cli("retention", path)
    assert rc == 1 and f"which another process holds ({holder})" in err
    with pytest.raises(StoreLockedError) as e:
        mqcore.open(path)
    assert e.value.holder == holder
    # readers are not refused: the store serve made is a store
    rc, out, err = run_cli("topics", path)
    assert rc == 0, err


def test_only_the_holder_describes_itself(tmp_path: Path) -> None:
    """describe_holder writes only while this process holds the lock; the next writer's open
    replaces what it said."""
    path = str(tmp_path / "s")
    with mqcore.open(path):
        assert describe_holder(path, "my loader\nwith a line break")
        with open(os.path.join(path, ".mqcore.lock")) as f:
            assert f.read() == f"{os.getpid()} open my loader with a line break\n"
        with pytest.raises(StoreLockedError, match=r"\(my loader with a line break, pid \d+\)"):
            mqcore.open(path)
    assert not describe_holder(path, "not the holder")  # closed: nothing written
    with mqcore.open(path):
        with open(os.path.join(path, ".mqcore.lock")) as f:
            assert f.read() == f"{os.getpid()} open\n"
    with mqcore.open(path, read_only=True):
        assert not describe_holder(path, "a reader")


def test_serve_without_create_refuses_a_typo_and_leaves_a_folder_alone(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"\xff\xd8")
    with serve(str(folder)) as proc:
        assert proc.wait(WAIT) == 1
        assert proc.stderr is not None and proc.stdout is not None
        err = proc.stderr.read()
        assert proc.stdout.read() == ""
    assert err.startswith(f"mqcore: error: {folder} is not an mqcore store or Kafka log ")
    assert err.endswith(" (pass --create to make a new store there)\n") and err.count("\n") == 1
    assert sorted(os.listdir(folder)) == ["a.jpg"]
