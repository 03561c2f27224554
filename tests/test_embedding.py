"""The embedding API (mqcore.log.ReplicaLog, docs/embedding.md) against an independent codec.

Batches are built by kafka-python's DefaultRecordBatchBuilder, as a Kafka client sends them,
appended as bytes, and read back both by mqcore's Store and by kafka-python's reader; bad input
must be refused with the right mqcore.errors exception and leave the files untouched;
truncation and crashes must leave files a fresh open agrees with.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import child_env
from crashchild import run_child
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

import mqcore
from mqcore.config import FlushPolicy, TopicConfig
from mqcore.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordTooLargeError,
)
from mqcore.log import ReplicaLog

ROOT = Path(__file__).resolve().parent.parent
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def build(
    values: list[bytes],
    *,
    keys: list[bytes | None] | None = None,
    codec: str = "none",
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    ts: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> bytes:
    """One v2 batch as kafka-python's producer builds it."""
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=CODECS[codec], is_transactional=False, producer_id=pid,
        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 22,
    )  # fmt: skip
    now = int(time.time() * 1000) if ts is None else ts
    for i, v in enumerate(values):
        key = keys[i] if keys else None
        b.append(i, timestamp=now + i, key=key, value=v, headers=headers or [])
    return bytes(b.build())


def kafka_records(data: bytes) -> list[tuple[int, int, int, bytes | None, bytes | None, list]]:
    """(offset, timestamp, timestamp type, key, value, headers) of every record, read and
    CRC-checked by kafka-python."""
    out = []
    mr = MemoryRecords(data)
    while (batch := mr.next_batch()) is not None:
        assert isinstance(batch, DefaultRecordBatch) and batch.validate_crc()
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)))
    return out


def open_log(path: Path, **cfg: object) -> ReplicaLog:
    return ReplicaLog.open(
        str(path / "t-0"),
        "t",
        0,
        TopicConfig(**cfg),
        FlushPolicy("always"),  # type: ignore[arg-type]
    )


def files(path: Path) -> dict[str, bytes]:
    d = path / "t-0"
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d))}


def test_leader_append_round_trips_through_store_and_kafka_python(tmp_path: Path) -> None:
    sent = []
    with open_log(tmp_path) as log:
        for n, codec in enumerate(CODECS):
            values = [b"%s-%d" % (codec.encode(), i) * (i + 1) for i in range(5)]
            keys: list[bytes | None] = [b"k%d" % i if i % 2 else None for i in range(5)]
            hdrs = [("h", b"x%d" % n)]
            data = build(values, keys=keys, codec=codec, headers=hdrs)
            info = log.append_as_leader(data, leader_epoch=3)
            assert (info.first_offset, info.last_offset, info.records) == (5 * n, 5 * n + 4, 5)
            sent += [(k, v, hdrs) for k, v in zip(keys, values, strict=True)]
        log.update_high_watermark(log.log_end_offset)
        raw = log.read_bytes(0, 1 << 30).data
        region_log = log.read(0, 1 << 30)
        with region_log:
            assert region_log.tobytes() == raw  # one segment: the file region is the same bytes
    got = kafka_records(raw)
    assert [g[0] for g in got] == list(range(25))
    assert [(g[3], g[4], g[5]) for g in got] == sent
    assert all(g[2] == 0 for g in got)  # CreateTime
    # every batch carries the leader epoch and its offsets, stamped in place
    mr, epochs = MemoryRecords(raw), []
    while (batch := mr.next_batch()) is not None:
        epochs.append(batch.base_offset)
    assert epochs == [0, 5, 10, 15, 20]
    with mqcore.open(str(tmp_path), read_only=True) as store:
        msgs = store.read("t", 0, 0, 100)
    assert [(m.offset, m.key, m.value, m.timestamp) for m in msgs] == [
        (g[0], g[3], g[4], g[1]) for g in got
    ]


def test_log_append_time_restamps_max_timestamp_and_crc(tmp_path: Path) -> None:
    with open_log(tmp_path, timestamp_type="LogAppendTime") as log:
        before = int(time.time() * 1000)
        info = log.append_as_leader(build([b"a", b"b"], ts=1_000), 0)
        after = int(time.time() * 1000)
        assert before <= info.log_append_time <= after
        got = kafka_records(log.read_bytes(0, 1 << 20, "log_end").data)  # validates the CRC
    assert [(g[1], g[2]) for g in got] == [(info.log_append_time, 1)] * 2


