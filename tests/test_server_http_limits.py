"""What one client can hold of the HTTP listener (the JSON API and the console) at most
(docs/server.md "HTTP query API", "Limits"; issue 31): connections in all and from one
address, time to send a request, time connected without one, time not reading its response.
Each test is a hostile client over real sockets against a real HttpServer or Server(http=),
beside a normal client that must still be answered; the server's own count of connections
(HttpServer.stats()) says what it holds. Waits are bounded conditions, never sleeps."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import child_env, run_cli
from kafkaclients import closed_by_peer

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
from mqcore.errors import InvalidConfigError  # noqa: E402
from mqcore.server import Server  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402

WAIT = 30.0  # the longest any condition may take on a loaded machine before the test fails


def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until `condition()` holds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def connect(address: tuple[str, int], source: str | None = None) -> socket.socket:
    """A TCP connection to the server, from the loopback address `source` if given."""
    return socket.create_connection(
        address, timeout=WAIT, source_address=(source, 0) if source else None
    )


def get(sock: socket.socket, path: str = "/v1/topics") -> tuple[int, bytes]:
    """One GET on a kept-alive connection: (status, body)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        assert chunk, f"closed before answering: {head!r}"
        head += chunk
    head, _, body = head.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    size = int(fields["content-length"])
    while len(body) < size:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of a response"
        body += chunk
    return int(lines[0].split()[1]), body


