"""Kafka transactions in the log (issue 34, "in the log" and "every reader has an isolation
level" for Store.read/get and ReplicaLog's committed fetch): transactional batches and
COMMIT/ABORT control batches built with kafka-python's record builder (an independent encoder),
appended as a replica copies them; the last stable offset, the `.txnindex` in Kafka's byte
layout, read_committed answers compared with a model of the transactions, after a clean
reopen, after a SIGKILL of the writer, with the snapshots and indexes lost, across segment
rolls and compaction; and a Kafka log directory holding transactions, `.txnindex` and a
producer snapshot with an open transaction, opened read-only.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import child_env
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

import mqcore
from mqcore.errors import InvalidConfigError
from mqcore.query.ids import encode_msg_id

TOPIC = "t"
TS = 1_700_000_000_000


def data_batch(base: int, pid: int, epoch: int, seq: int, values: list[bytes],
               transactional: bool = True, keys: list[bytes] | None = None) -> bytes:  # fmt: skip
    """A batch of `values` at offsets base.. (kafka-python's builder; base offset stamped),
    with `keys`, or each value its record's key too (so the key index has each)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  batch_size=1 << 20)  # fmt: skip
    for i, v in enumerate(values):
        b.append(i, timestamp=TS + base + i, key=v if keys is None else keys[i], value=v,
                 headers=[])  # fmt: skip
    buf = b.build()
    struct.pack_into(">q", buf, 0, base)  # baseOffset is outside the CRC
    return bytes(buf)


def marker_batch(base: int, pid: int, epoch: int, commit: bool) -> bytes:
    """Kafka's control batch: one record, key (version 0, type 1 COMMIT / 0 ABORT), value
    (version 0, coordinator epoch 3); the control attribute set and the CRC computed again."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=-1,
                                  batch_size=1 << 20)  # fmt: skip
    key = struct.pack(">hh", 0, 1 if commit else 0)
    b.append(0, timestamp=TS + base, key=key, value=struct.pack(">hi", 0, 3), headers=[])
    buf = b.build()
    attributes = struct.unpack_from(">h", buf, 21)[0] | 0x20
    struct.pack_into(">h", buf, 21, attributes)
    struct.pack_into(">I", buf, 17, calc_crc32c(bytes(buf[21:])))
    struct.pack_into(">q", buf, 0, base)
    return bytes(buf)


@dataclass
class Model:
    """What a partition holds: each offset's value (None for a marker), which transaction
    each transactional record belongs to, and how each transaction ended."""

    values: list[bytes | None] = field(default_factory=list)
    txn_of: dict[int, int] = field(default_factory=dict)  # offset -> transaction number
    open: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (txn, first)
    aborted: set[int] = field(default_factory=set)
    entries: list[tuple[int, int, int, int]] = field(default_factory=list)  # txnindex, Kafka's
    seqs: dict[int, int] = field(default_factory=dict)
    txns: int = 0

    @property
    def end(self) -> int:
        return len(self.values)

    @property
    def lso(self) -> int:
        return min((first for _, first in self.open.values()), default=self.end)

    def committed(self) -> list[tuple[int, bytes]]:
        return [(o, v) for o, v in enumerate(self.values[: self.lso])
                if v is not None and self.txn_of.get(o) not in self.aborted]  # fmt: skip

    def uncommitted(self) -> list[tuple[int, bytes]]:
        return [(o, v) for o, v in enumerate(self.values) if v is not None]

    def data(self, pid: int, n: int, transactional: bool) -> bytes:
        base = self.end
        values = [b"p%d-%d" % (pid, base + i) for i in range(n)]
        seq = self.seqs.get(pid, 0)
        self.seqs[pid] = seq + n
        if transactional:
            if pid not in self.open:
                self.txns += 1
                self.open[pid] = (self.txns, base)
            for i in range(n):
                self.txn_of[base + i] = self.open[pid][0]
        self.values += values
        return data_batch(base, pid, 0, seq, values, transactional)

    def end_txn(self, pid: int, commit: bool) -> bytes:
        base = self.end
        txn, first = self.open.pop(pid, (None, base))
        self.values.append(None)
        if not commit:
            if txn is not None:
                self.aborted.add(txn)
            self.entries.append((pid, first, base, self.lso))
        return marker_batch(base, pid, 0, commit)


def random_ops(rng: random.Random, model: Model, n: int) -> list[bytes]:
    """`n` batches: transactional data of producers 1-3, plain batches of producer 9 (not
    transactional), commits and aborts (some of transactions with no batch here)."""
    out = []
    for _ in range(n):
        pid = rng.choice([1, 2, 3])
        roll = rng.random()
        if roll < 0.45:
            out.append(model.data(pid, rng.randrange(1, 6), True))
        elif roll < 0.6:
            out.append(model.data(9, rng.randrange(1, 4), False))
        else:
            out.append(model.end_txn(pid, commit=rng.random() < 0.5))
    return out


def check(store: mqcore.Store, model: Model) -> None:
    """Every answer of the store against the model."""
    assert store.last_stable_offset(TOPIC) == model.lso
    assert store.end_offset(TOPIC) == model.end
    got = store.read(TOPIC, 0, 0, 100_000, isolation_level="read_committed")
    assert [(m.offset, m.value) for m in got] == model.committed()
    got = store.read(TOPIC, 0, 0, 100_000)
    assert [(m.offset, m.value) for m in got] == model.uncommitted()  # no marker, ever
    for level, want in (("read_committed", model.committed()),
                        ("read_uncommitted", model.uncommitted())):  # fmt: skip
        table = store.read_arrow(TOPIC, 0, 0, None, isolation_level=level)
        assert list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(),
                        strict=True)) == want, level  # fmt: skip
        pieces = store.iter_arrow(TOPIC, 0, 0, None, max_records=4, isolation_level=level)
        assert [o for b in pieces for o in b.column("offset").to_pylist()] == [o for o, _ in want]
        for how in ({"contains": b"-"}, {"regex": "-"}):  # the kernel's columns; Python's filter
            pieces = store.iter_arrow_matching(TOPIC, 0, max_records=4, isolation_level=level,
                                               **how)  # fmt: skip
            assert [(o, v) for b in pieces for o, v in zip(b.column("offset").to_pylist(),
                    b.column("value").to_pylist(), strict=True)] == want, (level, how)  # fmt: skip
    for level, want in (("read_committed", model.committed()),
                        ("read_uncommitted", model.uncommitted())):  # fmt: skip
        found = store.search(TOPIC, b"-", limit=100_000, isolation_level=level)
        assert [(m.offset, m.value) for m in found] == want, level
        found = store.range(TOPIC, 0, None, limit=100_000, order="time", isolation_level=level)
        assert sorted((m.offset, m.value) for m in found) == want, level
    committed = dict(model.committed())
    everything = dict(model.uncommitted())
    for offset in range(model.end):
        m = store.get(TOPIC, 0, offset, isolation_level="read_committed")
        assert (None if m is None else m.value) == committed.get(offset), offset
        # the index lookups: by store ID, and by key (each record's key is its value)
        msg_id = encode_msg_id(TOPIC, 0, offset)
        for level, known in (("read_committed", committed), ("read_uncommitted", everything)):
            m = store.get_by_id(msg_id, isolation_level=level)
            assert (None if m is None else m.value) == known.get(offset), (offset, level)
            if offset % 5 == 0 and offset in everything:
                hits = store.find_by_key(TOPIC, everything[offset], isolation_level=level)
                assert [(h.offset, h.value) for h in hits] == [
                    (o, v) for o, v in known.items() if o == offset], (offset, level)  # fmt: skip
    for key in (struct.pack(">hh", 0, 0), struct.pack(">hh", 0, 1)):  # markers' keys: never
        assert not store.find_by_key(TOPIC, key).messages
    # reads that start anywhere, with small pages, see the same records
    for start in range(0, model.end, 7):
        pages, at = [], start
        for _ in range(model.end + 1):  # bounded: each page moves on
            page = store.read(TOPIC, 0, at, 3, isolation_level="read_committed")
            if not page:
                break
            pages += page
            at = page[-1].offset + 1
        assert [(m.offset, m.value) for m in pages] == [
            (o, v) for o, v in model.committed() if o >= start]  # fmt: skip


def txnindex_entries(directory: Path) -> list[tuple[int, int, int, int]]:
    """Every `.txnindex` entry of a partition directory, parsed as Kafka lays it out."""
    out = []
    for path in sorted(directory.glob("*.txnindex")):
        data = path.read_bytes()
        assert len(data) % 34 == 0, path
        for pos in range(0, len(data), 34):
            version, *entry = struct.unpack_from(">hqqqq", data, pos)
            assert version == 0
            out.append(tuple(entry))
    return out


def build(path: str, model: Model, rng: random.Random, n: int, segment_bytes: int) -> None:
    with mqcore.open(path, create=True) as store:
        store.create_topic(TOPIC, partitions=1, segment_bytes=segment_bytes)
        replica = store.log.replica(TOPIC, 0)
        for batch in random_ops(rng, model, n):
            replica.append_as_follower(batch)
        check(store, model)


@pytest.mark.parametrize("seed", range(6))
def test_read_committed_answers_as_the_model_across_segments_and_reopens(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    model = Model()
    path = str(tmp_path / "s")
    build(path, model, rng, 120, segment_bytes=4096)  # transactions span rolls
    part_dir = tmp_path / "s" / f"{TOPIC}-0"
    assert len(list(part_dir.glob("*.log"))) >= 3
    assert txnindex_entries(part_dir) == model.entries
    with mqcore.open(path) as store:  # a clean reopen: the snapshot's open transactions
        check(store, model)
        replica = store.log.replica(TOPIC, 0)
        for batch in random_ops(rng, model, 40):
            replica.append_as_follower(batch)
        check(store, model)
    for f in [*part_dir.glob("*.snapshot"), *part_dir.glob("*.txnindex")]:
        f.unlink()  # lost: recovery walks the whole log and indexes the aborts again
    (tmp_path / "s" / "mqcore-clean-shutdown").unlink(missing_ok=True)
    with mqcore.open(path) as store:
        check(store, model)
    assert txnindex_entries(part_dir) == model.entries
    with mqcore.open(path, read_only=True) as store:
        check(store, model)


def test_isolation_levels_are_checked(store: mqcore.Store) -> None:
    store.create_topic(TOPIC)
    with pytest.raises(InvalidConfigError, match="isolation_level must be one of"):
        store.read(TOPIC, 0, 0, 10, isolation_level="committed")
    with pytest.raises(InvalidConfigError, match="isolation_level must be one of"):
        store.get(TOPIC, 0, 0, isolation_level=None)  # type: ignore[arg-type]


def test_a_committed_fetch_stops_at_the_last_stable_offset_and_names_the_aborted(
    store: mqcore.Store,
) -> None:
    """ReplicaLog's committed read (what a read_committed Fetch answers) ends below the last
    stable offset and lists the aborted transactions it overlaps, as Kafka's Fetch does."""
    store.create_topic(TOPIC)
    model = Model()
    replica = store.log.replica(TOPIC, 0)
    for batch in (model.data(1, 3, True), model.end_txn(1, commit=False),
                  model.data(2, 2, True), model.data(9, 2, False)):  # fmt: skip
        replica.append_as_follower(batch)
    replica.update_high_watermark(model.end)
    assert replica.last_stable_offset == model.lso == 4  # producer 2's transaction is open
    got = replica.read_bytes(0, 1 << 20, "committed")
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in got.aborted] == [(1, 0, 3)]
    assert got.last_stable_offset == 4 and got.last_offset < 4
    whole = replica.read_bytes(0, 1 << 20, "high_watermark")
    assert whole.aborted == [] and whole.high_watermark == model.end


