"""Kafka's transactions over the wire (issue 34): `mqcore serve` as the transaction
coordinator of unmodified transactional producers (confluent-kafka/librdkafka, kafka-python,
aiokafka): commit and abort, a read_committed consumer seeing exactly the committed records
and a read_uncommitted one all of them, neither a marker; fencing of a zombie by a new
session; a transaction that outlives transaction.timeout.ms aborted by the coordinator;
consume-transform-produce with send_offsets_to_transaction (the group's offsets committed with
the transaction, not with an aborted one); KIP-890's refusal of a produce outside the
producer's open transaction; the coordinator's state across a restart and across a SIGKILL
between its decision and the markers (crash points); DescribeTransactions/ListTransactions.
"""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterprocs import until
from conftest import child_env
from kafkaclients import KioWire
from zkserver import free_port

import mqcore

WAIT = 60.0


def confluent_producer(bootstrap: str, tid: str, **extra: Any) -> Any:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **extra})
    p.init_transactions(WAIT)
    return p


def consume_all(bootstrap: str, topic: str, partitions: int, level: str) -> list[tuple]:
    """Every record a consumer at `level` reads from the start to each partition's end."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{level}-{time.time()}",
                  "isolation.level": level, "enable.partition.eof": True,
                  "enable.auto.commit": False})  # fmt: skip
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple] = []
        ended: set[int] = set()
        deadline = time.monotonic() + WAIT
        while len(ended) < partitions and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                ended.add(m.partition())
                continue
            got.append((m.partition(), m.offset(), m.value()))
        assert len(ended) == partitions, "the consumer did not reach every partition's end"
        return got
    finally:
        c.close()


def values(records: list[tuple]) -> list[bytes]:
    return sorted(v for _, _, v in records)


def test_confluent_commit_and_abort_seen_by_each_isolation_level(
    store: mqcore.Store, kafka_server: Any
) -> None:
    store.create_topic("out", partitions=2)
    p = confluent_producer(kafka_server.bootstrap, "tx")
    p.begin_transaction()
    for i in range(20):
        p.produce("out", b"kept-%d" % i, partition=i % 2)
    p.commit_transaction(WAIT)
    p.begin_transaction()
    for i in range(10):
        p.produce("out", b"dropped-%d" % i, partition=i % 2)
    p.flush(WAIT)  # in the log before the abort
    p.abort_transaction(WAIT)
    p.begin_transaction()
    p.produce("out", b"after", partition=0)
    p.commit_transaction(WAIT)
    kept = sorted([b"kept-%d" % i for i in range(20)] + [b"after"])
    dropped = sorted(b"dropped-%d" % i for i in range(10))
    assert values(consume_all(kafka_server.bootstrap, "out", 2, "read_committed")) == kept
    assert values(consume_all(kafka_server.bootstrap, "out", 2, "read_uncommitted")) == sorted(
        kept + dropped)  # fmt: skip
    # the store's own readers agree, and no reader sees a marker
    for part in range(2):
        got = store.read("out", part, 0, 1000, isolation_level="read_committed")
        assert all(m.value.startswith((b"kept", b"after")) for m in got)
        assert store.last_stable_offset("out", part) == store.end_offset("out", part)


def test_an_open_transaction_holds_the_last_stable_offset(
    store: mqcore.Store, kafka_server: Any
) -> None:
    store.create_topic("out")
    p = confluent_producer(kafka_server.bootstrap, "tx")
    p.begin_transaction()
    p.produce("out", b"open", partition=0)
    p.flush(WAIT)
    assert store.end_offset("out", 0) == 1 and store.last_stable_offset("out", 0) == 0
    assert consume_all(kafka_server.bootstrap, "out", 1, "read_committed") == []
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_uncommitted")) == [b"open"]
    p.commit_transaction(WAIT)
    assert store.last_stable_offset("out", 0) == 2  # the record and the COMMIT marker
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_committed")) == [b"open"]


def test_a_new_session_fences_the_zombie(store: mqcore.Store, kafka_server: Any) -> None:
    from confluent_kafka import KafkaException

    store.create_topic("out")
    zombie = confluent_producer(kafka_server.bootstrap, "tx")
    zombie.begin_transaction()
    zombie.produce("out", b"zombie", partition=0)
    zombie.flush(WAIT)
    fresh = confluent_producer(kafka_server.bootstrap, "tx")  # aborts the zombie's
    fresh.begin_transaction()
    fresh.produce("out", b"fresh", partition=0)
    fresh.commit_transaction(WAIT)
    with pytest.raises(KafkaException) as refused:
        zombie.produce("out", b"late", partition=0)
        zombie.commit_transaction(WAIT)
    assert refused.value.args[0].fatal() or "fenced" in str(refused.value).lower()
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_committed")) == [b"fresh"]


def test_a_transaction_past_its_timeout_is_aborted(store: mqcore.Store, kafka_server: Any) -> None:
    store.create_topic("out")
    p = confluent_producer(kafka_server.bootstrap, "slow", **{"transaction.timeout.ms": 1500})
    p.begin_transaction()
    p.produce("out", b"late", partition=0)
    p.flush(WAIT)
    assert store.last_stable_offset("out", 0) == 0
    until(lambda: store.last_stable_offset("out", 0) == 2, "the coordinator's abort")
    assert consume_all(kafka_server.bootstrap, "out", 1, "read_committed") == []
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_uncommitted")) == [b"late"]


def test_consume_transform_produce_commits_offsets_with_the_transaction(
    store: mqcore.Store, kafka_server: Any
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    store.create_topic("in")
    store.create_topic("out")
    for i in range(10):
        store.append("in", b"n%d" % i)
    p = confluent_producer(kafka_server.bootstrap, "copier")
    c = Consumer({"bootstrap.servers": kafka_server.bootstrap, "group.id": "copy",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})  # fmt: skip
    try:
        c.assign([TopicPartition("in", 0, 0)])
        seen = []
        deadline = time.monotonic() + WAIT
        while len(seen) < 10 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                seen.append(m)
        assert len(seen) == 10
        for abort in (True, False):  # the first try is aborted: nothing of it stays
            p.begin_transaction()
            for m in seen[:6]:
                p.produce("out", m.value().upper(), partition=0)
            p.send_offsets_to_transaction([TopicPartition("in", 0, 6)],
                                          c.consumer_group_metadata(), WAIT)  # fmt: skip
            if abort:
                p.flush(WAIT)
                p.abort_transaction(WAIT)
                assert c.committed([TopicPartition("in", 0)], WAIT)[0].offset < 0
            else:
                p.commit_transaction(WAIT)
        assert c.committed([TopicPartition("in", 0)], WAIT)[0].offset == 6
    finally:
        c.close()
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_committed")) == sorted(
        b"N%d" % i for i in range(6))  # fmt: skip


def test_kafka_python_transactions(store: mqcore.Store, kafka_server: Any) -> None:
    from kafka import KafkaProducer

    store.create_topic("out")
    p = KafkaProducer(bootstrap_servers=kafka_server.bootstrap, transactional_id="kp")
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("out", b"kp-kept", partition=0)
        p.commit_transaction()
        p.begin_transaction()
        p.send("out", b"kp-dropped", partition=0)
        p.flush()
        p.abort_transaction()
    finally:
        p.close()
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_committed")) == [b"kp-kept"]
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_uncommitted")) == [
        b"kp-dropped", b"kp-kept"]  # fmt: skip


def test_aiokafka_transactions(store: mqcore.Store, kafka_server: Any) -> None:
    from aiokafka import AIOKafkaProducer

    store.create_topic("out")

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap, transactional_id="ak")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait("out", b"ak-kept", partition=0)
            await p.begin_transaction()
            await p.send_and_wait("out", b"ak-dropped", partition=0)
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())
    assert values(consume_all(kafka_server.bootstrap, "out", 1, "read_committed")) == [b"ak-kept"]


def test_a_produce_outside_the_open_transaction_is_refused(
    store: mqcore.Store, kafka_server: Any
) -> None:
    """KIP-890's verification: a transactional batch for a partition the transaction did not
    add (or after it ended) is refused with INVALID_TXN_STATE, nothing written."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kio.schema.errors import ErrorCode

    store.create_topic("out")
    wire = KioWire(("127.0.0.1", kafka_server.port))
    try:
        init = wire.call(22, 4, transactional_id="raw",
                         transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                         producer_epoch=-1)  # fmt: skip
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                      producer_id=pid, producer_epoch=epoch, base_sequence=0,
                                      batch_size=1 << 20)  # fmt: skip
        b.append(0, timestamp=int(time.time() * 1000), key=None, value=b"x", headers=[])
        records = bytes(b.build())
        from kio.index import load_payload_module
        from kio.static.constants import EntityType

        m = load_payload_module(0, 9, EntityType.request)
        answer = wire.call(0, 9, transactional_id="raw", acks=-1,
                           timeout=datetime.timedelta(seconds=10),
                           topic_data=(m.TopicProduceData(name="out", partition_data=(
                               m.PartitionProduceData(index=0, records=records),)),))  # fmt: skip
        code = answer.responses[0].partition_responses[0].error_code
        assert code == ErrorCode.invalid_txn_state
        assert store.end_offset("out", 0) == 0
    finally:
        wire.close()


