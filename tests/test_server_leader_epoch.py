"""OffsetForLeaderEpoch (API 23) on `mqcore serve`: where each leader epoch ends in a
partition's log, answered from the log's epoch cache, compared with ReplicaLog's own answer for
every epoch around the ones the log holds; the current-epoch fencing; a replica's request and
a consumer's. Every version, v0 and v1 among them (Kafka 4 removed them, 3.9 served them),
encoded and decoded by kafka-python's own protocol classes."""

from __future__ import annotations

import time

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kafkaclients import kafka_python_call  # noqa: E402

from mqcore.server import Server  # noqa: E402

UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_LEADER_EPOCH = 3, 75


def batch(n: int) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(n):
        b.append(i, timestamp=int(time.time() * 1000), key=None, value=b"v", headers=[])
    return bytes(b.build())


def ask(srv: Server, version: int, topic: str, epochs: list[int], *, current: int = -1,
        replica: int = -1) -> list[tuple[int, int, int]]:  # fmt: skip
    """(error code, epoch, end offset) for each asked epoch of partition 0 (partition 9, which
    does not exist, for epoch -9), asked by kafka-python's own OffsetForLeaderEpoch classes;
    v0 answers no epoch (-1 here)."""
    from kafka.protocol.old import offset_for_leader_epoch as ofle

    def part(e: int) -> tuple[int, ...]:
        p = 9 if e == -9 else 0
        return (p, current, e) if version >= 2 else (p, e)

    topics = [(topic, [part(e) for e in epochs])]
    if version >= 4:
        topics = [(topic, [(*part(e), {}) for e in epochs], {})]  # type: ignore[list-item]
    request = getattr(ofle, f"OffsetForLeaderEpochRequest_v{version}")
    args = (replica, topics) if version >= 3 else (topics,)
    r = kafka_python_call(srv.address, request(*args, **({"tags": {}} if version >= 4 else {})))
    out = []
    for p in r.topics[0][1]:
        if version == 0:
            out.append((p[0], -1, p[2]))
        else:
            out.append((p[0], p[2], p[3]))
    return out


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_epoch_ends_are_the_logs_own(store: mqcore.Store, version: int) -> None:
    """Epochs 2@0, 5@3, 7@7 written through the embedding API; every epoch from -1 to 9 is
    answered as ReplicaLog.end_offset_for_epoch answers it (Kafka's rules: the latest ends at
    the log end, an unknown one between two takes the lower's end, one above all is -1)."""
    store.create_topic("t")
    log = store.log.replica("t", 0)
    for epoch, n in ((2, 3), (5, 4), (7, 2)):
        log.append_as_leader(batch(n), epoch)
    with Server(store, listen="127.0.0.1:0") as srv:
        epochs = list(range(-1, 10))
        got = ask(srv, version, "t", epochs)
        want = [(0, *log.end_offset_for_epoch(e)) for e in epochs]
        if version == 0:
            want = [(c, -1, end) for c, _, end in want]
        assert got == want
        assert got[epochs.index(5)][2] == 7 and got[epochs.index(7)][2] == 9
        assert ask(srv, version, "t", [-9]) == [(UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]
        assert ask(srv, version, "nope", [0]) == [(UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]


def test_a_produced_log_is_at_epoch_0_and_newer_epochs_are_unknown(store: mqcore.Store) -> None:
    """Produced over the wire, every batch is epoch 0 (this node leads at 0): epoch 0 ends at
    the log end; a caller that believes in epoch 1 is told UNKNOWN_LEADER_EPOCH, one at 0 or
    without a current epoch is answered; a replica's request (replica_id set) too, without
    ACLs."""
    store.create_topic("t")
    with Server(store, listen="127.0.0.1:0") as srv:
        p = kafka.KafkaProducer(bootstrap_servers=srv.bootstrap)
        try:
            for i in range(5):
                p.send("t", b"m%d" % i, partition=0)
            p.flush(30)
        finally:
            p.close()
        assert ask(srv, 4, "t", [0]) == [(0, 0, 5)]
        assert ask(srv, 4, "t", [0], current=0) == [(0, 0, 5)]
        assert ask(srv, 4, "t", [0], current=1) == [(UNKNOWN_LEADER_EPOCH, -1, -1)]
        assert ask(srv, 4, "t", [0], replica=2) == [(0, 0, 5)]


kafka = pytest.importorskip("kafka")
