"""The public Store API: topics, appends, reads, bad input, locking, threads."""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from conftest import file_bytes

import mqcore
from mqcore._ext.hashing import kafka_partition
from mqcore.errors import (
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    ReadOnlyStoreError,
    RecordTooLargeError,
    StoreClosedError,
    StoreLockedError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)


def test_append_read_get_round_trip(store: mqcore.Store) -> None:
    store.create_topic("orders", partitions=2, unique_ids=False)  # headers exactly as given
    md = store.append("orders", b"v", key=b"k", headers={"h": b"x"}, partition=1, timestamp=42)
    assert (md.topic, md.partition, md.offset, md.timestamp) == ("orders", 1, 0, 42)
    bm = store.append_batch(
        "orders",
        [b"a", b"", None],
        keys=[None, b"k2", b"k3"],
        headers=[None, [("r", b"1"), ("r", None)], {}],
        partition=1,
        timestamps=[50, 40, 60],
    )
    assert (bm.partition, bm.base_offset, bm.count, bm.last_offset) == (1, 1, 3, 3)
    msgs = store.read("orders", 1, 0)
    assert [(m.offset, m.key, m.value, m.timestamp) for m in msgs] == [
        (0, b"k", b"v", 42),
        (1, None, b"a", 50),
        (2, b"k2", b"", 40),
        (3, b"k3", None, 60),
    ]
    assert msgs[0].headers == (("h", b"x"),)
    assert msgs[2].headers == (("r", b"1"), ("r", None))
    assert msgs[2].header("r") is None and msgs[0].header("h") == b"x"
    assert store.get("orders", 1, 3) == msgs[3]
    assert store.read("orders", 1, 2, max_records=1) == [msgs[2]]
    assert store.start_offset("orders", 1) == 0 and store.end_offset("orders", 1) == 4
    assert store.end_offset("orders", 0) == 0


def test_generated_unique_id_is_the_last_header(store: mqcore.Store) -> None:
    """By default every record gets a ("uid", 16 bytes) header after the caller's headers: a
    UUIDv7 whose text is the message's unique_id."""
    store.create_topic("t")
    md = store.append("t", b"v", headers=[("h", b"x"), ("h", None)])
    bm = store.append_batch("t", [b"a", b"b"], headers=[None, {"r": b"1"}])
    msgs = store.read("t", 0, 0)
    assert [m.headers[:-1] for m in msgs] == [(("h", b"x"), ("h", None)), (), (("r", b"1"),)]
    assert [m.headers[-1][0] for m in msgs] == ["uid"] * 3
    raws = [m.headers[-1][1] or b"" for m in msgs]
    assert [len(raw) for raw in raws] == [16] * 3 and len(set(raws)) == 3
    assert all(raw[6] >> 4 == 7 and raw[8] >> 6 == 0b10 for raw in raws)  # v7, RFC variant
    assert [m.unique_id for m in msgs] == [md.unique_id, *bm.unique_ids]
    assert [m.unique_id for m in msgs] == [str(uuid.UUID(bytes=raw)) for raw in raws]


def test_tombstone_is_not_empty_value(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t")
        s.append("t", None, key=b"gone")
        s.append("t", b"", key=b"empty")
    with mqcore.open(store_path, read_only=True) as s:
        a, b = s.read("t", 0, 0)
        assert a.value is None and b.value == b""
        rb = s.read_arrow("t", 0)
        assert rb.column("value").to_pylist() == [None, b""]


def test_offset_for_time_is_first_offset_at_or_after(store: mqcore.Store) -> None:
    store.create_topic("t")
    store.append_batch("t", [b"0", b"1", b"2", b"3"], timestamps=[100, 300, 200, 400])
    assert store.offset_for_time("t", 0, 50) == 0
    assert store.offset_for_time("t", 0, 150) == 1  # ts 300 at offset 1 comes before ts 200
    assert store.offset_for_time("t", 0, 300) == 1
    assert store.offset_for_time("t", 0, 301) == 3
    assert store.offset_for_time("t", 0, 401) is None


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "../escape", "x" * 250, "é", "a b", "topic\0", "/abs"]
)
def test_bad_topic_names_refused_and_nothing_created(store: mqcore.Store, name: str) -> None:
    before, entries = file_bytes(store.path), sorted(os.listdir(store.path))
    parent_entries = sorted(os.listdir(os.path.dirname(store.path)))
    with pytest.raises(InvalidTopicError):
        store.create_topic(name)
    with pytest.raises(InvalidTopicError):
        store.append(name, b"v")
    assert file_bytes(store.path) == before
    assert sorted(os.listdir(store.path)) == entries  # no directory was made, not even empty
    assert sorted(os.listdir(os.path.dirname(store.path))) == parent_entries


