"""The message browser's query: the form (the page's query string, so a URL is shareable)
checked field by field, and turned into the Store call that answers it.

- from=beginning: every selected partition from its start; from=offset: one partition from
  that offset (a query cursor placed there); from=time: messages with timestamp >= the time
  (the time index skips the segments before it); from=end: the newest `limit` messages of
  the selected partitions (before `to`), in time order: resolved once into a time-order
  cursor placed at them, carried by the query's links as `tail` (the page shows the time of
  the oldest of them). `to` bounds every one of them above (exclusive).
- order: "time" merges the partitions by timestamp (Store.search(order="time")), "partition"
  gives them one after the other; "auto" (the default) is time order when the query has a
  time bound or starts from the end, else partition order.
- key: the key index (Store.find_by_key), answered in one call; with tag, where, contains or
  regex, or in time order, Store.search(key=...). tag, where (SQL92), contains and regex:
  Store.search, which the page calls in chunks of CHUNK_SECONDS with the cursor of the
  previous chunk, until the page is full or the query ends.
- isolation_level: read_uncommitted (the default, as Kafka's consumer and every reader of the
  project: every record, transactions' control markers never) or read_committed (only
  what a read_committed consumer sees: below the last stable offset, no aborted record).
- Times in the form are wall-clock times of `tz` (an IANA zone name; UTC by default), shown
  beside the picker; the result rows show timestamps in the same zone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mqcore.errors import InvalidConfigError
from mqcore.query.engine import (
    PARTITION_ORDER,
    TIME_ORDER,
    QueryResult,
    decode_cursor,
    encode_cursor,
    make_spec,
    shown,
)
from mqcore.query.merge import decode_time_cursor, encode_time_cursor
from mqcore.server.httpbase import DEFAULT_MAX_SCAN, Params
from mqcore.storage.txnindex import READ_UNCOMMITTED, check_isolation
from mqcore.store import Store

FROM = ("beginning", "end", "offset", "time")
ORDERS = ("auto", TIME_ORDER, PARTITION_ORDER)
DEFAULT_PAGE = 50  # rows a page shows when the form names no limit
MAX_PAGE = 1000
CHUNK_SECONDS = 0.3  # one chunk's scan: a browser that goes away leaves at most this running
MAX_HISTORY = 200  # pages the back link remembers
# `tail` (a time-order cursor) is not a form input: from=end's place, resolved when the
# query's first page was made and carried by its rows and paging links (a new submission of
# the form resolves it anew)
FORM_FIELDS = ("partition", "from", "offset", "time", "to", "tz", "order", "key", "tag",
               "where", "contains", "regex", "limit", "max_scan", "isolation_level",
               "tail")  # fmt: skip
PAGE_FIELDS = (*FORM_FIELDS, "cursor", "hist")
_ZONE = re.compile(r"[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+){0,2}")


def form_params(request_params: Params) -> dict[str, str]:
    """The query string's fields with the empty ones left out (a submitted form sends every
    field, filled or not)."""
    return {k: v for k, v in request_params.values.items() if v != ""}


def parse_zone(name: str | None) -> tzinfo:
    """An IANA time zone (Europe/Paris) or UTC; InvalidConfigError for anything else."""
    if name is None or name.upper() == "UTC":
        return timezone.utc
    if not _ZONE.fullmatch(name) or ".." in name:
        raise InvalidConfigError(f"tz {shown(name)} is not a time zone name (UTC, Europe/Paris)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise InvalidConfigError(f"tz {shown(name)} is not a known time zone") from e


def parse_time(name: str, text: str, tz: tzinfo) -> int:
    """A date-time picker's value (YYYY-MM-DDTHH:MM[:SS[.fff]]) in `tz`, as ms."""
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        dt = None
    if dt is None or dt.tzinfo is not None or len(text) > 40:
        raise InvalidConfigError(
            f"{name} {shown(text)} is not a date and time (YYYY-MM-DDTHH:MM[:SS])"
        )
    ms = int(dt.replace(tzinfo=tz).timestamp() * 1000)
    if ms < 0:
        raise InvalidConfigError(f"{name} {shown(text)} is before 1970")
    return ms


