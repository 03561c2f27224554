"""Idempotent producers (mqcore/consume/producer.py, mqcore/storage/producer_state.py).

Sequences stamped in the batch headers (read back from the segment files), the 5-batch
duplicate window, gaps, fencing, epoch bumps, wrap-around, routing, producer id allocation and
the byte layout of Kafka's `.snapshot` file. Refused batches must leave every file unchanged.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pytest
from conftest import file_bytes

import mqcore
from mqcore._ext.batch import encode_batch, peek_batch_header, read_batch_info
from mqcore._ext.crc32c import crc32c
from mqcore._ext.hashing import kafka_partition
from mqcore.errors import (
    InvalidRecordError,
    OutOfOrderSequenceError,
    ProducerClosedError,
    ProducerFencedError,
)
from mqcore.storage.producer_state import (
    ProducerStateManager,
    read_snapshot,
    snapshot_offsets,
    snapshot_path,
)

INT32_MAX = 0x7FFFFFFF


def headers_of(
    store_path: str, topic: str = "t", partition: int = 0
) -> list[tuple[int, int, int, int, int]]:
    """(base offset, count, producer id, epoch, base sequence) of every batch on disk."""
    d = os.path.join(store_path, f"{topic}-{partition}")
    out = []
    for name in sorted(n for n in os.listdir(d) if n.endswith(".log")):
        data = Path(d, name).read_bytes()
        pos = 0
        while pos < len(data):
            info = peek_batch_header(data, pos)
            assert info is not None
            out.append(
                (
                    info.base_offset,
                    info.records_count,
                    info.producer_id,
                    info.producer_epoch,
                    info.base_sequence,
                )
            )
            pos += info.size
    return out


def test_encode_batch_writes_producer_fields_as_golden_bytes() -> None:
    pid, epoch, seq = 0x0102030405060708, 0x7FFF, INT32_MAX
    batch = encode_batch([b"a", b"b"], now_ms=5, producer_id=pid, producer_epoch=epoch,
                         base_sequence=seq)  # fmt: skip
    raw = batch.tobytes()
    assert raw[43:61] == struct.pack(">qhii", pid, epoch, seq, 2)
    assert raw[43:57] == bytes.fromhex("01020304050607087fff7fffffff")
    assert struct.unpack(">I", raw[17:21])[0] == crc32c(raw[21:])  # the CRC covers them
    info = peek_batch_header(raw, 0)
    assert info is not None
    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (pid, epoch, seq)
    checked = read_batch_info(raw, 0, True)
    assert checked is not None and checked.base_sequence == seq
    plain = encode_batch([b"a"], now_ms=5).tobytes()
    assert plain[43:57] == struct.pack(">qhi", -1, -1, -1)


def test_sequences_are_stamped_per_partition_in_the_headers(store: mqcore.Store) -> None:
    store.create_topic("t", partitions=2)
    p = store.producer(42, epoch=3)
    assert p.append_batch("t", [b"a", b"b", b"c"]).base_offset == 0
    assert p.append("t", b"d", partition=0).offset == 3
    p.append_batch("t", [b"x"], partition=1)
    store.append("t", b"plain")  # a non-idempotent append in between
    p.append_batch("t", [b"e", b"f"])
    assert p.sequence("t", 0) == 6 and p.sequence("t", 1) == 1
    store.flush()
    assert headers_of(store.path, "t", 0) == [
        (0, 3, 42, 3, 0),
        (3, 1, 42, 3, 3),
        (4, 1, -1, -1, -1),
        (5, 2, 42, 3, 4),
    ]
    assert headers_of(store.path, "t", 1) == [(0, 1, 42, 3, 0)]


def test_split_batch_gets_consecutive_sequences(store: mqcore.Store) -> None:
    store.create_topic("t", max_message_bytes=300, unique_ids=False)
    p = store.producer(7)
    md = p.append_batch("t", [bytes([i]) * 100 for i in range(8)])
    assert (md.base_offset, md.count, md.duplicate) == (0, 8, False)
    hdrs = headers_of(store.path)
    assert len(hdrs) > 1
    expect_seq = 0
    for base, count, pid, epoch, seq in hdrs:
        assert (pid, epoch, seq) == (7, 0, expect_seq) and base == expect_seq
        expect_seq += count
    assert expect_seq == 8 and p.sequence("t", 0) == 8
    before = file_bytes(store.path)
    again = p.append_batch("t", [bytes([i]) * 100 for i in range(8)], base_sequence=0)
    assert (again.base_offset, again.count, again.duplicate) == (0, 8, True)
    assert file_bytes(store.path) == before


def test_each_of_the_last_five_is_a_duplicate_and_the_sixth_back_is_refused(
    store: mqcore.Store,
) -> None:
    store.create_topic("t")
    p = store.producer(1)
    sent = []
    for i in range(7):
        size = i + 1
        md = p.append_batch("t", [b"v%d" % i] * size, timestamps=[1000 + i] * size)
        sent.append((p.sequence("t", 0) - size, size, md.base_offset))
    store.flush()
    before = file_bytes(store.path)
    end = store.end_offset("t")
    for seq, size, base in sent[-5:]:
        dup = p.append_batch("t", [b"other"] * size, base_sequence=seq)
        assert (dup.base_offset, dup.count, dup.duplicate) == (base, size, True)
        assert dup.unique_ids == [None] * size  # the resend's IDs were never stored
    seq6, size6, _ = sent[-6]
    want = (
        rf"producer 1 epoch 0 on t-0: expected sequence {p.sequence('t', 0)} .*got batch {seq6}\."
    )
    with pytest.raises(OutOfOrderSequenceError, match=want):
        p.append_batch("t", [b"x"] * size6, base_sequence=seq6)
    assert store.end_offset("t") == end
    assert p.sequence("t", 0) == sum(s for _, s, _ in sent)  # unchanged by the resends
    assert file_bytes(store.path) == before


def test_single_message_duplicate_returns_the_original_metadata(store: mqcore.Store) -> None:
    store.create_topic("t")
    p = store.producer(9)
    first = p.append("t", b"m", timestamp=1234)
    dup = p.append("t", b"m", timestamp=9999, sequence=0)
    assert (dup.offset, dup.timestamp, dup.duplicate, dup.unique_id) == (0, 1234, True, None)
    assert first.duplicate is False and first.unique_id is not None
    assert store.end_offset("t") == 1 and p.sequence("t", 0) == 1


def test_a_resend_that_only_partly_matches_a_window_batch_is_refused(store: mqcore.Store) -> None:
    store.create_topic("t")
    p = store.producer(2)
    p.append_batch("t", [b"a", b"b", b"c"])
    with pytest.raises(OutOfOrderSequenceError):
        p.append_batch("t", [b"a", b"b"], base_sequence=0)  # 0..1 is not the batch 0..2
    with pytest.raises(OutOfOrderSequenceError):
        p.append_batch("t", [b"b", b"c"], base_sequence=1)
    assert store.end_offset("t") == 3


def test_gaps_are_refused_and_write_nothing(store: mqcore.Store) -> None:
    store.create_topic("t")
    p = store.producer(3)
    before = file_bytes(store.path)
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 0 .a new producer's"):
        p.append_batch("t", [b"late"], base_sequence=1)
    assert file_bytes(store.path) == before and p.sequence("t", 0) == 0
    p.append_batch("t", [b"a", b"b"])
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2 .the next.*got batch 3"):
        p.append("t", b"gap", partition=0, sequence=3)
    assert store.end_offset("t") == 2
    assert p.append("t", b"next", partition=0).offset == 2


def test_an_older_epoch_is_fenced(store: mqcore.Store) -> None:
    store.create_topic("t")
    old = store.producer(5, epoch=0)
    old.append("t", b"a", partition=0)
    new = store.producer(5, epoch=1)
    new.append("t", b"b", partition=0)
    end = store.end_offset("t")
    with pytest.raises(ProducerFencedError, match="producer 5 epoch 0 is fenced on t-0"):
        old.append("t", b"zombie", partition=0)
    with pytest.raises(ProducerFencedError, match="the log has epoch 1"):
        store.producer(5, epoch=0)
    assert store.end_offset("t") == end


def test_a_new_epoch_restarts_the_sequence_at_zero(store: mqcore.Store) -> None:
    store.create_topic("t")
    e0 = store.producer(6, epoch=0)
    for _ in range(3):
        e0.append_batch("t", [b"x"])
    e1 = store.producer(6, epoch=1)
    assert e1.sequence("t", 0) == 0
    with pytest.raises(OutOfOrderSequenceError, match="a new epoch's first"):
        e1.append_batch("t", [b"y"], base_sequence=3)
    md = e1.append_batch("t", [b"y"])
    assert (md.base_offset, md.duplicate) == (3, False)
    # the old epoch's window is gone: (0, 0) now means epoch 1's own first batch
    assert e1.append_batch("t", [b"y"], base_sequence=0).base_offset == 3
    assert [h[3:] for h in headers_of(store.path)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    again = store.producer(6, epoch=1)
    assert again.sequence("t", 0) == 1  # a new Producer object goes on where the log is


def test_sequence_wraps_at_int32_max() -> None:
    mgr = ProducerStateManager("t-0", "/nonexistent", lambda: 0, fsync=False)
    offset = 0

    def write(seq: int, n: int) -> None:
        nonlocal offset
        b = encode_batch([b"v"] * n, now_ms=1, producer_id=1, producer_epoch=0, base_sequence=seq)
        assert mgr.check(1, 0, seq, n) is None
        b.set_base_offset(offset)
        offset += n
        mgr.record(1, 0, seq, b)

    write(0, 1)
    mgr.producers[1].batches[-1] = (
        mgr.producers[1].batches[-1].__class__(INT32_MAX - 3, INT32_MAX - 3, 0, 0, 1)
    )  # as if 2^31 - 3 records had been written
    write(INT32_MAX - 2, 2)  # ..., INT32_MAX - 1
    write(INT32_MAX, 3)  # INT32_MAX, 0, 1: across the wrap
    assert mgr.producers[1].batches[-1].last_seq == 1
    assert mgr.next_sequence_for(1, 0) == 2
    dup = mgr.check(1, 0, INT32_MAX, 3)
    assert dup is not None and dup.base_offset == 3
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2"):
        mgr.check(1, 0, 0, 1)
    write(2, 1)


def test_keyed_batch_routed_over_partitions_stamps_each_partition(store: mqcore.Store) -> None:
    store.create_topic("t", partitions=4)
    p = store.producer(11)
    keys = [b"k%d" % i for i in range(20)]
    out = p.append_batch("t", [b"v"] * 20, keys, partition=None)
    assert isinstance(out, list)
    counts = {md.partition: md.count for md in out}
    for part in range(4):
        n = sum(1 for k in keys if kafka_partition(k, 4) == part)
        assert counts.get(part, 0) == n and p.sequence("t", part) == n
    store.flush()
    for md in out:
        assert headers_of(store.path, "t", md.partition) == [(0, md.count, 11, 0, 0)]
    resent = p.append_batch("t", [b"v"] * 20, keys, partition=None,
                            base_sequence={md.partition: 0 for md in out})  # fmt: skip
    assert isinstance(resent, list) and all(md.duplicate for md in resent)
    with pytest.raises(InvalidRecordError, match="routed"):
        p.append_batch("t", [b"v"], [b"k"], partition=None, base_sequence=0)


def test_bad_producer_values_are_refused(store: mqcore.Store) -> None:
    store.create_topic("t")
    for pid, epoch in ((-1, 0), (1 << 63, 0), (1, -1), (1, 0x8000), (True, 0)):
        with pytest.raises(InvalidRecordError):
            store.producer(pid, epoch)
    p = store.producer(1)
    with pytest.raises(InvalidRecordError, match="sequence must be an int in 0..2147483647"):
        p.append_batch("t", [b"a"], base_sequence=1 << 31)
    with pytest.raises(InvalidRecordError, match="2 keys for 1 values"):
        p.append_batch("t", [b"a"], [b"k", b"j"], partition=None)
    p.close()
    with pytest.raises(ProducerClosedError):
        p.append("t", b"a")
    assert store.end_offset("t") == 0


def test_producer_ids_are_allocated_once_and_skip_used_ones(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("t")
        assert [store.producer().producer_id for _ in range(3)] == [0, 1, 2]
        store.producer(10).append("t", b"x")
        assert store.producer().producer_id == 11
    with mqcore.open(store_path, flush="os") as store:
        assert store.producer().producer_id == 12
    os.unlink(os.path.join(store_path, "mqcore-producer-ids"))
    with mqcore.open(store_path, flush="os") as store:
        # the counter is gone: ids that wrote to a partition are still never handed out
        assert store.producer().producer_id == 11


def test_concurrent_appends_of_one_producer_keep_sequences_in_order(store: mqcore.Store) -> None:
    store.create_topic("t")
    p = store.producer(4)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for i in range(50):
                p.append_batch("t", [b"%d" % i])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store.flush()
    assert [h[4] for h in headers_of(store.path)] == list(range(200))


def test_snapshot_file_is_kafkas_byte_layout(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("t")
        a = store.producer(100, epoch=2)
        a.append_batch("t", [b"a"] * 3, timestamps=[10, 30, 20])
        store.append("t", b"plain")
        b = store.producer(7)
        b.append_batch("t", [b"b"], timestamps=[5])
        a.append_batch("t", [b"c"] * 2, timestamps=[40, 41])
    d = os.path.join(store_path, "t-0")
    assert snapshot_offsets(d)[-1] == 7  # (a roll at 3: "plain" has the time of now)
    raw = Path(snapshot_path(d, 7)).read_bytes()
    entries = struct.pack(">i", 2)
    entries += struct.pack(">qhiqiqiq", 7, 0, 0, 4, 0, 5, -1, -1)
    entries += struct.pack(">qhiqiqiq", 100, 2, 4, 6, 1, 41, -1, -1)
    assert raw == struct.pack(">hI", 1, crc32c(entries)) + entries
    state = read_snapshot(snapshot_path(d, 7))
    assert state[100].epoch == 2 and state[100].batches[0].first_seq == 3


def test_non_idempotent_appends_are_untouched(store: mqcore.Store) -> None:
    store.create_topic("t")
    md = store.append_batch("t", [b"a", b"b"])
    assert md.duplicate is False and store.append("t", b"c").duplicate is False
    store.flush()
    assert [h[2:] for h in headers_of(store.path)] == [(-1, -1, -1)] * 2