WRITER = r"""
import os, sys, random
sys.path.insert(0, sys.argv[3])
import mqcore
from test_txn_log import Model, random_ops
model = Model()
rng = random.Random(int(sys.argv[2]))
store = mqcore.open(sys.argv[1], create=True, flush="os")
store.create_topic("t", partitions=1, segment_bytes=4096)
replica = store.log.replica("t", 0)
for batch in random_ops(rng, model, 150):
    replica.append_as_follower(batch)
print(len(model.values), flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_killed_writers_transactions_are_recovered(tmp_path: Path) -> None:
    """A writer SIGKILLed after its appends (no close, no snapshot since its last roll): the
    reopened store rebuilds the open transactions and the aborted index from the log."""
    path = str(tmp_path / "s")
    proc = subprocess.run([sys.executable, "-c", WRITER, path, "11", os.path.dirname(__file__)],
                          env=child_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    model = Model()
    random_ops(random.Random(11), model, 150)
    assert int(proc.stdout) == model.end
    with mqcore.open(path) as store:
        check(store, model)
    assert txnindex_entries(tmp_path / "s" / f"{TOPIC}-0") == model.entries


def test_compaction_keeps_the_aborted_index(tmp_path: Path) -> None:
    """Compaction merges segments: their `.txnindex` entries go with them, so aborted records
    that survive compaction are still skipped by a read_committed reader."""
    model = Model()
    path = str(tmp_path / "s")
    with mqcore.open(path, create=True) as store:
        store.create_topic(TOPIC, segment_bytes=2048, cleanup_policy="compact")
        replica = store.log.replica(TOPIC, 0)
        keyed = []
        for i in range(60):  # keyed records, so that compaction has work
            transactional = i % 3 != 2  # two batches of producer 1, one of producer 9
            pid = 1 if transactional else 9
            b = DefaultRecordBatchBuilder(magic=2, compression_type=0,
                                          is_transactional=transactional, producer_id=pid,
                                          producer_epoch=0, base_sequence=i,
                                          batch_size=1 << 20)  # fmt: skip
            b.append(0, timestamp=TS + i, key=b"k%d" % (i % 5), value=b"v%d" % i, headers=[])
            buf = b.build()
            struct.pack_into(">q", buf, 0, model.end)
            if transactional and 1 not in model.open:
                model.txns += 1
                model.open[1] = (model.txns, model.end)
            keyed.append(model.end)
            model.values.append(b"v%d" % i)
            replica.append_as_follower(bytes(buf))
            if i % 3 == 1:  # a transaction of two batches, aborted
                replica.append_as_follower(model.end_txn(1, commit=False))
        assert model.entries
        before = store.read(TOPIC, 0, 0, 10_000, isolation_level="read_committed")
        store.compact(TOPIC)
        after = store.read(TOPIC, 0, 0, 10_000, isolation_level="read_committed")
        assert {m.offset for m in after} <= {m.offset for m in before}
        aborted_offsets = {o for o, v in enumerate(model.values)
                           if v is not None and o in set(keyed)
                           and any(f <= o <= last for _, f, last, _ in model.entries)}  # fmt: skip
        assert not {m.offset for m in after} & aborted_offsets
        assert txnindex_entries(tmp_path / "s" / f"{TOPIC}-0") == model.entries


def test_compaction_never_lets_an_aborted_or_open_record_shadow_a_committed_one(
    tmp_path: Path,
) -> None:
    """Kafka's cleaner maps only stable records (below the last stable offset, none of an
    aborted transaction) and drops aborted records: a key written committed, then in a
    transaction that aborts and in one still open, keeps its committed record through
    compaction; once the open one commits, its record shadows the old one."""
    path = str(tmp_path / "s")
    with mqcore.open(path, create=True) as store:
        store.create_topic(TOPIC, segment_bytes=1024, cleanup_policy="compact")
        replica = store.log.replica(TOPIC, 0)
        at = [0]

        def append(batch: bytes, n: int = 1) -> int:
            replica.append_as_follower(batch)
            at[0] += n
            return at[0] - n

        def fill(n: int) -> None:  # distinct keys, plain batches: segments roll
            for _ in range(n):
                append(data_batch(at[0], 9, 0, at[0], [b"filler-%d" % at[0]], False))

        committed = append(data_batch(at[0], 9, 0, at[0], [b"K"], False))
        fill(20)
        aborted = append(data_batch(at[0], 1, 0, 0, [b"K"], True))
        assert store.get(TOPIC, 0, aborted) is not None
        fill(20)
        append(marker_batch(at[0], 1, 0, commit=False))
        fill(20)
        pending = append(data_batch(at[0], 2, 0, 0, [b"K"], True))
        fill(40)
        assert len(store.segment_offsets(TOPIC)) > 4
        assert store.last_stable_offset(TOPIC) == pending

        def holders(level: str) -> list[int]:
            return [m.offset for m in store.read(TOPIC, 0, 0, 10_000, isolation_level=level)
                    if m.value == b"K"]  # fmt: skip

        store.compact(TOPIC)
        assert holders("read_committed") == [committed]
        assert holders("read_uncommitted") == [committed, pending]  # the aborted one dropped
        assert store.get(TOPIC, 0, aborted) is None
        assert [m.offset for m in store.find_by_key(TOPIC, b"K")] == [committed, pending]
        append(marker_batch(at[0], 2, 0, commit=True))
        fill(40)
        store.compact(TOPIC)
        assert holders("read_committed") == holders("read_uncommitted") == [pending]
    with mqcore.open(path) as store:
        assert [m.offset for m in store.read(TOPIC, 0, 0, 10_000) if m.value == b"K"] == [pending]


def kafka_snapshot(entries: dict[int, tuple[int, int, int, int, int]]) -> bytes:
    """Kafka's producer snapshot, version 1 (ProducerStateManager.writeSnapshot): int16
    version, uint32 CRC-32C of the rest, int32 count, then per producer: int64 id, int16
    epoch, int32 last sequence, int64 last offset, int32 offset delta, int64 timestamp, int32
    coordinator epoch, int64 current transaction's first offset (-1: none)."""
    body = struct.pack(">i", len(entries)) + b"".join(
        struct.pack(">qhiqiqiq", pid, 0, last_seq, last_off, delta, ts, -1, txn_first)
        for pid, (last_seq, last_off, delta, ts, txn_first) in sorted(entries.items()))  # fmt: skip
    return struct.pack(">hI", 1, calc_crc32c(body)) + body


