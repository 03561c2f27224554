"""Interop with an independent Kafka implementation: kafka-python's record codec and partitioner.

Three directions: `.log` files mqcore writes are parsed batch by batch by kafka-python; batches
kafka-python builds, laid out as a bare Kafka log directory, open and read in mqcore (with the
indexes rebuilt as Kafka's rule says); and keys land on the partition Kafka's producer picks.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mqcore
from mqcore import compression
from mqcore._ext.batch import Message, decode_messages, encode_batch
from mqcore._ext.hashing import kafka_partition, murmur2_hash
from mqcore.errors import UnknownPartitionError

with warnings.catch_warnings():
    # kafka-python 3.0's protocol package loads its schemas with importlib.resources' legacy
    # open_text/read_text at import time (a DeprecationWarning, an error under our settings)
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka import codec as kafka_codec
    from kafka.partitioner.default import DefaultPartitioner, murmur2
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

CODEC_NAMES = ["none", "gzip", "snappy", "lz4", "zstd"]
INDEX_INTERVAL = 4096  # Kafka's default index.interval.bytes, also mqcore's

# (timestamp, key, value, headers) of one record, headers as kafka-python returns them
Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def random_records(rng: random.Random, n: int, base_ts: int) -> list[Record]:
    """Records with every shape Kafka allows: null/empty keys and values, repeated and null
    headers, timestamps that go backwards. Values are compressible so codecs really apply."""
    out: list[Record] = []
    for _ in range(n):
        key = rng.choice([None, b"", b"user-%d" % rng.randrange(50), bytes(rng.randbytes(8))])
        value = rng.choice(
            [
                None,
                b"",
                (b"GET /api/v1/items/%d HTTP/1.1 200 " % rng.randrange(10**6))
                * rng.randrange(1, 12),
                b'{"level":"info","msg":"' + b"x" * rng.randrange(300) + b'"}',
            ]
        )
        headers = [
            (
                rng.choice(["trace", "trace", "src", "\u00e9", ""]),
                rng.choice([None, b"", b"abc", rng.randbytes(5)]),
            )
            for _ in range(rng.randrange(4))
        ]
        out.append((base_ts + rng.randrange(-60_000, 60_000), key, value, headers))
    return out


def kafka_python_batches(data: bytes) -> Iterator[DefaultRecordBatch]:
    """Every batch of a .log file, parsed by kafka-python; the file must hold nothing else."""
    records = MemoryRecords(data)
    assert records.valid_bytes() == len(data)
    while records.has_next():
        batch = records.next_batch()
        assert isinstance(batch, DefaultRecordBatch)
        yield batch


def kafka_python_read_log(path: Path) -> list[tuple[int, int, int, Record]]:
    """(offset, timestamp_type, codec, record) of every record in a .log file, CRCs checked."""
    out = []
    for batch in kafka_python_batches(path.read_bytes()):
        assert batch.magic == 2
        assert batch.validate_crc()
        for rec in batch:
            out.append(
                (
                    rec.offset,
                    rec.timestamp_type,
                    batch.compression_type,
                    (rec.timestamp, rec.key, rec.value, list(rec.headers)),
                )
            )
    return out


def log_files(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def test_kafka_python_has_every_codec() -> None:
    """Interop must cover every codec, not skip the ones whose libraries are missing."""
    assert kafka_codec.has_gzip() and kafka_codec.has_snappy()
    assert kafka_codec.has_lz4() and kafka_codec.has_zstd()


# ---------------------------------------------------------------------------------------------
# (1) mqcore writes, kafka-python reads
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODEC_NAMES)
def test_mqcore_segments_parse_with_kafka_python(store_path: str, codec: str) -> None:
    """Batches appended through the store, across several segment rolls, read back from the
    raw .log files by kafka-python with the same offsets, timestamps, keys, values, headers."""
    rng = random.Random(CODEC_NAMES.index(codec))
    base_ts = now_ms() - 3_600_000
    expected: dict[int, Record] = {}
    with mqcore.open(store_path, flush="os") as store:
        # no generated uid header: the records read back are exactly the ones sent
        store.create_topic("interop", partitions=1, segment_bytes=6000, unique_ids=False)
        for _ in range(40):
            recs = random_records(rng, rng.randrange(1, 15), base_ts)
            as_dict = rng.random() < 0.5  # a dict keeps the last value of a repeated key
            sent = [(t, k, v, list(dict(h).items()) if as_dict else h) for t, k, v, h in recs]
            md = store.append_batch(
                "interop",
                [r[2] for r in sent],
                keys=[r[1] for r in sent],
                headers=[dict(r[3]) if as_dict else r[3] for r in sent],
                partition=0,
                timestamps=[r[0] for r in sent],
                compression=codec,
            )
            assert isinstance(md, mqcore.BatchMetadata)
            for i, r in enumerate(sent):
                expected[md.base_offset + i] = r
        for r in random_records(rng, 5, base_ts):
            one = store.append("interop", r[2], key=r[1], headers=r[3], timestamp=r[0])
            expected[one.offset] = r
    logs = log_files(Path(store_path) / "interop-0")
    assert len(logs) >= 3, "segment_bytes should have rolled the log several times"
    seen: dict[int, Record] = {}
    for path in logs:
        rows = kafka_python_read_log(path)
        assert rows, f"{path.name} holds no batch"
        assert int(path.stem) == rows[0][0], "a segment is named by its first offset"
        for offset, ts_type, batch_codec, rec in rows:
            assert ts_type == 0 and offset not in seen
            assert batch_codec in (CODEC_NAMES.index(codec), 0)  # single appends use the topic's
            seen[offset] = rec
    assert list(seen) == sorted(seen) == list(range(len(expected)))
    assert seen == expected
    assert {r[2] for p in logs for r in kafka_python_read_log(p)} >= {CODEC_NAMES.index(codec)}


def test_kafka_python_reads_exact_headers_and_codecs(store_path: str) -> None:
    """List headers with repeats keep order and duplicates; each batch carries its codec."""
    headers = [("a", b"1"), ("a", None), ("b", b""), ("a", b"3")]
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("h", unique_ids=False)  # only the headers given, in order
        for codec in CODEC_NAMES:
            store.append_batch(
                "h",
                [b"v" * 200, None],
                keys=[b"k", None],
                headers=[headers, None],
                timestamps=[10, 9],
                compression=codec,
            )
    rows = kafka_python_read_log(Path(store_path) / "h-0" / "00000000000000000000.log")
    assert [r[2] for r in rows] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [r[0] for r in rows] == list(range(10))
    for i, (_, _, _, rec) in enumerate(rows):
        assert rec == ((10, b"k", b"v" * 200, headers) if i % 2 == 0 else (9, None, None, []))


def test_kafka_python_reads_generated_uid_headers(store_path: str) -> None:
    """With unique IDs on (the default) kafka-python sees each record's ("uid", 16 bytes)
    header after the given ones, in every codec, holding the ID the append returned."""
    headers = [("a", b"1"), ("a", None)]
    uids: list[bytes] = []
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("u")
        for codec in CODEC_NAMES:
            md = store.append_batch(
                "u", [b"v" * 200, None], headers=[headers, None], compression=codec
            )
            assert isinstance(md, mqcore.BatchMetadata)
            uids += [uuid.UUID(u).bytes for u in md.unique_ids if u is not None]
    rows = kafka_python_read_log(Path(store_path) / "u-0" / "00000000000000000000.log")
    assert [r[2] for r in rows] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len(set(uids)) == len(rows) == 10
    for i, (_, _, _, rec) in enumerate(rows):
        assert rec[3] == (headers if i % 2 == 0 else []) + [("uid", uids[i])]
        assert uids[i][6] >> 4 == 7  # UUID version 7


def test_log_append_time_reads_in_kafka_python(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic("lat", timestamp_type="LogAppendTime")
        store.append_batch("lat", [b"a", b"b"], timestamps=[1, 2])
        ours = store.read("lat", 0, 0)
    rows = kafka_python_read_log(Path(store_path) / "lat-0" / "00000000000000000000.log")
    assert [(r[1], r[3][0]) for r in rows] == [(1, m.timestamp) for m in ours]
    assert all(m.timestamp_type == 1 and m.timestamp > 1_000_000 for m in ours)


# Kernel-level differential round trips, both directions, random records and every codec.

header_st = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=20))), max_size=4
)
record_st = st.tuples(
    st.integers(0, 2**45),
    st.one_of(st.none(), st.binary(max_size=30)),
    st.one_of(st.none(), st.binary(max_size=300)),
    header_st,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=20), st.integers(0, 4), st.integers(0, 2**40))
def test_kafka_python_decodes_encode_batch(records: list[Record], codec: int, base: int) -> None:
    eb = encode_batch(
        [r[2] for r in records],
        keys=[r[1] for r in records],
        headers=[r[3] for r in records],
        timestamps=[r[0] for r in records],
        codec=codec,
        compress=compression.compress,
    )
    eb.set_base_offset(base)
    batch = DefaultRecordBatch(eb.tobytes())
    assert batch.validate_crc()
    assert (
        batch.compression_type,
        batch.base_offset,
        batch.records_count,
        batch.max_timestamp,
    ) == (codec, base, len(records), max(r[0] for r in records))
    got = [(rec.offset, rec.timestamp, rec.key, rec.value, list(rec.headers)) for rec in batch]
    assert got == [(base + i, *r) for i, r in enumerate(records)]


def build_with_kafka_python(records: list[Record], codec: int, base_offset: int) -> bytes:
    """One v2 batch built by kafka-python, with the base offset a log would assign."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i, (ts, key, value, headers) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base_offset)  # outside the CRC, as a broker sets it
    return bytes(buf)


