"""The HTTP query API of `mqcore serve --http` (docs/server.md "HTTP query API").

`create_app(store)` is a Starlette ASGI app answering the Store's query calls as JSON under
/v1: topics and their offsets, one topic's config and partitions, a message by place, by store
ID or by unique ID, by key, by time, a search (tag, SQL92 selector, contains, regex) with
cursors, a partition read in order from an offset, and consumer groups with their lag. The
console (issue 14) mounts the same app.
`HttpServer(app, listen)` serves an ASGI app with uvicorn in a background thread, on its own
event loop, so a Python program (or mqcore.server.Server) starts and stops it.

Messages are mqcore.query.jsonform's objects, the ones `mqcore get/query --json` write. Every
handler is a plain function, which Starlette runs in its thread pool: the Store's calls block
(file reads), and the event loop stays free for other connections. Bad input is a 4xx JSON
error naming what was wrong (the mqcore.errors message), never a traceback.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import functools
import logging
import math
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mqcore.errors import (
    InvalidConfigError,
    InvalidMessageIdError,
    InvalidTopicError,
    MessageNotFoundError,
    MQCoreError,
    OffsetOutOfRangeError,
    SelectorSyntaxError,
    StoreClosedError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.log.internal import is_internal
from mqcore.query.engine import QueryResult
from mqcore.query.jsonform import message_object
from mqcore.server.address import parse_listen
from mqcore.store import Store

log = logging.getLogger("mqcore.server.http")

DEFAULT_LIMIT = 100  # messages a query returns when the request names no limit
MAX_LIMIT = 10_000  # a larger limit is cut to this (reason "limit" and a cursor say so)
DEFAULT_MAX_SCAN = 10_000_000  # records a scan examines at most (the Store's default)
MAX_TIMEOUT = 10.0  # seconds a scan may run per request; it then answers "timeout" + cursor
_DIGITS = re.compile(r"[0-9]{1,19}")

# -- errors -------------------------------------------------------------------------------------

NOT_FOUND = (UnknownTopicError, UnknownPartitionError, UnknownGroupError, MessageNotFoundError)
BAD_REQUEST = (
    InvalidConfigError,
    InvalidTopicError,
    InvalidMessageIdError,
    OffsetOutOfRangeError,
    SelectorSyntaxError,
)


def error_response(status: int, error: str, message: str) -> JSONResponse:
    """{"error": class name, "message": the sentence}, with the HTTP status."""
    return JSONResponse({"error": error, "message": message}, status_code=status)


def status_of(e: MQCoreError) -> int:
    """404 for what is not there, 400 for a bad argument, 503 for a closed store, else 500."""
    if isinstance(e, NOT_FOUND):
        return 404
    if isinstance(e, BAD_REQUEST):
        return 400
    if isinstance(e, StoreClosedError):
        return 503
    return 500


def _json_endpoint(
    fn: Callable[[Store, Request, Params], Any], allowed: tuple[str, ...] = ()
) -> Callable[[Request], JSONResponse]:
    """A handler taking (store, request, its checked query parameters) and returning a JSON
    value, as a Starlette endpoint that answers errors as JSON. A plain def: Starlette runs it
    in its thread pool, since the Store's calls block."""

    @functools.wraps(fn)
    def endpoint(request: Request) -> JSONResponse:
        try:
            params = Params(request, allowed)
            return JSONResponse(fn(request.app.state.store, request, params))
        except MQCoreError as e:
            return error_response(status_of(e), type(e).__name__, str(e))
        except Exception:  # a bug: logged here, answered without its traceback
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, "InternalError", "internal error (see the server log)")

    return endpoint


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (no such route: 404, wrong method: 405) as JSON too."""
    assert isinstance(exc, HTTPException)
    message = f"no route {request.url.path}" if exc.status_code == 404 else str(exc.detail)
    return error_response(exc.status_code, "HTTPError", message)


# -- request parameters -------------------------------------------------------------------------


class Params:
    """A request's query parameters, each given at most once and each one the endpoint takes
    (a misspelt name is refused rather than ignored). Text must be UTF-8 once percent-decoded;
    bytes that are not go as NAME_base64."""

    def __init__(self, request: Request, allowed: tuple[str, ...]):
        raw = request.scope.get("query_string", b"")
        try:
            pairs = urllib.parse.parse_qsl(
                raw.decode("utf-8"), keep_blank_values=True, errors="strict"
            )
        except UnicodeDecodeError as e:
            raise InvalidConfigError(
                "the query string is not UTF-8 once percent-decoded; send bytes as "
                "key_base64= or contains_base64="
            ) from e
        self.values: dict[str, str] = {}
        for name, value in pairs:
            if name not in allowed:
                takes = ", ".join(allowed) or "no parameters"
                raise InvalidConfigError(f"unknown parameter {name!r} (this call takes {takes})")
            if name in self.values:
                raise InvalidConfigError(f"parameter {name!r} is given more than once")
            self.values[name] = value

    def text(self, name: str) -> str | None:
        return self.values.get(name)

    def bytes(self, name: str) -> bytes | None:
        """NAME as its UTF-8, or NAME_base64 (standard alphabet, padded); not both."""
        text, b64 = self.values.get(name), self.values.get(name + "_base64")
        if text is not None and b64 is not None:
            raise InvalidConfigError(f"give {name} or {name}_base64, not both")
        if b64 is None:
            return None if text is None else text.encode("utf-8")
        try:
            return base64.b64decode(b64, validate=True)
        except binascii.Error as e:
            raise InvalidConfigError(
                f"{name}_base64 is not base64 (standard alphabet, padded; a + in a query "
                f"string is %2B): {e}"
            ) from e

    def integer(self, name: str) -> int | None:
        """A decimal integer >= 0 (ASCII digits, at most 19 of them); the Store checks ranges."""
        text = self.values.get(name)
        if text is None:
            return None
        if not _DIGITS.fullmatch(text):
            raise InvalidConfigError(f"{name} must be an integer >= 0, not {text[:40]!r}")
        return int(text)

    def count(self, name: str, default: int) -> int:
        """An integer parameter with a default (0 passes: the Store refuses it by name)."""
        value = self.integer(name)
        return default if value is None else value

    def limit(self, cap: int, default: int = DEFAULT_LIMIT) -> int:
        """`limit`, cut to `cap` (the result then ends with reason "limit")."""
        return min(self.count("limit", default), cap)

    def timeout(self, cap: float) -> float:
        """`timeout` in seconds (a number >= 0), never more than `cap` (its default)."""
        text = self.values.get("timeout")
        if text is None:
            return cap
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidConfigError(f"timeout must be a number of seconds >= 0, not {text!r}")
        return min(seconds, cap)


def path_int(request: Request, name: str) -> int:
    """A path segment that must be an integer >= 0 (a 400 naming it, not a 404, if not)."""
    text = request.path_params[name]
    if not _DIGITS.fullmatch(text):
        raise InvalidConfigError(f"{name} must be an integer >= 0, not {text[:40]!r}")
    return int(text)


# -- answers ------------------------------------------------------------------------------------


def result_object(r: QueryResult) -> dict[str, Any]:
    """A QueryResult: its messages and how the query ended (reason, cursor, scan counts)."""
    missing = r.missing_properties
    return {
        "messages": [message_object(m) for m in r.messages],
        "reason": r.reason,
        "complete": r.complete,
        "cursor": r.cursor,
        "scanned_records": r.scanned_records,
        "scanned_bytes": r.scanned_bytes,
        "missing_properties": None if missing is None else list(missing),
    }


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
    topics = [
        {"topic": t, "internal": is_internal(t), "partitions": partition_offsets(store, t)}
        for t in store.topics()
    ]
    return {"topics": topics}


def describe_topic(store: Store, request: Request, params: Params) -> dict[str, Any]:
    topic = request.path_params["topic"]
    config = store.topic_config(topic)  # UnknownTopicError first
    partitions = partition_offsets(store, topic)
    for entry in partitions:
        entry["segments"] = len(store.segment_offsets(topic, entry["partition"]))
    return {
        "topic": topic,
        "internal": is_internal(topic),
        "config": dataclasses.asdict(config),
        "partitions": partitions,
    }


def get_message(store: Store, request: Request, params: Params) -> dict[str, Any]:
    topic = request.path_params["topic"]
    partition, offset = path_int(request, "partition"), path_int(request, "offset")
    msg = store.get(topic, partition, offset)
    if msg is None:
        raise MessageNotFoundError(f"no message at offset {offset} of {topic}-{partition}")
    return {"message": message_object(msg)}


def read_messages(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """Store.read: up to `limit` messages from `offset` on (a partition browsed in order);
    `next_offset` is where the next page starts, `end_offset` the partition's end then."""
    topic, partition = request.path_params["topic"], path_int(request, "partition")
    offset = params.count("offset", 0)
    msgs = store.read(topic, partition, offset, params.limit(request.app.state.max_limit))
    return {
        "messages": [message_object(m) for m in msgs],
        "next_offset": msgs[-1].offset + 1 if msgs else offset,
        "end_offset": store.end_offset(topic, partition),
    }


