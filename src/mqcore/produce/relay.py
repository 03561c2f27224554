"""The two-phase relay: how a transaction commit and a delayed delivery move parked messages to
their real partitions exactly once, across a crash or a power loss at any step.

    1. the parked log (`__txn_half`, `__delay`) durable: what the PREPARE names is on disk
    2. PREPARE, durable: the messages now in doubt and where each target partition ended
       (an earlier attempt's PREPARE may stand instead: then nothing is written)
                                                                 crash point <name>.after_prepare
    3. per target partition, in order: the "already delivered?" check of each message in
       doubt (its unique ID in the partition since the end the PREPARE recorded), then one
       re-append of the rest                          crash point <name>.after_append (visit N)
    4. the re-appends durable, then DONE
So a crash before 2 leaves nothing in doubt; after it, a rerun skips what is already there.
A target partition that no longer exists (its topic was deleted, Store.delete_topic) gets
nothing: its messages are dropped with a warning, so one deleted topic never holds up the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from mqcore.crashpoints import crash_point
from mqcore.query import engine

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.log.manager import Log

Item = TypeVar("Item")
_log = logging.getLogger("mqcore")


def relay(
    log: Log,
    name: str,
    parked: str,
    groups: dict[tuple[str, int], list[Item]],
    prepare: Callable[[], str | None],
    doubt: Callable[[str, int, Item], int | None],
    unique_id: Callable[[Item], str | None],
    send: Callable[[str, int, list[Item]], object],
    done: Callable[[], object],
) -> None:
    """Relay `groups` ((topic, partition) -> parked items, in send order) from the one-partition
    log `parked`; a partition the log no longer holds is taken out of the dict first.
    `prepare()` writes the PREPARE record and returns its topic (None: an earlier attempt's
    stands); `doubt(t, p, item)` is the end offset of (t, p) before an interrupted attempt
    that may have re-appended `item` (None: it did not); `send(t, p, items)` re-appends;
    `done()` writes DONE. `name` ("txn", "delay") names the crash points."""
    log.sync_partitions([(parked, 0)])
    _drop_gone(log, name, groups)  # before prepare(), which reads `groups` too
    written = prepare()
    if written is not None:
        log.sync_partitions([(written, 0)])
        crash_point(f"{name}.after_prepare")
    check = PresenceCheck(log)
    for t, p in sorted(groups):
        rows = [
            item
            for item in groups[(t, p)]
            if (end := doubt(t, p, item)) is None or not check.present(t, p, end, unique_id(item))
        ]
        if rows:
            send(t, p, rows)
        crash_point(f"{name}.after_append")
    log.sync_partitions(groups)
    done()


def _drop_gone(log: Log, name: str, groups: dict[tuple[str, int], list[Item]]) -> None:
    """Take out of `groups` the target partitions the log no longer holds (deleted topics)."""
    for t, p in [tp for tp in groups if log.find_partition(*tp) is None]:
        _log.warning("%s: %d message(s) for %s-%d dropped: the partition no longer exists "
                     "(its topic was deleted)", name, len(groups.pop((t, p))), t, p)  # fmt: skip


class PresenceCheck:
    """Answers 'is unique ID U already in partition P of topic T?' for in-doubt messages.

    A topic with a key index answers from the index; one without is scanned once from the end
    offset recorded before the interrupted appends (anything the crash left is after it)."""

    def __init__(self, log: Log):
        self.log = log
        self._tails: dict[tuple[str, int], set[str]] = {}

    def present(self, topic: str, partition: int, from_offset: int, uid: str | None) -> bool:
        if uid is None:
            return False
        part = self.log.partition(topic, partition)
        if part.config.key_index:
            return bool(engine.find_unique([part], uid, None, None, 1).messages)
        seen = self._tails.get((topic, partition))
        if seen is None:
            seen = set()
            for m in scan(self.log, topic, partition, from_offset):
                if m.unique_id is not None:
                    seen.add(m.unique_id)
            self._tails[(topic, partition)] = seen
        return uid in seen


def scan(log: Log, topic: str, partition: int, start: int) -> Iterable[Message]:
    """Every message of the partition from `start` (clamped to its start offset) to its end."""
    part = log.partition(topic, partition)
    offset = max(start, part.start_offset)
    end = part.end_offset
    while offset < end:
        chunk = part.read(offset, 1000, log.verify_crc)
        if not chunk:
            break
        yield from chunk
        offset = chunk[-1].offset + 1


__all__ = ["PresenceCheck", "relay", "scan"]
