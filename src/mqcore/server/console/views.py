"""The console's pages (docs/console.md): overview, message browser (with its rows endpoint),
lookup, message detail, groups. Each is a plain function Starlette runs in its thread pool
(the Store's calls block); bad input answers the page with a visible error and a 4xx status.

With authentication each page asks the principal's ACLs first, as the JSON API does
(httpauth.access): a topic is listed when it may be described, its messages shown when it may
be read, a group listed and shown when it may be described (with the partitions of topics it
may describe); a refusal is a 403 page, whether or not the topic or group exists."""

from __future__ import annotations

import dataclasses
import functools
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from mqcore.consume.retry import H_PARTITION, H_TOPIC
from mqcore.errors import (
    InvalidConfigError,
    InvalidMessageIdError,
    MessageNotFoundError,
    MQCoreError,
)
from mqcore.log.internal import is_internal
from mqcore.query.ids import decode_msg_id, id_kind, parse_uid
from mqcore.query.jsonform import timestamp_type
from mqcore.server.auth import DESCRIBE, READ, WRITE, Access
from mqcore.server.console import browse, render
from mqcore.server.httpauth import access, find_unique, visible
from mqcore.server.httpbase import (
    Params,
    Scans,
    error_answer,
    lent_call,
    log,
    path_int,
    replica_view,
    status_of,
)
from mqcore.storage.txnindex import (
    ISOLATION_LEVELS,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    check_isolation,
)
from mqcore.store import Store

RATE_WINDOW_MS = 5 * 60_000  # the overview's append rate: messages per minute over this
LOOKUP_LIMIT = 100  # messages a key lookup shows per topic
_PLACE = re.compile(r"(.+)/([0-9]{1,19})/([0-9]{1,19})")


def html_page(
    fn: Callable[[Store, Request, Params], Response], allowed: tuple[str, ...] = ()
) -> Callable[[Request], Response]:
    """A page handler as an endpoint: an mqcore error becomes the page `error.html` with the
    error's status (400 bad input, 404 not there), a bug a 500 page without its traceback."""

    @functools.wraps(fn)
    def endpoint(request: Request) -> Response:
        try:
            with request.app.state.lend(request) as store:  # server/http.py: the store as it is now
                return fn(store, request, Params(request, allowed))
        except MQCoreError as e:
            return render.page(request, "error.html", status_of(e), error=str(e), title="Error")
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return render.page(
                request, "error.html", 500, error="internal error (see the server log)",
                title="Error",
            )  # fmt: skip

    return endpoint


# -- overview -----------------------------------------------------------------------------------


def topic_summary(store: Store, topic: str, now_ms: int) -> dict[str, Any]:
    """A topic's overview row: partitions, messages (offsets end - start), bytes on disk,
    first and last timestamps, and messages per minute over the last RATE_WINDOW_MS (from
    the time index, not a scan)."""
    parts = store.available_partitions(topic)
    messages = size = recent = 0
    first = last = -1
    for p in parts:
        start, end = store.start_offset(topic, p), store.end_offset(topic, p)
        messages += end - start
        size += store.disk_bytes(topic, p)
        head = store.read(topic, p, start, 1)
        tail = store.read(topic, p, max(start, end - 1), 1)
        if head and (first < 0 or head[0].timestamp < first):
            first = head[0].timestamp
        if tail:
            last = max(last, tail[0].timestamp)
        since = store.offset_for_time(topic, p, now_ms - RATE_WINDOW_MS)
        if since is not None:
            recent += max(0, end - since)
    return {
        "name": topic,
        "internal": is_internal(topic),
        "partitions": len(parts),
        "messages": messages,
        "size": size,
        "first_ts": first,
        "last_ts": last,
        "rate": recent / (RATE_WINDOW_MS / 60_000),
    }


