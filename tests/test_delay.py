"""Delayed messages: invisible until due, delivered in due order, across restarts, kill -9 and a
kill in the middle of delivery (consume/delay.py). Time is injected through deliver_due(now=)."""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import pytest
from conftest import plain_partition
from crashchild import KILLED, run_child

import mqcore
from mqcore.clock import now_ms
from mqcore.errors import InternalTopicError, InvalidConfigError, InvalidRecordError
from mqcore.produce.delay import DAY_MS, DELAY_TOPIC, PendingMetadata

QUIET = {"flush": "os", "transaction_check_interval_ms": 0, "delay_tick_ms": 0}


def open_store(path: str, **options: object) -> mqcore.Store:
    return mqcore.open(path, **{**QUIET, **options})


def values(store: mqcore.Store, topic: str = "t", partition: int = 0) -> list[bytes | None]:
    return [m.value for m in store.read(topic, partition, 0, 10_000)]


def test_invisible_until_due_then_delivered_in_due_order(store_path):
    base = now_ms() + 60_000
    with open_store(store_path) as store:
        store.create_topic("t")
        # sent in this order; due order is deliver_at, then the order of sending
        for name, at in [(b"c", 30), (b"a", 10), (b"b1", 20), (b"b2", 20), (b"d", 40)]:
            md = store.append("t", name, deliver_at=base + at)
            assert isinstance(md, PendingMetadata) and md.delayed and md.offset is None
        assert store.end_offset("t") == 0
        assert store.deliver_due(now=base + 9) == 0
        assert store.search("t", contains=b"a").messages == []
        assert store.deliver_due(now=base + 10) == 1
        assert values(store) == [b"a"]
        assert store.deliver_due(now=base + 29) == 2
        assert values(store) == [b"a", b"b1", b"b2"]
        assert store.deliver_due(now=base + 100) == 2
        assert values(store) == [b"a", b"b1", b"b2", b"c", b"d"]
        assert store.deliver_due(now=base + 10**6) == 0


def test_fields_ids_and_timestamps_are_kept(store):
    store.create_topic("t", partitions=4)
    at = now_ms() + 60_000
    md = store.append("t", b"v", key=b"k", headers=[("h", b"1")], tag="T", properties={"p": 1},
                      keys=["w"], delay_ms=60_000)  # fmt: skip
    stamped = store.append("t", b"old", partition=3, timestamp=5, deliver_at=at)
    assert md.partition == plain_partition(store, b"k", 4)  # fixed at send time
    assert at <= md.deliver_at <= at + 1000
    assert store.find_by_unique_id(md.unique_id).messages == []  # the timer log is not indexed
    before = now_ms()
    assert store.deliver_due(now=at + 1000) == 2
    (m,) = store.find_by_unique_id(md.unique_id).messages
    assert (m.partition, m.key, m.value) == (md.partition, b"k", b"v")
    assert [(k, v) for k, v in m.headers if k != "uid"] == [
        ("h", b"1"), ("tag", b"T"), ("p", b"1"), ("keys", b"w")]  # fmt: skip
    assert m.timestamp >= before  # stamped when it became visible
    (s,) = store.read("t", 3, 0, 10)
    assert (s.unique_id, s.timestamp) == (stamped.unique_id, 5)  # an explicit one is kept
    assert store.find_by_key("t", b"w").messages[0].unique_id == md.unique_id


def test_append_batch_with_one_or_per_message_times(store):
    store.create_topic("t", partitions=2)
    base = now_ms() + 60_000
    out = store.append_batch("t", [b"x", b"y"], partition=1, deliver_at=base)
    due = [base + 3, base + 1, base + 2]
    routed = store.append_batch("t", [b"p", b"q", b"r"], keys=[b"1", b"2", b"3"],
                                partition=None, deliver_at=due)  # fmt: skip
    assert [m.partition for m in out] == [1, 1]
    assert [m.partition for m in routed] == [plain_partition(store, k, 2)
                                             for k in (b"1", b"2", b"3")]  # fmt: skip
    assert store.deliver_due(now=base + 3) == 5
    got = {v: p for p in (0, 1) for v in values(store, "t", p)}
    assert got == {b"x": 1, b"y": 1, b"p": routed[0].partition, b"q": routed[1].partition,
                   b"r": routed[2].partition}  # fmt: skip
    by_partition = {p: values(store, "t", p) for p in (0, 1)}
    for vals in by_partition.values():  # due order inside each partition
        order = [v for v in (b"x", b"y", b"q", b"r", b"p") if v in vals]
        assert vals == order


