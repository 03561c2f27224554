"""Read-only store handles kept per Python worker process, for Spark's planner and tasks.

Spark reuses its Python workers (spark.python.worker.reuse, on by default): the process that
plans a read or runs a task runs the next one too. A task that opened the store anew each time
paid the open (topics, checkpoints, every partition's newest segment and its indexes) and,
because each open maps the segments afresh, a page-table fault per 64 KiB of log it read.
`shared_store` keeps one read-only Store per path instead, valid for as long as the store's
generation is unchanged.

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
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections import OrderedDict

import mqcore
from mqcore.errors import NotAStoreError
from mqcore.store import Store

MAX_STORES = 4  # paths kept per process; the least recently used is closed beyond that

Generation = tuple[tuple[object, ...], ...]

_lock = threading.Lock()
_stores: OrderedDict[str, tuple[Generation, Store]] = OrderedDict()


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


def shared_store(path: str) -> Store:
    """A read-only Store of `path` as it is on disk now, shared by the callers of this process
    (it stays open: do not close it). Opens, or reopens, when the generation changed."""
    key = os.path.abspath(path)
    with _lock:
        kept = _stores.pop(key, None)
        try:
            generation = store_generation(key)
        except OSError:
            generation = None
        if kept is not None:
            if kept[0] == generation:
                _stores[key] = kept
                return kept[1]
            kept[1].close()
        if generation is None:  # not a directory (now): the open says what is wrong
            mqcore.open(key, read_only=True).close()
            raise NotAStoreError(f"{key} could not be listed (it changed while being opened)")
        store = mqcore.open(key, read_only=True)
        _stores[key] = (generation, store)
        while len(_stores) > MAX_STORES:
            _, (_, oldest) = _stores.popitem(last=False)
            oldest.close()
        return store


def close_shared_stores() -> None:
    """Close every kept handle (at exit, so no store is left unclosed, and in tests)."""
    with _lock:
        while _stores:
            _, (_, store) = _stores.popitem()
            store.close()


atexit.register(close_shared_stores)