def test_fetch_returns_whole_batches_within_budget_and_hw(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=1024) as log:
        for i in range(20):
            log.append_as_leader(build([b"v%d-%d" % (i, j) * 10 for j in range(3)]), 0)
        end = log.log_end_offset
        log.update_high_watermark(31)  # inside the batch [30, 32]: that batch is not visible
        for offset in range(0, end + 1):
            for budget in (1, 200, 700, 1 << 20):
                r = log.read_bytes(offset, budget)
                if offset >= 30:
                    assert r.data == b"" and r.first_offset == -1
                    continue
                got = kafka_records(r.data)
                # brute force: batches are [3k, 3k+2]; from the one holding offset, in one
                # segment, at least one, then while the total fits the budget, all below 30
                assert got[0][0] == offset - offset % 3 == r.first_offset
                assert got[-1][0] == r.last_offset < 30
                assert len(r.data) <= budget or len(got) == 3
                full = log.read_bytes(offset, 1 << 20, "log_end")
                assert full.data.startswith(r.data)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(end + 1, 100, "log_end")


def test_file_region_sendfile_sends_the_batches(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for i in range(3):
            log.append_as_leader(build([b"x%d" % i] * 4), 0)
        log.update_high_watermark(log.log_end_offset)
        out = tmp_path / "sent"
        with log.read(2, 1 << 20) as r, open(out, "wb") as f:
            assert r.region is not None
            assert r.send(f.fileno()) == r.region.length
        assert out.read_bytes() == log.read_bytes(2, 1 << 20).data


def _corrupt_crc(data: bytes) -> bytes:
    b = bytearray(data)
    b[-1] ^= 0xFF
    return bytes(b)


def _wrong_magic(data: bytes) -> bytes:
    b = bytearray(data)
    b[16] = 1
    return bytes(b)


@pytest.mark.parametrize(
    ("mangle", "error", "words"),
    [
        (lambda d: d[:-3], CorruptRecordError, "truncated buffer"),
        (lambda d: d[:10], CorruptRecordError, "truncated buffer"),
        (_corrupt_crc, CorruptRecordError, "CRC"),
        (_wrong_magic, CorruptRecordError, "magic"),
        (lambda d: b"", InvalidRecordError, "no record batch"),
        (lambda d: d + d, InvalidRecordError, "exactly one record batch"),
    ],
)
def test_bad_leader_input_is_refused_and_stores_nothing(
    tmp_path: Path, mangle: object, error: type[Exception], words: str
) -> None:
    with open_log(tmp_path) as log:
        log.append_as_leader(build([b"keep"]), 0)
        before = files(tmp_path)
        with pytest.raises(error, match=words):
            log.append_as_leader(mangle(build([b"a", b"b"])), 0)  # type: ignore[operator]
        assert log.log_end_offset == 1
    assert files(tmp_path) == before or _same_log(files(tmp_path), before)


def _same_log(now: dict[str, bytes], before: dict[str, bytes]) -> bool:
    log = "00000000000000000000.log"
    return now[log] == before[log]


def test_producer_sequence_rules(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        first = log.append_as_leader(build([b"a", b"b"], pid=9, epoch=1, seq=0), 0)
        dup = log.append_as_leader(build([b"a", b"b"], pid=9, epoch=1, seq=0), 0)
        assert dup.duplicate and (dup.first_offset, dup.last_offset) == (0, 1)
        size = os.path.getsize(tmp_path / "t-0" / "00000000000000000000.log")
        with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2"):
            log.append_as_leader(build([b"c"], pid=9, epoch=1, seq=3), 0)
        with pytest.raises(ProducerFencedError):
            log.append_as_leader(build([b"c"], pid=9, epoch=0, seq=2), 0)
        assert os.path.getsize(tmp_path / "t-0" / "00000000000000000000.log") == size
        assert log.append_as_leader(build([b"c"], pid=9, epoch=1, seq=2), 0).first_offset == 2
        assert first.first_offset == 0 and log.log_end_offset == 3
        assert log.producer_state is not None
        assert log.producer_state.next_sequence_for(9, 1) == 3


def test_topic_limits_are_enforced(tmp_path: Path) -> None:
    with open_log(tmp_path, max_message_bytes=200) as log:
        with pytest.raises(RecordTooLargeError):
            log.append_as_leader(build([b"x" * 300]), 0)
        with pytest.raises(InvalidRecordError, match="ahead of the clock"):
            log.append_as_leader(build([b"x"], ts=int(time.time() * 1000) + 10 * 3_600_000), 0)
        assert log.log_end_offset == 0


def test_follower_copies_leader_bytes_and_refuses_gaps(tmp_path: Path) -> None:
    with open_log(tmp_path / "a") as leader, open_log(tmp_path / "b") as follower:
        for epoch in (1, 1, 4, 4, 6):
            leader.append_as_leader(build([b"e%d" % epoch] * 3), epoch)
        data = leader.read_bytes(0, 1 << 20, "log_end").data
        one = leader.read_bytes(0, 1, "log_end").data
        assert follower.append_as_follower(one).last_offset == 2
        with pytest.raises(InvalidRecordError, match="gap or an overlap"):
            follower.append_as_follower(one)  # overlap
        third = leader.read_bytes(6, 1, "log_end").data
        with pytest.raises(InvalidRecordError, match="gap or an overlap"):
            follower.append_as_follower(third)  # gap
        rest = data[len(one) :]
        bad = rest[:-1] + bytes([rest[-1] ^ 1])  # the last batch's CRC fails: none is written
        with pytest.raises(CorruptRecordError, match="CRC"):
            follower.append_as_follower(bad)
        assert follower.log_end_offset == 3
        follower.append_as_follower(rest)
        assert follower.read_bytes(0, 1 << 20, "log_end").data == data
        assert follower.epoch_entries == leader.epoch_entries
    assert (tmp_path / "a/t-0/leader-epoch-checkpoint").read_bytes() == b"0\n3\n1 0\n4 6\n6 12\n"
    assert (tmp_path / "b/t-0/leader-epoch-checkpoint").read_bytes() == b"0\n3\n1 0\n4 6\n6 12\n"


def test_end_offset_for_epoch_follows_kafka_rules(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        for epoch, n in ((2, 3), (2, 3), (5, 4), (7, 2)):
            log.append_as_leader(build([b"v"] * n), epoch)
        # entries: 2@0, 5@6, 7@10; log end 12 (Kafka's LeaderEpochFileCache.endOffsetFor)
        assert log.end_offset_for_epoch(7) == (7, 12)  # the latest: the log end
        assert log.end_offset_for_epoch(2) == (2, 6)  # ends where the next one starts
        assert log.end_offset_for_epoch(3) == (2, 6)  # unknown, between: the floor's
        assert log.end_offset_for_epoch(6) == (5, 10)
        assert log.end_offset_for_epoch(1) == (1, 0)  # below every known epoch
        assert log.end_offset_for_epoch(8) == (-1, -1)  # above every known epoch
        assert log.end_offset_for_epoch(-1) == (-1, -1)


def _offsets(log: ReplicaLog) -> list[int]:
    """Every offset of the log, fetched segment by segment as a follower would."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        r = log.read_bytes(offset, 1 << 30, "log_end")
        out += [g[0] for g in kafka_records(r.data)]
        offset = r.last_offset + 1
    return out


def test_truncate_to_then_reopen_is_consistent(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=600) as log:
        for i in range(30):
            log.append_as_leader(build([b"r%d" % i] * 2, keys=[b"k%d" % i, None]), i // 10)
        segs = sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log"))
        assert len(segs) > 3
        assert log.truncate_to(33) == 32  # the batch [32, 33] goes whole
        assert log.epoch_entries[-1].epoch == 1  # epoch 2 began at 40: gone
        log.append_as_leader(build([b"after"]), 5)
        expect = [*range(32), 32]
    with mqcore.open(str(tmp_path), read_only=True) as store:
        assert [m.offset for m in store.read("t", 0, 0, 1000)] == expect
        assert store.get("t", 0, 32).value == b"after"
        assert store.get("t", 0, 31).value == b"r15"
        assert [m.offset for m in store.find_by_key("t", b"k15").messages] == [30]  # rebuilt
    # a clean reopen trusts the indexes the truncation rebuilt: same answers as a scan
    with open_log(tmp_path) as log:
        assert _offsets(log) == expect
        assert [e.epoch for e in log.epoch_entries] == [0, 1, 5]


def test_truncate_fully_and_delete_records(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=500) as log:
        for i in range(20):
            log.append_as_leader(build([b"v%d" % i] * 3), 1)
        with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
            log.update_high_watermark(10)
            log.delete_records_before(11)
        log.update_high_watermark(60)
        assert log.delete_records_before(13) == 13  # inside the batch [12, 14]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(12, 100)
        assert log.read_bytes(13, 100).first_offset == 12  # the batch holding 13, whole
        assert min(int(n[:20]) for n in os.listdir(tmp_path / "t-0") if n.endswith(".log")) <= 13
        assert [(e.epoch, e.start_offset) for e in log.epoch_entries] == [(1, 13)]
    with mqcore.open(str(tmp_path), read_only=True) as store:
        assert store.start_offset("t", 0) == 13
        assert store.get("t", 0, 12) is None
        assert [m.offset for m in store.read("t", 0, 13, 2)] == [13, 14]
        with pytest.raises(OffsetOutOfRangeError):
            store.read("t", 0, 12, 1)
    with open_log(tmp_path) as log:
        log.truncate_fully_and_start_at(1000)
        assert (log.log_start_offset, log.log_end_offset, log.epoch_entries) == (1000, 1000, [])
        assert log.append_as_leader(build([b"x"]), 2).first_offset == 1000
    assert sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log")) == [
        "00000000000000001000.log"
    ]


CHILD = r"""
import sys, time
sys.path.insert(0, sys.argv[2])
from test_embedding import build
from mqcore.config import FlushPolicy, TopicConfig
from mqcore.log import ReplicaLog
log = ReplicaLog.open(sys.argv[1] + "/t-0", "t", 0, TopicConfig(segment_bytes=700),
                      FlushPolicy("always"))
for i in range(40):
    info = log.append_as_leader(build([b"c%d" % i] * 2), 1)
    print(info.last_offset, flush=True)
log.truncate_to(25)
print("truncated", flush=True)
log.truncate_fully_and_start_at(100)
"""


@pytest.mark.parametrize(
    "crash_at",
    [
        "truncate.after_copy",
        "truncate.after_replace",
        "truncate.after_drop",
        "append.after_write:20",
    ],
)
def test_kill_during_append_or_truncate_leaves_a_consistent_prefix(
    tmp_path: Path, crash_at: str
) -> None:
    child = run_child(CHILD, str(tmp_path), str(Path(__file__).parent), crash_at=crash_at)
    acked = [int(x) for x in child.lines if x.isdigit()]
    with open_log(tmp_path) as log:
        got = _offsets(log)
        assert got == list(range(len(got)))  # a prefix, never a hole
        if crash_at == "truncate.after_replace":
            assert got == list(range(24))  # the .log was replaced: the truncation stands
        elif crash_at == "truncate.after_drop":
            assert got == []  # every segment was renamed away: the embedder truncates again
        else:
            assert len(got) >= (acked[-1] + 1 if acked else 0)  # nothing acknowledged lost
        # the reopened log appends where it ends
        assert log.append_as_leader(build([b"z"]), 2).first_offset == len(got)


def test_example_broker_runs(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "docs/examples/embedded_broker.py"), str(tmp_path)],
        capture_output=True, text=True, env=child_env(), timeout=120, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out == [
        "produce base_offset=0",
        "produce base_offset=4",
        "produce base_offset=8",
        "idempotent first=12 resend=12 end=13",
        out[4],
        "end_offset_for_epoch(1)=(1, 13)",
        "truncated end=8 epochs=[(1, 0), (2, 8)]",
        "after restart committed=8",
    ]
    assert out[4].endswith(" high_watermark=13 offsets=[4, 5, 6, 7]"), out[4]


def test_a_stores_replica_handle_wakes_its_waiting_consumer(tmp_path: Path) -> None:
    """Log.replica: the handle of a store's partition is one per partition, its leader append
    is read back by Store.read, and a consumer polling in another thread wakes for it (the
    log's append listener) instead of sleeping out its timeout."""
    import threading

    with mqcore.open(str(tmp_path / "s"), flush="always") as store:
        store.create_topic("t")
        replica = store.log.replica("t", 0)
        assert store.log.replica("t", 0) is replica
        consumer = store.consumer("g", "t")
        consumer.poll(timeout_ms=0)  # joined, nothing yet
        got: list[list[bytes | None]] = []
        started = threading.Event()

        def poll() -> None:
            started.set()
            got.append([m.value for m in consumer.poll(timeout_ms=60_000)])

        t = threading.Thread(target=poll)
        t.start()
        started.wait()
        before = time.monotonic()
        info = replica.append_as_leader(build([b"a", b"b"]), leader_epoch=0)
        t.join(30)
        assert not t.is_alive()
        assert got == [[b"a", b"b"]]
        assert time.monotonic() - before < 30  # woke for the append, not at its timeout
        assert (info.first_offset, info.last_offset) == (0, 1)
        assert [m.value for m in store.read("t", 0, 0)] == [b"a", b"b"]
        consumer.close()


def test_a_leaders_own_appends_carry_its_epoch(tmp_path: Path) -> None:
    """ReplicaLog.lead(epoch): batches the store appends itself (Store.append, as a group
    coordinator's offset commits are written) carry the epoch in partitionLeaderEpoch, read
    back by kafka-python's codec, and the CRC stays valid (the field is outside it);
    resign() stops it."""
    with mqcore.open(str(tmp_path / "s")) as store:
        store.create_topic("t")
        handle = store.log.replica("t", 0)
        store.append("t", b"before")
        handle.lead(4)
        store.append("t", b"led")
        handle.resign()
        store.append("t", b"after")
        raw = bytes(handle.read_bytes(0, 1 << 20, "log_end").data)
        assert handle.end_offset_for_epoch(4) == (4, 3)
    epochs = []
    records = MemoryRecords(raw)
    while records.has_next():
        batch = records.next_batch()
        assert isinstance(batch, DefaultRecordBatch) and batch.validate_crc()
        epochs.append(batch.leader_epoch)
    assert epochs == [-1, 4, -1]
