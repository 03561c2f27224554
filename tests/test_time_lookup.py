"""offset_for_time (issue 20): the kernel (_ext/scan.first_offset_at_or_after, driven by
_ext/lookup.offset_for_time) against a pure-Python reading of the same bytes, and the store
against the records it was given; on damaged batches it raises as get and read do.

Kafka's rule throughout: the earliest offset whose record timestamp is >= T, whatever the order
of timestamps within and across batches; control batches hold no user records; under
LogAppendTime every record has its batch's maxTimestamp."""

from __future__ import annotations

import os
import random
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore import compression
from mqcore._ext.crc32c import crc32c
from mqcore._ext.scan import first_offset_at_or_after
from mqcore.errors import CorruptRecordError
from tests.test_lookup import T0, miscount_first_batch, segment

MAX_DECOMPRESSED = 256 << 20
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


# -- the reference: a plain Python reading of Kafka v2 batches ---------------------------------


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at data[pos]: (value, next position)."""
    shift = raw = 0
    while True:
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def record_times(data: bytes) -> list[tuple[int, int]]:
    """(offset, timestamp) of every user record in a segment's bytes, in log order."""
    out, pos = [], 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        attributes, _, base_ts, max_ts = struct.unpack_from(">hiqq", data, pos + 21)
        count = struct.unpack_from(">i", data, pos + 57)[0]
        area = data[pos + 61 : pos + 12 + length]
        if attributes & 7:
            area = compression.decompress(attributes & 7, area, MAX_DECOMPRESSED)
        p = 0
        for _ in range(count):
            size, p = read_varint(area, p)
            end = p + size
            ts_delta, q = read_varint(area, p + 1)
            offset_delta, _ = read_varint(area, q)
            if not attributes & 0x20:  # control records are not user records
                out.append((base + offset_delta, max_ts if attributes & 8 else base_ts + ts_delta))
            p = end
        pos += 12 + length
    return out


def reference(times: list[tuple[int, int]], timestamp: int) -> int | None:
    """Kafka's answer by brute force: the smallest offset whose timestamp reaches `timestamp`."""
    return min((o for o, ts in times if ts >= timestamp), default=None)


def probes(stamps: list[int]) -> list[int]:
    """Before, at, between and after every timestamp present, and the int64 extremes."""
    out = {-(1 << 63), (1 << 63) - 1, -1, 0}
    for ts in stamps:
        out.update((ts - 1, ts, ts + 1))
    return sorted(out)


# -- the kernel over segment bytes ------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_time_kernel_matches_a_python_reading_of_the_segment(seed: int) -> None:
    """Random segments (1 to 300 records a batch, sampled and not, gzip and snappy, offset gaps,
    LogAppendTime, a control batch, random timestamps within and across batches): the kernel's
    answer is the brute-force one without memos, while it makes them, and through them."""
    data = segment(seed)
    times = record_times(data)
    verified: dict[int, bytes] = {}
    for ts in probes([t for _, t in times]):
        want = reference(times, ts)
        for memo in (None, verified, verified):  # no memo, first visit, memos of a visit
            for verify in (True, False):
                got = first_offset_at_or_after(
                    data, 0, ts, verify, "seg.log", MAX_DECOMPRESSED, memo
                )
                assert (None if got < 0 else got) == want, (ts, memo is None, verify)


def test_time_kernel_walks_from_any_batch_start() -> None:
    """From a later batch boundary the answer is the first reaching record from there on."""
    data = segment(7)
    times = record_times(data)
    starts, pos = [], 0
    while pos < len(data):
        starts.append((pos, struct.unpack_from(">q", data, pos)[0]))
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    verified: dict[int, bytes] = {}
    for pos, base in starts:
        later = [(o, t) for o, t in times if o >= base]
        for ts in probes([t for _, t in times])[::7]:
            got = first_offset_at_or_after(data, pos, ts, True, "s", MAX_DECOMPRESSED, verified)
            assert (None if got < 0 else got) == reference(later, ts)


# -- the store --------------------------------------------------------------------------------

