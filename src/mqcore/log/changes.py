"""Who may change which topic now: the bookkeeping of the Log's topic changes.

Creating a topic, adding partitions, changing settings and deleting a topic take seconds when a
topic has thousands of partitions (a directory and a file per partition). They used to hold the
log's lock throughout, which every append through a replica handle, every new consumer and
every producer-id allocation also takes: one CreateTopics of 2,000 partitions stalled every
producer of `mqcore serve` for its 3 to 5 seconds. Now changes of one topic go one at a time,
changes of different topics run side by side, and the slow part (directories, files) holds no
lock at all: only the write of mqcore-topics.json and the publishing of the result are
serialized (`committing`), which is milliseconds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from mqcore.errors import StoreClosedError


class TopicChanges:
    """The topics being changed, the partitions creations in progress have reserved (the
    limits count them before they land), and the lock that orders topic-list writes."""

    def __init__(self, path: str):
        self._path = path
        self._cond = threading.Condition()
        self._busy: set[str] = set()
        self._closing = False
        self.reserved = 0  # partitions being created, not yet in the topic list

    @contextlib.contextmanager
    def changing(self, topic: str) -> Iterator[None]:
        """Hold `topic` for one change: another change of it waits until this one is done
        (so a name being deleted is never created again before its directories are gone)."""
        with self._cond:
            while topic in self._busy and not self._closing:
                self._cond.wait()
            if self._closing:
                raise StoreClosedError(f"store {self._path} is closing")
            self._busy.add(topic)
        try:
            yield
        finally:
            with self._cond:
                self._busy.discard(topic)
                self._cond.notify_all()

    @contextlib.contextmanager
    def reserving(self, count: int, check: Callable[[int], None]) -> Iterator[None]:
        """Reserve `count` new partitions while they are made; `check(reserved)` runs first,
        under the lock, with what other creations in progress reserved (it raises to refuse)."""
        with self._cond:
            check(self.reserved)
            self.reserved += count
        try:
            yield
        finally:
            with self._cond:
                self.reserved -= count

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """Held while the topic list is written and the change published: one writer at a
        time, so no write of the list leaves out another change's topic."""
        with self._cond:
            yield

    def close(self) -> None:
        """Refuse new changes and wait for those in progress (a creation publishes its
        partitions before the log closes them)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._busy:
                self._cond.wait()


__all__ = ["TopicChanges"]