def test_a_past_deliver_at_is_delivered_at_the_next_tick(store):
    store.create_topic("t")
    store.append("t", b"late", deliver_at=0)
    assert store.end_offset("t") == 0
    assert store.deliver_due() == 1
    assert values(store) == [b"late"]


def test_pending_messages_survive_a_restart_and_are_never_redelivered(store_path):
    base = now_ms() + 60_000
    with open_store(store_path) as store:
        store.create_topic("t")
        store.append("t", b"late", deliver_at=base + 50)  # timer offset 0
        store.append("t", b"early", deliver_at=base + 10)  # timer offset 1
        store.append("t", b"mid", deliver_at=base + 30)
        assert store.deliver_due(now=base + 10) == 1  # delivered out of timer-log order
    with open_store(store_path) as store:
        assert store.pending_delays() == 2
        assert store.deliver_due(now=base + 29) == 0
        assert store.deliver_due(now=base + 30) == 1
    with open_store(store_path) as store:
        assert store.deliver_due(now=base + 49) == 0
        assert store.deliver_due(now=base + 50) == 1
        assert values(store) == [b"early", b"mid", b"late"]
    with open_store(store_path) as store:
        assert store.pending_delays() == 0
        assert store.deliver_due(now=base + 10**6) == 0
        assert values(store) == [b"early", b"mid", b"late"]


@pytest.mark.parametrize("bad", ["soon", -1, True, 1.5, None])
def test_bad_delays_are_refused(store, bad):
    store.create_topic("t")
    if bad is not None:
        with pytest.raises(InvalidRecordError, match="deliver_at"):
            store.append("t", b"v", deliver_at=bad)
        with pytest.raises(InvalidRecordError, match="delay_ms"):
            store.append("t", b"v", delay_ms=bad)
        return
    with pytest.raises(InvalidRecordError, match="delay_max_ms"):
        store.append("t", b"v", delay_ms=41 * DAY_MS)
    with pytest.raises(InvalidRecordError, match="delay_max_ms"):
        store.append("t", b"v", deliver_at=now_ms() + 41 * DAY_MS)
    with pytest.raises(InvalidRecordError, match="not both"):
        store.append("t", b"v", deliver_at=1, delay_ms=1)
    with pytest.raises(InvalidRecordError, match="3 deliver_at values for 2"):
        store.append_batch("t", [b"a", b"b"], deliver_at=[1, 2, 3])
    with pytest.raises(InternalTopicError, match="__delay.*internal"):
        store.append(DELAY_TOPIC, b"v", delay_ms=1)
    assert store.end_offset("t") == 0 and DELAY_TOPIC not in store.topics()


def test_bad_delay_options_are_refused(store_path):
    with pytest.raises(InvalidConfigError, match="delay_max_ms"):
        open_store(store_path, delay_max_ms=0)
    with pytest.raises(InvalidConfigError, match="delay_tick_ms"):
        open_store(store_path, delay_tick_ms=-5)
    with open_store(store_path, delay_max_ms=1000) as store:
        store.create_topic("t")
        with pytest.raises(InvalidRecordError, match="delay_max_ms=1000"):
            store.append("t", b"v", delay_ms=1001)


def test_trace_records_delayed_and_delivered(store_path):
    with open_store(store_path, trace=True) as store:
        store.create_topic("t")
        at = now_ms() + 60_000
        md = store.append("t", b"v", deliver_at=at)
        store.deliver_due(now=at)
        events = store.trace(md.unique_id)
        assert [e.event for e in events] == ["delayed", "appended", "delay_delivered"]
        assert (events[0].topic, events[0].detail["deliver_at"]) == (DELAY_TOPIC, at)
        assert (events[-1].topic, events[-1].offset) == ("t", 0)


