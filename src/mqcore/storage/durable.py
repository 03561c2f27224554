"""Durability primitives: the one place mqcore forces bytes and names to stable storage.

Every fdatasync, fsync and msync of a store goes through these functions, and so does every
small file replaced atomically (write a temp file, fsync it, rename it over, fsync the
directory). The power-loss tests keep a ledger of what was made durable and cut everything
else, as a power loss would (docs/operations.md "Durability", tests/powerloss.py): they wrap
os.fsync and os.fdatasync, which are looked up at each call for that, and see each msync
through `observer`.

Files are opened with O_NOFOLLOW: a store never writes through a symbolic link.
"""

from __future__ import annotations

import concurrent.futures
import errno
import mmap
import os
from collections.abc import Callable

from mqcore._ext.filespace import reserve
from mqcore._ext.mapping import MappedFile
from mqcore.crashpoints import crash_point
from mqcore.errors import StoreError

# Tests set this to fn(path): called just before each msync of a mapping of `path` (what it
# sees then is at most what the msync makes durable). None in normal use.
observer: Callable[[str], None] | None = None

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def sync_data(fd: int) -> None:
    """fdatasync: the file's bytes (and its size) reach stable storage (fsync on macOS, which
    has no fdatasync)."""
    getattr(os, "fdatasync", os.fsync)(fd)


def sync_file(fd: int) -> None:
    """fsync: the bytes and every attribute of the file."""
    os.fsync(fd)


def sync_dir(directory: str) -> None:
    """fsync a directory: the names created, renamed or removed in it become durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SYNC_THREADS = 8  # directories synced side by side by sync_dirs


def sync_dirs(directories: list[str]) -> None:
    """fsync many directories (a creation's new partition directories): side by side from a
    few threads when there are many, so the filesystem's journal commits them together. On
    this project's ext4 VM 1,000 directory fsyncs took 1.6 s one after another and 0.08 s
    from 8 threads; a creation of 2,000 partitions spent a third of its time in them."""
    if len(directories) <= 2:
        for directory in directories:
            sync_dir(directory)
        return
    with concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, "mqcore-sync") as pool:
        list(pool.map(sync_dir, directories))  # the first error, if any, raised here


def sync_mapping(m: MappedFile, path: str, start: int = 0, length: int | None = None) -> None:
    """msync a shared writable mapping of `path` (all of it, or [start, start + length))."""
    if observer is not None:
        observer(path)
    m.flush(start, -1 if length is None else length)


def open_file(path: str, flags: int, mode: int = 0o644) -> int:
    """os.open without following a symbolic link in the last component (ELOOP if it is one)."""
    return os.open(path, flags | NOFOLLOW, mode)


def open_store_file(path: str, flags: int, mode: int = 0o644) -> int:
    """open_file for a store's own files: a symbolic link is refused with StoreError (a link
    would let the store write, cut or truncate a file outside it)."""
    try:
        return open_file(path, flags, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError(
                f"{path} is a symbolic link: a store's files are never links (remove it)"
            ) from None
        raise


def back_pages(path: str, m: MappedFile, start: int, end: int) -> int:
    """Give the pages of [start, end) of a shared writable mapping of `path` their disk blocks
    before the mapping writes them: the first store into a hole of a mapped file takes a page
    fault that allocates the block under the filesystem's journal (ext4: ~5-10 ms each, seen
    here). fallocate allocates them without touching the data (unwritten blocks read as
    zeros): 16 MiB in 0.1 ms where a pwrite of what the pages hold took 45 ms; the pwrite is
    the fallback where the call is missing. Returns the page-aligned end reached."""
    start -= start % mmap.PAGESIZE
    end = min(len(m), -(-end // mmap.PAGESIZE) * mmap.PAGESIZE)
    if end <= start:
        return max(start, end)
    fd = open_store_file(path, os.O_WRONLY)
    try:
        if reserve(fd, start, end - start) == 0:
            return end
        with memoryview(m) as view:
            at = start
            while at < end:
                at += os.pwrite(fd, view[at:end], at)
    finally:
        os.close(fd)
    return end


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte (os.write may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_file(path: str, data: bytes | bytearray | memoryview, *, sync: bool = True) -> None:
    """Create or truncate `path`, write `data`, fsync it when `sync`."""
    fd = open_store_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        write_all(fd, data)
        crash_point("checkpoint.after_tmp_write")
        if sync:
            sync_file(fd)
            crash_point("checkpoint.after_fsync")
    finally:
        os.close(fd)


def write_atomic(
    path: str,
    data: bytes | bytearray | memoryview,
    *,
    sync: bool = True,
    tmp: str | None = None,
    sync_dir_now: bool = True,
) -> None:
    """Replace `path` by a file holding `data`, all or nothing across a crash.

    Written to `tmp` (default `path + ".tmp"`), fsync'd, renamed over `path`, and the directory
    fsync'd so the new name survives a power loss; with `sync=False` only the rename is atomic
    (a process kill never leaves a half-written file, a power loss may lose the new one).
    `sync_dir_now=False` leaves the directory's fsync to the caller, who makes several names
    of one directory durable with one fsync (docs/operations.md "Store lifecycle"): until then
    a power loss keeps the old file or the new one, whole either way.
    """
    tmp = tmp if tmp is not None else path + ".tmp"
    write_file(tmp, data, sync=sync)
    os.replace(tmp, path)
    crash_point("checkpoint.after_rename")
    if sync and sync_dir_now:
        sync_dir(os.path.dirname(path) or ".")


__all__ = [
    "back_pages",
    "open_file",
    "open_store_file",
    "sync_data",
    "sync_dir",
    "sync_file",
    "sync_mapping",
    "write_all",
    "write_atomic",
    "write_file",
]
