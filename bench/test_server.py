"""`mqcore serve` (issue 19) against its baselines, side by side in one run: a confluent-kafka
producer (acks=1, linger 5 ms, 1 MiB batches) against `Store.append_batch` of the same messages
in process and against raw write() of the same encoded bytes; a confluent-kafka consumer
fetching from page cache against raw pread() of the same segment bytes; and the latency of one
acks=all produce under flush="always" against one write + fdatasync of a file.

The server runs as `mqcore serve` in a process of its own (as it is deployed; in the
benchmark's process it would share one GIL with the client). Figures and where the time goes:
bench/README.md "mqcore serve".
"""

from __future__ import annotations

import contextlib
import datetime
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from benchdata import SEED, T0_MS, prime_page_cache, record, values_of
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore
from mqcore._ext.batch import encode_batch

ck = pytest.importorskip("confluent_kafka")
pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")

SIZES = {"1KiB": 1024, "100B": 100}
FETCH_SIZES = {**SIZES, "64KiB": 64 << 10}  # large values: the client's per-message cost fades
# messages one produce round sends (~20, ~10 MB); the 64 KiB topic is only fetched (~300 MB)
PER_ROUND = {"1KiB": 20_000, "100B": 100_000, "64KiB": 500}
ROUNDS = 8
BATCH = 1000  # the in-process side's batches: what librdkafka's 1 MiB batches hold of 1 KiB
LATENCY_ROUNDS = 1000  # a p99 of 200 samples is their second worst: it moved 4x between runs
SEGMENT = 1 << 30
PRODUCER = {
    "acks": 1, "linger.ms": 5, "batch.size": 1 << 20, "compression.type": "none",
    "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 4_000_000,
}  # fmt: skip


@dataclass
class Served:
    """A `mqcore serve` process and what it serves."""

    path: str
    bootstrap: str
    process: subprocess.Popen[str]


def serve(path: str, flush: str) -> Served:
    with mqcore.open(path) as s:
        for name in FETCH_SIZES:
            if f"w{name}" not in s.topics():
                s.create_topic(f"w{name}", segment_bytes=SEGMENT, max_message_bytes=2 << 20)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "serve", path, "--listen", "127.0.0.1:0",
         "--flush", flush, "--max-connections-per-ip", "5000"],  # the idle connections' test
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return Served(path, proc.stdout.readline().split()[-1], proc)


def stop(served: Served) -> None:
    served.process.terminate()
    served.process.wait(60)
    if served.process.stdout is not None:
        served.process.stdout.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = serve(str(tmp_path_factory.mktemp("served") / "store"), "os")
    try:
        yield served
    finally:
        stop(served)


def produce_values(producer: Any, topic: str, values: list[bytes]) -> None:
    """Every value to partition 0, waiting for room when the client's queue is full."""
    send = producer.produce
    for v in values:
        try:
            send(topic, v, partition=0)
        except BufferError:  # the local queue is full: let acknowledgements drain it
            producer.poll(0.005)
            send(topic, v, partition=0)


def produce_all(producer: Any, topic: str, values: list[bytes]) -> None:
    """Every value to partition 0, then wait for every acknowledgement."""
    produce_values(producer, topic, values)
    assert producer.flush(120) == 0


@pytest.mark.parametrize("size", list(SIZES))
def test_wire_produce(benchmark: BenchmarkFixture, server: Served, size: str) -> None:
    """One confluent-kafka producer, acks=1, to `mqcore serve` (flush="os")."""
    values = values_of(PER_ROUND[size], SIZES[size], SEED)
    producer = ck.Producer({"bootstrap.servers": server.bootstrap, **PRODUCER})
    topic = f"w{size}"
    # the same warm page cache as the in-process and raw sides get (benchdata)
    prime_page_cache(
        os.path.dirname(server.path), (ROUNDS + 1) * PER_ROUND[size] * (SIZES[size] + 80)
    )
    with mqcore.open(server.path, read_only=True) as s:
        before = s.end_offset(topic, 0)
    benchmark.group = f"server-produce-{size}"
    record(benchmark, f"server/produce/{size}/wire", nbytes=PER_ROUND[size] * SIZES[size],
           messages=PER_ROUND[size])  # fmt: skip
    benchmark.pedantic(lambda: produce_all(producer, topic, values), rounds=ROUNDS,
                       warmup_rounds=1, iterations=1)  # fmt: skip
    with mqcore.open(server.path, read_only=True) as s:
        assert s.end_offset(topic, 0) - before == (ROUNDS + 1) * PER_ROUND[size]


