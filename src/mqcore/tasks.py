"""The store's background worker: one daemon thread running periodic maintenance tasks.

Retention, compaction, delayed-message delivery and transaction check-back each register a task
here instead of owning a thread. Every task is also callable on demand (the store's methods and
the CLI call the same functions), so tests drive them without waiting for the thread.

A task that raises an Exception runs again at its next interval (a full disk or a moment
without file descriptors must not stop delayed delivery for good), and says so in the log at
its first failure, every minute while it keeps failing, and when it recovers: it never goes
quiet while it does nothing. A task that raises anything else (SystemExit from a user's
transaction checker, say) stops the thread, and the store fails every later call with that
error (`on_stop`) instead of running on without its background work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_log = logging.getLogger("mqcore")


REPORT_EVERY = 60.0  # seconds between the log lines of a task that keeps failing


@dataclass
class _Task:
    name: str
    interval: float
    run: Callable[[], object]
    due: float = 0.0
    failures: int = 0
    reported: float = 0.0  # when its failing was last logged


class BackgroundTasks(threading.Thread):
    """Runs each registered task every `interval_ms`; a task that raises an Exception runs
    again at its next interval. `on_stop(error)` is told when the thread ends on anything
    else (`error` is kept too)."""

    def __init__(self, on_stop: Callable[[BaseException], None] | None = None) -> None:
        super().__init__(name="mqcore-tasks", daemon=True)
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._on_stop = on_stop
        self.last_error: BaseException | None = None
        self.error: BaseException | None = None  # what stopped the thread, if anything did

    def add(self, name: str, interval_ms: int, run: Callable[[], object]) -> None:
        """Register (or replace) task `name`; it first runs one interval from now."""
        with self._lock:
            self._tasks[name] = _Task(name, interval_ms / 1000.0, run, time.monotonic())
        self._wake.set()

    def remove(self, name: str) -> None:
        with self._lock:
            self._tasks.pop(name, None)

    def names(self) -> list[str]:
        """The registered tasks' names, sorted."""
        with self._lock:
            return sorted(self._tasks)

    def interval_ms(self, name: str) -> int:
        """How often task `name` runs (KeyError for a name not registered)."""
        with self._lock:
            return round(self._tasks[name].interval * 1000)

    def run_task(self, name: str) -> object:
        """Run task `name` once now, in the caller's thread, and return what it returns: what
        the worker thread runs, on demand (errors propagate here, unlike in the thread)."""
        with self._lock:
            fn = self._tasks[name].run
        return fn()

    def wake(self) -> None:
        """Run every task now (used when new work arrived, e.g. a delay that is already due)."""
        with self._lock:
            for task in self._tasks.values():
                task.due = 0.0
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self.is_alive():
            self.join()

    def failing(self) -> dict[str, int]:
        """The tasks whose last run failed, and how many runs in a row failed."""
        with self._lock:
            return {t.name: t.failures for t in self._tasks.values() if t.failures}

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # not a task's Exception (those are retried): the thread ends
            self.error = e
            _log.error("the background tasks stopped: %r", e)
            if self._on_stop is not None:
                self._on_stop(e)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            now = time.monotonic()
            with self._lock:
                due = [t for t in self._tasks.values() if t.due + t.interval <= now]
                nxt = min((t.due + t.interval for t in self._tasks.values()), default=now + 1.0)
            for task in due:
                if self._stopping.is_set():
                    return
                self._run_one(task)
            self._wake.wait(max(0.0, nxt - time.monotonic()) if not due else 0.0)
            self._wake.clear()

    def _run_one(self, task: _Task) -> None:
        try:
            task.run()
        except Exception as e:  # kept for the store to report; the task runs again later
            task.failures += 1
            self.last_error = e
            now = time.monotonic()
            if task.failures == 1 or now - task.reported >= REPORT_EVERY:
                task.reported = now
                _log.warning("background task %r failed (%d in a row; it runs again in %g s): "
                             "%r", task.name, task.failures, task.interval, e)  # fmt: skip
        else:
            if task.failures:
                _log.warning("background task %r runs again after %d failures", task.name,
                             task.failures)  # fmt: skip
            task.failures = 0
        finally:
            task.due = time.monotonic()
