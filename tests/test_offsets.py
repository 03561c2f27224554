"""Committed offsets in `__consumer_offsets` (consume/offsets.py) when the topic has several
partitions: a Kafka log directory has 50 by default, one group's commits in the partition
Kafka's `partitionFor(group)` names. The commits here are built by kafka-python and by hand
from Kafka's documented key and value layout, not by mqcore's encoder."""

from __future__ import annotations

import struct
import time
import warnings
from pathlib import Path

import mqcore
from mqcore.consume.offsets import (
    OFFSETS_TOPIC,
    OffsetAndMetadata,
    decode_value,
    partition_for_group,
)

with warnings.catch_warnings():
    # kafka-python 3.0 loads its schemas with importlib.resources' deprecated open_text
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

OFFSET_PARTITIONS = 5


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    units = s.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_partition_for(group: str, count: int) -> int:
    """Kafka's GroupCoordinator.partitionFor: Utils.abs(group.hashCode) % count."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % count


def kafka_string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def commit_key(group: str, topic: str, partition: int) -> bytes:
    return (
        struct.pack(">h", 1)
        + kafka_string(group)
        + kafka_string(topic)
        + struct.pack(">i", partition)
    )


def commit_value(offset: int, when: int) -> bytes:
    return struct.pack(">hqi", 3, offset, -1) + kafka_string("") + struct.pack(">q", when)


def write_partition(root: Path, topic: str, partition: int, records: list[tuple]) -> None:
    """One kafka-python batch of (key, value) records as `<topic>-<partition>`'s only segment."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    now = int(time.time() * 1000)
    for i, (key, value) in enumerate(records):
        assert builder.append(i, timestamp=now, key=key, value=value, headers=[]) is not None
    directory = root / f"{topic}-{partition}"
    directory.mkdir(parents=True)
    (directory / f"{0:020d}.log").write_bytes(bytes(builder.build()))


GROUPS = ["billing", "audit", "search", "mail", "polygenelubricants", "", "ünïcode-grüppe"]


def kafka_dir_with_commits(root: Path) -> dict[tuple[str, str, int], int]:
    """A Kafka log directory: topic `orders` (2 partitions of 40 and 25 records) and a
    5-partition `__consumer_offsets` holding two commits per (group, partition), the later
    one winning; returns what each group has committed."""
    for p, n in ((0, 40), (1, 25)):
        write_partition(root, "orders", p, [(None, b"v%d" % i) for i in range(n)])
    per_partition: dict[int, list[tuple]] = {p: [] for p in range(OFFSET_PARTITIONS)}
    want = {}
    for i, group in enumerate(GROUPS[:-2]):  # "" is no legal group name; the last is unused
        records = per_partition[kafka_partition_for(group, OFFSET_PARTITIONS)]
        for p in (0, 1):
            records.append((commit_key(group, "orders", p), commit_value(1, 1000)))
            records.append((commit_key(group, "orders", p), commit_value(5 + i + p, 2000)))
            want[(group, "orders", p)] = 5 + i + p
    assert sum(1 for r in per_partition.values() if r) > 1, "every group in one partition"
    for p, records in per_partition.items():
        if records:
            write_partition(root, OFFSETS_TOPIC, p, records)
        else:  # Kafka creates every partition, an empty one with an empty segment
            (root / f"{OFFSETS_TOPIC}-{p}").mkdir()
            (root / f"{OFFSETS_TOPIC}-{p}" / f"{0:020d}.log").write_bytes(b"")
    return want


def test_java_string_hash_golden_values() -> None:
    """The test's own reference against values Java prints for String.hashCode()."""
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Utils.abs maps it to 0


def test_partition_for_group_is_kafkas_partition_for() -> None:
    for group in GROUPS:
        for count in (1, 3, 50):
            assert partition_for_group(group, count) == kafka_partition_for(group, count)
    assert partition_for_group("polygenelubricants", 50) == 0


