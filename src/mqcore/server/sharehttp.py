"""Share groups over the HTTP API of `mqcore serve --http` (docs/server.md "Share groups over
HTTP"): members in any process, in any language with an HTTP client.

No Kafka client on PyPI speaks KIP-932's ShareGroupHeartbeat/ShareFetch/ShareAcknowledge yet
(kafka-python, aiokafka and confluent-kafka's Python consumer have no share consumer), so share
consumption is served here rather than on the Kafka listener:

  POST   /v1/share-groups/{group}/members                  join: ?topics=a,b[&record_lock_ms=
         &explicit_ack=&delivery_count_limit=&max_in_flight_records=&dead_letter=
         &auto_offset_reset=&session_timeout_ms=]  -> {"member_id": ...}
  POST   /v1/share-groups/{group}/members/{member}/poll    ?max_records=&timeout_ms=
         -> {"messages": [message object + "delivery_count"]}
  POST   /v1/share-groups/{group}/members/{member}/acknowledge   JSON body
         {"acknowledgements": [[topic, partition, offset, kind], ...]} -> {"acknowledged": n}
  POST   /v1/share-groups/{group}/members/{member}/commit  -> {}
  DELETE /v1/share-groups/{group}/members/{member}         leave (close) -> {}
  GET    /v1/share-groups[/{group}]                        lag: available and in flight

A member is a session: one that makes no request for `session_timeout_ms` (default 45 s,
Kafka's group.share.session.timeout.ms) is closed by the next request to the API, and the
records it held go back (as they would when their locks expire anyway). A process that dies
holding records therefore loses them to the other members after `record_lock_ms` at most.
Requests for one member are served one at a time (a member is used from one thread).

A poll that waits for records (`timeout_ms` > 0) holds a thread while it waits, so at most
`max_share_polls` wait at once, on threads of their own: never the pool the other requests are
served from (40 long polls took every thread of it). A poll past the bound answers at once
with the records there are, as one with timeout_ms=0 would, and the client polls again.

With authentication (httpauth.py), joining needs the group's read and each topic's read; a
member is bound to the principal that joined it, and any other principal's request for it is
answered as one for a member that does not exist (404), after the group's read is checked.
The lag needs the group's describe; the listing shows the groups the principal may describe,
each with the partitions of topics it may describe.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.routing import Route

from mqcore.consume.share import ShareConsumer
from mqcore.errors import InvalidConfigError, MQCoreError, UnknownGroupError
from mqcore.query.jsonform import message_object
from mqcore.server.auth import DESCRIBE, READ
from mqcore.server.httpauth import access, principal_of, visible
from mqcore.server.httpbase import Bodies, Busy, Params, error_answer, json_endpoint
from mqcore.store import Store

DEFAULT_SESSION_MS = 45_000
MAX_POLL_WAIT_MS = 30_000
MAX_SHARE_POLLS = 32  # share polls waiting for records at once, each on a thread of its own
MAX_ACK_BODY = 8 << 20
JOIN_OPTIONS = (
    "topics",
    "record_lock_ms",
    "explicit_ack",
    "delivery_count_limit",
    "max_in_flight_records",
    "dead_letter",
    "auto_offset_reset",
    "session_timeout_ms",
)


class Session:
    """One member: its consumer, the principal that joined it (None without auth), and when
    it was last used."""

    __slots__ = ("consumer", "last_seen", "lock", "principal", "timeout_s")

    def __init__(self, consumer: ShareConsumer, timeout_s: float, principal: str | None):
        self.consumer, self.timeout_s, self.principal = consumer, timeout_s, principal
        self.lock = threading.Lock()
        self.last_seen = time.monotonic()


class ShareSessions:
    """The share members the HTTP API made, by member id, closed when idle too long."""

    def __init__(self, store: Store, cluster: bool = False):
        self.store = store
        self.cluster = cluster  # a cluster's broker (sharecluster.py routes the requests)
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def join(
        self, group: str, topics: list[str], timeout_s: float, principal: str | None, **options: Any
    ) -> str:
        if self.cluster and options.get("dead_letter"):
            raise InvalidConfigError(
                "dead_letter is not served on a cluster yet: the dead-letter topic would be "
                "one broker's, not replicated (docs/cluster.md, known gaps)"
            )
        self.reap()
        sc = self.store.share_consumer(group, topics, **options)
        with self._lock:
            self._sessions[sc.member_id] = Session(sc, timeout_s, principal)
        return sc.member_id

    def session(self, group: str, member: str, principal: str | None) -> Session:
        """The member, used by the principal that joined it; any other principal is told it
        does not exist (UnknownGroupError), as it is told of a member that left."""
        self.reap()
        with self._lock:
            s = self._sessions.get(member)
        if s is None or s.consumer.group != group or s.principal != principal:
            raise UnknownGroupError(
                f"share group {group!r} has no member {member!r} here (it left, or its session "
                "expired)"
            )
        s.last_seen = time.monotonic()
        return s

    def leave(self, s: Session) -> None:
        """Close the member: what it holds goes back."""
        with self._lock:
            self._sessions.pop(s.consumer.member_id, None)
        with s.lock:
            s.consumer.close()

    def drop_all(self) -> None:
        """Forget every member without closing it (the share coordinator moved: their groups'
        state is another broker's now, and what they held goes back when the new coordinator
        loads the state); their next request is answered 404 and they join again."""
        with self._lock:
            self._sessions.clear()

    def reap(self) -> None:
        """Close the members idle longer than their session timeout."""
        now = time.monotonic()
        with self._lock:
            idle = [m for m, s in self._sessions.items() if now - s.last_seen > s.timeout_s]
            gone = [self._sessions.pop(m) for m in idle]
        for s in gone:
            with s.lock:
                s.consumer.close()


def _flag(name: str, text: str | None) -> bool | None:
    if text is None:
        return None
    if text not in ("true", "false"):
        raise InvalidConfigError(f"{name} must be true or false, not {text!r}")
    return text == "true"


def join(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """A new member: the group's read, then each topic's read (Kafka's order: group first)."""
    sessions: ShareSessions = request.app.state.share_sessions
    group = request.path_params["group"]
    topics = [t for t in (params.text("topics") or "").split(",") if t]
    if not topics:
        raise InvalidConfigError("topics= names the topics to consume, comma-separated")
    may = access(request)
    may.check_group(READ, group)
    for topic in topics:
        may.check_topic(READ, topic)
    options: dict[str, Any] = {}
    for name in ("record_lock_ms", "delivery_count_limit", "max_in_flight_records"):
        value = params.integer(name)
        if value is not None:
            options[name] = value
    for name in ("explicit_ack", "dead_letter"):
        flag = _flag(name, params.text(name))
        if flag is not None:
            options[name] = flag
    reset = params.text("auto_offset_reset")
    if reset is not None:
        options["auto_offset_reset"] = reset
    timeout_ms = params.count("session_timeout_ms", DEFAULT_SESSION_MS)
    if not 1000 <= timeout_ms <= 3_600_000:
        raise InvalidConfigError(f"session_timeout_ms must be in [1000, 3600000], not {timeout_ms}")
    member = sessions.join(group, topics, timeout_ms / 1000, principal_of(request), **options)
    return {"member_id": member}


def member_session(request: Request) -> Session:
    """The path's member, once the principal may read its group and is the one that joined
    it."""
    group = request.path_params["group"]
    access(request).check_group(READ, group)
    sessions: ShareSessions = request.app.state.share_sessions
    return sessions.session(group, request.path_params["member"], principal_of(request))


class WaitingPolls:
    """The bound on share polls that wait (see the module docstring). `waiting` and
    `shortened` (answered without waiting, past the bound) say what happened."""

    def __init__(self, limit: int = MAX_SHARE_POLLS):
        if limit < 1:
            raise InvalidConfigError(f"max_share_polls must be >= 1, not {limit}")
        self.limit = limit
        self._slots = anyio.CapacityLimiter(limit)
        self._threads = anyio.CapacityLimiter(limit)  # their own: never the shared pool's
        self.waiting = self.shortened = 0

    async def answer(self, request: Request, endpoint: Callable[[Request], Any]) -> Any:
        """`endpoint(request)` on a waiting poll's thread when a slot is free, else on the
        shared pool with the wait taken out."""
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            self.shortened += 1
            request.state.no_wait = True
            return await run_in_threadpool(endpoint, request)
        self.waiting += 1
        try:
            return await anyio.to_thread.run_sync(endpoint, request, limiter=self._threads)
        finally:
            self.waiting -= 1
            self._slots.release()


def poll(store: Store, request: Request, params: Params) -> dict[str, Any]:
    s = member_session(request)
    wait = min(params.count("timeout_ms", 0), MAX_POLL_WAIT_MS)
    if getattr(request.state, "no_wait", False):  # past max_share_polls: answer at once
        wait = 0
    with s.lock:
        msgs = s.consumer.poll(params.count("max_records", 500), wait)
    s.last_seen = time.monotonic()  # a long poll is not idleness
    return {"messages": [{**message_object(m), "delivery_count": m.delivery_count} for m in msgs]}


async def _ack_body(request: Request) -> list[Any]:
    """The acknowledgements of the body, read within its cap and the app's Bodies."""
    bodies: Bodies = request.app.state.bodies
    async with bodies.read(request, MAX_ACK_BODY, "the acknowledgement body") as raw:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidConfigError(f"the body is not JSON: {e}") from None
    return _acknowledgements(doc)


def _acknowledgements(doc: Any) -> list[Any]:
    """The checked [topic, partition, offset, kind] lists of an acknowledgement body."""
    acks = doc.get("acknowledgements") if isinstance(doc, dict) else None
    if not isinstance(acks, list):
        raise InvalidConfigError(
            'the body is {"acknowledgements": [[topic, partition, offset, kind], ...]}'
        )
    for a in acks:
        if not (
            isinstance(a, list)
            and len(a) == 4
            and isinstance(a[0], str)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in a[1:3])
            and isinstance(a[3], str)
        ):
            raise InvalidConfigError(
                f"an acknowledgement is [topic, partition, offset, kind], not {a!r}"[:300]
            )
    return acks


