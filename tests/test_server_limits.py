"""What one client can cost `mqcore serve` at most (docs/server.md "Limits and bad input"):
memory for requests it announces but does not send, threads for idle connections and for
requests that wait, connections from one address, time to send a request or to authenticate.
Each test is a hostile client over real sockets beside a normal client that must still be
answered, and reads the server's own accounting (Server.network_stats())."""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafkaclients import KioWire, closed_by_peer, recv_exactly

import mqcore

server_mod = pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kio.schema.errors import ErrorCode  # noqa: E402

from mqcore.errors import InvalidConfigError  # noqa: E402
from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402

WAIT = 30.0
MiB = 1 << 20


def until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait (bounded) until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def connect(srv: Server) -> socket.socket:
    return socket.create_connection(srv.address, timeout=WAIT)


def api_versions(sock: socket.socket, correlation: int = 1) -> int:
    """Send ApiVersions v0 and return its error code."""
    payload = struct.pack(">hhih", 18, 0, correlation, -1)
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    body = recv_exactly(sock, size)
    assert struct.unpack_from(">i", body)[0] == correlation
    return int(struct.unpack_from(">h", body, 4)[0])


def thread_count() -> int:
    return threading.active_count()


def test_an_announced_size_costs_nothing_until_its_bytes_arrive(store: mqcore.Store) -> None:
    """100 connections each announce a 100 MiB request and send 1,000 bytes of it: the server
    holds about their bytes (each buffer starts at 64 KiB at most), not 100 x 128 MiB zeroed
    up front as before, and a normal client is still answered."""
    with Server(store, "127.0.0.1:0") as srv:
        hostile = [connect(srv) for _ in range(100)]
        for sock in hostile:
            sock.sendall(struct.pack(">i", 100 * MiB) + b"\0" * 1000)
        until(lambda: srv.network_stats()["request_bytes"] >= 100 * 1000, "the bytes to arrive")
        held = srv.network_stats()["request_bytes"]
        assert held <= 100 * (64 << 10), held
        with connect(srv) as normal:
            assert api_versions(normal) == 0
        for sock in hostile:
            sock.close()
        until(lambda: srv.network_stats()["request_bytes"] == 0, "the buffers to be given back")


def test_before_authentication_a_large_frame_closes_the_connection(
    store: mqcore.Store, tmp_path: Path
) -> None:
    """With SASL on, a frame announcing more than max_unauthenticated_request_bytes (512 KiB,
    Kafka's sasl.server.max.receive.size) before the client has authenticated closes the
    connection from its 4-byte size; the same size after authenticating is read."""
    users = tmp_path / "users"
    add_user(users, "alice", "alice-pw")
    with Server(store, "127.0.0.1:0", sasl_credentials=users) as srv:
        with connect(srv) as sock:
            sock.sendall(struct.pack(">i", 600 << 10) + b"\0" * 100)
            assert closed_by_peer(sock)
        assert srv.network_stats()["request_bytes"] == 0
        wire = KioWire(srv.address)
        try:
            assert wire.call(17, 1, mechanism="PLAIN").error_code == 0
            assert wire.call(36, 2, auth_bytes=b"\0alice\0alice-pw").error_code == 0
            store.create_topic("big")
            records = batch([b"x" * (600 << 10)])
            assert produce(wire, "big", records) == ErrorCode.none
        finally:
            wire.close()


def test_a_request_trickling_in_is_dropped_after_request_timeout(store: mqcore.Store) -> None:
    """One byte every 0.1 s kept the old server's per-recv timeout from ever firing; now the
    whole request must arrive within request_timeout of its first byte."""
    with Server(store, "127.0.0.1:0", request_timeout=1.0) as srv, connect(srv) as sock:
        sock.sendall(struct.pack(">i", 1000))
        started = time.monotonic()
        sock.settimeout(0.1)
        closed = False
        while time.monotonic() - started < WAIT and not closed:
            try:
                sock.sendall(b"\0")
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed, "still open after 1 byte every 0.1 s for 30 s"
        assert srv.network_stats()["connections"] == 0