batch_plans = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 7, 63, 64, 65, 100, 300]),  # records: memo samples from 64 on
        st.sampled_from(CODECS),
        st.sampled_from(["rising", "random", "falling", "equal"]),
        st.integers(-50, 50),  # where the batch's timestamps sit against the one before
    ),
    min_size=1,
    max_size=8,
)


def batch_timestamps(rng: random.Random, n: int, shape: str, start: int) -> list[int]:
    if shape == "rising":
        return [start + i for i in range(n)]
    if shape == "falling":
        return [start + n - i for i in range(n)]
    if shape == "equal":
        return [start] * n
    return [start + rng.randrange(-20, 200) for _ in range(n)]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plans=batch_plans, seed=st.integers(0, 2**16), segment_bytes=st.sampled_from([600, 8192]))
def test_offset_for_time_matches_brute_force_over_segments(
    tmp_path_factory: pytest.TempPathFactory,
    plans: list[tuple[int, str, str, int]],
    seed: int,
    segment_bytes: int,
) -> None:
    """Batches of random sizes and codecs, timestamps out of order within and across batches,
    several segments (small segment_bytes), a sparse index of one entry per 256 bytes: the
    store's answer equals the brute-force answer over what was appended, at every probe, the
    first time (batches checked) and again (through their memos), and after a reopen."""
    rng = random.Random(seed)
    path = str(tmp_path_factory.mktemp("time"))
    times: list[tuple[int, int]] = []
    start = T0
    with mqcore.open(path) as store:
        store.create_topic("t", segment_bytes=segment_bytes, index_interval_bytes=256)
        for n, codec, shape, shift in plans:
            start += shift
            stamps = batch_timestamps(rng, n, shape, start)
            values = [rng.randbytes(rng.randrange(0, 30)) for _ in range(n)]
            md = store.append_batch("t", values, partition=0, timestamps=stamps, compression=codec)
            times += zip(range(md.base_offset, md.base_offset + n), stamps, strict=True)
        queries = probes([t for _, t in times])
        for _ in range(2):
            for ts in queries:
                assert store.offset_for_time("t", 0, ts) == reference(times, ts), ts
    with mqcore.open(path, read_only=True) as store:
        event(f"segments: {min(len(store.segment_offsets('t', 0)), 4)}")
        for ts in queries:
            assert store.offset_for_time("t", 0, ts) == reference(times, ts), ts


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plans=batch_plans, seed=st.integers(0, 2**16), cut=st.floats(0, 1))
def test_offset_for_time_answers_only_from_the_log_start(
    tmp_path_factory: pytest.TempPathFactory,
    plans: list[tuple[int, str, str, int]],
    seed: int,
    cut: float,
) -> None:
    """After DeleteRecords (ReplicaLog.delete_records_before) moves the log start, inside a
    batch too, no answer lies below it (Kafka's fetchOffsetByTimestamp searches from the log
    start): the brute-force answer over the records from the start on, before and after a
    reopen. The records below stay in the file until retention removes their segment."""
    rng = random.Random(seed)
    path = str(tmp_path_factory.mktemp("time"))
    times: list[tuple[int, int]] = []
    start_ts = T0
    with mqcore.open(path) as store:
        store.create_topic("t", segment_bytes=8192, index_interval_bytes=256)
        for n, codec, shape, shift in plans:
            start_ts += shift
            stamps = batch_timestamps(rng, n, shape, start_ts)
            md = store.append_batch(
                "t", [b"v"] * n, partition=0, timestamps=stamps, compression=codec
            )
            times += zip(range(md.base_offset, md.base_offset + n), stamps, strict=True)
        log_start = int(cut * store.end_offset("t", 0))
        store.log.replica("t", 0).delete_records_before(log_start)
        kept = [(o, ts) for o, ts in times if o >= log_start]
        queries = probes([t for _, t in times])
        for ts in queries:
            assert store.offset_for_time("t", 0, ts) == reference(kept, ts), (ts, log_start)
    with mqcore.open(path, read_only=True) as store:
        assert store.start_offset("t", 0) == log_start
        for ts in queries:
            assert store.offset_for_time("t", 0, ts) == reference(kept, ts), (ts, log_start)


