"""Power loss in the middle of the consumption model's two-phase steps (tests/powerloss.py): a
writer child keeps a ledger of what it synced, ends without a close (the power goes), and the
store reopens from the disk image the cut leaves. Under every flush policy:

- a transaction whose commit() returned is in its topic exactly once, and a delayed message
  that deliver_due() delivered is in its topic exactly once: the PREPARE record is durable
  before the first real append, and the real appends before the COMMIT / "done" record;
- a message whose nack() was committed past is redelivered (or dead-lettered): its copy is
  durable before the commit that moves past it.

What the page cache writes back on its own is not under mqcore's control: the child emulates a
writeback that reached one partition and not the others by flushing that one partition, which
is exactly what a power cut between two writebacks (or in the middle of a flusher pass) leaves.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import powerloss
import pytest
from crashchild import run_child

import mqcore

HERE = os.path.dirname(os.path.abspath(__file__))
QUIET = {"transaction_check_interval_ms": 0, "delay_tick_ms": 0}

PRELUDE = """
import os, sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
store = mqcore.open(sys.argv[1], flush=sys.argv[3], flush_interval_ms=3_600_000,
                    transaction_check_interval_ms=0, delay_tick_ms=0)
writeback = sys.argv[4]

def written_back():
    # the page cache wrote this one partition back before the power went
    if writeback != "none":
        store.log.partition(writeback, 0).flush()
"""

TXN = (
    PRELUDE
    + """
txn = store.begin("T")
txn.append_batch("t", [b"a", b"b"])
store.flush()  # the half messages are on disk (a flusher pass, or flush="always")
txn.commit()
written_back()
os.write(1, b"committed\\n")
os._exit(0)  # the power goes: no close
"""
)

DELAY = (
    PRELUDE
    + """
store.append_batch("t", [b"a", b"b"], deliver_at=0)
store.flush()  # the timer records are on disk
assert store.deliver_due() == 2
written_back()
os.write(1, b"delivered\\n")
os._exit(0)
"""
)

NACK = (
    PRELUDE
    + """
c = store.consumer("g", "t", retry_backoff_ms=[0], max_reconsume_times=int(sys.argv[5]))
got = c.poll(10)
assert [m.value for m in got] == [b"a", b"b"]
c.nack(got[0])
c.commit()
os.write(1, b"committed %d\\n" % c.committed("t", 0))
os._exit(0)
"""
)


def run_words(script: str, *args: str) -> list[str]:
    """Run `script` to its os._exit(0): the words it printed."""
    return run_child(script, *args).out.split()


def setup(tmp_path: Path, policy: str) -> tuple[str, str, str]:
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store, flush=policy, **QUIET) as s:
        s.create_topic("t")
    powerloss.Ledger(store, ledger).snapshot_existing()  # the starting state is on disk
    return store, ledger, image


def values_in(store: mqcore.Store, topic: str) -> Counter[bytes | None]:
    return Counter(m.value for m in store.read(topic, 0, store.start_offset(topic, 0), 1000))


POLICIES = ["always", "interval", "os"]


@pytest.mark.parametrize("writeback", ["none", "t", "__txn_op"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_committed_transaction_survives_a_power_loss_exactly_once(
    tmp_path: Path, policy: str, writeback: str
) -> None:
    """Before the fix, a PREPARE lost while the real appends reached the disk made the
    check-back commit them again ({a: 2, b: 2}); a COMMIT that reached the disk before the
    real appends lost them."""
    store, ledger, image = setup(tmp_path, policy)
    assert run_words(TXN, store, ledger, policy, writeback) == ["committed"]
    powerloss.power_cut(store, ledger, image, "cut")
    with mqcore.open(image, flush="os", **QUIET) as s:
        s.set_transaction_checker(lambda info: "commit")  # what the producer knows
        s.check_transactions(now=2**50)
        assert values_in(s, "t") == Counter({b"a": 1, b"b": 1})
        assert s.check_transactions(now=2**50) == {}  # none left open


@pytest.mark.parametrize("writeback", ["none", "t", "__delay_state"])
@pytest.mark.parametrize("policy", POLICIES)
def test_delivered_delayed_messages_survive_a_power_loss_exactly_once(
    tmp_path: Path, policy: str, writeback: str
) -> None:
    """Before the fix, the delivery progress lost while the real appends reached the disk
    delivered them again; progress that reached the disk before the appends lost them."""
    store, ledger, image = setup(tmp_path, policy)
    assert run_words(DELAY, store, ledger, policy, writeback) == ["delivered"]
    powerloss.power_cut(store, ledger, image, "cut")
    with mqcore.open(image, flush="os", **QUIET) as s:
        s.deliver_due()
        assert values_in(s, "t") == Counter({b"a": 1, b"b": 1})
        assert s.deliver_due(now=2**50) == 0  # none left pending


@pytest.mark.parametrize("dead_letter", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_nacked_message_committed_past_survives_a_power_loss(
    tmp_path: Path, policy: str, dead_letter: bool
) -> None:
    """Before the fix, commit() synced `__consumer_offsets` only: after a power loss the offset
    was past the nacked message and its retry copy was gone, so it was never redelivered."""
    store, ledger, image = setup(tmp_path, policy)
    with mqcore.open(store, flush="os", **QUIET) as s:
        s.append_batch("t", [b"a", b"b"])
    powerloss.Ledger(store, ledger).snapshot_existing()
    most = "0" if dead_letter else "16"
    assert run_words(NACK, store, ledger, policy, "none", most) == ["committed", "2"]
    powerloss.power_cut(store, ledger, image, "cut")
    with mqcore.open(image, flush="os", **QUIET) as s:
        c = s.consumer("g", "t", retry_backoff_ms=[0])
        assert c.committed("t", 0) == 2
        if dead_letter:
            assert values_in(s, "__dlq.g") == Counter({b"a": 1})
        else:
            assert [m.value for m in c.poll(10)] == [b"a"]
        c.close()
