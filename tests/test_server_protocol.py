"""`mqcore serve` at the frame level, over raw sockets: ApiVersions (and its answer to a version
it does not serve), and the bad input a listener meets: unknown APIs, garbage, a 2 GiB frame, a
client that stalls midway, idle and surplus connections. Each is answered or disconnected, and
the server goes on serving the others."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from typing import Any

import pytest
from kafkaclients import closed_by_peer, recv_exactly

import mqcore

server_mod = pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
Server = server_mod.Server
from mqcore.server.protocol import APIS  # noqa: E402

WAIT = 20.0  # seconds a test waits for something that should happen at once


def connect(srv: Any) -> socket.socket:
    sock = socket.create_connection(srv.address, timeout=WAIT)
    return sock


def request(sock: socket.socket, payload: bytes) -> bytes:
    """Send one frame, return the response frame's payload."""
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def api_versions_v0(correlation: int, version: int = 0) -> bytes:
    """ApiVersions request, header v1 (client_id "t"), empty v0 body (or any version's header)."""
    return struct.pack(">hhih", 18, version, correlation, 1) + b"t"


def parse_api_versions_v0(payload: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    """(correlation_id, error_code, {api_key: (min, max)}) of an ApiVersions v0 response."""
    correlation, error, count = struct.unpack_from(">ihi", payload)
    apis = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", payload, 10 + 6 * i)
        apis[key] = (lo, hi)
    assert len(payload) == 10 + 6 * count
    return correlation, error, apis


def still_serves(srv: Any) -> None:
    with connect(srv) as sock:
        correlation, error, apis = parse_api_versions_v0(request(sock, api_versions_v0(99)))
    assert (correlation, error) == (99, 0) and 0 in apis


def test_api_versions_lists_what_is_served(kafka_server: Any) -> None:
    with connect(kafka_server) as sock:
        correlation, error, apis = parse_api_versions_v0(request(sock, api_versions_v0(7)))
    assert correlation == 7 and error == 0
    assert apis == {key: (lo, hi) for key, (_, lo, hi) in APIS.items()}


def test_api_versions_v3_flexible_request_gets_a_header_v0_response(kafka_server: Any) -> None:
    # header v2: client_id stays a plain string, then an empty tagged-field section; the body
    # is compact: client_software_name, client_software_version (length + 1), tags
    body = b"\x05mqct" + b"\x021" + b"\x00"
    payload = struct.pack(">hhih", 18, 3, 42, 1) + b"t" + b"\x00" + body
    with connect(kafka_server) as sock:
        resp = request(sock, payload)
    # response header v0 (no tagged fields): correlation id, then error_code int16
    correlation, error = struct.unpack_from(">ih", resp)
    assert (correlation, error) == (42, 0)
    # compact array of APIs: length + 1 as a uvarint (small enough for one byte)
    assert resp[6] == len(APIS) + 1


def test_an_unserved_api_versions_version_answers_v0_with_the_list(kafka_server: Any) -> None:
    with connect(kafka_server) as sock:
        correlation, error, apis = parse_api_versions_v0(request(sock, api_versions_v0(5, 99)))
        assert (correlation, error) == (5, 35)  # UNSUPPORTED_VERSION
        assert apis[18] == (APIS[18][1], APIS[18][2])
        # the connection stays open: the client retries with a version it now knows
        correlation, error, _ = parse_api_versions_v0(request(sock, api_versions_v0(6)))
        assert (correlation, error) == (6, 0)


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">hhih", 999, 0, 1, -1),  # an API that does not exist
        struct.pack(">hhih", 0, 99, 1, -1),  # Produce at a version not served
        struct.pack(">hhih", 3, 9, 1, -1) + b"\xff" * 3,  # Metadata whose body is garbage
        b"\x00\x03",  # shorter than a header
        # Metadata v9 claiming 2**31 - 1 topics, v12 (compact) claiming 2**35: kio's reader
        # sized its array from the count and aborted the process (found by the fuzzer)
        struct.pack(">hhih", 3, 9, 1, -1) + struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 40,
        struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + b"\xff\xff\xff\xff\x7f" + b"\x00" * 40,
    ],
    ids=[
        "unknown-api",
        "unknown-version",
        "garbage-body",
        "short",
        "huge-count",
        "huge-compact-count",
    ],
)
def test_a_bad_request_closes_only_its_connection(kafka_server: Any, payload: bytes) -> None:
    with connect(kafka_server) as bystander, connect(kafka_server) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert closed_by_peer(sock)
        correlation, error, _ = parse_api_versions_v0(request(bystander, api_versions_v0(3)))
        assert (correlation, error) == (3, 0)
    still_serves(kafka_server)


