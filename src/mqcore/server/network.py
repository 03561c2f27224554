"""The network side of `mqcore serve`: one thread and a selector for every connection, as
Kafka's SocketServer does, so an idle connection costs a socket and a small object, never a
thread (2,000 idle connections were 2,004 threads).

The network thread accepts (closing a connection past `max_connections` or
`max_connections_per_ip`), shakes TLS hands without blocking, reads each request's frame and
writes each response's bytes (file regions with sendfile() on plain sockets), and enforces
every deadline: the TLS handshake and each request's whole arrival (`request_timeout`, from
its first byte to its last, so one byte every few seconds does not hold a connection),
authentication (`request_timeout` after connecting, when SASL is on), and silence between
requests (`idle_timeout`).

A complete frame goes to a request thread (`dispatch`); the connection is then *muted*: it
is not read again until its response is written, so responses leave in request order. The
request thread answers and tries to write and read on at once (a client with requests in
flight is served without a round trip through this thread), and hands the connection back
with `resume()` when the socket would block. One side owns a connection at a time: this
thread while it is registered with the selector, a request thread in between.

Memory: a request's buffer grows as its bytes arrive (a 4-byte size announcing 100 MiB costs
nothing until the bytes come), within `MemoryPool`, the bound on what every connection's
partial and pending requests hold together (Kafka's queued.max.request.bytes); a connection
that needs more than is free waits, muted, until a request finishes. Before SASL
authentication a frame may announce at most `max_unauthenticated_request_bytes` (Kafka's
sasl.server.max.receive.size, 512 KiB); a larger one closes the connection from its size.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import select
import selectors
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqcore.errors import ProtocolError
from mqcore.log import FileRegion
from mqcore.server.auth import SaslState
from mqcore.server.backoff import peer_key
from mqcore.server.common import Session
from mqcore.server.ratelog import RateLimitedLog

log = logging.getLogger("mqcore.server")

_SIZE = struct.Struct(">i")
FIRST_CHUNK = 64 << 10  # a request buffer starts at most this big and doubles as bytes arrive
SEND_CHUNK = 256 << 10  # bytes of a file region read at once for a TLS socket
ACCEPT_BATCH = 64  # connections accepted per selector event
PAUSE_ON_EMFILE = 0.1  # seconds accept() rests when the process is out of descriptors

# what a connection is doing
HANDSHAKE, READING, BUSY, WRITING, MEMORY, CLOSED = range(6)
# try_read's answers besides a frame
WOULD_BLOCK, NEED_MEMORY = object(), object()


class PeerClosed(Exception):
    """The client closed its end (cleanly between requests, or midway: `midway`)."""

    def __init__(self, midway: str = ""):
        super().__init__(midway or "closed by the client")
        self.midway = midway


@dataclass(frozen=True, slots=True)
class Limits:
    """The network's bounds (docs/server.md "Limits and bad input")."""

    max_connections: int
    max_connections_per_ip: int
    max_request_bytes: int
    max_unauthenticated_request_bytes: int
    idle_timeout: float
    request_timeout: float
    sasl: bool  # SASL is on: a connection must authenticate, within request_timeout


class MemoryPool:
    """The bytes request buffers may hold in all. `take` is all or nothing; `give` returns
    bytes and calls `on_free` so that connections waiting for memory are tried again."""

    def __init__(self, capacity: int, on_free: Callable[[], None] = lambda: None):
        self.capacity = capacity
        self.used = 0
        self.on_free = on_free
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.capacity:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        if n:
            with self._lock:
                self.used -= n
            self.on_free()