def test_group_lag_reads_every_partition_of_consumer_offsets(tmp_path: Path) -> None:
    """Regression: the replay read only partition 0, so `mqcore groups` on a Kafka log
    directory missed every group whose commits Kafka keeps in another partition."""
    root = tmp_path / "kafka-logs"
    want = kafka_dir_with_commits(root)
    with mqcore.open(str(root), read_only=True) as store:
        assert store.partitions(OFFSETS_TOPIC) == OFFSET_PARTITIONS
        lags = store.group_lag()
    got = {(lag.group, lag.topic, lag.partition): lag.committed for g in lags.values()
           for lag in g}  # fmt: skip
    assert got == want
    ends = {0: 40, 1: 25}
    for g in lags.values():
        assert [lag.lag for lag in g] == [ends[lag.partition] - lag.committed for lag in g]


def test_commit_goes_to_the_groups_partition_and_supersedes_kafkas(tmp_path: Path) -> None:
    """A writable open adopts the Kafka directory: a group's new commit is appended to the
    partition holding its earlier commits, so the replay's last-per-key is the new one."""
    root = tmp_path / "kafka-logs"
    want = kafka_dir_with_commits(root)
    group = "search"
    home = kafka_partition_for(group, OFFSET_PARTITIONS)
    with mqcore.open(str(root)) as store:
        before = {p: store.end_offset(OFFSETS_TOPIC, p) for p in range(OFFSET_PARTITIONS)}
        with store.consumer(group, "orders") as c:
            assert c.committed("orders", 0) == want[(group, "orders", 0)]
            c.commit({("orders", 0): 33})
        after = {p: store.end_offset(OFFSETS_TOPIC, p) for p in range(OFFSET_PARTITIONS)}
        grown = {p for p in after if after[p] != before[p]}
        assert grown == {home}
        last = store.read(OFFSETS_TOPIC, home, before[home], 10)
        assert [m.key for m in last] == [commit_key(group, "orders", 0)]
    with mqcore.open(str(root), read_only=True) as store:
        got = {(lag.group, lag.topic, lag.partition): lag.committed
               for g in store.group_lag().values() for lag in g}  # fmt: skip
    assert got == {**want, (group, "orders", 0): 33}


def test_consumer_offsets_of_an_mqcore_store_has_one_partition(store: mqcore.Store) -> None:
    """mqcore creates the topic with one partition: every group's commits live there."""
    store.create_topic("t", partitions=3)
    store.append_batch("t", [b"x"] * 4, partition=2)
    with store.consumer("g", "t") as c:
        c.poll()
        c.commit()
    assert store.partitions(OFFSETS_TOPIC) == 1
    assert [lag.committed for lag in store.group_lag("g")["g"]] == [0, 0, 4]


def test_a_committed_leader_epoch_is_kept_across_a_reopen(store_path: str) -> None:
    """Regression: the leader epoch a client commits (OffsetCommit v6+, KIP-320) was written
    as -1 and read back as -1. It is kept in the value's version 3 field, as Kafka keeps it,
    and read from a value Kafka wrote (built here from the documented layout)."""
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("t", partitions=2)
        store.offset_store().commit("g", {("t", 0): OffsetAndMetadata(3, "m", 10, 5)})
        kafka_value = struct.pack(">hqi", 3, 8, 7) + kafka_string("") + struct.pack(">q", 11)
        store.log.append_records(OFFSETS_TOPIC, 0, [kafka_value], [commit_key("g", "t", 1)])
    with mqcore.open(store_path, flush="os") as store:
        got = store.offset_store().group_offsets("g")
    assert got == {
        ("t", 0): OffsetAndMetadata(3, "m", 10, 5),
        ("t", 1): OffsetAndMetadata(8, "", 11, 7),
    }
    old = struct.pack(">hq", 2, 4) + kafka_string("") + struct.pack(">q", 12)  # v2: no epoch
    assert decode_value(old) == OffsetAndMetadata(4, "", 12, -1)
