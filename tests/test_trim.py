"""Trimming the internal topics of transactions and delays (consume/trim.py, docs/consume.md
"Trimming the internal topics"): the disk they use stays bounded however many transactions
and delayed messages go through, and trimming never loses or duplicates a message: an open
transaction still commits (its messages in send order), a pending delay is still delivered,
across restarts, kills and power cuts."""

from __future__ import annotations

import os
import random
import textwrap
from collections import Counter
from pathlib import Path

import powerloss
import pytest
from crashchild import KILLED, run_child

import mqcore
from mqcore.clock import now_ms
from mqcore.produce.delay import DAY_MS, DELAY_STATE_TOPIC, DELAY_TOPIC
from mqcore.produce.transactions import HALF_TOPIC, OP_TOPIC

HERE = os.path.dirname(os.path.abspath(__file__))
TRIMMED = (HALF_TOPIC, OP_TOPIC, DELAY_TOPIC, DELAY_STATE_TOPIC)
SEGMENT = 64 << 10
OPTIONS = {
    "flush": "os",
    "transaction_check_interval_ms": 0,
    "delay_tick_ms": 0,
    "transaction_timeout_ms": 0,
    "transaction_check_max": 10_000,
    # store defaults, so the internal topics take them: small segments, small indexes
    "segment_bytes": SEGMENT,
    "segment_index_bytes": 1 << 16,
    "key_index_entries": 4096,
    "preallocate_bytes": 0,
}


def open_store(path: str, **options: object) -> mqcore.Store:
    return mqcore.open(path, **{**OPTIONS, **options})


def disk_used(path: str) -> int:
    """Bytes of disk (allocated blocks) the files of the trimmed topics hold."""
    total = 0
    for topic in TRIMMED:
        directory = os.path.join(path, f"{topic}-0")
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                total += os.stat(os.path.join(directory, name)).st_blocks * 512
    return total


def values(store: mqcore.Store, topic: str = "t") -> list[bytes | None]:
    return [m.value for m in store.read(topic, 0, store.start_offset(topic, 0), 1 << 30)]


# Per topic, what a trim keeps is at most the data written since the previous trim plus two
# segments (the active one, and the one the boundary falls in): here about 300 KB of records a
# trim interval in all four topics, and 64 KiB segments, plus the blocks an active segment's
# mapped indexes get ahead of their entries (64 KiB a region: durable.back_pages). 1.5 MiB is a
# bound that does not depend on how many cycles ran; without trimming 10,000 cycles take over
# 6 MB.
BOUND = 3 << 19
TRIM_EVERY = 1000


@pytest.mark.slow
def test_disk_stays_bounded_over_many_transaction_and_delay_cycles(fast_path):
    """Transactions (2 of 3 committed, 1 rolled back) and delayed messages (batches of 100,
    delivered), retention (which trims) every 1,000 cycles; an open transaction and a delay due
    in 30 days stay across every trim (re-parked) and a restart.

    100,000 cycles: 100 trims. The bound is checked at every trim, so the run passes through
    and checks everything a 10,000-cycle run did (it was a second case, 8 s of the suite)."""
    cycles = 100_000
    base = now_ms() + DAY_MS  # due times ahead of the clock: no background wake-up
    expected: Counter[bytes | None] = Counter()
    with open_store(fast_path) as store:
        store.create_topic("t", segment_bytes=1 << 30)
        long = store.begin("long")
        long.append_batch("t", [b"L0", b"L1", b"L2"])
        store.append("t", b"FAR", deliver_at=base + 30 * DAY_MS)
        most = 0
        for i in range(cycles):
            txn = store.begin()
            txn.append("t", b"v%d" % i)
            if i % 3 == 2:
                txn.rollback()
            else:
                txn.commit()
                expected[b"v%d" % i] += 1
            if i % 100 == 99:
                batch = [b"d%d" % j for j in range(i - 99, i + 1)]
                store.append_batch("t", batch, deliver_at=base)
                assert store.deliver_due(now=base) == 100
                expected.update(batch)
            if i % TRIM_EVERY == TRIM_EVERY - 1:
                store.apply_retention()
                most = max(most, disk_used(fast_path))
        assert most <= BOUND, f"the trimmed topics reached {most} bytes"
        assert all(store.start_offset(t, 0) > 0 for t in TRIMMED)
    with open_store(fast_path) as store:  # a restart reads what the trims left
        store.set_transaction_checker(lambda info: "commit")  # asked about every open one
        assert store.check_transactions(now=2**50) == {"long": "committed"}
        assert store.deliver_due(now=base + 30 * DAY_MS) == 1
        assert store.deliver_due(now=2**50) == 0  # it was the only one pending
        got = values(store)
        expected.update([b"L0", b"L1", b"L2", b"FAR"])
        assert Counter(got) == expected
        assert [v for v in got if v in (b"L0", b"L1", b"L2")] == [b"L0", b"L1", b"L2"]


