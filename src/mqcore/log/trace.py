"""Message trace: what happened to a message, kept in the internal topic `__trace`.

Each event is one record of `__trace`: key = the message's unique ID text (so the trace topic's
key index answers `store.trace(uid)` without a scan), value = a JSON object
{"event", "time", "topic", "partition", "offset", "group"?, ...}. Sampling is decided per unique
ID by its xxHash64, so a sampled message has all of its events recorded and the rest none.

It sits in the log layer because both consume/ (delivered, committed, nacked, ...) and produce/
(transactions, delays) record events; a `Tracer` needs only a `Log`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqcore._ext.hashing import xxh64_hash
from mqcore._ext.lookup import KEY_KIND
from mqcore.errors import InvalidConfigError
from mqcore.log.internal import is_internal
from mqcore.query.ids import uid_text
from mqcore.query.keyed import find_indexed

if TYPE_CHECKING:
    from mqcore.log.manager import Log

TRACE_TOPIC = "__trace"
EVENTS = (
    "appended",
    "delivered",
    "committed",
    "nacked",
    "retried",
    "dead_lettered",
    "delayed",
    "delay_delivered",
    "half_appended",
    "txn_committed",
    "txn_rolled_back",
    "acknowledged",  # share groups: a record accepted, released, rejected or archived
)


@dataclass(frozen=True)
class TraceEvent:
    """One step in a message's life; `topic/partition/offset` say where the message was."""

    unique_id: str
    event: str
    time: int
    topic: str
    partition: int
    offset: int
    group: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "unique_id": self.unique_id,
            "event": self.event,
            "time": self.time,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
        }
        if self.group is not None:
            out["group"] = self.group
        if self.detail:
            out["detail"] = self.detail
        return out


def sample_rate(option: bool | float) -> float:
    """The store's `trace=` option as a rate: False 0.0, True 1.0, or a float in [0, 1]."""
    if option is True or option is False:
        return float(option)
    if not isinstance(option, (int, float)) or not 0.0 <= float(option) <= 1.0:
        raise InvalidConfigError(f"trace must be True, False or a rate in [0, 1], not {option!r}")
    return float(option)


class Tracer:
    """Appends trace events of sampled messages to `__trace` (created on first use)."""

    def __init__(self, log: Log, rate: float):
        self.log = log
        self.rate = rate
        self._threshold = int(rate * (1 << 64))

    def sampled(self, unique_id: str | None) -> bool:
        if unique_id is None or self.rate <= 0.0:
            return False
        return self.rate >= 1.0 or xxh64_hash(unique_id.encode()) < self._threshold

    def record(self, events: Iterable[TraceEvent]) -> None:
        """Append the sampled events as one batch (nothing when none is sampled)."""
        chosen = [e for e in events if self.sampled(e.unique_id)]
        if not chosen:
            return
        topic = self.log.internal_topic(TRACE_TOPIC, unique_ids=False, cleanup_policy="delete")
        self.log.append_records(
            topic,
            0,
            [json.dumps(e.to_json(), separators=(",", ":")).encode() for e in chosen],
            [e.unique_id.encode() for e in chosen],
            timestamps=[e.time for e in chosen],
        )

    def on_append(
        self, topic: str, partition: int, base: int, count: int, uids: bytes | None, now: int
    ) -> None:
        """The "appended" events of an append (the log's append listener); the writes of
        internal topics, this one's included, are not traced."""
        if uids is None or is_internal(topic):
            return
        events = []
        for i in range(count):
            raw = uids[16 * i : 16 * i + 16]
            if raw != bytes(16):
                events.append(
                    TraceEvent(uid_text(raw), "appended", now, topic, partition, base + i)
                )
        if events:
            self.record(events)

    def events(self, unique_id: str, limit: int = 10_000) -> list[TraceEvent]:
        """Every recorded event of `unique_id`, oldest first (from `__trace`'s key index)."""
        if not self.log.has_topic(TRACE_TOPIC):
            return []
        found = find_indexed(
            self.log.partitions_of(TRACE_TOPIC), unique_id.encode(), KEY_KIND, None,
            None, limit, None,
        )  # fmt: skip
        events = []
        for m in found.messages:
            try:
                events.append(_from_json(m.value))
            except ValueError as e:  # junk is skipped and reported (log/internal.py)
                self.log.skipped.report(m.topic, m.partition, m.offset, str(e))
        return sorted(events, key=lambda e: e.time)


def _from_json(raw: bytes | None) -> TraceEvent:
    """The event a `__trace` record holds; ValueError for a record that holds none."""
    try:
        d = json.loads(raw or b"")
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not JSON: {e}") from None
    kinds = {"unique_id": str, "event": str, "time": int, "topic": str, "partition": int,
             "offset": int}  # fmt: skip
    if not isinstance(d, dict) or any(type(d.get(k)) is not t for k, t in kinds.items()):
        raise ValueError("not a trace event")
    group, detail = d.get("group"), d.get("detail", {})
    if d["event"] not in EVENTS or not isinstance(group, (str, type(None))):
        raise ValueError(f"not a trace event: {d['event']!r}")
    if not isinstance(detail, dict):
        raise ValueError("the detail is not an object")
    return TraceEvent(
        d["unique_id"], d["event"], d["time"], d["topic"], d["partition"], d["offset"], group,
        detail,
    )  # fmt: skip


def events_for(
    messages: Sequence[Any], event: str, now: int, group: str | None = None, **detail: Any
) -> list[TraceEvent]:
    """One `event` per message that carries a unique ID (a Message or a RecordMetadata)."""
    return [
        TraceEvent(m.unique_id, event, now, m.topic, m.partition, m.offset, group, dict(detail))
        for m in messages
        if m.unique_id is not None
    ]