def test_describe_and_list_transactions(store: mqcore.Store, kafka_server: Any) -> None:
    from kio.schema.errors import ErrorCode

    store.create_topic("out", partitions=2)
    p = confluent_producer(kafka_server.bootstrap, "described")
    p.begin_transaction()
    p.produce("out", b"x", partition=1)
    p.flush(WAIT)
    wire = KioWire(("127.0.0.1", kafka_server.port))
    try:
        described = wire.call(65, 0, transactional_ids=("described", "nobody"))
        found, missing = described.transaction_states
        assert found.error_code == ErrorCode.none and found.transaction_state == "Ongoing"
        assert [(t.topic, list(t.partitions)) for t in found.topics] == [("out", [1])]
        assert missing.error_code == ErrorCode.transactional_id_not_found
        listed = wire.call(66, 1, state_filters=("Ongoing",), producer_id_filters=(),
                           duration_filter=-1)  # fmt: skip
        assert [t.transactional_id for t in listed.transaction_states] == ["described"]
    finally:
        wire.close()
    p.commit_transaction(WAIT)


# -- the coordinator's state across a restart and a kill -----------------------------------------


def serve(path: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "mqcore.cli", "serve", path, "--create",
                             "--listen", f"127.0.0.1:{port}"],
                            env=env or child_env(), stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "serving" in line, line
    return proc