class Model:
    """What the store must hold: open transactions (values in send order), committed and
    delivered values, pending delays."""

    def __init__(self) -> None:
        self.open: dict[str, list[bytes]] = {}
        self.visible: Counter[bytes] = Counter()
        self.pending: dict[bytes, int] = {}  # value -> deliver_at


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_trims_between_random_steps_and_restarts_lose_and_duplicate_nothing(fast_path, seed):
    """Random sends, check-back decisions (commit, rollback, unknown), delayed sends,
    deliveries, trims and restarts on 4 KiB segments, against a model: after every restart the
    open transactions and pending delays are exactly the model's, and the topic holds exactly
    the committed and delivered messages, each transaction's in send order."""
    rng = random.Random(seed)
    model = Model()
    clock = now_ms() + DAY_MS  # due times ahead of the clock: no background wake-up
    answers: dict[str, str] = {}
    handles: dict[str, mqcore.Transaction] = {}
    options = {"segment_bytes": 4096}
    store = open_store(fast_path, **options)
    store.create_topic("t", segment_bytes=1 << 30)
    store.set_transaction_checker(lambda info: answers.get(info.transaction_id, "unknown"))
    serial = 0

    def check_model(s: mqcore.Store) -> None:
        assert s.open_transactions() == sorted(model.open)
        assert s.pending_delays() == len(model.pending)
        got = values(s)
        assert Counter(got) == model.visible
        for tid, sent in model.open.items():
            assert not set(sent) & set(got), tid

    try:
        for _step in range(1500):
            r = rng.random()
            if r < 0.3:
                serial += 1
                tid = f"x{serial}"
                batch = [b"%s:%d" % (tid.encode(), k) for k in range(rng.randint(1, 3))]
                handles[tid] = store.begin(tid)
                handles[tid].append_batch("t", batch)
                model.open[tid] = batch
            elif r < 0.4 and handles:
                tid = rng.choice(sorted(handles))
                if tid in model.open:
                    more = b"%s:%d" % (tid.encode(), len(model.open[tid]))
                    handles[tid].append("t", more)
                    model.open[tid].append(more)
            elif r < 0.55 and model.open:
                answers.clear()
                for tid in rng.sample(sorted(model.open), min(3, len(model.open))):
                    answers[tid] = rng.choice(["commit", "rollback", "unknown"])
                outcomes = store.check_transactions(now=2**50)
                for tid in list(model.open):
                    answer = answers.get(tid, "unknown")
                    assert outcomes[tid] == {"commit": "committed", "rollback": "rolled_back",
                                             "unknown": "unknown"}[answer]  # fmt: skip
                    if answer != "unknown":
                        sent = model.open.pop(tid)
                        handles.pop(tid, None)
                        if answer == "commit":
                            model.visible.update(sent)
            elif r < 0.7:
                serial += 1
                value = b"d%d" % serial
                at = clock + (rng.randint(0, 50) if rng.random() < 0.9 else 20 * DAY_MS)
                store.append("t", value, deliver_at=at)
                model.pending[value] = at
            elif r < 0.8:
                clock += rng.randint(0, 30)
                due = [v for v, at in model.pending.items() if at <= clock]
                assert store.deliver_due(now=clock) == len(due)
                for v in due:
                    del model.pending[v]
                    model.visible[v] += 1
            elif r < 0.95:
                store.apply_retention()
            else:
                store.close()
                store = open_store(fast_path, **options)
                store.set_transaction_checker(
                    lambda info: answers.get(info.transaction_id, "unknown")
                )
                handles.clear()  # a restart loses the producer's handles; check-back decides
                check_model(store)
        store.apply_retention()
        assert store.start_offset(HALF_TOPIC, 0) > 0 and store.start_offset(OP_TOPIC, 0) > 0
        store.close()
        store = open_store(fast_path, **options)
        check_model(store)
        answers.clear()
        store.set_transaction_checker(lambda info: "commit")
        store.check_transactions(now=2**50)
        store.deliver_due(now=clock + 30 * DAY_MS)
        got = values(store)
        for sent in model.open.values():
            model.visible.update(sent)
            assert [v for v in got if v in sent] == sent  # send order, once each
        model.visible.update(list(model.pending))
        assert Counter(got) == model.visible
    finally:
        store.close()


