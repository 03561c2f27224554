"""The partition mutation quota of `mqcore serve`: KIP-599's controller mutation quota.

Creating partitions costs the store a directory, a descriptor and a rewrite of its topic list
each, so a burst of creations (CreateTopics, CreatePartitions, Metadata auto-creation) is
metered per principal with a token bucket of partitions: it refills at `rate` partitions a
second up to `burst`. A creation is admitted while the principal's bucket holds any token, and
then takes all its partitions, so the bucket may go below zero (a request larger than the
burst is not starved, as KIP-599 says); while it is empty, creations are refused with
THROTTLING_QUOTA_EXCEEDED and the time until it holds a token again, which Kafka's clients
wait out before they retry. Unauthenticated clients share one principal, User:ANONYMOUS.
Kafka applies the quota strictly from CreateTopics v6 and CreatePartitions v3 and delays older
versions instead; mqcore refuses in every version (a delayed response would hold a
connection), and refuses auto-creation too (Kafka only counts it).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from mqcore.errors import InvalidConfigError
from mqcore.server.common import KafkaError
from mqcore.server.defaults import MUTATION_BURST as BURST
from mqcore.server.defaults import MUTATION_RATE as RATE

MAX_BUCKETS = 10_000  # full buckets are forgotten past this many principals


class QuotaExceeded(KafkaError):
    """A creation refused by the mutation quota; `throttle_ms` until the bucket refills."""

    def __init__(self, message: str, throttle_ms: int):
        super().__init__(ErrorCode.throttling_quota_exceeded, message)
        self.throttle_ms = throttle_ms


class MutationQuota:
    """Token buckets of partitions, one per principal (thread-safe). `clock` in seconds."""

    def __init__(
        self, rate: float = RATE, burst: int = BURST, clock: Callable[[], float] = time.monotonic
    ):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise InvalidConfigError(f"the mutation rate must be > 0 partitions/s, not {rate!r}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise InvalidConfigError(f"the mutation burst must be an int >= 1, not {burst!r}")
        self.rate, self.burst, self.clock = float(rate), burst, clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # principal -> (tokens, at)

    def _tokens(self, principal: str, now: float) -> float:
        tokens, at = self._buckets.get(principal, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate)

    def admit(self, principal: str) -> None:
        """QuotaExceeded unless `principal`'s bucket holds a token now."""
        with self._lock:
            tokens = self._tokens(principal, self.clock())
        if tokens <= 0:
            wait = math.ceil((1 - tokens) / self.rate * 1000)
            raise QuotaExceeded(
                f"{principal} created partitions faster than {self.rate:g} a second (burst "
                f"{self.burst}); retry in {wait} ms",
                wait,
            )

    def record(self, principal: str, partitions: int) -> None:
        """Take `partitions` tokens from `principal`'s bucket (after they were created)."""
        with self._lock:
            now = self.clock()
            self._buckets[principal] = (self._tokens(principal, now) - partitions, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets = {
                    p: (t, at) for p, (t, at) in self._buckets.items()
                    if t + (now - at) * self.rate < self.burst
                }  # fmt: skip


__all__ = ["BURST", "RATE", "MutationQuota", "QuotaExceeded"]