def get_by_id(store: Store, request: Request, params: Params) -> dict[str, Any]:
    msg_id = request.path_params["msg_id"]
    msg = store.get_by_id(msg_id)
    if msg is None:
        raise MessageNotFoundError(f"no message with store ID {msg_id!r} (or no longer)")
    return {"message": message_object(msg)}


def by_unique_id(store: Store, request: Request, params: Params) -> dict[str, Any]:
    r = store.find_by_unique_id(
        request.path_params["unique_id"],
        start=params.integer("start"),
        end=params.integer("end"),
        limit=params.limit(request.app.state.max_limit, default=1),
    )
    return result_object(r)


def by_key(store: Store, request: Request, params: Params) -> dict[str, Any]:
    key = params.bytes("key")
    if key is None:
        raise InvalidConfigError("by-key needs key= (or key_base64=)")
    r = store.find_by_key(
        request.path_params["topic"],
        key,
        start=params.integer("start"),
        end=params.integer("end"),
        limit=params.limit(request.app.state.max_limit),
        partition=params.integer("partition"),
        cursor=params.text("cursor"),
    )
    return result_object(r)


def search(store: Store, request: Request, params: Params) -> dict[str, Any]:
    """by-time and search: one Store.search, with the filters the request gives."""
    r = store.search(
        request.path_params["topic"],
        contains=params.bytes("contains"),
        regex=params.text("regex"),
        tag=params.text("tag"),
        where=params.text("where"),
        partition=params.integer("partition"),
        start=params.integer("start"),
        end=params.integer("end"),
        limit=params.limit(request.app.state.max_limit),
        max_scan=params.count("max_scan", DEFAULT_MAX_SCAN),
        timeout=params.timeout(request.app.state.max_timeout),
        cursor=params.text("cursor"),
    )
    return result_object(r)