def test_a_kafka_log_directory_with_transactions_answers_read_committed(tmp_path: Path) -> None:
    """A bare Kafka log directory as Kafka leaves it: two segments of transactional and plain
    batches with their markers, each segment's `.txnindex` holding the aborts whose markers it
    holds, and a producer snapshot at the second segment's base offset that carries the
    transactions open there. Opened read-only (nothing written) it answers as the model; the
    transactions still open at the end hold the last stable offset, including one opened
    before the snapshot that no batch after it names first."""
    rng = random.Random(5)
    model = Model()
    first_half = random_ops(rng, model, 60)
    split = model.end
    producers: dict[int, tuple[int, int, int, int, int]] = {}
    for batch in first_half:  # the producer state at the split, from the batches themselves
        (base,) = struct.unpack_from(">q", batch, 0)
        attrs, delta = struct.unpack_from(">hi", batch, 21)
        ts, pid, _, seq = struct.unpack_from(">qqhi", batch, 35)
        if attrs & 0x20 or pid < 0:
            continue
        producers[pid] = (seq + delta, base + delta, delta, ts, -1)
    for pid, (_, first) in model.open.items():
        producers[pid] = (*producers[pid][:4], first)
    pid_open = 4  # a transaction opened before the snapshot, never ended: only it says where
    producers[pid_open] = (0, split - 1, 0, TS, split - 1)  # (an earlier batch of it, retained)
    model.open[pid_open] = (999, split - 1)
    second_half = random_ops(rng, model, 60)
    directory = tmp_path / "kafka-logs" / f"{TOPIC}-0"
    directory.mkdir(parents=True)
    (directory / f"{0:020d}.log").write_bytes(b"".join(first_half))
    (directory / f"{split:020d}.log").write_bytes(b"".join(second_half))
    for base, end in ((0, split), (split, model.end)):
        entries = [e for e in model.entries if base <= e[2] < end]
        if entries:
            (directory / f"{base:020d}.txnindex").write_bytes(
                b"".join(struct.pack(">hqqqq", 0, *e) for e in entries))  # fmt: skip
    (directory / f"{split:020d}.snapshot").write_bytes(kafka_snapshot(producers))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in directory.iterdir())
    with mqcore.open(str(tmp_path / "kafka-logs"), read_only=True) as store:
        assert store.last_stable_offset(TOPIC) == min(model.lso, split - 1)
        check(store, model)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in directory.iterdir()) == before


