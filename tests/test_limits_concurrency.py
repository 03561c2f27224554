"""Topic changes racing on one topic (issue 31): deleting, growing, reconfiguring and creating
it from several threads at once, each call either succeeds or raises the mqcore error of what
it met (UnknownTopicError for a topic deleted under it, TopicExistsError, InvalidConfigError
for a count that is no longer a growth), never a bare KeyError. Before, the existence check
ran outside the log's lock and the lookup inside it: 292 of 480 such requests over the wire
ended with a KeyError. And a creation of many partitions no longer holds up appends: they
wait for no topic change (the log's lock is held only to publish one)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import mqcore
from mqcore.errors import (
    InvalidConfigError,
    MQCoreError,
    TopicExistsError,
    UnknownTopicError,
)
from mqcore.storage.partition import Partition

ROUNDS = 100


def hammer(store: mqcore.Store, topic: str) -> Counter[str]:
    """Four threads changing `topic` ROUNDS times each; what each call ended with."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(4)

    def grow(i: int) -> None:
        store.add_partitions(topic, store.partitions(topic) + 1)

    calls: list[Callable[[int], object]] = [
        lambda i: store.delete_topic(topic),
        grow,
        lambda i: store.alter_topic_config(topic, retention_ms=1000 + i),
        lambda i: store.create_topic(topic, partitions=1),
    ]

    def run(call: Callable[[int], object]) -> None:
        start.wait()
        for i in range(ROUNDS):
            try:
                call(i)
                outcome = "ok"
            except (UnknownTopicError, TopicExistsError, InvalidConfigError) as e:
                outcome = type(e).__name__
            except KeyError as e:  # the bug: a lookup of a topic deleted meanwhile
                outcome = f"KeyError {e!r}"
            with lock:
                seen[outcome] += 1

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def test_racing_changes_of_one_topic_raise_mqcore_errors_only(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t")
        seen = hammer(s, "t")
        assert sum(seen.values()) == 4 * ROUNDS
        assert not [k for k in seen if k.startswith("KeyError")], seen
        assert seen["ok"] > 0 and seen["UnknownTopicError"] > 0
        topics = s.topics()
        count = s.partitions("t") if "t" in topics else 0
    # what the last change left is what the next open finds, with no stray directory
    with mqcore.open(store_path, read_only=True) as ro:
        assert ro.topics() == topics and ro.stray_directories == []
        assert (ro.partitions("t") if "t" in topics else 0) == count


def test_lookups_of_a_deleted_topic_are_unknown_topic_errors(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t", partitions=2)
        s.delete_topic("t")
        for call in (
            lambda: s.alter_topic_config("t", retention_ms=5),
            lambda: s.add_partitions("t", 3),
            lambda: s.delete_topic("t"),
            lambda: s.add_partitions("t", 3, validate_only=True),
        ):
            try:
                call()
            except MQCoreError as e:
                assert isinstance(e, UnknownTopicError), e
            else:
                raise AssertionError("a deleted topic was changed")


def test_appends_do_not_wait_for_a_creation_of_many_partitions(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append (and a replica handle's, as mqcore serve's produce) goes through while a
    creation is halfway: the creation is held at its 500th partition until the appends are
    done, which would deadlock (and fail the waits) if they waited for it."""
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("busy")
        halfway, appended = threading.Event(), threading.Event()
        real = Partition.__init__
        made = []

        def init(part: Partition, *args: Any, **kwargs: Any) -> None:
            made.append(part)
            if len(made) == 500:
                halfway.set()
                assert appended.wait(10), "the appends waited for the creation"
            real(part, *args, **kwargs)

        monkeypatch.setattr(Partition, "__init__", init)
        creator = threading.Thread(target=s.create_topic, args=("big", 1000))
        creator.start()
        assert halfway.wait(30)
        assert s.append("busy", b"during").offset == 0
        assert s.log.replica("busy", 0).log_end_offset == 1
        assert "big" not in s.topics()  # published whole, at the end
        appended.set()
        creator.join()
        assert s.partitions("big") == 1000
