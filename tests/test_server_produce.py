"""Produce over the wire, where it can go wrong: the idempotent producer's sequence checks
(batches built by kafka-python's record codec, requests by kio), resends answered with the
original offsets across a server restart, and acks=all under flush="always" with the server
killed by SIGKILL mid-stream: every acknowledged message is there once after the restart."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

import mqcore

server_mod = pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
ck = pytest.importorskip("confluent_kafka")
from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402
from kafkaclients import KioWire  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402

Server = server_mod.Server
WAIT = 60.0


def batch(pid: int, epoch: int, sequence: int, values: list[bytes]) -> bytes:
    """A v2 batch as a Kafka producer builds it (kafka-python's codec, not ours)."""
    b = DefaultRecordBatchBuilder(2, 0, False, pid, epoch, sequence, 1 << 20)
    now = int(time.time() * 1000)
    for i, v in enumerate(values):
        b.append(i, now, None, v, [])
    return bytes(b.build())


def produce(wire: KioWire, topic: str, records: bytes) -> Any:
    from kio.schema.produce.v9.request import PartitionProduceData, TopicProduceData

    resp = wire.call(
        0, 9, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=0, records=records),)),),
    )  # fmt: skip
    return resp.responses[0].partition_responses[0]


def test_sequence_checks_over_the_wire(kafka_server: Any, store: mqcore.Store) -> None:
    store.create_topic("idem")
    wire = KioWire(kafka_server.address)
    try:
        init = wire.call(22, 4, transactional_id=None,
                            transaction_timeout=datetime.timedelta(seconds=60),
                            producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert init.error_code == ErrorCode.none and init.producer_id >= 0
        pid, epoch = init.producer_id, init.producer_epoch
        first = produce(wire, "idem", batch(pid, epoch, 0, [b"a", b"b"]))
        assert (first.error_code, first.base_offset) == (ErrorCode.none, 0)
        # a resend of the same batch: the original offsets, nothing written
        again = produce(wire, "idem", batch(pid, epoch, 0, [b"a", b"b"]))
        assert (again.error_code, again.base_offset) == (ErrorCode.none, 0)
        # a gap in the sequence: refused
        gap = produce(wire, "idem", batch(pid, epoch, 5, [b"c"]))
        assert gap.error_code == ErrorCode.out_of_order_sequence_number
        nxt = produce(wire, "idem", batch(pid, epoch, 2, [b"c"]))
        assert (nxt.error_code, nxt.base_offset) == (ErrorCode.none, 2)
        # KIP-360: the producer bumps its epoch; the old epoch is fenced from then on
        bump = wire.call(22, 4, transactional_id=None,
                            transaction_timeout=datetime.timedelta(seconds=60),
                            producer_id=pid, producer_epoch=epoch)  # fmt: skip
        assert (bump.error_code, bump.producer_id, bump.producer_epoch) == (
            ErrorCode.none,
            pid,
            epoch + 1,
        )
        newer = produce(wire, "idem", batch(pid, epoch + 1, 0, [b"d"]))
        assert (newer.error_code, newer.base_offset) == (ErrorCode.none, 3)
        stale = produce(wire, "idem", batch(pid, epoch, 3, [b"e"]))
        assert stale.error_code == ErrorCode.invalid_producer_epoch
        # a damaged batch: CORRUPT_MESSAGE, nothing written
        bad = bytearray(batch(pid, epoch + 1, 1, [b"f"]))
        bad[-1] ^= 0xFF
        assert produce(wire, "idem", bytes(bad)).error_code == ErrorCode.corrupt_message
    finally:
        wire.close()
    assert [m.value for m in store.read("idem", 0, 0, 100)] == [b"a", b"b", b"c", b"d"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_idempotent_producer_across_a_server_restart(tmp_path: Any) -> None:
    """librdkafka's idempotent producer keeps sending while the server restarts on the same
    store and port; requests in flight at the stop are sent again, and the restarted server
    (its producer state recovered from the log) answers the ones already appended with their
    original offsets. Every message is stored once, in the order produced."""
    path = str(tmp_path / "store")
    listen = f"127.0.0.1:{free_port()}"
    with mqcore.open(path) as s:
        s.create_topic("r", partitions=1)
    p = ck.Producer({"bootstrap.servers": listen, "enable.idempotence": True, "linger.ms": 2,
                     "retry.backoff.ms": 50, "reconnect.backoff.ms": 50})  # fmt: skip
    failed: list[Any] = []
    srv = Server(path, listen=listen).start()
    try:
        for i in range(3000):
            p.produce("r", value=b"%06d" % i, on_delivery=lambda e, m: e and failed.append(e))
            if i % 200 == 0:
                p.poll(0)
            if i == 1500:
                srv.stop()  # requests in flight now get no answer: the client sends them again
                srv = Server(path, listen=listen).start()
        assert p.flush(WAIT) == 0
    finally:
        srv.stop()
    assert failed == []
    with mqcore.open(path, read_only=True) as s:
        values = [m.value for m in s.read("r", 0, 0, 10_000)]
    assert values == [b"%06d" % i for i in range(3000)]


CHILD_PRODUCER = r"""
import sys, confluent_kafka
bootstrap, count = sys.argv[1], int(sys.argv[2])
p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                              "enable.idempotence": True, "linger.ms": 1,
                              "message.timeout.ms": 4000})
def report(err, msg):
    if err is None:  # acknowledged: printed (and flushed) before the next one is produced
        print(msg.value().decode(), flush=True)
for i in range(count):
    while True:
        try:
            p.produce("acked", value=b"m%07d" % i, on_delivery=report)
            break
        except BufferError:  # the local queue is full: wait for acknowledgements
            p.poll(0.1)
    p.poll(0)
p.flush(10)
"""


@pytest.mark.slow
def test_every_acknowledged_message_survives_sigkill_of_the_server(tmp_path: Any) -> None:
    """`mqcore serve --flush always` in its own process, a producer with acks=all in another,
    the server killed with SIGKILL mid-stream: after a restart, every message the producer
    saw acknowledged is in the log, exactly once."""
    from conftest import child_env

    path = str(tmp_path / "store")
    with mqcore.open(path) as s:
        s.create_topic("acked", partitions=1)
    env = child_env()
    server = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "serve", path, "--listen", "127.0.0.1:0",
         "--flush", "always"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    bootstrap = server.stdout.readline().strip().rsplit(" ", 1)[-1]
    producer = subprocess.Popen(
        [sys.executable, "-c", CHILD_PRODUCER, bootstrap, "1000000"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert producer.stdout is not None
    acked: list[str] = []
    try:
        for line in producer.stdout:  # kill once a few hundred acks are in
            acked.append(line.strip())
            if len(acked) == 500:
                os.kill(server.pid, signal.SIGKILL)
                break
        server.wait(WAIT)
        # no acknowledgement can come after the kill: stop the producer, keep what it printed
        producer.kill()
        acked.extend(line.strip() for line in producer.stdout)
        producer.wait(WAIT)
    finally:
        for proc in (server, producer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    assert len(acked) >= 500
    with Server(path, listen="127.0.0.1:0") as srv:  # the restart: recovery of the killed log
        assert srv.store is not None
        stored = [m.value.decode() for m in srv.store.read("acked", 0, 0, 1 << 30)]
    assert len(stored) == len(set(stored)), "a message is stored twice"
    assert set(acked) <= set(stored), sorted(set(acked) - set(stored))[:5]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cut", "zero"])
def test_acks_all_under_flush_always_survive_a_power_loss(tmp_path: Any, mode: str) -> None:
    """The server runs under the sync ledger (tests/powerloss.py); a confluent-kafka producer
    with acks=all sends until 300 acknowledgements are in, then the server is killed and the
    disk a power cut leaves is rebuilt (never-synced bytes cut, or zeros): every acknowledged
    message is in that image, once. This is what "acks=all with flush="always" is fdatasync'd
    before the response" promises."""
    import powerloss
    from crashchild import helper_env

    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store) as s:
        s.create_topic("pl", partitions=2, segment_bytes=64 << 10)
    here = os.path.dirname(os.path.abspath(__file__))
    server = subprocess.Popen(
        [sys.executable, os.path.join(here, "powerloss_server.py"), store, ledger],
        env=helper_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    acked: list[bytes] = []
    try:
        assert server.stdout is not None
        bootstrap = server.stdout.readline().strip()
        p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1,
                         "message.timeout.ms": 5000})  # fmt: skip

        def report(err: Any, msg: Any) -> None:
            if err is None:
                acked.append(msg.value())

        i = 0
        deadline = time.monotonic() + WAIT
        while len(acked) < 300 and time.monotonic() < deadline:
            p.produce("pl", key=b"k%d" % (i % 5), value=b"v%07d" % i, on_delivery=report)
            i += 1
            p.poll(0.001 if i % 20 else 0.05)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(WAIT)
        p.purge()
        p.flush(0)  # reports of responses read before the kill still arrive
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert len(acked) >= 300
    powerloss.power_cut(store, ledger, image, mode)
    with mqcore.open(image, flush="always") as s:
        stored = [m.value for p in range(2) for m in s.read("pl", p, 0, 1 << 30)]
    assert len(stored) == len(set(stored)), "a message is stored twice"
    missing = set(acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"
