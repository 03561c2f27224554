"""Replication's decisions (mqcore.cluster.replication) between real logs on disk: the
failover histories of KIP-101 and KIP-279 (a follower ahead of the new leader, followers whose
epochs diverge), the high watermark, ISR shrink and expansion, min.insync.replicas. Each
broker's partition is a ReplicaLog of its own directory; batches are built by kafka-python, as
a producer sends them. After every failover the logs must agree byte for byte."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from mqcore.cluster.replication import (
    LeaderPartition,
    fetch_from_leader,
    truncate_to_leader,
    truncation_offset,
)
from mqcore.config import FlushPolicy, TopicConfig
from mqcore.errors import InvalidConfigError
from mqcore.log import ReplicaLog


def batch(*values: bytes) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    now = int(time.time() * 1000)
    for i, v in enumerate(values):
        b.append(i, timestamp=now, key=None, value=v, headers=[])
    return bytes(b.build())


def broker_log(tmp_path: Path, name: str) -> ReplicaLog:
    return ReplicaLog.open(str(tmp_path / name / "t-0"), "t", 0, TopicConfig(),
                           FlushPolicy("always"))  # type: ignore[arg-type]  # fmt: skip


def everything(log: ReplicaLog) -> bytes:
    """The log's batches from its start to its end, as stored."""
    out, offset = b"", log.log_start_offset
    while offset < log.log_end_offset:
        r = log.read_bytes(offset, 1 << 30, "log_end")
        out += r.data
        offset = r.last_offset + 1
    return out


def values(log: ReplicaLog) -> list[bytes | None]:
    """Every record's value, read by kafka-python."""
    out, records = [], MemoryRecords(everything(log))
    while (b := records.next_batch()) is not None:
        out += [r.value for r in b]
    return out


def wire(leader: ReplicaLog) -> tuple[object, object]:
    """The leader as a follower reaches it: OffsetForLeaderEpoch and a replica's Fetch (read
    to the log end, not the high watermark)."""

    def offsets_for(epoch: int) -> tuple[int, int]:
        return leader.end_offset_for_epoch(epoch)

    def fetch(offset: int) -> bytes:
        if offset >= leader.log_end_offset:
            return b""
        return leader.read_bytes(offset, 1 << 20, "log_end").data

    return offsets_for, fetch


def follow(follower: ReplicaLog, leader: ReplicaLog) -> None:
    offsets_for, fetch = wire(leader)
    truncate_to_leader(follower, offsets_for)  # type: ignore[arg-type]
    fetch_from_leader(follower, fetch, max_rounds=100)  # type: ignore[arg-type]


def test_a_follower_ahead_of_the_new_leader_loses_only_the_uncommitted_tail(
    tmp_path: Path,
) -> None:
    """KIP-101's first case. A leads epoch 0 and writes m0, m1; B copied only m0 (so the high
    watermark was 1: m1 was never acknowledged with acks=all). A dies, B leads epoch 1 and
    writes m2 at offset 1. A returns as a follower: by epochs it truncates to 1 (m1 goes), then
    copies m2; both logs are then the same bytes. By its high watermark alone A would also
    have cut to 1 here; the next case is where that goes wrong."""
    a, b = broker_log(tmp_path, "a"), broker_log(tmp_path, "b")
    with a, b:
        a.append_as_leader(batch(b"m0"), 0)
        b.append_as_follower(a.read_bytes(0, 1 << 20, "log_end").data)
        a.append_as_leader(batch(b"m1"), 0)
        b.assign_epoch(1)
        b.append_as_leader(batch(b"m2"), 1)
        follow(a, b)
        assert a.log_end_offset == b.log_end_offset == 2
        assert everything(a) == everything(b)
        assert values(a) == [b"m0", b"m2"]
        assert a.epoch_entries == b.epoch_entries


def test_a_committed_record_survives_a_restart_then_a_failover(tmp_path: Path) -> None:
    """KIP-101's data-loss case for truncation by high watermark. A leads epoch 0 and writes
    m0, m1; B copies both, and A's high watermark reaches 2 (m1 acknowledged), but B would
    learn that only on its next fetch (its own is 1). B restarts and follows A again: by its
    high watermark it would cut m1; by epochs (A's epoch 0 ends at 2) it keeps it. Then A dies
    and B leads epoch 1: m1 is still there, and A, following B, ends up with B's bytes."""
    a, b = broker_log(tmp_path, "a"), broker_log(tmp_path, "b")
    with a, b:
        a.append_as_leader(batch(b"m0"), 0)
        a.append_as_leader(batch(b"m1"), 0)
        b.append_as_follower(a.read_bytes(0, 1 << 20, "log_end").data)  # both batches
        a.update_high_watermark(2)
        b.update_high_watermark(1)
        offsets_for, _ = wire(a)
        assert truncate_to_leader(b, offsets_for) == 2  # type: ignore[arg-type]
        assert b.high_watermark == 1  # what truncation by high watermark would have kept
        b.assign_epoch(1)  # A died: B leads
        b.append_as_leader(batch(b"m2"), 1)
        follow(a, b)
        assert a.log_end_offset == b.log_end_offset == 3
        assert everything(a) == everything(b)
        assert values(a) == [b"m0", b"m1", b"m2"]


