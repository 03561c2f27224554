"""HTTP Basic authentication and ACLs for the HTTP server (the JSON API and the console).

The users are those of the SCRAM credentials file `mqcore serve --sasl-credentials` reads
(auth.py): a Basic password is checked as SASL PLAIN checks it, against the stored keys, so no
password is kept anywhere. `BasicAuthMiddleware` guards the whole app: a request without valid
credentials gets 401 (and a browser its login prompt); an accepted one carries its principal
("User:NAME") in `request.state.principal`. `access(request)` is that principal's view of the
ACL file (auth.Access, the check the Kafka listener makes too): every endpoint and page asks
it before it touches the store, and `visible` leaves out of a group listing what Kafka's
ListGroups and OffsetFetch leave out. Without credentials configured everything is allowed;
with credentials but no ACL file, everything is allowed to every authenticated user.

Basic credentials travel in clear text unless the server speaks TLS, so `check_transport`
refuses them on a non-loopback address without TLS (docs/console.md "Security").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from mqcore.errors import InvalidConfigError
from mqcore.query import engine
from mqcore.query.engine import QueryResult
from mqcore.server.auth import DESCRIBE, PLAIN, READ, Access, Authorizer, Sasl
from mqcore.server.httpbase import error_response
from mqcore.store import Store

REALM = "mqcore"


class HttpAuth:
    """Who may use the HTTP server: the users of a credentials file, and with an ACL file
    what each may write."""

    def __init__(self, sasl: Sasl, authorizer: Authorizer | None = None):
        self.sasl = sasl
        self.authorizer = authorizer
        # a password once checked is remembered as an HMAC under a key of this process, so
        # each request does not pay PBKDF2 again (a browser sends Basic with every request)
        self._key = secrets.token_bytes(32)
        self._checked: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, credentials: str, acl: str | None = None) -> HttpAuth:
        """From the paths of a credentials file and an optional ACL file (InvalidConfigError
        naming a bad line)."""
        return cls(Sasl(credentials, (PLAIN,)), Authorizer.load(acl) if acl else None)

    def principal(self, authorization: str | None) -> str | None:
        """The principal ("User:NAME") of a valid `Authorization: Basic ...` value, else None."""
        if authorization is None:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = (
                base64.b64decode(token.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep or not user:
            return None
        mark = hmac.new(self._key, password.encode(), hashlib.sha256).digest()
        with self._lock:
            known = self._checked.get(user)
        if known is not None and hmac.compare_digest(known, mark):
            return "User:" + user
        if not self.sasl.check_password(user, password):
            return None
        with self._lock:
            self._checked[user] = mark
        return "User:" + user


def principal_of(request: Request) -> str | None:
    """The request's principal ("User:NAME"), None without authentication."""
    return getattr(request.state, "principal", None)


def access(request: Request) -> Access:
    """What the request's principal may do (auth.Access): everything without credentials
    configured or without an ACL file."""
    auth: HttpAuth | None = request.app.state.auth
    principal = principal_of(request)
    if auth is None or principal is None:
        return Access(None)
    return Access(auth.authorizer, principal)


class _GroupRow(Protocol):
    @property
    def topic(self) -> str: ...


Row = TypeVar("Row", bound=_GroupRow)


def visible(lags: Mapping[str, Sequence[Row]], may: Access) -> dict[str, list[Row]]:
    """The groups `may` describes, each with the partitions of the topics it describes: what
    Kafka's ListGroups and OffsetFetch (all topics) show a principal; the rest is left out."""
    return {
        group: [row for row in rows if may.topic(DESCRIBE, row.topic)]
        for group, rows in lags.items()
        if may.group(DESCRIBE, group)
    }


def find_unique(
    store: Store, may: Access, unique_id: str, *, start: int | None, end: int | None, limit: int
) -> QueryResult:
    """Store.find_by_unique_id over the topics `may` reads only: the others are not searched,
    so neither their messages nor their existence shows (the JSON API's unique-ids and the
    console's lookup)."""
    store.log.check_open()
    parts = [
        part
        for part in store.log.all_partitions()
        if part.config.key_index and may.topic(READ, part.topic)
    ]
    return engine.find_unique(parts, unique_id, start, end, limit)


class BasicAuthMiddleware:
    """ASGI middleware: 401 unless the request carries valid Basic credentials."""

    def __init__(self, app: ASGIApp, auth: HttpAuth):
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization")
        # PBKDF2 on a first check takes milliseconds: off the event loop
        principal = await run_in_threadpool(self.auth.principal, header)
        if principal is None:
            response = error_response(
                401, "AuthenticationError", "this server needs a user name and password"
            )
            response.headers["WWW-Authenticate"] = f'Basic realm="{REALM}", charset="UTF-8"'
            await response(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        state["principal"] = principal
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(host: str, tls: bool) -> None:
    """Basic credentials only over TLS or on a loopback address (InvalidConfigError)."""
    if not tls and not is_loopback(host):
        raise InvalidConfigError(
            f"HTTP authentication on {host} without TLS would send passwords in clear text: "
            "give --tls-cert and --tls-key, or listen on a loopback address"
        )
