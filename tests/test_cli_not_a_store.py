"""A path that is not a store: every command that takes a STORE refuses it in one line, exit 1,
and creates or changes nothing (issue 17.1). Run through the real `mqcore` command in a
subprocess, with the whole directory around the path listed (names, sizes, mtimes) before and
after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli

import mqcore
from mqcore.errors import NotAStoreError, StoreError

# every command that takes a STORE, with the arguments it needs besides it
COMMANDS = [
    ["verify"],
    ["verify", "--repair"],
    ["stats"],
    ["topics"],
    ["topics", "--all"],
    ["consume", "{}", "orders"],
    ["get", "{}", "orders", "0", "0"],
    ["query", "{}", "orders", "--key", "k"],
    ["trace", "{}", "01a20488-e598-7c73-bc52-3263487f23cc"],
    ["compact", "{}", "orders"],
    ["retention"],
    ["groups"],
    ["console", "{}", "--http", "127.0.0.1:0"],
    ["console", "{}", "--http", "127.0.0.1:0", "--allow-write"],
    ["serve", "{}", "--listen", "127.0.0.1:0"],  # `mqcore serve ./lgos` (issue 32.3)
]


def listing(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under `root` (root included): kind, size and mtime in ns."""
    out = {}
    for entry in [root, *root.rglob("*")]:
        st = entry.lstat()
        kind = "dir" if entry.is_dir() else "file"
        out[str(entry.relative_to(root))] = (kind, st.st_size, st.st_mtime_ns)
    return out


def _argv(command: list[str], path: str) -> list[str]:
    if "{}" in command:
        return [path if a == "{}" else a for a in command]
    return [command[0], path, *command[1:]]


def _make(kind: str, tmp: Path) -> Path:
    if kind == "missing":
        return tmp / "typo"
    if kind == "empty":
        (tmp / "empty").mkdir()
        return tmp / "empty"
    if kind == "file":
        (tmp / "afile").write_bytes(b"not a store\n")
        return tmp / "afile"
    junk = tmp / "junk"
    (junk / "photos").mkdir(parents=True)
    (junk / "photos" / "a.jpg").write_bytes(b"\xff\xd8" * 100)
    (junk / "notes.txt").write_text("hello\n")
    (junk / "backup-1").mkdir()  # named like a partition, but it holds no segment
    (junk / "backup-1" / "readme").write_text("no .log here\n")
    return junk


@pytest.mark.parametrize("kind", ["missing", "empty", "file", "junk"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(a for a in c if a != "{}"))
def test_a_path_that_is_not_a_store_is_refused_and_left_alone(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    path = _make(kind, tmp_path)
    before = listing(tmp_path)
    rc, out, err = run_cli(*_argv(command, str(path)))
    assert listing(tmp_path) == before
    assert rc == 1, (out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqcore: error: "), err
    assert str(path) in lines[0]


@pytest.mark.parametrize("kind", ["missing", "empty", "file", "junk"])
def test_read_only_open_of_a_non_store_raises_and_writes_nothing(tmp_path: Path, kind: str) -> None:
    path = _make(kind, tmp_path)
    before = listing(tmp_path)
    with pytest.raises(NotAStoreError, match="not an mqcore store") as e:
        mqcore.open(str(path), read_only=True)
    assert isinstance(e.value, StoreError) and str(path) in str(e.value)
    with pytest.raises(NotAStoreError):
        mqcore.open(str(path), create=False)
    assert listing(tmp_path) == before


def test_open_creates_a_store_only_when_allowed(tmp_path: Path) -> None:
    """`mqcore.open(path)` creates a missing store, as sqlite3.connect does; after that, every
    kind of open takes it for a store, even before a topic exists."""
    path = str(tmp_path / "new")
    mqcore.open(path).close()
    for options in ({"read_only": True}, {"create": False}):
        with mqcore.open(path, **options) as s:
            assert s.topics() == []
    rc, out, err = run_cli("topics", path)
    assert rc == 0, err


def test_a_kafka_log_directory_still_opens_read_only(tmp_path: Path) -> None:
    """No mqcore-topics.json: `<topic>-<n>` directories with .log files make a Kafka log dir."""
    src = tmp_path / "src"
    with mqcore.open(str(src), flush="os") as s:
        s.create_topic("events", partitions=2)
        s.append("events", b"v", partition=1)
    kafka = tmp_path / "kafka"
    kafka.mkdir()
    for p in (0, 1):
        (kafka / f"events-{p}").mkdir()
        for name in os.listdir(src / f"events-{p}"):
            if name.endswith((".log", ".index", ".timeindex")):
                (kafka / f"events-{p}" / name).write_bytes(
                    (src / f"events-{p}" / name).read_bytes()
                )
    before = listing(tmp_path)
    with mqcore.open(str(kafka), read_only=True) as r:
        assert r.topics() == ["events"] and r.end_offset("events", 1) == 1
    rc, out, err = run_cli("topics", str(kafka))
    assert rc == 0 and "events" in out, err
    assert listing(tmp_path) == before
