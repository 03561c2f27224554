"""Retry and dead-letter topics of a consumer group, RocketMQ style, without a timer service.

`__retry.<group>` has one partition per backoff level (RocketMQ's levels 10s 30s 1m 2m 3m 4m 5m
6m 7m 8m 9m 10m 20m 30m 1h 2h by default). A message nacked for the n-th time is appended to
partition min(n, levels) - 1 with a due time of now + that level's delay, so due times never go
down within a partition and a consumer stops reading a retry partition at its first message
that is not due yet. After `max_reconsume_times` redeliveries the next nack appends it to
`__dlq.<group>` instead.

A copy keeps the key, value, every header of the original (its unique ID `uid`, `tag`, `keys`,
properties) and carries these headers (UTF-8 text):
  mq.origin            store ID (m1-...) of the original message: get_by_id() follows it
  mq.origin.topic      original topic
  mq.origin.partition  original partition
  mq.origin.offset     original offset
  mq.reconsume         how many times it has been redelivered (1 for the first retry copy)
  mq.due               due time in ms (retry copies only)
A copy of a copy keeps the first origin.
"""

from __future__ import annotations

from collections.abc import Sequence

from mqcore._ext.batch import Message
from mqcore.errors import InvalidConfigError

DEFAULT_LEVELS_MS = tuple(
    s * 1000
    for s in (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
H_ORIGIN = "mq.origin"
H_TOPIC = "mq.origin.topic"
H_PARTITION = "mq.origin.partition"
H_OFFSET = "mq.origin.offset"
H_RECONSUME = "mq.reconsume"
H_DUE = "mq.due"
RETRY_HEADERS = (H_ORIGIN, H_TOPIC, H_PARTITION, H_OFFSET, H_RECONSUME, H_DUE)


def check_levels(levels: Sequence[int] | None) -> tuple[int, ...]:
    if levels is None:
        return DEFAULT_LEVELS_MS
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or not levels:
        raise InvalidConfigError(f"retry_backoff_ms must be a non-empty list of ms, not {levels!r}")
    for v in levels:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidConfigError(f"retry_backoff_ms entries must be ints >= 0, not {v!r}")
    if list(levels) != sorted(levels):
        raise InvalidConfigError(f"retry_backoff_ms must not decrease: {list(levels)}")
    return tuple(levels)


def reconsume_times(m: Message) -> int:
    """How many times this message has been redelivered (0 for an original)."""
    raw = m.header(H_RECONSUME)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def due_time(m: Message) -> int:
    """When a retry copy may be delivered (ms); 0 for anything else."""
    raw = m.header(H_DUE)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def copy_headers(m: Message, reconsume: int, due: int | None) -> list[tuple[str, bytes | None]]:
    """The original's headers without our own, then origin, reconsume count and due time."""
    out = [(k, v) for k, v in m.headers if k not in RETRY_HEADERS]
    if m.header(H_ORIGIN) is not None:
        out += [(k, m.header(k)) for k in (H_ORIGIN, H_TOPIC, H_PARTITION, H_OFFSET)]
    else:
        out += [
            (H_ORIGIN, m.msg_id.encode()),
            (H_TOPIC, m.topic.encode()),
            (H_PARTITION, str(m.partition).encode()),
            (H_OFFSET, str(m.offset).encode()),
        ]
    out.append((H_RECONSUME, str(reconsume).encode()))
    if due is not None:
        out.append((H_DUE, str(due).encode()))
    return out