def test_with_sasl_a_connection_must_authenticate_within_request_timeout(
    store: mqcore.Store, tmp_path: Path
) -> None:
    users = tmp_path / "users"
    add_user(users, "alice", "alice-pw")
    with Server(store, "127.0.0.1:0", sasl_credentials=users, request_timeout=1.0) as srv:
        with connect(srv) as sock:
            assert api_versions(sock) == 0  # answered before authentication
            assert closed_by_peer(sock)  # then closed: it never authenticated


def test_idle_connections_cost_no_thread(store: mqcore.Store) -> None:
    """2,000 idle connections: the server's thread count does not move (it was one thread per
    connection), and a new client is answered."""
    from mqcore.server.bounds import raise_open_files_limit

    if (raise_open_files_limit() or 1 << 20) < 6000:  # 2,000 sockets on each side, and the store's
        pytest.skip("needs an open-files limit of 6,000 (ulimit -n)")
    with Server(store, "127.0.0.1:0", max_connections_per_ip=5000) as srv:
        with connect(srv) as first:
            assert api_versions(first) == 0
        before = thread_count()
        idle = [connect(srv) for _ in range(2000)]
        try:
            until(lambda: srv.connection_count() == 2000, "2,000 connections")
            assert thread_count() == before
            with connect(srv) as normal:
                assert api_versions(normal) == 0
        finally:
            for sock in idle:
                sock.close()


def test_connections_from_one_address_are_bounded(store: mqcore.Store) -> None:
    with Server(store, "127.0.0.1:0", max_connections_per_ip=3) as srv:
        held = [connect(srv) for _ in range(3)]
        for sock in held:
            assert api_versions(sock) == 0
        extra = connect(srv)
        assert closed_by_peer(extra)
        extra.close()
        assert srv.network_stats()["most_from_one_address"] == 3
        held.pop().close()
        until(lambda: srv.connection_count() == 2, "a place to come free")
        with connect(srv) as again:
            assert api_versions(again) == 0
        for sock in held:
            sock.close()


