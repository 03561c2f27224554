"""Consumer groups: committed offsets, assignment and rebalance, filters, positions, priorities,
bad input (issue 4). Process kills are in test_consumer_process.py, retry/DLQ in test_retry.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

import mqcore
from mqcore.consume.group import range_assign
from mqcore.consume.offsets import (
    OFFSETS_TOPIC,
    OffsetAndMetadata,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from mqcore.errors import (
    CommitFailedError,
    ConsumerClosedError,
    GroupNotEmptyError,
    GroupTypeError,
    InvalidConfigError,
    InvalidGroupError,
    InvalidTopicError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    SelectorSyntaxError,
    UnknownPartitionError,
    UnknownTopicError,
)


def fill(store: mqcore.Store, topic: str, n: int, partitions: int = 1) -> None:
    store.create_topic(topic, partitions=partitions)
    for p in range(partitions):
        store.append_batch(
            topic,
            [f"{topic}-{p}-{i}".encode() for i in range(n)],
            partition=p,
            timestamps=[1000 + i for i in range(n)],
        )


def values(msgs: list[mqcore.Message]) -> list[bytes]:
    return [m.value for m in msgs if m.value is not None]


def user(assignment: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [tp for tp in assignment if not tp[0].startswith("__")]


# -- committed offsets -------------------------------------------------------------------------


def test_offset_record_layout_is_kafkas() -> None:
    key = encode_key("g", "orders", 3)
    assert key == b"\x00\x01" + b"\x00\x01g" + b"\x00\x06orders" + b"\x00\x00\x00\x03"
    assert decode_key(key) == ("g", "orders", 3)
    assert decode_key(b"\x00\x02\x00\x01g") is None  # group metadata, not an offset commit
    value = encode_value(OffsetAndMetadata(42, "m", 7))
    assert value == b"\x00\x03" + (42).to_bytes(8, "big") + b"\xff" * 4 + b"\x00\x01m" + (
        7
    ).to_bytes(8, "big")
    assert decode_value(value) == OffsetAndMetadata(42, "m", 7)
    v1 = b"\x00\x01" + (5).to_bytes(8, "big") + b"\x00\x00" + (1).to_bytes(8, "big") * 2
    assert decode_value(v1) == OffsetAndMetadata(5, "", 1)
    with pytest.raises(ValueError):
        decode_value(value[:-1])


def test_commit_survives_reopen_and_lives_in_a_compacted_topic(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as store:
        fill(store, "t", 10, partitions=2)
        c = store.consumer("g", "t")
        assert len(c.poll(100)) == 20
        assert c.committed("t", 0) is None
        c.commit()
        assert c.committed("t", 0) == 10 and c.committed("t", 1) == 10
        c.commit({("t", 0): 4})
        assert c.committed("t", 0) == 4
        assert store.topic_config(OFFSETS_TOPIC).cleanup_policy == "compact"
        recs = store.read(OFFSETS_TOPIC, 0, 0)
        # one batch of the 2 partitions (no retry topic: nothing was nacked); then one of one
        assert len(recs) == 3 and len({m.timestamp for m in recs[:2]}) == 1
        assert decode_key(recs[-1].key or b"") == ("g", "t", 0)
        c.close()
    with mqcore.open(store_path, flush="os") as store:
        c = store.consumer("g", "t")
        assert c.committed("t", 0) == 4 and c.committed("t", 1) == 10
        assert values(c.poll(100)) == [f"t-0-{i}".encode() for i in range(4, 10)]
        c.close()


def test_deleted_group_offsets_stay_deleted_after_replay(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as store:
        fill(store, "t", 3)
        c = store.consumer("g", "t")
        c.poll()
        c.commit()
        c.close()
        other = store.consumer("other", "t")
        other.commit({("t", 0): 1})
        other.close()
        assert store.delete_group("g") == 1  # t-0 (nothing nacked: no retry)
        assert store.read(OFFSETS_TOPIC, 0, 0)[-1].value is None  # a tombstone
    with mqcore.open(store_path, flush="os") as store:
        assert store.consumer("g", "t").committed(0) is None
        assert store.consumer("other", "t").committed(0) == 1


def test_alter_group_offsets_is_refused_while_the_group_has_members(store_path: str) -> None:
    """As Kafka's --reset-offsets: a member's next commit would undo an offset set under it,
    so altering (or deleting) a group's offsets waits until its members leave; a share
    group's name is refused; what is altered is durable and what is refused leaves the
    committed offsets as they were."""
    with mqcore.open(store_path, flush="os") as store:
        fill(store, "t", 10, partitions=2)
        c = store.consumer("g", "t", enable_auto_commit=False)
        c.poll()
        c.commit({("t", 0): 4, ("t", 1): 5})
        assert store.group_members("g") == 1
        with pytest.raises(GroupNotEmptyError, match="'g' has 1 member; stop them"):
            store.alter_group_offsets("g", {("t", 0): 1})
        with pytest.raises(InvalidGroupError):  # what delete_group raised before: still caught
            store.delete_group("g")
        assert {(p.partition, p.committed) for p in store.group_lag("g")["g"]} == {(0, 4), (1, 5)}
        c.close()
        assert store.group_members("g") == 0
        store.alter_group_offsets("g", {("t", 0): 1, ("t", 1): 10}, "reset")
        with pytest.raises(OffsetOutOfRangeError, match="offset 11 of t-1 is outside 0..10"):
            store.alter_group_offsets("g", {("t", 1): 11})
        with pytest.raises(UnknownPartitionError):
            store.alter_group_offsets("g", {("t", 2): 0})
        with store.share_consumer("s", "t"):
            with pytest.raises(GroupTypeError, match="'s' is a share group"):
                store.alter_group_offsets("s", {("t", 0): 0})
        assert "s" not in store.group_lag()
    with mqcore.open(store_path, flush="os") as store:
        c = store.consumer("g", "t", enable_auto_commit=False)
        assert c.committed(0) == 1 and c.committed(1) == 10
        altered = store.offset_store().committed("g", "t", 1)
        assert altered is not None and (altered.offset, altered.metadata) == (10, "reset")


def test_uncommitted_progress_is_delivered_again(store: mqcore.Store) -> None:
    fill(store, "t", 5)
    c = store.consumer("g", "t")
    assert len(c.poll()) == 5
    c.close()
    c = store.consumer("g", "t")
    assert len(c.poll()) == 5
    c.close()


def test_auto_commit_commits_at_poll_and_close(store: mqcore.Store) -> None:
    fill(store, "t", 5)
    c = store.consumer("g", "t", enable_auto_commit=True, auto_commit_interval_ms=0)
    assert len(c.poll(3)) == 3
    assert c.committed(0) is None
    c.poll(1)  # commits the 3 before fetching
    assert c.committed(0) == 3
    c.close()
    assert store.consumer("g", "t").committed(0) == 4


# -- assignment and rebalance ------------------------------------------------------------------


def test_range_assignment_is_kafkas() -> None:
    got = range_assign(
        [("a", ["x", "y"]), ("b", ["x"]), ("c", ["x", "y"])], {"x": 7, "y": 2}.__getitem__
    )
    assert got == {
        "a": {("x", 0), ("x", 1), ("x", 2), ("y", 0)},
        "b": {("x", 3), ("x", 4)},
        "c": {("x", 5), ("x", 6), ("y", 1)},
    }


def test_rebalance_hands_partitions_over(store: mqcore.Store) -> None:
    fill(store, "t", 3, partitions=4)
    a = store.consumer("g", "t")
    assert user(a.assignment()) == [("t", p) for p in range(4)]
    assert len(a.poll(100)) == 12
    a.commit()
    b = store.consumer("g", "t")
    # b's partitions are still a's until a polls: pending, never shared
    assert user(b.assignment()) == []
    assert b.poll() == [] and user(b.assignment()) == []
    assert a.poll() == []  # rebalances take effect in poll: a releases t-2 and t-3
    assert user(a.assignment()) == [("t", 0), ("t", 1)]
    assert b.poll() == []  # nothing after the group's committed offsets
    assert user(b.assignment()) == [("t", 2), ("t", 3)]
    store.append("t", b"new", partition=3)
    assert values(b.poll()) == [b"new"]
    with pytest.raises(CommitFailedError, match="t-3"):
        a.commit({("t", 3): 1})
    b.close()
    assert values(a.poll()) == [b"new"]  # b never committed: a re-reads from the group's offset
    assert user(a.assignment()) == [("t", p) for p in range(4)]
    a.close()


def test_revoked_progress_is_not_committed_without_auto_commit(store: mqcore.Store) -> None:
    fill(store, "t", 3, partitions=2)
    a = store.consumer("g", "t")
    assert len(a.poll()) == 6
    b = store.consumer("g", "t")
    a.poll()  # a gives up t-1 without committing it
    assert a.committed("t", 1) is None
    assert len(b.poll()) == 3  # redelivered
    a.close()
    b.close()


def test_two_consumers_in_threads_receive_everything_once(store: mqcore.Store) -> None:
    """Two members of one group poll and commit as they go while a third joins and leaves;
    at every poll no partition is owned by two members, and every message arrives once."""
    parts, per = 6, 400
    store.create_topic("t", partitions=parts)
    coord_owners: list[dict[tuple[str, int], str]] = []
    received: list[bytes] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    produced = threading.Event()
    late_owned: list[int] = []

    def producer() -> None:
        for i in range(per):
            for p in range(parts):
                store.append("t", f"{p}-{i}".encode(), partition=p)
        produced.set()

    def member(joins_late: bool) -> None:
        try:
            c = store.consumer("g", "t")
            idle = 0
            polls = 0
            while idle < 3:
                msgs = c.poll(50, timeout_ms=100)
                polls += 1
                mine = set(c.assignment())
                owners = c.group_assignment()
                for tp in mine:
                    assert owners[tp] == c.member_id
                for m in msgs:
                    assert owners[(m.topic, m.partition)] == c.member_id
                with lock:
                    received.extend(values(msgs))
                    coord_owners.append(owners)
                c.commit()
                if joins_late:
                    late_owned.append(len(user(sorted(mine))))
                    if polls == 20:
                        break
                idle = idle + 1 if not msgs and produced.is_set() else 0
            c.close()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=member, args=(i == 2,)) for i in range(3)]
    prod = threading.Thread(target=producer)
    threads[0].start()
    prod.start()
    threads[1].start()
    threads[2].start()
    for t in [prod, *threads]:
        t.join(120)
    assert not errors, errors
    assert sorted(received) == sorted(f"{p}-{i}".encode() for p in range(parts) for i in range(per))
    assert len(coord_owners) > 3
    assert max(late_owned) > 0  # the third member did take partitions over, and gave them back


# -- filters -----------------------------------------------------------------------------------


@pytest.mark.parametrize("key_index", [True, False], ids=["tag-column", "scan-kernel"])
def test_tag_and_sql_filters_in_the_poll_loop(store: mqcore.Store, key_index: bool) -> None:
    """Same answers whether the tag column (key index) or the scan kernel finds the tags, over
    several segments and batches of several sizes."""
    store.create_topic("t", partitions=1, key_index=key_index, segment_bytes=64 * 1024)
    n = 3000
    for lo in range(0, n, 700):
        idx = range(lo, min(n, lo + 700))
        store.append_batch(
            "t",
            [str(i).encode() for i in idx],
            tags=["red" if i % 10 == 0 else None if i % 7 == 0 else "blue" for i in idx],
            properties=[{"n": i} for i in idx],
        )
    assert len(store.segment_offsets("t")) > 2
    c = store.consumer("g", "t", tag="red")
    got = c.poll(1000)
    assert values(got) == [str(i).encode() for i in range(0, n, 10)]
    assert c.position(0) == n
    store.append("t", b"late", tag="red")
    store.append("t", b"later", tag="blue")
    assert values(c.poll(1000)) == [b"late"] and c.position(0) == n + 2
    c.close()
    c = store.consumer("g2", "t", where="n BETWEEN 100 AND 102 OR TAGS = 'none'")
    assert values(c.poll(1000)) == [b"100", b"101", b"102"]
    c.close()
    c = store.consumer("g3", "t", tag="red", where="n >= 2000")
    assert values(c.poll(5)) == [str(i).encode() for i in range(2000, 2050, 10)]
    assert c.position(0) == 2041
    assert len(c.poll(1000)) == 95 and c.position(0) == n + 2
    c.close()
    c = store.consumer("g4", "t", tag="red")
    pages = [values(c.poll(7)) for _ in range(43)]
    assert [v for page in pages for v in page] == [str(i).encode() for i in range(0, n, 10)] + [
        b"late"
    ]
    c.close()


def test_filtered_poll_is_bounded_and_advances(store: mqcore.Store) -> None:
    """Without a tag column (key_index=False) a filtered poll examines at most
    FILTER_SCAN_BUDGET records and returns, possibly empty, past them."""
    from mqcore.consume.consumer import FILTER_SCAN_BUDGET

    store.create_topic("t", key_index=False)
    n = FILTER_SCAN_BUDGET * 2 + 100
    store.append_batch("t", [b"x"] * n, tags=["blue"] * (n - 1) + ["red"])
    c = store.consumer("g", "t", tag="red")
    assert c.poll() == []
    assert c.position(0) == FILTER_SCAN_BUDGET
    assert c.poll() == []
    assert c.position(0) == 2 * FILTER_SCAN_BUDGET
    got = c.poll()
    assert [m.offset for m in got] == [n - 1] and c.position(0) == n
    c.close()
    # the tag column skips the blue ones without reading them: one poll
    store.create_topic("indexed")
    store.append_batch("indexed", [b"x"] * n, tags=["blue"] * (n - 1) + ["red"])
    c = store.consumer("g", "indexed", tag="red")
    assert [m.offset for m in c.poll()] == [n - 1] and c.position(0) == n
    c.close()


# -- positions ---------------------------------------------------------------------------------


def test_seek_position_committed_lag(store: mqcore.Store) -> None:
    fill(store, "t", 10, partitions=2)
    c = store.consumer("g", "t")
    assert c.position("t", 0) == 0
    c.seek("t", 0, 7)
    assert [m.offset for m in c.poll(100) if m.partition == 0] == [7, 8, 9]
    assert c.lag()[("t", 0)] == 0  # nothing committed: from the position
    c.commit({("t", 0): 8, ("t", 1): 2})
    assert c.lag()[("t", 0)] == 2 and c.lag()[("t", 1)] == 8
    c.seek_to_time(1005)
    assert c.position("t", 0) == 5 and c.position("t", 1) == 5
    c.seek_to_time(10**12)
    assert c.position("t", 1) == 10
    c.close()
    store.create_topic("u")
    two = store.consumer("two", ["t", "u"])
    with pytest.raises(InvalidConfigError, match="topic"):
        two.seek(0, 3)  # (partition, offset) only for a consumer of one topic
    two.close()
    store.append("u", b"a")
    store.append("u", b"b")
    s = store.consumer("s", "u")
    s.seek(0, 1)
    assert values(s.poll()) == [b"b"] and s.position(0) == 2
    s.close()


def test_auto_offset_reset(store: mqcore.Store) -> None:
    fill(store, "t", 5)
    late = store.consumer("late", "t", auto_offset_reset="latest")
    assert late.poll() == []
    store.append("t", b"after")
    assert values(late.poll()) == [b"after"]
    late.close()
    strict = store.consumer("strict", "t", auto_offset_reset="none")
    with pytest.raises(NoOffsetForPartitionError, match="strict"):
        strict.poll()
    with pytest.raises(NoOffsetForPartitionError):
        strict.position(0)
    strict.commit({("t", 0): 2})
    assert values(strict.poll()) == [b"t-0-2", b"t-0-3", b"t-0-4", b"after"]
    strict.seek(0, 99)  # outside the log
    with pytest.raises(OffsetOutOfRangeError, match="99"):
        strict.poll()
    strict.close()
    early = store.consumer("early", "t")
    early.seek(0, 99)
    assert len(early.poll()) == 6  # reset to the start
    early.close()


def test_position_below_the_log_start_is_reset(store_path: str) -> None:
    """Retention deleted the segments holding the committed offset: the reset policy decides."""
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("t", segment_bytes=1024)
        for i in range(20):
            store.append("t", b"%03d" % i + b"x" * 97)
        c = store.consumer("g", "t")
        c.commit({("t", 0): 2})
        c.close()
        for name in ("n", "l"):
            store.consumer(name, "t").commit({("t", 0): 1})
        assert store.segment_offsets("t")[:2] == [0, 5]
    tdir = os.path.join(store_path, "t-0")
    for name in os.listdir(tdir):
        if name.startswith("00000000000000000000."):
            os.remove(os.path.join(tdir, name))  # what retention does: whole segments go
    with mqcore.open(store_path, flush="os") as store:
        assert store.start_offset("t") == 5
        c = store.consumer("g", "t")
        assert c.position(0) == 5 and c.poll(1)[0].offset == 5
        c.close()
        strict = store.consumer("n", "t", auto_offset_reset="none")
        with pytest.raises(OffsetOutOfRangeError, match="outside"):
            strict.poll()
        strict.close()
        late = store.consumer("l", "t", auto_offset_reset="latest")
        assert late.poll() == [] and late.position(0) == 20
        late.close()


def test_poll_waits_for_an_append(store: mqcore.Store) -> None:
    store.create_topic("t")
    c = store.consumer("g", "t")
    assert c.poll(timeout_ms=0) == []
    started = threading.Event()

    def later() -> None:
        started.wait(10)
        store.append("t", b"wake")

    t = threading.Thread(target=later)
    t.start()
    started.set()
    got = c.poll(timeout_ms=30_000)  # returns when the append signals, not after 30 s
    t.join()
    assert values(got) == [b"wake"]
    c.close()


def test_waiting_poll_wakes_when_its_partition_is_released(store: mqcore.Store) -> None:
    fill(store, "t", 3, partitions=2)
    a = store.consumer("g", "t")
    assert len(a.poll()) == 6  # a owns both partitions and commits nothing
    b = store.consumer("g", "t")
    result: list[list[mqcore.Message]] = []
    t = threading.Thread(target=lambda: result.append(b.poll(100, timeout_ms=60_000)))
    began = time.monotonic()
    t.start()
    a.poll()  # hands t-1 over: b wakes up (no timer), its uncommitted records come again
    t.join(90)
    assert time.monotonic() - began < 30
    assert values(result[0]) == [b"t-1-0", b"t-1-1", b"t-1-2"]
    a.close()
    b.close()


# -- priorities --------------------------------------------------------------------------------


def test_priorities_lead_in_proportion(store: mqcore.Store) -> None:
    """orders:10, audit:1, both always with data: of every 11 polls 10 return orders only and
    one returns audit only (max_records fills from the leading topic)."""
    fill(store, "orders", 1000)
    fill(store, "audit", 1000)
    c = store.consumer("g", ["orders", "audit"], priorities={"orders": 10, "audit": 1})
    leaders = []
    for _ in range(33):
        msgs = c.poll(10)
        assert len(msgs) == 10 and len({m.topic for m in msgs}) == 1
        leaders.append(msgs[0].topic)
    assert leaders.count("audit") == 3
    for i in range(0, 33, 11):
        assert leaders[i : i + 11].count("audit") == 1
    c.close()
    # with room left, the lower priority fills it after the leader
    c = store.consumer("g2", ["orders", "audit"], priorities={"orders": 10})
    msgs = c.poll(1500)
    assert [m.topic for m in msgs] == ["orders"] * 1000 + ["audit"] * 500
    c.close()


# -- bad input ---------------------------------------------------------------------------------


def test_bad_input(store: mqcore.Store) -> None:
    fill(store, "t", 1)
    with pytest.raises(UnknownTopicError, match="nope"):
        store.consumer("g", "nope")
    with pytest.raises(InvalidGroupError, match="group name"):
        store.consumer("bad/group", "t")
    with pytest.raises(InvalidGroupError):
        store.consumer("", "t")
    with pytest.raises(InvalidGroupError, match="limit"):
        store.consumer("g" * 245, "t")
    assert issubclass(InvalidGroupError, InvalidTopicError)
    with pytest.raises(InvalidConfigError, match="auto_offset_reset"):
        store.consumer("g", "t", auto_offset_reset="smallest")
    with pytest.raises(InvalidConfigError, match="priority"):
        store.consumer("g", "t", priorities={"other": 1})
    with pytest.raises(InvalidConfigError, match="at least one topic"):
        store.consumer("g", [])
    with pytest.raises(SelectorSyntaxError):
        store.consumer("g", "t", where="a >")
    with pytest.raises(InvalidConfigError, match="retry_backoff_ms"):
        store.consumer("g", "t", retry_backoff_ms=[])
    c = store.consumer("g", "t")
    for bad in (0, -1, True, "5", 10**9):
        with pytest.raises(InvalidConfigError, match="max_records"):
            c.poll(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="timeout_ms"):
        c.poll(1, timeout_ms=-5)
    with pytest.raises(UnknownPartitionError):
        c.seek("t", 5, 0)
    with pytest.raises(InvalidConfigError, match="offset"):
        c.seek("t", 0, -1)
    with pytest.raises(InvalidConfigError, match="offset"):
        c.commit({("t", 0): "3"})  # type: ignore[dict-item]
    with pytest.raises(InvalidConfigError):
        c.nack(b"not a message")  # type: ignore[arg-type]
    c.nack(c.poll()[0])  # makes __retry.g, with the 16 default levels
    with pytest.raises(InvalidConfigError, match="retry_backoff_ms has 2 levels"):
        store.consumer("g", "t", retry_backoff_ms=[1, 2])
    c.close()
    c.close()
    with pytest.raises(ConsumerClosedError):
        c.poll()
    with pytest.raises(ConsumerClosedError):
        c.commit()


def test_read_only_store_has_no_consumers(store_path: str) -> None:
    mqcore.open(store_path, flush="os").close()
    with mqcore.open(store_path, read_only=True) as ro, pytest.raises(ReadOnlyStoreError):
        ro.consumer("g", "t")