def test_the_cli_reads_either_isolation_level(tmp_path: Path) -> None:
    """`mqcore consume` and `mqcore get` take --isolation-level (default read_uncommitted, as
    kcat's); read_committed prints exactly the committed records and says why a record of
    an aborted transaction is not there."""
    from conftest import run_cli

    rng = random.Random(9)
    model = Model()
    path = str(tmp_path / "s")
    build(path, model, rng, 60, segment_bytes=1 << 20)
    for level, want in (("read_committed", model.committed()),
                        ("read_uncommitted", model.uncommitted())):  # fmt: skip
        code, out, err = run_cli("consume", path, TOPIC, "--isolation-level", level)
        assert code == 0, err
        fields = [line.split("\t") for line in out.splitlines()]
        got = [(int(f[1]), f[4].encode()) for f in fields]
        assert got == want, level
    code, out, _ = run_cli("consume", path, TOPIC)
    assert len(out.splitlines()) == len(model.uncommitted())
    aborted = next(o for o, v in model.uncommitted() if o not in dict(model.committed())
                   and o < model.lso)  # fmt: skip
    code, out, err = run_cli("get", path, TOPIC, "0", str(aborted),
                             "--isolation-level", "read_committed")  # fmt: skip
    assert code == 1 and "not committed" in err, (out, err)
    code, out, err = run_cli("get", path, TOPIC, "0", str(aborted))
    assert code == 0 and "Traceback" not in err
    for level, want in (("read_committed", model.committed()),
                        ("read_uncommitted", model.uncommitted())):  # fmt: skip
        code, out, err = run_cli("query", path, TOPIC, "--contains", "-", "--limit", "10000",
                                 "--isolation-level", level)  # fmt: skip
        assert code == 0, err
        assert [int(line.split("\t")[2]) for line in out.splitlines()] == [o for o, _ in want]
        key = dict(model.uncommitted())[aborted].decode()
        code, out, err = run_cli("query", path, TOPIC, "--key", key, "--isolation-level", level)
        assert code == 0, err
        assert len(out.splitlines()) == (level == "read_uncommitted"), (level, out)


