"""A toy broker loop over mqcore's embedding API (docs/embedding.md), runnable:

    python docs/examples/embedded_broker.py [directory]

The broker side uses only the embedding API: a `mqcore.log.Log` for its log directory (topics,
one `ReplicaLog` handle per partition) and `OffsetStore` for its groups' committed offsets. The
client side builds its record batches with kafka-python's record codec (`pip install
kafka-python`), as a Kafka producer would send them, and reads fetched bytes back with it.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from mqcore.config import FlushPolicy
from mqcore.consume.offsets import OffsetAndMetadata, OffsetStore
from mqcore.log import Log, ReplicaLog


def client_batch(values: list[bytes], producer_id: int = -1, sequence: int = -1) -> bytes:
    """What a producer puts in a produce request for one partition: one v2 record batch."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1, base_sequence=sequence, batch_size=1 << 20,
    )  # fmt: skip
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, timestamp=now, key=None, value=value, headers=[])
    return bytes(builder.build())


# -- the broker: what it does with each request, through the embedding API only --------------


def handle_produce(log: ReplicaLog, records: bytes, leader_epoch: int) -> tuple[int, int]:
    """Produce: validate and append the request's bytes; answer (base offset, log start)."""
    info = log.append_as_leader(records, leader_epoch)
    # a single-replica log commits at once; a replicating broker moves the high watermark
    # when its followers have fetched past the offsets
    log.update_high_watermark(log.log_end_offset)
    return info.first_offset, info.log_start_offset


def handle_fetch(log: ReplicaLog, out: socket.socket, offset: int, max_bytes: int) -> int:
    """Fetch: whole batches from `offset`, sent from the segment file with sendfile()."""
    with log.read(offset, max_bytes) as fetched:
        header = fetched.size.to_bytes(4, "big") + fetched.high_watermark.to_bytes(8, "big")
        out.sendall(header)
        return fetched.send(out.fileno())


def handle_leader_change(log: ReplicaLog, new_epoch: int, leader_end_for_my_epoch: int) -> int:
    """Become a follower of a leader of `new_epoch`: cut what the new leader does not have (it
    answered OffsetsForLeaderEpoch for our latest epoch with `leader_end_for_my_epoch`)."""
    end = log.truncate_to(leader_end_for_my_epoch)
    log.assign_epoch(new_epoch, end)
    return end


def receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def handle_offset_commit(groups: OffsetStore, group: str, topic: str, offsets: dict) -> None:
    """OffsetCommit: the group's next offsets per partition, durable when it returns."""
    groups.commit(group, {(topic, p): OffsetAndMetadata(o) for p, o in offsets.items()})


def main(directory: str) -> None:
    broker_log = Log(directory, flush_policy=FlushPolicy("always"))
    try:
        broker_log.create_topic("orders", partitions=1)  # CreateTopics
        serve(broker_log)
    finally:
        broker_log.close()
    # the next start recovers the directory and finds the group's commit
    broker_log = Log(directory, flush_policy=FlushPolicy("always"))
    try:
        committed = OffsetStore(broker_log).committed("billing", "orders", 0)
        print(f"after restart committed={committed.offset if committed else None}")
    finally:
        broker_log.close()


def serve(broker_log: Log) -> None:
    log = broker_log.replica("orders", 0)  # one handle per partition, kept
    log.assign_epoch(1)  # this broker became leader of orders-0 in epoch 1
    for n in range(3):
        base, _ = handle_produce(log, client_batch([b"order-%d-%d" % (n, i) for i in range(4)]), 1)
        print(f"produce base_offset={base}")
    # an idempotent producer's resend is answered with the original offsets
    first = handle_produce(log, client_batch([b"paid"], producer_id=42, sequence=0), 1)
    again = handle_produce(log, client_batch([b"paid"], producer_id=42, sequence=0), 1)
    print(f"idempotent first={first[0]} resend={again[0]} end={log.log_end_offset}")

    server, client = socket.socketpair()
    with server, client:
        sent = handle_fetch(log, server, 5, 64)  # from inside the second batch, small budget
        size = int.from_bytes(receive(client, 4), "big")
        hw = int.from_bytes(receive(client, 8), "big")
        records = MemoryRecords(receive(client, size))
        offsets = []
        while (batch := records.next_batch()) is not None:
            offsets += [r.offset for r in batch]
        print(f"fetch sent={sent} high_watermark={hw} offsets={offsets}")

    # leadership moved on: epoch 2's leader only has epoch 1 up to offset 8
    print(f"end_offset_for_epoch(1)={log.end_offset_for_epoch(1)}")
    end = handle_leader_change(log, 2, 8)
    print(f"truncated end={end} epochs={[(e.epoch, e.start_offset) for e in log.epoch_entries]}")
    handle_offset_commit(OffsetStore(broker_log), "billing", "orders", {0: end})


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
