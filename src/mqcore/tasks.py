"""The store's background worker: one daemon thread running periodic maintenance tasks.

Retention, compaction, delayed-message delivery and transaction check-back each register a task
here instead of owning a thread. Every task is also callable on demand (the store's methods and
the CLI call the same functions), so tests drive them without waiting for the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_log = logging.getLogger("mqcore")


@dataclass
class _Task:
    name: str
    interval: float
    run: Callable[[], object]
    due: float = 0.0
    failures: int = 0


class BackgroundTasks(threading.Thread):
    """Runs each registered task every `interval_ms`; a failing task warns and is retried at its
    next interval (a full disk must not stop delayed delivery for good), never kills the thread."""

    def __init__(self) -> None:
        super().__init__(name="mqcore-tasks", daemon=True)
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.last_error: BaseException | None = None

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

    def run(self) -> None:
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
            task.failures = 0
        except Exception as e:  # kept for the store to report; the task runs again later
            task.failures += 1
            self.last_error = e
            if task.failures == 1:  # once per run of failures, not at every retry
                _log.warning("background task %r failed: %r", task.name, e)
        finally:
            task.due = time.monotonic()
