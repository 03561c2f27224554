"""Committed offsets of consumer groups, kept in the internal compacted topic `__consumer_offsets`.

One record per (group, topic, partition) commit, in Kafka's own layout so Kafka tooling that
decodes `__consumer_offsets` reads ours:
  key   = int16 version (1), string group, string topic, int32 partition
  value = int16 version (3), int64 offset, int32 leader epoch (-1: none), string metadata,
          int64 commit time (ms); a null value deletes the group's offset for that partition.
(string = int16 length + UTF-8, all big-endian.) Values of versions 0-2 are read too.

Partitions: mqcore creates the topic with one partition, but a Kafka log directory has many
(offsets.topic.num.partitions, 50 by default), and a store opened on one, read-only or adopted
writable, reads them all. Kafka keeps each group's commits in one partition,
partition_for_group(group, count) (its GroupCoordinator.partitionFor); mqcore appends a
group's commits to that same partition. So every key lives in one partition, and replaying the
partitions one after another, last value per key winning, gives the committed state.

Why a compacted internal topic and not a checkpoint file: it recovers with the log's own
machinery (CRCs, truncation of a torn tail), a commit is one append of one batch (no rewrite of
a whole file per commit), and compaction keeps it at one record per key. The state is loaded by
replaying the topic (last value per key wins) on first use.

Durability: a commit appends its batch and then fdatasyncs the partition whatever the store's
flush policy is, so a committed offset survives a process kill and a power loss.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqcore.crashpoints import crash_point
from mqcore.errors import TopicExistsError
from mqcore.log.internal import ReplayedState

if TYPE_CHECKING:
    from mqcore.log.manager import Log

OFFSETS_TOPIC = "__consumer_offsets"
KEY_VERSION = 1
VALUE_VERSION = 3
OFFSETS_SEGMENT_BYTES = 100 << 20  # Kafka's offsets.topic.segment.bytes

GroupKey = tuple[str, str, int]  # (group, topic, partition)


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed offset: the next offset the group will consume, its metadata, when, and
    the leader epoch of the record before it as the client committed it (-1: none; Kafka
    clients send it back in their fetches to detect a truncated log, KIP-320)."""

    offset: int
    metadata: str = ""
    commit_time: int = -1
    leader_epoch: int = -1


def partition_for_group(group: str, partitions: int) -> int:
    """The partition of `__consumer_offsets` holding `group`'s commits, Kafka's rule:
    Utils.abs(group.hashCode()) % partitions, with Java's String.hashCode over UTF-16 code
    units (Utils.abs maps Integer.MIN_VALUE to 0)."""
    h = 0
    units = group.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    if h >= 1 << 31:
        h = 0 if h == 1 << 31 else (1 << 32) - h  # abs of the negative int32
    return h % partitions


def encode_string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_key(group: str, topic: str, partition: int) -> bytes:
    return (
        struct.pack(">h", KEY_VERSION)
        + encode_string(group)
        + encode_string(topic)
        + struct.pack(">i", partition)
    )


def encode_value(om: OffsetAndMetadata) -> bytes:
    return (
        struct.pack(">hqi", VALUE_VERSION, om.offset, om.leader_epoch)
        + encode_string(om.metadata)
        + struct.pack(">q", om.commit_time)
    )


class BigEndianReader:
    """Bounds-checked big-endian reads; any overrun raises ValueError."""

    def __init__(self, raw: bytes):
        self.raw, self.pos = raw, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.raw):
            raise ValueError("truncated")
        (v,) = struct.unpack_from(fmt, self.raw, self.pos)
        self.pos += size
        return int(v)

    def string(self) -> str:
        n = self.take(">h")
        if n < 0 or self.pos + n > len(self.raw):
            raise ValueError("bad string length")
        s = self.raw[self.pos : self.pos + n].decode()
        self.pos += n
        return s


def decode_key(raw: bytes | None) -> GroupKey | None:
    """(group, topic, partition), or None for a key that is not an offset commit (Kafka also
    stores group metadata, key version 2, in this topic); ValueError for one that is no key."""
    if raw is None:
        raise ValueError("no key")
    r = BigEndianReader(raw)
    version = r.take(">h")
    if version not in (0, 1):
        return None
    return r.string(), r.string(), r.take(">i")


