"""mqcore's query options in a Spark task (docs/spark.md "Queries"): the records of one offset
range that match them, found by the store's engine (Store.search, find_by_key,
find_by_unique_id, get_by_id: the key and unique-ID indexes, the scan kernel for tag, SQL92,
contains and regex) instead of handing Spark every record to filter.

The range is the task's (the offset and time bounds already resolved into it: plan.py), so
a query answers within the read's bounds; each search starts at the range's first offset
(a cursor there) and goes page by page until it passes the range's end. The matches become
Arrow batches in the read's Spark schema, at most maxRecordsPerBatch rows each.
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


def query_messages(store: Store, rng: OffsetRange, q: Query, level: str) -> Iterator[Message]:
    """The records of `rng` that match `q`, in offset order, as a reader at `level` sees
    them."""
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
    if not q.keys:
        yield from _search(store, rng, level, q.scan_filters)
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
    includeHeaders or includeExtras asks for them)."""
    assert opts.query is not None
    include_headers = opts.include_headers or opts.include_extras
    page: list[Message] = []
    for m in query_messages(store, rng, opts.query, opts.isolation_level):
        page.append(m)
        if len(page) >= opts.max_records_per_batch:
            yield messages_batch(page, include_headers)
            page = []
    if page:
        yield messages_batch(page, include_headers)


def messages_batch(msgs: list[Message], include_headers: bool) -> pa.RecordBatch:
    """`msgs` as one RecordBatch of arrow.kafka_schema (timestamps in microseconds); the
    headers as one flat key array and one value array cut by list offsets, not a Python
    object per header."""
    import pyarrow as pa

    from mqcore.arrow import kafka_schema

    schema = kafka_schema(include_headers)
    arrays = [
        pa.array([m.key for m in msgs], pa.binary()),
        pa.array([m.value for m in msgs], pa.binary()),
        pa.array([m.topic for m in msgs], pa.string()),
        pa.array([m.partition for m in msgs], pa.int32()),
        pa.array([m.offset for m in msgs], pa.int64()),
        pa.array([m.timestamp * 1000 for m in msgs], pa.int64()).cast(schema.field(5).type),
        pa.array([m.timestamp_type for m in msgs], pa.int32()),
    ]
    if include_headers:
        names: list[str] = []
        values: list[bytes | None] = []
        ends = [0]
        for m in msgs:
            for k, v in m.headers:
                names.append(k)
                values.append(v)
            ends.append(len(names))
        field = schema.field(7).type.value_type
        pairs = pa.StructArray.from_arrays(
            [pa.array(names, pa.string()), pa.array(values, pa.binary())],
            fields=list(field),
        )
        arrays.append(pa.ListArray.from_arrays(pa.array(ends, pa.int32()), pairs,
                                               type=schema.field(7).type))  # fmt: skip
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