def groups(store: Store, request: Request, params: Params) -> dict[str, Any]:
    name = request.path_params.get("group")
    lags = store.group_lag(name)
    if name is not None and not lags:
        raise UnknownGroupError(f"consumer group {name!r} has no committed offsets here")
    found = [
        {
            "group": group,
            "lag": sum(p.lag or 0 for p in parts),
            "partitions": [p.to_json() for p in parts],
        }
        for group, parts in sorted(lags.items())
    ]
    return found[0] if name is not None else {"groups": found}


PAGE = ("limit", "cursor", "start", "end", "partition")
SCAN = (*PAGE, "max_scan", "timeout")


def create_app(
    store: Store, *, max_limit: int = MAX_LIMIT, max_timeout: float = MAX_TIMEOUT
) -> Starlette:
    """The JSON query API over `store` (left open: the caller owns it). A request's `limit` is
    cut to `max_limit` messages; a scan runs at most `max_timeout` seconds. Either then answers
    with its reason ("limit", "timeout") and a cursor to go on from."""
    routes = [
        Route("/v1/topics", _json_endpoint(list_topics)),
        Route("/v1/topics/{topic}", _json_endpoint(describe_topic)),
        Route(
            "/v1/topics/{topic}/partitions/{partition}/offsets/{offset}",
            _json_endpoint(get_message),
        ),
        Route(
            "/v1/topics/{topic}/partitions/{partition}/messages",
            _json_endpoint(read_messages, ("offset", "limit")),
        ),
        Route("/v1/topics/{topic}/by-key", _json_endpoint(by_key, (*PAGE, "key", "key_base64"))),
        Route("/v1/topics/{topic}/by-time", _json_endpoint(search, SCAN)),
        Route(
            "/v1/topics/{topic}/search",
            _json_endpoint(search, (*SCAN, "tag", "where", "contains", "contains_base64", "regex")),
        ),
        Route("/v1/messages/{msg_id}", _json_endpoint(get_by_id)),
        Route(
            "/v1/unique-ids/{unique_id}", _json_endpoint(by_unique_id, ("start", "end", "limit"))
        ),
        Route("/v1/groups", _json_endpoint(groups)),
        Route("/v1/groups/{group}", _json_endpoint(groups)),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.store = store
    app.state.max_limit = max_limit
    app.state.max_timeout = max_timeout
    return app


# -- serving ------------------------------------------------------------------------------------


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
    port (see `address`). Use as a context manager, or start() and stop()."""

    def __init__(self, app: Any, listen: str = "127.0.0.1:0", *, shutdown_timeout: int = 5):
        self.app = app
        self.host, self.port = parse_listen(listen)
        self.shutdown_timeout = shutdown_timeout
        self._server: _Uvicorn | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def start(self) -> HttpServer:
        """Bind (an OSError here, in the caller), then serve until stop()."""
        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,  # leave the host program's logging alone
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=self.shutdown_timeout,
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
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

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
