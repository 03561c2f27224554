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

**A Kafka transaction's offsets** (TxnOffsetCommit: the group's coordinator holds them until
the transaction's COMMIT or ABORT reaches `__consumer_offsets`, as Kafka's does) are
mqcore's own record in the same topic, one per (producer, group), in the group's partition,
written and fdatasync'd before the request is answered and replayed like the commits
(PendingTxnOffsets; Kafka writes them as offset commits in transactional batches instead):
  key   = int16 version (100), int64 producer id, string group
  value = int16 version (0), int16 producer epoch, int32 count, count x (string topic,
          int32 partition, int64 offset, int32 leader epoch, string metadata)
The transaction's end writes the group's offset commits (on COMMIT), then a tombstone for
the record; ended twice (a marker sent again after a crash), the second finds nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mqcore.crashpoints import crash_point
from mqcore.errors import ProducerFencedError, TopicExistsError
from mqcore.log.internal import ReplayedState

if TYPE_CHECKING:
    from mqcore.log.manager import Log

OFFSETS_TOPIC = "__consumer_offsets"
KEY_VERSION = 1
VALUE_VERSION = 3
PENDING_KEY_VERSION = 100  # mqcore's own: a transaction's offsets, not yet ended
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


PendingKey = tuple[int, str]  # (producer id, group)
TopicOffsets = dict[tuple[str, int], OffsetAndMetadata]


@dataclass(frozen=True, slots=True)
class PendingOffsets:
    """A group's offsets in one open transaction of a producer (at `epoch`)."""

    epoch: int
    offsets: TopicOffsets


def encode_pending_key(producer_id: int, group: str) -> bytes:
    return struct.pack(">hq", PENDING_KEY_VERSION, producer_id) + encode_string(group)


def decode_pending_key(raw: bytes | None) -> PendingKey | None:
    if raw is None:
        raise ValueError("no key")
    r = BigEndianReader(raw)
    if r.take(">h") != PENDING_KEY_VERSION:
        return None
    return r.take(">q"), r.string()


def encode_pending(p: PendingOffsets) -> bytes:
    parts = [struct.pack(">hhi", 0, p.epoch, len(p.offsets))]
    for (t, part), om in sorted(p.offsets.items()):
        parts += [encode_string(t), struct.pack(">iqi", part, om.offset, om.leader_epoch),
                  encode_string(om.metadata)]  # fmt: skip
    return b"".join(parts)


def decode_pending(raw: bytes) -> PendingOffsets:
    r = BigEndianReader(raw)
    if r.take(">h") != 0:
        raise ValueError("unknown pending offsets version")
    epoch, count = r.take(">h"), r.take(">i")
    offsets: TopicOffsets = {}
    for _ in range(count):
        topic = r.string()
        partition, offset, leader_epoch = r.take(">i"), r.take(">q"), r.take(">i")
        offsets[(topic, partition)] = OffsetAndMetadata(offset, r.string(), -1, leader_epoch)
    return PendingOffsets(epoch, offsets)


class PendingTxnOffsets(ReplayedState[PendingKey, PendingOffsets]):
    """The transactions' offsets not yet ended, by (producer id, group) (module doc)."""

    def __init__(self, log: Log):
        super().__init__(log, OFFSETS_TOPIC, decode_pending_key, decode_pending,
                         "a transaction's pending offsets")  # fmt: skip


class OffsetStore(ReplayedState[GroupKey, OffsetAndMetadata]):
    """The committed offsets of every group of one log, in memory after the first use. The
    replay reads every partition the log holds (a Kafka directory may lack some; a key lives in
    one); junk (not written by a commit) is skipped and reported, never fatal: one such record
    must not stop every consumer of every group."""

    def __init__(self, log: Log):
        super().__init__(log, OFFSETS_TOPIC, decode_key, decode_value, "an offset commit")
        self.pending = PendingTxnOffsets(log)

    def reload(self) -> None:
        super().reload()
        self.pending.reload()

    def stage_txn(self, producer_id: int, epoch: int, group: str, offsets: TopicOffsets) -> None:
        """Hold `offsets` of `group` for the producer's open transaction (TxnOffsetCommit),
        durable when this returns; ProducerFencedError for an epoch older than one held."""
        with self.lock, self.pending.lock:
            pending = self.pending.loaded()
            held = pending.get((producer_id, group))
            if held is not None and held.epoch > epoch:
                raise ProducerFencedError(
                    f"producer {producer_id} epoch {epoch} is fenced: its offsets for group "
                    f"{group!r} are held at epoch {held.epoch}"
                )
            merged = PendingOffsets(
                epoch, {**(held.offsets if held and held.epoch == epoch else {}), **offsets}
            )
            self._append({encode_pending_key(producer_id, group): encode_pending(merged)}, group)
            pending[(producer_id, group)] = merged

    def end_txn(self, producer_id: int, commit: bool, now: int) -> int:
        """The end of the producer's transaction reached the offsets: on commit its groups'
        offsets are committed (commit time `now`), then what was held is dropped, both durable
        when this returns; the number of groups committed."""
        with self.lock, self.pending.lock:
            pending = self.pending.loaded()
            held = sorted((g, p) for (pid, g), p in pending.items() if pid == producer_id)
            if commit:
                self._write({(g, t, part): OffsetAndMetadata(om.offset, om.metadata, now,
                                                             om.leader_epoch)
                             for g, p in held for (t, part), om in p.offsets.items()})  # fmt: skip
            for g, _ in held:
                self._append({encode_pending_key(producer_id, g): None}, g)
                del pending[(producer_id, g)]
            return len(held) if commit else 0

    def pending_groups(self, producer_id: int) -> list[str]:
        """The groups whose offsets the producer's open transaction holds here."""
        with self.pending.lock:
            return sorted(g for pid, g in self.pending.loaded() if pid == producer_id)

    def _append(self, records: Mapping[bytes, bytes | None], group: str) -> None:
        """Append raw records to the group's partition and fdatasync them."""
        topic = self.topic()
        p = partition_for_group(group, self.log.config(topic).partitions)
        self.log.append_records(topic, p, list(records.values()), list(records))
        self.log.partition(topic, p).flush()

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
