"""The HTTP query API of `mqcore serve --http` (docs/server.md "HTTP query API").

`create_app(store)` is a Starlette ASGI app answering the Store's query calls as JSON under
/v1: topics and their offsets, one topic's config and partitions, a message by place, by store
ID or by unique ID, by key, by time, a search (tag, SQL92 selector, contains, regex) with
cursors, a partition read in order from an offset, and consumer groups with their lag. The
console (issue 14) mounts the same app. With authentication, each handler asks the principal's
ACLs first (httpauth.access: describe to see a topic or group, read for its messages), so a
refusal (403) never depends on whether the topic, group or message exists.
`HttpServer(app, listen)` serves an ASGI app with uvicorn in a background thread, on its own
event loop, so a Python program (or mqcore.server.Server) starts and stops it, bounding what one
client may hold: connections in all and per address (server/httplimits.py), the time a request
may take to arrive, a connection may stay idle and a response may stay unread (_BoundedH11).

Messages are mqcore.query.jsonform's objects, the ones `mqcore get/query --json` write. Every
handler is a plain function, which Starlette runs in its thread pool: the Store's calls block
(file reads), and the event loop stays free for other connections. Bad input is a 4xx JSON
error naming what was wrong (the mqcore.errors message), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from mqcore.errors import (
    InvalidConfigError,
    MessageNotFoundError,
    UnknownGroupError,
)
from mqcore.handles import shared_store
from mqcore.log.internal import is_internal
from mqcore.query.engine import PARTITION_ORDER, QueryResult, check_order
from mqcore.query.ids import decode_msg_id
from mqcore.query.jsonform import message_object
from mqcore.server.address import parse_listen
from mqcore.server.auth import DESCRIBE, READ, tls_context
from mqcore.server.bounds import connection_room, within
from mqcore.server.clusterread import FORWARDED, ClusterReader, LeaderView
from mqcore.server.httpauth import (
    BasicAuthMiddleware,
    HttpAuth,
    SameOriginMiddleware,
    access,
    find_unique,
    visible,
)
from mqcore.server.httpbase import (
    DEFAULT_MAX_SCAN,
    DEFAULT_MAX_SCANS,
    MAX_BODY_BYTES,
    MAX_LIMIT,
    MAX_TIMEOUT,
    SCAN_WAIT,
    Bodies,
    Params,
    Scan,
    Scans,
    http_error,
    json_endpoint,
    log,
    path_int,
    replica_view,
    result_object,
    scan_endpoint,
)
from mqcore.server.httplimits import (
    IDLE_TIMEOUT,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_HEADER_BYTES,
    REQUEST_TIMEOUT,
    HttpLimits,
    ListenSocket,
    Places,
)
from mqcore.server.sharecluster import ShareCluster, routed
from mqcore.server.sharehttp import MAX_SHARE_POLLS, ShareSessions, WaitingPolls, share_routes
from mqcore.storage.txnindex import READ_UNCOMMITTED, check_isolation
from mqcore.store import Store

# -- answers ------------------------------------------------------------------------------------


def partition_offsets(store: Store, topic: str) -> list[dict[str, int]]:
    return [
        {
            "partition": p,
            "start_offset": store.start_offset(topic, p),
            "end_offset": store.end_offset(topic, p),
        }
        for p in store.available_partitions(topic)
    ]


# -- handlers: each answers one Store call --------------------------------------------------------


def list_topics(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """The topics the principal may describe (Kafka's Metadata for all topics)."""
    may = access(request)
    topics = [
        {"topic": t, "internal": is_internal(t), "partitions": partition_offsets(store, t)}
        for t in store.topics()
        if may.topic(DESCRIBE, t)
    ]
    return {"topics": topics}


def readable_topic(request: Request) -> str:
    """The path's topic, once the principal may read it (TopicAuthorizationError first, so a
    refusal says nothing of whether the topic exists)."""
    topic = request.path_params["topic"]
    access(request).check_topic(READ, topic)
    return topic


def describe_topic(store: Store, request: Request, params: Params) -> dict[str, Any]:
    topic = request.path_params["topic"]
    access(request).check_topic(DESCRIBE, topic)
    config = store.topic_config(topic)  # UnknownTopicError first
    partitions = partition_offsets(store, topic)
    replicas = replica_view(request, topic)
    for entry in partitions:
        entry["segments"] = len(store.segment_offsets(topic, entry["partition"]))
        entry.update(replicas.get(entry["partition"], {}))
    return {
        "topic": topic,
        "internal": is_internal(topic),
        "config": dataclasses.asdict(config),
        "partitions": partitions,
    }


def isolation(params: Params) -> dict[str, str]:
    """`isolation_level` as a read's keyword ({} for the default read_uncommitted)."""
    level = params.text("isolation_level") or READ_UNCOMMITTED
    check_isolation(level)
    return {} if level == READ_UNCOMMITTED else {"isolation_level": level}


def get_message(store: Store, request: Request, params: Params) -> dict[str, Any]:
    topic = readable_topic(request)
    partition, offset = path_int(request, "partition"), path_int(request, "offset")
    msg = store.get(topic, partition, offset, **isolation(params))
    if msg is None:
        raise MessageNotFoundError(f"no message at offset {offset} of {topic}-{partition}")
    return {"message": message_object(msg)}


def read_messages(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """Store.read: up to `limit` messages from `offset` on (a partition browsed in order);
    `next_offset` is where the next page starts, `end_offset` the partition's end then."""
    topic, partition = readable_topic(request), path_int(request, "partition")
    offset = params.count("offset", 0)
    msgs = store.read(topic, partition, offset, params.limit(request.app.state.max_limit),
                      **isolation(params))  # fmt: skip
    return {
        "messages": [message_object(m) for m in msgs],
        "next_offset": msgs[-1].offset + 1 if msgs else offset,
        "end_offset": store.end_offset(topic, partition),
    }


def get_by_id(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """The message a store ID names; the ID names its topic, which the principal must read."""
    msg_id = request.path_params["msg_id"]
    access(request).check_topic(READ, decode_msg_id(msg_id)[0])
    msg = store.get_by_id(msg_id, **isolation(params))
    if msg is None:
        raise MessageNotFoundError(f"no message with store ID {msg_id!r} (or no longer)")
    return {"message": message_object(msg)}


def by_unique_id(store: Store, request: Request, params: Params) -> dict[str, Any]:
    r = find_unique(
        store,
        access(request),
        request.path_params["unique_id"],
        start=params.integer("start"),
        end=params.integer("end"),
        limit=params.limit(request.app.state.max_limit, default=1),
        **isolation(params),
    )
    return result_object(r)


def by_key(store: Store, request: Request, params: Params) -> dict[str, Any]:
    key = params.bytes("key")
    if key is None:
        raise InvalidConfigError("by-key needs key= (or key_base64=)")
    r = store.find_by_key(
        readable_topic(request),
        key,
        start=params.integer("start"),
        end=params.integer("end"),
        limit=params.limit(request.app.state.max_limit),
        partition=params.integer("partition"),
        cursor=params.text("cursor"),
        **isolation(params),
    )
    return result_object(r)


def search(request: Request, params: Params) -> Scan:
    """by-time and search: Store.search with the filters the request gives, run in slices
    under the app's bound on scans (httpbase.Scans). `order`: "partition" (the Store's
    default) or "time" (merged across partitions by timestamp)."""
    topic = readable_topic(request)
    filters: dict[str, Any] = {
        "contains": params.bytes("contains"),
        "regex": params.text("regex"),
        "tag": params.text("tag"),
        "where": params.text("where"),
        "partition": params.integer("partition"),
        "start": params.integer("start"),
        "end": params.integer("end"),
        "order": check_order(params.text("order") or PARTITION_ORDER),
        **isolation(params),
    }

    def call(
        store: Store, limit: int, max_scan: int, timeout: float, cursor: str | None
    ) -> QueryResult:
        return store.search(
            topic, **filters, limit=limit, max_scan=max_scan, timeout=timeout, cursor=cursor
        )

    state = request.app.state
    return Scan(
        call,
        params.limit(state.max_limit),
        params.count("max_scan", DEFAULT_MAX_SCAN),
        params.timeout(state.max_timeout),
        params.text("cursor"),
    )


def groups(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """Consumer groups' lag: the groups the principal may describe, each with the partitions
    of the topics it may describe; one group needs its describe (403 whether or not it
    exists)."""
    name = request.path_params.get("group")
    may = access(request)
    if name is not None:
        may.check_group(DESCRIBE, name)
    lags = store.group_lag(name)
    if name is not None and not lags:
        raise UnknownGroupError(f"consumer group {name!r} has no committed offsets here")
    found = [
        {
            "group": group,
            "lag": sum(p.lag or 0 for p in parts),
            "partitions": [p.to_json() for p in parts],
        }
        for group, parts in sorted(visible(lags, may).items())
    ]
    return found[0] if name is not None else {"groups": found}


def lender(store: Store, cluster: LeaderView | None) -> Callable[[Request], Any]:
    """What a request reads through (`app.state.lend(request)`, a context manager): a
    read-only store as it is on disk now (the process's kept handle of its path, reopened
    when a writer changed it: mqcore.handles), an open store itself, or on a cluster's
    broker the cluster (ClusterReader) or, for a request another broker forwarded, the
    partitions this broker leads (LeaderView)."""
    if cluster is not None:

        def lend_cluster(request: Request) -> contextlib.AbstractContextManager[Any]:
            if request.headers.get(FORWARDED) is not None:
                return contextlib.nullcontext(cluster)
            auth = request.headers.get("authorization")
            return contextlib.nullcontext(ClusterReader(cluster, authorization=auth))

        return lend_cluster
    if store.read_only:
        path = store.path
        return lambda request: shared_store(path)
    return lambda request: contextlib.nullcontext(store)


PAGE = ("limit", "cursor", "start", "end", "partition")
ISOLATION = "isolation_level"
SCAN = (*PAGE, "max_scan", "timeout", "order", ISOLATION)


def create_app(
    store: Store,
    *,
    max_limit: int = MAX_LIMIT,
    max_timeout: float = MAX_TIMEOUT,
    console: bool = True,
    allow_write: bool = False,
    auth: HttpAuth | None = None,
    group_members: Callable[[str], tuple[str, list[dict[str, Any]]] | None] | None = None,
    allowed_hosts: Iterable[str] = (),
    max_scans: int = DEFAULT_MAX_SCANS,
    scan_wait: float = SCAN_WAIT,
    max_share_polls: int = MAX_SHARE_POLLS,
    max_body_bytes: int = MAX_BODY_BYTES,
    replicas: Callable[[str], dict[int, dict[str, Any]]] | None = None,
    cluster: LeaderView | None = None,
) -> Starlette:
    """The JSON query API over `store` (left open: the caller owns it) under /v1, and with
    `console` the console's pages under /ui (server/console; `/` redirects there). A
    request's `limit` is cut to `max_limit` messages; a scan runs at most `max_timeout`
    seconds. Either then answers with its reason ("limit", "timeout") and a cursor to go on
    from. `allow_write` turns the console's write actions on (403 without); `auth` asks every
    request for HTTP Basic credentials (server/httpauth.py). `group_members(group)` gives a
    consumer group's state and members where a coordinator knows them (`mqcore serve`).
    Every request's Host must name the server: the address it listens on, localhost on
    loopback, or one of `allowed_hosts`; a write from another site's page is refused
    (httpauth.SameOriginMiddleware). At most `max_scans` scans (search, by-time, the
    console's browser rows) run at once; one more waits `scan_wait` seconds for a slot, then
    is answered 503 (httpbase.Scans). At most `max_share_polls` share polls wait for records
    at once; one more answers at once (sharehttp.WaitingPolls). Request bodies being read hold
    at most `max_body_bytes` together (httpbase.Bodies; 503 past it). `replicas(topic)`, on
    a cluster's broker, gives each partition's leader, replicas and ISR (replica_view), and
    `cluster` (the broker's clusterread.LeaderView) makes every answer the cluster's: each
    partition read by its leader to its high watermark (server/clusterread.py).

    A read-only `store` (`mqcore console`) shows the store as it is on disk at each request,
    not as it was when opened: each request borrows the process's kept handle of its path,
    reopened when a writer changed the store since (mqcore.handles)."""
    if cluster is not None and allow_write:
        raise InvalidConfigError(
            "the console's write actions are not served on a cluster's broker (they would "
            "write one replica): produce with a Kafka client"
        )
    routes = [
        Route("/v1/topics", json_endpoint(list_topics)),
        Route("/v1/topics/{topic}", json_endpoint(describe_topic)),
        Route(
            "/v1/topics/{topic}/partitions/{partition}/offsets/{offset}",
            json_endpoint(get_message, (ISOLATION,)),
        ),
        Route(
            "/v1/topics/{topic}/partitions/{partition}/messages",
            json_endpoint(read_messages, ("offset", "limit", ISOLATION)),
        ),
        Route(
            "/v1/topics/{topic}/by-key",
            json_endpoint(by_key, (*PAGE, "key", "key_base64", ISOLATION)),
        ),
        Route("/v1/topics/{topic}/by-time", scan_endpoint(search, SCAN)),
        Route(
            "/v1/topics/{topic}/search",
            scan_endpoint(search, (*SCAN, "tag", "where", "contains", "contains_base64", "regex")),
        ),
        Route("/v1/messages/{msg_id}", json_endpoint(get_by_id, (ISOLATION,))),
        Route(
            "/v1/unique-ids/{unique_id}",
            json_endpoint(by_unique_id, ("start", "end", "limit", ISOLATION)),
        ),
        Route("/v1/groups", json_endpoint(groups)),
        Route("/v1/groups/{group}", json_endpoint(groups)),
    ]
    routes += share_routes(None if cluster is None else routed)
    if console:
        from mqcore.server import console as ui  # jinja2: only when the console is served

        routes += ui.console_routes()
    middleware = [Middleware(SameOriginMiddleware, allowed_hosts=allowed_hosts)]
    if auth is not None:
        middleware.append(Middleware(BasicAuthMiddleware, auth=auth))
    app = Starlette(
        routes=routes, exception_handlers={HTTPException: http_error}, middleware=middleware
    )
    if console:
        ui.configure(app.state, allow_write)
    app.state.auth = auth
    app.state.group_members = group_members
    app.state.replicas = replicas
    app.state.cluster = cluster
    app.state.store = store
    app.state.lend = lender(store, cluster)
    sessions = app.state.share_sessions = ShareSessions(store, cluster=cluster is not None)
    app.state.share_cluster = None if cluster is None else ShareCluster(cluster, sessions)
    app.state.share_polls = WaitingPolls(max_share_polls)
    app.state.bodies = Bodies(max_body_bytes)
    app.state.scans = Scans(max_scans, scan_wait)
    app.state.max_limit = max_limit
    app.state.max_timeout = max_timeout
    return app


# -- serving ------------------------------------------------------------------------------------


class _Config(uvicorn.Config):
    """uvicorn's options, and the request deadline it has none for."""

    def __init__(self, app: Any, request_timeout: float, **options: Any):
        super().__init__(app, **options)
        self.request_timeout = request_timeout


class _BoundedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the deadlines it lacks (docs/server.md "Limits"):
    a request (headers and body) must arrive whole within request_timeout of its first byte
    (uvicorn has no such deadline: a byte every few seconds held a connection forever); the
    keep-alive timeout (idle_timeout) runs from the connection's start too, not only after a
    first response; and a response its client takes nothing of for request_timeout drops the
    connection (uvicorn's close waits for unsent bytes without end)."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any):
        super().__init__(config, *args, **kwargs)
        assert isinstance(config, _Config)
        self.request_timeout = config.request_timeout
        self._arrival: asyncio.TimerHandle | None = None  # the request arriving now
        self._stall: asyncio.TimerHandle | None = None  # unsent bytes the client must take

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        if self._arrival is None:  # a request's first byte
            self._expect_arrival()
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):  # in whole, or ending
            self._arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # a pipelined request whose body is not all in yet: its deadline runs from now
        if self.conn.their_state is h11.SEND_BODY and self._arrival is None:
            self._expect_arrival()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_unsent()

    def timeout_keep_alive_handler(self) -> None:
        self._watch_unsent()  # uvicorn's close waits for the unsent bytes, without end
        super().timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arrived()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        super().connection_lost(exc)

    def _expect_arrival(self) -> None:
        self._arrival = self.loop.call_later(self.request_timeout, self._arrived_too_slowly)

    def _arrived(self) -> None:
        if self._arrival is not None:
            self._arrival.cancel()
            self._arrival = None

    def _arrived_too_slowly(self) -> None:
        self._arrival = None
        log.debug("closing %s: a request took over %g s to arrive", self.client,
                  self.request_timeout)  # fmt: skip
        self.transport.abort()

    def _watch_unsent(self) -> None:
        """Look again in request_timeout whether the client took any of the unsent bytes."""
        unsent = self.transport.get_write_buffer_size()
        if self._stall is None and unsent:
            self._stall = self.loop.call_later(self.request_timeout, self._check_unsent, unsent)

    def _check_unsent(self, before: int) -> None:
        """Drop the connection when the unsent bytes did not go down since the last look;
        look again while they do."""
        self._stall = None
        unsent = self.transport.get_write_buffer_size()
        if unsent and unsent >= before:
            log.debug("closing %s: it took none of its response for %g s", self.client,
                      self.request_timeout)  # fmt: skip
            self.transport.abort()
        else:
            self._watch_unsent()


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, saying when it listens (start() waits for that)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


class HttpServer:
    """Serves an ASGI app over HTTP from a background thread (uvicorn, its own event loop).
    Binds to loopback unless `listen` ("HOST:PORT") names another address; port 0 picks a free
    port (see `address`). With `tls_cert` (and `tls_key` unless the PEM holds both) it speaks
    HTTPS. Use as a context manager, or start() and stop().

    What one client may hold (docs/server.md "Limits"; InvalidConfigError for a value that
    cannot work): at most `max_connections` connections in all (cut to a quarter of the
    open-files limit) and `max_connections_per_ip` from one address, one more closed at
    accept; a request must arrive whole within `request_timeout` of its first byte; a
    connection without a request under way is closed after `idle_timeout`; a response its
    client takes nothing of for `request_timeout` drops the connection."""

    def __init__(
        self,
        app: Any,
        listen: str = "127.0.0.1:0",
        *,
        shutdown_timeout: int = 5,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        max_connections_per_ip: int = MAX_CONNECTIONS_PER_IP,
        request_timeout: float = REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
    ):
        self.limits = HttpLimits(
            max_connections, max_connections_per_ip, request_timeout, idle_timeout
        )
        self.app = app
        self.host, self.port = parse_listen(listen)
        if tls_key is not None and tls_cert is None:
            raise InvalidConfigError("tls_key needs tls_cert")
        if tls_cert is not None:
            tls_context(tls_cert, tls_key)  # a bad certificate or key is refused here
        self.tls_cert, self.tls_key = tls_cert, tls_key
        self.shutdown_timeout = shutdown_timeout
        self._places: Places | None = None  # the connections' places, from start()
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def start(self) -> HttpServer:
        """Bind (an OSError here, in the caller), then serve until stop()."""
        if self._thread is not None:
            return self
        # beside a store's default share of the descriptors (mqcore serve has given its
        # Kafka listener's share already: bounds.split_room)
        self._places = Places(
            within(self.limits.max_connections, connection_room(), "HTTP max_connections"),
            self.limits.max_connections_per_ip,
        )
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = ListenSocket(family, self._places)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError as e:
            sock.close()
            where = f"{self.host}:{self.port}"
            raise OSError(e.errno, f"cannot listen on {where} (HTTP): {e.strerror}") from e
        self.port = sock.getsockname()[1]
        config = _Config(
            self.app,
            self.limits.request_timeout,
            log_config=None,  # leave the host program's logging alone
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=self.shutdown_timeout,
            ssl_certfile=self.tls_cert,
            ssl_keyfile=self.tls_key,
            # asyncio's loop, never uvloop: its accept() is ListenSocket's, where connections
            # are counted (uvloop accepts in C); h11 with the deadlines, whatever is installed
            loop="asyncio",
            http=_BoundedH11,
            timeout_keep_alive=self.limits.idle_timeout,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        )
        server = self._server = _Uvicorn(config)
        self._thread = threading.Thread(
            target=self._run, args=(server, sock), name="mqcore-http", daemon=True
        )
        self._thread.start()
        while not server.ready.wait(0.05):
            if not self._thread.is_alive():  # startup failed: say why, here
                self._thread = None
                with contextlib.suppress(OSError):
                    sock.close()
                raise RuntimeError(f"the HTTP server did not start: {self._failure!r}")
        log.info("HTTP query API on %s", self.url)
        return self

    def _run(self, server: _Uvicorn, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # noqa: BLE001 - kept for start() to report
            self._failure = e

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) listened on (the port chosen when listen asked for port 0)."""
        return self.host, self.port

    @property
    def open_connections(self) -> int:
        """HTTP connections open now (tests wait on a client's close being seen)."""
        server = self._server
        return 0 if server is None else len(server.server_state.connections)

    def stats(self) -> dict[str, int]:
        """What the connections hold now: how many are open (from accept to close, a TLS
        handshake included), the most from one address, and how many were refused."""
        if self._places is None:
            return {"connections": 0, "most_from_one_address": 0, "refused": 0}
        return self._places.stats()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls_cert else 'http'}://{host}:{self.port}"

    def stop(self) -> None:
        """Stop listening, let requests in progress finish (up to shutdown_timeout), return."""
        if self._thread is None or self._server is None:
            return
        self._server.should_exit = True
        self._thread.join()
        self._thread = None

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