@settings(max_examples=200, deadline=None)
@given(st.lists(record_st, min_size=1, max_size=20), st.integers(0, 4), st.integers(0, 2**40))
def test_mqcore_decodes_kafka_python_batches(records: list[Record], codec: int, base: int) -> None:
    data = build_with_kafka_python(records, codec, base)
    out: list[Message] = []
    assert decode_messages(data, 0, "t", 0, 0, 1 << 20, out) == (len(data), base + len(records))
    got = [(m.offset, m.timestamp, m.key, m.value, list(m.headers)) for m in out]
    assert got == [(base + i, *r) for i, r in enumerate(records)]


def test_golden_batch_matches_kafka_python_builder() -> None:
    """For identical inputs, both writers produce identical bytes past the leader epoch (which
    kafka-python leaves at 0 and mqcore writes as -1 'none'); the CRC does not cover it."""
    records: list[Record] = [
        (1000, b"k", b"v0", [("h", b"x")]),
        (999, None, None, [("n", None)]),
        (1005, b"", b"", [("a", b"1"), ("a", b"2")]),
    ]
    ours = encode_batch(
        [r[2] for r in records],
        keys=[r[1] for r in records],
        headers=[r[3] for r in records],
        timestamps=[r[0] for r in records],
    )
    ours.set_base_offset(7)
    theirs = build_with_kafka_python(records, 0, 7)
    assert ours.tobytes()[:12] == theirs[:12]
    assert ours.tobytes()[16:] == theirs[16:]