def stop(proc: subprocess.Popen[str], kill: bool = False) -> int:
    """End a served process (SIGKILL with `kill`, else SIGTERM) and close its pipe."""
    if proc.poll() is None:
        proc.kill() if kill else proc.terminate()
    code = proc.wait(WAIT)
    assert proc.stdout is not None
    proc.stdout.close()
    return code


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, int]]:
    path = str(tmp_path / "store")
    with mqcore.open(path, create=True) as s:
        s.create_topic("out", partitions=2)
    yield path, free_port()


@pytest.mark.parametrize("point", ["kafka_txn.after_prepare", "kafka_txn.after_marker"])
def test_a_commit_killed_after_its_decision_is_completed_at_restart(
    served: tuple[str, int], point: str
) -> None:
    """The server is SIGKILLed (a crash point) after the commit decision is durable: at
    restart the coordinator writes the rest of the markers, so the transaction is committed
    on every partition and the producer's next session continues it."""
    path, port = served
    env = {**child_env(), "MQCORE_CRASH_AT": point}
    proc = serve(path, port, env)
    try:
        p = confluent_producer(f"127.0.0.1:{port}", "tx", **{"message.timeout.ms": 5000})
        p.begin_transaction()
        for i in range(6):
            p.produce("out", b"c%d" % i, partition=i % 2)
        p.flush(WAIT)
        with pytest.raises(Exception):  # noqa: B017 (the broker dies under the commit)
            p.commit_transaction(5)
        assert proc.wait(WAIT) != 0
    finally:
        stop(proc, kill=True)
    proc = serve(path, port)
    try:
        bootstrap = f"127.0.0.1:{port}"
        got = values(consume_all(bootstrap, "out", 2, "read_committed"))
        assert got == sorted(b"c%d" % i for i in range(6))
        again = confluent_producer(bootstrap, "tx")
        again.begin_transaction()
        again.produce("out", b"next", partition=0)
        again.commit_transaction(WAIT)
        assert b"next" in values(consume_all(bootstrap, "out", 2, "read_committed"))
    finally:
        stop(proc)
    with mqcore.open(path, read_only=True) as s:
        for part in range(2):
            assert s.last_stable_offset("out", part) == s.end_offset("out", part)