def partition_rows(
    store: Store, topic: str, replicas: dict[int, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Each partition's offsets, segments and bytes on disk (what `mqcore stats` prints), and
    on a cluster's broker its leader, replicas and in-sync replicas (`replicas`)."""
    out = []
    for p in store.available_partitions(topic):
        start, end = store.start_offset(topic, p), store.end_offset(topic, p)
        out.append({"partition": p, "start": start, "end": end, "messages": end - start,
                    "segments": len(store.segment_offsets(topic, p)),
                    "size": store.disk_bytes(topic, p),
                    **(replicas or {}).get(p, {})})  # fmt: skip
    return out


def group_summaries(store: Store, may: Access) -> list[dict[str, Any]]:
    """Every consumer group (lag: the sum over its partitions) and share group (lag: records
    available plus in flight) the principal may describe, over the topics it may describe."""
    out = [
        {"name": g, "kind": "consumer", "lag": sum(p.lag or 0 for p in parts),
         "partitions": len(parts)}
        for g, parts in sorted(visible(store.group_lag(), may).items())
    ]  # fmt: skip
    out += [
        {"name": g, "kind": "share", "lag": sum(p.available + p.in_flight for p in parts),
         "partitions": len(parts)}
        for g, parts in sorted(visible(store.share_group_lag(), may).items())
    ]  # fmt: skip
    return out


def overview(store: Store, request: Request, params: Params) -> Response:
    """The topics and groups the principal may describe; the produce form offers the topics
    it may write."""
    now = int(time.time() * 1000)
    may = access(request)
    topics = [topic_summary(store, t, now) for t in store.topics() if may.topic(DESCRIBE, t)]
    writable = [t["name"] for t in topics if not t["internal"] and may.topic(WRITE, t["name"])]
    return render.page(
        request, "overview.html", title="Overview", topics=topics, writable=writable,
        groups=group_summaries(store, may),
        utc=lambda ms: render.time_text(ms, browse.parse_zone(None)),
    )  # fmt: skip


# -- browser ------------------------------------------------------------------------------------


def query_string(fields: dict[str, str], **more: str | None) -> str:
    merged = {**fields, **more}
    return urllib.parse.urlencode({k: v for k, v in merged.items() if v is not None})


def browser(store: Store, request: Request, params: Params) -> Response:
    """The page shell: the form, the status line and an empty results table the page's
    script fills from `rows` in chunks. The principal must read the topic."""
    topic = request.path_params["topic"]
    access(request).check_topic(READ, topic)
    partitions = store.partitions(topic)  # UnknownTopicError: a 404 page
    error = None
    q = None
    try:
        q = browse.parse_query(store, topic, params)
    except MQCoreError as e:
        if status_of(e) != 400:
            raise
        error = str(e)
    fields = q.fields if q is not None else browse.form_params(params)
    base = f"/ui/topics/{urllib.parse.quote(topic, safe='')}"
    prev = None
    if q is not None and q.history:
        back = q.history[-1]
        prev = (
            base
            + "?"
            + query_string(
                q.fields,
                cursor=None if back == "-" else back,
                hist=",".join(q.history[:-1]) or None,
            )
        )
    rows_url = None
    if q is not None:
        rows_url = f"{base}/rows?" + query_string(q.fields, cursor=browse.first_cursor(q))
    return render.page(
        request, "browser.html", 400 if error else 200, error=error, title=topic, topic=topic,
        config=sorted(dataclasses.asdict(store.topic_config(topic)).items()),
        partition_rows=partition_rows(store, topic, replica_view(request, topic)),
        partitions=partitions, fields=fields, zone=render.zone_name(q.tz) if q else "UTC",
        rows_url=rows_url, prev_url=prev, page_url=base,
        history=",".join(q.history) if q else "", cursor=(q.cursor or "-") if q else "-",
        limit=q.limit if q else browse.DEFAULT_PAGE,
        max_scan=q.max_scan if q else 0, froms=browse.FROM, orders=browse.ORDERS,
        isolations=ISOLATION_LEVELS,
        tail=tail_text(store, topic, q),
    )  # fmt: skip


def tail_text(store: Store, topic: str, q: browse.BrowseQuery | None) -> str | None:
    """What from=end was resolved to, beside the form: the time of the oldest message shown."""
    if q is None or q.tail is None:
        return None
    since = browse.tail_time(store, topic, q.tail)
    return None if since is None else render.time_text(since, q.tz)


async def rows(request: Request) -> JSONResponse:
    """One chunk of the browser's results: server-rendered (escaped) rows and where the query
    stands. A scan, so under the app's bound on scans, on a scan thread (httpbase.Scans: 503
    when no slot comes free). JSON errors, like the /v1 API."""
    try:
        access(request).check_topic(READ, request.path_params["topic"])  # before any slot
        scans: Scans = request.app.state.scans
        async with scans.slot():
            return await scans.run(lent_call, request, rows_chunk, request)
    except Exception as e:  # noqa: BLE001 - every error is answered as JSON
        return error_answer(request, e)


def rows_chunk(store: Store, request: Request) -> JSONResponse:
    params = Params(request, (*browse.PAGE_FIELDS, "page_left", "scan_left"))
    topic = request.path_params["topic"]
    q = browse.parse_query(store, topic, params)
    limit = params.count("page_left", q.limit)
    max_scan = params.count("scan_left", q.max_scan)
    if limit < 1 or max_scan < 1:
        raise InvalidConfigError("page_left and scan_left must be >= 1")
    r = browse.run_chunk(store, topic, q, browse.first_cursor(q), min(limit, q.limit), max_scan)
    html = render.fragment("rows.html", rows=[render.row(m, q.tz) for m in r.messages], topic=topic)
    return JSONResponse(
        {
            "html": html,
            "count": len(r.messages),
            "reason": r.reason,
            "cursor": r.cursor,
            "scanned_bytes": r.scanned_bytes,
            "scanned_records": r.scanned_records,
            "indexed": browse.key_lookup(q),
        }
    )


# -- lookup -------------------------------------------------------------------------------------


def recognise(text: str) -> str:
    """What a pasted text is: store-id, unique-id, offset (TOPIC/PARTITION/OFFSET) or key."""
    if id_kind(text) == "store":
        return "store-id"
    try:
        parse_uid(text)
        return "unique-id"
    except InvalidMessageIdError:
        pass
    return "offset" if _PLACE.fullmatch(text) else "key"


def lookup(store: Store, request: Request, params: Params) -> Response:
    q = params.text("q")
    topic = params.text("topic") or None
    level = params.text("isolation_level") or READ_UNCOMMITTED
    kind, found, error, status = None, [], None, 200
    if q:
        kind = recognise(q)
        try:
            check_isolation(level)
            found = lookup_messages(store, access(request), kind, q, topic, level)
        except MQCoreError as e:
            error, status = str(e), status_of(e)
    utc = browse.parse_zone(None)
    return render.page(
        request, "lookup.html", status, error=error, title="Lookup", q=q or "", kind=kind,
        topic=topic or "", rows=[render.row(m, utc, with_topic=True) for m in found],
        searched=q is not None and q != "", isolation_level=level, isolations=ISOLATION_LEVELS,
    )  # fmt: skip


def lookup_messages(
    store: Store, may: Access, kind: str, q: str, topic: str | None,
    isolation_level: str = READ_UNCOMMITTED,
) -> list[Any]:  # fmt: skip
    """The messages a pasted text names, in the topics the principal may read: a store ID or
    a place names its topic (TopicAuthorizationError when it may not read it); a unique ID
    or a key is looked for in the readable topics only (or in the one given). Each as a
    reader of `isolation_level` sees it."""
    level = {"isolation_level": isolation_level}
    if kind == "store-id":
        may.check_topic(READ, decode_msg_id(q)[0])  # InvalidMessageIdError names what is wrong
        m = store.get_by_id(q, **level)
        return [] if m is None else [m]
    if kind == "unique-id":
        return find_unique(store, may, q, start=None, end=None, limit=10, **level).messages
    if kind == "offset":
        match = _PLACE.fullmatch(q)
        assert match is not None
        may.check_topic(READ, match[1])
        m = store.get(match[1], int(match[2]), int(match[3]), **level)
        return [] if m is None else [m]
    if topic:
        may.check_topic(READ, topic)
    topics = [topic] if topic else [
        t for t in store.topics()
        if not is_internal(t) and may.topic(READ, t) and store.topic_config(t).key_index
    ]  # fmt: skip
    out = []
    for t in topics:
        out += store.find_by_key(t, q, limit=LOOKUP_LIMIT, isolation_level=isolation_level).messages
    return out


# -- message detail -----------------------------------------------------------------------------


def message(store: Store, request: Request, params: Params) -> Response:
    """One message (the principal must read its topic) and its history, the events of groups
    it may describe."""
    topic = request.path_params["topic"]
    may = access(request)
    may.check_topic(READ, topic)
    partition, offset = path_int(request, "partition"), path_int(request, "offset")
    wanted = params.text("format") or None
    if wanted is not None and wanted not in render.FORMATS:
        raise InvalidConfigError(
            f"format must be one of {', '.join(render.FORMATS)}, not {wanted[:40]!r}"
        )
    tz = browse.parse_zone(params.text("tz") or None)
    m = store.get(topic, partition, offset)
    if m is None:
        raise MessageNotFoundError(f"no message at offset {offset} of {topic}-{partition}")
    # whether a read_committed consumer gets it (not: an aborted transaction's record, or one
    # after a transaction still open)
    committed = store.get(topic, partition, offset, isolation_level=READ_COMMITTED) is not None
    fmt, value = render.value_as(m.value, wanted)
    origin = m.header(H_TOPIC)
    origin_partition = m.header(H_PARTITION)
    return render.page(
        request, "message.html", title=f"{topic}/{partition}/{offset}", m=m,
        key=render.text_of(m.key) if m.key is not None else None, value=value, value_format=fmt,
        size=len(m.value) if m.value is not None else 0,
        headers=[(render.text_of(k.encode("utf-8", "surrogateescape")), render.header_value(v))
                 for k, v in m.headers],
        timestamp=render.time_text(m.timestamp, tz),
        timestamp_type=timestamp_type(m.timestamp_type),
        zone=render.zone_name(tz), events=[
            {"event": e.event, "topic": e.topic, "partition": e.partition, "offset": e.offset,
             "group": e.group, "detail": e.detail, "when": render.time_text(e.time, tz)}
            for e in store.history(m)
            if e.group is None or may.group(DESCRIBE, e.group)
        ],
        origin=render.text_of(origin) if origin is not None else None,
        origin_partition=render.text_of(origin_partition) if origin_partition else None,
        formats=render.FORMATS, committed=committed,
    )  # fmt: skip


# -- groups -------------------------------------------------------------------------------------


def group_rows(store: Store, may: Access, name: str | None) -> list[dict[str, Any]]:
    """Every partition of the consumer groups and share groups (or of `name`) the principal
    may describe, of the topics it may describe."""
    out: list[dict[str, Any]] = []
    for g, parts in sorted(visible(store.group_lag(name), may).items()):
        out += [
            {"group": g, "kind": "consumer", "topic": p.topic, "partition": p.partition,
             "committed": p.committed, "end": p.end_offset, "lag": p.lag,
             "commit_time": p.commit_time}
            for p in sorted(parts, key=lambda p: (p.topic, p.partition))
        ]  # fmt: skip
    for g, shares in sorted(visible(store.share_group_lag(name), may).items()):
        out += [
            {"group": g, "kind": "share", "topic": s.topic, "partition": s.partition,
             "start": s.start, "end": s.log_end, "available": s.available,
             "in_flight": s.in_flight}
            for s in sorted(shares, key=lambda s: (s.topic, s.partition))
        ]  # fmt: skip
    return out


def groups(store: Store, request: Request, params: Params) -> Response:
    """Every group the principal may describe, or one (its describe first: a 403 page whether
    or not it exists)."""
    name = request.path_params.get("group")
    may = access(request)
    if name is not None:
        may.check_group(DESCRIBE, name)
    found = group_rows(store, may, name)
    known = request.app.state.group_members
    live = known(name) if known is not None and name is not None else None
    if name is not None and not found and live is None:
        raise MessageNotFoundError(f"no consumer group or share group {name!r} in this store")
    utc = browse.parse_zone(None)
    return render.page(
        request, "groups.html", title=name or "Groups", group=name, rows=found,
        groups=group_summaries(store, may) if name is None else [],
        utc=lambda ms: render.time_text(ms, utc),
        kinds=sorted({r["kind"] for r in found}), live=live, knows_members=known is not None,
        topics=sorted({r["topic"] for r in found if r["kind"] == "consumer"}),
    )  # fmt: skip


def not_found(request: Request) -> HTMLResponse:
    return render.page(request, "error.html", 404, error=f"no page {request.url.path}",
                       title="Not found")  # fmt: skip