# ---------------------------------------------------------------------------------------------
# (2) kafka-python writes a Kafka log directory, mqcore opens it
# ---------------------------------------------------------------------------------------------


class KafkaLogDir:
    """A bare Kafka log directory built from kafka-python batches, and what it holds."""

    def __init__(self, root: Path):
        self.root = root
        self.records: dict[tuple[str, int], dict[int, Record]] = {}

    def write_segment(
        self, topic: str, partition: int, base: int, batches: list[tuple[int, list[Record]]]
    ) -> Path:
        """Write batches (codec, records) end to end as `<base>.log`, offsets from `base`."""
        directory = self.root / f"{topic}-{partition}"
        directory.mkdir(parents=True, exist_ok=True)
        parts = []
        offset = base
        held = self.records.setdefault((topic, partition), {})
        for codec, recs in batches:
            data = build_with_kafka_python(recs, codec, offset)
            assert DefaultRecordBatch(data).compression_type == codec, "codec fell back to none"
            parts.append(data)
            for i, r in enumerate(recs):
                held[offset + i] = r
            offset += len(recs)
        path = directory / f"{base:020d}.log"
        path.write_bytes(b"".join(parts))
        return path


def kafka_dir_batches(
    rng: random.Random, count: int, base_ts: int
) -> list[tuple[int, list[Record]]]:
    """`count` batches cycling through the five codecs; each batch ends with a repetitive
    record so that kafka-python really compresses it (it falls back to none otherwise)."""
    batches = []
    for i in range(count):
        recs = random_records(rng, rng.randrange(0, 20), base_ts)
        recs.append((base_ts + i, b"k", b"compressible " * 30, [("n", b"%d" % i)]))
        batches.append((i % 5, recs))
    return batches


