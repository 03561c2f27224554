"""The pull log of a share group (QMQ's idea): what each member received, in order, and how
each record ended, in the internal topic `__pull.<group>`.

One record per member each time the group writes its state (a poll that delivered records or
moved a window, a commit, a close), keyed by the member id (UTF-8), its timestamp the time of
the write, holding that member's entries since the last write in order, grouped by partition:
  value = int8 version (0), int32 groups,
          groups x (string topic, int32 partition, int32 n, int64 max offset,
                    n x int64 offset, n x int16 delivery count, n x int8 event)
(string = int16 length + UTF-8, big-endian.) Events: 0 delivered, 1 accepted, 2 released (by
`release`, an expired lock or the member's close), 3 rejected, 4 archived (the delivery limit).
A group's max offset lets the trim decide without reading the entries.

The log keeps only what is still of use: once every share-partition's start has passed all the
records a pull-log record names, that record is obsolete, and the leading whole segments of
obsolete records are deleted (retention's steps, `storage.retention.delete_below`) at each
commit. Nothing is kept forever: a group's history is as long as its slowest record.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqcore.consume.offsets import BigEndianReader, encode_string
from mqcore.log.trace import TraceEvent
from mqcore.storage.retention import delete_below

if TYPE_CHECKING:
    from mqcore.log.manager import Log

PULL_PREFIX = "__pull."
VERSION = 0
EVENTS = ("delivered", "accepted", "released", "rejected", "archived")
EVENT_CODE = {e: i for i, e in enumerate(EVENTS)}
PULL_SEGMENT_BYTES = 16 << 20
READ_CHUNK = 5000

Entry = tuple[str, int, int, int, str]  # (topic, partition, offset, delivery count, event)


@dataclass(frozen=True, slots=True)
class PullEntry:
    """One step of one record in a share group: `member` got it (`delivered`, the
    `delivery_count`-th time) or it ended or went back (`accepted`, `released`, `rejected`,
    `archived`), at `time` (ms); `position` is the pull-log offset (the member's order)."""

    group: str
    member: str
    time: int
    event: str
    topic: str
    partition: int
    offset: int
    delivery_count: int
    position: int

    def trace_event(self, unique_id: str) -> TraceEvent:
        """This step as a trace event (`share_<event>`, the member and the delivery count in
        its detail): how `mqcore trace` and the console show it beside the store's trace."""
        return TraceEvent(
            unique_id, f"share_{self.event}", self.time, self.topic, self.partition, self.offset,
            self.group, {"member": self.member, "delivery_count": self.delivery_count},
        )  # fmt: skip


def pull_topic(group: str) -> str:
    return PULL_PREFIX + group


def encode_entries(entries: Iterable[Entry]) -> bytes:
    """One value: the entries grouped by partition, each group's arrays packed at once."""
    groups: dict[tuple[str, int], list[Entry]] = {}
    for e in entries:
        groups.setdefault((e[0], e[1]), []).append(e)
    parts = [struct.pack(">bi", VERSION, len(groups))]
    for (topic, partition), items in groups.items():
        n = len(items)
        offsets = [e[2] for e in items]
        parts.append(encode_string(topic))
        counts = [e[3] for e in items]
        codes = [EVENT_CODE[e[4]] for e in items]
        fmt = f">iiq{n}q{n}h{n}b"
        parts.append(struct.pack(fmt, partition, n, max(offsets), *offsets, *counts, *codes))
    return b"".join(parts)


def _groups(raw: bytes) -> Iterator[tuple[str, int, int, int, int]]:
    """(topic, partition, n, max offset, position of the offsets) of each group of a value;
    ValueError for bytes that are not one."""
    r = BigEndianReader(raw)
    version = r.take(">b")
    if version != VERSION:
        raise ValueError(f"unknown pull log version {version}")
    count = r.take(">i")
    if count < 0:
        raise ValueError(f"negative group count {count}")
    for _ in range(count):
        topic = r.string()
        partition, n, top = r.take(">i"), r.take(">i"), r.take(">q")
        if n < 0 or r.pos + 11 * n > len(raw):
            raise ValueError(f"bad entry count {n}")
        yield topic, partition, n, top, r.pos
        r.pos += 11 * n
    if r.pos != len(raw):
        raise ValueError("trailing bytes")


def decode_entries(raw: bytes) -> list[Entry]:
    """The entries of one value, in order; ValueError for bytes that are not one."""
    out: list[Entry] = []
    for topic, partition, n, top, pos in _groups(raw):
        offsets = struct.unpack_from(f">{n}q", raw, pos)
        counts = struct.unpack_from(f">{n}h", raw, pos + 8 * n)
        codes = struct.unpack_from(f">{n}b", raw, pos + 10 * n)
        if n and max(offsets) != top:
            raise ValueError(f"max offset {top} is not the entries' {max(offsets)}")
        for off, count, code in zip(offsets, counts, codes, strict=True):
            if not 0 <= code < len(EVENTS):
                raise ValueError(f"unknown pull log event {code}")
            out.append((topic, partition, off, count, EVENTS[code]))
    return out


class PullLog:
    """Appends, reads and trims one share group's pull log (call under the group's lock)."""

    def __init__(self, log: Log, group: str):
        self.log, self.group, self.topic = log, group, pull_topic(group)
        self._obsolete_below = -1  # pull-log offsets below it are known to be obsolete

    def append(self, member: str, entries: list[Entry]) -> None:
        if not entries:
            return
        topic = self.log.internal_topic(
            self.topic,
            partitions=1,
            unique_ids=False,
            key_index=False,
            cleanup_policy="delete",
            segment_bytes=PULL_SEGMENT_BYTES,
        )
        self.log.append_records(topic, 0, [encode_entries(entries)], [member.encode()])

    def entries(self) -> Iterator[PullEntry]:
        """Every entry still kept, in pull-log order; records that do not parse are skipped
        and reported (Log.skipped)."""
        part = self.log.find_partition(self.topic, 0)
        if part is None:
            return
        offset, end = part.start_offset, part.end_offset
        while offset < end:
            msgs = part.read(offset, READ_CHUNK, self.log.verify_crc)
            if not msgs:
                return
            for m in msgs:
                try:
                    member = (m.key or b"").decode()
                    decoded = decode_entries(m.value or b"")
                except ValueError as e:
                    self.log.skipped.report(self.topic, 0, m.offset, f"not a pull log: {e}")
                    continue
                for topic, partition, off, count, event in decoded:
                    yield PullEntry(
                        self.group, member, m.timestamp, event, topic, partition, off, count,
                        m.offset,
                    )  # fmt: skip
            offset = msgs[-1].offset + 1

    def trim(self, start_of: Callable[[str, int], int | None]) -> None:
        """Delete the leading segments whose records are all obsolete: every record they name
        lies below its share-partition's start (`start_of(topic, partition)`, None when the
        group has no such share-partition: obsolete too)."""
        part = self.log.find_partition(self.topic, 0)
        if part is None or len(part.table) < 2:
            return  # only whole segments go, never the active one: nothing to free yet
        offset = max(self._obsolete_below, part.start_offset)
        end = part.end_offset
        while offset < end:
            msgs = part.read(offset, READ_CHUNK, self.log.verify_crc)
            if not msgs:
                break
            for m in msgs:
                try:
                    live = any(
                        (s := start_of(t, p)) is not None and top >= s
                        for t, p, _, top, _ in _groups(m.value or b"")
                    )
                except ValueError:
                    live = False  # junk: reported by entries(), no reason to keep it
                if live:
                    self._obsolete_below = m.offset
                    delete_below(part, m.offset)
                    return
            offset = msgs[-1].offset + 1
        self._obsolete_below = offset
        delete_below(part, offset)
