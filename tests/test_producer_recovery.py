"""Idempotent producers across crashes and restarts, on real files and real processes.

A writer process with a fixed producer id is SIGKILLed mid-run; this process then resends every
batch with the same sequences and the log must hold each exactly once. The producer state must
come back exact (epoch and the full 5-batch window) whether the `.snapshot` files are intact,
deleted, corrupt or newer than the log, and after recovery cut the log's tail. A producer id
handed out before a crash is never handed out again.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from crashchild import run_child

import mqcore
from mqcore.storage.producer_state import WINDOW, ProducerEntry, snapshot_offsets, snapshot_path

PID = 77

WRITER = r"""
import os
import sys
import mqcore
path, flush, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = mqcore.open(path, flush=flush)
store.create_topic("t", segment_bytes=2048)
p = store.producer(pid)
if sys.argv[4] == "ids":
    for _ in range(3):
        print(store.producer().producer_id, flush=True)
    sys.stdin.read()
seq = 0
for i in range(400):
    values = [b"b%d-r%d" % (i, r) * 4 for r in range(i % 4 + 1)]
    md = p.append_batch("t", values, base_sequence=seq)
    os.write(1, b"%d %d\n" % (i, md.base_offset))  # one write: a kill cannot split a line
    seq += len(values)
"""


def batch_values(i: int) -> list[bytes]:
    return [b"b%d-r%d" % (i, r) * 4 for r in range(i % 4 + 1)]


def run_writer(
    path: str, flush: str, mode: str, stop_after: int, crash_at: str | None = None
) -> list[str]:
    """Start the writer, read `stop_after` output lines, SIGKILL it while it goes on writing;
    returns every line it printed (each an acknowledged append). With `crash_at` the writer
    dies at that crash point instead (mqcore.crashpoints), `stop_after` lines or more later."""
    child = run_child(
        WRITER,
        path,
        flush,
        str(PID),
        mode,
        crash_at=crash_at,
        kill_when=None if crash_at else lambda lines: len(lines) >= stop_after,
    )
    assert len(child.lines) >= stop_after, child.err
    return child.lines


def window(store: mqcore.Store, topic: str = "t", partition: int = 0) -> dict[int, ProducerEntry]:
    state = store.log.partition(topic, partition).producer_state
    assert state is not None
    return {pid: ProducerEntry(e.epoch, list(e.batches)) for pid, e in state.producers.items()}


@pytest.mark.parametrize("flush", ["always", "os"])
@pytest.mark.parametrize("acks", [3, 60, 170])
def test_resend_after_sigkill_leaves_exactly_one_copy(
    tmp_path: Path, flush: str, acks: int
) -> None:
    path = str(tmp_path / "s")
    acked = {
        int(i): int(off) for i, off in (ln.split() for ln in run_writer(path, flush, "w", acks))
    }
    last = max(acked)
    assert sorted(acked) == list(range(last + 1))
    total = max(200, last + 10)
    with mqcore.open(path, flush=flush) as store:
        assert store.end_offset("t") >= sum(len(batch_values(i)) for i in range(last + 1))
        p = store.producer(PID)
        # like a Kafka producer after a timeout: resend from the oldest batch it may not have
        # seen acknowledged (the last 4 acked ones, the one in flight, then new ones)
        first = max(0, last - 3)
        seq = sum(len(batch_values(i)) for i in range(first))
        duplicates = 0
        for i in range(first, total):
            values = batch_values(i)
            md = p.append_batch("t", values, base_sequence=seq)
            if i in acked:
                assert (md.duplicate, md.base_offset) == (True, acked[i])
            duplicates += md.duplicate
            seq += len(values)
        assert last + 1 - first <= duplicates <= last + 2 - first
        assert p.sequence("t", 0) == seq
        got = [m.value for m in store.read("t", 0, 0, 10_000)]
        assert got == [v for i in range(total) for v in batch_values(i)]
        assert len(store.segment_offsets("t")) > 3  # the state crossed segment rolls


def test_producer_id_allocated_before_a_crash_is_never_reused(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    handed = [int(x) for x in run_writer(path, "os", "ids", 3)]
    assert len(handed) == 3
    assert len(set(handed)) == 3
    with mqcore.open(path, flush="os") as store:
        fresh = [store.producer().producer_id for _ in range(3)]
    assert min(fresh) > max(*handed, PID)


def build(path: str) -> dict[int, ProducerEntry]:
    """Three producers interleaved with plain appends over many small segments, one of them
    bumping its epoch; returns the live state before the clean close."""
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t", segment_bytes=1024, unique_ids=False)
        ps = {pid: store.producer(pid) for pid in (1, 2, 3)}
        for i in range(60):
            pid = (1, 2, 3)[i % 3] if i < 40 else (1, 3)[i % 2]
            ps[pid].append_batch("t", [b"%d-%d" % (pid, i) * 10] * (i % 3 + 1))
            if i % 7 == 0:
                store.append("t", b"plain" * 20)
            if i == 45:
                ps[2] = store.producer(2, epoch=1)
                ps[2].append_batch("t", [b"new epoch"])
                ps[2].append_batch("t", [b"new epoch again"])
        state = window(store)
        assert len(store.segment_offsets("t")) > 5
    assert all(len(e.batches) == WINDOW for pid, e in state.items() if pid != 2)
    assert state[2].epoch == 1 and len(state[2].batches) == 2
    return state


def part_dir(path: str) -> str:
    return os.path.join(path, "t-0")


def check_window(path: str, expected: dict[int, ProducerEntry]) -> None:
    """The reopened state equals `expected`, and acts on it: each window batch is a duplicate,
    anything older is refused, the next sequence is accepted."""
    with mqcore.open(path, flush="os") as store:
        assert window(store) == expected
        end = store.end_offset("t")
        p = store.producer(1)
        for rec in expected[1].batches:
            n = (rec.last_seq - rec.first_seq) + 1
            md = p.append_batch("t", [b"r"] * n, base_sequence=rec.first_seq)
            assert (md.duplicate, md.base_offset) == (True, rec.base_offset)
        first = expected[1].batches[0].first_seq
        with pytest.raises(mqcore.errors.OutOfOrderSequenceError):
            p.append_batch("t", [b"r"], base_sequence=first - 1)
        assert store.end_offset("t") == end
        assert not p.append_batch("t", [b"next"]).duplicate


def test_clean_restart_rebuilds_the_full_window_from_a_one_batch_snapshot(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    expected = build(path)
    with mqcore.open(path, flush="os", read_only=True) as store:
        end = store.end_offset("t")
    assert snapshot_offsets(part_dir(path))[-1] == end
    check_window(path, expected)


@pytest.mark.parametrize("damage", ["deleted", "corrupt", "short", "newer", "bad-version"])
def test_damaged_snapshots_are_rebuilt_from_the_log(tmp_path: Path, damage: str) -> None:
    path = str(tmp_path / "s")
    expected = build(path)
    d = part_dir(path)
    offsets = snapshot_offsets(d)
    newest = Path(snapshot_path(d, offsets[-1]))
    if damage == "deleted":
        for off in offsets:
            os.unlink(snapshot_path(d, off))
    elif damage == "corrupt":
        raw = bytearray(newest.read_bytes())
        raw[-3] ^= 0x40
        newest.write_bytes(bytes(raw))
    elif damage == "short":
        newest.write_bytes(newest.read_bytes()[:-5])
    elif damage == "bad-version":
        newest.write_bytes(b"\x00\x02" + newest.read_bytes()[2:])
    else:
        # a snapshot claiming more log than there is (as after a power loss cut the log)
        beyond = Path(snapshot_path(d, offsets[-1] + 1000))
        beyond.write_bytes(Path(snapshot_path(d, offsets[0])).read_bytes())
        newest.unlink()
    check_window(path, expected)
    left = snapshot_offsets(d)
    assert all(off <= offsets[-1] + 1 for off in left)  # the bad ones were deleted


def test_snapshot_beyond_a_truncated_tail_is_discarded(tmp_path: Path) -> None:
    """Recovery cuts a torn last batch: the snapshot written at the old end must not make the
    lost batch look present, so its resend is written, once."""
    path = str(tmp_path / "s")
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t", unique_ids=False)
        p = store.producer(5)
        for i in range(4):
            p.append_batch("t", [b"m%d" % i] * 2)
        old_end = store.end_offset("t")
    d = part_dir(path)
    assert snapshot_offsets(d) == [old_end]
    log = Path(d, "00000000000000000000.log")
    log.write_bytes(log.read_bytes()[:-7])  # tear the last batch
    os.unlink(os.path.join(path, "mqcore-clean-shutdown"))
    os.unlink(os.path.join(path, "mqcore-recovery-point-checkpoint"))
    with mqcore.open(path, flush="os") as store:
        assert store.end_offset("t") == old_end - 2
        assert snapshot_offsets(d) == []
        p = store.producer(5)
        assert p.sequence("t", 0) == 6
        assert p.append_batch("t", [b"m2"] * 2, base_sequence=4).duplicate  # still there
        md = p.append_batch("t", [b"m3"] * 2, base_sequence=6)
        assert (md.duplicate, md.base_offset) == (False, 6)
        assert [m.value for m in store.read("t", 0, 0, 100)] == [
            b"m%d" % i for i in range(4) for _ in range(2)
        ]


@pytest.mark.parametrize(
    "crash_at", [None, "roll.after_new_segment:12", "producer_snapshot.after_write:12"]
)
def test_crash_after_rolls_rebuilds_from_the_last_roll_snapshot(
    tmp_path: Path, crash_at: str | None
) -> None:
    """SIGKILL leaves only roll snapshots: the walk from the newest one to the log end gives
    the exact state (compared with a clean reopen's). The kill may land inside a roll, after
    the new segment's files exist and before its snapshot does (`roll.after_new_segment`):
    the newest snapshot is then the previous roll's."""
    path = str(tmp_path / "s")
    run_writer(path, "os", "w", 100, crash_at)
    d = part_dir(path)
    with mqcore.open(path, flush="os", read_only=True) as store:
        end = store.end_offset("t")
        bases = store.segment_offsets("t")
    offsets = snapshot_offsets(d)
    assert len(bases) >= 2 and offsets
    if offsets[-1] != bases[-1]:  # no snapshot for the newest segment: killed mid-roll
        assert end == bases[-1] and offsets[-1] == bases[-2], (offsets, bases, end)
    else:
        assert bases[-1] <= end  # written at the last roll, before the segment's first append
    with mqcore.open(path, flush="os") as store:
        after_crash = window(store)
    with mqcore.open(path, flush="os") as store:
        assert window(store) == after_crash
    assert len(after_crash[PID].batches) == WINDOW
    assert after_crash[PID].batches[-1].last_offset == end - 1


def test_resent_split_batch_writes_only_the_pieces_a_crash_lost(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    values = [bytes([65 + i]) * 100 for i in range(8)]
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t", max_message_bytes=300, unique_ids=False)
        store.producer(8).append_batch("t", values)
    log = Path(part_dir(path), "00000000000000000000.log")
    data = log.read_bytes()
    first = int.from_bytes(data[8:12], "big") + 12  # the first piece's size
    assert first < len(data)
    log.write_bytes(data[:first])  # as if the crash came between the pieces
    Path(part_dir(path), "00000000000000000003.snapshot.77.tmp").write_bytes(b"half")
    os.unlink(os.path.join(path, "mqcore-clean-shutdown"))
    os.unlink(os.path.join(path, "mqcore-recovery-point-checkpoint"))
    with mqcore.open(path, flush="os") as store:
        assert not [n for n in os.listdir(part_dir(path)) if n.endswith(".tmp")]
        kept = store.end_offset("t")
        assert 0 < kept < 8
        md = store.producer(8).append_batch("t", values, base_sequence=0)
        assert (md.base_offset, md.count, md.duplicate) == (0, 8, False)
        assert [m.value for m in store.read("t", 0, 0, 100)] == values
        again = store.producer(8).append_batch("t", values, base_sequence=0)
        assert again.duplicate and store.end_offset("t") == 8


def test_unknown_producer_may_start_anywhere_once_old_segments_are_gone(tmp_path: Path) -> None:
    """With the log start at 0 a new id must start at sequence 0 (a lost first batch is a gap);
    once old segments are deleted (retention) its earlier batches may be gone, so any
    sequence is accepted, as Kafka does."""
    path = str(tmp_path / "s")
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t", segment_bytes=1024, unique_ids=False)
        for _ in range(30):
            store.append("t", b"x" * 200)
        with pytest.raises(mqcore.errors.OutOfOrderSequenceError):
            store.producer(3).append_batch("t", [b"late"], base_sequence=9)
        second = store.segment_offsets("t")[1]
    for name in os.listdir(part_dir(path)):
        if name.startswith("00000000000000000000."):
            os.unlink(os.path.join(part_dir(path), name))
    with mqcore.open(path, flush="os") as store:
        assert store.start_offset("t") == second
        md = store.producer(3).append_batch("t", [b"late"], base_sequence=9)
        assert not md.duplicate
        with pytest.raises(mqcore.errors.OutOfOrderSequenceError, match="expected sequence 10"):
            store.producer(3).append_batch("t", [b"gap"], base_sequence=12)
