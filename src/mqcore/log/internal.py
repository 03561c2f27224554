"""Internal topics: the naming rule, the refusal of ordinary appends, and the report of internal
records their readers could not parse.

Kafka's rule: a topic whose name starts with `__` is internal. mqcore keeps the state of the
consumption model there (`__consumer_offsets`, `__retry.<group>`, `__dlq.<group>`,
`__txn_half`, `__txn_op`, `__delay`, `__delay_state`, `__trace`). Only mqcore writes them
(`Log.append_records`); the public appends, `create_topic` and `mqcore produce` refuse
them, as a Kafka broker refuses a produce request to an internal topic.

A record of an internal topic that its reader cannot parse (written by something else: a Kafka
tool, an older mqcore that accepted ordinary appends, a bug) is skipped and reported, never
fatal: one junk record must not stop every consumer or every transaction. Each is logged once
as a warning on the "mqcore" logger and listed by `Store.skipped_records()`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from mqcore.errors import InternalTopicError

if TYPE_CHECKING:
    from mqcore.log.manager import Log

K = TypeVar("K")
V = TypeVar("V")
REPLAY_CHUNK = 10_000

INTERNAL_PREFIX = "__"
MAX_KEPT = 10_000  # skipped records listed (the count goes on past it)

_log = logging.getLogger("mqcore")


def is_internal(topic: str) -> bool:
    return topic.startswith(INTERNAL_PREFIX)


def refuse_internal(topic: str, action: str = "append to") -> None:
    """InternalTopicError when `topic` is internal (the guard of every public write)."""
    if topic.startswith(INTERNAL_PREFIX):
        raise InternalTopicError(
            f"cannot {action} topic {topic!r}: it is internal (its name starts with "
            f"{INTERNAL_PREFIX!r}); internal topics are written only by mqcore"
        )


@dataclass(frozen=True)
class SkippedRecord:
    """An internal record a reader skipped: where it is and why it could not be used."""

    topic: str
    partition: int
    offset: int
    reason: str


class SkipLog:
    """The skipped internal records of one store, each logged and listed once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, int, int]] = set()
        self.records: list[SkippedRecord] = []
        self.count = 0

    def report(self, topic: str, partition: int, offset: int, reason: str) -> None:
        where = (topic, partition, offset)
        with self._lock:
            if where in self._seen:
                return
            self._seen.add(where)
            self.count += 1
            if len(self.records) < MAX_KEPT:
                self.records.append(SkippedRecord(topic, partition, offset, reason))
        _log.warning("skipped internal record %s-%d@%d: %s", topic, partition, offset, reason)


__all__ = [
    "ReplayedState",
    "replay_last_values",
    "INTERNAL_PREFIX",
    "SkipLog",
    "SkippedRecord",
    "is_internal",
    "refuse_internal",
]


def replay_last_values(
    log: Log,
    topic: str,
    decode_key: Callable[[bytes | None], K | None],
    decode_value: Callable[[bytes], V],
    what: str,
) -> dict[K, V]:
    """The state a compacted internal topic holds: every partition the log has, in offset
    order, the last value per key winning and a null value (a tombstone) deleting its key. A
    key `decode_key` maps to None is not ours (passed over); a record either decoder refuses
    with ValueError is skipped and reported as "not `what`" (SkipLog), never fatal."""
    out: dict[K, V] = {}
    if not log.has_topic(topic):
        return out
    for part in log.iter_partitions(topic):
        offset, end = part.start_offset, part.end_offset
        while offset < end:
            msgs = part.read(offset, REPLAY_CHUNK, log.verify_crc)
            if not msgs:
                break
            for m in msgs:
                try:
                    key = decode_key(m.key)
                    if key is None:
                        continue
                    if m.value is None:
                        out.pop(key, None)
                    else:
                        out[key] = decode_value(m.value)
                except ValueError as e:  # UnicodeDecodeError included
                    log.skipped.report(topic, part.partition, m.offset, f"not {what}: {e}")
            offset = msgs[-1].offset + 1
    return out


class ReplayedState(Generic[K, V]):
    """What a compacted internal topic holds, replayed (replay_last_values) at the first use
    and kept in memory after: the base of the committed offsets (consume/offsets.py) and the
    share groups' state (consume/sharestate.py). Read and change `loaded()` under `lock`."""

    def __init__(
        self,
        log: Log,
        topic: str,
        decode_key: Callable[[bytes | None], K | None],
        decode_value: Callable[[bytes], V],
        what: str,
    ):
        self.log = log
        self.lock = threading.Lock()
        self._replay_args = (topic, decode_key, decode_value, what)
        self._state: dict[K, V] | None = None

    def reload(self) -> None:
        """Forget the state: the next use replays the topic again (its log changed under
        this process, as a replica's does when another broker led it)."""
        with self.lock:
            self._state = None

    def loaded(self) -> dict[K, V]:
        """The state (call with `lock` held)."""
        if self._state is None:
            self._state = replay_last_values(self.log, *self._replay_args)
        return self._state