IDLE_CONNECTIONS = 1000


def test_wire_produce_beside_idle_connections_and_a_slow_consumer(
    benchmark: BenchmarkFixture, server: Served
) -> None:
    """test_wire_produce[1KiB] while 1,000 other connections sit idle (each holds a server
    thread parked in recv()) and one consumer fetches a large range but reads its socket a
    kilobyte at a time (its thread parked in a full send): neither may slow the producer by
    more than 20 % (bench/ratios.py)."""
    import socket
    import threading

    size = "1KiB"
    fill(server, size)  # something for the slow consumer to fetch
    host, port = server.bootstrap.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port))) for _ in range(IDLE_CONNECTIONS)]
    stop = threading.Event()

    def slow_consumer() -> None:
        import io
        import struct

        from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
        from kio.schema.request_header.v2.header import RequestHeader
        from kio.serial import entity_writer

        with socket.create_connection((host, int(port))) as sock:
            while not stop.is_set():
                out = io.BytesIO()
                entity_writer(RequestHeader)(out, RequestHeader(
                    request_api_key=1, request_api_version=12, correlation_id=1,
                    client_id="slow"))  # fmt: skip
                entity_writer(FetchRequest)(out, FetchRequest(
                    max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
                    max_bytes=64 << 20, topics=(FetchTopic(topic=f"w{size}", partitions=(
                        FetchPartition(partition=0, fetch_offset=0,
                                       partition_max_bytes=64 << 20),)),),
                    forgotten_topics_data=()))  # fmt: skip
                payload = out.getvalue()
                sock.sendall(struct.pack(">i", len(payload)) + payload)
                left = 8 + 1  # at least the size and the header: then read a trickle
                while not stop.wait(0.01) and left > 0:
                    left = len(sock.recv(1024))
                return

    reader = threading.Thread(target=slow_consumer)
    reader.start()
    try:
        values = values_of(PER_ROUND[size], SIZES[size], SEED)
        producer = ck.Producer({"bootstrap.servers": server.bootstrap, **PRODUCER})
        prime_page_cache(os.path.dirname(server.path), (ROUNDS + 1) * PER_ROUND[size] * 1104)
        benchmark.group = f"server-produce-{size}"
        record(benchmark, f"server/produce/{size}/wire-beside-idle-and-slow",
               nbytes=PER_ROUND[size] * SIZES[size], messages=PER_ROUND[size],
               idle_connections=len(idle))  # fmt: skip
        benchmark.pedantic(lambda: produce_all(producer, f"w{size}", values), rounds=ROUNDS,
                           warmup_rounds=1, iterations=1)  # fmt: skip
    finally:
        stop.set()
        reader.join()
        for sock in idle:
            sock.close()


@contextlib.contextmanager
def null_server(path: str) -> Iterator[str]:
    """bench/null_produce_server.py over a new store at `path`: its bootstrap address."""
    proc = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "null_produce_server.py"), path],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("size", list(SIZES))