def test_time_kernel_skips_offsets_below_min_offset() -> None:
    """The kernel's min_offset, at every offset of a random segment: the first reaching record
    from there on, with and without memos."""
    data = segment(11)
    times = record_times(data)
    verified: dict[int, bytes] = {}
    stamps = probes([t for _, t in times])[::5]
    for low in sorted({o for o, _ in times})[::3]:
        later = [(o, t) for o, t in times if o >= low]
        for ts in stamps:
            for memo in (None, verified):
                got = first_offset_at_or_after(
                    data, 0, ts, True, "s", MAX_DECOMPRESSED, memo, min_offset=low
                )
                assert (None if got < 0 else got) == reference(later, ts), (low, ts)


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_offset_for_time_under_log_append_time(tmp_path: object, codec: str) -> None:
    """LogAppendTime: each record's timestamp is its batch's maxTimestamp (what read() says)."""
    with mqcore.open(os.path.join(str(tmp_path), "s")) as store:
        store.create_topic("t", timestamp_type="LogAppendTime", segment_bytes=2000)
        for i in range(6):
            store.append_batch("t", [b"v"] * (1 + 40 * i), partition=0, compression=codec)
        times = [(m.offset, m.timestamp) for m in store.read("t", 0, 0, 10_000)]
        for ts in probes([t for _, t in times]):
            assert store.offset_for_time("t", 0, ts) == reference(times, ts)


def test_offset_for_time_huge_and_tiny_timestamps(store: mqcore.Store) -> None:
    """Timestamps past int64 either way answer as the extremes do, not OverflowError."""
    store.create_topic("t")
    store.append_batch("t", [b"a", b"b"], partition=0, timestamps=[T0, T0 + 1])
    assert store.offset_for_time("t", 0, 1 << 70) is None
    assert store.offset_for_time("t", 0, -(1 << 70)) == 0
    assert store.offset_for_time("t", 0, T0 + 1) == 1


# -- damaged batches --------------------------------------------------------------------------


def three_batches(path: str, n: int) -> str:
    """A store of three batches of n records, timestamps T0 + offset; returns the log's path."""
    with mqcore.open(path) as store:
        store.create_topic("t", index_interval_bytes=0)  # every batch is in the sparse indexes
        for b in range(3):
            store.append_batch(
                "t",
                [b"v%04d" % i for i in range(n)],
                partition=0,
                timestamps=[T0 + b * n + i for i in range(n)],
            )
    return os.path.join(path, "t-0", "00000000000000000000.log")