@pytest.mark.parametrize("level", ["read_committed", "read_uncommitted"])
def test_consumer_and_share_groups_read_their_isolation_level(tmp_path: Path, level: str) -> None:
    """A consumer group's and a share group's members see what a Kafka consumer at their
    isolation level sees: polled to the end, read_committed stops at the last stable offset
    (an open transaction is left at the end) and skips aborted records. Once the open
    transactions commit, the rest arrives."""
    rng = random.Random(4)
    model = Model()
    path = str(tmp_path / "s")
    build(path, model, rng, 80, segment_bytes=4096)
    with mqcore.open(path) as store:
        replica = store.log.replica(TOPIC, 0)
        replica.append_as_follower(model.data(7, 3, True))  # left open
        want = model.committed() if level == "read_committed" else model.uncommitted()
        consumer = store.consumer("g", TOPIC, isolation_level=level)
        share = store.share_consumer("s", TOPIC, isolation_level=level)
        got: list[tuple[int, bytes | None]] = []
        shared: list[tuple[int, bytes | None]] = []
        for _ in range(model.end + 2):  # bounded: each poll moves on or finds the end
            page = consumer.poll(50)
            more = share.poll(50)
            got += [(m.offset, m.value) for m in page]
            shared += [(m.offset, m.value) for m in more]
            if not page and not more:
                break
        assert got == want
        assert sorted(shared) == want
        stable = model.lso  # the oldest open transaction's first offset
        for pid in sorted(model.open):  # every open transaction commits
            replica.append_as_follower(model.end_txn(pid, commit=True))
        assert store.last_stable_offset(TOPIC) == model.end
        later = [(m.offset, m.value) for m in consumer.poll(10_000)]
        if level == "read_committed":  # the rest, now committed
            assert later == [(o, v) for o, v in model.committed() if o >= stable] != []
        else:  # every record was delivered already
            assert later == []
        consumer.close()
        share.close()
    with mqcore.open(path) as store:
        with pytest.raises(InvalidConfigError, match="isolation_level"):
            store.consumer("h", TOPIC, isolation_level="committed")