def test_an_open_transaction_across_a_restart_is_aborted_by_the_next_session(
    served: tuple[str, int],
) -> None:
    path, port = served
    proc = serve(path, port)
    bootstrap = f"127.0.0.1:{port}"
    try:
        p = confluent_producer(bootstrap, "tx")
        p.begin_transaction()
        p.produce("out", b"left-open", partition=0)
        p.flush(WAIT)
    finally:
        stop(proc, kill=True)
    proc = serve(path, port)
    try:
        assert consume_all(bootstrap, "out", 2, "read_committed") == []
        fresh = confluent_producer(bootstrap, "tx")  # the next session aborts the last
        fresh.begin_transaction()
        fresh.produce("out", b"fresh", partition=0)
        fresh.commit_transaction(WAIT)
        assert values(consume_all(bootstrap, "out", 2, "read_committed")) == [b"fresh"]
        assert values(consume_all(bootstrap, "out", 2, "read_uncommitted")) == [
            b"fresh", b"left-open"]  # fmt: skip
    finally:
        stop(proc)


def test_bad_transactional_requests_get_kafkas_errors_and_ids_are_bounded(
    store: mqcore.Store, kafka_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kio.schema.errors import ErrorCode

    from mqcore.server import transactions

    monkeypatch.setattr(transactions, "MAX_TRANSACTIONAL_IDS", 3)
    store.create_topic("out")
    minute = datetime.timedelta(seconds=60)
    wire = KioWire(("127.0.0.1", kafka_server.port))
    try:
        inits = [wire.call(22, 4, transactional_id=f"t{i}", transaction_timeout=minute,
                           producer_id=-1, producer_epoch=-1) for i in range(4)]  # fmt: skip
        assert [i.error_code for i in inits] == [ErrorCode.none] * 3 + [ErrorCode.invalid_request]
        again = wire.call(22, 4, transactional_id="t0", transaction_timeout=minute,
                          producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert again.error_code == ErrorCode.none and again.producer_epoch == 1
        too_long = wire.call(22, 4, transactional_id="t1",
                             transaction_timeout=datetime.timedelta(hours=1), producer_id=-1,
                             producer_epoch=-1)  # fmt: skip
        assert too_long.error_code == ErrorCode.invalid_transaction_timeout
        pid = inits[1].producer_id
        unknown = wire.call(26, 4, transactional_id="nobody", producer_id=pid, producer_epoch=0,
                            committed=True)  # fmt: skip
        assert unknown.error_code == ErrorCode.invalid_producer_id_mapping
        stale = wire.call(26, 4, transactional_id="t0", producer_id=inits[0].producer_id,
                          producer_epoch=0, committed=True)  # fmt: skip
        assert stale.error_code == ErrorCode.producer_fenced  # t0 is at epoch 1 now
        from kio.index import load_payload_module
        from kio.static.constants import EntityType

        m = load_payload_module(28, 3, EntityType.request)
        part = m.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=1,
                                                 committed_leader_epoch=-1,
                                                 committed_metadata=None)  # fmt: skip
        topic = m.TxnOffsetCommitRequestTopic(name="out", partitions=(part,))
        offsets = wire.call(28, 3, transactional_id="t1", group_id="g", producer_id=pid,
                            producer_epoch=0, generation_id=-1, member_id="",
                            group_instance_id=None, topics=(topic,))  # fmt: skip
        assert offsets.topics[0].partitions[0].error_code == ErrorCode.invalid_txn_state
    finally:
        wire.close()


STUCK = 8.0  # seconds without a commit after which the test's supervisor restarts the copier
COPIER = r"""
import sys
from confluent_kafka import Consumer, Producer, TopicPartition, KafkaException

bootstrap, partitions = sys.argv[1], int(sys.argv[2])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "copier", "enable.auto.commit": False,
              "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
tps = [TopicPartition("in", p) for p in range(partitions)]
start = c.committed(tps, 30)
c.assign([TopicPartition("in", t.partition, max(t.offset, 0)) for t in start])
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "copier-tx",
              "transaction.timeout.ms": 10000, "linger.ms": 5, "debug": "eos"})
p.init_transactions(30)
print("ready", flush=True)
while True:
    msgs = [m for m in c.consume(200, 0.5) if m.error() is None]
    if not msgs:
        continue
    p.begin_transaction()
    for m in msgs:
        p.produce("out", b"copy-" + m.value(), partition=m.partition())
    positions = c.position(tps)
    p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
    p.commit_transaction(30)
"""


class Copier:
    """The COPIER process against `bootstrap`, as a supervisor keeps it: `committed()` is the
    group's committed input offsets (-1 while its coordinator moves); `progressed(before)`
    says whether they passed `before`, and starts the copier again when it died (a
    transactional client's errors are fatal) or made no progress for STUCK seconds
    (librdkafka, its broker killed under a request, can wait on it for good); `kill()`."""

    def __init__(self, bootstrap: str, partitions: int, log: Path):
        self.bootstrap, self.partitions, self.log = bootstrap, partitions, log
        self.proc = self._start()
        self.seen_at, self.seen = time.monotonic(), 0

    def _start(self) -> subprocess.Popen[str]:
        with open(self.log, "a") as err:  # what the copier's client said, for a failure's report
            return subprocess.Popen([sys.executable, "-c", COPIER, self.bootstrap,
                                     str(self.partitions)], env=child_env(),
                                    stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip

    def committed(self) -> int:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "copier"})
        try:
            got = c.committed([TopicPartition("in", p) for p in range(self.partitions)], 10)
            return sum(max(t.offset, 0) for t in got)
        except KafkaException:  # the server is starting again, or the coordinator moving
            return -1
        finally:
            c.close()

    def progressed(self, before: int) -> bool:
        now, done = time.monotonic(), self.committed()
        if done > self.seen:
            self.seen_at, self.seen = now, done
        if self.proc.poll() is not None or now - self.seen_at > STUCK:
            self.kill()
            self.seen_at = now
        return done > before

    def kill(self) -> None:
        """SIGKILL the copier and start it again."""
        stop(self.proc, kill=True)
        self.proc = self._start()

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-40:])