def refused(sock: socket.socket) -> bool:
    """Whether the server closes the connection without a byte of an answer (within WAIT),
    though a request was sent on it."""
    sock.settimeout(WAIT)
    try:
        sock.sendall(b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return sock.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def answered(server: HttpServer, source: str | None = None) -> bool:
    """A normal client's request on a fresh connection gets its 200."""
    with connect(server.address, source) as sock:
        return get(sock)[0] == 200


@pytest.fixture
def app(store: mqcore.Store) -> object:
    store.create_topic("orders")
    return create_app(store)


@pytest.fixture
def serve(app: object) -> Iterator[Callable[..., HttpServer]]:
    """Start HttpServers over the app with the limits given; each is stopped at the end."""
    started: list[HttpServer] = []

    def start(**limits: float) -> HttpServer:
        server = HttpServer(app, **limits).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def test_connections_from_one_address_are_bounded(store: mqcore.Store) -> None:
    """Server(http=, http_max_connections_per_ip=3): a fourth connection from 127.0.0.1 is
    closed at accept without an answer (the old server kept 1,500 and more); one from
    another address gets in; a place comes free when one of the three closes."""
    with Server(
        store, "127.0.0.1:0", http="127.0.0.1:0", http_max_connections_per_ip=3,
        http_idle_timeout=WAIT,
    ) as server:  # fmt: skip
        http = server.http_server
        assert http is not None
        held = [connect(http.address) for _ in range(3)]
        for sock in held:
            assert get(sock)[0] == 200  # each kept alive
        with connect(http.address) as extra:
            assert refused(extra)
        assert http.stats()["refused"] >= 1
        assert http.stats()["most_from_one_address"] == 3
        assert answered(http, source="127.0.0.2")
        held.pop().close()
        until(lambda: http.stats()["connections"] == 2, "a place to come free")
        with connect(http.address) as again:
            assert get(again)[0] == 200
        for sock in held:
            sock.close()


def test_connections_in_all_are_bounded(serve: Callable[..., HttpServer]) -> None:
    """max_connections=4 over several addresses: a fifth connection is closed at accept,
    whatever its address; one comes in once a place is free."""
    server = serve(max_connections=4, idle_timeout=WAIT)
    held = [connect(server.address, f"127.0.0.{i}") for i in range(1, 5)]
    for sock in held:
        assert get(sock)[0] == 200
    with connect(server.address, "127.0.0.9") as extra:
        assert refused(extra)
    held.pop().close()
    until(lambda: server.stats()["connections"] == 3, "a place to come free")
    assert answered(server, source="127.0.0.9")
    for sock in held:
        sock.close()


def test_with_tls_a_connection_holds_its_place_from_accept(app: object, tmp_path: Path) -> None:
    """Over HTTPS, connections are counted at accept, before their TLS handshake: two that
    never start one hold the two places of their address, and a real client from it is
    closed at accept; it gets in once one of the two has gone."""
    import ssl

    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    server = HttpServer(app, tls_cert=str(tmp_path / "s.pem"), max_connections_per_ip=2)
    with server:
        stalled = [connect(server.address) for _ in range(2)]
        until(lambda: server.stats()["connections"] == 2, "both to be accepted")
        with connect(server.address) as raw, pytest.raises((ssl.SSLError, OSError)):
            client_tls.wrap_socket(raw, server_hostname="127.0.0.1")
        assert server.stats()["refused"] == 1
        stalled.pop().close()
        until(lambda: server.stats()["connections"] == 1, "a place to come free")
        with client_tls.wrap_socket(connect(server.address), server_hostname="127.0.0.1") as tls:
            assert get(tls)[0] == 200
        stalled[0].close()


def trickle(sock: socket.socket, first: bytes, then: bytes) -> bool:
    """Send `first`, then one byte of `then` every 0.1 s (repeated) until the server closes the
    connection; False if it is still open after WAIT."""
    sock.sendall(first)
    sock.settimeout(0.1)
    deadline = time.monotonic() + WAIT
    i = 0
    while time.monotonic() < deadline:
        try:
            sock.sendall(then[i % len(then) : i % len(then) + 1])
            i += 1
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


@pytest.mark.parametrize(
    ("first", "then"),
    [
        pytest.param(b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b"a", id="headers"),
        pytest.param(
            b"POST /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n",
            b"a",
            id="body",
        ),
    ],
)
def test_a_request_trickling_in_is_dropped_after_request_timeout(
    serve: Callable[..., HttpServer], first: bytes, then: bytes
) -> None:
    """One byte every 0.1 s, in the headers or in a body the app answered 405 without reading,
    held the old server's connection forever (every byte put its keep-alive timer off); now the
    whole request must arrive within request_timeout of its first byte. A normal client is
    answered meanwhile."""
    server = serve(request_timeout=1.0)
    with connect(server.address) as sock:
        sock.sendall(first)
        assert answered(server)
        assert trickle(sock, b"", then), "still open after a byte every 0.1 s for 30 s"
    until(lambda: server.stats()["connections"] == 0, "the connection to be forgotten")
    assert answered(server)


def test_a_connection_that_sends_nothing_is_closed_after_idle_timeout(
    serve: Callable[..., HttpServer],
) -> None:
    """uvicorn's keep-alive timer starts after a first response: a connection that never sent
    a byte was held forever. Now idle_timeout counts from the connection's start as well as
    between requests."""
    server = serve(idle_timeout=0.5)
    with connect(server.address) as silent:
        assert closed_by_peer(silent)
    with connect(server.address) as kept:
        assert get(kept)[0] == 200
        assert closed_by_peer(kept)
    until(lambda: server.stats()["connections"] == 0, "both connections to be forgotten")


def test_a_response_its_client_does_not_read_is_dropped(
    store: mqcore.Store, serve: Callable[..., HttpServer]
) -> None:
    """A client that asks for a large response and reads none of it: uvicorn's keep-alive
    close waits for the unsent bytes forever (the connection and the response stayed held).
    Now a response the client takes nothing of for request_timeout drops the connection."""
    value = b"v" * 2000
    for _ in range(3):
        store.append_batch("orders", [value] * 1000)  # ~6 MiB of JSON in one response
    server = serve(request_timeout=1.0, idle_timeout=1.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT)
    try:
        sock.connect(server.address)
        path = "/v1/topics/orders/partitions/0/messages?limit=3000"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")  # then nothing more is read
        until(lambda: server.stats()["connections"] == 0, "the unread response to be dropped")
        assert answered(server)
    finally:
        sock.close()


def test_headers_are_bounded(serve: Callable[..., HttpServer]) -> None:
    """Headers over 16 KiB (h11's bound on an incomplete event) are answered 400 and the
    connection closed, as they were before; 15 KiB of headers are served."""
    server = serve()
    with connect(server.address) as sock:
        sock.sendall(b"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (17 << 10))
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
        assert closed_by_peer(sock)
    with connect(server.address) as sock:
        big = "a" * (15 << 10)
        sock.sendall(f"GET /v1/topics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {big}\r\n\r\n".encode())
        head = sock.recv(100)
        assert head.startswith(b"HTTP/1.1 200"), head


def test_many_idle_connections_and_a_normal_request(serve: Callable[..., HttpServer]) -> None:
    """500 idle connections from one address with the defaults: 256 are held (the per-address
    bound), the rest closed at accept, and a client from another address is answered."""
    server = serve(idle_timeout=WAIT)
    idle = []
    try:
        for _ in range(500):
            idle.append(connect(server.address))
        until(lambda: server.stats()["connections"] == 256, "256 connections held")
        until(lambda: server.stats()["refused"] == 500 - 256, "the rest refused")
        assert answered(server, source="127.0.0.2")
    finally:
        for sock in idle:
            sock.close()
    until(lambda: server.stats()["connections"] == 0, "every place given back")


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("max_connections", 0),
        ("max_connections_per_ip", -1),
        ("max_connections", 2.5),
        ("request_timeout", 0),
        ("idle_timeout", -1.0),
        ("idle_timeout", float("nan")),
    ],
)
def test_bad_limits_are_refused_naming_the_keyword(app: object, keyword: str, value: float) -> None:
    with pytest.raises(InvalidConfigError, match=keyword):
        HttpServer(app, **{keyword: value})  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match=f"http_{keyword}"):
        # refused at construction: the store's path is never opened
        Server("/nonexistent/never-opened", http="127.0.0.1:0", **{f"http_{keyword}": value})