def test_wire_produce_not_appended(
    benchmark: BenchmarkFixture, tmp_path_factory: pytest.TempPathFactory, size: str
) -> None:
    """The same producer to a server that acknowledges without appending
    (bench/null_produce_server.py): what the client, the socket and the request parsing cost
    without the store, the ceiling of the wire side on this machine."""
    with null_server(str(tmp_path_factory.mktemp("null") / "store")) as bootstrap:
        producer = ck.Producer({"bootstrap.servers": bootstrap, **PRODUCER})
        values = values_of(PER_ROUND[size], SIZES[size], SEED)
        produce_all(producer, f"w{size}", values[:10])  # metadata and the topic, made
        benchmark.group = f"server-produce-{size}"
        record(benchmark, f"server/produce/{size}/wire-not-appended",
               nbytes=PER_ROUND[size] * SIZES[size], messages=PER_ROUND[size])  # fmt: skip
        benchmark.pedantic(lambda: produce_all(producer, f"w{size}", values), rounds=ROUNDS,
                           warmup_rounds=1, iterations=1)  # fmt: skip


def produce_frames(topic: str, values: list[bytes]) -> list[bytes]:
    """Produce v9 requests (acks=1) of BATCH messages each, framed and encoded once: batches
    as a client builds them (no unique IDs), to partition 0."""
    import io
    import struct

    from kio.schema.produce.v9.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer

    frames = []
    for n, i in enumerate(range(0, len(values), BATCH)):
        records = encode_batch(values[i : i + BATCH], now_ms=T0_MS).tobytes()
        out = io.BytesIO()
        head = RequestHeader(
            request_api_key=0, request_api_version=9, correlation_id=n, client_id="raw"
        )
        entity_writer(RequestHeader)(out, head)
        entity_writer(ProduceRequest)(out, ProduceRequest(
            transactional_id=None, acks=1, timeout=datetime.timedelta(seconds=30),
            topic_data=(TopicProduceData(name=topic, partition_data=(
                PartitionProduceData(index=0, records=records),)),)))  # fmt: skip
        payload = out.getvalue()
        frames.append(struct.pack(">i", len(payload)) + payload)
    return frames


