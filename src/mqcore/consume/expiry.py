"""Expiry of abandoned consumer groups: Kafka's `offsets.retention.minutes` (KIP-211).

Kafka deletes the committed offsets of a group that has had no member for the retention (7
days since Kafka 2.0), counted from when it became empty, and those of a group that never had
members (commits from `assign()`) from its last commit; a group without offsets is gone from
every listing. mqcore keeps no membership on disk, so it counts from the later of the group's
newest commit and the last time this process saw it with members (`Store.group_members`, so
mqcore serve's Kafka clients too), and from the store's open for a group it never saw with
members: a restart never expires a group sooner than the retention after it. A group's offsets
go all at once (Kafka expires a standalone group's partitions one by one, each after its own
commit). Its retry and dead-letter topics stay: they hold messages.
"""

from __future__ import annotations

from collections.abc import Callable

from mqcore.clock import Clock
from mqcore.config import DAY_MS
from mqcore.consume.offsets import OffsetStore
from mqcore.errors import InvalidConfigError

OFFSETS_RETENTION_MS = 7 * DAY_MS  # Kafka's offsets.retention.minutes, 10,080 (KIP-186)
RETENTION_CHECK_MS = 600_000  # Kafka's offsets.retention.check.interval.ms

ExpiryListener = Callable[[list[str]], None]


class GroupExpiry:
    """When each group was last seen with members, and the pass that expires the others.
    `retention_ms=-1` keeps every group."""

    def __init__(self, retention_ms: int, check_interval_ms: int, clock: Clock):
        if (
            isinstance(retention_ms, bool)
            or not isinstance(retention_ms, int)
            or not (retention_ms == -1 or retention_ms >= 1)
        ):
            raise InvalidConfigError(
                f"offsets_retention_ms must be an int >= 1, or -1 (keep), not {retention_ms!r}"
            )
        if (
            isinstance(check_interval_ms, bool)
            or not isinstance(check_interval_ms, int)
            or check_interval_ms < 0
        ):
            raise InvalidConfigError(
                "offsets_retention_check_interval_ms must be an int >= 0 (0: no background "
                f"task), not {check_interval_ms!r}"
            )
        self.retention_ms = retention_ms
        self.check_interval_ms = check_interval_ms
        self.opened_at = clock()
        self._seen_busy: dict[str, int] = {}  # group -> when it last had members
        self.listeners: list[ExpiryListener] = []

    def expire(self, offsets: OffsetStore, members: Callable[[str], int], now: int) -> list[str]:
        """One pass: tombstone the offsets of every group with no member now, no commit and
        no member for the retention; returns them, sorted."""
        if self.retention_ms < 0:
            return []
        groups = {group for group, _, _ in offsets.all_offsets()}
        cutoff = now - self.retention_ms
        candidates = {}
        for group in sorted(groups):
            if members(group):
                self._seen_busy[group] = now
            elif self._seen_busy.get(group, self.opened_at) <= cutoff:
                candidates[group] = cutoff  # the newest commit is checked under the lock
        expired = offsets.expire(candidates)
        gone = set(expired)
        self._seen_busy = {g: t for g, t in self._seen_busy.items() if g in groups - gone}
        return expired

    def tell(self, expired: list[str]) -> None:
        """Every listener, after each pass (expired may be empty): mqcore serve's coordinator
        drops its own empty groups of those names."""
        for listener in list(self.listeners):
            listener(expired)


__all__ = ["OFFSETS_RETENTION_MS", "RETENTION_CHECK_MS", "ExpiryListener", "GroupExpiry"]