def test_diverging_epochs_take_several_rounds(tmp_path: Path) -> None:
    """KIP-279's case: the follower's latest epoch is one the leader never had. F holds
    epochs 0@0 and 2@3 (it led epoch 2 briefly, unreplicated); the leader L holds 0@0, 1@2,
    3@4. F asks about epoch 2: L answers epoch 1, ending at 4; F has no epoch 1, so it cuts to
    where its epoch 0 ends (3) and asks again about epoch 0: L's epoch 0 ends at 2, so F cuts
    to 2 and copies L's log from there."""
    f, leader = broker_log(tmp_path, "f"), broker_log(tmp_path, "l")
    with f, leader:
        for v in (b"x0", b"x1"):
            leader.append_as_leader(batch(v), 0)
        f.append_as_follower(leader.read_bytes(0, 1 << 20, "log_end").data)  # both batches
        f.append_as_leader(batch(b"f2"), 0)  # f's own epoch-0 record at 2 (never replicated)
        f.append_as_leader(batch(b"f3"), 2)
        f.append_as_leader(batch(b"f4"), 2)
        leader.append_as_leader(batch(b"l2"), 1)
        leader.append_as_leader(batch(b"l3"), 1)
        leader.append_as_leader(batch(b"l4"), 3)
        assert [(e.epoch, e.start_offset) for e in f.epoch_entries] == [(0, 0), (2, 3)]
        assert [(e.epoch, e.start_offset) for e in leader.epoch_entries] == [(0, 0), (1, 2), (3, 4)]
        assert truncation_offset(f, *leader.end_offset_for_epoch(2)) == (3, False)
        asked: list[int] = []
        offsets_for, fetch = wire(leader)

        def recorded(epoch: int) -> tuple[int, int]:
            asked.append(epoch)
            return offsets_for(epoch)  # type: ignore[operator,no-any-return]

        assert truncate_to_leader(f, recorded) == 2
        assert asked == [2, 0]
        fetch_from_leader(f, fetch, max_rounds=100)  # type: ignore[arg-type]
        assert everything(f) == everything(leader)
        assert values(f) == [b"x0", b"x1", b"l2", b"l3", b"l4"]
        assert f.epoch_entries == leader.epoch_entries


def test_a_follower_without_epochs_keeps_what_is_committed(tmp_path: Path) -> None:
    """The leader knows no epoch the follower asks about (UNDEFINED): the follower keeps its
    high watermark, as Kafka falls back."""
    f = broker_log(tmp_path, "f")
    with f:
        for v in (b"a", b"b", b"c"):
            f.append_as_leader(batch(v), 4)
        f.update_high_watermark(2)
        assert truncate_to_leader(f, lambda _epoch: (-1, -1)) == 2


def test_the_high_watermark_is_the_slowest_in_sync_replicas_log_end(tmp_path: Path) -> None:
    """Leader 1 with followers 2 and 3: the high watermark follows the slower in-sync
    follower and never goes back; acks=all is answered once it passes the write."""
    log = broker_log(tmp_path, "l")
    with log:
        leader = LeaderPartition(log, 1, 5, [1, 2, 3], [1, 2, 3], now_ms=0)
        for v in (b"a", b"b", b"c", b"d"):
            log.append_as_leader(batch(v), 5)
        assert log.high_watermark == 0 and not leader.committed(0)
        assert leader.follower_fetched(2, 4, now_ms=10) == 0  # 3 has nothing yet
        assert leader.follower_fetched(3, 2, now_ms=10) == 2
        assert leader.committed(1) and not leader.committed(2)
        assert leader.follower_fetched(3, 1, now_ms=11) == 2  # a stale fetch: no step back
        assert leader.follower_fetched(3, 4, now_ms=12) == 4
        assert [(e.epoch, e.start_offset) for e in log.epoch_entries] == [(5, 0)]


def test_a_follower_that_stops_fetching_leaves_the_isr_and_rejoins_once_caught_up(
    tmp_path: Path,
) -> None:
    """Follower 3 stops fetching: after replica.lag.time.max.ms it is the one to drop, and the
    high watermark then moves with follower 2 alone; below min.insync.replicas=3 writes are
    refused, at 2 taken. Follower 3 fetching again rejoins only once it reached the high
    watermark."""
    log = broker_log(tmp_path, "l")
    with log:
        leader = LeaderPartition(log, 1, 0, [1, 2, 3], [1, 2, 3], now_ms=0,
                                 replica_lag_time_max_ms=1000)  # fmt: skip
        log.append_as_leader(batch(b"a", b"b"), 0)
        leader.follower_fetched(2, 2, now_ms=100)
        leader.follower_fetched(3, 0, now_ms=100)  # behind: not caught up
        assert leader.lagging(now_ms=999) == set()
        leader.follower_fetched(2, 2, now_ms=1500)
        assert leader.lagging(now_ms=1500) == {3}
        assert leader.set_isr({1, 2}) == 2  # without 3, the high watermark reaches 2
        assert not leader.enough_replicas(3) and leader.enough_replicas(2)
        log.append_as_leader(batch(b"c"), 0)
        leader.follower_fetched(2, 3, now_ms=1600)
        assert log.high_watermark == 3
        leader.follower_fetched(3, 2, now_ms=1650)
        assert leader.may_join() == set()  # 2 < the high watermark 3
        leader.follower_fetched(3, 3, now_ms=1700)
        assert leader.may_join() == {3}
        assert leader.set_isr({1, 2, 3}) == 3 and leader.lagging(now_ms=1800) == set()
        with pytest.raises(InvalidConfigError, match="left out of the ISR"):
            leader.set_isr({2, 3})