@pytest.fixture
def kafka_dir(tmp_path: Path) -> KafkaLogDir:
    """topic `events` with two partitions of one segment each, topic `multi` with a partition
    of three segments, the last starting after a gap of offsets (as compaction leaves them)."""
    rng = random.Random(7)
    base_ts = now_ms() - 7_200_000
    kd = KafkaLogDir(tmp_path / "kafka-logs")
    kd.write_segment("events", 0, 0, kafka_dir_batches(rng, 60, base_ts))
    kd.write_segment("events", 1, 0, kafka_dir_batches(rng, 7, base_ts))
    first = kd.write_segment("multi", 0, 0, kafka_dir_batches(rng, 30, base_ts))
    n1 = len(kd.records[("multi", 0)])
    kd.write_segment("multi", 0, n1, kafka_dir_batches(rng, 30, base_ts))
    n2 = len(kd.records[("multi", 0)])
    kd.write_segment("multi", 0, n2 + 17, kafka_dir_batches(rng, 10, base_ts))
    assert first.stat().st_size > 4 * INDEX_INTERVAL
    return kd


def message_record(m: Message) -> Record:
    return (m.timestamp, m.key, m.value, list(m.headers))


def check_store_serves(store: mqcore.Store, kd: KafkaLogDir) -> None:
    """read / get / offset_for_time / read_arrow all return exactly what kafka-python wrote."""
    assert store.topics() == ["events", "multi"]
    assert store.partitions("events") == 2 and store.partitions("multi") == 1
    rng = random.Random(3)
    for (topic, p), want in kd.records.items():
        offsets = sorted(want)
        assert store.start_offset(topic, p) == offsets[0]
        assert store.end_offset(topic, p) == offsets[-1] + 1
        got = read_everything(store, topic, p)
        assert [m.offset for m in got] == offsets
        assert all(m.topic == topic and m.partition == p and m.timestamp_type == 0 for m in got)
        assert [message_record(m) for m in got] == [want[o] for o in offsets]
        for o in rng.sample(offsets, min(30, len(offsets))):
            m = store.get(topic, p, o)
            assert m is not None and m.offset == o and message_record(m) == want[o]
        gaps = sorted(set(range(offsets[0], offsets[-1])) - set(offsets))
        for o in gaps[:5]:
            assert store.get(topic, p, o) is None
        check_offset_for_time(store, topic, p, want, rng)
        check_read_arrow(store, topic, p, want)


def read_everything(store: mqcore.Store, topic: str, p: int) -> list[Message]:
    out: list[Message] = []
    offset = store.start_offset(topic, p)
    end = store.end_offset(topic, p)
    while offset < end:
        page = store.read(topic, p, offset, max_records=97)
        assert page, f"read returned nothing at {offset} < end {end}"
        out.extend(m for m in page if m.offset >= offset)
        offset = page[-1].offset + 1
    return out


def check_offset_for_time(
    store: mqcore.Store, topic: str, p: int, want: dict[int, Record], rng: random.Random
) -> None:
    stamps = sorted({r[0] for r in want.values()})
    probes = [stamps[0] - 1, stamps[-1], stamps[-1] + 1, 0]
    probes += rng.sample(stamps, min(20, len(stamps)))
    probes += [t + 1 for t in rng.sample(stamps, min(10, len(stamps)))]
    for t in probes:
        brute = min((o for o, r in want.items() if r[0] >= t), default=None)
        assert store.offset_for_time(topic, p, t) == brute, t


def check_read_arrow(store: mqcore.Store, topic: str, p: int, want: dict[int, Record]) -> None:
    offsets = sorted(want)
    rb = store.read_arrow(topic, p, offsets[0], None, include_headers=True)
    rb.validate(full=True)
    assert rb.column("offset").to_pylist() == offsets
    assert rb.column("key").to_pylist() == [want[o][1] for o in offsets]
    assert rb.column("value").to_pylist() == [want[o][2] for o in offsets]
    assert rb.column("timestamp").cast("int64").to_pylist() == [want[o][0] * 1000 for o in offsets]
    assert rb.column("headers").to_pylist() == [
        [{"key": k, "value": v} for k, v in want[o][3]] for o in offsets
    ]
    assert set(rb.column("topic").to_pylist()) == {topic}