OUT_OF_DESCRIPTORS = """
import os, resource, sys
import mqcore
from mqcore.server.http import HttpServer, create_app
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
store = mqcore.open(sys.argv[1])
store.create_topic("orders")
server = HttpServer(create_app(store)).start()
print(server.port, flush=True)
hog = []
try:
    while True:
        hog.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print("out of descriptors", flush=True)
sys.stdin.readline()
for fd in hog:
    os.close(fd)
print(server.stats()["refused"], flush=True)
sys.stdin.readline()
server.stop()
store.close()
"""


def test_out_of_descriptors_connections_are_closed_not_retried_in_a_loop(tmp_path: Path) -> None:
    """A server process with no descriptor left: asyncio's accept loop, told EMFILE, retried
    every waiting connection over and over (CPython gh-151615: 23,000 retries, each logged,
    and 2 s of CPU in 3 s) while the clients waited unanswered. Now each waiting connection is
    accepted with a spare descriptor and closed at once; once descriptors are free again, a
    client is answered."""
    child = subprocess.Popen(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, str(tmp_path / "store")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(),
    )  # fmt: skip
    try:
        assert child.stdin is not None and child.stdout is not None
        address = ("127.0.0.1", int(child.stdout.readline()))
        assert child.stdout.readline() == "out of descriptors\n"
        for _ in range(5):
            with connect(address) as sock:
                assert refused(sock)
        child.stdin.write("\n")
        child.stdin.flush()
        assert int(child.stdout.readline()) >= 5
        with connect(address) as sock:
            assert get(sock)[0] == 200
        child.stdin.write("\n")
        child.stdin.flush()
        _, err = child.communicate(timeout=WAIT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert "out of system resource" not in err, err


def test_connections_are_cut_to_what_the_open_files_limit_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 1,024 descriptors (the usual soft limit of a desktop shell, where `mqcore console`
    runs) the store keeps half and 256 more: the listeners share 256, a quarter of it for
    mqcore serve's HTTP listener, all of it for the console's (server/bounds.py)."""
    import resource

    from mqcore.server import bounds
    from mqcore.server.httplimits import HttpLimits

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    assert bounds.connection_room() == 256
    assert bounds.split_room(512, 1024, 4096) == (64, 192)
    assert bounds.split_room(512, None, 4096) == (0, 256)
    assert bounds.split_room(100, 50, 60) == (50, 60)  # room enough: nothing cut
    assert bounds.within(1024, bounds.connection_room(), "HTTP max_connections") == 256
    assert bounds.within(1024, 3, "x") == bounds.MIN_CONNECTIONS
    assert HttpLimits().max_connections == 1024


def test_the_json_api_still_answers_under_the_limits(serve: Callable[..., HttpServer]) -> None:
    """A kept-alive client's requests are answered on one connection for longer than
    request_timeout: the deadline is each request's, not the connection's."""
    server = serve(request_timeout=1.0, idle_timeout=WAIT)
    with connect(server.address) as sock:
        for _ in range(5):
            time.sleep(0.3)  # the client's pause between requests: 1.5 s in all
            status, body = get(sock)
            assert status == 200
            assert [t["topic"] for t in json.loads(body)["topics"]] == ["orders"]


def test_mqcore_console_takes_the_limits_as_flags(tmp_path: Path) -> None:
    """`mqcore console --max-connections-per-ip 1`: a second connection from the address is
    closed at accept. A limit that cannot work is one line naming it, before the store is
    opened."""
    path = str(tmp_path / "s")
    with mqcore.open(path) as s:
        s.create_topic("orders")
    status, out, err = run_cli("console", path, "--http", "127.0.0.1:0", "--idle-timeout", "0")
    assert status == 1 and out == ""
    assert err.startswith("mqcore: error: idle_timeout=0.0") and len(err.splitlines()) == 1
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "console", path, "--http", "127.0.0.1:0",
         "--max-connections-per-ip", "1", "--request-timeout", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/ui/", line)
        assert m, line
        address = ("127.0.0.1", int(m[1]))
        with connect(address) as first:
            assert get(first)[0] == 200
            with connect(address) as second:
                assert refused(second)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err


def post_head(sock: socket.socket, path: str, length: int | None) -> None:
    """A POST's request line and headers; the body is the caller's to send."""
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"{size}\r\n\r\n".encode())  # fmt: skip


def status_of_answer(sock: socket.socket) -> int:
    """The status of the response that comes (the request may not have been sent whole)."""
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(65536)
        assert chunk, f"closed before answering: {head!r}"
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_a_body_over_its_cap_is_refused_before_it_is_read(
    store: mqcore.Store, serve: Callable[..., HttpServer]
) -> None:
    """A 300 MiB acknowledgement body (declared, or chunked without a length): answered 400
    after its first kilobyte, not read whole into memory first (the server's peak went from
    63 to 665 MiB for one such POST), and the share member is never even looked up."""
    server = serve()
    url = "/v1/share-groups/g/members/m/acknowledge"
    with connect(server.address) as sock:
        post_head(sock, url, 300 << 20)
        sock.sendall(b"[" * 1024)
        assert status_of_answer(sock) == 400
    with connect(server.address) as sock:
        post_head(sock, url, None)
        chunk = b"x" * (1 << 20)
        status = None
        sock.settimeout(WAIT)
        for _ in range(300):  # 1 MiB chunks: refused past the 8 MiB cap, long before 300
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
        status = status_of_answer(sock)
        assert status == 400
    assert server.app.state.bodies.used == 0


def test_bodies_being_read_share_one_bound(store: mqcore.Store) -> None:
    """With max_body_bytes 1 MiB, a client holding 800 KB of an unfinished body leaves no room
    for another's 500 KB: that one is answered 503 with Retry-After; once the first is done,
    the second goes through (to the member check: 404 for a member that does not exist)."""
    url = "/v1/share-groups/g/members/m/acknowledge"
    body = b'{"acknowledgements": []}'.ljust(500_000)
    with HttpServer(create_app(store, max_body_bytes=1 << 20)) as server:
        bodies = server.app.state.bodies
        holder = connect(server.address)
        try:
            post_head(holder, url, 900_000)
            holder.sendall(b" " * 800_000)
            until(lambda: bodies.used >= 800_000, "the first body's bytes")
            with connect(server.address) as other:
                post_head(other, url, len(body))
                other.sendall(body)
                assert status_of_answer(other) == 503
            holder.sendall(b" " * 100_000)
            assert status_of_answer(holder) == 400  # 900 KB of spaces: not JSON
        finally:
            holder.close()
        until(lambda: bodies.used == 0, "the bytes given back")
        with connect(server.address) as other:
            post_head(other, url, len(body))
            other.sendall(body)
            assert status_of_answer(other) == 404