def test_a_2_gib_frame_is_refused_from_its_size(kafka_server: Any) -> None:
    """The size alone closes the connection: the server never waits for (or allocates) the
    2 GiB it announces."""
    with connect(kafka_server) as sock:
        sock.sendall(struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 16)
        assert closed_by_peer(sock)
    with connect(kafka_server) as sock:
        sock.sendall(struct.pack(">i", -5))
        assert closed_by_peer(sock)
    still_serves(kafka_server)


def test_random_bytes_never_stop_the_server(kafka_server: Any) -> None:
    import random

    rng = random.Random(11)
    for _ in range(30):
        junk = rng.randbytes(rng.randrange(1, 300))
        with connect(kafka_server) as sock:
            sock.sendall(junk)
            # then EOF: a short frame must be given up (a refused size closed it already)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            assert closed_by_peer(sock)
    still_serves(kafka_server)


def limited(store: mqcore.Store, **limits: Any) -> Any:
    return Server(store, listen="127.0.0.1:0", **limits)


# 2 s: a test thread stalled by a loaded machine between connect() and its first request must
# not be taken for an idle client (0.3 s was close); the waits for the close allow 20 s
CUT_OFF = 2.0


def test_a_client_that_stalls_midframe_is_dropped(store: mqcore.Store) -> None:
    with limited(store, request_timeout=CUT_OFF) as srv, connect(srv) as sock:
        sock.sendall(struct.pack(">i", 100) + b"\x00" * 10)  # 10 of 100 bytes, then nothing
        assert closed_by_peer(sock)
        still_serves(srv)


def test_an_idle_connection_is_closed(store: mqcore.Store) -> None:
    with limited(store, idle_timeout=CUT_OFF) as srv, connect(srv) as sock:
        correlation, error, _ = parse_api_versions_v0(request(sock, api_versions_v0(1)))
        assert error == 0
        assert closed_by_peer(sock)  # nothing sent after the first answer


def test_connections_past_the_limit_are_refused(store: mqcore.Store) -> None:
    with limited(store, max_connections=3) as srv:
        held = [connect(srv) for _ in range(3)]
        for sock in held:  # each answered: the three are in and served
            assert parse_api_versions_v0(request(sock, api_versions_v0(1)))[1] == 0
        extra = connect(srv)
        assert closed_by_peer(extra)
        extra.close()
        held.pop().close()
        deadline = time.monotonic() + WAIT
        while srv.connection_count() > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        still_serves(srv)  # a place came free
        for sock in held:
            sock.close()


def test_listens_on_loopback_unless_told(store: mqcore.Store) -> None:
    assert server_mod.parse_listen(":0") == ("127.0.0.1", 0)
    with Server(store, listen=":0") as srv:
        assert srv.address[0] == "127.0.0.1"
    import inspect

    default = inspect.signature(Server).parameters["listen"].default
    assert default.startswith("127.0.0.1:")


def test_bad_listen_addresses_are_refused(store: mqcore.Store) -> None:
    for text in ("localhost", "127.0.0.1:99999", "127.0.0.1:x", ""):
        with pytest.raises(mqcore.errors.InvalidConfigError, match="HOST:PORT"):
            Server(store, listen=text)


def test_stop_closes_connections_and_leaves_a_given_store_open(store: mqcore.Store) -> None:
    srv = Server(store, listen="127.0.0.1:0").start()
    sock = connect(srv)
    assert parse_api_versions_v0(request(sock, api_versions_v0(1)))[1] == 0
    srv.stop()
    assert closed_by_peer(sock)
    sock.close()
    with pytest.raises(OSError):
        socket.create_connection(srv.address, timeout=2).close()
    store.create_topic("t")  # the caller's store stays open, the caller's
    store.append("t", b"still open")


def test_a_server_opened_on_a_path_closes_its_store(tmp_path: Any) -> None:
    path = str(tmp_path / "s")
    with Server(path, listen="127.0.0.1:0") as srv:
        assert srv.store is not None
        cluster = srv.broker.cluster_id
    with mqcore.open(path) as s:  # the writer lock is free again
        s.create_topic("t")
    with Server(path, listen="127.0.0.1:0") as srv:
        assert srv.broker.cluster_id == cluster  # the same cluster across restarts


def test_a_handler_bug_closes_only_its_connection(kafka_server: Any) -> None:
    """A handler that raises what no request should (a bug) ends that connection with one
    logged line; the server goes on serving."""

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    kafka_server.broker.handlers[3] = broken  # Metadata
    with connect(kafka_server) as sock:
        payload = struct.pack(">hhih", 3, 1, 9, -1) + struct.pack(">i", -1)  # all topics
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert closed_by_peer(sock)
    still_serves(kafka_server)
