"""The console's write actions (only with allow_write; 403 otherwise): produce a test
message, reset a consumer group's offsets to a time, resend a dead-lettered message to its
origin topic. Each is a POST of an HTML form carrying the app's CSRF token; with auth on, the
principal's ACLs are asked first (httpauth.access), as the Kafka listener asks them: produce
needs `write` on the topic, resend `read` on the copy's topic and `write` on the one it goes
to, a reset the group's `read` and each topic's `read` (Kafka's OffsetCommit, which
`kafka-consumer-groups --reset-offsets` sends). An internal topic is never written (403 from
the ACLs, or 400 InternalTopicError from the store without them). A done action redirects
(303) to what it made: the new message, or the group."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from mqcore.consume.retry import H_PARTITION, H_TOPIC, RETRY_HEADERS
from mqcore.errors import InvalidConfigError, MessageNotFoundError, MQCoreError
from mqcore.server.auth import READ, WRITE, Access
from mqcore.server.console import browse, csrf, render
from mqcore.server.httpauth import access
from mqcore.server.httpbase import Bodies, Busy, log, status_of
from mqcore.store import Store

MAX_FORM_BYTES = 1 << 20  # a test message is small; a larger form is refused


class Refused(Exception):
    """The action is not allowed (answered 403 with the reason)."""


class Form:
    """A urlencoded form's fields (each at most once) and what its sender may do."""

    def __init__(self, fields: dict[str, str], may: Access):
        self.fields = fields
        self.may = may

    def get(self, name: str) -> str | None:
        value = self.fields.get(name)
        return None if value == "" else value

    def need(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise InvalidConfigError(f"the form needs {name}")
        return value

    def integer(self, name: str) -> int | None:
        text = self.get(name)
        if text is None:
            return None
        if not text.isascii() or not text.isdigit() or len(text) > 19:
            raise InvalidConfigError(f"{name} must be an integer >= 0, not {text[:40]!r}")
        return int(text)


def detail_url(topic: str, partition: int, offset: int) -> str:
    return (
        f"/ui/topics/{urllib.parse.quote(topic, safe='')}/partitions/{partition}/offsets/{offset}"
    )


def produce(store: Store, form: Form) -> str:
    """Append one message (key, value, tag, partition as the form gives them)."""
    topic = form.need("topic")
    form.may.check_topic(WRITE, topic)
    key = form.get("key")
    md = store.append(
        topic,
        (form.get("value") or "").encode("utf-8"),
        key=None if key is None else key.encode("utf-8"),
        partition=form.integer("partition"),
        tag=form.get("tag"),
    )
    store.flush()
    return detail_url(md.topic, md.partition, md.offset)


def reset_offsets(store: Store, form: Form) -> str:
    """Commit, for each partition the group has committed (of `topic` only, when given; every
    partition of `topic` when the group has none there), the first offset at or after the
    time (the end offset when nothing is that new). Refused while the group has members, here
    or as Kafka clients of `mqcore serve` (their next commit would undo it), as Kafka's
    `--reset-offsets` is, and for a share group (Store.alter_group_offsets). Needs the
    group's read and each topic's read, as Kafka's OffsetCommit does."""
    group = form.need("group")
    form.may.check_group(READ, group)
    tz = browse.parse_zone(form.get("tz"))
    ms = browse.parse_time("time", form.need("time"), tz)
    topic = form.get("topic")
    places = [(p.topic, p.partition) for p in store.group_lag(group).get(group, [])]
    if topic is not None:
        places = [tp for tp in places if tp[0] == topic] or [
            (topic, p) for p in store.available_partitions(topic)
        ]
    if not places:
        raise InvalidConfigError(f"group {group!r} has no committed offsets: name a topic")
    for t in sorted({t for t, _ in places}):
        form.may.check_topic(READ, t)
    offsets = {}
    for t, p in places:
        found = store.offset_for_time(t, p, ms)
        offsets[(t, p)] = store.end_offset(t, p) if found is None else found
    store.alter_group_offsets(group, offsets, "reset by mqcore console")
    return f"/ui/groups/{urllib.parse.quote(group, safe='')}"


def resend(store: Store, form: Form) -> str:
    """Append a dead-lettered copy's key, value and headers (without the retry headers, so
    with the original's unique ID: its trace goes on) to the partition it came from."""
    topic, partition, offset = form.need("topic"), form.integer("partition"), form.integer("offset")
    if partition is None or offset is None:
        raise InvalidConfigError("the form needs partition and offset")
    form.may.check_topic(READ, topic)
    m = store.get(topic, partition, offset)
    if m is None:
        raise MessageNotFoundError(f"no message at offset {offset} of {topic}-{partition}")
    origin, origin_partition = m.header(H_TOPIC), m.header(H_PARTITION)
    if origin is None or origin_partition is None:
        raise InvalidConfigError(
            f"{topic}/{partition}/{offset} has no {H_TOPIC} and {H_PARTITION} headers: it is "
            "not a dead-lettered or retry copy"
        )
    try:
        to_topic, to_partition = origin.decode("utf-8"), int(origin_partition)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidConfigError(f"the origin headers of {topic}/{partition}/{offset}: {e}") from e
    form.may.check_topic(WRITE, to_topic)
    headers = [(k, v) for k, v in m.headers if k not in RETRY_HEADERS]
    md = store.append(to_topic, m.value, key=m.key, headers=headers, partition=to_partition)
    store.flush()
    return detail_url(md.topic, md.partition, md.offset)


def action(fn: Callable[[Store, Form], str]) -> Callable[[Request], object]:
    """A write action as a POST endpoint."""

    async def endpoint(request: Request) -> Response:
        state = request.app.state
        if not state.console_allow_write:
            return render.page(
                request, "error.html", 403, title="Refused",
                error="write actions are off: start the console with --allow-write",
            )  # fmt: skip
        try:
            form = await read_form(request)
            check_sender(request, form)
            url = await run_in_threadpool(fn, state.store, form)
        except Refused as e:
            return render.page(request, "error.html", 403, title="Refused", error=str(e))
        except MQCoreError as e:
            return render.page(request, "error.html", status_of(e), title="Error", error=str(e))
        except Busy as e:
            page = render.page(request, "error.html", 503, title="Busy", error=str(e))
            page.headers["Retry-After"] = "1"
            return page
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return render.page(
                request,
                "error.html",
                500,
                title="Error",
                error="internal error (see the server log)",
            )
        return RedirectResponse(url, status_code=303)

    return endpoint


def check_sender(request: Request, form: Form) -> None:
    """Refused unless the form comes from a page of this console in this browser session,
    as this principal: a browser's Origin or Referer (httpauth.SameOriginMiddleware refused
    another site's already; one of them must be there) and the session's CSRF token."""
    if "origin" not in request.headers and "referer" not in request.headers:
        raise Refused("a write action needs the browser's Origin or Referer header")
    if not csrf.valid(request, form.get("csrf")):
        raise Refused(
            "the form's CSRF token is missing, stale or another session's: reload the page"
        )


async def read_form(request: Request) -> Form:
    """The urlencoded body (no multipart: the console's forms send none)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        raise InvalidConfigError("a write action takes an application/x-www-form-urlencoded form")
    bodies: Bodies = request.app.state.bodies
    async with bodies.read(request, MAX_FORM_BYTES, "the form") as body:
        try:  # the bytes, and what their percent escapes stand for, must be UTF-8
            pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                                           errors="strict")  # fmt: skip
        except UnicodeDecodeError as e:
            raise InvalidConfigError("the form is not UTF-8") from e
    fields: dict[str, str] = {}
    for k, v in pairs:
        if k in fields:
            raise InvalidConfigError(f"form field {k!r} is given more than once")
        fields[k] = v
    return Form(fields, access(request))
