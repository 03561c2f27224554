"""The background flusher of `flush="interval"`: group commit every N ms or N messages."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Flusher(threading.Thread):
    """Calls `flush_all` every `interval_ms`, or sooner when woken (N messages appended).

    One fdatasync per partition covers every append made before it started: that is the group
    commit. `checkpoint` runs at most every `checkpoint_ms` after a flush, to advance the
    recovery points on disk.
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
            except BaseException as e:  # surfaced by the next append (Store._check_flusher)
                self.error = e
                break
