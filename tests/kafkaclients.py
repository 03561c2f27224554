"""Helpers the `mqcore serve` tests share: reading a raw socket, and consuming with
confluent-kafka (librdkafka) by assign(), without a group."""

from __future__ import annotations

import socket
import time
from typing import Any

WAIT = 30.0


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock`; ConnectionError when it closes first."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def consume_confluent(config: dict[str, Any], topic: str, partitions: int, n: int) -> list[Any]:
    """The first `n` messages of partitions 0..partitions-1 of `topic` from offset 0, read by a
    confluent-kafka consumer with `config` (bootstrap and security settings) and assign()."""
    import confluent_kafka as ck

    c = ck.Consumer({**config, "group.id": "t", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + WAIT
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m)
        return got
    finally:
        c.close()
