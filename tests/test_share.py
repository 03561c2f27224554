"""Share groups (issue 21): members beyond the partition count, each record acknowledged on its
own, on real stores; the share-partition against a plain model (hypothesis state machine); the
durable state across restarts and SIGKILL."""

from __future__ import annotations

import collections
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from crashchild import run_child
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import mqcore
from mqcore.consume.share import NO_DEADLINE, SharePartition
from mqcore.consume.sharestate import (
    ShareSnapshot,
    decode_value,
    encode_key,
    encode_value,
)
from mqcore.errors import GroupTypeError, InvalidConfigError, InvalidRecordStateError

T0 = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def filled(path: str, n: int, partitions: int = 1) -> mqcore.Store:
    store = mqcore.open(path)
    store.create_topic("t", partitions=partitions)
    for p in range(partitions):
        for lo in range(0, n, 1000):
            store.append_batch("t", [b"m%d" % i for i in range(lo, min(n, lo + 1000))], partition=p)
    return store


# -- the share-partition against a plain model -------------------------------------------------

LIMIT = 3
LOCK = 100


class ShareModel(RuleBasedStateMachine):
    """SharePartition driven by random acquisitions, acknowledgements, expiries, departures
    and restarts (snapshot, encode, decode, rebuild) beside a model that keeps every offset of
    a 40-record log with its state: a list, no window, no dict order."""

    N = 40

    def __init__(self) -> None:
        super().__init__()
        self.sp = SharePartition(0)
        self.now = 0
        # per offset: None (not taken yet), "done", or [member | None, count, expiry]
        self.model: list[object] = [None] * self.N

    def model_start(self) -> int:
        for off, s in enumerate(self.model):
            if s != "done":
                return off
        return self.N

    def held(self) -> list[tuple[int, str]]:
        return [
            (off, s[0])
            for off, s in enumerate(self.model)
            if isinstance(s, list) and s[0] is not None and s[2] > self.now
        ]

    def model_expire(self) -> None:
        for off, s in enumerate(self.model):
            if isinstance(s, list) and s[0] is not None and s[2] <= self.now:
                self.model[off] = "done" if s[1] >= LIMIT else [None, s[1], 0]

    @rule(member=st.sampled_from("ab"), room=st.integers(1, 8))
    def acquire(self, member: str, room: int) -> None:
        self.model_expire()
        for o in self.sp.expire(self.now, LIMIT):
            assert o.ended in ("released", "archived")
        got = self.sp.acquire_available(member, self.now, LOCK, room)
        want = [off for off, s in enumerate(self.model) if isinstance(s, list) and s[0] is None][
            :room
        ]
        assert got == want
        for off in want:
            s = self.model[off]
            assert isinstance(s, list)
            self.model[off] = [member, s[1] + 1, self.now + LOCK]
        left = room - len(got)
        new = [off for off in range(self.sp.end, self.N)][: max(0, left)]
        if new and left > 0:
            skip = len(new) > 2 and self.now % 2 == 0  # a filtered (passed over) record
            offsets = [o for o in new if not (skip and o == new[1])]
            self.sp.acquire_new(offsets, new[-1] + 1, member, self.now, LOCK)
            for off in new:
                self.model[off] = "done" if off not in offsets else [member, 1, self.now + LOCK]

    @precondition(lambda self: bool(self.held()))
    @rule(data=st.data(), kind=st.sampled_from(["accept", "release", "reject", "renew"]))
    def acknowledge(self, data: st.DataObject, kind: str) -> None:
        off, member = data.draw(st.sampled_from(self.held()))
        o = self.sp.acknowledge(member, off, kind, self.now, LOCK, LIMIT)
        s = self.model[off]
        assert isinstance(s, list)
        if kind in ("accept", "reject"):
            self.model[off] = "done"
        elif kind == "renew":
            s[2] = self.now + LOCK
        else:
            self.model[off] = "done" if s[1] >= LIMIT else [None, s[1], 0]
        assert o.deliveries == s[1]

    @rule(data=st.data())
    def acknowledge_what_is_not_held(self, data: st.DataObject) -> None:
        off = data.draw(st.integers(0, self.N - 1))
        member = data.draw(st.sampled_from("ab"))
        if (off, member) in self.held():
            return
        with pytest.raises(InvalidRecordStateError):
            self.sp.acknowledge(member, off, "accept", self.now, LOCK, LIMIT)

    @rule(ms=st.integers(1, 150))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(log_start=st.integers(0, N))
    def retention(self, log_start: int) -> None:
        """Retention or DeleteRecords moved the log start: what lies below it is done."""
        self.sp.forget_below(log_start)
        self.model[:log_start] = ["done"] * log_start

    @rule(data=st.data())
    def compacted_away(self, data: st.DataObject) -> None:
        off = data.draw(st.integers(0, self.N - 1))
        if off < self.sp.end:
            self.sp.drop(off)
            self.model[off] = "done"

    @rule(log_end=st.integers(0, N))
    def log_cut_back(self, log_end: int) -> None:
        """Recovery cut a torn tail: offsets from log_end on are written afresh later."""
        if log_end < self.sp.end:
            self.sp.cut_back(log_end)
            self.model[log_end:] = [None] * (self.N - log_end)

    @rule(member=st.sampled_from("ab"))
    def leave(self, member: str) -> None:
        self.sp.release_member(member, LIMIT)
        for off, s in enumerate(self.model):
            if isinstance(s, list) and s[0] == member:
                self.model[off] = "done" if s[1] >= LIMIT else [None, s[1], 0]

    @rule()
    def restart(self) -> None:
        """Only the durable form survives: every lock is gone, counts are kept."""
        snap = decode_value(encode_value(self.sp.snapshot()))
        self.sp = SharePartition(snap.end, snap.pending())
        for off, s in enumerate(self.model):
            if isinstance(s, list):
                self.model[off] = [None, s[1], 0]

    @invariant()
    def same_window(self) -> None:
        assert self.sp.start == self.model_start()
        for off, s in enumerate(self.model):
            rec = self.sp.records.get(off)
            if isinstance(s, list):
                assert rec is not None and rec.count == s[1], off
                assert (rec.member if rec.state else None) == s[0], off
            else:
                assert rec is None, off
        # the counters and the expiry bound kept beside the records agree with them
        held = [s for s in self.model if isinstance(s, list)]
        acquired = [s for s in held if s[0] is not None]
        assert self.sp.counts() == (len(held) - len(acquired), len(acquired))
        assert self.sp.next_expiry() <= min((s[2] for s in acquired), default=NO_DEADLINE)


ShareModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_share_partition_matches_the_model = ShareModel.TestCase


# -- the durable form ----------------------------------------------------------------------------


def test_share_state_values_round_trip_and_junk_is_refused() -> None:
    snap = ShareSnapshot(10, 30, ((10, 3, 1), (14, 1, 5), (20, 10, 2)))
    assert decode_value(encode_value(snap)) == snap
    assert snap.pending()[14] == 5 and 13 not in snap.pending()
    raw = encode_value(snap)
    for bad in (raw[:-1], raw + b"\0", raw[:2] + b"\xff" + raw[3:]):
        with pytest.raises(ValueError):
            decode_value(bad)
    overlapping = ShareSnapshot(10, 30, ((10, 5, 1), (12, 1, 1)))
    with pytest.raises(ValueError, match="bad run"):
        decode_value(encode_value(overlapping))


def test_junk_in_the_state_topic_is_skipped_and_reported(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with filled(path, 10) as store:
        with store.share_consumer("g", "t") as sc:
            assert len(sc.poll(4)) == 4
            sc.commit()
        store.log.append_records(
            "__share_group_state", 0, [b"junk"], [encode_key("g", "t", 0)]
        )  # a value that is no snapshot: the last good one stands
    with mqcore.open(path) as store:
        assert store.share_group_lag("g")["g"][0].start == 4
        assert [r.reason for r in store.skipped_records()][-1].startswith("not a share state")


# -- many members on one partition -----------------------------------------------------------


def test_four_members_on_one_partition_accept_each_record_once(tmp_path: Path) -> None:
    """100,000 records, four members in four threads, explicit acknowledgements: the union of
    what they accepted is the log, nothing twice, and each did at least 15 % of the work."""
    n = 100_000
    with filled(str(tmp_path / "s"), n) as store:
        accepted: dict[str, list[int]] = {}
        errors: list[BaseException] = []

        def member(i: int) -> None:
            try:
                with store.share_consumer("workers", "t", explicit_ack=True) as sc:
                    mine = accepted.setdefault(sc.member_id, [])
                    while True:
                        msgs = sc.poll(100, timeout_ms=200)
                        if not msgs:
                            if store.share_group_lag("workers")["workers"][0].available == 0:
                                return
                            continue
                        for m in msgs:
                            sc.acknowledge(m, "accept")
                            mine.append(m.offset)
                        sc.commit()
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=member, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        every = [o for offs in accepted.values() for o in offs]
        assert len(every) == n and sorted(every) == list(range(n))
        assert len(accepted) == 4
        assert min(len(v) for v in accepted.values()) >= 0.15 * n, {
            k: len(v) for k, v in accepted.items()
        }
        lag = store.share_group_lag("workers")["workers"][0]
        assert (lag.start, lag.available, lag.in_flight) == (n, 0, 0)


def test_more_members_than_partitions_all_get_work(tmp_path: Path) -> None:
    with filled(str(tmp_path / "s"), 300, partitions=2) as store:
        members = [store.share_consumer("g", "t") for _ in range(5)]
        got = [m.poll(50) for m in members]
        assert all(len(g) == 50 for g in got)
        offsets = [(m.partition, m.offset) for g in got for m in g]
        assert len(set(offsets)) == 250
        for m in members:
            m.close()


# -- locks, releases, poison records ------------------------------------------------------------


def test_a_member_that_stops_acking_loses_its_records_when_the_lock_expires(
    tmp_path: Path,
) -> None:
    clock = Clock()
    with filled(str(tmp_path / "s"), 20) as store:
        a = store.share_consumer("g", "t", record_lock_ms=1000, now_ms=clock, explicit_ack=True)
        b = store.share_consumer("g", "t", record_lock_ms=1000, now_ms=clock, explicit_ack=True)
        held = a.poll(10)
        assert [m.offset for m in held] == list(range(10))
        mine = b.poll(20)
        assert [m.offset for m in mine] == list(range(10, 20))
        for m in mine:
            b.acknowledge(m)
        clock.now += 999
        assert b.poll(20) == []  # a's locks still hold
        clock.now += 1
        again = b.poll(20)
        assert [(m.offset, m.delivery_count) for m in again] == [(o, 2) for o in range(10)]
        with pytest.raises(InvalidRecordStateError, match="not held by this member"):
            a.acknowledge(held[0])
        for m in again:
            b.acknowledge(m)
        b.commit()
        assert store.share_group_lag("g")["g"][0].start == 20


def test_a_poison_record_is_archived_at_the_limit_and_dead_lettered(tmp_path: Path) -> None:
    """Record 3 fails every time it is processed: released five times, then archived and
    copied to `__dlq.<group>` with its origin headers; the others flow meanwhile."""
    with filled(str(tmp_path / "s"), 10) as store:
        sc = store.share_consumer("g", "t", explicit_ack=True, dead_letter=True)
        done: list[int] = []
        deliveries = collections.Counter()
        for _ in range(20):
            msgs = sc.poll(3)
            if not msgs:
                break
            for m in msgs:
                deliveries[m.offset] += 1
                assert m.delivery_count == deliveries[m.offset]
                if m.offset == 3:
                    sc.acknowledge(m, "release")
                else:
                    sc.acknowledge(m, "accept")
                    done.append(m.offset)
        assert sorted(done) == [o for o in range(10) if o != 3]
        assert deliveries[3] == 5
        dlq = store.read("__dlq.g", 0, 0, 10)
        assert [m.value for m in dlq] == [b"m3"]
        assert dlq[0].header("mq.origin.offset") == b"3"
        assert dlq[0].header("mq.reconsume") == b"5"
        lag = store.share_group_lag("g")["g"][0]
        assert (lag.start, lag.available, lag.in_flight) == (10, 0, 0)
        sc.close()


def test_reject_ends_a_record_and_renew_keeps_the_lock(tmp_path: Path) -> None:
    clock = Clock()
    with filled(str(tmp_path / "s"), 4) as store:
        a = store.share_consumer("g", "t", explicit_ack=True, record_lock_ms=100, now_ms=clock)
        b = store.share_consumer("g", "t", explicit_ack=True, record_lock_ms=100, now_ms=clock)
        m0, m1, m2, m3 = a.poll(4)
        a.acknowledge(m0, "reject")
        clock.now += 90
        a.acknowledge(m1, "renew")
        clock.now += 20  # m2's and m3's locks expired, m1's was renewed
        assert [m.offset for m in b.poll(10)] == [2, 3]
        a.acknowledge(m1, "accept")
        with pytest.raises(InvalidRecordStateError, match="done already"):
            a.acknowledge(m0, "accept")


def test_explicit_mode_refuses_a_poll_with_unacknowledged_records(tmp_path: Path) -> None:
    with filled(str(tmp_path / "s"), 4) as store:
        sc = store.share_consumer("g", "t", explicit_ack=True)
        first = sc.poll(2)
        sc.acknowledge(first[0])
        with pytest.raises(InvalidRecordStateError, match="not acknowledged"):
            sc.poll(2)
        sc.acknowledge(first[1], "release")
        assert [m.offset for m in sc.poll(2)] == [1, 2]


def test_implicit_mode_accepts_the_previous_poll(tmp_path: Path) -> None:
    with filled(str(tmp_path / "s"), 6) as store:
        sc = store.share_consumer("g", "t")
        assert [m.offset for m in sc.poll(2)] == [0, 1]
        assert [m.offset for m in sc.poll(2)] == [2, 3]
        lag = store.share_group_lag("g")["g"][0]
        assert (lag.start, lag.in_flight) == (2, 2)
        sc.close()  # accepts 2, 3
        lag = store.share_group_lag("g")["g"][0]
        assert (lag.start, lag.available, lag.in_flight) == (4, 2, 0)


def test_the_window_is_bounded(tmp_path: Path) -> None:
    with filled(str(tmp_path / "s"), 50) as store:
        a = store.share_consumer("g", "t", explicit_ack=True, max_in_flight_records=10)
        b = store.share_consumer("g", "t", explicit_ack=True, max_in_flight_records=10)
        held = a.poll(50)
        assert len(held) == 10 and b.poll(50) == []  # at the bound: nothing new
        a.acknowledge(held[0])
        assert [m.offset for m in b.poll(50)] == [10]  # one slot freed
        with pytest.raises(InvalidConfigError, match="cannot join"):
            store.share_consumer("g", "t", max_in_flight_records=11)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with filled(str(tmp_path / "s"), 2) as store:
        for kw in (
            {"record_lock_ms": 0},
            {"delivery_count_limit": 0},
            {"explicit_ack": 1},
            {"auto_offset_reset": "none"},
        ):
            with pytest.raises(InvalidConfigError):
                store.share_consumer("g", "t", **kw)
        with pytest.raises(mqcore.errors.UnknownTopicError):
            store.share_consumer("g", "nope")
        sc = store.share_consumer("g", "t", explicit_ack=True)
        (m, _) = sc.poll(2)
        with pytest.raises(InvalidConfigError, match="acknowledgement"):
            sc.acknowledge(m, "maybe")
        sc.close()
        with pytest.raises(mqcore.errors.ConsumerClosedError):
            sc.poll()


# -- durability: restarts and SIGKILL ---------------------------------------------------------


def test_committed_acknowledgements_survive_a_restart_and_counts_are_kept(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "s")
    with filled(path, 30) as store:
        sc = store.share_consumer("g", "t", explicit_ack=True)
        msgs = sc.poll(20)
        for m in msgs[:10]:
            sc.acknowledge(m)
        sc.commit()
        for m in msgs[10:15]:
            sc.acknowledge(m)  # not committed: may or may not survive
        store.close()  # without closing the member: its locks die with the process
    with mqcore.open(path) as store:
        lag = store.share_group_lag("g")["g"][0]
        assert lag.start >= 10 and lag.in_flight == 0
        sc = store.share_consumer("g", "t", explicit_ack=True)
        again = sc.poll(100)
        offsets = [m.offset for m in again]
        assert not set(offsets) & set(range(10))
        assert set(range(15, 30)) <= set(offsets)
        counts = {m.offset: m.delivery_count for m in again}
        assert all(counts[o] == 2 for o in range(15, 20))  # the poll's count was written
        assert all(counts[o] == 1 for o in range(20, 30))
        sc.close()


WORKER = r"""
import sys
import mqcore
path = sys.argv[1]
store = mqcore.open(path, flush="os")
members = [store.share_consumer("g", "t", explicit_ack=True) for _ in range(2)]
turn = 0
while True:
    turn += 1
    sc = members[turn % 2]  # two members take turns: the commit of one covers the other's
    msgs = sc.poll(7, timeout_ms=100)
    if not msgs:
        msgs = members[(turn + 1) % 2].poll(7, timeout_ms=100)
        sc = members[(turn + 1) % 2]
        if not msgs:
            break
    kept = [m for m in msgs if not (m.offset % 11 == 0 and m.delivery_count < 2)]
    for m in msgs:
        sc.acknowledge(m, "accept" if m in kept else "release")
    print("try", *(m.offset for m in kept), flush=True)
    sc.commit()
    print("done", flush=True)
"""


@pytest.mark.parametrize(
    "kill",
    [
        "lines:5",
        "lines:40",
        "share_state.after_append:9",
        "share_state.after_fdatasync:12",
        "share_state.after_append:30",
    ],
)
def test_sigkill_of_the_store_loses_no_acknowledgement(tmp_path: Path, kill: str) -> None:
    """kill -9 while a member acknowledges and commits: after reopen no record whose commit
    returned is delivered again, and every other record is delivered (at least once)."""
    path = str(tmp_path / "s")
    filled(path, 600).close()
    how, _, n = kill.partition(":")
    if how == "lines":
        child = run_child(WORKER, path, kill_when=lambda lines: len(lines) >= int(n))
    else:
        child = run_child(WORKER, path, crash_at=kill)
    committed: set[int] = set()
    unsure: set[int] = set()  # accepted in the commit the kill interrupted: either way
    for line in child.lines:
        if line.startswith("try"):
            unsure = {int(o) for o in line.split()[1:]}
        elif line == "done":
            committed |= unsure
            unsure = set()
    with mqcore.open(path) as store:
        sc = store.share_consumer("g", "t", explicit_ack=True)
        rest: list[int] = []
        while msgs := sc.poll(100):
            for m in msgs:
                sc.acknowledge(m)
            rest += [m.offset for m in msgs]
        assert not committed & set(rest)
        assert set(range(600)) - committed - unsure <= set(rest)
        assert len(rest) == len(set(rest))
        sc.close()


def test_share_groups_of_a_read_only_store(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with filled(path, 10) as store, store.share_consumer("g", "t") as sc:
        sc.poll(4)
        sc.commit()
    with mqcore.open(path, read_only=True) as ro:
        (lag,) = ro.share_group_lag("g")["g"]
        assert (lag.start, lag.end, lag.available, lag.in_flight) == (4, 4, 6, 0)
        with pytest.raises(mqcore.errors.ReadOnlyStoreError):
            ro.share_consumer("g", "t")


def test_random_acks_against_brute_force(tmp_path: Path) -> None:
    """Three members, random accept/release/reject/expiry over 2,000 records in 3 partitions:
    every record ends exactly once (accepted, rejected or archived), the trace of outcomes
    matches what each member saw."""
    rng = random.Random(3)
    clock = Clock()
    with filled(str(tmp_path / "s"), 2000 // 3, partitions=3) as store:
        total = 3 * (2000 // 3)
        members = [
            store.share_consumer(
                "g",
                "t",
                explicit_ack=True,
                record_lock_ms=50,
                now_ms=clock,
                delivery_count_limit=3,
            )  # fmt: skip
            for _ in range(3)
        ]
        ended: collections.Counter[tuple[int, int]] = collections.Counter()
        deliveries: collections.Counter[tuple[int, int]] = collections.Counter()
        idle = 0
        while idle < 5:
            clock.now += rng.choice([1, 1, 1, 60])
            progressed = False
            for sc in members:
                try:
                    msgs = sc.poll(rng.randint(1, 40))
                except InvalidRecordStateError:
                    continue
                for m in msgs:
                    key = (m.partition, m.offset)
                    deliveries[key] += 1
                    assert m.delivery_count == deliveries[key]
                    kind = rng.choice(["accept", "accept", "release", "reject", "skip"])
                    if kind == "skip":  # the lock expires later: released
                        continue
                    sc.acknowledge(m, kind)
                    if kind != "release":
                        ended[key] += 1
                    elif deliveries[key] >= 3:
                        ended[key] += 1  # archived at the limit
                progressed |= bool(msgs)
            idle = 0 if progressed else idle + 1
            if not progressed:
                clock.now += 100
        for key, n in deliveries.items():
            if n >= 3 and not ended[key]:
                ended[key] += 1  # archived by an expiry at the limit
        assert set(ended) == {(p, o) for p in range(3) for o in range(total // 3)}
        assert set(ended.values()) == {1}
        for sc in members:
            sc.close()
        assert all(r.available == 0 for r in store.share_group_lag("g")["g"])


def test_state_topic_is_internal(tmp_path: Path) -> None:
    with filled(str(tmp_path / "s"), 2) as store:
        with store.share_consumer("g", "t") as sc:
            sc.poll()
        with pytest.raises(mqcore.errors.InternalTopicError):
            store.append("__share_group_state", b"x")
        assert os.path.isdir(os.path.join(str(tmp_path / "s"), "__share_group_state-0"))


def test_trace_shows_who_got_a_record_and_how_it_ended(tmp_path: Path) -> None:
    """With tracing on, store.trace(uid) answers "who got message X, when, how many times,
    and was it accepted": a delivered event per delivery (member, count), an acknowledged
    event per outcome."""
    clock = Clock()
    with mqcore.open(str(tmp_path / "s"), trace=True) as store:
        store.create_topic("t")
        uid = store.append("t", b"x").unique_id
        a = store.share_consumer("g", "t", explicit_ack=True, now_ms=clock, record_lock_ms=10)
        b = store.share_consumer("g", "t", explicit_ack=True, now_ms=clock, record_lock_ms=10)
        (m,) = a.poll()
        a.acknowledge(m, "release")
        (m,) = b.poll()
        b.acknowledge(m, "accept")
        events = [(e.event, e.detail) for e in store.trace(uid) if e.group == "g"]
        assert events == [
            ("delivered", {"member": a.member_id, "delivery_count": 1}),
            ("acknowledged", {"share": "released", "delivery_count": 1, "member": a.member_id}),
            ("delivered", {"member": b.member_id, "delivery_count": 2}),
            ("acknowledged", {"share": "accepted", "delivery_count": 2, "member": b.member_id}),
        ]


def test_history_tells_each_share_step_once_with_tracing_on(tmp_path: Path) -> None:
    """store.history(m) (what `mqcore trace` and the console show): the appended event from
    the trace and each share step from the pull log, once; the share group's own trace events
    say the same and are left out, a consumer group's stay."""
    with mqcore.open(str(tmp_path / "s"), trace=True) as store:
        store.create_topic("t")
        uid = store.append("t", b"x").unique_id
        sc = store.share_consumer("g", "t", explicit_ack=True)
        (m,) = sc.poll()
        sc.acknowledge(m, "release")
        (m,) = sc.poll()
        sc.acknowledge(m, "accept")
        sc.commit()
        with store.consumer("c", "t") as c:
            assert len(c.poll(10)) == 1
            c.commit()
        assert {e.group for e in store.trace(uid)} == {None, "g", "c"}
        got = [(e.event, e.group) for e in store.history(m)]
        assert got[0] == ("appended", None)
        assert [g for g in got if g[1] == "g"] == [
            ("share_delivered", "g"), ("share_released", "g"),
            ("share_delivered", "g"), ("share_accepted", "g"),
        ]  # fmt: skip
        assert [g for g in got if g[1] == "c"] == [
            (e.event, "c") for e in store.trace(uid) if e.group == "c"
        ]
        assert len(got) == 1 + 4 + sum(1 for e in store.trace(uid) if e.group == "c")


def test_the_pull_log_says_who_got_each_record_and_is_trimmed_behind_the_start(
    tmp_path: Path,
) -> None:
    """Every delivery and outcome is in `__pull.<group>` in order (checked against what each
    member saw); once the share-partition start passes them their segments go."""
    clock = Clock()
    path = str(tmp_path / "s")
    with filled(path, 400) as store:
        # small segments, so that trimming (whole segments only) shows in a short test
        store.log.internal_topic("__pull.g", unique_ids=False, key_index=False, segment_bytes=2048)
        a = store.share_consumer("g", "t", explicit_ack=True, now_ms=clock, record_lock_ms=10)
        b = store.share_consumer("g", "t", explicit_ack=True, now_ms=clock, record_lock_ms=10)
        seen: list[tuple[str, int, int, str]] = []
        first = a.poll(3)
        seen += [(a.member_id, m.offset, 1, "delivered") for m in first]
        clock.now += 10  # a's locks expire: b gets them, a's are released
        again = b.poll(3)
        seen += [(a.member_id, m.offset, 1, "released") for m in first]
        seen += [(b.member_id, m.offset, 2, "delivered") for m in again]
        b.acknowledge(again[0], "accept")
        b.acknowledge(again[1], "reject")
        b.acknowledge(again[2], "release")
        seen += [
            (b.member_id, again[0].offset, 2, "accepted"),
            (b.member_id, again[1].offset, 2, "rejected"),
            (b.member_id, again[2].offset, 2, "released"),
        ]
        log = store.share_pull_log("g")
        assert [(e.member, e.offset, e.delivery_count, e.event) for e in log] == seen
        assert [e.position for e in log] == sorted(e.position for e in log)
        assert [e.event for e in store.share_pull_log("g", topic="t", partition=0, offset=2)] == [
            "delivered", "released", "delivered", "released",
        ]  # fmt: skip
        assert {e.member for e in store.share_pull_log("g", member=a.member_id)} == {a.member_id}
        # work through everything: the start passes all, the old segments of the log go
        while msgs := b.poll(50):
            for m in msgs:
                b.acknowledge(m)
            b.commit()
        pull = store.log.partition("__pull.g", 0)
        assert 0 < pull.start_offset < pull.end_offset
        # what is left starts in the last segment: records behind the start may share it
        assert min(e.position for e in store.share_pull_log("g")) == pull.start_offset
        a.close()
        b.close()
    with mqcore.open(path, read_only=True) as ro:
        kept = ro.share_pull_log("g")
        assert kept and kept[-1].event == "accepted" and kept[-1].offset == 399


def test_mqcore_trace_shows_share_deliveries_without_tracing(tmp_path: Path) -> None:
    """The pull log is always on: `mqcore trace UID` lists what share groups did with the
    message even when the store never traced."""
    path = str(tmp_path / "s")
    with mqcore.open(path) as store:
        store.create_topic("t")
        uid = store.append("t", b"x").unique_id
        store.append("t", b"y")
        sc = store.share_consumer("g", "t", explicit_ack=True)
        for m in sc.poll():
            sc.acknowledge(m, "release" if m.value == b"x" else "accept")
        for m in sc.poll():
            sc.acknowledge(m, "accept")
        sc.close()
        member = sc.member_id
    rc, out, err = run_cli("trace", path, uid, "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["event"], r["offset"], r["group"], r["detail"]) for r in rows] == [
        ("share_delivered", 0, "g", {"member": member, "delivery_count": 1}),
        ("share_released", 0, "g", {"member": member, "delivery_count": 1}),
        ("share_delivered", 0, "g", {"member": member, "delivery_count": 2}),
        ("share_accepted", 0, "g", {"member": member, "delivery_count": 2}),
    ]


@pytest.mark.parametrize(
    ("filters", "keep"),
    [
        ({"tag": "red"}, lambda i: i % 3 == 0),
        ({"where": "n > 20000 AND region = 'eu'"}, lambda i: i > 20000 and i % 2 == 0),
        ({"tag": "red", "where": "region = 'us'"}, lambda i: i % 3 == 0 and i % 2 == 1),
    ],
)
def test_filters_pass_records_over_and_they_count_as_done(
    tmp_path: Path, filters: dict[str, str], keep: Any
) -> None:
    """Tag and SQL92 filters as the consumer's (the same fetch): members get exactly the
    records that match (brute force over what was appended), the others are done at once, so
    the group's start passes them; more than one filter budget of non-matching records before
    the first match does not stop a poll that may wait."""
    n = 40_000
    with mqcore.open(str(tmp_path / "s")) as store:
        store.create_topic("t")
        for lo in range(0, n, 1000):
            idx = range(lo, lo + 1000)
            store.append_batch(
                "t",
                [b"m%d" % i for i in idx],
                tags=["red" if i % 3 == 0 else "blue" for i in idx],
                properties=[{"n": str(i), "region": "eu" if i % 2 == 0 else "us"} for i in idx],
                partition=0,
            )
        members = [store.share_consumer("g", "t", explicit_ack=True, **filters) for _ in range(2)]
        got: list[int] = []
        while True:
            progressed = False
            for sc in members:
                msgs = sc.poll(500, timeout_ms=2000)
                for m in msgs:
                    sc.acknowledge(m)
                got += [m.offset for m in msgs]
                progressed |= bool(msgs)
            if not progressed:
                break
        assert sorted(got) == [i for i in range(n) if keep(i)]
        (lag,) = store.share_group_lag("g")["g"]
        assert (lag.start, lag.end, lag.available, lag.in_flight) == (n, n, 0, 0)
        with pytest.raises(InvalidConfigError, match="cannot join"):
            store.share_consumer("g", "t", where="n > 1")
        for sc in members:
            sc.close()


# -- one type per group name -------------------------------------------------------------------


def test_a_group_name_is_either_a_consumer_group_or_a_share_group(tmp_path: Path) -> None:
    """Kafka keeps one type per group ID; mqcore too, or both kinds would dead-letter into one
    `__dlq.<group>`. The type lasts as long as the group's offsets or share state, also
    across a reopen, and deleting a consumer group's offsets frees the name."""
    path = str(tmp_path / "s")
    with filled(path, 10) as store:
        assert store.group_type("c") is None and store.group_type("s") is None
        with store.consumer("c", "t") as c:  # members, nothing committed yet
            assert store.group_type("c") == "consumer"
            with pytest.raises(GroupTypeError, match="'c' is a consumer group"):
                store.share_consumer("c", "t")
            c.poll(3)
            c.commit()
        with store.share_consumer("s", "t") as sc:
            assert store.group_type("s") == "share"
            with pytest.raises(GroupTypeError, match="'s' is a share group"):
                store.consumer("s", "t")
            sc.poll(3)
            sc.commit()
    with mqcore.open(path) as store:  # the committed offsets and the share state say so
        assert store.group_type("c") == "consumer" and store.group_type("s") == "share"
        with pytest.raises(GroupTypeError):
            store.share_consumer("c", "t")
        with pytest.raises(GroupTypeError):
            store.consumer("s", "t")
        store.delete_group("c")
        assert store.group_type("c") is None
        with store.share_consumer("c", "t") as sc:
            assert len(sc.poll(10)) == 10
    with mqcore.open(path, read_only=True) as store:
        assert store.group_type("c") == "share" and store.group_type("s") == "share"