def expected_index_entries(log: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Kafka's rule (LogSegment.recover), run over batches kafka-python parses: an offset entry
    (batch lastOffset -> batch position) before a batch once more than index.interval.bytes were
    scanned since the last entry, a time entry then if the largest timestamp grew, and the
    closing time entry when the segment is sealed."""
    base = int(log.stem)
    offsets: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    position = since_entry = 0
    max_ts = offset_of_max = last_time = -1
    for batch in kafka_python_batches(log.read_bytes()):
        if batch.max_timestamp > max_ts:
            max_ts, offset_of_max = batch.max_timestamp, batch.last_offset
        if since_entry > INDEX_INTERVAL:
            offsets.append((batch.last_offset - base, position))
            if max_ts > last_time:
                times.append((max_ts, offset_of_max - base))
                last_time = max_ts
            since_entry = 0
        since_entry += batch.size_in_bytes
        position += batch.size_in_bytes
    if max_ts > last_time:
        times.append((max_ts, offset_of_max - base))
    return offsets, times


def read_index_files(log: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    raw = log.with_suffix(".index").read_bytes()
    raw_time = log.with_suffix(".timeindex").read_bytes()
    assert len(raw) % 8 == 0 and len(raw_time) % 12 == 0, "index files must be trimmed"
    return (list(struct.iter_unpack(">ii", raw)), list(struct.iter_unpack(">qi", raw_time)))


def test_kafka_dir_opens_writable_and_rebuilds_indexes(kafka_dir: KafkaLogDir) -> None:
    root = kafka_dir.root
    logs = sorted(root.glob("*/*.log"))
    assert not list(root.glob("*/*.index"))
    with mqcore.open(str(root), flush="os") as store:
        check_store_serves(store, kafka_dir)
    for log in logs:
        assert log.with_suffix(".index").exists() and log.with_suffix(".timeindex").exists()
        got = read_index_files(log)
        want = expected_index_entries(log)
        assert got == want, log.name
    big = root / "events-0" / "00000000000000000000.log"
    assert len(read_index_files(big)[0]) >= 3
    with mqcore.open(str(root), read_only=True) as store:
        check_store_serves(store, kafka_dir)


def test_kafka_dir_opens_read_only_untouched(kafka_dir: KafkaLogDir) -> None:
    """A read-only open serves a bare Kafka directory and writes nothing into it."""
    root = kafka_dir.root
    before = sorted(
        (p.relative_to(root), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    )
    with mqcore.open(str(root), read_only=True) as store:
        check_store_serves(store, kafka_dir)
    after = sorted(
        (p.relative_to(root), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    )
    assert after == before


def test_kafka_dir_accepts_appends_after_open(kafka_dir: KafkaLogDir) -> None:
    """Appending continues the Kafka log's offsets; kafka-python still parses every file."""
    root = kafka_dir.root
    copy = root.parent / "copy"
    shutil.copytree(root, copy)
    with mqcore.open(str(copy), flush="os") as store:
        end = store.end_offset("multi", 0)
        md = store.append(
            "multi", b"after", key=b"k", headers={"x": b"y"}, partition=0, timestamp=now_ms()
        )
        assert md.offset == end
    last_log = log_files(copy / "multi-0")[-1]
    rows = kafka_python_read_log(last_log)
    assert md.unique_id is not None  # the topic takes the store defaults: unique IDs on
    uid = ("uid", uuid.UUID(md.unique_id).bytes)
    assert rows[-1][0] == end and rows[-1][3][1:] == (b"k", b"after", [("x", b"y"), uid])


# ---------------------------------------------------------------------------------------------
# (3) Kafka's murmur2 and default partitioner
# ---------------------------------------------------------------------------------------------

# org.apache.kafka.common.utils.UtilsTest.testMurmur2
MURMUR2_GOLDEN = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("key", "expected"), MURMUR2_GOLDEN)
def test_murmur2_golden(key: bytes, expected: int) -> None:
    assert murmur2_hash(key) == expected
    assert murmur2(key) == expected & 0xFFFFFFFF


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_murmur2_equals_kafka_python(key: bytes) -> None:
    assert murmur2_hash(key) & 0xFFFFFFFF == murmur2(key)
    assert -(2**31) <= murmur2_hash(key) < 2**31


