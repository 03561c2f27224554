"""The request plumbing of the HTTP API (server/http.py, server/sharehttp.py): query
parameters checked by name and type, errors answered as JSON with the HTTP status their
mqcore.errors class calls for, the endpoint wrapper that runs a handler in Starlette's
thread pool (the Store's calls block), and `Scans`, the bound on scans (below).

Scans (the API's search and by-time, the console's browser rows) are the expensive requests:
a search may run `max_timeout` seconds. Sixty of them at once took every thread of
Starlette's pool (anyio's 40), so cheap requests waited for them (10.5 s), and a scan whose
client had gone ran on to its end. So:
- at most `max_scans` run at once (default 2 x the CPUs), each on a thread of the scans' own
  (anyio.CapacityLimiter of that size), never on the pool cheap requests are served from;
- one over the bound waits for a slot at most `scan_wait` seconds (default 2) without a
  thread, then is answered 503 with Retry-After: a short burst (the console's chunks, a
  script's few searches) is absorbed, a flood is refused early rather than queued for
  minutes;
- the API's search runs in slices of SCAN_SLICE seconds, each resuming at the previous one's
  cursor, and stops when its client has gone (counted in `Scans.abandoned`); the console's
  rows are one 0.3 s chunk a request anyway. Slices answer what one call would: the pages of
  a query hold exactly its messages (docs/query.md)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import logging
import math
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mqcore.errors import (
    AuthorizationError,
    GroupNotEmptyError,
    GroupTypeError,
    InvalidConfigError,
    InvalidMessageIdError,
    InvalidRecordStateError,
    InvalidTopicError,
    MessageNotFoundError,
    MQCoreError,
    OffsetOutOfRangeError,
    ReplicationError,
    SelectorSyntaxError,
    StoreClosedError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.query.engine import LIMIT, MAX_SCAN, TIMEOUT, QueryResult, usable_cpus
from mqcore.query.jsonform import message_object
from mqcore.store import Store

log = logging.getLogger("mqcore.server.http")  # one logger for the whole HTTP API

DEFAULT_LIMIT = 100  # messages a query returns when the request names no limit
MAX_LIMIT = 10_000  # a larger limit is cut to this (reason "limit" and a cursor say so)
MAX_BODY_BYTES = 64 << 20  # request bodies being read by every connection together
DEFAULT_MAX_SCAN = 10_000_000  # records a scan examines at most (the Store's default)
MAX_TIMEOUT = 10.0  # seconds a scan may run per request; it then answers "timeout" + cursor
DEFAULT_MAX_SCANS = 2 * usable_cpus()  # scans running at once (Scans)
SCAN_WAIT = 2.0  # seconds a scan waits for a slot before it is answered 503
SCAN_SLICE = 0.5  # seconds of one slice of a search: its client's presence is checked between
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
    """403 for what the principal's ACLs refuse, 404 for what is not there, 400 for a bad
    argument, 409 for a share acknowledgement of a record the member does not hold, a group
    name of the other type or a group whose members are in, 503 for a closed store or a
    cluster's partition whose leader does not answer now (ask again), else 500."""
    if isinstance(e, AuthorizationError):
        return 403
    if isinstance(e, NOT_FOUND):
        return 404
    if isinstance(e, (InvalidRecordStateError, GroupTypeError, GroupNotEmptyError)):
        return 409
    if isinstance(e, BAD_REQUEST):
        return 400
    if isinstance(e, (StoreClosedError, ReplicationError)):
        return 503  # a closed store; on a cluster, a partition without a leader now
    return 500


def error_answer(request: Request, e: Exception) -> JSONResponse:
    """An exception as the JSON error: an mqcore error with its status, a busy scan bound
    503, anything else a bug, logged here and answered without its traceback."""
    if isinstance(e, MQCoreError):
        return error_response(status_of(e), type(e).__name__, str(e))
    if isinstance(e, Busy):
        response = error_response(503, "HTTPError", str(e))
        response.headers["Retry-After"] = "1"
        return response
    log.error("%s %s failed", request.method, request.url.path, exc_info=e)
    return error_response(500, "InternalError", "internal error (see the server log)")


