"""The pull log of a share group (QMQ's idea): what each member received, in order, and how
each record ended, in the internal topic `__pull.<group>`.

One record per poll that delivered records and per batch of outcomes, keyed by the member id
(UTF-8), its timestamp the time of the event:
  value = int8 version (0), int32 entries,
          entries x (string topic, int32 partition, int64 offset, int16 delivery count,
                     int8 event)
(string = int16 length + UTF-8, big-endian.) Events: 0 delivered, 1 accepted, 2 released (by
`release`, an expired lock or the member's close), 3 rejected, 4 archived (the delivery limit).

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


def pull_topic(group: str) -> str:
    return PULL_PREFIX + group


def encode_entries(entries: Iterable[Entry]) -> bytes:
    items = list(entries)
    parts = [struct.pack(">bi", VERSION, len(items))]
    for topic, partition, offset, count, event in items:
        parts.append(encode_string(topic))
        parts.append(struct.pack(">iqhb", partition, offset, count, EVENT_CODE[event]))
    return b"".join(parts)


def decode_entries(raw: bytes) -> list[Entry]:
    """The entries of one value; ValueError for bytes that are not one."""
    r = BigEndianReader(raw)
    version = r.take(">b")
    if version != VERSION:
        raise ValueError(f"unknown pull log version {version}")
    n = r.take(">i")
    if n < 0:
        raise ValueError(f"negative entry count {n}")
    out = []
    for _ in range(n):
        topic = r.string()
        partition, offset, count, code = (
            r.take(">i"), r.take(">q"), r.take(">h"), r.take(">b"),
        )  # fmt: skip
        if not 0 <= code < len(EVENTS):
            raise ValueError(f"unknown pull log event {code}")
        out.append((topic, partition, offset, count, EVENTS[code]))
    if r.pos != len(raw):
        raise ValueError("trailing bytes")
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
        if part is None:
            return
        offset = max(self._obsolete_below, part.start_offset)
        end = part.end_offset
        while offset < end:
            msgs = part.read(offset, READ_CHUNK, self.log.verify_crc)
            if not msgs:
                break
            for m in msgs:
                try:
                    live = any(
                        (s := start_of(t, p)) is not None and o >= s
                        for t, p, o, _, _ in decode_entries(m.value or b"")
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
