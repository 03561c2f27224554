"""`mqcore serve`: a store behind the Kafka protocol, for clients in any language.

One thread accepts, one thread serves each connection: it reads a frame, answers it, reads
the next, so a connection's responses go out in the order of its requests (Kafka's rule, which
clients with several requests in flight rely on). The store's own calls release the GIL where
they wait (fdatasync, file reads), and an idle connection's thread sleeps in recv().

Limits, each a keyword of Server: `max_connections` (refused at accept: the socket is closed),
`max_request_bytes` (a frame announcing more is refused from its 4-byte size, before its body
is read: the connection closes), `idle_timeout` (a connection silent between requests is
closed), `request_timeout` (a frame that stops arriving midway is dropped with its connection).
A frame that does not parse closes that connection only; the server goes on serving the others.

Security (server.auth, docs/server.md "Security"): `tls_cert`/`tls_key` (and `tls_ca` to
require client certificates) make every connection TLS, its handshake done in the connection's
thread under `request_timeout`, so a client that stalls in it never holds up accept.
`sasl_credentials` turns SASL on: until a connection has authenticated, only ApiVersions,
SaslHandshake and SaslAuthenticate are answered and anything else closes it. `acl` (with
SASL) names the ACL file the broker checks each topic operation against.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import socket
import ssl
import threading
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mqcore.errors import AuthenticationError, InvalidConfigError, MQCoreError, ProtocolError
from mqcore.server.address import parse_listen
from mqcore.server.auth import (
    MECHANISMS,
    PLAIN,
    Authorizer,
    Sasl,
    SaslState,
    sasl_not_enabled,
    tls_context,
)
from mqcore.server.broker import Broker
from mqcore.server.common import CloseConnection, Session
from mqcore.server.fetchwire import FetchAnswer, FetchFrame, encode_fetch, send_frame
from mqcore.server.groups import INITIAL_REBALANCE_DELAY
from mqcore.server.producewire import ProduceAnswer, encode_produce
from mqcore.server.protocol import (
    API_VERSIONS,
    CONNECTION_APIS,
    encode_response,
    frame_size,
    parse_request,
    peek_header,
    read_frame_size,
    unsupported_versions_response,
)
from mqcore.storage import durable
from mqcore.store import Store

if TYPE_CHECKING:
    from mqcore.server.http import HttpServer

log = logging.getLogger("mqcore.server")

DEFAULT_PORT = 9092
MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
CLUSTER_FILE = "mqcore-cluster-id"


class Server:
    """The Kafka protocol over one store. `store` is an open Store (the server uses it, and
    leaves it open at stop) or a path (the server opens it with `store_options` and closes it
    at stop). Binds to loopback unless `listen` names another address. `http` ("HOST:PORT")
    also serves the JSON query API there (server/http.py; `http_server.url`). Use as a context
    manager, or start() and stop()."""

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        listen: str = f"127.0.0.1:{DEFAULT_PORT}",
        *,
        advertised_host: str | None = None,
        node_id: int = 0,
        auto_create_topics: bool = True,
        default_partitions: int = 1,
        max_connections: int = 4096,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        idle_timeout: float = 600.0,
        request_timeout: float = 30.0,
        group_initial_rebalance_delay: float = INITIAL_REBALANCE_DELAY,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        sasl_credentials: str | os.PathLike[str] | None = None,
        sasl_mechanisms: tuple[str, ...] = MECHANISMS,
        acl: str | os.PathLike[str] | None = None,
        http: str | None = None,
        **store_options: Any,
    ):
        self.host, self.port = parse_listen(listen)
        # security: read (and refused when wrong) here, before a store is opened
        if tls_cert is None and (tls_key is not None or tls_ca is not None):
            raise InvalidConfigError("tls_key and tls_ca need tls_cert")
        if acl is not None and sasl_credentials is None:
            raise InvalidConfigError("an ACL file needs SASL (sasl_credentials): it names users")
        self.tls: ssl.SSLContext | None = (
            tls_context(os.fspath(tls_cert), _path(tls_key), _path(tls_ca))
            if tls_cert is not None
            else None
        )
        self.sasl = Sasl(sasl_credentials, sasl_mechanisms) if sasl_credentials else None
        self.authorizer = Authorizer.load(acl) if acl is not None else None
        if self.sasl is not None and self.tls is None and PLAIN in self.sasl.mechanisms:
            log.warning("SASL/PLAIN without TLS: passwords cross the network in clear text")
        self.advertised_host = advertised_host
        self.node_id = node_id
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self.max_connections = max_connections
        self.max_request_bytes = max_request_bytes
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.group_initial_rebalance_delay = group_initial_rebalance_delay
        self._store_arg = store
        self._store_options = store_options
        self.store: Store | None = None
        self.broker: Broker | None = None
        self._owns_store = False
        self._sock: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._stopping = threading.Event()
        # -- HTTP query API (server/http.py): "HOST:PORT" or None --
        if http is not None:
            http_host, _ = parse_listen(http)  # a bad address is refused here, as `listen` is
            if self.sasl is not None:  # Basic passwords: over TLS or on loopback only
                from mqcore.server.httpauth import check_transport

                check_transport(http_host, self.tls is not None)
        self._tls_cert = _path(tls_cert)
        self._tls_key = _path(tls_key)
        self.http = http
        self.http_server: HttpServer | None = None

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> Server:
        """Open the store (when given a path), bind, listen, and serve in background threads."""
        if self._sock is not None:
            return self
        if isinstance(self._store_arg, Store):
            self.store = self._store_arg
        else:
            import mqcore

            self.store = mqcore.open(os.fspath(self._store_arg), **self._store_options)
            self._owns_store = True
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(512)
        except OSError as e:
            if self._owns_store:
                self.store.close()
            raise OSError(e.errno, f"cannot listen on {self.host}:{self.port}: {e.strerror}") from e
        self._sock = sock
        self.port = sock.getsockname()[1]
        self.broker = Broker(
            self.store, self.advertised_host or self.host, self.port, node_id=self.node_id,
            cluster_id=cluster_id(self.store.path), auto_create_topics=self.auto_create_topics,
            default_partitions=self.default_partitions, authorizer=self.authorizer,
            group_initial_rebalance_delay=self.group_initial_rebalance_delay,
        )  # fmt: skip
        self._stopping.clear()
        self._accepter = threading.Thread(target=self._accept, name="mqcore-accept", daemon=True)
        self._accepter.start()
        log.info("serving %s on %s:%d", self.store.path, self.host, self.port)
        # -- HTTP query API: after the Kafka listener; a failure to bind stops that too --
        if self.http is not None:
            from mqcore.server.http import HttpServer, create_app  # starlette, uvicorn: only here
            from mqcore.server.httpauth import HttpAuth

            try:
                auth = None
                if self.sasl is not None:  # the same users (and ACLs) over HTTP Basic
                    auth = HttpAuth(self.sasl, self.authorizer)
                self.http_server = HttpServer(
                    create_app(self.store, auth=auth, group_members=self.broker.groups.member_list),
                    self.http, tls_cert=self._tls_cert,
                    tls_key=self._tls_key,
                ).start()  # fmt: skip
            except BaseException:
                self.stop()
                raise
        # -- end HTTP query API --
        return self

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) listened on (the port chosen when listen asked for port 0)."""
        return self.host, self.port

    @property
    def bootstrap(self) -> str:
        """HOST:PORT as clients' bootstrap.servers takes it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def stop(self) -> None:
        """Stop accepting, close every connection (requests in progress finish first, waiting
        fetches return at once), and close the store if the server opened it."""
        if self._sock is None:
            return
        # -- HTTP query API: stopped first, while the store is still open --
        if self.http_server is not None:
            self.http_server.stop()
            self.http_server = None
        # -- end HTTP query API --
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if self._accepter is not None:
            self._accepter.join()
        assert self.broker is not None and self.store is not None
        self.broker.close()
        with self._lock:
            connections = list(self._connections.items())
        for conn, _ in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join()
        self._sock = None
        if self._owns_store:
            self.store.close()
        log.info("stopped serving %s", self.store.path)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    # -- connections ----------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                continue  # e.g. EMFILE: the connection is refused by the kernel's backlog
            with self._lock:
                if len(self._connections) >= self.max_connections or self._stopping.is_set():
                    log.warning("refused %s: %d connections open", peer, len(self._connections))
                    conn.close()
                    continue
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                thread = threading.Thread(
                    target=self._serve, args=(conn, peer), name=f"mqcore-conn-{peer}", daemon=True
                )
                self._connections[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        session = Session(peer)
        sasl = SaslState()
        inbox = Inbox()
        try:
            if self.tls is not None:
                conn = self._tls_wrap(conn)
                if self._stopping.is_set():
                    return
                conn.settimeout(self.request_timeout)  # a stalled handshake ends the thread
                conn.do_handshake()
            while not self._stopping.is_set():
                frame = self._read_frame(conn, inbox)
                if frame is None:
                    return
                if sasl.raw_tokens and sasl.principal is None:  # after SaslHandshake v0
                    assert self.sasl is not None
                    reply = self.sasl.raw_token(bytes(frame), sasl)
                    session.principal = sasl.principal or session.principal
                    conn.sendall(frame_size(len(reply)) + reply)
                    continue
                response = self._answer(frame, session, sasl)
                if isinstance(response, FetchFrame):
                    try:
                        send_frame(conn, response)
                    finally:
                        response.close()
                elif response is not None:
                    conn.sendall(response)
                if sasl.failed:
                    log.info("closing %s: SASL authentication failed", peer)
                    return
                inbox.trim()
        except (OSError, ProtocolError, AuthenticationError, CloseConnection) as e:
            log.debug("closing %s: %s", peer, e)
        except Exception as e:  # a bug: this connection ends, the server serves the others
            log.error("closing %s after an unexpected %s: %s", peer, type(e).__name__, e)
            log.debug("the unexpected error's traceback", exc_info=True)
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def _tls_wrap(self, conn: socket.socket) -> ssl.SSLSocket:
        """`conn` as TLS, not yet shaken hands. The TLS socket takes the place of `conn` (now
        detached) among the connections stop() shuts down; stop() sets _stopping before it
        looks, so a caller that finds it unset after this returns is sure to be shut down by
        a stop() that comes later."""
        assert self.tls is not None
        tls = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        with self._lock:
            self._connections[tls] = self._connections.pop(conn)
        return tls

    def _read_frame(self, conn: socket.socket, inbox: Inbox) -> memoryview | None:
        """The next request's payload, in `inbox`; None when the client closed (or went idle
        too long)."""
        conn.settimeout(self.idle_timeout)
        try:
            head = _recv_exactly(conn, inbox.frame(4), allow_eof=True)
        except TimeoutError:
            return None
        if head is None:
            return None
        size = read_frame_size(head)
        if size < 0 or size > self.max_request_bytes:
            raise ProtocolError(
                f"a request of {size} bytes is over max_request_bytes={self.max_request_bytes}"
            )
        conn.settimeout(self.request_timeout)
        return _recv_exactly(conn, inbox.frame(size), allow_eof=False)

    def _answer(
        self, frame: memoryview, session: Session, sasl: SaslState
    ) -> bytes | FetchFrame | None:
        assert self.broker is not None
        try:
            request = parse_request(frame)
        except ProtocolError:
            key, _, correlation = peek_header(frame)
            if key == API_VERSIONS:  # KIP-511: answer in v0 with the versions served
                return unsupported_versions_response(correlation)
            raise
        session.client_id = request.client_id
        key = request.api.key
        if key in CONNECTION_APIS:
            if self.sasl is None:
                body = sasl_not_enabled(request.api)
            else:
                body = self.sasl.handle(request.api, request.body, sasl)
                if sasl.principal is not None:
                    session.principal = sasl.principal
            return encode_response(request.api, request.correlation_id, body)
        if self.sasl is not None and sasl.principal is None and key != API_VERSIONS:
            raise ProtocolError(f"{request.api.name} before SASL authentication", key)
        try:
            body = self.broker.handle(request.api, request.body, session)
        except CloseConnection:
            raise
        except MQCoreError as e:
            # a request-level failure the handler could not put in its response
            raise ProtocolError(f"{request.api.name} failed: {e}") from e
        if body is None:
            return None
        if isinstance(body, FetchAnswer):  # records sent from the files (server/fetchwire.py)
            return encode_fetch(request.api.version, request.correlation_id, body.topics)
        if isinstance(body, ProduceAnswer):  # written by hand (server/producewire.py)
            return encode_produce(request.api.version, request.correlation_id, body)
        return encode_response(request.api, request.correlation_id, body)


def _path(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)


class Inbox:
    """A connection's receive buffer, reused for each request (a fresh buffer per request
    costs its page faults, and a copy out of it another pass over the bytes). A request's
    bytes stay valid until its response is sent: the handlers run to the end before the next
    read and keep no view of them, so a produce's records are stamped and appended where
    they arrived (server/producewire.py)."""

    KEEP = 2 << 20  # kept between requests: a 1 MiB batch's request fits; larger ones are let go

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray(4096)

    def frame(self, size: int) -> memoryview:
        """`size` bytes of the buffer to receive into, grown (never resized in place: a view
        may still be out) to the next power of two when short."""
        if size > len(self.buf):
            self.buf = bytearray(1 << (size - 1).bit_length())
        return memoryview(self.buf)[:size]

    def trim(self) -> None:
        if len(self.buf) > self.KEEP:
            self.buf = bytearray(4096)


def _recv_exactly(conn: socket.socket, view: memoryview, allow_eof: bool) -> memoryview | None:
    """Fill `view` from `conn`; None on a clean close before the first byte."""
    size = len(view)
    got = 0
    while got < size:
        n = conn.recv_into(view[got:], size - got)
        if n == 0:
            if allow_eof and got == 0:
                return None
            raise ProtocolError(f"the connection closed {got} bytes into a {size}-byte read")
        got += n
    return view


def cluster_id(store_path: str) -> str:
    """The store's cluster ID (Kafka's 22-character base64 of a UUID), made once and kept in
    the store directory, so clients see the same cluster across restarts."""
    path = os.path.join(store_path, CLUSTER_FILE)
    try:
        with open(path) as f:
            found = f.read().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    with contextlib.suppress(OSError):  # a read-only store serves a fresh ID
        durable.write_atomic(path, (made + "\n").encode())
    return made