def batch(values: list[bytes]) -> bytes:
    """A v2 batch as a Kafka producer builds it (kafka-python's codec, not ours)."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 64 * MiB)
    for i, v in enumerate(values):
        b.append(i, int(time.time() * 1000), None, v, [])
    return bytes(b.build())


def produce(wire: KioWire, topic: str, records: bytes) -> Any:
    from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData

    r = wire.call(0, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
                  topic_data=(TopicProduceData(name=topic, partition_data=(
                      PartitionProduceData(index=0, records=records),)),))  # fmt: skip
    return r.responses[0].partition_responses[0].error_code


def produce_frame(topic: str, records: bytes, correlation: int) -> bytes:
    """A whole Produce v9 request frame, written by kio."""
    import io

    from kio.schema.produce.v9.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.serial import entity_writer

    from mqcore.server.protocol import build

    head = ProduceRequest.__header_schema__
    out = io.BytesIO()
    entity_writer(head)(out, build(head, request_api_key=0, request_api_version=9,
                                   correlation_id=correlation, client_id="t"))  # fmt: skip
    entity_writer(ProduceRequest)(out, ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=0, records=records),)),)))  # fmt: skip
    return struct.pack(">i", out.tell()) + out.getvalue()


def test_partial_requests_share_a_bounded_pool_of_memory(store: mqcore.Store) -> None:
    """max_queued_request_bytes bounds what every connection's partial requests hold together:
    with a 3 MiB pool, A holds 2 MiB of a 2.5 MiB request; B's whole 2 MiB request waits for
    memory (muted, not refused) and is answered once A's request is in and answered."""
    store.create_topic("t", max_message_bytes=3 * MiB)
    with Server(store, "127.0.0.1:0", max_request_bytes=3 * MiB,
                max_queued_request_bytes=3 * MiB) as srv:  # fmt: skip
        frame_a = produce_frame("t", batch([b"a" * (5 * MiB // 2)]), 1)
        frame_b = produce_frame("t", batch([b"b" * (2 * MiB - 4096)]), 2)
        a, b = connect(srv), connect(srv)
        try:
            a.sendall(frame_a[: 2 * MiB + 4096])
            until(lambda: srv.network_stats()["request_bytes"] >= 2 * MiB, "A's 2 MiB")
            b.sendall(frame_b)
            until(lambda: srv.network_stats()["waiting_for_memory"] == 1, "B to wait for memory")
            assert srv.network_stats()["request_bytes"] <= 3 * MiB
            a.sendall(frame_a[2 * MiB + 4096 :])
            for sock, correlation in ((a, 1), (b, 2)):
                (size,) = struct.unpack(">i", recv_exactly(sock, 4))
                assert struct.unpack_from(">i", recv_exactly(sock, size))[0] == correlation
        finally:
            a.close()
            b.close()
    assert [len(m.value) for m in store.read("t", 0, 0, 10)] == [5 * MiB // 2, 2 * MiB - 4096]


def fetch_frame(topic: str, correlation: int, max_wait_ms: int) -> bytes:
    """A Fetch v12 frame waiting up to max_wait_ms for one byte of `topic` partition 0."""
    import io

    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
    from kio.serial import entity_writer

    from mqcore.server.protocol import build

    head = FetchRequest.__header_schema__
    out = io.BytesIO()
    entity_writer(head)(out, build(head, request_api_key=1, request_api_version=12,
                                   correlation_id=correlation, client_id="t"))  # fmt: skip
    entity_writer(FetchRequest)(out, FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1, max_bytes=MiB, isolation_level=0, session_id=0, session_epoch=-1,
        forgotten_topics_data=(), rack_id="", topics=(FetchTopic(topic=topic, partitions=(
            FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                           last_fetched_epoch=-1, log_start_offset=-1,
                           partition_max_bytes=MiB),)),)))  # fmt: skip
    return struct.pack(">i", out.tell()) + out.getvalue()


def test_waiting_fetches_hold_no_thread_and_an_append_answers_them(store: mqcore.Store) -> None:
    """100 consumers long-polling an empty partition (max_wait 60 s) on a server with 4
    request threads: they wait in the purgatory, the thread count does not grow, a producer
    and a metadata request are still answered, and the append wakes every one of them."""
    store.create_topic("t")
    with Server(store, "127.0.0.1:0", io_threads=4) as srv:
        before = thread_count()
        consumers = [connect(srv) for _ in range(100)]
        try:
            for i, sock in enumerate(consumers):
                sock.sendall(fetch_frame("t", i, 60_000))
            until(lambda: srv.network_stats()["waiting_requests"] == 100, "100 waiting fetches")
            assert thread_count() == before
            wire = KioWire(srv.address)
            try:
                assert produce(wire, "t", batch([b"wake"])) == ErrorCode.none
            finally:
                wire.close()
            for i, sock in enumerate(consumers):
                (size,) = struct.unpack(">i", recv_exactly(sock, 4))
                body = recv_exactly(sock, size)
                assert struct.unpack_from(">i", body)[0] == i
                assert b"wake" in body
            assert srv.network_stats()["waiting_requests"] == 0
        finally:
            for sock in consumers:
                sock.close()


def test_stop_answers_waiting_fetches(store: mqcore.Store) -> None:
    store.create_topic("t")
    srv = Server(store, "127.0.0.1:0").start()
    sock = connect(srv)
    try:
        sock.sendall(fetch_frame("t", 7, 60_000))
        until(lambda: srv.network_stats()["waiting_requests"] == 1, "the fetch to wait")
        srv.stop()
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        assert struct.unpack_from(">i", recv_exactly(sock, size))[0] == 7  # empty, answered
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("limit", "value", "complaint"),
    [
        ("max_connections_per_ip", 0, "max_connections_per_ip"),
        ("io_threads", 0, "io_threads"),
        ("max_queued_request_bytes", 1024, "below max_request_bytes"),
        ("request_timeout", 0, "request_timeout"),
    ],
)
def test_a_limit_that_cannot_work_is_refused(
    tmp_path: Path, limit: str, value: Any, complaint: str
) -> None:
    with pytest.raises(InvalidConfigError, match=complaint):
        Server(tmp_path / "never-made", "127.0.0.1:0", **{limit: value})
    assert not (tmp_path / "never-made").exists()


def test_connections_leave_the_store_its_descriptors(tmp_path: Path) -> None:
    """Under a hard open-files limit of 1,024 (a common default) max_connections (4,096) is cut
    so that connections cannot take the descriptors the store's partitions need: the limit
    minus the store's partition bound (half of it) minus 256, with a warning."""
    import resource
    import subprocess
    import sys

    from conftest import child_env

    code = (
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from mqcore.server import Server\n"
        "with Server(sys.argv[1], '127.0.0.1:0') as srv:\n"
        "    print(json.dumps(srv.network_stats()))\n"
    )

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s")], capture_output=True, text=True,
        env=child_env(), preexec_fn=low_limit, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    import json

    assert json.loads(proc.stdout)["max_connections"] == 1024 - 512 - 256
    assert "max_connections 4096 cut to 256" in proc.stderr


def test_mqcore_serve_takes_the_limits_from_its_flags(tmp_path: Path) -> None:
    """`mqcore serve --max-connections-per-ip 2 --request-timeout 1` in its own process: a
    third connection from the address is closed at once, a request trickling in is dropped
    after a second, a normal client is answered, and `mqcore serve --help` lists every
    limit without the server extra's modules being imported for it."""
    import subprocess
    import sys

    from conftest import child_env

    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "serve", str(tmp_path / "s"), "--create",
         "--listen", "127.0.0.1:0", "--max-connections-per-ip", "2", "--request-timeout", "1"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        host, port = proc.stdout.readline().split()[-1].rsplit(":", 1)
        address = (host, int(port))
        first = socket.create_connection(address, timeout=WAIT)
        second = socket.create_connection(address, timeout=WAIT)
        assert api_versions(first) == 0 and api_versions(second) == 0
        with socket.create_connection(address, timeout=WAIT) as third:
            assert closed_by_peer(third)
        second.sendall(struct.pack(">i", 100) + b"\0")  # then nothing more
        assert closed_by_peer(second)
        assert api_versions(first) == 0
        first.close()
        second.close()
    finally:
        proc.terminate()
        proc.wait(WAIT)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    shown = subprocess.run(
        [sys.executable, "-c", "import sys, mqcore.cli.serve as s, argparse\n"
         "p = argparse.ArgumentParser(); s.add_network_limits(p); p.print_help()\n"
         "print('kio' in sys.modules)"],
        env=child_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    for flag in ("--max-connections-per-ip", "--max-unauthenticated-request-bytes",
                 "--max-queued-request-bytes", "--io-threads", "--request-timeout",
                 "--http-max-connections-per-ip", "--http-request-timeout"):  # fmt: skip
        assert flag in shown.stdout
    assert shown.stdout.strip().endswith("False")  # kio was not imported


def test_a_server_whose_store_fails_stops_and_says_why(tmp_path: Path) -> None:
    """The store's background tasks end (a check-back calling sys.exit): every request would
    fail from then on, so the server stops on its own (`failure` says why, connections are
    refused) instead of answering KAFKA_STORAGE_ERROR to everything; the store's data stays."""
    from mqcore.errors import StoreClosedError

    srv = Server(str(tmp_path / "s"), "127.0.0.1:0", flush="os").start()
    try:
        assert srv.store is not None
        srv.store.create_topic("t")
        srv.store.append("t", b"kept")  # the task thread starts at the first write
        with connect(srv) as sock:
            assert api_versions(sock) == 0

        def exits() -> None:
            raise SystemExit(3)

        srv.store.log.tasks.add("exits", 1, exits)
        until(lambda: not srv.serving, "the server to stop")
        assert isinstance(srv.failure, StoreClosedError)
        assert "background tasks ended on SystemExit(3)" in str(srv.failure)

        def refused() -> bool:  # `serving` turns False as the stop starts; the socket closes last
            try:
                socket.create_connection(srv.address, timeout=WAIT).close()
            except OSError:
                return True
            return False

        until(refused, "connections to be refused")
    finally:
        srv.stop()
    with mqcore.open(str(tmp_path / "s"), read_only=True) as ro:
        assert [m.value for m in ro.read("t", 0, 0, 10)] == [b"kept"]