@pytest.mark.slow
def test_consume_transform_produce_is_exactly_once_while_processes_are_killed(
    tmp_path: Path,
) -> None:
    """Issue 34's exactly-once proof on one node: a confluent-kafka consume-transform-produce
    loop (read_committed consumer, transactional producer, send_offsets_to_transaction) copies
    100,000 numbered messages from `in` to `out` while the test SIGKILLs the loop's process or
    the server, 30 times at random moments, restarting what it killed; `out` read
    read_committed holds every input message exactly once, in order per partition."""
    import random

    rng = random.Random(34)
    path, port, partitions, total = str(tmp_path / "store"), free_port(), 2, 100_000
    with mqcore.open(path, create=True, flush="os") as s:
        s.create_topic("in", partitions=partitions)
        s.create_topic("out", partitions=partitions)
        for p in range(partitions):
            numbers = range(p, total, partitions)
            for chunk in range(0, len(numbers), 10_000):
                s.append_batch("in", [b"%06d" % n for n in numbers[chunk:chunk + 10_000]],
                               partition=p)  # fmt: skip
    bootstrap = f"127.0.0.1:{port}"
    server = serve(path, port)
    copier = Copier(bootstrap, partitions, tmp_path / "copier.log")
    kills = {"copier": 0, "server": 0}
    try:
        for _ in range(30):
            before = copier.committed()
            try:
                until(lambda before=before: before >= total or copier.progressed(before),
                      "the copier to commit again", timeout=120)  # fmt: skip
            except AssertionError as e:
                raise AssertionError(
                    f"{e}; committed {before}; the copier's log:\n{copier.tail()}"
                ) from None
            time.sleep(rng.uniform(0, 0.4))  # a random moment of the loop's work
            victim = rng.choice(["copier", "copier", "server"])
            kills[victim] += 1
            if victim == "server":
                stop(server, kill=True)
                server = serve(path, port)
            else:
                copier.kill()
        until(lambda: copier.progressed(total - 1) and copier.committed() >= total,
              "every input message copied", timeout=300)  # fmt: skip
    finally:
        stop(copier.proc, kill=True)
        stop(server)
    assert kills["server"] >= 5 and kills["copier"] >= 5
    with mqcore.open(path, read_only=True) as s:
        for p in range(partitions):
            got = s.read("out", p, 0, 10 * total, isolation_level="read_committed")
            out = [m.value for m in got]
            want = [b"copy-%06d" % n for n in range(p, total, partitions)]
            if out != want:
                short = min(len(out), len(want))
                first = next((i for i in range(short) if out[i] != want[i]), short)
                raise AssertionError(
                    f"partition {p}: {len(out)} copies for {len(want)} inputs, "
                    f"{len(out) - len(set(out))} doubled, {len(set(want) - set(out))} missing; "
                    f"first difference at {first}: {out[first - 2 : first + 3]} vs "
                    f"{want[first - 2 : first + 3]}; at offsets "
                    f"{[m.offset for m in got[first - 2 : first + 3]]}"
                )
            every = s.read("out", p, 0, 10 * total)  # aborted copies are there, not counted
            assert len(every) >= len(out)


