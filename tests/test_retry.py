"""nack(): redelivery through `__retry.<group>` with backoff levels, then `__dlq.<group>`; the
copies keep the message's identity and say where it came from; trace follows every step."""

from __future__ import annotations

from pathlib import Path

import pytest

import mqcore
from mqcore.consume.retry import DEFAULT_LEVELS_MS, reconsume_times


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def test_default_levels_are_rocketmqs() -> None:
    assert [ms // 1000 for ms in DEFAULT_LEVELS_MS] == [
        10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
    ]  # fmt: skip


def test_retry_then_dead_letter_with_headers_and_trace(tmp_path: Path) -> None:
    clock = Clock()
    with mqcore.open(str(tmp_path / "s"), flush="os", trace=True) as store:
        store.create_topic("orders", partitions=2)
        md = store.append(
            "orders", b"pay", key=b"k1", partition=1, tag="red", properties={"amount": 5}
        )
        store.append("orders", b"other", partition=0)
        c = store.consumer(
            "billing", "orders", max_reconsume_times=2, retry_backoff_ms=[100, 1000],
            now_ms=clock,
        )  # fmt: skip
        first = [m for m in c.poll() if m.value == b"pay"]
        assert len(first) == 1 and reconsume_times(first[0]) == 0
        c.nack(first[0])
        c.commit()
        assert c.committed("orders", 1) == 1  # the nacked message counts as consumed
        assert c.poll() == []  # not due yet
        clock.now += 99
        assert c.poll() == []
        clock.now += 1
        (r1,) = c.poll()
        assert (r1.topic, r1.partition) == ("__retry.billing", 0)
        c.nack(r1)
        clock.now += 999
        assert c.poll() == []
        clock.now += 1
        (r2,) = c.poll()
        assert (r2.topic, r2.partition) == ("__retry.billing", 1)
        c.nack(r2)  # the 2nd redelivery failed too: dead letter
        clock.now += 10**9
        assert c.poll() == []
        c.commit()
        (dead,) = store.read("__dlq.billing", 0, 0)
        for m in (r1, r2, dead):
            assert (m.key, m.value, m.tag, m.unique_id) == (b"k1", b"pay", "red", md.unique_id)
            assert m.properties["amount"] == "5"
            assert m.header("mq.origin") == md.msg_id.encode()
            assert store.get_by_id(m.header("mq.origin").decode()).value == b"pay"  # type: ignore[union-attr]
            assert m.header("mq.origin.topic") == b"orders"
            assert m.header("mq.origin.partition") == b"1"
            assert m.header("mq.origin.offset") == b"0"
        assert [reconsume_times(m) for m in (r1, r2, dead)] == [1, 2, 2]
        assert r1.header("mq.due") == b"1000100" and r2.header("mq.due") == b"1001100"
        assert dead.header("mq.due") is None
        found = store.find_by_unique_id(md.unique_id or "", limit=10)
        assert {m.topic for m in found} == {"orders", "__retry.billing", "__dlq.billing"}
        steps = [(e.event, e.topic) for e in store.trace(md.unique_id or "")]
        assert steps == [
            ("appended", "orders"),
            ("delivered", "orders"),
            ("nacked", "orders"),
            ("retried", "__retry.billing"),
            ("committed", "orders"),
            ("delivered", "__retry.billing"),
            ("nacked", "__retry.billing"),
            ("retried", "__retry.billing"),
            ("delivered", "__retry.billing"),
            ("nacked", "__retry.billing"),
            ("dead_lettered", "__dlq.billing"),
            ("committed", "__retry.billing"),
            ("committed", "__retry.billing"),
        ]
        assert all(e.group == "billing" for e in store.trace(md.unique_id or "")[1:])
        c.close()


def test_retry_partition_stops_at_first_message_not_due(store: mqcore.Store) -> None:
    clock = Clock()
    store.create_topic("t")
    store.append_batch("t", [b"a", b"b", b"c"])
    c = store.consumer("g", "t", retry_backoff_ms=[50], now_ms=clock)
    a, b, cc = c.poll()
    c.nack(a)
    clock.now += 30
    c.nack(b)  # due 30 ms later than a's copy, same partition
    c.nack(cc)
    clock.now += 20
    assert [m.value for m in c.poll()] == [b"a"]
    assert c.position("__retry.g", 0) == 1
    clock.now += 30
    assert [m.value for m in c.poll()] == [b"b", b"c"]
    c.close()


def test_levels_beyond_the_last_reuse_it_and_zero_goes_straight_to_dlq(
    store: mqcore.Store,
) -> None:
    clock = Clock()
    store.create_topic("t")
    store.append("t", b"x")
    c = store.consumer("g", "t", retry_backoff_ms=[0], max_reconsume_times=3, now_ms=clock)
    (m,) = c.poll()
    for times in (1, 2, 3):
        c.nack(m)
        (m,) = c.poll()
        assert (m.partition, reconsume_times(m)) == (0, times)
    c.nack(m)
    assert [d.value for d in store.read("__dlq.g", 0, 0)] == [b"x"]
    c.close()
    store.append("t", b"y")
    z = store.consumer("z", "t", max_reconsume_times=0, retry_backoff_ms=[0])
    (m,) = [m for m in z.poll() if m.value == b"y"]
    z.nack(m)
    assert [d.value for d in store.read("__dlq.z", 0, 0)] == [b"y"]
    assert "__retry.z" not in store.topics()
    z.close()