def test_background_task_delivers_a_due_message(store_path):
    with mqcore.open(store_path, flush="os", delay_tick_ms=10) as store:
        store.create_topic("t")
        store.append("t", b"now", deliver_at=0)  # wakes the task
        assert "delay" in store.log.tasks.names()
        store.log.tasks.stop()  # joins the thread: whatever it delivered is written
        delivered = store.end_offset("t")
        assert store.deliver_due() == 1 - delivered
        assert values(store) == [b"now"]


# -- kill -9 -------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    import mqcore
    from mqcore import crashpoints

    path, point, base, again = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = mqcore.open(path, flush="os", transaction_check_interval_ms=0, delay_tick_ms=0)
    out = []
    if again == "no":
        store.create_topic("idx", partitions=2)
        store.create_topic("noidx", partitions=1, key_index=False)
        out = store.append_batch("idx", [b"a", b"b", b"c"], keys=[b"1", b"2", b"3"],
                                 partition=None, deliver_at=[base + 30, base + 10, base + 20])
        out += store.append_batch("noidx", [b"e", b"d"], deliver_at=[base + 20, base + 10])
    print(json.dumps([m.unique_id for m in out]), flush=True)

    def die(at):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    if point.split(':')[0] in crashpoints.CRASH_POINTS:
        crashpoints.arm(point)  # a step of mqcore's own (after the set-up above)
    die("holding")
    store.deliver_due(now=base + 100)
    die("after_delivery")
    """
)
STEPS = ["delay.after_prepare", "delay.after_append:1", "delay.after_append:2",
         "delay.after_append:3", "after_delivery"]  # fmt: skip


def run_delay_child(path: str, point: str, base: int, again: bool = False) -> list[str]:
    """The CHILD killed at `point`: the unique IDs it was given (its first line)."""
    child = run_child(CHILD, path, point, str(base), "yes" if again else "no", expect=KILLED)
    return json.loads(child.lines[0])


def copies(store: mqcore.Store) -> Counter[str | None]:
    return Counter(m.unique_id for t in ("idx", "noidx") for p in store.available_partitions(t)
                   for m in store.read(t, p, 0, 100))  # fmt: skip


def test_kill_9_of_the_process_holding_delayed_messages(store_path):
    base = now_ms() + 60_000
    uids = run_delay_child(store_path, "holding", base)
    with open_store(store_path) as store:
        assert copies(store) == Counter()
        assert store.deliver_due(now=base + 10) == 2
        assert sorted(values(store, "noidx")) == [b"d"]
        assert store.deliver_due(now=base + 30) == 3
        assert copies(store) == Counter(uids)
        assert values(store, "noidx") == [b"d", b"e"]
        for p in (0, 1):  # due order inside each partition: b (10), c (20), a (30)
            got = values(store, "idx", p)
            assert got == [v for v in (b"b", b"c", b"a") if v in got]


@pytest.mark.parametrize("point", STEPS)
def test_kill_in_the_middle_of_delivery_never_duplicates(store_path, point):
    base = now_ms() + 60_000
    uids = run_delay_child(store_path, point, base)
    with open_store(store_path) as store:
        store.deliver_due(now=base + 100)
        assert copies(store) == Counter(uids)
        assert store.pending_delays() == 0
    with open_store(store_path) as store:
        assert store.deliver_due(now=base + 10**6) == 0
        assert copies(store) == Counter(uids)


def test_two_kills_in_a_row_mid_delivery_still_deliver_once(store_path):
    """The second attempt's PREPARE keeps the end offsets of the first (a copy the first crash
    left in the unindexed topic lies after those, not after the second attempt's)."""
    base = now_ms() + 60_000
    uids = run_delay_child(store_path, "delay.after_append:3", base)
    run_delay_child(store_path, "delay.after_prepare", base, again=True)
    with open_store(store_path) as store:
        store.deliver_due(now=base + 100)
        assert copies(store) == Counter(uids)
