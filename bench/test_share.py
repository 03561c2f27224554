"""Share groups (issue 21): four share members on one partition against one consumer-group
member on the same partition, the same 50,000 messages, each side committing after every
batch of 100 (an fdatasync per commit on both sides), side by side in one run.

`share/4-members`: four members in four threads, implicit acknowledgement, poll(100) then
commit() until the group's backlog is empty; `share/4-members-explicit`: the same with an
acknowledge() call per record; `share/1-member`: one share member, for the cost of the model
without concurrency; `share/classic`: a consumer group member, poll(100) then commit().
Each round uses a new group, so it consumes the whole topic from offset 0. `messages` is what
one round accepts (the whole log), so msgs/s is the aggregate accepted rate.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest
from benchdata import record
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore
from mqcore.consume.share import ShareConsumer

TOPIC = "jobs"
MESSAGES = 50_000
BATCH = 100
VALUE = b"j" * 200
ROUNDS = 3
_names = itertools.count()


@pytest.fixture(scope="module")
def share_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mqcore.Store]:
    store = mqcore.open(str(tmp_path_factory.mktemp("share")), flush="os")
    try:
        store.create_topic(TOPIC)
        for _ in range(MESSAGES // 1000):
            store.append_batch(TOPIC, [VALUE] * 1000)
        yield store
    finally:
        store.close()


def classic(store: mqcore.Store) -> int:
    n = 0
    with store.consumer(f"classic-{next(_names)}", TOPIC) as c:
        while n < MESSAGES:
            n += len(c.poll(BATCH))
            c.commit()
    return n


def shared(store: mqcore.Store, members: int, explicit: bool) -> int:
    group = f"share-{next(_names)}"
    counts = [0] * members
    errors: list[BaseException] = []

    def member(i: int, sc: ShareConsumer) -> None:
        try:
            while True:
                msgs = sc.poll(BATCH)
                if not msgs:
                    (lag,) = store.share_group_lag(group)[group]
                    if lag.available == 0 and lag.in_flight == 0:
                        return
                    continue
                if explicit:
                    for m in msgs:
                        sc.acknowledge(m, "accept")
                counts[i] += len(msgs)
                sc.commit()
        except BaseException as e:  # pragma: no cover - reported by the caller
            errors.append(e)

    consumers = [store.share_consumer(group, TOPIC, explicit_ack=explicit) for _ in range(members)]
    threads = [threading.Thread(target=member, args=(i, sc)) for i, sc in enumerate(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sc in consumers:
        sc.close()
    assert not errors, errors
    return sum(counts)


def test_share_classic(benchmark: BenchmarkFixture, share_store: mqcore.Store) -> None:
    record(benchmark, "share/classic", messages=MESSAGES)
    benchmark.group = "share"
    got = benchmark.pedantic(classic, args=(share_store,), rounds=ROUNDS, iterations=1)
    assert got == MESSAGES


@pytest.mark.parametrize(("members", "explicit"), [(4, False), (4, True), (1, False)])
def test_share_members(
    benchmark: BenchmarkFixture, share_store: mqcore.Store, members: int, explicit: bool
) -> None:
    name = f"share/{members}-member{'s' if members > 1 else ''}{'-explicit' if explicit else ''}"
    record(benchmark, name, messages=MESSAGES)
    benchmark.group = "share"
    got = benchmark.pedantic(
        shared, args=(share_store, members, explicit), rounds=ROUNDS, iterations=1
    )
    assert got == MESSAGES