def raw_produce_all(sock: Any, frames: list[bytes], in_flight: int = 5) -> None:
    """Send `frames` with up to `in_flight` requests unanswered (librdkafka's default
    max.in.flight), reading each response whole and checking only its size."""
    import socket
    import struct

    sent = answered = 0
    while answered < len(frames):
        while sent < len(frames) and sent - answered < in_flight:
            sock.sendall(frames[sent])
            sent += 1
        (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
        assert len(sock.recv(size, socket.MSG_WAITALL)) == size
        answered += 1


@pytest.mark.parametrize("size", list(SIZES))
def test_raw_protocol_produce(benchmark: BenchmarkFixture, server: Served, size: str) -> None:
    """The same messages as Produce requests encoded beforehand and written to the socket by
    a client that costs next to nothing: what the server itself sustains (the confluent
    producer's own produce() calls cost more than the whole in-process append, see
    test_confluent_produce_calls_alone)."""
    import socket

    topic = f"w{size}"
    frames = produce_frames(topic, values_of(PER_ROUND[size], SIZES[size], SEED))
    prime_page_cache(
        os.path.dirname(server.path), (ROUNDS + 1) * PER_ROUND[size] * (SIZES[size] + 80)
    )
    host, port = server.bootstrap.rsplit(":", 1)
    with mqcore.open(server.path, read_only=True) as s:
        before = s.end_offset(topic, 0)
    with socket.create_connection((host, int(port))) as sock:
        benchmark.group = f"server-produce-{size}"
        record(benchmark, f"server/produce/{size}/raw-protocol",
               nbytes=PER_ROUND[size] * SIZES[size], messages=PER_ROUND[size])  # fmt: skip
        benchmark.pedantic(lambda: raw_produce_all(sock, frames), rounds=ROUNDS,
                           warmup_rounds=1, iterations=1)  # fmt: skip
    with mqcore.open(server.path, read_only=True) as s:
        assert s.end_offset(topic, 0) - before == (ROUNDS + 1) * PER_ROUND[size]


@pytest.mark.parametrize("size", list(SIZES))
def test_confluent_produce_calls_alone(benchmark: BenchmarkFixture, size: str) -> None:
    """The confluent producer's produce() calls for one round with no broker to send to (the
    messages wait in librdkafka's queue and are purged after each round): the client's own
    floor, under any server."""
    values = values_of(PER_ROUND[size], SIZES[size], SEED)
    producer = ck.Producer({"bootstrap.servers": "127.0.0.1:9", **PRODUCER})

    def calls() -> None:
        send = producer.produce
        for v in values:
            send("t", v, partition=0)
        assert len(producer) >= len(values)  # queued (a few reports of the last purge may wait)
        producer.purge()
        producer.poll(0)  # the purged messages' reports, as a delivering client serves them

    benchmark.group = f"server-produce-{size}"
    record(benchmark, f"server/produce/{size}/confluent-calls-alone",
           nbytes=PER_ROUND[size] * SIZES[size], messages=PER_ROUND[size])  # fmt: skip
    benchmark.pedantic(calls, rounds=ROUNDS, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("ids", [True, False], ids=["ids", "no-ids"])
@pytest.mark.parametrize("size", list(SIZES))
def test_inprocess_append_batch(
    benchmark: BenchmarkFixture, scratch: str, size: str, ids: bool
) -> None:
    """The same messages through Store.append_batch in this process, batches of 1000: on a
    default topic (a unique ID generated per message, as mqcore's users append) and without
    IDs (like for like with the wire, whose client batches carry none)."""
    values = values_of(PER_ROUND[size], SIZES[size], SEED)
    batches = [values[i : i + BATCH] for i in range(0, len(values), BATCH)]
    prime_page_cache(scratch, (ROUNDS + 1) * PER_ROUND[size] * (SIZES[size] + 80))
    with mqcore.open(os.path.join(scratch, f"store-{ids}"), flush="os") as s:
        s.create_topic("t", segment_bytes=SEGMENT, max_message_bytes=2 << 20, unique_ids=ids)

        def append_all() -> None:
            for b in batches:
                s.append_batch("t", b, partition=0)

        benchmark.group = f"server-produce-{size}"
        record(benchmark, f"server/produce/{size}/append_batch" + ("" if ids else "-no-ids"),
               nbytes=PER_ROUND[size] * SIZES[size], messages=PER_ROUND[size])  # fmt: skip
        benchmark.pedantic(append_all, rounds=ROUNDS, warmup_rounds=1, iterations=1)
        assert s.end_offset("t", 0) == (ROUNDS + 1) * PER_ROUND[size]


@pytest.mark.parametrize("size", list(SIZES))
def test_raw_write(benchmark: BenchmarkFixture, scratch: str, size: str) -> None:
    """os.write() of the same messages encoded once beforehand (batches of 1000)."""
    values = values_of(PER_ROUND[size], SIZES[size], SEED)
    encoded = [
        encode_batch(values[i : i + BATCH], now_ms=T0_MS, uid_ms=T0_MS).tobytes()
        for i in range(0, len(values), BATCH)
    ]
    prime_page_cache(scratch, (ROUNDS + 1) * sum(map(len, encoded)))
    fd = os.open(os.path.join(scratch, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:

        def write_all() -> None:
            for b in encoded:
                os.write(fd, b)

        benchmark.group = f"server-produce-{size}"
        record(benchmark, f"server/produce/{size}/raw-write",
               nbytes=PER_ROUND[size] * SIZES[size], messages=PER_ROUND[size])  # fmt: skip
        benchmark.pedantic(write_all, rounds=ROUNDS, warmup_rounds=1, iterations=1)
    finally:
        os.close(fd)


def fill(server: Served, size: str) -> int:
    """The messages of the fetch benchmarks' topic: what the produce benchmark left, produced
    here when it did not run. Returns how many there are."""
    topic = f"w{size}"
    with mqcore.open(server.path, read_only=True) as s:
        count = s.end_offset(topic, 0)
    want = (ROUNDS + 1) * PER_ROUND[size]
    if count < want:
        producer = ck.Producer({"bootstrap.servers": server.bootstrap, **PRODUCER})
        produce_all(producer, topic, values_of(want - count, FETCH_SIZES[size], SEED))
    return max(count, want)


def log_bytes(path: str, topic: str) -> int:
    part = os.path.join(path, f"{topic}-0")
    return sum(
        os.path.getsize(os.path.join(part, n)) for n in os.listdir(part) if n.endswith(".log")
    )


@pytest.mark.parametrize("size", list(FETCH_SIZES))
def test_wire_fetch(benchmark: BenchmarkFixture, server: Served, size: str) -> None:
    """One confluent-kafka consumer reads the topic from offset 0 (page cache): log bytes/s."""
    topic = f"w{size}"
    count = fill(server, size)
    nbytes = log_bytes(server.path, topic)
    config = {"bootstrap.servers": server.bootstrap, "group.id": "bench",
              "enable.auto.commit": False, "fetch.max.bytes": 50 << 20,
              "max.partition.fetch.bytes": 16 << 20, "fetch.wait.max.ms": 100}  # fmt: skip

    def fetch_all() -> None:
        c = ck.Consumer(config)
        try:
            c.assign([ck.TopicPartition(topic, 0, 0)])
            got = 0
            while got < count:  # consume() waits for as many as asked: never ask for more
                got += len(c.consume(min(100_000, count - got), 5.0))
        finally:
            c.close()

    benchmark.group = f"server-fetch-{size}"
    record(benchmark, f"server/fetch/{size}/wire", nbytes=nbytes, messages=count)
    benchmark.pedantic(fetch_all, rounds=5, warmup_rounds=1, iterations=1)


@pytest.mark.parametrize("size", list(FETCH_SIZES))
def test_raw_read(benchmark: BenchmarkFixture, server: Served, size: str) -> None:
    """pread() of the same segment bytes in 1 MiB reads: the page cache's own speed."""
    topic = f"w{size}"
    fill(server, size)
    part = os.path.join(server.path, f"{topic}-0")
    logs = sorted(os.path.join(part, n) for n in os.listdir(part) if n.endswith(".log"))
    nbytes = sum(os.path.getsize(p) for p in logs)

    def read_all() -> None:
        for path in logs:
            fd = os.open(path, os.O_RDONLY)
            try:
                at = 0
                while chunk := os.pread(fd, 1 << 20, at):
                    at += len(chunk)
            finally:
                os.close(fd)

    benchmark.group = f"server-fetch-{size}"
    record(benchmark, f"server/fetch/{size}/raw-read", nbytes=nbytes)
    benchmark.pedantic(read_all, rounds=5, warmup_rounds=1, iterations=1)


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def raw_fetch_all(address: tuple[str, int], topic: str, count: int) -> int:
    """Fetch `topic` partition 0 from offset 0 to `count` with Fetch v12 requests over one
    socket, each response read whole into one buffer where only the batch headers are looked
    at (no record decoded, nothing copied): what the server delivers when the client costs
    nothing. Returns the record bytes received."""
    import io
    import socket
    import struct

    from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer

    sock = socket.create_connection(address)
    offset, received, correlation = 0, 0, 0
    view = memoryview(bytearray(128 << 20))
    try:
        while offset < count:
            correlation += 1
            out = io.BytesIO()
            entity_writer(RequestHeader)(out, RequestHeader(
                request_api_key=1, request_api_version=12, correlation_id=correlation,
                client_id="raw"))  # fmt: skip
            entity_writer(FetchRequest)(out, FetchRequest(
                max_wait=datetime.timedelta(milliseconds=100), min_bytes=1, max_bytes=64 << 20,
                topics=(FetchTopic(topic=topic, partitions=(FetchPartition(
                    partition=0, fetch_offset=offset, partition_max_bytes=32 << 20),)),),
                forgotten_topics_data=()))  # fmt: skip
            payload = out.getvalue()
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            got = 0
            while got < 4:
                got += sock.recv_into(view[got:4], 4 - got)
            size = struct.unpack_from(">i", view)[0]
            got = 0
            while got < size:
                got += sock.recv_into(view[got:size], size - got)
            # FetchResponse v12 (server/fetchwire.py's schema), one topic of one partition:
            # header 5, throttle 4, error 2, session 4, topics count, name, partitions count
            pos = 15
            _, pos = _uvarint(view, pos)
            name_len, pos = _uvarint(view, pos)
            pos += name_len - 1
            _, pos = _uvarint(view, pos)
            pos += 4 + 2 + 8 + 8 + 8  # index, error, high watermark, last stable, log start
            _, pos = _uvarint(view, pos)  # aborted transactions (null)
            pos += 4  # preferred read replica
            length, pos = _uvarint(view, pos)
            end = pos + max(length - 1, 0)
            received += end - pos
            while pos + 61 <= end:  # the batches' headers: the next offset
                base, batch_length = struct.unpack_from(">qi", view, pos)
                offset = base + struct.unpack_from(">i", view, pos + 23)[0] + 1
                pos += 12 + batch_length
    finally:
        sock.close()
    return received


@pytest.mark.parametrize("size", list(FETCH_SIZES))
def test_raw_protocol_fetch(benchmark: BenchmarkFixture, server: Served, size: str) -> None:
    """Fetch requests from a client that reads the bytes and decodes nothing: the server's
    delivery rate (sendfile from page cache over loopback)."""
    count = fill(server, size)
    nbytes = log_bytes(server.path, f"w{size}")
    host, port = server.bootstrap.rsplit(":", 1)
    benchmark.group = f"server-fetch-{size}"
    record(benchmark, f"server/fetch/{size}/raw-protocol", nbytes=nbytes, messages=count)
    benchmark.pedantic(lambda: raw_fetch_all((host, int(port)), f"w{size}", count), rounds=5,
                       warmup_rounds=1, iterations=1)  # fmt: skip


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def measure_latency(benchmark: BenchmarkFixture, bootstrap: str, case: str) -> None:
    """One 100 B message at a time, acks=all: the time from produce() to its acknowledgement,
    LATENCY_ROUNDS times (median by pytest-benchmark, p99 in extra_info)."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    value = b"v" * 100
    produce_all(producer, "w100B", [value])  # connected, metadata known
    samples: list[float] = []

    def one() -> None:
        t = time.perf_counter()
        producer.produce("w100B", value, partition=0)
        assert producer.flush(30) == 0
        samples.append(time.perf_counter() - t)

    benchmark.group = "server-latency"
    benchmark.pedantic(one, rounds=LATENCY_ROUNDS, warmup_rounds=5, iterations=1)
    record(benchmark, case, messages=1, p99_ms=p99(samples[5:]) * 1e3)


def test_produce_latency_acks_all_always(
    benchmark: BenchmarkFixture, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """acks=all to `mqcore serve --flush always` (fdatasync'd before the response)."""
    served = serve(str(tmp_path_factory.mktemp("always") / "store"), "always")
    try:
        measure_latency(benchmark, served.bootstrap, "server/latency/acks-all-always")
    finally:
        stop(served)


def test_produce_latency_not_appended(
    benchmark: BenchmarkFixture, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """acks=all to a server that acknowledges without appending: the round trip through
    librdkafka, the socket and the server's request handling, with no disk in it."""
    with null_server(str(tmp_path_factory.mktemp("null-latency") / "store")) as bootstrap:
        measure_latency(benchmark, bootstrap, "server/latency/not-appended")


def test_fdatasync_latency(benchmark: BenchmarkFixture, scratch: str) -> None:
    """The baseline of the latency goal: write 100 B to a file and fdatasync it."""
    fd = os.open(os.path.join(scratch, "sync.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    samples: list[float] = []
    try:

        def one() -> None:
            t = time.perf_counter()
            os.write(fd, b"v" * 100)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - t)

        benchmark.group = "server-latency"
        benchmark.pedantic(one, rounds=LATENCY_ROUNDS, warmup_rounds=5, iterations=1)
        record(benchmark, "server/latency/fdatasync", messages=1,
               p99_ms=p99(samples[5:]) * 1e3)  # fmt: skip
    finally:
        os.close(fd)
