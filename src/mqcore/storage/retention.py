"""Retention: delete a partition's oldest whole segments by age and by size (Kafka's rules).

A sealed segment expires by time when its largest timestamp is older than now - retention_ms,
by size while the partition stays at or above retention_bytes without it (Kafka's rule: a
deletion never takes the log below the limit, so it may stay up to one segment above it).
Only a prefix of the log goes, never the active segment: when every segment expires, the active
one is rolled first so the log keeps an empty active segment at its end offset. The log start
offset is the first remaining segment's base offset.

Deletion is Kafka's: the segment leaves the list at once and its files are renamed to
`.deleted` (a crash from there on is finished at the next open, which drops `.deleted` files);
the files are closed and unlinked when the last reader that pinned the segment lets go.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from mqcore.crashpoints import crash_point
from mqcore.storage import durable
from mqcore.storage.loader import CLEANMARK_SUFFIX, SEGMENT_FILE_SUFFIXES
from mqcore.storage.partition import Partition
from mqcore.storage.segment import LOG_SUFFIX, LogSegment, segment_name

DELETED_SUFFIX = ".deleted"

# progress(done, total): segments looked at so far, of all in the pass
Progress = Callable[[int, int], None]


@dataclass
class RetentionReport:
    """What a retention pass deleted, and the log start offset of every partition it saw."""

    deleted_segments: list[str] = field(default_factory=list)  # "<topic>-<p>/<base>.log"
    deleted_bytes: int = 0
    start_offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def merge(self, other: RetentionReport) -> None:
        self.deleted_segments.extend(other.deleted_segments)
        self.deleted_bytes += other.deleted_bytes
        self.start_offsets.update(other.start_offsets)

    def to_json(self) -> dict[str, object]:
        return {
            "deleted_segments": list(self.deleted_segments),
            "deleted_bytes": self.deleted_bytes,
            "start_offsets": [
                {"topic": t, "partition": p, "start_offset": o}
                for (t, p), o in sorted(self.start_offsets.items())
            ],
        }


def applies(cleanup_policy: str) -> bool:
    return "delete" in cleanup_policy.split(",")


def expired_prefix(segments: list[LogSegment], retention_ms: int, retention_bytes: int,
                   now: int) -> int:  # fmt: skip
    """How many leading segments (the active one included) retention would delete."""
    by_time = 0
    if retention_ms >= 0:
        limit = now - retention_ms
        while by_time < len(segments) and segments[by_time].max_timestamp < limit:
            by_time += 1
    by_size = 0
    if retention_bytes >= 0:
        excess = sum(s.size for s in segments) - retention_bytes
        while by_size < len(segments) and excess - segments[by_size].size >= 0:
            excess -= segments[by_size].size
            by_size += 1
    return max(by_time, by_size)


def segment_files(seg: LogSegment) -> list[str]:
    """Paths of the segment's files that exist, the .log first."""
    stem = os.path.join(seg.directory, segment_name(seg.base_offset))
    suffixes = [LOG_SUFFIX] + [s for s in SEGMENT_FILE_SUFFIXES if s != LOG_SUFFIX]
    return [stem + s for s in suffixes if os.path.exists(stem + s)]


def retire_files(seg: LogSegment, keep_open: bool) -> list[str]:
    """Rename the segment's files to `.deleted` (its open descriptors and mappings go on
    working), the `.log` first: a reader's listing drops the whole segment at that one rename,
    never a log whose indexes are gone. `keep_open`: readers hold it, open it first. Returns
    the new paths."""
    seg.retire(keep_open)
    out = []
    for path in segment_files(seg):
        os.rename(path, path + DELETED_SUFFIX)
        out.append(path + DELETED_SUFFIX)
    return out


def disposer(part: Partition, seg: LogSegment, paths: list[str], point: str) -> Callable[[], None]:
    """The deferred end of a retired segment: close its files, then unlink the `.deleted` ones."""

    def dispose() -> None:
        with part.sync_lock():  # a flush() may hold its descriptor
            seg.writable = False  # sealed already: close without trimming by path
            seg.close()
        crash_point(point)
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    return dispose


def apply_partition(part: Partition, now: int) -> RetentionReport:
    """One retention pass over one partition: its expired prefix (expired_prefix) goes; when
    every segment expired, the active one is rolled first so it can go too (Kafka's rule)."""
    cfg = part.config
    return _delete_leading(
        part, lambda segs: expired_prefix(segs, cfg.retention_ms, cfg.retention_bytes, now), True
    )


def delete_below(part: Partition, offset: int) -> RetentionReport:
    """Move the log start to the segment boundary at or below `offset`: the leading segments
    that end at or below it go (never the active one), by retention's steps (Kafka's
    deleteRecords on whole segments; consume/trim.py uses it for the internal topics)."""

    def below(segs: list[LogSegment]) -> int:
        count = 0
        while count < len(segs) - 1 and segs[count + 1].base_offset <= offset:
            count += 1
        return count

    return _delete_leading(part, below, False)


def _delete_leading(
    part: Partition, how_many: Callable[[list[LogSegment]], int], roll_all: bool
) -> RetentionReport:
    """Delete the first `how_many(segments)` segments (never the active one; with `roll_all`,
    roll first when that is all of them): out of the list at once, `.log` then the other files
    renamed to `.deleted`, the directory fsync'd, the files unlinked when no reader pins them."""
    report = RetentionReport()

    def retire(seg: LogSegment, pinned: bool) -> Callable[[], None]:
        paths = retire_files(seg, pinned)
        return disposer(part, seg, paths, "retention.before_unlink")

    with part.maintenance:
        taken = part.delete_oldest(how_many, roll_all, retire)
        if taken is None:
            return report
        report.start_offsets[(part.topic, part.partition)] = taken.start_offset
        if taken.victims:
            durable.sync_dir(part.directory)
            crash_point("retention.after_deleted")
        for dispose in taken.dispose_now:
            dispose()
    for seg, size in taken.victims:
        report.deleted_segments.append(
            f"{part.topic}-{part.partition}/{segment_name(seg.base_offset)}.log"
        )
        report.deleted_bytes += size
    return report


def apply(parts: list[Partition], now: int, progress: Progress | None = None) -> RetentionReport:
    """Retention over `parts` (the caller picked those whose cleanup policy has "delete")."""
    report = RetentionReport()
    total = sum(len(p.segments) for p in parts)
    done = 0
    if progress is not None:
        progress(0, total)
    for part in parts:
        n = len(part.segments)
        report.merge(apply_partition(part, now))
        done += n
        if progress is not None:
            progress(done, total)
    return report


__all__ = [
    "CLEANMARK_SUFFIX",
    "RetentionReport",
    "apply",
    "apply_partition",
    "delete_below",
    "expired_prefix",
]