def json_endpoint(
    fn: Callable[[Store, Request, Params], Any], allowed: tuple[str, ...] = ()
) -> Callable[[Request], JSONResponse]:
    """A handler taking (store, request, its checked query parameters) and returning a JSON
    value, as a Starlette endpoint that answers errors as JSON. A plain def: Starlette runs it
    in its thread pool, since the Store's calls block."""

    @functools.wraps(fn)
    def endpoint(request: Request) -> JSONResponse:
        try:
            params = Params(request, allowed)
            with request.app.state.lend(request) as store:  # server/http.py: the store as it is now
                return JSONResponse(fn(store, request, params))
        except Exception as e:  # noqa: BLE001 - every error is answered as JSON
            return error_answer(request, e)

    return endpoint


# -- scans --------------------------------------------------------------------------------------

T = TypeVar("T")


class Busy(Exception):
    """A bound the server keeps on some work is reached (answered 503 with Retry-After)."""


class ScansBusy(Busy):
    """No scan slot came free within the wait."""


class Bodies:
    """What request bodies being read hold together (the HTTP side of the Kafka listener's
    max_queued_request_bytes): a body is taken in as it arrives, within its own `cap` and this
    budget, and gives its bytes back when its reader is done; one that does not fit is
    answered 503 (Busy). A Content-Length over the cap is refused before anything is read.
    Used on the event loop only."""

    def __init__(self, capacity: int = MAX_BODY_BYTES):
        if capacity < 1:
            raise InvalidConfigError(f"max_body_bytes must be >= 1, not {capacity}")
        self.capacity = capacity
        self.used = 0

    @contextlib.asynccontextmanager
    async def read(self, request: Request, cap: int, what: str) -> AsyncIterator[bytearray]:
        """The body, at most `cap` bytes (InvalidConfigError naming `what` past it)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise InvalidConfigError(f"{what} is {declared} bytes: at most {cap}")
        body = bytearray()
        try:
            async for chunk in request.stream():
                if len(body) + len(chunk) > cap:
                    raise InvalidConfigError(f"{what} is larger than {cap} bytes")
                if self.used + len(chunk) > self.capacity:
                    raise Busy(f"request bodies being read hold {self.used} bytes (the "
                               f"server's bound, {self.capacity}): try again")  # fmt: skip
                self.used += len(chunk)
                body += chunk
            yield body
        finally:
            self.used -= len(body)


class Scans:
    """The bound on one app's scans (see the module docstring): `slot()` to run one,
    `run(fn, ...)` for its blocking calls, `slices(request, scan)` for a search.
    `running`, `waiting` (for a slot), `abandoned` (stopped because the client went away)
    and `refused` (503) say what happened; all are used on the event loop only."""

    def __init__(self, max_scans: int = DEFAULT_MAX_SCANS, wait: float = SCAN_WAIT):
        if max_scans < 1 or not wait >= 0:
            raise InvalidConfigError(
                f"max_scans must be >= 1 and scan_wait >= 0, not {max_scans} and {wait}"
            )
        self.max_scans, self.wait = max_scans, wait
        self._slots = anyio.CapacityLimiter(max_scans)
        self._threads = anyio.CapacityLimiter(max_scans)  # the scans' own: never the pool's
        self.running = self.waiting = self.abandoned = self.refused = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the max_scans slots, waiting `wait` seconds at most (ScansBusy)."""
        acquired = await self._acquire()
        if not acquired:
            self.refused += 1
            raise ScansBusy(
                f"{self.max_scans} scans are running (the server's bound) and none ended "
                f"within {self.wait:g} s: try again"
            )
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()

    async def _acquire(self) -> bool:
        """A slot at once if one is free, else within `wait` seconds; False when none came."""
        try:
            self._slots.acquire_nowait()
            return True
        except anyio.WouldBlock:
            pass
        self.waiting += 1
        try:
            with anyio.move_on_after(self.wait):
                await self._slots.acquire()
                return True
        finally:
            self.waiting -= 1
        return False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on one of the scans' threads."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._threads)

    async def slices(self, request: Request, scan: Scan) -> QueryResult | None:
        """`scan` run SCAN_SLICE seconds at a time on a scan thread, each slice resuming at
        the previous one's cursor, until the query ends (exhausted, limit, max_scan) or its
        timeout passes: the answer one call would give. None when the client went away
        between two slices (counted in `abandoned`)."""
        deadline = time.monotonic() + scan.timeout
        total, cursor = QueryResult(), scan.cursor
        limit, max_scan = scan.limit, scan.max_scan
        while True:
            timeout = min(SCAN_SLICE, max(0.0, deadline - time.monotonic()))
            piece = await self.run(lent_call, request, scan.call, limit, max_scan, timeout, cursor)
            merge(total, piece)
            limit = scan.limit - len(total.messages)
            max_scan = scan.max_scan - total.scanned_records
            if piece.reason != TIMEOUT or time.monotonic() >= deadline:
                return total
            if limit < 1 or max_scan < 1:  # the time ran out just as the limit was met
                total.reason = LIMIT if limit < 1 else MAX_SCAN
                return total
            if await request.is_disconnected():
                self.abandoned += 1
                return None
            cursor = piece.cursor


