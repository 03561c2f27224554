"""The open sealed segments of a store, least recently used first.

A sealed segment is opened on first use (its `.log` and indexes mapped, no descriptor kept) and
stays open while it is used. Past `max_open_segments` the least recently used ones are closed
again (LogSegment.release): descriptors and mappings are bounded by that setting, not by how many
segments a store holds (docs/operations.md "Limits"). Closing never pulls memory from under a
reader: a mapping goes when its last buffer is released, a key table a reader holds stays valid.
The active segments, and segments retention or compaction retired while readers still hold
them, are never closed here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Protocol


class CachedSegment(Protocol):
    """What the cache uses of a segment (storage/segment.py's LogSegment): a structural type,
    so this module does not import the segment module that imports it."""

    owner_lock: Any  # the partition's lock, or None
    is_open: bool

    def release(self) -> bool: ...


class SegmentCache:
    """LRU of open sealed segments; `limit` of them at most (more only while the partition of
    the oldest is busy in another thread: it is closed at the next admission)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lru: OrderedDict[CachedSegment, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._lru)

    def admit(self, seg: CachedSegment) -> None:
        """`seg` was opened or used: it becomes the most recent; close the oldest past limit."""
        with self._lock:
            self._lru[seg] = None
            self._lru.move_to_end(seg)
            excess = len(self._lru) - self.limit
            if excess <= 0:
                return
            victims = [v for v in self._lru if v is not seg][: excess + 8]
        closed = 0
        for victim in victims:
            if closed >= excess:
                break
            lock = victim.owner_lock
            if lock is not None and not lock.acquire(blocking=False):
                continue  # its partition is busy in another thread: try a later one
            try:
                released = victim.release()
            finally:
                if lock is not None:
                    lock.release()
            if released or not victim.is_open:
                self.forget(victim)
                closed += 1

    def forget(self, seg: CachedSegment) -> None:
        """`seg` is closed, retired or gone: no longer counted."""
        with self._lock:
            self._lru.pop(seg, None)