def batch_starts(log: str) -> list[int]:
    with open(log, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos + 12 <= len(data) and struct.unpack_from(">i", data, pos + 8)[0] > 0:
        out.append(pos)
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return out


@pytest.mark.parametrize("n", [5, 100])  # below and above the memo's sampling threshold (64)
@pytest.mark.parametrize("which", ["answer", "skipped"])
def test_offset_for_time_refuses_a_crc_mismatch_in_a_batch_it_reads(
    tmp_path: object, n: int, which: str
) -> None:
    """A flipped byte in the batch holding the answer, or in a batch the lookup skips by its
    header (after the time-index floor), raises CorruptRecordError at every lookup (nothing is
    remembered as checked), as get does; with verify_crc=False the answer still comes."""
    path = os.path.join(str(tmp_path), "s")
    log = three_batches(path, n)
    second = batch_starts(log)[1]
    with open(log, "r+b") as f:
        f.seek(second + 61 + 8)  # inside the first value: only the CRC can tell
        byte = f.read(1)
        f.seek(second + 61 + 8)
        f.write(bytes([byte[0] ^ 0x40]))
    # "answer": the first record of the second batch; "skipped": the time-index floor of a
    # timestamp in the third batch is the second batch, whose maxTimestamp is below it
    ts = T0 + n if which == "answer" else T0 + 2 * n + 1
    with mqcore.open(path, read_only=True) as store:
        for _ in range(2):
            with pytest.raises(CorruptRecordError, match="CRC"):
                store.offset_for_time("t", 0, ts)
    with mqcore.open(path, read_only=True, verify_crc=False) as store:
        assert store.offset_for_time("t", 0, ts) == ts - T0


@pytest.mark.parametrize("n", [5, 100])
@pytest.mark.parametrize("verify_crc", [True, False])
def test_offset_for_time_refuses_a_batch_holding_more_records_than_its_count_like_read(
    tmp_path: object, n: int, verify_crc: bool
) -> None:
    """Issue 16's faulty writer (a CRC-valid batch whose recordsCount is smaller than the records
    it holds): read and get raise, and so does offset_for_time, which used to answer from the
    first records without noticing."""
    path = os.path.join(str(tmp_path), "s")
    log = three_batches(path, n)
    miscount_first_batch(log, n - 1)
    with mqcore.open(path, read_only=True, verify_crc=verify_crc) as store:
        for ts in (T0, T0 + 1):
            with pytest.raises(CorruptRecordError, match="bytes left over"):
                store.offset_for_time("t", 0, ts)


def test_a_lookup_trusts_what_get_checked_and_get_what_a_lookup_checked(tmp_path: object) -> None:
    """One memo per batch, whichever read made it: a lookup's first visit checks the batch
    as get's first visit does, so damage made after the check (the page cache's copy changed
    under the reader) is not seen by either; damage there before the first read is."""
    path = os.path.join(str(tmp_path), "s")
    log = three_batches(path, 100)
    second = batch_starts(log)[1]
    with mqcore.open(path, read_only=True) as store:
        assert store.offset_for_time("t", 0, T0 + 150) == 150  # checks and remembers batch 2
        with open(log, "r+b") as f:
            f.seek(second + 61 + 8)
            f.write(b"\x00")
        assert store.get("t", 0, 150) is not None  # the lookup's memo: no second CRC pass
    with mqcore.open(path, read_only=True) as store:
        with pytest.raises(CorruptRecordError, match="CRC"):
            store.get("t", 0, 150)
        with pytest.raises(CorruptRecordError, match="CRC"):
            store.offset_for_time("t", 0, T0 + 150)


def test_corrupt_length_in_a_memo_checked_batch_is_bounded(tmp_path: object) -> None:
    """A record length rewritten after the batch was checked (CRC fixed too) makes the
    timestamp walk raise or answer an offset of that batch, never read outside it."""
    path = os.path.join(str(tmp_path), "s")
    log = three_batches(path, 100)
    second = batch_starts(log)[1]
    with mqcore.open(path, read_only=True) as store:
        assert store.offset_for_time("t", 0, T0 + 190) == 190
        with open(log, "r+b") as f:
            data = bytearray(f.read())
            data[second + 61] = 0x7F  # the first record's length: far past its end
            length = struct.unpack_from(">i", data, second + 8)[0]
            struct.pack_into(
                ">I", data, second + 17, crc32c(bytes(data[second + 21 : second + 12 + length]))
            )
            f.seek(0)
            f.write(data)
        for ts in range(T0 + 100, T0 + 200, 7):
            try:
                got = store.offset_for_time("t", 0, ts)
            except CorruptRecordError:
                continue
            assert got is not None and 100 <= got < 200


def test_a_negative_base_offset_is_corruption_not_an_answer() -> None:
    """A batch whose baseOffset is negative (CRC-valid: the field is outside the CRC) raises
    CorruptRecordError, as get does, with or without memos; it used to give a negative offset
    (taken for "none") or an internal error once memos were kept."""
    data = bytearray(segment(3))
    struct.pack_into(">q", data, 0, -5)
    for memo in (None, {}):
        with pytest.raises(CorruptRecordError, match="negative base offset"):
            first_offset_at_or_after(bytes(data), 0, T0 - 1, True, "s", MAX_DECOMPRESSED, memo)
