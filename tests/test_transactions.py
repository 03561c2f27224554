"""Transactional (half) messages: visibility, state errors, check-back, and crash recovery with
a child process SIGKILLed before and at every step of commit (consume/transactions.py)."""

from __future__ import annotations

import itertools
import json
import textwrap
import time
from collections import Counter

import pytest
from conftest import plain_partition
from crashchild import KILLED, run_child

import mqcore
from mqcore.errors import (
    InternalTopicError,
    InvalidConfigError,
    InvalidRecordError,
    ReadOnlyStoreError,
    TransactionStateError,
)
from mqcore.produce.transactions import HALF_TOPIC, OP_TOPIC, TransactionInfo

QUIET = {"flush": "os", "transaction_check_interval_ms": 0, "delay_tick_ms": 0}


def open_store(path: str, **options: object) -> mqcore.Store:
    return mqcore.open(path, **{**QUIET, **options})


def uids_in(store: mqcore.Store, topic: str) -> Counter[str | None]:
    return Counter(
        m.unique_id
        for p in store.available_partitions(topic)
        for m in store.read(topic, p, 0, 10_000)
    )


def test_committed_messages_become_visible_with_their_ids_and_fields(store_path):
    with open_store(store_path) as store:
        store.create_topic("t", partitions=3)
        txn = store.begin("order-1")
        a = txn.append("t", b"v1", key=b"k1", headers={"h": b"1"}, tag="TagA",
                       properties={"n": 7}, keys="x y", timestamp=1234)  # fmt: skip
        other = (a.partition + 1) % 3
        more = txn.append_batch("t", [b"v2", b"v3"], partition=other)
        assert a.offset is None and a.msg_id is None and a.kind == "half"
        assert all(store.end_offset("t", p) == 0 for p in range(3))
        assert store.find_by_unique_id(a.unique_id).messages == []
        results = txn.commit()
        assert txn.state == "committed"
        assert sum(r.count for r in results) == 3
        (m,) = store.find_by_unique_id(a.unique_id).messages
        assert (m.topic, m.partition, m.value, m.key, m.timestamp) == (
            "t", a.partition, b"v1", b"k1", 1234)  # fmt: skip
        assert a.partition == plain_partition(store, b"k1", 3)
        assert [(k, v) for k, v in m.headers if k != "uid"] == [
            ("h", b"1"), ("tag", b"TagA"), ("n", b"7"), ("keys", b"x y")]  # fmt: skip
        assert store.find_by_key("t", b"y").messages[0].unique_id == a.unique_id
        assert [x.value for x in store.read("t", other, 0, 10)] == [b"v2", b"v3"]
        assert [x.unique_id for x in store.read("t", other, 0, 10)] == [p.unique_id for p in more]
    with open_store(store_path) as store:  # and after a reopen, exactly once
        assert uids_in(store, "t") == Counter([a.unique_id] + [p.unique_id for p in more])
        assert store.check_transactions(now=2**50) == {}


def test_rolled_back_messages_are_never_visible(store_path):
    with open_store(store_path) as store:
        store.create_topic("t")
        txn = store.begin()
        md = txn.append("t", b"secret")
        txn.rollback()
        assert txn.state == "rolled_back"
        assert store.end_offset("t") == 0
        assert store.find_by_unique_id(md.unique_id).messages == []
        assert store.end_offset(HALF_TOPIC) == 1  # parked, invisible to the real topic
    with open_store(store_path) as store:
        store.set_transaction_checker(lambda info: pytest.fail("resolved: never checked"))
        assert store.check_transactions(now=2**50) == {}
        assert store.end_offset("t") == 0


def test_context_manager_commits_on_success_and_rolls_back_on_error(store):
    store.create_topic("t")
    with store.begin() as ok:
        ok.append("t", b"kept")
    assert ok.state == "committed"
    with pytest.raises(ZeroDivisionError), store.begin() as bad:
        bad.append("t", b"dropped")
        1 / 0  # noqa: B018
    assert bad.state == "rolled_back"
    assert [m.value for m in store.read("t", 0, 0, 10)] == [b"kept"]


def test_state_errors(store):
    store.create_topic("t")
    txn = store.begin("T1")
    txn.append("t", b"a")
    txn.commit()
    for call in (lambda: txn.append("t", b"b"), txn.commit, txn.rollback):
        with pytest.raises(TransactionStateError, match="committed"):
            call()
    with pytest.raises(TransactionStateError, match="already used"):
        store.begin("T1")
    other = store.begin("T2")
    other.rollback()
    with pytest.raises(TransactionStateError, match="rolled_back"):
        other.commit()
    empty = store.begin()
    assert empty.commit() == []