class Connection:
    """One client connection: its socket, who it is, the request being read into a buffer
    that grows with it, and the response being written."""

    def __init__(self, sock: socket.socket, peer: Any, now: float):
        self.sock = sock
        self.peer = peer
        # the address as bounds and login backoffs count it (an IPv6 peer by its /64)
        self.ip = peer_key(peer[0] if isinstance(peer, tuple) else str(peer))
        self.session = Session(peer)
        self.sasl = SaslState(peer=self.ip)
        self.state = READING
        self.connected_at = self.last_active = now
        self.frame_since: float | None = None  # the current frame's first byte
        self._head = bytearray(4)
        self._head_got = 0
        self._size = -1  # the frame's size, once its 4 bytes are in
        self.buf: bytearray | None = None
        self._got = 0
        self.charged = 0  # bytes of the pool this connection's buffer holds
        self.out: collections.deque[Any] = collections.deque()  # bytes, memoryview, [region, pos]
        self.regions: list[FileRegion] = []  # closed once the response is out
        self.tls_wants_write = False  # an SSL read or handshake needs the socket writable
        self.tls_wants_read = False  # an SSL write needs it readable
        self.close_after = False  # close once the queued response is out (a refused login)

    @property
    def authenticated(self) -> bool:
        return self.sasl.principal is not None

    # -- reading ------------------------------------------------------------------------------

    @property
    def mid_frame(self) -> bool:
        """Some of a request is in (its buffer must be kept)."""
        return self._head_got > 0

    def try_read(self, limits: Limits, pool: MemoryPool, now: float) -> Any:
        """The next whole frame as a view of the buffer, WOULD_BLOCK, or NEED_MEMORY (the pool
        is short: try again when it frees). ProtocolError for a frame over its limit (from
        its 4-byte size, before anything is allocated), PeerClosed when the client closed."""
        while True:
            if self._size < 0:
                if not self._read_head(now):
                    return WOULD_BLOCK
                self._check_size(limits)
                continue
            if self._got == self._size:
                frame = memoryview(self.buf or b"")[: self._size]
                self._size, self._head_got, self.frame_since = -1, 0, None
                self.last_active = now
                return frame
            if self.buf is None or self._got == len(self.buf):
                if not self._grow(pool):
                    return NEED_MEMORY
            assert self.buf is not None  # _grow made it
            n = self._recv(memoryview(self.buf)[self._got : self._size])
            if n is None:
                return WOULD_BLOCK
            if n == 0:
                raise PeerClosed(f"{self._got} bytes into a {self._size}-byte request")
            self._got += n

    def _read_head(self, now: float) -> bool:
        """Read the 4-byte size; True once it is in (and within limits)."""
        n = self._recv(memoryview(self._head)[self._head_got :])
        if n is None:
            return False
        if n == 0:
            raise PeerClosed(f"{self._head_got} bytes into a size" if self._head_got else "")
        if self._head_got == 0:
            self.frame_since = now
        self._head_got += n
        if self._head_got < 4:
            return False
        self._size = _SIZE.unpack(self._head)[0]
        self._got = 0
        return True

    def _check_size(self, limits: Limits) -> None:
        """ProtocolError when the announced size is over what this connection may send."""
        size = self._size
        cap = limits.max_request_bytes
        what = "max_request_bytes"
        if limits.sasl and not self.authenticated:
            cap = limits.max_unauthenticated_request_bytes
            what = "max_unauthenticated_request_bytes"
        if size < 0 or size > cap:
            raise ProtocolError(f"a request of {size} bytes is over {what}={cap}")

    def _grow(self, pool: MemoryPool) -> bool:
        """A buffer for more of the frame: kept when it already holds the whole frame,
        else doubled (up to the frame's size), the growth taken from the pool."""
        have = len(self.buf) if self.buf is not None else 0
        if have >= self._size:
            return True
        want = min(self._size, max(FIRST_CHUNK if have == 0 else 2 * have, 4096))
        if not pool.take(want - have):
            return False
        grown = bytearray(want)
        if self.buf is not None and self._got:
            grown[: self._got] = self.buf[: self._got]
        self.buf = grown
        self.charged += want - have
        return True

    def release_buffer(self, pool: MemoryPool) -> None:
        """Give the request buffer back unless a request is partly in it: a connection
        between requests holds nothing (a busy one keeps it from request to request)."""
        if self.mid_frame and self.state != CLOSED:
            return
        self.buf = None
        charged, self.charged = self.charged, 0
        pool.give(charged)

    def _recv(self, view: memoryview) -> int | None:
        """recv_into(view): the count (0: closed), or None when it would block."""
        try:
            return self.sock.recv_into(view, len(view))
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            return None
        except ssl.SSLWantWriteError:
            self.tls_wants_write = True
            return None

    # -- writing ------------------------------------------------------------------------------

    def queue(self, response: bytes | Any) -> None:
        """Queue a response: bytes, or a FetchFrame's pieces (its file regions are closed once
        sent, or when the connection closes)."""
        pieces = getattr(response, "pieces", None)
        if pieces is None:
            self.out.append(response)
            return
        for piece in pieces:
            if isinstance(piece, FileRegion):
                self.out.append([piece, 0])
                self.regions.append(piece)
            else:
                self.out.append(piece)

    def try_send(self, now: float) -> bool:
        """Write what the socket takes now; True when everything queued is out."""
        tls = isinstance(self.sock, ssl.SSLSocket)
        while self.out:
            piece = self.out[0]
            if isinstance(piece, list):
                if tls:
                    self._read_chunk(piece)
                    continue
                if not self._sendfile(piece):
                    return False
                self.out.popleft()
                continue
            try:
                n = self.sock.send(piece)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                return False
            except ssl.SSLWantReadError:
                self.tls_wants_read = True
                return False
            self.last_active = now
            if n < len(piece):
                self.out[0] = memoryview(piece)[n:]
                return False
            self.out.popleft()
        self.tls_wants_read = False
        self.close_regions()
        return True

    def _read_chunk(self, piece: list[Any]) -> None:
        """Under TLS, the next chunk of a [region, sent] piece goes in front of it as bytes
        (an SSL socket cannot sendfile, and must be given the same bytes after a partial
        write); the piece leaves the queue once all of it is read."""
        region, sent = piece
        want = min(SEND_CHUNK, region.length - sent)
        chunk = os.pread(region.fd, want, region.position + sent)
        if len(chunk) < want:
            raise OSError(f"a record set ended {want - len(chunk)} bytes short")
        piece[1] = sent + want
        if piece[1] >= region.length:
            self.out.popleft()
        self.out.appendleft(chunk)

    def _sendfile(self, piece: list[Any]) -> bool:
        """Send a [region, sent] piece with sendfile(); True when all of it is out."""
        region, sent = piece
        while sent < region.length:
            try:
                n = os.sendfile(self.sock.fileno(), region.fd, region.position + sent,
                                region.length - sent)  # fmt: skip
            except (BlockingIOError, InterruptedError):
                return False
            if n == 0:
                raise OSError(f"a record set ended {region.length - sent} bytes short")
            sent += n
            piece[1] = sent
        return True

    def close_regions(self) -> None:
        for region in self.regions:
            region.close()
        self.regions.clear()

    def close(self, pool: MemoryPool) -> None:
        self.state = CLOSED
        self.out.clear()
        self.close_regions()
        self.release_buffer(pool)
        with contextlib.suppress(OSError):
            self.sock.close()


