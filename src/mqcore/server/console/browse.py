"""The message browser's query: the form (the page's query string, so a URL is shareable)
checked field by field, and turned into the Store call that answers it.

- from=beginning: every selected partition from its start; from=offset: one partition from
  that offset (a query cursor placed there); from=time: messages with timestamp >= the time
  (the time index skips the segments before it); from=end: the newest `limit` messages of
  each selected partition, as a time: the smallest timestamp among them, resolved once and
  carried by the query's links as `tail` (the page shows it).
  `to` bounds every one of them above (exclusive).
- key: the key index (Store.find_by_key), answered in one call; tag, where (SQL92), contains
  and regex: Store.search, which the page calls in chunks of CHUNK_SECONDS with the cursor
  of the previous chunk, until the page is full or the query ends.
- Times in the form are wall-clock times of `tz` (an IANA zone name; UTC by default), shown
  beside the picker; the result rows show timestamps in the same zone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from mqcore.errors import InvalidConfigError
from mqcore.query.engine import QueryResult, decode_cursor, encode_cursor, make_spec, shown
from mqcore.server.httpbase import DEFAULT_MAX_SCAN, Params
from mqcore.store import Store

FROM = ("beginning", "end", "offset", "time")
DEFAULT_PAGE = 50  # rows a page shows when the form names no limit
MAX_PAGE = 1000
CHUNK_SECONDS = 0.3  # one chunk's scan: a browser that goes away leaves at most this running
MAX_HISTORY = 200  # pages the back link remembers
# `tail` (ms) is not a form input: from=end's time, resolved when the query's first page was
# made and carried by its rows and paging links (a new submission of the form resolves it anew)
FORM_FIELDS = ("partition", "from", "offset", "time", "to", "tz", "key", "tag", "where",
               "contains", "regex", "limit", "max_scan", "tail")  # fmt: skip
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
    history: list[str] = field(default_factory=list)  # cursors of the pages before ("-": none)

    @property
    def filters(self) -> bool:
        return any(v is not None for v in (self.key, self.tag, self.where, self.contains,
                                            self.regex))  # fmt: skip


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
    if start_from == "end":
        start = params.integer("tail")
    if "to" in values:
        end = parse_time("to", values["to"], tz)
    key = params.bytes("key")
    tag, where, regex = params.text("tag"), params.text("where"), params.text("regex")
    contains = params.bytes("contains")
    if key is not None and any(v is not None for v in (tag, where, contains, regex)):
        raise InvalidConfigError(
            "a key is looked up in the key index: combine it with a time, a partition and "
            "an offset, not with tag, where, contains or regex"
        )
    if key is None:  # a bad selector, regex or time range answers the page, not only its rows
        make_spec(start, end, contains, regex, tag, where)
    limit = params.count("limit", DEFAULT_PAGE)
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidConfigError(f"limit must be 1 to {MAX_PAGE}, not {limit}")
    max_scan = params.count("max_scan", DEFAULT_MAX_SCAN)
    if max_scan < 1:
        raise InvalidConfigError("max_scan must be >= 1")
    cursor = params.text("cursor")
    decode_cursor(cursor)  # InvalidConfigError for a cursor no query wrote
    history = [h for h in values.get("hist", "").split(",") if h]
    if len(history) > MAX_HISTORY:
        history = history[-MAX_HISTORY:]
    for h in history:
        if h != "-":
            decode_cursor(h)
    q = BrowseQuery(
        {k: v for k, v in values.items() if k in FORM_FIELDS}, partition, start_from, offset,
        start, end, tz, key, tag, where, contains, regex, limit, max_scan, cursor, history,
    )  # fmt: skip
    if start_from == "end" and start is None:
        q.start = tail_time(store, topic, q)
        if q.start is not None:
            q.fields["tail"] = str(q.start)
    return q


def tail_time(store: Store, topic: str, q: BrowseQuery) -> int | None:
    """The smallest timestamp among the newest `limit` messages of each selected partition
    (None: they are empty): from=end as a time every page of the query agrees on."""
    parts = store.available_partitions(topic) if q.partition is None else [q.partition]
    times = []
    for p in parts:
        first = max(store.start_offset(topic, p), store.end_offset(topic, p) - q.limit)
        times += [m.timestamp for m in store.read(topic, p, first, q.limit)]
    return min(times) if times else None


def first_cursor(q: BrowseQuery) -> str | None:
    """Where the query starts: the page's cursor, or from=offset's place."""
    if q.cursor is not None:
        return q.cursor
    if q.start_from == "offset" and q.partition is not None and q.offset is not None:
        return encode_cursor(q.partition, q.offset)
    return None


def run_chunk(
    store: Store, topic: str, q: BrowseQuery, cursor: str | None, limit: int, max_scan: int
) -> QueryResult:
    """One call of the Store for the page: the key index in one go, a scan for at most
    CHUNK_SECONDS (reason "timeout" and a cursor to go on from)."""
    if q.key is not None:
        return store.find_by_key(
            topic, q.key, start=q.start, end=q.end, limit=limit, partition=q.partition,
            cursor=cursor,
        )  # fmt: skip
    return store.search(
        topic, contains=q.contains, regex=q.regex, tag=q.tag, where=q.where,
        partition=q.partition, start=q.start, end=q.end, limit=limit, max_scan=max_scan,
        timeout=CHUNK_SECONDS, cursor=cursor,
    )  # fmt: skip