class OneTopicCluster:
    """The three ClusterMetadata calls DefaultPartitioner makes, for one topic."""

    def __init__(self, topic: str, partitions: int):
        self.topic = topic
        self.count = partitions

    def topics(self) -> set[str]:
        return {self.topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.count))

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.count))


def kafka_python_partition(key: bytes, partitions: int) -> int:
    return DefaultPartitioner().partition(
        "t", key, key, b"v", b"v", OneTopicCluster("t", partitions)
    )


@settings(max_examples=300)
@given(st.binary(max_size=64), st.integers(1, 1000))
def test_kafka_partition_equals_default_partitioner(key: bytes, partitions: int) -> None:
    assert kafka_partition(key, partitions) == kafka_python_partition(key, partitions)


def test_store_append_picks_kafka_partition(store: mqcore.Store) -> None:
    rng = random.Random(11)
    store.create_topic("keyed", partitions=7)
    keys = [rng.randbytes(rng.randrange(0, 20)) for _ in range(300)]
    for key in keys:
        md = store.append("keyed", b"v", key=key)
        assert md.partition == kafka_python_partition(key, 7)
        got = store.get("keyed", md.partition, md.offset)
        assert got is not None and got.key == key


def test_store_append_batch_routes_by_kafka_partition(store: mqcore.Store) -> None:
    rng = random.Random(12)
    store.create_topic("routed", partitions=5)
    keys = [b"key-%d" % rng.randrange(1000) for _ in range(200)]
    values = [b"value-%d" % i for i in range(200)]
    mds = store.append_batch("routed", values, keys=keys, partition=None)
    assert isinstance(mds, list) and sum(md.count for md in mds) == 200
    for p in range(5):
        got = [(m.key, m.value) for m in store.read("routed", p, 0, 1000)]
        want = [
            (k, v) for k, v in zip(keys, values, strict=True) if kafka_python_partition(k, 5) == p
        ]
        assert got == want


def test_store_route_matches_for_every_partition_count(store: mqcore.Store) -> None:
    """Partition counts that are and are not powers of two, with a key hashing negative."""
    negative = next(k for k, h in MURMUR2_GOLDEN if h < 0)
    for n in (1, 2, 3, 16, 17, 100):
        store.create_topic(f"n{n}", partitions=n)
        md = store.append(f"n{n}", b"v", key=negative)
        assert (
            md.partition
            == kafka_python_partition(negative, n)
            == ((murmur2_hash(negative) & 0x7FFFFFFF) % n)
        )


def test_broker_dir_with_some_partitions_of_a_topic(tmp_path: Path) -> None:
    """A broker's log directory holds only some partitions of a topic (here 1 and 3 of 4): a
    read-only open serves those and names the absent ones in a clear error."""
    rng = random.Random(11)
    kd = KafkaLogDir(tmp_path / "broker-logs")
    kd.write_segment("orders", 1, 0, kafka_dir_batches(rng, 5, now_ms()))
    kd.write_segment("orders", 3, 0, kafka_dir_batches(rng, 3, now_ms()))
    with mqcore.open(str(kd.root), read_only=True) as store:
        assert store.partitions("orders") == 4
        assert store.available_partitions("orders") == [1, 3]
        for p in (1, 3):
            msgs = store.read("orders", p, 0, 10_000)
            assert [m.offset for m in msgs] == sorted(kd.records[("orders", p)])
            assert [message_record(m) for m in msgs] == [
                kd.records[("orders", p)][m.offset] for m in msgs
            ]
        for p in (0, 2):
            with pytest.raises(UnknownPartitionError, match=f"partition {p} of topic 'orders'"):
                store.read("orders", p, 0)
        with pytest.raises(UnknownPartitionError, match="outside 0..3"):
            store.get("orders", 4, 0)
    assert sorted(os.listdir(kd.root)) == ["orders-1", "orders-3"]  # nothing added
