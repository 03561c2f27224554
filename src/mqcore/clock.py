"""The one wall clock of mqcore: milliseconds since the epoch, as Kafka timestamps count.

Every layer that needs "now" takes it from a `Clock` (a `Log` carries one, `clock=` of
`mqcore.open`), so a test or an embedding broker can inject its own time; `now_ms` is the
default. Durations (timeouts, flusher waits) use `time.monotonic` instead: they must not jump
when the wall clock is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def now_ms() -> int:
    """Milliseconds since the Unix epoch (the system's wall clock)."""
    return time.time_ns() // 1_000_000
