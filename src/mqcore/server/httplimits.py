"""What one client may hold of the HTTP listener (the JSON API and the console), bounded as the
Kafka listener bounds it (server/network.py; docs/server.md "HTTP query API", "Limits").

Connections are counted at accept(), before asyncio makes a transport or a TLS handshake
starts: `ListenSocket` is the listening socket uvicorn is given, and asyncio's accept loop calls
its accept(), which closes a connection past `max_connections` in all or
`max_connections_per_ip` from one address (an IPv6 client by its /64, as logins are counted)
and takes a place for any other; the accepted socket (`PlacedSocket`) gives its place back when
asyncio closes it. uvicorn's `limit_concurrency` does not do this: it counts a connection only
once its request's headers are in, so connections that send nothing held a descriptor each
without bound. With no descriptor left in the process, a waiting connection is accepted with a
spare one and closed, rather than left to asyncio's retries.

The deadlines (a request's arrival, idleness, an unread response) are kept by the HTTP protocol
(server/http.py), which has uvicorn's event loop at hand; this module has no uvicorn in it, so
`Server` checks the limits at construction without importing it.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mqcore.server.backoff import peer_key
from mqcore.server.bounds import check_counts, check_seconds
from mqcore.server.defaults import (
    HTTP_IDLE_TIMEOUT as IDLE_TIMEOUT,
)
from mqcore.server.defaults import (
    HTTP_MAX_CONNECTIONS as MAX_CONNECTIONS,
)
from mqcore.server.defaults import (
    HTTP_MAX_CONNECTIONS_PER_IP as MAX_CONNECTIONS_PER_IP,
)
from mqcore.server.defaults import (
    HTTP_REQUEST_TIMEOUT as REQUEST_TIMEOUT,
)

log = logging.getLogger("mqcore.server.http")

MAX_HEADER_BYTES = 16 << 10  # h11's bound on an incomplete event (a request line and headers)
REFUSAL_LOG_INTERVAL = 10.0  # seconds between two lines about refused connections


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP listener's bounds. A value that cannot work is refused (InvalidConfigError
    naming the keyword: `named` goes before each name, "http_" for Server's keywords)."""

    max_connections: int = MAX_CONNECTIONS
    max_connections_per_ip: int = MAX_CONNECTIONS_PER_IP
    request_timeout: float = REQUEST_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    named: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        check_counts(self.named, max_connections=self.max_connections,
                     max_connections_per_ip=self.max_connections_per_ip)  # fmt: skip
        check_seconds(self.named, request_timeout=self.request_timeout,
                      idle_timeout=self.idle_timeout)  # fmt: skip


class Places:
    """The connections open, in all and per address. Taken on the event loop's thread and read
    from others (stats), hence the lock."""

    def __init__(self, max_connections: int, max_connections_per_ip: int):
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self._lock = threading.Lock()
        self._open = 0
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._refused = 0
        self._held_back = 0
        self._next_log = 0.0

    def take(self, key: str) -> str | None:
        """Take a place for a connection from `key`; else the reason it is refused."""
        with self._lock:
            held = self._per_ip[key]
            if self._open >= self.max_connections:
                refusal = f"{self._open} HTTP connections open (max_connections)"
            elif held >= self.max_connections_per_ip:
                refusal = f"{held} HTTP connections from {key} (max_connections_per_ip)"
            else:
                self._open += 1
                self._per_ip[key] += 1
                return None
        self.count_refusal(refusal)
        return refusal

    def give(self, key: str) -> None:
        with self._lock:
            self._open -= 1
            self._per_ip[key] -= 1
            if self._per_ip[key] <= 0:
                del self._per_ip[key]

    def stats(self) -> dict[str, int]:
        """Connections open, the most from one address, connections refused so far."""
        with self._lock:
            return {
                "connections": self._open,
                "most_from_one_address": max(self._per_ip.values(), default=0),
                "refused": self._refused,
            }

    def count_refusal(self, refusal: str) -> None:
        """Count a refused connection and log it: a warning, at most one line per
        REFUSAL_LOG_INTERVAL (a flood is counted, not logged line by line)."""
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            if now < self._next_log:
                self._held_back += 1
                return
            held, self._held_back = self._held_back, 0
            self._next_log = now + REFUSAL_LOG_INTERVAL
        more = f"; {held} more refused since the last line" if held else ""
        log.warning("refused an HTTP connection: %s%s", refusal, more)


class PlacedSocket(socket.socket):
    """An accepted connection holding a place; closing it gives the place back (once)."""

    def __init__(self, listener: socket.socket, fd: int, places: Places, key: str):
        super().__init__(listener.family, listener.type, listener.proto, fileno=fd)
        self._place: tuple[Places, str] | None = (places, key)

    def close(self) -> None:
        place, self._place = self._place, None
        if place is not None:
            place[0].give(place[1])
        super().close()


class ListenSocket(socket.socket):
    """The listening socket: accept() admits a connection within the places, or closes it.
    It keeps a spare descriptor for the moment the process has none left: asyncio's accept
    loop, told EMFILE, retries once per connection waiting and schedules as many restarts
    (CPython gh-151615: 23,000 retries and 2 s of CPU in 3 s), so the connection waiting is
    accepted with the spare and closed instead, as libuv does."""

    def __init__(self, family: int, places: Places):
        # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on connections whose
        # socket says TCP, and without it every response on a kept-alive connection waited
        # ~40 ms for the client's delayed ACK (Nagle)
        super().__init__(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.places = places
        self._spare = _spare_descriptor()

    def accept(self) -> tuple[socket.socket, Any]:
        """The next connection, holding its place. One past a bound, or one that came when no
        descriptor was free, is closed here and ConnectionAbortedError raised, which asyncio's
        accept loop passes over."""
        try:
            fd, peer = self._accept()  # type: ignore[attr-defined]
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE) or self._spare is None:
                raise
            self._refuse_without_descriptors()
            raise ConnectionAbortedError("no descriptor free") from e
        key = peer_key(peer[0] if isinstance(peer, tuple) else None)
        refusal = self.places.take(key)
        if refusal is not None:
            os.close(fd)
            raise ConnectionAbortedError(refusal)
        return PlacedSocket(self, fd, self.places, key), peer

    def _refuse_without_descriptors(self) -> None:
        """Accept the connection waiting with the spare descriptor and close it, so the
        listener is no longer readable for it; then take a spare again."""
        assert self._spare is not None
        os.close(self._spare)
        self._spare = None
        try:
            fd = self._accept()[0]  # type: ignore[attr-defined]
        except OSError:
            fd = None  # gone already, or the descriptor was taken meanwhile
        # counted before the close: the client that sees its connection closed finds it in
        # the stats (a test read them in between and counted one short)
        self.places.count_refusal("no descriptor free (the process's open-files limit)")
        if fd is not None:
            os.close(fd)
        self._spare = _spare_descriptor()

    def close(self) -> None:
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        super().close()


def _spare_descriptor() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
