"""Warnings an operator must see, without a flood: the refusals of `mqcore serve` (a request
version it does not serve, a failed login, a connection over a bound) are logged at warning, so a
server whose clients all fail says why, but at most once per `interval` for each (address,
reason): the lines held back are counted in the next one for that key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

INTERVAL = 60.0  # seconds between two lines of one (address, reason)
MAX_KEYS = 10_000  # keys remembered; the oldest are forgotten past this


class RateLimitedLog:
    """`warning(key, message, *args)`: logged unless the same key was logged less than
    `interval` seconds ago. Thread-safe; memory bounded by `max_keys`."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = INTERVAL,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger, self.interval, self.max_keys, self.clock = logger, interval, max_keys, clock
        self._last: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        """Log `message % args` at warning unless `key` was logged within the interval;
        True when it was logged."""
        now = self.clock()
        with self._lock:
            last, held = self._last.get(key, (-float("inf"), 0))
            if now - last < self.interval:
                self._last[key] = (last, held + 1)
                return False
            self._last[key] = (now, 0)
            self._last.move_to_end(key)
            while len(self._last) > self.max_keys:
                self._last.popitem(last=False)
        if held:
            message += f" ({held} more like it in the last {self.interval:g} s not logged)"
        self.logger.warning(message, *args)
        return True


__all__ = ["INTERVAL", "RateLimitedLog"]
