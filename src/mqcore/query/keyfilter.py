"""A key lookup with scan filters: Store.search(key=..., where=/contains=/tag=/regex=).

The key index names the few records that may carry a key (query/keyed.pyx, each hit checked
against its record), so the lookup comes first and the filters run on its hits, in Python
(ScanSpec.matches: the scan kernel's rules). A scan with a key predicate would read every
record of the time window to find the same few; the lookup reads only its hits. A key with a
great many messages costs a point read per message, still no more than the scan's decoding of
each.

In partition order the hits come partition by partition, in offset order, with a `c1-`
cursor like find_by_key's; in time order each partition is a stream of query/merge.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from mqcore._ext.batch import Message
from mqcore._ext.lookup import KEY_KIND
from mqcore.errors import QueryInterrupted
from mqcore.query.engine import (
    INTERRUPTED,
    LIMIT,
    MAX_LIMIT,
    MAX_SCAN,
    NO_END,
    TIME_ORDER,
    TIMEOUT,
    PlaceT,
    QueryResult,
    ScanBudget,
    ScanSpec,
    decode_cursor,
    encode_cursor,
    page_budget,
    query_bytes,
    resume_points,
)
from mqcore.query.keyed import find_indexed
from mqcore.query.merge import Fetch, Fetched, merge_by_time
from mqcore.storage.partition import Partition

FILTERED_PAGE = 1024  # hits one lookup reads when filters may reject most of them


def key_fetch(raw: bytes, spec: ScanSpec) -> Fetch[Partition]:
    """A stream of one partition's messages carrying `raw` that pass `spec`: pages of key
    index hits from an offset, filtered, until `want` pass, the hits end or the budget does."""
    filtered = any(f is not None for f in (spec.needle, spec.tag, spec.pattern, spec.selector))
    lo = spec.lo or None
    hi = None if spec.hi == NO_END else spec.hi

    def fetch(
        part: Partition, offset: int, end: int, want: int, records: int, deadline: float
    ) -> Fetched:
        found: list[Message] = []
        scanned = 0
        cursor = encode_cursor(part.partition, offset)
        while True:
            end = min(end, part.end_offset)  # every hit below it is seen when a lookup ends
            page = min(MAX_LIMIT, max(want, FILTERED_PAGE)) if filtered else want
            r = find_indexed([part], raw, KEY_KIND, lo, hi, page, cursor)
            scanned += r.scanned_records
            for m in r.messages:
                if m.offset >= end:
                    return Fetched(found, max(offset, end), None, scanned)
                if spec.matches(m):
                    found.append(m)
                    if len(found) >= want:
                        return Fetched(found, m.offset + 1, LIMIT, scanned)
            if r.cursor is None:
                return Fetched(found, max(offset, end), None, scanned)
            cursor = r.cursor
            next_offset = decode_cursor(cursor)[1]
            if scanned >= records:
                return Fetched(found, next_offset, MAX_SCAN, scanned)
            if time.monotonic() >= deadline:
                return Fetched(found, next_offset, TIMEOUT, scanned)

    return fetch


def run_key_search(
    parts: Sequence[Partition],
    key: bytes | str,
    spec: ScanSpec,
    order: str,
    limit: int,
    max_scan: int,
    timeout: float | None,
    cursor: str | None,
) -> QueryResult:
    """Messages of `parts` carrying `key` (as key or `keys` word) that pass `spec`, in
    `order`. `scanned_records` counts the key index hits read."""
    fetch = key_fetch(query_bytes(key, "key"), spec)
    budget = page_budget(limit, max_scan, timeout)
    if order == TIME_ORDER:
        return merge_by_time(parts, fetch, budget, cursor, spec)
    decode_cursor(cursor)  # a bad cursor is refused before anything is read
    result = QueryResult()
    try:
        in_partition_order(parts, fetch, budget, cursor, result)
    except KeyboardInterrupt:
        result.reason = INTERRUPTED
        result.missing_properties = spec.missing_properties()
        raise QueryInterrupted(result) from None
    result.missing_properties = spec.missing_properties()
    return result


def in_partition_order(
    parts: Sequence[PlaceT],
    fetch: Fetch[PlaceT],
    budget: ScanBudget,
    cursor: str | None,
    result: QueryResult,
) -> None:
    """Each partition's stream to its end in turn, into `result`, until the budget stops one
    (its reason and cursor then end the result). The cursor is kept current, so a Ctrl-C
    leaves the place to resume from (the interrupted fetch's finds are not in the result)."""
    for part, offset in resume_points(parts, cursor):
        result.cursor = encode_cursor(part.partition, offset)
        got = fetch(
            part,
            offset,
            NO_END,
            budget.limit - len(result.messages),
            max(1, budget.max_scan - result.scanned_records),
            budget.deadline,
        )
        result.messages += got.messages
        result.scanned_records += got.scanned_records
        if got.stop is not None:
            result.reason = got.stop
            result.cursor = encode_cursor(part.partition, got.next_offset)
            return
    result.cursor = None
