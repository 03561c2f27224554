"""Deleting topics and adding partitions (Store.delete_topic, Store.add_partitions): real
files, reopens, readers and background tasks beside a deletion, and kills at every step."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
from crashchild import KILLED, run_child

import mqcore
from mqcore._ext.hashing import kafka_partition
from mqcore.errors import (
    InternalTopicError,
    InvalidConfigError,
    MQCoreError,
    ReadOnlyStoreError,
    StoreClosedError,
    UnknownTopicError,
)


def entries(path: str) -> list[str]:
    """The store directory's sub-directories (partitions, and `-delete` leftovers)."""
    return sorted(e.name for e in os.scandir(path) if e.is_dir())


def values(store: mqcore.Store, topic: str) -> list[bytes | None]:
    out: list[bytes | None] = []
    for p in store.available_partitions(topic):
        out += [m.value for m in store.read(topic, p, 0, 100_000)]
    return out


def declared(path: str) -> dict[str, object]:
    with open(os.path.join(path, "mqcore-topics.json"), encoding="utf-8") as f:
        return json.load(f)


# -- delete_topic -------------------------------------------------------------------------------


def test_a_deleted_topic_is_gone_from_disk_and_after_a_reopen(store_path: str) -> None:
    with mqcore.open(store_path, segment_bytes=4096) as store:
        store.create_topic("gone", partitions=3)
        store.create_topic("kept", partitions=1)
        for i in range(300):  # several segments per partition
            store.append("gone", b"g%d" % i + b"x" * 100, key=b"%d" % i)
            store.append("kept", b"k%d" % i)
        store.delete_topic("gone")
        assert store.topics() == ["kept"]
        with pytest.raises(UnknownTopicError):
            store.read("gone", 0, 0, 10)
        with pytest.raises(UnknownTopicError):
            store.append("gone", b"v")
        assert entries(store_path) == ["kept-0"]
        assert "deleting" not in declared(store_path)
        assert list(declared(store_path)["topics"]) == ["kept"]  # type: ignore[call-overload]
    with mqcore.open(store_path) as store:
        assert store.topics() == ["kept"]
        assert store.stray_directories == []
        assert values(store, "kept") == [b"k%d" % i for i in range(300)]


def test_a_deleted_name_can_be_created_again_fresh(store: mqcore.Store) -> None:
    store.create_topic("t", partitions=2)
    store.append_batch("t", [b"old%d" % i for i in range(50)], partition=1)
    store.delete_topic("t")
    store.create_topic("t", partitions=1)
    md = store.append("t", b"new")
    assert (md.partition, md.offset) == (0, 0)
    assert values(store, "t") == [b"new"]
    assert store.start_offset("t", 0) == 0
    path = store.path
    store.close()
    with mqcore.open(path) as again:
        assert again.partitions("t") == 1
        assert values(again, "t") == [b"new"]


def test_delete_topic_refuses_internal_unknown_and_read_only(store_path: str) -> None:
    with mqcore.open(store_path) as store:
        store.create_topic("t")
        store.consumer("g", "t").commit({("t", 0): 0})  # makes __consumer_offsets
        assert "__consumer_offsets" in store.topics()
        with pytest.raises(InternalTopicError, match="__consumer_offsets"):
            store.delete_topic("__consumer_offsets")
        with pytest.raises(UnknownTopicError, match="nope"):
            store.delete_topic("nope")
        assert "__consumer_offsets" in store.topics()
    with mqcore.open(store_path, read_only=True) as ro:
        with pytest.raises(ReadOnlyStoreError):
            ro.delete_topic("t")
        assert "t" in ro.topics()


def test_group_offsets_of_a_deleted_topic_stay(store: mqcore.Store) -> None:
    """As in Kafka: committed offsets stay until the group goes (or the group's offsets are
    deleted); a consumer of the topic gets UnknownTopicError until it exists again, then its
    position (past the new end) is reset by its auto_offset_reset."""
    store.create_topic("t")
    store.append_batch("t", [b"a", b"b", b"c"])
    consumer = store.consumer("g", "t")
    assert [m.value for m in consumer.poll(max_records=10, timeout_ms=0)] == [b"a", b"b", b"c"]
    consumer.commit()
    store.delete_topic("t")
    with pytest.raises(UnknownTopicError):
        consumer.poll(max_records=10, timeout_ms=0)
    store.create_topic("t")  # created again: the consumer goes on with the new topic
    store.append("t", b"new")
    assert [m.value for m in consumer.poll(max_records=10, timeout_ms=0)] == [b"new"]
    consumer.close()
    committed = store.offset_store().committed("g", "t", 0)
    assert committed is not None and committed.offset == 3