def acknowledge(store: Store, request: Request, params: Params) -> dict[str, Any]:
    s = member_session(request)
    acks = request.state.acks
    with s.lock:
        for topic, partition, offset, kind in acks:
            s.consumer.acknowledge((topic, partition, offset), kind)
    return {"acknowledged": len(acks)}


def commit(store: Store, request: Request, params: Params) -> dict[str, Any]:
    s = member_session(request)
    with s.lock:
        s.consumer.commit()
    return {}


def leave(store: Store, request: Request, params: Params) -> dict[str, Any]:
    sessions: ShareSessions = request.app.state.share_sessions
    sessions.leave(member_session(request))
    return {}


def lag(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """Share groups' backlog: the groups the principal may describe (one group needs its
    describe, 403 whether or not it exists), each with the partitions of topics it may
    describe."""
    name = request.path_params.get("group")
    may = access(request)
    if name is not None:
        may.check_group(DESCRIBE, name)
    lags = store.share_group_lag(name)
    if name is not None and not lags:
        raise UnknownGroupError(f"share group {name!r} has no state here")
    found = [
        {
            "group": group,
            "available": sum(r.available for r in rows),
            "in_flight": sum(r.in_flight for r in rows),
            "partitions": [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "start": r.start,
                    "end": r.end,
                    "log_end": r.log_end,
                    "available": r.available,
                    "in_flight": r.in_flight,
                }
                for r in rows
            ],  # fmt: skip
        }
        for group, rows in sorted(visible(lags, may).items())
    ]
    return found[0] if name is not None else {"share_groups": found}


