"""Power-loss simulation: a ledger of what mqcore made durable, and the disk a power cut leaves.

`install(root, ledger)` wraps os.fsync and os.fdatasync and sets mqcore.storage.durable.observer
(msync) in the process under test (the test's own, or a writer child that a test kills; a child
installs it before importing mqcore). Before each sync of a file under `root` it copies the
file's bytes as they are then (sparse, keyed by inode, so renames follow the file); before each
directory fsync it records the directory's names. Those are at most what the sync makes
durable, so the model never keeps a byte the disk might not have.

`power_cut(root, ledger, out, mode)` then builds the directory tree a power loss would leave:
- a directory lists exactly the names it held at its last fsync (none if it was never synced;
  the root itself survives), so a file created, renamed or deleted since comes back as it was;
- a file holds the bytes of its last sync; what was never synced is cut off (mode "cut") or
  reads back as zeros up to the size the file has now (mode "zero": the size reached the disk,
  the data did not), a file never synced at all being empty or all zeros.
What existed before `install` (and was not synced since) counts as durable: a test sets up its
starting state, then installs the ledger.

The ledger lives in files, so several processes (a killed writer, the next one) share it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from typing import Any

_SEEK_DATA = getattr(os, "SEEK_DATA", None)
_SEEK_HOLE = getattr(os, "SEEK_HOLE", None)


def _copy_sparse(src_fd: int, dst_path: str) -> int:
    """Copy the file behind src_fd to dst_path keeping its holes; returns its size."""
    size = os.fstat(src_fd).st_size
    tmp = dst_path + ".part"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(out, size)
        pos = 0
        while pos < size:
            start, end = pos, size
            if _SEEK_DATA is not None and _SEEK_HOLE is not None:
                try:
                    start = os.lseek(src_fd, pos, _SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                end = os.lseek(src_fd, start, _SEEK_HOLE)
            at = start
            while at < end:
                chunk = os.pread(src_fd, min(1 << 20, end - at), at)
                if not chunk:
                    break
                os.pwrite(out, chunk, at)
                at += len(chunk)
            pos = end
    finally:
        os.close(out)
    os.replace(tmp, dst_path)
    return size


class Ledger:
    """What was made durable under `root`, kept in the directory `path`."""

    def __init__(self, root: str, path: str):
        self.root = os.path.realpath(root)
        self.path = path
        os.makedirs(os.path.join(path, "files"), exist_ok=True)
        os.makedirs(os.path.join(path, "dirs"), exist_ok=True)

    def _dir_key(self, directory: str) -> str | None:
        rel = os.path.relpath(os.path.realpath(directory), self.root)
        if rel.startswith(".."):
            return None
        return rel.replace(os.sep, "|")

    def _under_root(self, path: str) -> bool:
        return not os.path.relpath(path, self.root).startswith("..")

    def fd_synced(self, fd: int) -> None:
        """os.fsync / os.fdatasync of `fd` is about to run."""
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if where.endswith(" (deleted)") or not self._under_root(where):
            return
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            self.dir_synced(where)
        else:
            self.file_synced(fd)

    def file_synced(self, fd: int) -> None:
        st = os.fstat(fd)
        start = time.monotonic_ns()
        readable = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)  # fd may be write-only
        try:
            size = _copy_sparse(readable, os.path.join(self.path, "files", str(st.st_ino)))
        finally:
            os.close(readable)
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = "?"
        # one line per sync, one write: (start ns, inode, bytes, path) for tests that ask
        # which appends a sync covered
        line = f"{start} {st.st_ino} {size} {where}\n".encode()
        fd_j = os.open(os.path.join(self.path, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd_j, line)
        finally:
            os.close(fd_j)

    def path_synced(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self.file_synced(fd)
        finally:
            os.close(fd)

    def dir_synced(self, directory: str) -> None:
        key = self._dir_key(directory)
        if key is None:
            return
        names = {
            e.name: [e.inode(), e.is_dir(follow_symlinks=False)] for e in os.scandir(directory)
        }
        tmp = os.path.join(self.path, "dirs", key + ".part")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(names, f)
        os.replace(tmp, os.path.join(self.path, "dirs", key + ".json"))

    def snapshot_existing(self) -> None:
        """Count what is under root now as durable (the test's starting state)."""
        for directory, dirs, files in os.walk(self.root):
            self.dir_synced(directory)
            for name in files:
                self.path_synced(os.path.join(directory, name))
            dirs.sort()


_REAL: dict[str, Callable[[int], None]] = {}


def install(root: str, ledger: str) -> Ledger:
    """Start keeping the ledger in this process (a new ledger first records what exists)."""
    fresh = not os.path.isdir(os.path.join(ledger, "files"))
    led = Ledger(root, ledger)
    if fresh and os.path.isdir(root):
        led.snapshot_existing()
    for name in ("fsync", "fdatasync"):
        real = _REAL.setdefault(name, getattr(os, name))

        def synced(fd: int, real: Callable[[int], None] = real) -> None:
            led.fd_synced(fd)
            real(fd)

        setattr(os, name, synced)
    _set_map_observer(led.path_synced)
    return led


def _set_map_observer(fn: Callable[[str], None] | None) -> None:
    try:
        from mqcore.storage import durable
    except ImportError:  # a tree from before storage/durable.py: its msyncs go unseen
        return
    durable.observer = fn


def uninstall() -> None:
    for name, real in _REAL.items():
        setattr(os, name, real)
    _set_map_observer(None)


def sync_journal(ledger: str) -> list[tuple[int, int, int, str]]:
    """Every file sync the ledger saw: (monotonic start ns, inode, bytes kept, path)."""
    path = os.path.join(ledger, "journal")
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            start, inode, size, where = line.rstrip("\n").split(" ", 3)
            out.append((int(start), int(inode), int(size), where))
    return out


def _current_sizes(root: str) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(directory, name))
            sizes[st.st_ino] = st.st_size
    return sizes


