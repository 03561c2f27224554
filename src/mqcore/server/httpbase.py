"""The request plumbing of the HTTP API (server/http.py, server/sharehttp.py): query
parameters checked by name and type, errors answered as JSON with the HTTP status their
mqcore.errors class calls for, and the endpoint wrapper that runs a handler in Starlette's
thread pool (the Store's calls block)."""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

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
    SelectorSyntaxError,
    StoreClosedError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.store import Store

log = logging.getLogger("mqcore.server.http")  # one logger for the whole HTTP API

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
    """403 for what the principal's ACLs refuse, 404 for what is not there, 400 for a bad
    argument, 409 for a share acknowledgement of a record the member does not hold, a group
    name of the other type or a group whose members are in, 503 for a closed store, else
    500."""
    if isinstance(e, AuthorizationError):
        return 403
    if isinstance(e, NOT_FOUND):
        return 404
    if isinstance(e, (InvalidRecordStateError, GroupTypeError, GroupNotEmptyError)):
        return 409
    if isinstance(e, BAD_REQUEST):
        return 400
    if isinstance(e, StoreClosedError):
        return 503
    return 500


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
            with request.app.state.lend() as store:  # server/http.py: the store as it is now
                return JSONResponse(fn(store, request, params))
        except MQCoreError as e:
            return error_response(status_of(e), type(e).__name__, str(e))
        except Exception:  # a bug: logged here, answered without its traceback
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, "InternalError", "internal error (see the server log)")

    return endpoint


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
