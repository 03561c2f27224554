"""Kafka transactions in the log against a model (issue 34, "property test"): seeded random
interleavings of transactional and plain batches, commits, aborts, transaction timeouts (the
coordinator's abort at a bumped epoch, after which the producer goes on at the new epoch),
restarts (clean, and with every producer snapshot and `.txnindex` lost), DeleteRecords and
compaction, with every reader's answer under each isolation level compared with the model's
after each step. The batches are kafka-python's (test_txn_log.data_batch / marker_batch),
appended as a replica copies them.

The model is Kafka's, written out independently of the store's code:
- the last stable offset is the first offset of the oldest open transaction, never below the
  log start offset (Kafka's UnifiedLog clamps it there) nor above the log end;
- read_committed sees the records below it that no aborted transaction holds;
- compaction (LogCleaner) maps the latest stable record of each key (below the last stable
  offset, none of an aborted transaction), cleans the sealed segments up to the first that
  reaches the last stable offset, drops there every aborted record and every record that is
  not its key's latest, and keeps the control batches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_txn_log import TOPIC, data_batch, marker_batch

import mqcore

KEYS = [b"k%d" % i for i in range(6)]
PLAIN = 9  # the producer of plain (not transactional) batches


@dataclass
class Model:
    start: int = 0
    end: int = 0
    records: dict[int, tuple[bytes, bytes] | None] = field(default_factory=dict)  # None: marker
    txn_of: dict[int, int] = field(default_factory=dict)  # offset -> transaction number
    open: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (txn, first)
    aborted: set[int] = field(default_factory=set)
    epochs: dict[int, int] = field(default_factory=dict)
    seqs: dict[int, int] = field(default_factory=dict)
    txns: int = 0

    @property
    def lso(self) -> int:
        first = min((f for _, f in self.open.values()), default=self.end)
        return max(self.start, min(first, self.end))

    def is_aborted(self, offset: int) -> bool:
        return self.txn_of.get(offset) in self.aborted

    def visible(self, committed: bool) -> list[tuple[int, bytes, bytes]]:
        out = []
        for o in sorted(self.records):
            kv = self.records[o]
            if o < self.start or kv is None:
                continue
            if committed and (o >= self.lso or self.is_aborted(o)):
                continue
            out.append((o, *kv))
        return out

    def data(self, rng: random.Random, pid: int) -> bytes:
        base, n = self.end, rng.randrange(1, 5)
        keys = [rng.choice(KEYS) for _ in range(n)]
        values = [b"v%d" % (base + i) for i in range(n)]
        seq = self.seqs.get(pid, 0)
        self.seqs[pid] = seq + n
        transactional = pid != PLAIN
        if transactional:
            if pid not in self.open:
                self.txns += 1
                self.open[pid] = (self.txns, base)
            for i in range(n):
                self.txn_of[base + i] = self.open[pid][0]
        for i in range(n):
            self.records[base + i] = (keys[i], values[i])
        self.end += n
        return data_batch(base, pid, self.epochs.get(pid, 0), seq, values, transactional,
                          keys=keys)  # fmt: skip

    def end_txn(self, pid: int, commit: bool, bump: bool = False) -> bytes:
        """A marker; `bump`: the coordinator's abort of a timed-out transaction, at the next
        epoch (the producer goes on at it, its sequences from 0)."""
        base = self.end
        if bump:
            self.epochs[pid] = self.epochs.get(pid, 0) + 1
            self.seqs[pid] = 0
        txn = self.open.pop(pid, (None, base))[0]
        if not commit and txn is not None:
            self.aborted.add(txn)
        self.records[base] = None
        self.end += 1
        return marker_batch(base, pid, self.epochs.get(pid, 0), commit)

    def delete_before(self, offset: int) -> None:
        """DeleteRecords: the records below `offset` are gone for readers (the files of the
        segments wholly below it too; the first segment's records below it stay in it)."""
        self.start = max(self.start, offset)

    def snapshots_lost(self, first_base: int) -> None:
        """Recovery without the producer snapshots walks the segments from the first one
        (base `first_base`): an open transaction whose first records went with deleted
        segments is known from its first record still in the files, or not at all."""
        for o in [o for o in self.records if o < first_base]:
            del self.records[o]
        for pid, (txn, _) in list(self.open.items()):
            held = [o for o in self.records if self.txn_of.get(o) == txn]
            if held:
                self.open[pid] = (txn, min(held))
            else:
                del self.open[pid]

    def compact(self, bases: list[int]) -> None:
        """Kafka's cleaner over segments starting at `bases` (the last one active)."""
        lso = self.lso
        latest: dict[bytes, int] = {}
        for o in sorted(self.records):
            kv = self.records[o]
            if o < lso and kv is not None and not self.is_aborted(o):
                latest[kv[0]] = o
        clean_end = None
        for nxt in bases[1:]:  # each sealed segment's end
            if nxt > lso:
                break
            clean_end = nxt
        if clean_end is None:
            return
        for o in [o for o in self.records if o < clean_end]:
            kv = self.records[o]
            if kv is not None and (self.is_aborted(o) or latest.get(kv[0]) != o):
                del self.records[o]


def check(store: mqcore.Store, model: Model) -> None:
    """Every reader against the model, at both isolation levels."""
    assert store.start_offset(TOPIC) == model.start
    assert store.end_offset(TOPIC) == model.end
    assert store.last_stable_offset(TOPIC) == model.lso
    for level, committed in (("read_committed", True), ("read_uncommitted", False)):
        want = model.visible(committed)
        got = store.read(TOPIC, 0, model.start, 100_000, isolation_level=level)
        assert [(m.offset, m.key, m.value) for m in got] == want, level
        table = store.read_arrow(TOPIC, 0, model.start, None, isolation_level=level)
        assert table.column("offset").to_pylist() == [o for o, _, _ in want], level
        found = store.search(TOPIC, b"v", limit=100_000, isolation_level=level)
        assert [(m.offset, m.value) for m in found] == [(o, v) for o, _, v in want], level
        for key in KEYS:
            hits = store.find_by_key(TOPIC, key, limit=100_000, isolation_level=level)
            assert [m.offset for m in hits] == [o for o, k, _ in want if k == key], (level, key)
        by_offset = {o: v for o, _, v in want}
        for o in range(model.start, model.end):
            m = store.get(TOPIC, 0, o, isolation_level=level)
            assert (None if m is None else m.value) == by_offset.get(o), (level, o)


@pytest.mark.parametrize("seed", range(6))
def test_every_reader_answers_as_the_model_through_timeouts_restarts_retention_and_compaction(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    model = Model()
    path = str(tmp_path / "s")
    part_dir = tmp_path / "s" / f"{TOPIC}-0"
    store = mqcore.open(path, create=True)
    try:
        store.create_topic(TOPIC, segment_bytes=700, cleanup_policy="compact,delete",
                           retention_ms=-1)  # fmt: skip
        steps = {"data": 0, "commit": 0, "abort": 0, "timeout": 0, "restart": 0, "lost": 0,
                 "delete": 0, "compact": 0}  # fmt: skip
        for _ in range(250):
            replica = store.log.replica(TOPIC, 0)
            roll = rng.random()
            pid = rng.choice([1, 2, 3])
            if roll < 0.45:
                replica.append_as_follower(model.data(rng, rng.choice([1, 2, 3, PLAIN])))
                steps["data"] += 1
                continue  # the readers are checked after the other steps
            if roll < 0.65:
                commit = rng.random() < 0.5
                replica.append_as_follower(model.end_txn(pid, commit))
                steps["commit" if commit else "abort"] += 1
            elif roll < 0.72:
                if pid not in model.open:
                    continue
                replica.append_as_follower(model.end_txn(pid, commit=False, bump=True))
                steps["timeout"] += 1
            elif roll < 0.8:
                first_base = store.segment_offsets(TOPIC)[0]
                store.close()
                if rng.random() < 0.5:  # the snapshots and aborted indexes lost: rebuilt
                    model.snapshots_lost(first_base)
                    for f in [*part_dir.glob("*.snapshot"), *part_dir.glob("*.txnindex")]:
                        f.unlink()
                    (tmp_path / "s" / "mqcore-clean-shutdown").unlink(missing_ok=True)
                    steps["lost"] += 1
                store = mqcore.open(path)
                steps["restart"] += 1
            elif roll < 0.88:
                replica.update_high_watermark(model.end)
                offset = rng.randrange(model.start, model.end + 1)
                replica.delete_records_before(offset)
                model.delete_before(offset)
                steps["delete"] += 1
            else:
                model.compact(store.segment_offsets(TOPIC))
                store.compact(TOPIC)
                steps["compact"] += 1
            check(store, model)
        check(store, model)
        with mqcore.open(path, read_only=True) as reader:  # a second reader beside the writer
            check(reader, model)
        assert all(steps.values()), steps  # every kind of step ran
    finally:
        store.close()