@dataclass(frozen=True)
class Scan:
    """What a scan request asks for: `call(store, limit, max_scan, timeout, cursor)` is one
    Store.search of it."""

    call: Callable[[Store, int, int, float, str | None], QueryResult]
    limit: int
    max_scan: int
    timeout: float
    cursor: str | None


def lent_call(request: Request, call: Callable[..., T], *args: Any) -> T:
    """call(store, *args) with the store as it is now (server/http.py lend)."""
    with request.app.state.lend(request) as store:
        return call(store, *args)


def merge(total: QueryResult, piece: QueryResult) -> None:
    """A slice's result added to the whole: its messages, counts, how it ended; a property
    is missing when no slice that examined a message saw it."""
    total.messages += piece.messages
    total.scanned_records += piece.scanned_records
    total.scanned_bytes += piece.scanned_bytes
    total.reason, total.cursor = piece.reason, piece.cursor
    if piece.missing_properties is not None:
        before = total.missing_properties
        total.missing_properties = (
            piece.missing_properties
            if before is None
            else tuple(sorted(set(before) & set(piece.missing_properties)))
        )


def scan_endpoint(
    plan: Callable[[Request, Params], Scan], allowed: tuple[str, ...]
) -> Callable[[Request], Awaitable[Response]]:
    """A scan as an endpoint: `plan` checks the request (on the event loop: no store call),
    then the scan waits for a slot and runs in slices (Scans); the answer is its result."""

    async def endpoint(request: Request) -> Response:
        try:
            scan = plan(request, Params(request, allowed))
            scans: Scans = request.app.state.scans
            async with scans.slot():
                result = await scans.slices(request, scan)
        except Exception as e:  # noqa: BLE001 - every error is answered as JSON
            return error_answer(request, e)
        if result is None:  # nobody is there to read it
            return error_response(499, "HTTPError", "the client went away")
        return JSONResponse(result_object(result))

    return endpoint


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


async def http_error(request: Request, exc: Exception) -> JSONResponse:
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
        """`limit` (>= 1: 0 is refused, as every Store query refuses it), cut to `cap` (the
        result then ends with reason "limit")."""
        value = self.count("limit", default)
        if value < 1:
            raise InvalidConfigError("limit must be >= 1, not 0")
        return min(value, cap)

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


def replica_view(request: Request, topic: str) -> dict[int, dict[str, Any]]:
    """On a cluster's broker, each partition's leader, leader epoch, replicas, in-sync
    replicas and this broker's high watermark of it (docs/cluster.md); {} on a node of one."""
    view = request.app.state.replicas
    return {} if view is None else view(topic)
