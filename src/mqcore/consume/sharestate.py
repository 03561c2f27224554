"""Durable state of share groups, kept in the internal compacted topic `__share_group_state`.

One record per share-partition (group, topic, partition), the whole in-flight window each time
(Kafka's ShareSnapshot idea, without its separate update records: a compacted topic keeps the
last value per key, so every value must stand alone):
  key   = int16 version (0), string group, string topic, int32 partition
  value = int16 version (0), int64 start, int64 end, int32 runs,
          runs x (int64 first offset, int32 length, int16 delivery count)
(string = int16 length + UTF-8, all big-endian.) A null value deletes the share-partition.

`start` is the share-partition start offset: every offset below it is done. `end` is the
next offset not yet taken into the window. Inside [start, end) the runs list the records still
to be done (available, or acquired when the value was written: a lock does not survive a
restart, so they come back available) with their delivery counts; an offset of the window that
no run lists is done (accepted, rejected, archived at the delivery limit, or passed over by the
group's filter). Offsets from `end` on were never delivered.

Durability: `ShareConsumer.commit()` appends the values of every share-partition that changed
and fdatasyncs the partition whatever the store's flush policy, so acknowledgements survive a
process kill and a power loss once it returns. A poll appends the values of the partitions it
acquired records from without a sync (the store's flush policy applies): delivery counts then
survive a process kill, so a record that kills its consumer still reaches the delivery limit.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqcore.consume.offsets import BigEndianReader, encode_string
from mqcore.crashpoints import crash_point
from mqcore.log.internal import ReplayedState

if TYPE_CHECKING:
    from mqcore.log.manager import Log

SHARE_STATE_TOPIC = "__share_group_state"
KEY_VERSION = 0
VALUE_VERSION = 0
STATE_SEGMENT_BYTES = 100 << 20

ShareKey = tuple[str, str, int]  # (group, topic, partition)


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    """One share-partition's durable state: [start, end) with the records still to be done,
    as runs (first offset, length, delivery count), ascending and not overlapping."""

    start: int
    end: int
    runs: tuple[tuple[int, int, int], ...] = ()

    def pending(self) -> dict[int, int]:
        """offset -> delivery count of every record still to be done."""
        out = {}
        for first, length, count in self.runs:
            for off in range(first, first + length):
                out[off] = count
        return out


def runs_of(offsets: Sequence[int], counts: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    """Ascending `offsets` with their delivery `counts` as runs (first, length, count) of
    consecutive offsets with one count. The run breaks are found by C-level iterators (a gap
    in the offsets, or a count unlike the previous one): Python code runs per run, not per
    record, as a window of thousands of records is written at every poll."""
    n = len(offsets)
    if n == 0:
        return ()
    gaps = map(operator.ne, map(operator.sub, offsets[1:], offsets[:-1]), itertools.repeat(1))
    changes = map(operator.ne, counts[1:], counts[:-1])
    starts = [0, *itertools.compress(range(1, n), map(operator.or_, gaps, changes)), n]
    return tuple((offsets[a], b - a, counts[a]) for a, b in itertools.pairwise(starts))


def encode_key(group: str, topic: str, partition: int) -> bytes:
    return (
        struct.pack(">h", KEY_VERSION)
        + encode_string(group)
        + encode_string(topic)
        + struct.pack(">i", partition)
    )


def encode_value(snap: ShareSnapshot) -> bytes:
    parts = [struct.pack(">hqqi", VALUE_VERSION, snap.start, snap.end, len(snap.runs))]
    parts += [struct.pack(">qih", first, length, count) for first, length, count in snap.runs]
    return b"".join(parts)


def decode_key(raw: bytes | None) -> ShareKey:
    if raw is None:
        raise ValueError("no key")
    r = BigEndianReader(raw)
    version = r.take(">h")
    if version != KEY_VERSION:
        raise ValueError(f"unknown share state key version {version}")
    return r.string(), r.string(), r.take(">i")


def decode_value(raw: bytes) -> ShareSnapshot:
    """The snapshot a value holds; ValueError for bytes that are not one (runs out of order or
    outside [start, end), counts below 1, trailing bytes)."""
    r = BigEndianReader(raw)
    version = r.take(">h")
    if version != VALUE_VERSION:
        raise ValueError(f"unknown share state value version {version}")
    start, end, n = r.take(">q"), r.take(">q"), r.take(">i")
    if not 0 <= start <= end or n < 0 or n * 14 != len(raw) - r.pos:
        raise ValueError(f"bad share state header: start {start}, end {end}, {n} runs")
    runs = []
    low = start
    for _ in range(n):
        first, length, count = r.take(">q"), r.take(">i"), r.take(">h")
        if first < low or length < 1 or first + length > end or count < 1:
            raise ValueError(f"bad run ({first}, {length}, {count}) in [{low}, {end})")
        runs.append((first, length, count))
        low = first + length
    return ShareSnapshot(start, end, tuple(runs))


class ShareStateStore(ReplayedState[ShareKey, ShareSnapshot]):
    """The durable state of every share-partition of one log, replayed on first use."""

    def __init__(self, log: Log):
        super().__init__(log, SHARE_STATE_TOPIC, decode_key, decode_value, "a share state")

    def snapshot(self, group: str, topic: str, partition: int) -> ShareSnapshot | None:
        with self.lock:
            return self.loaded().get((group, topic, partition))

    def group_snapshots(self, group: str | None = None) -> dict[ShareKey, ShareSnapshot]:
        """The durable state of `group`'s share-partitions (every group's when None)."""
        with self.lock:
            return {k: v for k, v in self.loaded().items() if group is None or k[0] == group}

    def write(
        self, group: str, snapshots: Mapping[tuple[str, int], ShareSnapshot | None], sync: bool
    ) -> None:
        """Append one batch with each share-partition's value (None deletes it); with `sync`
        fdatasync it before returning (commit), else the store's flush policy applies."""
        if not snapshots:
            return
        items = sorted(snapshots.items())
        with self.lock:
            loaded = self.loaded()
            topic = self.log.internal_topic(
                SHARE_STATE_TOPIC,
                partitions=1,
                cleanup_policy="compact",
                unique_ids=False,
                key_index=False,
                segment_bytes=STATE_SEGMENT_BYTES,
            )
            self.log.append_records(
                topic,
                0,
                [None if s is None else encode_value(s) for _, s in items],
                [encode_key(group, t, p) for (t, p), _ in items],
            )
            crash_point("share_state.after_append")
            for (t, p), s in items:
                if s is None:
                    loaded.pop((group, t, p), None)
                else:
                    loaded[(group, t, p)] = s
        if sync:
            self.sync()

    def sync(self) -> None:
        """fdatasync every value appended so far (and a new segment's name)."""
        if self.log.has_topic(SHARE_STATE_TOPIC):
            self.log.partition(SHARE_STATE_TOPIC, 0).flush()
            crash_point("share_state.after_fdatasync")
