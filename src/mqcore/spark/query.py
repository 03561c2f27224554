"""mqcore's query options in a Spark task (docs/spark.md "Queries"): the records of one offset
range that match them, found by the store's engine (Store.search, find_by_key,
find_by_unique_id, get_by_id: the key and unique-ID indexes, the scan kernel for tag, SQL92,
contains and regex) instead of handing Spark every record to filter.

The range is the task's (the offset and time bounds already resolved into it: plan.py), so
a query answers within the read's bounds. A scan (tag, where, contains, regex) is the
kernel's, which adds each match to the Arrow columns itself (Store.iter_arrow_matching); a
key's search starts at the range's first offset (a cursor there) and goes page by page until
it passes the range's end. The matches are Arrow batches in the read's Spark schema, at most
maxRecordsPerBatch rows each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mqcore.query.engine import EXHAUSTED, decode_cursor, encode_cursor, make_spec
from mqcore.spark.options import Query, ReadOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore._ext.batch import Message
    from mqcore.spark.plan import OffsetRange
    from mqcore.store import Store

PAGE = 10_000  # matches one search returns
NO_SCAN_LIMIT = 1 << 62  # a task reads its whole range: no max_scan


def lookup_messages(store: Store, rng: OffsetRange, q: Query, level: str) -> Iterator[Message]:
    """The records of `rng` that a lookup (msgId, uniqueId or keys) finds and `q`'s filters
    pass, in offset order, as a reader at `level` sees them."""
    if rng.start >= rng.end:
        return
    spec = make_spec(None, None, q.contains, q.regex, q.tag, q.where)
    if q.msg_id is not None:
        topic, partition, offset = q.msg_id
        if (topic, partition) == (rng.topic, rng.partition) and rng.start <= offset < rng.end:
            m = store.get(topic, partition, offset, isolation_level=level)
            if m is not None and spec.matches(m):
                yield m
        return
    if q.unique_id is not None:
        found = store.find_by_unique_id(q.unique_id, limit=PAGE, isolation_level=level,
                                        topics=lambda t: t == rng.topic)  # fmt: skip
        yield from sorted((m for m in found.messages if m.partition == rng.partition
                           and rng.start <= m.offset < rng.end and spec.matches(m)),
                          key=lambda m: m.offset)  # fmt: skip
        return
    hits: dict[int, Message] = {}
    for key in q.keys:  # each key's hits; a record with two of the keys once
        for m in _search(store, rng, level, {**q.scan_filters, "key": key}):
            hits.setdefault(m.offset, m)
    yield from (hits[o] for o in sorted(hits))


def _search(
    store: Store, rng: OffsetRange, level: str, filters: dict[str, Any]
) -> Iterator[Message]:
    """Store.search of the range's partition from its start, page by page, to its end."""
    cursor: str | None = encode_cursor(rng.partition, rng.start)
    while cursor is not None:
        r = store.search(rng.topic, partition=rng.partition, cursor=cursor, limit=PAGE,
                         max_scan=NO_SCAN_LIMIT, isolation_level=level, **filters)  # fmt: skip
        for m in r.messages:
            if m.offset >= rng.end:
                return
            yield m
        if r.reason == EXHAUSTED or r.cursor is None:
            return
        if decode_cursor(r.cursor)[1] >= rng.end:
            return
        cursor = r.cursor


def query_batches(store: Store, rng: OffsetRange, opts: ReadOptions) -> Iterator[pa.RecordBatch]:
    """The matches of `rng` as Arrow batches in the Kafka source's schema (with headers when
    includeHeaders or includeExtras asks for them). A scan (tag, where, contains, regex) has
    the kernel fill the Arrow columns (Store.iter_arrow_matching); a lookup (keys, msgId,
    uniqueId) turns its few hits into a batch."""
    from mqcore.arrow import messages_batch

    q = opts.query
    assert q is not None
    include_headers = opts.include_headers or opts.include_extras
    if not q.keys and q.msg_id is None and q.unique_id is None:
        if rng.start < rng.end:
            yield from store.iter_arrow_matching(
                rng.topic, rng.partition, rng.start, rng.end, include_headers=include_headers,
                max_records=opts.max_records_per_batch, max_bytes=opts.max_bytes_per_batch,
                isolation_level=opts.isolation_level, **q.scan_filters,
            )  # fmt: skip
        return
    page: list[Message] = []
    for m in lookup_messages(store, rng, q, opts.isolation_level):
        page.append(m)
        if len(page) >= opts.max_records_per_batch:
            yield messages_batch(page, include_headers)
            page = []
    if page:
        yield messages_batch(page, include_headers)
