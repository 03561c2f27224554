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
from typing import TYPE_CHECKING

from mqcore.storage.retention import delete_below

if TYPE_CHECKING:
    from mqcore.storage.partition import Partition

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


def segment_bases(part: Partition) -> list[int]:
    """Base offsets of the partition's segments, oldest first, at one moment."""
    with part.locked():
        return [seg.base_offset for seg in part.segments]


__all__ = ["MAX_MOVES", "delete_below", "segment_bases", "trim_point"]
