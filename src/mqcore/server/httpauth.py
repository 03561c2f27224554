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

Failed logins back off per peer and per user (backoff.LoginBackoff): an attempt during a
backoff is answered 429 with Retry-After before its password is checked, and a lockout is
logged once, as a warning of the `mqcore.server.http` logger.

Basic credentials travel in clear text unless the server speaks TLS, so `check_transport`
refuses them on a non-loopback address without TLS (docs/console.md "Security").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import math
import secrets
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mqcore.errors import InvalidConfigError
from mqcore.query.engine import QueryResult
from mqcore.server.auth import DESCRIBE, PLAIN, READ, Access, Authorizer, Sasl
from mqcore.server.backoff import LoginBackoff, peer_key
from mqcore.server.httpbase import error_response, log
from mqcore.store import Store

REALM = "mqcore"


class LoginRefused(Exception):
    """The attempt comes during a login backoff: answered 429 after `wait` seconds more,
    without its password being checked."""

    def __init__(self, wait: float):
        super().__init__(f"wait {wait:.1f} s")
        self.wait = wait


class HttpAuth:
    """Who may use the HTTP server: the users of a credentials file, what each may do (the
    ACL file; everything without one), and how failed logins back off (`backoff`, per peer
    and per user: server/backoff.py)."""

    def __init__(
        self, sasl: Sasl, authorizer: Authorizer | None = None, backoff: LoginBackoff | None = None
    ):
        self.sasl = sasl
        self.authorizer = authorizer
        self.backoff = backoff if backoff is not None else LoginBackoff(logger=log)
        # a password once checked is remembered as an HMAC under a key of this process, so
        # each request does not pay PBKDF2 again (a browser sends Basic with every request)
        self._key = secrets.token_bytes(32)
        self._checked: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._locks = _KeyedLocks()

    @classmethod
    def load(cls, credentials: str, acl: str | None = None) -> HttpAuth:
        """From the paths of a credentials file and an optional ACL file (InvalidConfigError
        naming a bad line)."""
        return cls(Sasl(credentials, (PLAIN,)), Authorizer.load(acl) if acl else None)

    async def login(self, peer: str, authorization: str | None) -> str | None:
        """The principal ("User:NAME") of a valid `Authorization: Basic ...` value from `peer`
        (backoff.peer_key), else None. LoginRefused during a backoff, before any check: a
        remembered password too, or the remembered HMAC would test guesses for free. Checks
        that need PBKDF2 run one at a time per peer and per user, so parallel requests do
        not get round the backoff."""
        given = basic_credentials(authorization)
        if given is None:
            return None
        user, password = given
        self._refuse_during_backoff(peer, user)
        if self._remembered(user, password):
            return "User:" + user
        async with self._locks.hold("peer " + peer), self._locks.hold("user " + user):
            self._refuse_during_backoff(peer, user)  # the attempt before may have failed
            if self._remembered(user, password):
                return "User:" + user
            # PBKDF2 takes milliseconds: off the event loop
            if not await run_in_threadpool(self.sasl.check_password, user, password):
                self.backoff.failed(peer, user)
                return None
            self._remember(user, password)
        self.backoff.succeeded(peer, user)
        return "User:" + user

    def _refuse_during_backoff(self, peer: str, user: str) -> None:
        wait = self.backoff.wait(peer, user)
        if wait > 0:
            raise LoginRefused(wait)

    def _mark(self, password: str) -> bytes:
        return hmac.new(self._key, password.encode(), hashlib.sha256).digest()

    def _remembered(self, user: str, password: str) -> bool:
        with self._lock:
            known = self._checked.get(user)
        return known is not None and hmac.compare_digest(known, self._mark(password))

    def _remember(self, user: str, password: str) -> None:
        with self._lock:
            self._checked[user] = self._mark(password)