def test_legal_topic_names(store: mqcore.Store) -> None:
    for name in ["a", "A.b_c-1", "x" * 249, "..."]:
        store.create_topic(name)
    assert set(store.topics()) == {"a", "A.b_c-1", "x" * 249, "..."}


def test_non_str_topic_name(store: mqcore.Store) -> None:
    with pytest.raises(InvalidTopicError):
        store.create_topic(b"bytes")  # type: ignore[arg-type]


def test_create_topic_idempotent_and_conflicting(store: mqcore.Store) -> None:
    store.create_topic("t", partitions=3)
    store.create_topic("t", partitions=3)
    with pytest.raises(TopicExistsError):
        store.create_topic("t", partitions=4)
    assert store.partitions("t") == 3


def test_unknown_topic_and_auto_create(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as s:
        with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
            s.append("nope", b"v")
        assert s.topics() == []
    with mqcore.open(store_path, flush="os", auto_create_topics=True, default_partitions=2) as s:
        md = s.append("auto", b"v", partition=1)
        assert md.offset == 0 and s.partitions("auto") == 2


def test_unknown_partition(store: mqcore.Store) -> None:
    store.create_topic("t", partitions=2)
    for bad in (-1, 2, "0", True):
        with pytest.raises(UnknownPartitionError):
            store.append("t", b"v", partition=bad)  # type: ignore[arg-type]
        with pytest.raises(UnknownPartitionError):
            store.read("t", bad, 0)  # type: ignore[arg-type]


def test_oversize_message_refused_before_writing(store: mqcore.Store) -> None:
    store.create_topic("t", max_message_bytes=2048)
    store.append("t", b"x" * 100)
    before = file_bytes(store.path)
    with pytest.raises(RecordTooLargeError, match="max_message_bytes=2048"):
        store.append("t", b"x" * 2048)
    with pytest.raises(RecordTooLargeError):
        store.append_batch("t", [b"small", b"x" * 4096])
    assert file_bytes(store.path) == before
    assert store.end_offset("t", 0) == 1
    assert store.append("t", b"after").offset == 1


def test_oversize_batch_is_split_into_fitting_batches(store: mqcore.Store) -> None:
    store.create_topic("t", max_message_bytes=10_000)
    values = [os.urandom(1000) for _ in range(50)]
    md = store.append_batch("t", values)
    assert (md.base_offset, md.count) == (0, 50)
    assert [m.value for m in store.read("t", 0, 0, 100)] == values
    log = os.path.join(store.path, "t-0", "00000000000000000000.log")
    assert os.path.getsize(log) > 50_000  # several batches, each below the limit


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_split_batches_fill_up_to_the_limit(store: mqcore.Store, compression: str) -> None:
    """1000 x 1100 B with generated IDs is over Kafka's default 1 MiB limit: uncompressed,
    the first batch is filled to the limit and the rest follows in one more batch; compressed
    (sizes known only after compressing) it is halved. Offsets stay consecutive either way."""
    store.create_topic("t", compression=compression)
    values = [os.urandom(1100) for _ in range(1000)]
    md = store.append_batch("t", values)
    assert (md.base_offset, md.count) == (0, 1000)
    assert md.unique_ids is not None and len(md.unique_ids) == 1000
    msgs = store.read("t", 0, 0, 2000)
    assert [m.value for m in msgs] == values and [m.offset for m in msgs] == list(range(1000))
    assert [str(uuid.UUID(bytes=dict(m.headers)["uid"])) for m in msgs] == md.unique_ids
    log = os.path.join(store.path, "t-0", "00000000000000000000.log")
    with open(log, "rb") as f:
        data = f.read()
    sizes, pos = [], 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        sizes.append(12 + length)
        pos += 12 + length
    assert all(size <= 1048588 for size in sizes)
    if compression == "none":
        assert len(sizes) == 2 and sizes[0] > 1048588 - 1100
    else:
        assert len(sizes) == 2 and sizes[0] < 600_000


def test_default_limit_is_kafkas_and_1mib_values_need_a_larger_one(store: mqcore.Store) -> None:
    store.create_topic("small")
    with pytest.raises(RecordTooLargeError):
        store.append("small", b"x" * (1 << 20))
    store.create_topic("big", max_message_bytes=2 << 20)
    value = os.urandom(1 << 20)
    md = store.append("big", value)
    got = store.get("big", 0, md.offset)
    assert got is not None and got.value == value


def test_bad_record_types(store: mqcore.Store) -> None:
    store.create_topic("t")
    before = file_bytes(store.path)
    for kwargs in (
        {"value": "str"},
        {"value": 5},
        {"value": b"v", "key": "str"},
        {"value": b"v", "headers": {"h": "str"}},
        {"value": b"v", "headers": {1: b"x"}},
        {"value": b"v", "headers": [("only-one",)]},
        {"value": b"v", "timestamp": -5},
        {"value": b"v", "timestamp": "now"},
    ):
        with pytest.raises(InvalidRecordError):
            store.append("t", **kwargs)
    with pytest.raises(InvalidRecordError):
        store.append_batch("t", [])
    with pytest.raises(InvalidRecordError):
        store.append_batch("t", [b"a", b"b"], keys=[b"k"])
    assert file_bytes(store.path) == before


def test_offsets_out_of_range(store: mqcore.Store) -> None:
    store.create_topic("t")
    store.append_batch("t", [b"a", b"b"])
    with pytest.raises(OffsetOutOfRangeError):
        store.read("t", 0, -1)
    with pytest.raises(OffsetOutOfRangeError):
        store.read("t", 0, 3)
    with pytest.raises(OffsetOutOfRangeError):
        store.get("t", 0, -1)
    with pytest.raises(OffsetOutOfRangeError):
        store.iter_arrow("t", 0, 5, 10).__next__()
    assert store.read("t", 0, 2) == []
    assert store.get("t", 0, 2) is None and store.get("t", 0, 10**12) is None
    with pytest.raises(InvalidConfigError):
        store.read("t", 0, 0, max_records=-1)


def test_second_writer_refused_readers_allowed(store_path: str) -> None:
    s = mqcore.open(store_path, flush="os")
    s.create_topic("t")
    s.append("t", b"v")
    before = file_bytes(store_path)
    with pytest.raises(StoreLockedError):
        mqcore.open(store_path)
    with mqcore.open(store_path, read_only=True) as r:
        assert [m.value for m in r.read("t", 0, 0)] == [b"v"]
        with pytest.raises(ReadOnlyStoreError):
            r.append("t", b"w")
        with pytest.raises(ReadOnlyStoreError):
            r.create_topic("u")
    assert file_bytes(store_path) == before
    s.close()
    with mqcore.open(store_path) as again:
        assert again.end_offset("t") == 1


def test_closed_store_refuses_use(store_path: str) -> None:
    s = mqcore.open(store_path, flush="os")
    s.create_topic("t")
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        s.append("t", b"v")
    with pytest.raises(StoreClosedError):
        s.read("t", 0, 0)


def test_keyed_partitioning_matches_kafka_and_null_keys_round_robin(store: mqcore.Store) -> None:
    store.create_topic("t", partitions=5)
    for i in range(50):
        key = f"user-{i}".encode()
        assert store.append("t", b"v", key=key).partition == kafka_partition(key, 5)
    parts = [store.append("t", b"v").partition for _ in range(10)]
    assert sorted(parts) == sorted(list(range(5)) * 2)
    routed = store.append_batch("t", [b"1", b"2", b"3"], keys=[b"a", b"b", b"a"], partition=None)
    assert isinstance(routed, list)
    assert sum(md.count for md in routed) == 3
    assert {md.partition for md in routed} == {kafka_partition(b"a", 5), kafka_partition(b"b", 5)}


def test_segments_roll_by_size_and_by_time(store: mqcore.Store) -> None:
    store.create_topic("size", segment_bytes=4096)
    for i in range(40):
        store.append("size", os.urandom(500), timestamp=1000 + i)
    names = sorted(os.listdir(os.path.join(store.path, "size-0")))
    logs = [n for n in names if n.endswith(".log")]
    assert len(logs) > 3 and all(len(n) == len("00000000000000000000.log") for n in logs)
    assert all(n[:-4] + ".index" in names and n[:-4] + ".timeindex" in names for n in logs)
    assert [m.offset for m in store.read("size", 0, 0, 100)] == list(range(40))

    store.create_topic("time", segment_ms=1000)
    for ts in (0, 500, 1000, 1001, 2500, 2600):
        store.append("time", b"v", timestamp=ts)
    logs = sorted(n for n in os.listdir(os.path.join(store.path, "time-0")) if n.endswith(".log"))
    # a new segment when the record time runs past the first batch's by more than segment_ms
    assert logs == [
        "00000000000000000000.log",
        "00000000000000000003.log",
        "00000000000000000004.log",
    ]


def test_reopen_keeps_everything(store_path: str) -> None:
    with mqcore.open(store_path, flush="always", segment_bytes=2048) as s:
        s.create_topic("t", partitions=2)
        for i in range(100):
            s.append("t", str(i).encode(), partition=i % 2, timestamp=i)
    with mqcore.open(store_path) as s:
        assert s.topics() == ["t"]
        assert [m.value for m in s.read("t", 1, 0, 100)] == [
            str(i).encode() for i in range(1, 100, 2)
        ]
        assert s.offset_for_time("t", 0, 51) == 26
        assert s.append("t", b"more", partition=0).offset == 50
        assert all(not r.recovered_segments for r in s.recovery.values())


def test_invalid_config(store_path: str) -> None:
    with pytest.raises(InvalidConfigError):
        mqcore.open(store_path, flush="sometimes")
    with mqcore.open(store_path, flush="os") as s:
        with pytest.raises(InvalidConfigError):
            s.create_topic("t", segment_bytes=3 << 30)
        with pytest.raises(InvalidConfigError):
            s.create_topic("t", no_such_setting=1)
        with pytest.raises(InvalidConfigError):
            s.create_topic("t", partitions=0)
        assert s.topics() == []


def test_concurrent_appends_and_reads(store_path: str) -> None:
    """Writers in threads get dense, unique offsets; readers never see a partial batch."""
    with mqcore.open(store_path, flush="always", segment_bytes=64 << 10) as s:
        s.create_topic("t")
        per_thread, writers = 300, 4
        errors: list[BaseException] = []
        done = threading.Event()
        seen_ends: list[int] = []

        def write(tid: int) -> None:
            try:
                for i in range(per_thread):
                    if i % 3:
                        s.append("t", f"{tid}:{i}".encode(), partition=0)
                    else:
                        s.append_batch("t", [f"{tid}:{i}".encode()], partition=0)
            except BaseException as e:  # surfaced below
                errors.append(e)

        def read() -> None:
            try:
                while not done.is_set():
                    end = s.end_offset("t")
                    msgs = s.read("t", 0, 0, max_records=end + 10)
                    assert [m.offset for m in msgs] == list(range(len(msgs)))
                    assert len(msgs) >= end
                    seen_ends.append(end)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=write, args=(t,)) for t in range(writers)]
        reader = threading.Thread(target=read)
        reader.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        reader.join()
        assert not errors, errors
        msgs = s.read("t", 0, 0, max_records=10_000)
        assert [m.offset for m in msgs] == list(range(writers * per_thread))
        by_thread: dict[str, list[int]] = {}
        for m in msgs:
            assert m.value is not None
            tid, i = m.value.decode().split(":")
            by_thread.setdefault(tid, []).append(int(i))
        assert all(v == list(range(per_thread)) for v in by_thread.values())
        assert seen_ends == sorted(seen_ends)