def test_retry_copies_survive_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    clock = Clock()
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t")
        store.append("t", b"x")
        c = store.consumer("g", "t", retry_backoff_ms=[10], now_ms=clock)
        c.nack(c.poll()[0])
        c.commit()
        c.close()
    clock.now += 10
    with mqcore.open(path, flush="os") as store:
        c = store.consumer("g", "t", retry_backoff_ms=[10], now_ms=clock)
        (m,) = c.poll()
        assert (m.topic, m.value, reconsume_times(m)) == ("__retry.g", b"x", 1)
        c.close()


def test_nack_keeps_messages_without_unique_id(store: mqcore.Store) -> None:
    store.create_topic("plain", unique_ids=False)
    store.append("plain", b"v", key=b"k", headers={"h": b"1"})
    c = store.consumer("g", "plain", retry_backoff_ms=[0])
    c.nack(c.poll()[0])
    (m,) = c.poll()
    assert m.unique_id is None and m.header("h") == b"1" and m.key == b"k"
    c.close()


@pytest.mark.parametrize("bad", [[-1], [5, 1], "10", [1.5]])
def test_bad_backoff(store: mqcore.Store, bad: object) -> None:
    store.create_topic("t")
    with pytest.raises(mqcore.errors.InvalidConfigError, match="retry_backoff_ms"):
        store.consumer("g", "t", retry_backoff_ms=bad)


def test_a_consumer_creates_no_retry_topic_until_its_first_nack(store: mqcore.Store) -> None:
    """Issue 17.4: `store.consumer(...)` alone made 16 empty `__retry.<group>` partitions that
    crowded every topic listing and lag() result."""
    clock = Clock()
    store.create_topic("t", partitions=2)
    store.append_batch("t", [b"a", b"b"], partition=0)
    store.append("t", b"c", partition=1)
    c = store.consumer("g", "t", retry_backoff_ms=[10, 20, 30], now_ms=clock)
    got = c.poll()
    c.commit()
    assert "__retry.g" not in store.topics()
    assert c.lag() == {("t", 0): 0, ("t", 1): 0}
    assert c.assignment() == [("t", 0), ("t", 1)]
    c.nack(next(m for m in got if m.value == b"b"))
    assert store.partitions("__retry.g") == 3  # the whole topic, one partition per level
    # the nacking member (alone in its group) owns the new levels at once: lag shows the copy
    assert c.assignment() == [("__retry.g", 0), ("__retry.g", 1), ("__retry.g", 2), ("t", 0),
                              ("t", 1)]  # fmt: skip
    assert c.lag()[("__retry.g", 0)] == 1
    store.append("t", b"d", partition=1)
    assert [m.value for m in c.poll()] == [b"d"]  # the copy is not due yet
    clock.now += 10
    (copy,) = [m for m in c.poll() if m.topic == "__retry.g"]
    assert (copy.value, copy.partition) == (b"b", 0)
    # lag: every partition of the subscribed topics, and the retry levels that ever held a
    # message (the others never did; listing them says nothing)
    expected = {}
    for tp in c.assignment():
        end = store.end_offset(*tp)
        if tp[0] == "t" or end > 0:
            committed = c.committed(*tp)
            expected[tp] = end - (committed if committed is not None else c.position(*tp))
    assert c.lag() == expected and set(expected) == {("t", 0), ("t", 1), ("__retry.g", 0)}
    c.close()


def test_a_lazily_made_retry_topic_reaches_every_member(store: mqcore.Store) -> None:
    """The member that nacks need not own the retry level: the group rebalances when the topic
    appears, and the member it goes to redelivers the copy."""
    clock = Clock()
    store.create_topic("t", partitions=2)
    store.append("t", b"zero", partition=0)
    store.append("t", b"one", partition=1)
    first = store.consumer("g", "t", retry_backoff_ms=[0, 0], now_ms=clock)
    second = store.consumer("g", "t", retry_backoff_ms=[0, 0], now_ms=clock)
    first.poll()
    (m,) = second.poll()
    assert m.partition == 1
    second.nack(m)  # level 0 goes to the first member (range assignment, join order)
    second.commit()
    (copy,) = first.poll()
    assert (copy.topic, copy.partition, copy.value) == ("__retry.g", 0, b"one")
    assert second.poll() == []
    assert ("__retry.g", 0) in first.assignment() and ("__retry.g", 1) in second.assignment()
    first.close()
    second.close()


def test_levels_that_do_not_match_an_existing_retry_topic_are_refused(tmp_path: Path) -> None:
    """One partition per level: checked when a consumer starts and the topic exists, and when
    a nack finds a topic that another member made with other levels."""
    path = str(tmp_path / "s")
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t")
        store.append("t", b"x")
        c = store.consumer("g", "t", retry_backoff_ms=[0, 0])
        c.nack(c.poll()[0])
        c.close()
    with mqcore.open(path, flush="os") as store:
        with pytest.raises(mqcore.errors.InvalidConfigError, match="one per backoff level"):
            store.consumer("g", "t", retry_backoff_ms=[0, 0, 0])
        early = store.consumer("h", "t", retry_backoff_ms=[0])
        late = store.consumer("h", "t", retry_backoff_ms=[0, 0])  # no __retry.h yet
        (m,) = early.poll()
        early.nack(m)
        assert store.partitions("__retry.h") == 1
        with pytest.raises(mqcore.errors.InvalidConfigError, match="one per backoff level"):
            late.nack(m)
        early.close()
        late.close()