class Network:
    """The network thread over a listening socket (see the module docstring). `dispatch(conn,
    frame)` runs on the network thread with a muted connection and must hand it to a request
    thread; `tls` wraps every accepted connection."""

    def __init__(
        self,
        listener: socket.socket,
        limits: Limits,
        dispatch: Callable[[Connection, memoryview], None],
        *,
        tls: ssl.SSLContext | None = None,
        max_queued_request_bytes: int,
    ):
        self.limits = limits
        self.tls = tls
        self.pool = MemoryPool(max_queued_request_bytes, self._memory_freed)
        self._dispatch = dispatch
        self._listener = listener
        listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._lock = threading.Lock()
        self._conns: set[Connection] = set()  # every open connection, whoever owns it
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._handback: collections.deque[Connection] = collections.deque()
        self._memory_wait: collections.deque[Connection] = collections.deque()
        self._memory_pending = False
        self._accept_paused_until = 0.0
        self._stopping = threading.Event()
        self.refusals = RateLimitedLog(log)  # a flood of refusals logs a line a minute
        self._thread = threading.Thread(target=self._run, name="mqcore-network", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def connection_count(self) -> int:
        with self._lock:
            return len(self._conns)

    def stats(self) -> dict[str, int]:
        """What the connections cost now: how many (and how many may be, after the cut to the
        open-files limit), the request-buffer bytes they hold, how many wait for memory, and
        how many per address at most."""
        with self._lock:
            busiest = max(self._per_ip.values(), default=0)
            count = len(self._conns)
        return {
            "max_connections": self.limits.max_connections,
            "connections": count,
            "request_bytes": self.pool.used,
            "waiting_for_memory": len(self._memory_wait),
            "most_from_one_address": busiest,
        }

    # -- called from request threads ----------------------------------------------------------

    def resume(self, conn: Connection) -> None:
        """Take a connection back (its response out or partly out, or waiting for memory)."""
        self._handback.append(conn)
        self._poke()

    def wait_for_memory(self, conn: Connection) -> None:
        conn.state = MEMORY
        self.resume(conn)

    def close(self, conn: Connection) -> None:
        """Close a connection a request thread owns."""
        with self._lock:
            if conn not in self._conns:
                return
            self._conns.discard(conn)
            self._forget_ip(conn.ip)
        conn.close(self.pool)

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    def _memory_freed(self) -> None:
        if self._memory_wait:
            self._memory_pending = True
            self._poke()

    # -- stopping -----------------------------------------------------------------------------

    def stop(self, flush_timeout: float = 2.0) -> None:
        """Stop accepting and reading; write out the responses queued (for up to
        `flush_timeout`), then close every connection."""
        self._stopping.set()
        self._poke()
        self._thread.join()
        deadline = time.monotonic() + flush_timeout
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
            self._per_ip.clear()
        for conn in conns:
            if conn.out and conn.state != CLOSED:
                _flush_blocking(conn, deadline)
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close(self.pool)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        sweep_every = max(0.01, min(0.25, self.limits.idle_timeout / 4,
                                    self.limits.request_timeout / 4))  # fmt: skip
        next_sweep = time.monotonic() + sweep_every
        while not self._stopping.is_set():
            timeout = max(0.0, next_sweep - time.monotonic())
            for key, mask in self._sel.select(timeout):
                try:
                    self._on_event(key.data, mask)
                except Exception as e:  # a bug: that connection ends, the others go on
                    self._unexpected(key.data, e)
            self._take_handbacks()
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + sweep_every
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(self._listener)

    def _on_event(self, data: Any, mask: int) -> None:
        if data == "accept":
            self._accept()
        elif data == "wake":
            with contextlib.suppress(BlockingIOError, OSError):
                while self._wake_r.recv(4096):
                    pass
        else:
            self._on_ready(data, mask)

    def _unexpected(self, conn: Any, e: Exception) -> None:
        log.error("closing %s after an unexpected %s: %s", getattr(conn, "peer", conn),
                  type(e).__name__, e)  # fmt: skip
        log.debug("the unexpected error's traceback", exc_info=True)
        if isinstance(conn, Connection):
            self._drop(conn)

    def _accept(self) -> None:
        now = time.monotonic()
        if now < self._accept_paused_until:
            return
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("accept failed (%s): pausing new connections for %.1f s",
                                e.strerror, PAUSE_ON_EMFILE)  # fmt: skip
                    self._accept_paused_until = now + PAUSE_ON_EMFILE
                    self._sel.modify(self._listener, selectors.EVENT_READ, "paused")
                return
            self._admit(sock, peer, now)

    def _admit(self, sock: socket.socket, peer: Any, now: float) -> None:
        ip = peer_key(peer[0] if isinstance(peer, tuple) else str(peer))
        with self._lock:
            refusal = None
            if len(self._conns) >= self.limits.max_connections:
                refusal = f"{len(self._conns)} connections open (max_connections)"
            elif self._per_ip[ip] >= self.limits.max_connections_per_ip:
                refusal = f"{self._per_ip[ip]} connections from {ip} (max_connections_per_ip)"
            if refusal is None:
                self._per_ip[ip] += 1
        if refusal is not None:
            self.refusals.warning((ip, "refused"), "refused %s: %s", peer, refusal)
            sock.close()
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ssl.SSLError) as e:
            log.debug("closing %s: %s", peer, e)
            sock.close()
            with self._lock:
                self._forget_ip(ip)
            return
        conn = Connection(sock, peer, now)
        conn.state = HANDSHAKE if self.tls is not None else READING
        conn.frame_since = now if self.tls is not None else None  # the handshake's deadline
        with self._lock:
            self._conns.add(conn)
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _forget_ip(self, ip: str) -> None:
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]

    def _on_ready(self, conn: Connection, mask: int) -> None:
        try:
            if conn.state == HANDSHAKE:
                self._handshake(conn)
            elif conn.state == WRITING:
                if not conn.try_send(time.monotonic()):
                    self._interest(conn)
                elif conn.close_after:
                    self._drop(conn)
                else:
                    conn.state = READING
                    conn.release_buffer(self.pool)
                    self._read(conn)
            elif conn.state == READING:
                self._read(conn)
        except (OSError, ProtocolError, PeerClosed, ssl.SSLError) as e:
            log.debug("closing %s: %s", conn.peer, e)
            self._drop(conn)

    def _handshake(self, conn: Connection) -> None:
        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            conn.tls_wants_write = False
            self._interest(conn)
            return
        except ssl.SSLWantWriteError:
            conn.tls_wants_write = True
            self._interest(conn)
            return
        conn.tls_wants_write = False
        conn.state, conn.frame_since = READING, None
        self._read(conn)  # the client's first request may be in already

    def _read(self, conn: Connection) -> None:
        """Read on; dispatch a whole frame (the connection is muted until handed back)."""
        conn.tls_wants_write = False
        got = conn.try_read(self.limits, self.pool, time.monotonic())
        if got is WOULD_BLOCK:
            self._interest(conn)
        elif got is NEED_MEMORY:
            conn.state = MEMORY
            self._memory_wait.append(conn)
            self._interest(conn)
        else:
            conn.state = BUSY
            self._interest(conn)
            self._dispatch(conn, got)

    def _interest(self, conn: Connection) -> None:
        """Register what the connection waits for now (nothing while muted)."""
        events = 0
        if conn.state in (READING, HANDSHAKE):
            events = selectors.EVENT_READ
            if conn.tls_wants_write:
                events |= selectors.EVENT_WRITE
        elif conn.state == WRITING:
            events = selectors.EVENT_WRITE
            if conn.tls_wants_read:
                events |= selectors.EVENT_READ
        try:
            key = self._sel.get_key(conn.sock)
        except (KeyError, ValueError):
            key = None
        if events == 0:
            if key is not None:
                self._sel.unregister(conn.sock)
        elif key is None:
            self._sel.register(conn.sock, events, conn)
        elif key.events != events:
            self._sel.modify(conn.sock, events, conn)

    def _take_handbacks(self) -> None:
        if self._memory_pending:
            self._memory_pending = False
            waiting = list(self._memory_wait)
            self._memory_wait.clear()
            for conn in waiting:
                if conn.state == MEMORY:
                    conn.state = READING
                    self._on_ready(conn, selectors.EVENT_READ)
        while self._handback:
            conn = self._handback.popleft()
            if conn.state == CLOSED:
                continue
            if self._stopping.is_set():
                continue
            if conn.state == MEMORY:
                self._memory_wait.append(conn)
                self._interest(conn)
                continue
            conn.state = WRITING if conn.out else READING
            self._on_ready(conn, 0)

    def _sweep(self, now: float) -> None:
        """Close connections past a deadline; accept again after a pause for descriptors."""
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            with contextlib.suppress(KeyError, ValueError):
                self._sel.modify(self._listener, selectors.EVENT_READ, "accept")
        with self._lock:
            conns = list(self._conns)
        lim = self.limits
        for conn in conns:
            why = None
            if conn.state in (BUSY, CLOSED):
                continue
            if conn.frame_since is not None and now - conn.frame_since > lim.request_timeout:
                why = f"a request (or the TLS handshake) took over {lim.request_timeout} s"
            elif (
                lim.sasl
                and not conn.authenticated
                and (now - conn.connected_at > lim.request_timeout)
            ):
                why = f"not authenticated within {lim.request_timeout} s"
            elif conn.state == READING and now - conn.last_active > lim.idle_timeout:
                why = f"idle for {lim.idle_timeout} s"
            elif conn.state == WRITING and now - conn.last_active > lim.request_timeout:
                why = f"read none of its response for {lim.request_timeout} s"
            if why is not None:
                log.debug("closing %s: %s", conn.peer, why)
                self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        """Close a connection this thread owns."""
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(ValueError):
            self._memory_wait.remove(conn)
        with self._lock:
            if conn in self._conns:
                self._conns.discard(conn)
                self._forget_ip(conn.ip)
        conn.close(self.pool)


def _flush_blocking(conn: Connection, deadline: float) -> None:
    """Write a stopping server's last response, waiting up to the deadline."""
    with contextlib.suppress(OSError, ssl.SSLError, ValueError):
        while conn.out and time.monotonic() < deadline:
            if conn.try_send(time.monotonic()):
                return
            select.select([], [conn.sock], [], max(0.0, deadline - time.monotonic()))
