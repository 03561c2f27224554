"""The background flusher of `flush="interval"`: group commit every N ms or N messages."""

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
    """Calls `flush_all` every `interval_ms`, or sooner when woken (N messages appended).

    One fdatasync per partition covers every append made before it started: that is the group
    commit. `checkpoint` runs at most every `checkpoint_ms` after a flush, to advance the
    recovery points on disk. A round that ran out of file descriptors (SHORT_OF_DESCRIPTORS)
    is retried at the next interval; any other error stops it, kept in `error`.
    """

    def __init__(
        self,
        interval_ms: int,
        flush_all: Callable[[], None],
        checkpoint: Callable[[], None],
        checkpoint_ms: int = 10_000,
    ):
        super().__init__(name="mqcore-flusher", daemon=True)
        self.interval = interval_ms / 1000.0
        self.flush_all = flush_all
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_ms / 1000.0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.join()

    def run(self) -> None:
        last_checkpoint = time.monotonic()
        warned = -60.0
        while not self._stopping.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                self.flush_all()
                if time.monotonic() - last_checkpoint >= self.checkpoint_every:
                    self.checkpoint()
                    last_checkpoint = time.monotonic()
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