@dataclass
class BrowseQuery:
    """The checked form."""

    fields: dict[str, str]  # what was given, to rebuild links
    partition: int | None
    start_from: str
    offset: int | None
    start: int | None  # ms, inclusive
    end: int | None  # ms, exclusive
    tz: tzinfo
    key: bytes | None
    tag: str | None
    where: str | None
    contains: bytes | None
    regex: str | None
    limit: int
    max_scan: int
    cursor: str | None
    order: str = PARTITION_ORDER
    tail: str | None = None  # from=end's time-order cursor
    isolation_level: str = READ_UNCOMMITTED
    history: list[str] = field(default_factory=list)  # cursors of the pages before ("-": none)

    @property
    def filters(self) -> bool:
        return any(v is not None for v in (self.key, self.tag, self.where, self.contains,
                                            self.regex))  # fmt: skip

    @property
    def scan_filters(self) -> bool:
        return any(v is not None for v in (self.tag, self.where, self.contains, self.regex))


def parse_query(store: Store, topic: str, params: Params) -> BrowseQuery:
    """The form checked against the topic (UnknownTopicError first); InvalidConfigError
    names the first bad field."""
    partitions = store.partitions(topic)
    values = form_params(params)
    params.values = values
    part_text = values.get("partition", "all")
    partition = None
    if part_text != "all":
        partition = params.integer("partition")
        assert partition is not None
        if partition >= partitions:
            raise InvalidConfigError(f"partition {partition} is not one of {topic}'s {partitions}")
    start_from = values.get("from", "beginning")
    if start_from not in FROM:
        raise InvalidConfigError(f"from must be one of {', '.join(FROM)}, not {shown(start_from)}")
    tz = parse_zone(values.get("tz"))
    offset = params.integer("offset")
    start = end = None
    if start_from == "offset":
        if offset is None or partition is None:
            raise InvalidConfigError("from=offset needs an offset and one partition")
    if start_from == "time":
        if "time" not in values:
            raise InvalidConfigError("from=time needs a time")
        start = parse_time("time", values["time"], tz)
    if "to" in values:
        end = parse_time("to", values["to"], tz)
    order = query_order(values.get("order", "auto"), start_from, start, end)
    key = params.bytes("key")
    tag, where, regex = params.text("tag"), params.text("where"), params.text("regex")
    contains = params.bytes("contains")
    make_spec(start, end, contains, regex, tag, where)  # a bad one answers the page
    limit = params.count("limit", DEFAULT_PAGE)
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidConfigError(f"limit must be 1 to {MAX_PAGE}, not {limit}")
    max_scan = params.count("max_scan", DEFAULT_MAX_SCAN)
    if max_scan < 1:
        raise InvalidConfigError("max_scan must be >= 1")
    cursor = params.text("cursor")
    check = decode_time_cursor if order == TIME_ORDER else decode_cursor
    check(cursor)  # InvalidConfigError for a cursor no query wrote
    history = [h for h in values.get("hist", "").split(",") if h]
    if len(history) > MAX_HISTORY:
        history = history[-MAX_HISTORY:]
    for h in history:
        if h != "-":
            check(h)
    q = BrowseQuery(
        {k: v for k, v in values.items() if k in FORM_FIELDS}, partition, start_from, offset,
        start, end, tz, key, tag, where, contains, regex, limit, max_scan, cursor, order,
    )  # fmt: skip
    q.history = history
    q.isolation_level = values.get("isolation_level", READ_UNCOMMITTED)
    check_isolation(q.isolation_level)
    if start_from == "end":
        q.tail = values.get("tail") or tail_cursor(store, topic, q)
        decode_time_cursor(q.tail)  # InvalidConfigError for a tail no page wrote
        q.fields["tail"] = q.tail
    return q


