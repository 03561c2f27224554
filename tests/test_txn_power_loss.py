"""A power loss in the middle of a Kafka transaction's commit (issue 34; tests/powerloss.py):
a writer child runs the transaction coordinator over its store under a sync ledger, commits
one transaction, aborts one, and dies (MQCORE_CRASH_AT) in the middle of a third one's commit:
after its decision was written, or after its marker. The store reopens from the disk image
the cut leaves (what was never synced is gone), the coordinator finishes what was decided,
and under every flush policy: no record of the aborted transaction is visible read_committed,
the committed one's all are, the interrupted one's are visible only as a whole and only as
decided (commit), and no transaction is left holding the last stable offset.
"""

from __future__ import annotations

import os
from pathlib import Path

import powerloss
import pytest
from crashchild import run_child

import mqcore

HERE = os.path.dirname(os.path.abspath(__file__))

WRITER = """
import os, sys
sys.path.insert(0, sys.argv[5])
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
from mqcore.server.transactions import TransactionCoordinator
from test_txn_log import data_batch

store = mqcore.open(sys.argv[1], flush=sys.argv[3], flush_interval_ms=3_600_000)
coordinator = TransactionCoordinator(store, expiry_interval_ms=3_600_000)
replica = store.log.replica("t", 0)
pid, epoch = coordinator.init_producer_id("tx", 60_000)
seq = 0
for name, commit in (("a", True), ("b", False), ("c", True)):
    coordinator.add_partitions("tx", pid, epoch, [("t", 0)])
    values = [b"%s%d" % (name.encode(), i) for i in range(5)]
    replica.append_as_leader(data_batch(0, pid, epoch, seq, values), 0, transactional=True)
    seq += len(values)
    if name == sys.argv[4]:
        store.log.partition("t", 0).flush()  # the page cache wrote it back before the cut
    os.write(1, b"ending %s\\n" % name.encode())
    coordinator.end_txn("tx", pid, epoch, commit)
os.write(1, b"all ended\\n")
os._exit(0)
"""


@pytest.mark.parametrize("point", ["kafka_txn.after_prepare:3", "kafka_txn.after_marker:3"])
@pytest.mark.parametrize("policy", ["always", "interval", "os"])
@pytest.mark.parametrize("writeback", ["none", "c"])
def test_a_power_loss_in_a_commit_leaves_only_committed_records_visible(
    tmp_path: Path, policy: str, point: str, writeback: str
) -> None:
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store, flush=policy) as s:
        s.create_topic("t")
    powerloss.Ledger(store, ledger).snapshot_existing()
    child = run_child(WRITER, store, ledger, policy, writeback, HERE, crash_at=point,
                      expect=None)  # fmt: skip
    assert child.out.split()[-2:] == ["ending", "c"], child.out  # died inside c's commit
    powerloss.power_cut(store, ledger, image, "cut")
    with mqcore.open(image) as s:
        from mqcore.server.transactions import TransactionCoordinator

        TransactionCoordinator(s, expiry_interval_ms=3_600_000).close()  # finishes c
        seen = [m.value for m in s.read("t", 0, 0, 1000, isolation_level="read_committed")]
        assert seen[:5] == [b"a%d" % i for i in range(5)]  # a's commit returned: durable
        assert not [v for v in seen if v.startswith(b"b")]
        c = [v for v in seen if v.startswith(b"c")]
        assert c in ([], [b"c%d" % i for i in range(5)])  # whole or not at all
        if writeback == "c" or point.startswith("kafka_txn.after_marker"):
            assert c == [b"c%d" % i for i in range(5)]  # its records survived: committed
        assert s.last_stable_offset("t", 0) == s.end_offset("t", 0)


def test_a_torn_leader_epoch_checkpoint_is_read_again_from_the_log(tmp_path: Path) -> None:
    """Regression (found by the test above under flush="os"): the leader-epoch checkpoint was
    written without an fsync under "os", so a power loss could leave it torn and the store
    would not open ("not a version-0 leader-epoch checkpoint"). It is fsync'd now whatever
    the policy, and a torn one is made again from the batches' partitionLeaderEpoch."""
    from test_txn_log import data_batch

    path = str(tmp_path / "s")
    with mqcore.open(path, create=True, flush="os") as s:
        s.create_topic("t")
        replica = s.log.replica("t", 0)
        replica.append_as_leader(data_batch(0, 1, 0, 0, [b"a", b"b"], False), 0)
        replica.append_as_leader(data_batch(0, 1, 0, 2, [b"c"], False), 3)
        want = replica.leader_epochs.entries
    assert [(e.epoch, e.start_offset) for e in want] == [(0, 0), (3, 2)]
    checkpoint = tmp_path / "s" / "t-0" / "leader-epoch-checkpoint"
    checkpoint.write_bytes(b"\0" * 7)  # what a power loss may leave of an unsynced write
    with mqcore.open(path) as s:
        assert s.log.replica("t", 0).leader_epochs.entries == want
        assert [m.value for m in s.read("t", 0, 0, 10)] == [b"a", b"b", b"c"]
    assert checkpoint.read_bytes() == b"0\n2\n0 0\n3 2\n"