def decode_value(raw: bytes) -> OffsetAndMetadata:
    r = BigEndianReader(raw)
    version = r.take(">h")
    offset = r.take(">q")
    leader_epoch = -1  # versions 0-2 have none
    if version == 3:
        leader_epoch = r.take(">i")
    elif version not in (0, 1, 2):
        raise ValueError(f"unknown offset value version {version}")
    metadata = r.string()
    commit_time = r.take(">q")
    return OffsetAndMetadata(offset, metadata, commit_time, leader_epoch)


class OffsetStore(ReplayedState[GroupKey, OffsetAndMetadata]):
    """The committed offsets of every group of one log, in memory after the first use. The
    replay reads every partition the log holds (a Kafka directory may lack some; a key lives in
    one); junk (not written by a commit) is skipped and reported, never fatal: one such record
    must not stop every consumer of every group."""

    def __init__(self, log: Log):
        super().__init__(log, OFFSETS_TOPIC, decode_key, decode_value, "an offset commit")

    def committed(self, group: str, topic: str, partition: int) -> OffsetAndMetadata | None:
        with self.lock:
            return self.loaded().get((group, topic, partition))

    def all_offsets(self) -> dict[GroupKey, OffsetAndMetadata]:
        """Every group's committed offsets (a copy)."""
        with self.lock:
            return dict(self.loaded())

    def group_offsets(self, group: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        with self.lock:
            return {(t, p): om for (g, t, p), om in self.loaded().items() if g == group}

    def topic(self) -> str:
        """`__consumer_offsets`, created (compacted, one partition) unless the log has it: at
        the first commit, or when a Kafka client names it before any group committed (Kafka's
        broker creates its internal topic then; Burrow reads it from the start)."""
        try:
            return self.log.internal_topic(
                OFFSETS_TOPIC,
                partitions=1,
                cleanup_policy="compact",
                unique_ids=False,
                key_index=False,
                segment_bytes=OFFSETS_SEGMENT_BYTES,
            )
        except TopicExistsError:  # created meanwhile by another thread
            return OFFSETS_TOPIC

    def commit(
        self, group: str, offsets: Mapping[tuple[str, int], OffsetAndMetadata | None]
    ) -> None:
        """Append one batch with every partition's commit (None deletes it), fdatasync it, then
        make it visible: once this returns the commit survives a power loss."""
        if not offsets:
            return
        with self.lock:
            self._write({(group, t, p): om for (t, p), om in offsets.items()})

    def _write(self, items: Mapping[GroupKey, OffsetAndMetadata | None]) -> None:
        """Append `items` (None: a tombstone) to `__consumer_offsets`, one batch per partition
        of it (a group's keys all go to partition_for_group's), fdatasync each, then make them
        visible. Call with the lock held."""
        if not items:
            return
        loaded = self.loaded()
        topic = self.topic()
        count = self.log.config(topic).partitions
        by_partition: dict[int, list[tuple[GroupKey, OffsetAndMetadata | None]]] = {}
        for key, om in sorted(items.items()):
            by_partition.setdefault(partition_for_group(key[0], count), []).append((key, om))
        for p, entries in sorted(by_partition.items()):
            self.log.append_records(
                topic,
                p,
                [None if om is None else encode_value(om) for _, om in entries],
                [encode_key(*key) for key, _ in entries],
            )
            crash_point("offsets.after_append")
            self.log.partition(topic, p).flush()  # the batch, and a new segment's names
            crash_point("offsets.after_fdatasync")
        for key, om in items.items():
            if om is None:
                loaded.pop(key, None)
            else:
                loaded[key] = om

    def expire(self, cutoffs: Mapping[str, int]) -> list[str]:
        """Tombstone every offset of each group of `cutoffs` whose newest commit time is at or
        before the group's cutoff (ms), all in one batch per partition, durable when this
        returns; the groups expired, sorted. Decided under the lock, so a commit that lands
        first keeps its group (docs/consume.md "Expiry of abandoned groups")."""
        with self.lock:
            newest: dict[str, int] = {}
            for (group, _, _), om in self.loaded().items():
                if group in cutoffs:
                    newest[group] = max(newest.get(group, om.commit_time), om.commit_time)
            expired = sorted(g for g, t in newest.items() if t <= cutoffs[g])
            gone = set(expired)
            self._write(dict.fromkeys((k for k in self.loaded() if k[0] in gone), None))
            return expired

    def delete_group(self, group: str) -> int:
        """Tombstone every committed offset of `group` (one batch); returns how many."""
        keys = list(self.group_offsets(group))
        self.commit(group, dict.fromkeys(keys))
        return len(keys)