def test_a_restart_between_txn_offset_commit_and_end_txn_keeps_the_offsets(
    served: tuple[str, int],
) -> None:
    """Regression (found by the exactly-once test above): the offsets TxnOffsetCommit gives
    were held in memory until EndTxn, so a server restarted in between committed the
    transaction's records without them, and the restarted consumer copied them again. Now
    the group's coordinator holds them in `__consumer_offsets` (durable before the answer):
    the server SIGKILLed after TxnOffsetCommit, the commit after its restart commits them;
    the aborted transaction's offsets are dropped."""
    from kio.index import load_payload_module
    from kio.schema.errors import ErrorCode
    from kio.static.constants import EntityType

    path, port = served
    m = load_payload_module(28, 3, EntityType.request)

    def offsets(offset: int) -> tuple[Any, ...]:
        return (m.TxnOffsetCommitRequestTopic(name="out", partitions=(
            m.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                              committed_leader_epoch=-1,
                                              committed_metadata=""),)),)  # fmt: skip

    def session(wire: KioWire) -> tuple[int, int]:
        init = wire.call(22, 4, transactional_id="tx",
                         transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                         producer_epoch=-1)  # fmt: skip
        assert init.error_code == ErrorCode.none
        return init.producer_id, init.producer_epoch

    def txn_offsets(wire: KioWire, pid: int, epoch: int, offset: int) -> None:
        added = wire.call(25, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch,
                          group_id="g")  # fmt: skip
        assert added.error_code == ErrorCode.none
        kept = wire.call(28, 3, transactional_id="tx", group_id="g", producer_id=pid,
                         producer_epoch=epoch, generation_id=-1, member_id="",
                         group_instance_id=None, topics=offsets(offset))  # fmt: skip
        assert kept.topics[0].partitions[0].error_code == ErrorCode.none

    proc = serve(path, port)
    try:
        wire = KioWire(("127.0.0.1", port))
        pid, epoch = session(wire)
        txn_offsets(wire, pid, epoch, 7)
        wire.close()
        stop(proc, kill=True)
        proc = serve(path, port)
        wire = KioWire(("127.0.0.1", port))
        ended = wire.call(26, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch,
                          committed=True)  # fmt: skip
        assert ended.error_code == ErrorCode.none
        pid, epoch = session(wire)  # a new session: its aborted offsets never count
        txn_offsets(wire, pid, epoch, 99)
        ended = wire.call(26, 3, transactional_id="tx", producer_id=pid, producer_epoch=epoch,
                          committed=False)  # fmt: skip
        assert ended.error_code == ErrorCode.none
        wire.close()
    finally:
        stop(proc)
    with mqcore.open(path) as s:  # the server is stopped
        got = s.offset_store().committed("g", "out", 0)
        assert got is not None and got.offset == 7