def query_order(text: str, start_from: str, start: int | None, end: int | None) -> str:
    """The order a browser query reads in: `text` (auto, time or partition); auto is time
    order for a time window or from=end, else partition order. from=end is a place in time
    order only (InvalidConfigError with partition order)."""
    if text not in ORDERS:
        raise InvalidConfigError(f"order must be one of {', '.join(ORDERS)}, not {shown(text)}")
    if text == "auto":
        timed = start_from == "end" or start is not None or end is not None
        return TIME_ORDER if timed else PARTITION_ORDER
    if start_from == "end" and text == PARTITION_ORDER:
        raise InvalidConfigError(
            "from=end shows the newest messages of all partitions in time order: choose "
            "order time (or auto), or from=offset in one partition"
        )
    return text


def tail_cursor(store: Store, topic: str, q: BrowseQuery) -> str:
    """from=end as a time-order cursor placed at the newest `limit` messages of the selected
    partitions (before `to`): each partition's newest `limit` are read, the newest `limit`
    of them all by (timestamp, partition, offset) kept, and each partition placed at its first
    kept one (or at its end). Paging from it shows exactly them, newest last."""
    parts = store.available_partitions(topic) if q.partition is None else [q.partition]
    ends, newest = {}, []
    for p in parts:
        start, end = store.start_offset(topic, p), store.end_offset(topic, p)
        if q.end is not None:
            before = store.offset_for_time(topic, p, q.end)
            end = end if before is None else before
        ends[p] = end
        if end > start:
            newest += store.read(topic, p, max(start, end - q.limit), min(q.limit, end - start),
                                 isolation_level=q.isolation_level)  # fmt: skip
    newest.sort(key=lambda m: (m.timestamp, m.partition, m.offset))
    for m in reversed(newest[-q.limit :]):
        ends[m.partition] = m.offset
    return encode_time_cursor(ends)


def tail_time(store: Store, topic: str, tail: str) -> int | None:
    """The timestamp of the oldest message a from=end cursor is placed at (None: none)."""
    times = []
    for p, offset in decode_time_cursor(tail).items():
        m = store.get(topic, p, offset) if offset < store.end_offset(topic, p) else None
        if m is not None:
            times.append(m.timestamp)
    return min(times) if times else None


def first_cursor(q: BrowseQuery) -> str | None:
    """Where the query starts: the page's cursor, from=offset's place or from=end's."""
    if q.cursor is not None:
        return q.cursor
    if q.start_from == "offset" and q.partition is not None and q.offset is not None:
        if q.order == TIME_ORDER:
            return encode_time_cursor({q.partition: q.offset})
        return encode_cursor(q.partition, q.offset)
    return q.tail


def run_chunk(
    store: Store, topic: str, q: BrowseQuery, cursor: str | None, limit: int, max_scan: int
) -> QueryResult:
    """One call of the Store for the page: a key alone in partition order from the key index
    in one go; anything else for at most CHUNK_SECONDS (reason "timeout" and a cursor to go
    on from)."""
    if key_lookup(q):
        assert q.key is not None
        return store.find_by_key(
            topic, q.key, start=q.start, end=q.end, limit=limit, partition=q.partition,
            cursor=cursor, isolation_level=q.isolation_level,
        )  # fmt: skip
    return store.search(
        topic, contains=q.contains, regex=q.regex, tag=q.tag, where=q.where,
        partition=q.partition, start=q.start, end=q.end, limit=limit, max_scan=max_scan,
        timeout=CHUNK_SECONDS, cursor=cursor, key=q.key, order=q.order,
        isolation_level=q.isolation_level,
    )  # fmt: skip


def key_lookup(q: BrowseQuery) -> bool:
    """Whether the page is one find_by_key call (a key, no other filter, partition order)."""
    return q.key is not None and not q.scan_filters and q.order == PARTITION_ORDER