def test_bad_input_is_refused(store_path):
    with pytest.raises(InvalidConfigError, match="transaction_check_max"):
        open_store(store_path, transaction_check_max=0)
    with pytest.raises(InvalidConfigError, match="transaction_timeout_ms"):
        open_store(store_path, transaction_timeout_ms="6s")
    with open_store(store_path) as store:
        store.create_topic("t")
        for bad_id in ("", 5, "a\nb", "x" * 250):
            with pytest.raises(InvalidConfigError, match="transaction_id"):
                store.begin(bad_id)  # type: ignore[arg-type]
        txn = store.begin()
        with pytest.raises(InternalTopicError, match="__txn_half"):
            txn.append(HALF_TOPIC, b"x")
        with pytest.raises(InvalidRecordError, match="timestamps"):
            txn.append("t", b"x", timestamp=-1)
        with pytest.raises(InvalidRecordError, match="keys"):
            txn.append_batch("t", [b"a", b"b"], keys=[b"k"])
        with pytest.raises(InvalidConfigError, match="callable"):
            store.set_transaction_checker("commit")  # type: ignore[arg-type]
        txn.rollback()


def test_unknown_is_asked_again_up_to_the_max_then_rolled_back(store_path):
    asked: list[TransactionInfo] = []

    def checker(info: TransactionInfo) -> str:
        asked.append(info)
        return "unknown"

    opts = {"transaction_timeout_ms": 1000, "transaction_check_max": 3}
    with open_store(store_path, **opts) as store:
        store.create_topic("t")
        txn = store.begin("slow")
        md = txn.append("t", b"v")
        started = asked_at = md.timestamp
        store.set_transaction_checker(checker)
        assert store.check_transactions(now=started + 999) == {}  # not timed out yet
        assert asked == []
        assert store.check_transactions(now=started + 1000) == {"slow": "unknown"}
        assert store.check_transactions(now=started + 2000) == {"slow": "unknown"}
    with open_store(store_path, **opts) as store:  # the count of checks survives a reopen
        store.set_transaction_checker(checker)
        assert store.check_transactions(now=asked_at + 3000) == {"slow": "rolled_back"}
        assert [i.checks for i in asked] == [0, 1, 2]
        assert asked[0].targets == (("t", 0),) and asked[0].unique_ids == (md.unique_id,)
        assert store.end_offset("t") == 0
        ops = [json.loads(m.value) for m in store.read(OP_TOPIC, 0, 0, 10)]
        assert [o["op"] for o in ops] == ["unknown", "unknown", "rollback"]
        assert ops[-1]["reason"] == "max_checks"


def test_check_back_resolves_a_live_transaction_and_a_failing_checker_is_unknown(store):
    store.create_topic("t")
    txn = store.begin()
    md = txn.append("t", b"v")
    store.set_transaction_checker(lambda info: 1 / 0)
    assert store.check_transactions(now=md.timestamp + 6000) == {txn.transaction_id: "unknown"}
    store.set_transaction_checker(lambda info: "maybe")
    assert store.check_transactions(now=md.timestamp + 6000) == {txn.transaction_id: "unknown"}
    store.set_transaction_checker(lambda info: "rollback")
    assert store.check_transactions(now=md.timestamp + 6000) == {txn.transaction_id: "rolled_back"}
    assert txn.state == "rolled_back"
    with pytest.raises(TransactionStateError):
        txn.commit()


