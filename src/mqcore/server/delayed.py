"""Requests that wait without holding a thread: Kafka's DelayedOperation and its purgatory.

A Fetch waiting for `min_bytes`, a JoinGroup waiting for the rebalance and a SyncGroup waiting
for the leader's assignment return a `Delayed` instead of blocking their handler thread: the
server's few request threads would otherwise all be asleep in long polls (twenty consumers
rejoining one group would hold twenty threads, and the rebalance they wait for needs a thread
to answer the last JoinGroup). The `Purgatory` keeps each one until it can complete:

- it is checked again whenever one of its keys is woken (an append to a partition it fetches,
  a change in the groups), and at its `recheck()` time (a group's next timer);
- at its `deadline` it is checked for the last time, `final=True`, and must answer then;
- `Purgatory.close()` answers every one at once (the server is stopping).

Checks run on the executor the purgatory is given (the server's request threads), never on the
thread that woke them: an append listener runs inside the appending request. A check is
serialized per operation, and a wake that arrives during a check schedules another, so a wake
is never lost; a new operation is checked once more right after it is registered, which covers
a wake that came between its first check and its registration.

`Delayed.wait()` is the same request answered by blocking the calling thread instead (the
handler's original wait): what `Broker.handle` and direct callers of the handlers use.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

log = logging.getLogger("mqcore.server")

NOT_YET: Any = object()  # a check's answer while the operation cannot complete
MAX_RECHECK = 1.0  # seconds: an operation with a recheck() is looked at least this often


class Delayed:
    """A response that is not ready yet. `poll(final)` returns the handler's result, or
    NOT_YET (never when `final`); `then(result)` turns the result into the response. `block()`
    is the waiting version, for callers that may block a thread. `deadline` (monotonic
    seconds, None: none) is when the final poll happens; `keys` what wakes it; `recheck()`
    when it wants a look without a wake (monotonic seconds)."""

    __slots__ = ("block", "deadline", "keys", "poll", "recheck", "then")

    def __init__(
        self,
        poll: Callable[[bool], Any],
        block: Callable[[], Any],
        *,
        deadline: float | None = None,
        keys: Iterable[Hashable] = (),
        recheck: Callable[[], float] | None = None,
        then: Callable[[Any], Any] = lambda result: result,
    ):
        self.poll, self.block, self.then = poll, block, then
        self.deadline, self.keys, self.recheck = deadline, tuple(keys), recheck

    def wait(self) -> Any:
        """The response, waiting in this thread as long as it takes."""
        return self.then(self.block())


def resolve(result: Any) -> Any:
    """A handler's response, waited for in this thread if it was Delayed."""
    return result.wait() if isinstance(result, Delayed) else result


Done = Callable[[Any, BaseException | None], None]  # (response, error): exactly one of them


class _Op:
    __slots__ = ("delayed", "done", "due", "lock", "on_done", "scheduled")

    def __init__(self, delayed: Delayed, on_done: Done):
        self.delayed, self.on_done = delayed, on_done
        self.lock = threading.Lock()  # one check at a time
        self.done = False
        self.scheduled = False  # a check is queued and has not started
        self.due = float("inf")  # the time its live timer entry fires


class Purgatory:
    """Delayed operations until they complete. `execute(fn)` runs a check somewhere other than
    the waker's thread (the server's request threads); `clock` is monotonic seconds."""

    def __init__(
        self,
        execute: Callable[[Callable[[], None]], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._execute, self._clock = execute, clock
        self._cond = threading.Condition()
        self._watch: dict[Hashable, set[_Op]] = {}
        self._timers: list[tuple[float, int, _Op]] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run_timers, name="mqcore-purgatory",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def __len__(self) -> int:
        with self._cond:
            return len({op for ops in self._watch.values() for op in ops} | self._timed())

    def _timed(self) -> set[_Op]:
        return {op for _, _, op in self._timers if not op.done}

    def add(self, delayed: Delayed, on_done: Done) -> None:
        """Keep `delayed` (its first poll said NOT_YET) until it completes; `on_done(response,
        None)` or `on_done(None, error)` is then called once, on an executor thread."""
        op = _Op(delayed, on_done)
        with self._cond:
            for key in delayed.keys:
                self._watch.setdefault(key, set()).add(op)
            self._arm(op)
        self._schedule(op)  # a wake before the keys were registered is not lost

    def wake(self, key: Hashable) -> None:
        """Check again every operation waiting on `key`."""
        with self._cond:
            ops = list(self._watch.get(key, ()))
        for op in ops:
            self._schedule(op)

    def close(self) -> None:
        """Answer every operation now (final polls), and stop the timer thread."""
        with self._cond:
            self._closed = True
            ops = {op for ops in self._watch.values() for op in ops} | self._timed()
            self._cond.notify_all()
        for op in ops:
            self._schedule(op)
        self._thread.join()

    def _arm(self, op: _Op) -> None:
        """Push op's next timer (its deadline or recheck time, whichever is first); held lock."""
        d = op.delayed
        due = d.deadline if d.deadline is not None else float("inf")
        if d.recheck is not None:
            due = min(due, d.recheck(), self._clock() + MAX_RECHECK)
        if due < float("inf"):
            op.due = due
            heapq.heappush(self._timers, (due, next(self._seq), op))
            self._cond.notify_all()

    def _schedule(self, op: _Op) -> None:
        with self._cond:
            if op.done or op.scheduled:
                return
            op.scheduled = True
        self._execute(lambda: self._check(op))

    def _check(self, op: _Op) -> None:
        with op.lock:
            with self._cond:
                op.scheduled = False  # a wake from now on schedules another check
                if op.done:
                    return
                final = self._closed or (
                    op.delayed.deadline is not None and self._clock() >= op.delayed.deadline
                )
            try:
                result = op.delayed.poll(final)
                if result is NOT_YET:
                    if final:
                        raise RuntimeError("a delayed request did not answer its final poll")
                    with self._cond:
                        self._arm(op)
                    return
                response, error = op.delayed.then(result), None
            except BaseException as e:  # noqa: BLE001 - handed to on_done, which reports it
                response, error = None, e
            with self._cond:
                op.done = True
                for key in op.delayed.keys:
                    waiting = self._watch.get(key)
                    if waiting is not None:
                        waiting.discard(op)
                        if not waiting:
                            del self._watch[key]
        op.on_done(response, error)

    def _run_timers(self) -> None:
        with self._cond:
            while not self._closed:
                now = self._clock()
                while self._timers and self._timers[0][0] <= now:
                    due, _, op = heapq.heappop(self._timers)
                    if not op.done and op.due == due:
                        op.due = float("inf")
                        self._cond.release()
                        try:
                            self._schedule(op)
                        finally:
                            self._cond.acquire()
                wait = self._timers[0][0] - now if self._timers else None
                self._cond.wait(wait)
