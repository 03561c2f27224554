"""Trimming the internal topics of transactions and delays: which prefix may go, and deleting it.

`__txn_half` and `__delay` are logs of parked messages; `__txn_op` and `__delay_state` are the
logs of their bookkeeping. None of them has a retention limit (a parked message must wait as long
as its transaction stays open or its delay runs), so they are trimmed by *resolution* instead
(docs/consume.md "Trimming the internal topics"): as Kafka's retention, only a prefix of whole
segments goes, never the active one, so the log start moves forward and no offset changes.

A prefix of a parked log may go when nothing below its end is live (an open transaction's half
message, a pending delayed message). One long-lived message would pin the whole log behind it,
so live messages below a chosen boundary are first re-parked: copied to the end of the log with
a header naming where they were first parked (delay.H_MOVED), as RocketMQ's transaction check
puts half messages back and its timer store rolls long delays. `trim_point` picks the boundary
so that the copies never cost more than half of what the trim frees.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from mqcore.storage import durable
from mqcore.storage.partition import Partition
from mqcore.storage.retention import RetentionReport, disposer, retire_files
from mqcore.storage.segment import segment_name

MAX_MOVES = 10_000  # live messages re-parked by one trim pass


def trim_point(bases: Sequence[int], live: Sequence[int], cap: int) -> int:
    """The segment boundary below which a parked log is trimmed (its first base: nothing).

    `bases` are the base offsets of the log's segments, oldest first (the last one, the active
    segment, is never freed); `live` the sorted offsets of the live messages, which are re-parked
    before the trim; nothing at or above `cap` may be freed (a message that cannot be moved).
    The highest boundary whose live messages below it are at most half of its records (and at
    most MAX_MOVES): each copy frees at least one record, so copying costs at most one write per
    record trimmed, whatever the delays or transaction lifetimes are.
    """
    best = bases[0]
    for base in bases[1:]:
        if base > cap:
            break
        moved = bisect.bisect_left(live, base)
        if moved <= MAX_MOVES and 2 * moved <= base - bases[0]:
            best = base
    return best


def delete_below(part: Partition, offset: int) -> RetentionReport:
    """Delete the partition's leading segments that end at or below `offset` (never the active
    one), with retention's protocol (storage/retention.py): out of the segment list at once,
    files renamed to `.deleted`, the directory fsync'd, files unlinked when no reader pins them.

    This is the one storage capability trimming needs, "move the log start to the segment
    boundary at or below `offset`" (Kafka's deleteRecords on whole segments). The storage layer
    has no such call yet; this mirrors `retention.apply_partition`'s deletion step and should
    become `storage.retention.delete_below(part, offset)`.
    """
    report = RetentionReport()
    with part.maintenance:
        victims: list[tuple[str, int]] = []
        now_dispose = []
        with part._lock:
            if part.closed or not part.writable:
                return report
            count = 0
            while count < len(part.segments) - 1 and part.segments[count + 1].base_offset <= offset:
                count += 1
            for seg in part.segments[:count]:
                victims.append((segment_name(seg.base_offset), seg.size))
                dispose = disposer(part, seg, retire_files(seg), "retention.before_unlink")
                if part.retire(seg, dispose):
                    now_dispose.append(dispose)
            del part.segments[:count]
            del part._bases[:count]
            report.start_offsets[(part.topic, part.partition)] = part.start_offset
        if victims:
            durable.sync_dir(part.directory)
        for dispose in now_dispose:
            dispose()
    for name, size in victims:
        report.deleted_segments.append(f"{part.topic}-{part.partition}/{name}.log")
        report.deleted_bytes += size
    return report


__all__ = ["MAX_MOVES", "delete_below", "trim_point"]