def test_commit_is_traced_after_the_append_across_a_millisecond(store_path):
    """The commit reads its clock before the real append, which stamps its own "appended"
    event: when a millisecond passes in between, the trace still lists the append first (a
    clean-clone run once saw them swapped). The store's clock moves 1 ms at every reading, so
    every step crosses a millisecond boundary."""
    ticks = itertools.count(time.time_ns() // 1_000_000)
    with open_store(store_path, trace=True, clock=lambda: next(ticks)) as store:
        store.create_topic("t")
        txn = store.begin("c")
        kept = txn.append("t", b"v")
        txn.commit()
        events = store.trace(kept.unique_id)
        assert [e.event for e in events] == ["half_appended", "appended", "txn_committed"]
        assert events[1].time <= events[2].time


def test_trace_records_half_commit_and_rollback(store_path):
    with open_store(store_path, trace=True) as store:
        store.create_topic("t")
        with store.begin("c") as txn:
            kept = txn.append("t", b"v")
        gone = store.begin("r")
        dropped = gone.append("t", b"w")
        gone.rollback()
        assert [e.event for e in store.trace(kept.unique_id)] == [
            "half_appended", "appended", "txn_committed"]  # fmt: skip
        events = store.trace(dropped.unique_id)
        assert [e.event for e in events] == ["half_appended", "txn_rolled_back"]
        assert events[0].detail == {"transaction_id": "r", "topic": "t", "partition": 0}
        assert store.trace(kept.unique_id)[-1].offset == 0


# -- crashes -------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import mqcore
    from mqcore import crashpoints

    path, point = sys.argv[1], sys.argv[2]
    store = mqcore.open(path, flush="os", transaction_check_interval_ms=0, delay_tick_ms=0)
    store.create_topic("idx", partitions=2)
    store.create_topic("noidx", partitions=1, key_index=False)
    txn = store.begin("T")
    sent = txn.append_batch("idx", [b"a", b"b", b"c"], keys=[b"1", b"2", b"3"], partition=None)
    uids = [m.unique_id for m in sent]
    uids += [m.unique_id for m in txn.append_batch("noidx", [b"d", b"e"])]
    print(json.dumps(uids), flush=True)

    def die(at):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    if point.split(':')[0] in crashpoints.CRASH_POINTS:
        crashpoints.arm(point)  # a step of mqcore's own (after the set-up above)
    die("before_commit")
    txn.commit()
    die("after_commit")
    """
)
COMMIT_STEPS = ["txn.after_prepare", "txn.after_append:1", "txn.after_append:2",
                "txn.after_append:3", "after_commit"]  # fmt: skip


def run_txn_child(path: str, point: str) -> list[str]:
    """The CHILD killed at `point`: the unique IDs it sent (its first line)."""
    return json.loads(run_child(CHILD, path, point, expect=KILLED).lines[0])


def all_copies(store: mqcore.Store) -> Counter[str | None]:
    return uids_in(store, "idx") + uids_in(store, "noidx")


@pytest.mark.parametrize("answer", ["commit", "rollback"])
def test_kill_before_commit_then_check_back_decides(store_path, answer):
    uids = run_txn_child(store_path, "before_commit")
    asked: list[str] = []
    with open_store(store_path) as store:
        assert all_copies(store) == Counter()
        store.set_transaction_checker(lambda info: asked.append(info.transaction_id) or answer)
        assert store.check_transactions(now=1) == {}  # younger than transaction_timeout_ms
        outcome = "committed" if answer == "commit" else "rolled_back"
        assert store.check_transactions(now=2**50) == {"T": outcome}
        assert asked == ["T"]
        expected = Counter(uids) if answer == "commit" else Counter()
        assert all_copies(store) == expected
    with open_store(store_path) as store:  # the decision is durable; nothing moves again
        assert store.check_transactions(now=2**50) == {}
        assert all_copies(store) == expected


@pytest.mark.parametrize("point", COMMIT_STEPS)
def test_kill_inside_commit_rolls_forward_exactly_once(store_path, point):
    uids = run_txn_child(store_path, point)
    with open_store(store_path) as store:
        store.set_transaction_checker(lambda info: pytest.fail("a prepared commit is decided"))
        outcome = store.check_transactions(now=0)  # no timeout needed: the decision is on disk
        assert outcome == ({} if point == "after_commit" else {"T": "committed"})
        assert all_copies(store) == Counter(uids)
        for uid in uids[:3]:
            assert len(store.find_by_unique_id(uid, limit=5).messages) == 1
    with open_store(store_path) as store:
        assert store.check_transactions(now=2**50) == {}
        assert all_copies(store) == Counter(uids)


def test_a_read_only_store_neither_resolves_nor_delivers(store_path):
    with open_store(store_path) as store:
        store.create_topic("t")
        store.begin().append("t", b"v")
    with mqcore.open(store_path, read_only=True) as ro:
        assert "transactions" not in ro.log.tasks.names() and "delay" not in ro.log.tasks.names()
        for call in (ro.begin, ro.check_transactions, ro.deliver_due):
            with pytest.raises(ReadOnlyStoreError):
                call()
