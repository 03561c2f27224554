"""Consume throughput (issue 4): a group consumer's poll loop over 200k messages without a
filter, with a tag filter and with a SQL92 filter, against a plain `Store.read()` loop and
against a read loop that filters in Python.

Every message carries a tag (one in four is "red", one in 1000 "rare") and a property `region`
(one in four is 'eu'), so the tag and SQL92 filters match 25 %, the sparse tag filter 0.1 %.
Each round consumes the whole topic from offset 0 (a seek); `messages` is the number of
messages in the log, so msgs/s and MB/s say how fast the log is consumed, whatever the filter
keeps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from benchdata import record
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore
from mqcore.consume.consumer import Consumer
from mqcore.query.engine import selector_view
from mqcore.query.selector import compile_selector

TOPIC = "events"
MESSAGES = 200_000
BATCH = 1000
VALUE_BYTES = 200
CHUNK = 1000  # max_records of a poll, max_records of a read
REGIONS = ("eu", "us", "apac", "latam")
WHERE = "region = 'eu'"
# three predicates over two properties and the tag (numeric coercion, IN, string test); on this
# data it keeps the same 25 % as WHERE (region 'eu' is every fourth message, all with n < 10^6)
WHERE3 = "region IN ('eu', 'mars') AND n BETWEEN 0 AND 999999 AND NOT TAGS STARTSWITH 'x'"
RARE = 1000  # one message in RARE has the tag "rare"


@dataclass
class ConsumeData:
    store: mqcore.Store
    log_bytes: int
    matches: int  # messages each filter keeps


@pytest.fixture(scope="module")
def consume_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsumeData]:
    store = mqcore.open(str(tmp_path_factory.mktemp("consume")), flush="os")
    try:
        store.create_topic(TOPIC)
        value = b"x" * VALUE_BYTES
        for b in range(MESSAGES // BATCH):
            idx = range(b * BATCH, (b + 1) * BATCH)
            store.append_batch(
                TOPIC,
                [value] * BATCH,
                tags=["red" if i % 4 == 0 else "rare" if i % RARE == 1 else "blue" for i in idx],
                properties=[{"region": REGIONS[i % 4 if i % 8 else 0], "n": str(i)} for i in idx],
            )
        logs = os.path.join(store.path, f"{TOPIC}-0")
        size = sum(
            os.path.getsize(os.path.join(logs, n)) for n in os.listdir(logs) if n.endswith(".log")
        )
        yield ConsumeData(store, size, MESSAGES // 4)
    finally:
        store.close()


def consume_all(consumer: Consumer) -> int:
    consumer.seek(0, 0)
    n = 0
    while True:
        msgs = consumer.poll(CHUNK)
        n += len(msgs)
        if not msgs and consumer.position(0) >= MESSAGES:
            return n


def run_poll(
    benchmark: BenchmarkFixture, data: ConsumeData, side: str, expect: int, **filters: str
) -> None:
    consumer = data.store.consumer(f"bench-{side}", TOPIC, **filters)
    try:
        record(benchmark, f"consume/{side}", nbytes=data.log_bytes, messages=MESSAGES)
        benchmark.group = "consume"
        got = benchmark.pedantic(
            consume_all, args=(consumer,), rounds=5, warmup_rounds=1, iterations=1
        )
        assert got == expect
    finally:
        consumer.close()


def test_consume_poll(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """poll(1000) loop, no filter: every message becomes a Message."""
    run_poll(benchmark, consume_data, "poll", MESSAGES)


def test_consume_poll_tag(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """poll(1000) loop with tag="red": the kernel passes over the other tags undecoded."""
    run_poll(benchmark, consume_data, "poll-tag", consume_data.matches, tag="red")


def test_consume_poll_tag_sparse(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """poll(1000) loop with tag="rare" (0.1 %): the tag column names the 200 batches to read."""
    run_poll(benchmark, consume_data, "poll-tag-sparse", MESSAGES // RARE, tag="rare")


def test_consume_poll_sql(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """poll(1000) loop with where="region = 'eu'": every message is decoded and tested."""
    run_poll(benchmark, consume_data, "poll-sql", consume_data.matches, where=WHERE)


def test_consume_poll_sql3(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """poll(1000) loop with the three-predicate WHERE3 (same 25 %)."""
    run_poll(benchmark, consume_data, "poll-sql3", consume_data.matches, where=WHERE3)


def search_all(store: mqcore.Store) -> int:
    return len(store.search(TOPIC, where=WHERE, limit=MESSAGES).messages)


def test_consume_search_sql(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """Store.search(where="region = 'eu'") over the whole topic: the query engine's scan."""
    record(benchmark, "consume/search-sql", nbytes=consume_data.log_bytes, messages=MESSAGES)
    benchmark.group = "consume"
    got = benchmark.pedantic(
        search_all, args=(consume_data.store,), rounds=5, warmup_rounds=1, iterations=1
    )
    assert got == consume_data.matches


def read_loop(store: mqcore.Store, keep: Callable[[mqcore.Message], bool] | None = None) -> int:
    offset, n = 0, 0
    while True:
        msgs = store.read(TOPIC, 0, offset, CHUNK)
        if not msgs:
            return n
        n += len(msgs) if keep is None else sum(1 for m in msgs if keep(m))
        offset = msgs[-1].offset + 1


def run_read(
    benchmark: BenchmarkFixture,
    data: ConsumeData,
    side: str,
    expect: int,
    keep: Callable[[mqcore.Message], bool] | None,
) -> None:
    record(benchmark, f"consume/{side}", nbytes=data.log_bytes, messages=MESSAGES)
    benchmark.group = "consume"
    got = benchmark.pedantic(
        read_loop, args=(data.store, keep), rounds=5, warmup_rounds=1, iterations=1
    )
    assert got == expect


def test_consume_read(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """Store.read(topic, 0, offset, 1000) loop: the baseline without groups or filters."""
    run_read(benchmark, consume_data, "read", MESSAGES, None)


def test_consume_read_python_tag(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """Store.read() loop keeping m.tag == "red" in Python."""
    run_read(
        benchmark, consume_data, "read-python-tag", consume_data.matches, lambda m: m.tag == "red"
    )


def test_consume_read_python_sql(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """Store.read() loop testing the compiled selector in Python."""
    sel = compile_selector(WHERE)
    run_read(
        benchmark,
        consume_data,
        "read-python-sql",
        consume_data.matches,
        lambda m: sel.matches(selector_view(m)),
    )


def test_consume_read_python_sql3(benchmark: BenchmarkFixture, consume_data: ConsumeData) -> None:
    """Store.read() loop testing the compiled three-predicate selector in Python."""
    sel = compile_selector(WHERE3)
    run_read(
        benchmark,
        consume_data,
        "read-python-sql3",
        consume_data.matches,
        lambda m: sel.matches(selector_view(m)),
    )
