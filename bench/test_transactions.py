"""Kafka transactions on `mqcore serve` (issue 34's speed items), side by side in one run:

- produce of 1 KiB messages in transactions of 1,000 (confluent-kafka: begin, 1,000 produces,
  commit) against the same idempotent produce without transactions (goal: >= 0.8);
- a read_committed fetch against a read_uncommitted one of the same log, a tenth of whose
  transactions were aborted (goal: >= 0.9): each fetches the whole log with a confluent-kafka
  consumer from the start to the end (the last stable offset).

The server runs as `mqcore serve` in a process of its own (bench/test_server.py's reason).
Figures and where the time goes: bench/README.md "Transactions".
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
from benchdata import SEED, record, values_of
from pytest_benchmark.fixture import BenchmarkFixture
from test_server import Served, produce_values, serve, stop

ck = pytest.importorskip("confluent_kafka")

SIZE = 1024
PER_TXN = 1000
TXNS = 20  # transactions a produce round writes: 20,000 messages, as test_server's rounds
ROUNDS = 6
ABORTED = 0.1  # of the fetched log's transactions
FETCH_TXNS = 200  # 200,000 messages in the fetched log
PRODUCER = {"linger.ms": 5, "batch.size": 1 << 20, "compression.type": "none",
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 4_000_000}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = serve(str(tmp_path_factory.mktemp("txns") / "store"), "os")
    try:
        yield served
    finally:
        stop(served)


@pytest.mark.parametrize("mode", ["transactions", "idempotent"])
def test_transactional_produce(benchmark: BenchmarkFixture, server: Served, mode: str) -> None:
    """20 transactions of 1,000 x 1 KiB (commit each) against 20,000 idempotent produces."""
    values = values_of(PER_TXN, SIZE, SEED)
    topic = "w1KiB"
    if mode == "transactions":
        producer = ck.Producer({"bootstrap.servers": server.bootstrap,
                                "transactional.id": "bench-tx", **PRODUCER})  # fmt: skip
        producer.init_transactions(60)

        def round_() -> None:
            for _ in range(TXNS):
                producer.begin_transaction()
                produce_values(producer, topic, values)
                producer.commit_transaction(60)
    else:
        producer = ck.Producer({"bootstrap.servers": server.bootstrap,
                                "enable.idempotence": True, **PRODUCER})  # fmt: skip

        def round_() -> None:
            for _ in range(TXNS):
                produce_values(producer, topic, values)
            assert producer.flush(120) == 0

    benchmark.group = "txn-produce-1KiB"
    record(benchmark, f"txn/produce/1KiB/{mode}", nbytes=TXNS * PER_TXN * SIZE,
           messages=TXNS * PER_TXN)  # fmt: skip
    benchmark.pedantic(round_, rounds=ROUNDS, warmup_rounds=1, iterations=1)


@pytest.fixture(scope="module")
def aborted_log(server: Served) -> int:
    """Topic `mixed`: FETCH_TXNS transactions of 1,000 x 1 KiB, a tenth of them (chosen at
    random) aborted after their records reached the log; returns the committed count."""
    from mqcore import open as open_store

    with open_store(server.path, read_only=True) as s:
        assert "mixed" not in s.topics()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic("mixed", 1, 1)])["mixed"].result(60)
    producer = ck.Producer({"bootstrap.servers": server.bootstrap,
                            "transactional.id": "bench-mixed", **PRODUCER})  # fmt: skip
    producer.init_transactions(60)
    values = values_of(PER_TXN, SIZE, SEED)
    rng = random.Random(SEED)
    committed = 0
    for _ in range(FETCH_TXNS):
        producer.begin_transaction()
        produce_values(producer, "mixed", values)
        if rng.random() < ABORTED:
            producer.flush(60)  # in the log, then aborted
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
            committed += PER_TXN
    return committed


def fetch_all(bootstrap: str, level: str) -> int:
    """Every record of `mixed` a consumer at `level` reads, from the start to the end."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{level}",
                            "isolation.level": level, "enable.partition.eof": True,
                            "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                            "max.partition.fetch.bytes": 16 << 20})  # fmt: skip
    try:
        consumer.assign([ck.TopicPartition("mixed", 0, 0)])
        got = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            batch = consumer.consume(10_000, 1.0)
            for m in batch:
                if m.error() is not None:
                    return got
                got += 1
        raise AssertionError("the consumer did not reach the end")
    finally:
        consumer.close()


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_read_committed_fetch(
    benchmark: BenchmarkFixture, server: Served, aborted_log: int, level: str
) -> None:
    """The whole log of `mixed` (200,000 x 1 KiB, a tenth aborted) at each isolation level."""
    want = aborted_log if level == "read_committed" else FETCH_TXNS * PER_TXN
    benchmark.group = "txn-fetch-1KiB"
    record(benchmark, f"txn/fetch/1KiB/{level}", nbytes=want * SIZE, messages=want)
    counts: list[int] = []
    benchmark.pedantic(lambda: counts.append(fetch_all(server.bootstrap, level)), rounds=ROUNDS,
                       warmup_rounds=1, iterations=1)  # fmt: skip
    assert set(counts) == {want}
