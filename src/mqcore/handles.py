"""Read-only store handles kept per process and reopened when the store changed on disk: for
Spark's planner and tasks, and for the HTTP server and console over a store it does not write
(`mqcore console`), which must show what a writer appended since.

Spark reuses its Python workers (spark.python.worker.reuse, on by default): the process that
plans a read or runs a task runs the next one too. A task that opened the store anew each time
paid the open (topics, checkpoints, every partition's newest segment and its indexes) and,
because each open maps the segments afresh, a page-table fault per 64 KiB of log it read.
`shared_store` keeps one read-only Store per path instead, valid for as long as the store's
generation is unchanged; each HTTP request of a read-only console borrows it the same way.

A read-only Store sees the log as it was when it opened (docs/architecture.md "Processes"), so
a kept handle must not outlive a change on disk. The generation is the name, inode, size and
modification time of every entry of the store directory and of each directory in it (the
partitions): an append grows the active `.log` (its reservation does not count in its size:
fallocate KEEP_SIZE), a roll or retention adds or removes segment files, compaction and every
metadata file (topics, checkpoints, log start offsets, the writer's lock file and the
clean-shutdown marker) are replaced by a rename, so their inode changes, and a topic deleted and
created again gets new directories. The generation is taken before the open: a change while
the store opens makes the next generation differ, so the handle is reopened rather than
trusted. A store whose directory is gone or changed is closed and opened again, and then fails
or reads as a fresh open would.

A handle is lent (`with shared_store(path) as store:`), never closed while lent: a handle
replaced or evicted while a task still reads through it is closed when that task is done. A
handle nobody has borrowed for IDLE_SECONDS is closed by a background thread: an open store
keeps the files of the segments it has read open, and retention's deletions free their disk
space only once the last descriptor goes, so an idle Spark worker must not pin them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator

import mqcore
from mqcore.errors import NotAStoreError
from mqcore.store import Store

MAX_STORES = 4  # paths kept per process; the least recently used idle one is closed beyond
IDLE_SECONDS = 30.0  # a handle not lent for this long is closed

Generation = tuple[tuple[object, ...], ...]


class _Kept:
    """One kept handle: the generation it was opened at, how many callers hold it now, and
    when the last one gave it back."""

    __slots__ = ("generation", "idle_since", "retired", "store", "users")

    def __init__(self, generation: Generation, store: Store):
        self.generation, self.store = generation, store
        self.users = 0
        self.idle_since = time.monotonic()
        self.retired = False  # replaced or evicted: closed when the last user gives it back

    def retire(self) -> None:
        self.retired = True
        if self.users == 0:
            self.store.close()


_lock = threading.Lock()
_stores: OrderedDict[str, _Kept] = OrderedDict()
_reaper: threading.Thread | None = None
_wake = threading.Event()  # set_idle_seconds: the reaper takes the new interval now


def store_generation(path: str) -> Generation:
    """What a read-only open of `path` depends on, as (where, name, inode, size, mtime) rows;
    OSError (FileNotFoundError, NotADirectoryError) when it is not a readable directory."""
    rows: list[tuple[object, ...]] = []
    with os.scandir(path) as top:
        for entry in top:
            # an entry removed while listed (retention, a deletion) is left out, as the open
            # that follows will not see it either
            with contextlib.suppress(FileNotFoundError):
                st = entry.stat(follow_symlinks=False)
                rows.append(("", entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
                if entry.is_dir(follow_symlinks=False):
                    rows += _directory_rows(entry.name, entry.path)
    rows.sort()
    return tuple(rows)


def _directory_rows(name: str, path: str) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    with os.scandir(path) as inner:
        for item in inner:
            with contextlib.suppress(FileNotFoundError):
                st = item.stat(follow_symlinks=False)
                rows.append((name, item.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return rows


@contextlib.contextmanager
def shared_store(path: str) -> Iterator[Store]:
    """Lend the read-only Store of `path` as it is on disk now, shared by the callers of this
    process (do not close it); opened, or reopened, when the generation changed."""
    kept = _borrow(os.path.abspath(path))
    try:
        yield kept.store
    finally:
        with _lock:
            kept.users -= 1
            kept.idle_since = time.monotonic()
            if kept.retired and kept.users == 0:
                kept.store.close()


def _borrow(key: str) -> _Kept:
    global _reaper
    with _lock:
        kept = _stores.pop(key, None)
        try:
            generation = store_generation(key)
        except OSError:
            generation = None
        if kept is not None and kept.generation != generation:
            kept.retire()
            kept = None
        if kept is None:
            if generation is None:  # not a directory (now): the open says what is wrong
                mqcore.open(key, read_only=True).close()
                raise NotAStoreError(f"{key} could not be listed (it changed while being opened)")
            kept = _Kept(generation, mqcore.open(key, read_only=True))
        kept.users += 1
        _stores[key] = kept
        idle = [k for k, held in _stores.items() if held.users == 0]
        for k in idle[: max(0, len(_stores) - MAX_STORES)]:
            _stores.pop(k).retire()
        if _reaper is None:
            _reaper = threading.Thread(target=_close_idle, name="mqcore-store-handles", daemon=True)
            _reaper.start()
        return kept


def set_idle_seconds(seconds: float) -> None:
    """Close a handle once nobody has borrowed it for `seconds` (IDLE_SECONDS; tests shorten
    it). The background thread takes the new interval at once, not after its current wait."""
    global IDLE_SECONDS
    IDLE_SECONDS = seconds
    _wake.set()


def _close_idle() -> None:
    """Close the handles nobody borrowed for IDLE_SECONDS, checking every quarter of it (and at
    once when set_idle_seconds changes it)."""
    while True:
        if _wake.wait(IDLE_SECONDS / 4):
            _wake.clear()
        now = time.monotonic()
        with _lock:
            for key in [k for k, kept in _stores.items() if kept.users == 0]:
                if now - _stores[key].idle_since >= IDLE_SECONDS:
                    _stores.pop(key).retire()


def close_shared_stores() -> None:
    """Close every kept handle not lent now; the lent ones close when given back (at exit, so
    no store is left unclosed, and in tests)."""
    with _lock:
        while _stores:
            _, kept = _stores.popitem()
            kept.retire()


atexit.register(close_shared_stores)
