"""The background flusher: the group commit of `flush="interval"` every N ms or N messages, and
the timed syncs of topics with flush_after_ms (Kafka's flush.ms) under any policy but
"always"."""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable

_log = logging.getLogger("mqcore")

# No descriptor to open a directory or a checkpoint file with: nothing was written or lost,
# the same round goes again at the next interval. Any other error stops the flusher (a failed
# fdatasync leaves the page cache's state unknown: fsync-gate).
SHORT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class Flusher(threading.Thread):
    """Calls `flush_all` every `interval_ms` (None: never, the store's policy is not
    "interval"), or sooner when woken (N messages appended), and `flush_timed` whenever a
    partition's own flush_after_ms comes: it syncs the partitions due and returns the seconds
    until the next one is (None: none waits).

    One fdatasync per partition covers every append made before it started: that is the group
    commit. `checkpoint` runs at most every `checkpoint_ms` after a whole pass, to advance the
    recovery points on disk. A round that ran out of file descriptors (SHORT_OF_DESCRIPTORS)
    is retried at the next interval; any other error stops it, kept in `error`.
    """

    def __init__(
        self,
        interval_ms: int | None,
        flush_all: Callable[[], None],
        checkpoint: Callable[[], None],
        flush_timed: Callable[[], float | None] = lambda: None,
        checkpoint_ms: int = 10_000,
    ):
        super().__init__(name="mqcore-flusher", daemon=True)
        self.interval = None if interval_ms is None else interval_ms / 1000.0
        self.flush_all = flush_all
        self.checkpoint = checkpoint
        self.flush_timed = flush_timed
        self.checkpoint_every = checkpoint_ms / 1000.0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._whole_pass = False  # woken for a pass over every partition
        self._next_timed: float | None = None  # time.monotonic() of the next timed sync
        self.error: BaseException | None = None

    def wake(self) -> None:
        """A pass over every partition now (a partition reached flush_messages)."""
        self._whole_pass = True
        self._wake.set()

    def reschedule(self, due: float) -> None:
        """A partition wants a timed sync at `due` (time.monotonic()): wake up then at the
        latest."""
        if self._next_timed is None or due < self._next_timed:
            self._next_timed = due
            self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.join()

    def run(self) -> None:
        warned = -60.0
        last_pass = last_checkpoint = time.monotonic()
        while not self._stopping.is_set():
            self._wake.wait(self._timeout(last_pass))
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                if self._pass_due(last_pass):
                    last_pass = time.monotonic()
                    self.flush_all()
                    if time.monotonic() - last_checkpoint >= self.checkpoint_every:
                        self.checkpoint()
                        last_checkpoint = time.monotonic()
                self._flush_timed()
            except OSError as e:
                if e.errno not in SHORT_OF_DESCRIPTORS:
                    self.error = e  # surfaced by the next call on the store (Log.check_open)
                    break
                if time.monotonic() - warned >= 60.0:  # once a minute while it lasts
                    warned = time.monotonic()
                    _log.warning("the flusher ran out of file descriptors; it tries again: %s", e)
            except BaseException as e:
                self.error = e
                break

    def _timeout(self, last_pass: float) -> float | None:
        """How long to sleep: until the next whole pass or timed sync, whichever comes first."""
        now = time.monotonic()
        waits = [] if self.interval is None else [last_pass + self.interval - now]
        if self._next_timed is not None:
            waits.append(self._next_timed - now)
        return max(min(waits), 0.0) if waits else None

    def _pass_due(self, last_pass: float) -> bool:
        """Whether a whole pass is due: woken for one, or the interval is up. The flag is
        taken back only for a pass, which covers any append whose wake() it swallows."""
        if self.interval is None:
            return False
        if self._whole_pass or time.monotonic() - last_pass >= self.interval:
            self._whole_pass = False
            return True
        return False

    def _flush_timed(self) -> None:
        self._next_timed = None  # before: a reschedule meanwhile wakes the next wait
        wait = self.flush_timed()
        if wait is not None:
            self.reschedule(time.monotonic() + wait)
