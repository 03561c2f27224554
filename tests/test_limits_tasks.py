"""The store's background work never limps on unseen (issue 31): a task that fails runs again
and says so until it recovers, a moment without file descriptors does not stop the flusher for
good, and a task thread that ends stops the store with an error naming why. Before, a creation
that ran out of descriptors kept them all, so every task failed from then on (logged once),
and the flusher's next checkpoint stopped it: every later call raised EMFILE."""

from __future__ import annotations

import errno
import logging
import threading

import pytest

import mqcore
from mqcore.errors import StoreClosedError
from mqcore.storage.partition import Partition


def test_the_flusher_goes_on_after_running_out_of_descriptors(
    store_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Partition.flush
    calls = []
    again = threading.Event()

    def flush(part: Partition) -> int:
        if threading.current_thread().name == "mqcore-flusher":
            calls.append(part)
            if len(calls) == 1:
                raise OSError(errno.EMFILE, "Too many open files")
            again.set()
        return real(part)

    with mqcore.open(store_path, flush="interval", flush_interval_ms=10) as s:
        s.create_topic("t")
        s.append("t", b"first")  # starts the flusher
        monkeypatch.setattr(Partition, "flush", flush)
        s.append("t", b"second")
        assert again.wait(30)  # the flusher's next round, after the failed one
        monkeypatch.setattr(Partition, "flush", real)
        assert s.append("t", b"third").offset == 2
        s.flush()


def test_a_task_thread_that_ends_stops_the_store_with_its_reason(store_path: str) -> None:
    ran = threading.Event()

    def checker_that_exits() -> None:  # e.g. a transaction checker calling sys.exit()
        ran.set()
        raise SystemExit(3)

    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t")
        s.append("t", b"a")  # a new store starts its task thread at its first write
        s.log.tasks.add("exits", 1, checker_that_exits)
        assert ran.wait(30)
        s.log.tasks.join(30)
        assert not s.log.tasks.is_alive()
        with pytest.raises(StoreClosedError, match=r"background tasks ended on SystemExit\(3\)"):
            s.append("t", b"b")
        with pytest.raises(StoreClosedError):
            s.read("t", 0, 0, 10)
    with mqcore.open(store_path, read_only=True) as ro:  # closed as cleanly as ever
        assert [m.value for m in ro.read("t", 0, 0, 10)] == [b"a"]


def test_a_failing_task_runs_again_and_says_when_it_recovers(
    store_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []
    recovered = threading.Event()

    def flaky() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise OSError(errno.EMFILE, "Too many open files")
        recovered.set()

    with caplog.at_level(logging.WARNING, logger="mqcore"):
        with mqcore.open(store_path, flush="os") as s:
            s.create_topic("t")
            s.append("t", b"a")
            s.log.tasks.add("flaky", 1, flaky)
            assert recovered.wait(30)
            failing = s.log.tasks.failing()
            assert "flaky" not in failing
    said = [r.getMessage() for r in caplog.records if "'flaky'" in r.getMessage()]
    assert said[0].startswith("background task 'flaky' failed (1 in a row")
    assert "background task 'flaky' runs again after 3 failures" in said