def test_a_read_holding_segments_survives_the_deletion(store: mqcore.Store) -> None:
    """A reader that pinned segments and holds a view of one keeps reading the bytes it has;
    a new view of a segment of the deleted topic is a StoreClosedError, never a crash."""
    store.create_topic("t", segment_bytes=4096)
    for i in range(200):
        store.append("t", b"%d" % i + b"y" * 100)
    part = store.log.partition("t", 0)
    with part.pinned_ends() as ends:
        seg, size, _ = ends[0]
        view = seg.view(0, size)
        before = bytes(view)
        store.delete_topic("t")
        assert bytes(view) == before  # mapped until the view is released
        view.release()
        with pytest.raises(StoreClosedError):
            ends[1][0].view(0, ends[1][1])
    with pytest.raises(UnknownTopicError, match="deleted"):
        part.read(0, 10)
    assert entries(store.path) == []


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """A 0.2 ms GIL switch interval for the test, Python's 5 ms restored after."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        yield
    finally:
        sys.setswitchinterval(saved)


@pytest.mark.usefixtures("fine_switching")
def test_readers_and_writers_beside_deletions_get_only_mqcore_errors(store: mqcore.Store) -> None:
    """Threads append, read and consume a topic that is deleted and created again over and
    over: each call succeeds or raises an mqcore error (UnknownTopicError mostly).

    A 0.2 ms GIL switch interval (Python's is 5 ms): the spinning threads hand the GIL back
    sooner, so each deletion's many I/O calls stop waiting 5 ms apiece to get it again (the
    test ran 40 s for 30 rounds), and the threads interleave more finely, not less."""
    store.create_topic("t", partitions=2, segment_bytes=4096)
    stop = threading.Event()
    failures: list[BaseException] = []
    done = [0, 0]

    def run(call: object, slot: int) -> None:
        while not stop.is_set():
            try:
                call()  # type: ignore[operator]
                done[slot] += 1
            except MQCoreError:
                pass
            except BaseException as e:  # anything else is a bug
                failures.append(e)
                return

    def reader() -> None:
        for p in (0, 1):
            store.read("t", p, 0, 50)

    threads = [
        threading.Thread(target=run, args=(lambda: store.append("t", b"v" * 200), 0)),
        threading.Thread(target=run, args=(reader, 1)),
    ]
    for t in threads:
        t.start()
    try:
        for _ in range(30):
            store.delete_topic("t")
            store.create_topic("t", partitions=2, segment_bytes=4096)
            store.append("t", b"mark")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == []
    store.flush()  # the flusher found nothing wrong either
    assert store.log.tasks.last_error is None
    assert entries(store.path) == ["t-0", "t-1"]


def test_background_maintenance_skips_a_deleted_topic(store_path: str) -> None:
    """Retention and compaction passes run every millisecond and the flusher every one while
    topics are deleted: none of them fails or writes into a deleted topic's directory."""
    with mqcore.open(
        store_path,
        flush_interval_ms=1,
        retention_check_interval_ms=1,
        compaction_check_interval_ms=1,
        segment_bytes=4096,
    ) as store:
        for round_ in range(15):
            store.create_topic("c", cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
            store.create_topic("r", retention_ms=1)
            for i in range(100):
                store.append("c", b"x" * 100, key=b"%d" % (i % 5))
                store.append("r", b"y" * 100)
            store.delete_topic("c")
            store.delete_topic("r")
            assert entries(store_path) == [], round_
        store.flush()
        assert store.log.tasks.last_error is None
    assert entries(store_path) == []


# -- add_partitions -------------------------------------------------------------------------------


def test_add_partitions_grows_the_topic_and_reroutes_keys(store_path: str) -> None:
    keys = [b"key-%d" % i for i in range(200)]
    with mqcore.open(store_path) as store:
        store.create_topic("t", partitions=2)
        for k in keys:
            assert store.append("t", k, key=k).partition == kafka_partition(k, 2)
        cfg = store.add_partitions("t", 5)
        assert cfg.partitions == 5 == store.partitions("t")
        assert store.available_partitions("t") == [0, 1, 2, 3, 4]
        for k in keys:  # routed by the new count from now on
            assert store.append("t", k, key=k).partition == kafka_partition(k, 5)
        assert entries(store_path) == [f"t-{p}" for p in range(5)]
    with mqcore.open(store_path) as store:
        assert store.partitions("t") == 5
        for p in range(5):
            want = [k for k in keys if kafka_partition(k, 2) == p]
            want += [k for k in keys if kafka_partition(k, 5) == p]
            assert [m.value for m in store.read("t", p, 0, 1000)] == want
        consumer = store.consumer("g", "t")  # a new consumer reads every partition
        got = []
        while batch := consumer.poll(max_records=1000, timeout_ms=0):
            got += [m.value for m in batch]
        consumer.close()
        assert sorted(got) == sorted(keys * 2)


@pytest.mark.parametrize("count", [1, 2, 0, -1, True, "3", 2.5, 1_000_001])
def test_add_partitions_refuses_a_count_that_does_not_grow(
    store: mqcore.Store, count: object
) -> None:
    store.create_topic("t", partitions=2)
    match = "has 2 partitions" if count != 1_000_001 else "partitions"
    with pytest.raises(InvalidConfigError, match=match):
        store.add_partitions("t", count)  # type: ignore[arg-type]
    assert store.partitions("t") == 2
    assert entries(store.path) == ["t-0", "t-1"]


def test_add_partitions_refuses_internal_and_unknown_and_alter_still_refuses(
    store: mqcore.Store,
) -> None:
    store.create_topic("t")
    store.consumer("g", "t").commit({("t", 0): 0})
    with pytest.raises(InternalTopicError):
        store.add_partitions("__consumer_offsets", 100)
    with pytest.raises(UnknownTopicError):
        store.add_partitions("nope", 3)
    with pytest.raises(InvalidConfigError, match="partitions cannot change"):
        store.alter_topic_config("t", partitions=3)


# -- kills between the steps ----------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    import mqcore
    from mqcore import crashpoints

    path, action, point = sys.argv[1], sys.argv[2], sys.argv[3]
    store = mqcore.open(path, flush="always", segment_bytes=4096)
    store.create_topic("t", partitions=3)
    store.create_topic("keep")
    for i in range(200):
        store.append("t", b"t%d" % i + b"z" * 50, key=b"%d" % i)
        store.append("keep", b"k%d" % i)
    crashpoints.arm(point)
    if action == "delete":
        store.delete_topic("t")
    else:
        store.add_partitions("t", 5)
    """
)

DELETE_POINTS = [
    "checkpoint.after_tmp_write",  # inside the save that commits: not deleted yet
    "checkpoint.after_rename",
    "delete_topic.after_save",
    "delete_topic.after_rename",
    "checkpoint.after_tmp_write:2",  # the save that drops the `deleting` entry
]


@pytest.mark.parametrize("point", DELETE_POINTS)
def test_a_kill_during_delete_topic_leaves_the_whole_topic_or_none(
    store_path: str, point: str
) -> None:
    run_child(CHILD, store_path, "delete", point, expect=KILLED)
    whole = sorted(b"t%d" % i + b"z" * 50 for i in range(200))
    with mqcore.open(store_path) as store:
        if "t" in store.topics():
            assert point == "checkpoint.after_tmp_write"
            assert sorted(values(store, "t")) == whole  # type: ignore[type-var]
            store.delete_topic("t")  # and it can still be deleted
        assert store.topics() == ["keep"]
        assert values(store, "keep") == [b"k%d" % i for i in range(200)]
        assert entries(store_path) == ["keep-0"]
        assert store.stray_directories == []
        assert "deleting" not in declared(store_path)
        store.create_topic("t")
        assert store.end_offset("t", 0) == 0  # created again: nothing of the old one


@pytest.mark.parametrize("point", ["add_partitions.after_dirs", "checkpoint.after_rename"])
def test_a_kill_during_add_partitions_leaves_the_old_or_new_count(
    store_path: str, point: str
) -> None:
    run_child(CHILD, store_path, "add", point, expect=KILLED)
    with mqcore.open(store_path) as store:
        count = store.partitions("t")
        assert count == (3 if point == "add_partitions.after_dirs" else 5)
        assert len(values(store, "t")) == 200
        if count == 3:  # the new directories are strays, taken over by the next try
            assert [os.path.basename(d) for d in store.stray_directories] == ["t-3", "t-4"]
            store.add_partitions("t", 5)
        for p in (3, 4):
            assert store.end_offset("t", p) == 0
    with mqcore.open(store_path) as store:
        assert store.partitions("t") == 5
        assert store.stray_directories == []


def test_delays_and_transactions_for_a_deleted_topic_do_not_hold_up_the_rest(
    store_path: str,
) -> None:
    """A delayed message and a transaction's message waiting for a topic that is then deleted
    are dropped (with a warning) when their time comes; the others are delivered, and nothing
    stays pending across a reopen."""
    day = 86_400_000
    opts = {"delay_tick_ms": 0, "transaction_check_interval_ms": 0}
    with mqcore.open(store_path, **opts) as store:
        store.create_topic("gone")
        store.create_topic("kept")
        base = store.log.clock()
        store.append("gone", b"late-gone", deliver_at=base + day)
        store.append("kept", b"late-kept", deliver_at=base + day + 1)
        txn = store.begin()
        txn.append("gone", b"txn-gone")
        txn.append("kept", b"txn-kept")
        store.delete_topic("gone")
        txn.commit()
        store.deliver_due(now=base + 2 * day)
        assert store.pending_delays() == 0
        assert sorted(values(store, "kept")) == [b"late-kept", b"txn-kept"]
    with mqcore.open(store_path, **opts) as store:
        assert store.pending_delays() == 0 and store.open_transactions() == []
        assert store.deliver_due(now=2**50) == 0
        assert "gone" not in store.topics()


def test_update_topic_config_reads_and_writes_with_nothing_between(store: mqcore.Store) -> None:
    """Store.update_topic_config computes the change from the settings as they are, under the
    topic's change: 4 threads adding 1 to retention_ms 50 times each lose none of the 200
    increments (a read, then alter_topic_config, would lose some: IncrementalAlterConfigs'
    APPEND and SUBTRACT are computed this way)."""
    import threading

    store.create_topic("t", retention_ms=1000)

    def add_ones() -> None:
        for _ in range(50):
            store.update_topic_config("t", lambda cfg: {"retention_ms": cfg.retention_ms + 1})

    threads = [threading.Thread(target=add_ones) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.topic_config("t").retention_ms == 1200