def _with_body(inner: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """Read and check the JSON body on the event loop, then run `inner` in the thread pool."""

    async def endpoint(request: Request) -> Any:
        try:
            request.state.acks = await _ack_body(request)
        except (MQCoreError, Busy) as e:
            return error_answer(request, e)
        return await run_in_threadpool(inner, request)

    return endpoint


def _bounded_poll() -> Callable[[Request], Any]:
    """The poll endpoint, waiting within the app's WaitingPolls (app.state.share_polls)."""
    inner = json_endpoint(poll, ("max_records", "timeout_ms"))

    async def endpoint(request: Request) -> Any:
        polls: WaitingPolls = request.app.state.share_polls
        return await polls.answer(request, inner)

    return endpoint


def share_routes(wrap: Callable[[Callable[[Request], Any]], Any] | None = None) -> list[Route]:
    """The share-group routes, each endpoint passed through `wrap` (a cluster's broker routes
    them to the share coordinator: sharecluster.routed)."""
    base = "/v1/share-groups/{group}/members"
    routes = [
        Route("/v1/share-groups", json_endpoint(lag), methods=["GET"]),
        Route("/v1/share-groups/{group}", json_endpoint(lag), methods=["GET"]),
        Route(base, json_endpoint(join, JOIN_OPTIONS), methods=["POST"]),
        Route(base + "/{member}/poll", _bounded_poll(), methods=["POST"]),
        Route(
            base + "/{member}/acknowledge", _with_body(json_endpoint(acknowledge)), methods=["POST"]
        ),  # fmt: skip
        Route(base + "/{member}/commit", json_endpoint(commit), methods=["POST"]),
        Route(base + "/{member}", json_endpoint(leave), methods=["DELETE"]),
    ]
    if wrap is None:
        return routes
    return [Route(r.path, wrap(r.endpoint), methods=r.methods) for r in routes]