def test_a_store_made_before_trimming_never_trims_its_parked_logs_by_size(fast_path):
    """Internal topics created by an older mqcore took the store's topic defaults (here
    retention_bytes=1): retention must not delete an open transaction's half messages."""
    with open_store(fast_path) as store:
        store.create_topic("t")
        store.log.internal_topic(HALF_TOPIC, unique_ids=True, key_index=False, retention_bytes=1)
        txn = store.begin("T")
        for i in range(200):  # several segments
            txn.append("t", b"%03d" % i + b"x" * 1000)
        assert len(store.segment_offsets(HALF_TOPIC, 0)) > 2
        report = store.apply_retention(now=2**50)
        assert not [s for s in report.deleted_segments if s.startswith(HALF_TOPIC)]
        txn.commit()
        assert values(store) == [b"%03d" % i + b"x" * 1000 for i in range(200)]


# -- kills and power cuts in the middle of a trim --------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import mqcore
    from mqcore import crashpoints

    path, point, base = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if sys.argv[4] != "-":
        import powerloss
        powerloss.install(path, sys.argv[4])
    store = mqcore.open(path, flush="os", transaction_check_interval_ms=0, delay_tick_ms=0,
                        segment_bytes=4096, segment_index_bytes=1 << 16,
                        key_index_entries=4096, preallocate_bytes=0)
    store.create_topic("t", segment_bytes=1 << 30)
    long = store.begin("long")
    long.append_batch("t", [b"L0", b"L1"])
    store.append("t", b"FAR", deliver_at=base + 10 * 86_400_000)
    base += 86_400_000  # due times ahead of the clock: no background wake-up
    for i in range(300):
        with store.begin() as txn:
            txn.append("t", b"v%d" % i)
        store.append("t", b"d%d" % i, deliver_at=base)
    assert store.deliver_due(now=base) == 300
    long.append("t", b"L2")

    def die(at):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    if point.split(':')[0] in crashpoints.CRASH_POINTS:
        crashpoints.arm(point)  # a step of mqcore's own (after the set-up above)
    store.apply_retention()
    print("trimmed", flush=True)
    if sys.argv[4] != "-":
        os._exit(0)  # the power goes
    die("after_trim")
    """
)


def run_trim_child(path: str, point: str, base: int, ledger: str = "-") -> str:
    """The CHILD killed at `point`, or with a ledger ending by os._exit (the power goes)."""
    expect = 0 if ledger != "-" else KILLED
    return run_child(CHILD, path, point, str(base), ledger, expect=expect).out


def check_after(path: str, base: int) -> None:
    """The open transaction commits once, in send order; every committed and delivered message
    is there once; the far delay is delivered once. A second open moves nothing again."""
    want = Counter([b"v%d" % i for i in range(300)] + [b"d%d" % i for i in range(300)])
    want.update([b"L0", b"L1", b"L2", b"FAR"])
    with mqcore.open(path, flush="os", transaction_check_interval_ms=0, delay_tick_ms=0) as store:
        store.set_transaction_checker(lambda info: "commit")  # asked about every open one
        assert store.check_transactions(now=2**50) == {"long": "committed"}
        assert store.deliver_due(now=base + 11 * DAY_MS) == 1
        assert store.deliver_due(now=2**50) == 0  # it was the only one pending
        got = values(store)
        assert Counter(got) == want
        assert [v for v in got if v.startswith(b"L")] == [b"L0", b"L1", b"L2"]
    with mqcore.open(path, flush="os", transaction_check_interval_ms=0, delay_tick_ms=0) as store:
        store.set_transaction_checker(lambda info: "commit")
        assert store.check_transactions(now=2**50) == {}  # none left open
        assert store.deliver_due(now=2**50) == 0  # none left pending
        assert values(store) == got


@pytest.mark.parametrize("point", ["txn.after_repark", "delay.after_repark", "after_trim"])
def test_a_kill_in_the_middle_of_a_trim_loses_and_duplicates_nothing(store_path, point):
    """Killed after the re-parked copies were appended (the originals still there: the load
    must keep exactly one of each), or after the trim."""
    base = now_ms()
    run_trim_child(store_path, point, base)
    check_after(store_path, base)


@pytest.mark.parametrize("mode", ["cut", "zero"])
def test_a_power_cut_after_a_trim_loses_and_duplicates_nothing(tmp_path: Path, mode):
    """Every record the deletion relies on (the copies, the decisions, the delivery snapshot)
    is made durable before the segments go, whatever the flush policy."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    base = now_ms()
    assert run_trim_child(store, "-", base, ledger) == "trimmed\n"
    powerloss.power_cut(store, ledger, image, mode)
    with mqcore.open(image, read_only=True) as s:  # the trim did delete segments
        assert all(s.start_offset(t, 0) > 0 for t in (HALF_TOPIC, DELAY_TOPIC))
    check_after(image, base)