def power_cut(root: str, ledger: str, out: str, mode: str = "cut") -> dict[str, Any]:
    """Write into `out` the tree a power loss leaves of `root`; returns what it did (for a
    failing test's message): files kept whole, cut, zero-filled, lost or resurrected."""
    assert mode in ("cut", "zero"), mode
    led = Ledger(root, ledger)
    sizes = _current_sizes(led.root)
    report: dict[str, Any] = {"cut": [], "zeroed": [], "resurrected": [], "lost": []}
    present = set()
    for directory, _dirs, files in os.walk(led.root):
        for name in files:
            present.add(os.path.relpath(os.path.join(directory, name), led.root))
    if os.path.exists(out):
        shutil.rmtree(out)
    _rebuild_dir(led, "", out, sizes, mode, report, present)
    return report


def _listing(led: Ledger, rel: str) -> dict[str, list[Any]]:
    key = rel.replace(os.sep, "|") if rel else "."
    path = os.path.join(led.path, "dirs", key + ".json")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data: dict[str, list[Any]] = json.load(f)
    return data


def _rebuild_dir(
    led: Ledger,
    rel: str,
    out: str,
    sizes: dict[int, int],
    mode: str,
    report: dict[str, Any],
    present: set[str],
) -> None:
    os.makedirs(out, exist_ok=True)
    for name, (inode, is_dir) in sorted(_listing(led, rel).items()):
        child = os.path.join(rel, name) if rel else name
        target = os.path.join(out, name)
        if is_dir:
            _rebuild_dir(led, child, target, sizes, mode, report, present)
            continue
        synced = os.path.join(led.path, "files", str(inode))
        now = sizes.get(inode)
        if child not in present:
            report["resurrected"].append(child)
        if os.path.exists(synced):
            shutil.copyfile(synced, target)
            kept = os.path.getsize(synced)
        else:
            open(target, "wb").close()
            kept = 0
            report["lost"].append(child)
        if now is not None and now > kept:
            if mode == "zero":
                os.truncate(target, now)  # the unsynced tail reads back as zeros
                report["zeroed"].append(f"{child}@{kept}+{now - kept}")
            else:
                report["cut"].append(f"{child}@{kept}-{now}")