def basic_credentials(authorization: str | None) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic ...` value; None for anything else."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and user else None


class _KeyedLocks:
    """asyncio locks by name, each kept only while a request holds or waits for it (so as
    many as requests in flight at most). Used on the event loop only."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        lock = lock or asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


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
    store: Store, may: Access, unique_id: str, *, start: int | None, end: int | None, limit: int,
    **isolation: str,
) -> QueryResult:  # fmt: skip
    """Store.find_by_unique_id over the topics `may` reads only (the JSON API's unique-ids
    and the console's lookup); `isolation` its isolation_level, if given."""
    return store.find_by_unique_id(
        unique_id, start=start, end=end, limit=limit, topics=lambda t: may.topic(READ, t),
        **isolation,
    )  # fmt: skip


class BasicAuthMiddleware:
    """ASGI middleware: 401 unless the request carries valid Basic credentials, 429 (with
    Retry-After) during a login backoff."""

    def __init__(self, app: ASGIApp, auth: HttpAuth):
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        try:
            principal = await self.auth.login(
                peer_key(client[0] if client else None), Headers(scope=scope).get("authorization")
            )
        except LoginRefused as e:
            await too_many_failures(e.wait)(scope, receive, send)
            return
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


def too_many_failures(wait: float) -> JSONResponse:
    """429 with Retry-After: the attempt came during a login backoff."""
    seconds = math.ceil(wait)
    response = error_response(
        429, "AuthenticationError",
        f"too many failed logins from this address or as this user: try again in {seconds} s",
    )  # fmt: skip
    response.headers["Retry-After"] = str(seconds)
    return response


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SameOriginMiddleware:
    """ASGI middleware against DNS rebinding and cross-site requests. Every request's Host
    must name this server (421 otherwise): the address the connection came to, `localhost`
    when that is a loopback address, or one of `allowed_hosts` (a page of evil.example whose
    name was rebound to 127.0.0.1 sends Host evil.example). A request that changes something
    (any method but GET, HEAD, OPTIONS) whose Origin, or without one its Referer, is another
    site's page is refused (403): browsers send them; other clients need not, and the
    console's write actions require one (actions.py)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = ()):
        self.app = app
        self.allowed = frozenset(host_name(h) for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        server = scope.get("server")
        local = server[0] if server else None
        if not self.serves(host_name(host), local):
            names = ", ".join(sorted({*self.allowed, *served_names(local)})) or "none"
            return error_response(
                421, "HTTPError",
                f"Host {host_name(host)!r} is not a name this server answers to ({names}; "
                "add names with --allowed-host)",
            )  # fmt: skip
        source = headers.get("origin") or headers.get("referer")
        if scope["method"] in SAFE_METHODS or source is None or same_site(source, host):
            return None
        return error_response(
            403, "HTTPError",
            f"cross-origin {scope['method']} refused: {source[:200]!r} is not a page of "
            f"this server ({host[:200]!r})",
        )  # fmt: skip

    def serves(self, name: str, local: str | None) -> bool:
        return bool(name) and (name in self.allowed or name in served_names(local))


def host_name(value: str) -> str:
    """The host of a Host header or a name ("[::1]:8080" -> "::1", "Example.COM.:80" ->
    "example.com"), lower case, without a trailing dot; an IP address in its usual form."""
    value = value.strip().lower()
    if value.startswith("["):
        name = value[1:].partition("]")[0]
    else:
        name = value.rpartition(":")[0] if value.count(":") == 1 else value
    name = name.rstrip(".")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def served_names(local: str | None) -> set[str]:
    """The names a connection to the local address `local` answers to: the address itself
    (an IPv4-mapped IPv6 address as the IPv4 one too) and localhost when it is loopback."""
    if not local:
        return set()
    names = {local.lower()}
    try:
        ip = ipaddress.ip_address(local)
    except ValueError:
        return names
    names.add(str(ip))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
        names.add(str(ip))
    if ip.is_loopback:
        names.add("localhost")
    return names


def same_site(url: str, host: str) -> bool:
    """Whether the page `url` (an Origin or a Referer) is of the server the Host header
    `host` names: the same host name and the same port (a port the scheme implies counts as
    none, as browsers write it)."""
    try:
        page = urllib.parse.urlsplit(url)
        page_port = page.port
    except ValueError:
        return False
    if page.scheme not in ("http", "https") or not page.hostname:
        return False
    implied = {"http": 80, "https": 443}[page.scheme]
    _, colon, port = host.strip().rpartition(":")
    host_port = int(port) if colon and port.isdigit() and not host.endswith("]") else None
    same_port = (page_port or implied) == (host_port or implied)
    return host_name(page.hostname) == host_name(host) and same_port


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
