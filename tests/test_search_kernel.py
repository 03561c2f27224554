"""The search kernel (mqcore._ext.search.scan_records) over real segments.

Segments are written by the store (every codec, tombstones, empty values, keys, headers with and
without "tag", CreateTime and LogAppendTime) and their .log bytes scanned; every answer is checked
against a brute force over Store.read(): single scans, resumed scans with limits and record
budgets, whole-batch skipping (proved by corrupting a batch the filter must never decode),
control batches, corruption, torn tails, and fuzzed bytes over a buffer that ends right before an
inaccessible page. Content search (the batch-wide needle search fused with the CRC, batches
passed over when they hold no occurrence) is checked with both needle-search implementations
against decode_messages. A throughput figure against a Python loop is printed, not asserted.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import random
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqcore
import mqcore.store
from mqcore._ext.batch import BatchInfo, Message, decode_messages, encode_batch, read_batch_info
from mqcore._ext.crc32c import crc32c
from mqcore._ext.search import (
    ScanResult,
    implementation,
    scan_records,
    select_implementation,
)
from mqcore.compression import compress
from mqcore.errors import CorruptRecordError, InvalidConfigError, MQCoreError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
TOPIC = "search"
T0 = 1_700_000_000_000
CODECS = ["none", "gzip", "lz4", "zstd", "snappy"]
WORDS = [b"alpha", b"beta", b"gamma", b"delta", b"abc", b"ab", b"zz", b"\x00\xff"]
HEADER_CHOICES: list[list[tuple[str, bytes | None]] | None] = [
    None,
    [],
    [("tag", b"TagA")],
    [("tag", b"TagB"), ("x", b"abc")],
    [("x", b"1"), ("tag", b"TagA")],
    [("tag", None)],
    [("tag", b"")],
    [("tagx", b"TagA"), ("Tag", b"TagA"), ("ta", b"TagA")],
    [("tag", b"TagAB")],
    [("tag", b"TagB"), ("tag", b"TagA")],
]
TAGS = [None, b"TagA", b"TagB", b"", b"Tag", b"TagAB"]


@dataclass
class Segment:
    """A segment's bytes, the store's own reading of it, and its batches."""

    buf: bytes
    path: str
    messages: list[Message]
    batches: list[BatchInfo]
    positions: list[int]
    log_append_time: bool


def log_path(store_path: str, topic: str, partition: int = 0) -> str:
    return os.path.join(store_path, f"{topic}-{partition}", "00000000000000000000.log")


def walk(buf: bytes) -> tuple[list[BatchInfo], list[int]]:
    """Every batch of buf and its position."""
    infos, positions, pos = [], [], 0
    while pos < len(buf):
        info = read_batch_info(buf, pos)
        assert info is not None
        infos.append(info)
        positions.append(pos)
        pos += info.size
    return infos, positions


def random_value(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return b""
    if roll < 0.2:
        return rng.choice(WORDS) * rng.randrange(100, 400)  # compressible, larger than a page
    return b" ".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 6)))


def write_batches(store: mqcore.Store, topic: str, rng: random.Random, count: int) -> None:
    """`count` batches with varied codecs, sizes, keys, headers and (CreateTime) timestamps that
    are out of order within a batch and, now and then, across batches."""
    for i in range(count):
        n = rng.choice([1, 1, 2, 3, 8, 25])
        base = T0 + i * 1000 - (5000 if i % 7 == 3 else 0)
        store.append_batch(
            topic,
            [random_value(rng) for _ in range(n)],
            keys=[rng.choice([None, *WORDS]) for _ in range(n)],
            headers=[rng.choice(HEADER_CHOICES) for _ in range(n)],
            timestamps=[base + rng.randrange(0, 700) for _ in range(n)],
            compression=CODECS[i % len(CODECS)],
        )


def build_segment(path: str, log_append_time: bool, seed: int, count: int) -> Segment:
    """Write a segment through the store (LogAppendTime under a fake clock that steps 100 ms per
    batch) and read it back both ways."""
    clock = itertools.count(T0, 100)
    store = mqcore.open(path, flush="os", clock=lambda: next(clock))
    store.create_topic(TOPIC, timestamp_type="LogAppendTime" if log_append_time else "CreateTime")
    write_batches(store, TOPIC, random.Random(seed), count)
    messages = store.read(TOPIC, 0, 0, 1_000_000)
    store.close()
    with open(log_path(path, TOPIC), "rb") as f:
        buf = f.read()
    batches, positions = walk(buf)
    return Segment(buf, path, messages, batches, positions, log_append_time)


@pytest.fixture(scope="module")
def create_time_segment(tmp_path_factory: pytest.TempPathFactory) -> Segment:
    return build_segment(str(tmp_path_factory.mktemp("ct") / "store"), False, 11, 60)


@pytest.fixture(scope="module")
def append_time_segment(tmp_path_factory: pytest.TempPathFactory) -> Segment:
    return build_segment(str(tmp_path_factory.mktemp("lat") / "store"), True, 12, 40)


@pytest.fixture(scope="module", params=["CreateTime", "LogAppendTime"])
def segment(request: pytest.FixtureRequest) -> Segment:
    name = "create_time_segment" if request.param == "CreateTime" else "append_time_segment"
    seg: Segment = request.getfixturevalue(name)
    return seg


# ---------------------------------------------------------------------------------------------
# The brute force and the model of what the kernel reads
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    min_offset: int = INT64_MIN
    max_offset: int = INT64_MAX
    min_ts: int = INT64_MIN
    max_ts: int = INT64_MAX
    needle: bytes | None = None
    in_key: bool = False
    tag: bytes | None = None

    def matches(self, m: Message) -> bool:
        if not (self.min_offset <= m.offset < self.max_offset):
            return False
        if not (self.min_ts <= m.timestamp < self.max_ts):
            return False
        if self.needle is not None:
            in_value = m.value is not None and self.needle in m.value
            in_key = self.in_key and m.key is not None and self.needle in m.key
            if not (in_value or in_key):
                return False
        return self.tag is None or ("tag", self.tag) in m.headers

    def expected(self, messages: list[Message]) -> list[Message]:
        return [m for m in messages if self.matches(m)]

    def scan(self, buf: Any, pos: int = 0, **kw: Any) -> ScanResult:
        window = (self.min_offset, self.max_offset, self.min_ts, self.max_ts)
        return scan_records(buf, pos, TOPIC, 0, *window, self.needle, self.in_key, self.tag, **kw)


def skipped(b: BatchInfo, q: Query) -> bool:
    """The module comment's rule for passing over a whole batch."""
    return (
        b.is_control
        or b.last_offset < q.min_offset
        or b.max_timestamp < q.min_ts
        or (b.timestamp_type == 1 and b.max_timestamp >= q.max_ts)
    )


def model(seg: Segment, q: Query) -> tuple[int, int, int, int]:
    """(records_scanned, bytes_scanned, next_position, next_offset) of a full scan from 0."""
    scanned = read = 0
    next_offset = q.min_offset
    by_offset = {m.offset for m in seg.messages}
    for b, pos in zip(seg.batches, seg.positions, strict=True):
        if b.base_offset >= q.max_offset or (skipped(b, q) and b.last_offset >= q.max_offset):
            return scanned, read, pos, max(next_offset, q.max_offset)
        if not skipped(b, q):
            read += b.size
            for o in range(max(b.base_offset, q.min_offset), b.last_offset + 1):
                if o >= q.max_offset:
                    return scanned, read, pos, max(next_offset, q.max_offset)
                scanned += o in by_offset
        next_offset = max(next_offset, b.last_offset + 1)
    return scanned, read, len(seg.buf), next_offset


def floor_position(seg: Segment, offset: int) -> int:
    """Position of the last batch starting at or below `offset` (an index floor), else 0."""
    below = [p for b, p in zip(seg.batches, seg.positions, strict=True) if b.base_offset <= offset]
    return below[-1] if below else 0


def scan_to_end(seg: Segment, q: Query, pos: int = 0, **kw: Any) -> tuple[list[Message], int]:
    """Loop scan_records on its resume cursor until "end"; checks every step's bookkeeping."""
    out: list[Message] = []
    lo, calls = q.min_offset, 0
    limit, budget = kw.get("limit", 1000), kw.get("max_records", INT64_MAX)
    while True:
        r = Query(lo, q.max_offset, q.min_ts, q.max_ts, q.needle, q.in_key, q.tag).scan(
            seg.buf, pos, **kw
        )
        calls += 1
        assert len(r.messages) <= limit and r.records_scanned <= budget
        assert r.next_position in seg.positions or r.next_position == len(seg.buf)
        assert [m.offset for m in r.messages] == sorted({m.offset for m in r.messages})
        out += r.messages
        if r.reason == "end":
            return out, calls
        if r.reason == "limit":
            assert len(r.messages) == limit
            assert r.next_offset == r.messages[-1].offset + 1
        else:
            assert r.reason == "max_records" and r.records_scanned == budget
        assert (r.next_position, r.next_offset) > (pos, lo), "no progress"
        pos, lo = r.next_position, r.next_offset


# ---------------------------------------------------------------------------------------------
# Results against the brute force
# ---------------------------------------------------------------------------------------------


def test_segments_have_what_the_tests_need(segment: Segment) -> None:
    """Every codec, tombstones, empty values, tags; one file-wide reading agrees with the store."""
    assert {b.codec for b in segment.batches} == {0, 1, 2, 3, 4}
    assert {b.timestamp_type for b in segment.batches} == {int(segment.log_append_time)}
    values = [m.value for m in segment.messages]
    assert None in values and b"" in values
    assert any(("tag", b"TagA") in m.headers for m in segment.messages)
    out: list[Message] = []
    decode_messages(segment.buf, 0, TOPIC, 0, 0, 1 << 30, out)
    assert out == segment.messages


def test_unfiltered_scan_returns_every_message(segment: Segment) -> None:
    r = Query().scan(segment.buf, limit=1 << 30)
    assert r.messages == segment.messages
    assert r.reason == "end"
    assert r.records_scanned == len(segment.messages)
    assert r.bytes_scanned == r.next_position == len(segment.buf)
    assert r.next_offset == segment.messages[-1].offset + 1
    assert all(isinstance(m, Message) and m.topic == TOPIC for m in r.messages)


@pytest.mark.parametrize(
    "query",
    [
        Query(needle=b"gamma"),
        Query(needle=b"ab", in_key=True),
        Query(needle=b""),
        Query(needle=b"", in_key=True),
        Query(needle=b"\x00\xff"),
        Query(needle=b"not there at all"),
        Query(tag=b"TagA"),
        Query(tag=b""),
        Query(needle=b"alpha", tag=b"TagB"),
        Query(min_offset=10, max_offset=40, needle=b"beta"),
        Query(min_ts=T0 + 20_000, max_ts=T0 + 30_000),
    ],
)
def test_fixed_queries(segment: Segment, query: Query) -> None:
    r = query.scan(segment.buf, limit=1 << 30)
    assert r.messages == query.expected(segment.messages)
    assert r.reason == "end"


def test_empty_needle_matches_every_non_null_value(create_time_segment: Segment) -> None:
    r = Query(needle=b"").scan(create_time_segment.buf, limit=1 << 30)
    assert [m.offset for m in r.messages] == [
        m.offset for m in create_time_segment.messages if m.value is not None
    ]


needles = st.one_of(
    st.none(),
    st.sampled_from(WORDS),
    st.binary(max_size=3),
    st.text(alphabet="abglmtz ", max_size=5).map(str.encode),
)


@st.composite
def queries(draw: st.DrawFn, seg: Segment) -> Query:
    """Each of the offset window, time window, needle and tag is left open half the time, so
    about half the queries match something."""
    end = seg.messages[-1].offset + 1
    times = sorted({m.timestamp for m in seg.messages})
    ts = st.one_of(
        st.sampled_from([INT64_MIN, INT64_MAX]),
        st.sampled_from(times).flatmap(lambda t: st.integers(t - 2, t + 2)),
    )
    offsets = st.one_of(st.sampled_from([INT64_MIN, INT64_MAX]), st.integers(-2, end + 2))
    full = (INT64_MIN, INT64_MAX)
    lo, hi = draw(st.one_of(st.just(full), st.lists(offsets, min_size=2, max_size=2).map(sorted)))
    t0, t1 = draw(st.one_of(st.just(full), st.lists(ts, min_size=2, max_size=2).map(sorted)))
    needle = draw(st.one_of(st.none(), needles))
    tag = draw(st.one_of(st.none(), st.sampled_from(TAGS)))
    return Query(lo, hi, t0, t1, needle, draw(st.booleans()), tag)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_single_scan_matches_brute_force_and_model(segment: Segment, data: st.DataObject) -> None:
    """One scan with no limit returns the brute force's list and reads exactly what the
    skipping rules allow (records and bytes scanned, where it stops)."""
    q = data.draw(queries(segment))
    r = q.scan(segment.buf, limit=1 << 30)
    assert r.messages == q.expected(segment.messages)
    assert r.reason == "end"
    assert (r.records_scanned, r.bytes_scanned, r.next_position, r.next_offset) == model(segment, q)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    limit=st.integers(1, 7),
    budget=st.one_of(st.just(INT64_MAX), st.integers(1, 30)),
    from_floor=st.booleans(),
)
def test_resumed_scans_yield_the_brute_force_list(
    segment: Segment, data: st.DataObject, limit: int, budget: int, from_floor: bool
) -> None:
    """Looping on (next_position, next_offset) with small limits and record budgets gives exactly
    the matches of one unbounded pass, starting at 0 or at the batch holding min_offset."""
    q = data.draw(queries(segment))
    pos = floor_position(segment, q.min_offset) if from_floor else 0
    got, _calls = scan_to_end(segment, q, pos, limit=limit, max_records=budget)
    assert got == q.expected(segment.messages)


def test_limit_stops_right_after_the_record(create_time_segment: Segment) -> None:
    """limit=1 from every offset: the match is that record, and the cursor points past it, at the
    next batch when the record was its batch's last."""
    seg = create_time_segment
    for b, pos in zip(seg.batches, seg.positions, strict=True):
        for offset in range(b.base_offset, b.last_offset + 1):
            r = Query(min_offset=offset).scan(seg.buf, pos, limit=1)
            assert r.reason == "limit" and [m.offset for m in r.messages] == [offset]
            assert r.next_offset == offset + 1
            last = offset == b.last_offset
            assert r.next_position == (pos + b.size if last else pos)
            assert r.records_scanned == 1


def test_budget_counts_scanned_records_only(create_time_segment: Segment) -> None:
    """max_records counts records examined in the window: skipped ones are free."""
    seg = create_time_segment
    q = Query(min_offset=20, needle=b"no such bytes")
    r = q.scan(seg.buf, max_records=5)
    assert r.reason == "max_records" and r.records_scanned == 5 and r.messages == []
    assert r.next_offset == 25
    got, calls = scan_to_end(seg, q, max_records=5)
    assert got == [] and calls == (len(seg.messages) - 20) // 5 + 1  # the last call says "end"


def test_limit_wins_over_budget_on_the_same_record(create_time_segment: Segment) -> None:
    r = Query().scan(create_time_segment.buf, limit=3, max_records=3)
    assert r.reason == "limit" and len(r.messages) == 3 and r.records_scanned == 3


def test_max_offset_ends_the_scan(create_time_segment: Segment) -> None:
    seg = create_time_segment
    b, pos = seg.batches[10], seg.positions[10]
    r = Query(max_offset=b.base_offset).scan(seg.buf, limit=1 << 30)
    assert r.reason == "end" and r.next_position == pos and r.next_offset == b.base_offset
    assert r.messages == seg.messages[: b.base_offset]
    rest = Query(min_offset=r.next_offset).scan(seg.buf, r.next_position, limit=1 << 30)
    assert r.messages + rest.messages == seg.messages


# ---------------------------------------------------------------------------------------------
# Whole batches passed over: proved by a damaged batch that must never be decoded
# ---------------------------------------------------------------------------------------------


def damage_records(seg: Segment, index: int) -> bytearray:
    """seg's bytes with the records of batch `index` (uncompressed) made undecodable; its CRC is
    left wrong, so only verify_crc=False scans get as far as its records."""
    b, pos = seg.batches[index], seg.positions[index]
    assert b.codec == 0 and b.records_count > 0
    buf = bytearray(seg.buf)
    buf[pos + 61] = 0x7F  # first record's length varint: -64, never valid
    return buf


def test_time_window_skips_batches_undecoded(create_time_segment: Segment) -> None:
    seg = create_time_segment
    index = next(i for i, b in enumerate(seg.batches) if b.codec == 0 and i > 5)
    buf = damage_records(seg, index)
    target = seg.batches[index]
    after = Query(min_ts=target.max_timestamp + 1)
    r = after.scan(buf, verify_crc=False, limit=1 << 30)
    assert r.messages == after.expected(seg.messages)
    offsets = Query(min_offset=target.last_offset + 1)
    assert offsets.scan(buf, verify_crc=False).messages == offsets.expected(seg.messages)
    with pytest.raises(CorruptRecordError) as err:
        Query(min_ts=target.max_timestamp).scan(buf, verify_crc=False, source="x.log")
    assert err.value.position == seg.positions[index] and err.value.path == "x.log"


def test_log_append_time_skips_batches_outside_the_window(append_time_segment: Segment) -> None:
    seg = append_time_segment
    index = next(i for i, b in enumerate(seg.batches) if b.codec == 0 and i > 5)
    buf = damage_records(seg, index)
    ts = seg.batches[index].max_timestamp
    for q in (Query(max_ts=ts), Query(min_ts=ts + 1)):
        assert q.scan(buf, verify_crc=False, limit=1 << 30).messages == q.expected(seg.messages)
    with pytest.raises(CorruptRecordError):
        Query(min_ts=ts, max_ts=ts + 1).scan(buf, verify_crc=False)


def control_batch(base_offset: int) -> bytes:
    """A batch flagged as control (attribute bit 5) with a correct CRC."""
    raw = bytearray(encode_batch([b"gamma control"], now_ms=T0).tobytes())
    raw[0:8] = struct.pack(">q", base_offset)
    attributes = struct.unpack_from(">h", raw, 21)[0] | 0x20
    struct.pack_into(">h", raw, 21, attributes)
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


def test_control_batches_hold_no_messages(create_time_segment: Segment) -> None:
    seg = create_time_segment
    end = seg.messages[-1].offset + 1
    tail = bytearray(encode_batch([b"gamma after"], now_ms=T0).tobytes())
    tail[0:8] = struct.pack(">q", end + 1)
    buf = seg.buf + control_batch(end) + bytes(tail)
    r = Query(needle=b"gamma").scan(buf, limit=1 << 30)
    assert r.messages[-1].offset == end + 1 and r.messages[-1].value == b"gamma after"
    assert r.messages[:-1] == Query(needle=b"gamma").expected(seg.messages)
    assert r.next_offset == end + 2 and r.records_scanned == len(seg.messages) + 1


# ---------------------------------------------------------------------------------------------
# Corruption, torn tails, arguments
# ---------------------------------------------------------------------------------------------


def test_corrupt_batch_in_the_middle_names_its_position(create_time_segment: Segment) -> None:
    seg = create_time_segment
    index = len(seg.batches) // 2
    pos, b = seg.positions[index], seg.batches[index]
    buf = bytearray(seg.buf)
    buf[pos + b.size - 1] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC") as err:
        Query(needle=b"zz").scan(buf, source="seg.log", file_pos=4096, limit=1 << 30)
    assert err.value.position == 4096 + pos and err.value.path == "seg.log"
    before = Query().scan(buf, limit=b.base_offset)  # offsets start at 0: stops just before it
    assert before.messages == seg.messages[: b.base_offset] and before.next_position == pos


def test_corrupt_record_names_its_batch(create_time_segment: Segment) -> None:
    seg = create_time_segment
    index = next(i for i, b in enumerate(seg.batches) if b.codec == 0 and i > 5)
    buf = damage_records(seg, index)
    with pytest.raises(CorruptRecordError, match="varint|length") as err:
        Query().scan(buf, verify_crc=False, source="s.log", limit=1 << 30)
    assert err.value.position == seg.positions[index]


def test_truncated_buffers_stop_cleanly(create_time_segment: Segment) -> None:
    """Every cut of the segment: the complete batches' matches, reason "end", and a cursor at
    the torn batch."""
    seg = create_time_segment
    ends = [p + b.size for b, p in zip(seg.batches, seg.positions, strict=True)]
    q = Query(needle=b"a", in_key=True)
    step = max(1, len(seg.buf) // 3000)
    for cut in [*range(0, len(seg.buf), step), *ends, *(e - 1 for e in ends)]:
        whole = [b for b, e in zip(seg.batches, ends, strict=True) if e <= cut]
        r = q.scan(memoryview(seg.buf)[:cut], limit=1 << 30)
        last = whole[-1].last_offset if whole else -1
        assert r.reason == "end"
        assert r.messages == [m for m in q.expected(seg.messages) if m.offset <= last]
        assert r.next_position == (ends[len(whole) - 1] if whole else 0)
        assert r.next_offset == (last + 1 if whole else INT64_MIN)


def test_arguments_are_checked(create_time_segment: Segment) -> None:
    buf = create_time_segment.buf
    with pytest.raises(InvalidConfigError, match="limit"):
        Query().scan(buf, limit=0)
    with pytest.raises(InvalidConfigError, match="max_records"):
        Query().scan(buf, max_records=0)
    for pos in (-1, len(buf) + 1):
        with pytest.raises(ValueError, match="position"):
            Query().scan(buf, pos)
    at_end = Query().scan(buf, len(buf))
    assert (at_end.messages, at_end.reason, at_end.next_position) == ([], "end", len(buf))
    empty = Query(min_offset=7).scan(b"")
    assert (empty.reason, empty.next_position, empty.next_offset) == ("end", 0, 7)
    with pytest.raises(TypeError):
        scan_records(buf, 0, TOPIC, 0, 0, 1, 0, 1, bytearray(b"x"))  # type: ignore[arg-type]


def test_result_repr(create_time_segment: Segment) -> None:
    r = Query().scan(create_time_segment.buf, limit=2)
    assert repr(r).startswith("ScanResult(2 messages, reason='limit'")


# ---------------------------------------------------------------------------------------------
# Fuzzing over a guarded buffer
# ---------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int


class Guarded:
    """Anonymous memory followed by a PROT_NONE page: bytes placed flush against it make any read
    past their end fault at once."""

    def __init__(self, size: int):
        self.size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self.map = mmap.mmap(-1, self.size + mmap.PAGESIZE)
        anchor = ctypes.c_char.from_buffer(self.map)
        address = ctypes.addressof(anchor)
        del anchor
        if _libc.mprotect(address + self.size, mmap.PAGESIZE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")

    @contextmanager
    def place(self, data: bytes) -> Iterator[memoryview]:
        start = self.size - len(data)
        self.map[start : self.size] = data
        with memoryview(self.map) as whole, whole[start : self.size] as view:
            yield view


@pytest.fixture(scope="module")
def guarded(create_time_segment: Segment) -> Iterator[Guarded]:
    g = Guarded(len(create_time_segment.buf) + 4096)
    yield g
    g.map.close()


def scan_or_mqcore_error(view: memoryview, q: Query, **kw: Any) -> ScanResult | None:
    try:
        r = q.scan(view, **kw)
    except MQCoreError:
        return None
    assert 0 <= r.next_position <= len(view) and r.reason in ("end", "limit", "max_records")
    return r


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=600),
    verify=st.booleans(),
    needle=needles,
    tag=st.sampled_from(TAGS),
)
def test_random_bytes_never_crash(
    guarded: Guarded, data: bytes, verify: bool, needle: bytes | None, tag: bytes | None
) -> None:
    with guarded.place(data) as view:
        scan_or_mqcore_error(view, Query(needle=needle, in_key=True, tag=tag), verify_crc=verify)


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 1 << 30),
    fix_crc=st.booleans(),
    needle=needles,
    tag=st.sampled_from(TAGS),
)
def test_damaged_segments_never_crash(
    create_time_segment: Segment,
    guarded: Guarded,
    flips: list[tuple[int, int]],
    cut: int,
    fix_crc: bool,
    needle: bytes | None,
    tag: bytes | None,
) -> None:
    """Byte changes in a real segment (optionally with the damaged batch's CRC recomputed, so
    verify_crc scans decode it) and a cut: results or an mqcore error, and whenever the whole
    buffer decodes, the unfiltered scan returns exactly what decode_messages returns."""
    seg = create_time_segment
    buf = bytearray(seg.buf)
    for at, value in flips:
        buf[at % len(buf)] = value
    if fix_crc:
        for b, pos in zip(seg.batches, seg.positions, strict=True):
            struct.pack_into(">I", buf, pos + 17, crc32c(bytes(buf[pos + 21 : pos + b.size])))
    data = bytes(buf[: len(buf) - cut % 200])
    with guarded.place(data) as view:
        for verify in (True, False):
            scan_or_mqcore_error(
                view, Query(needle=needle, in_key=True, tag=tag), verify_crc=verify
            )
            full = scan_or_mqcore_error(view, Query(), verify_crc=verify, limit=1 << 30)
            out: list[Message] = []
            try:
                decode_messages(view, 0, TOPIC, 0, INT64_MIN, 1 << 30, out, verify)
            except MQCoreError:
                continue
            assert full is not None, "scan_records refused what decode_messages accepted"
            want = [m for m in out if m.timestamp < INT64_MAX and m.offset < INT64_MAX]
            assert full.messages == want


# ---------------------------------------------------------------------------------------------
# Content search: one needle search per batch (fused with the CRC), batches passed over
# ---------------------------------------------------------------------------------------------

IMPLEMENTATIONS = pytest.mark.parametrize("fast", [True, False], ids=["fast", "generic"])


@contextmanager
def search_implementation(fast: bool) -> Iterator[str]:
    """Scans in the block use the CPU's best needle search (fast) or the generic one."""
    name = select_implementation(fast)
    try:
        yield name
    finally:
        select_implementation(True)


def batch_bytes(
    values: list[bytes | None],
    base_offset: int,
    *,
    keys: list[bytes | None] | None = None,
    headers: list[list[tuple[str, bytes | None]] | None] | None = None,
    codec: int = 0,
) -> bytes:
    """One encoded batch at `base_offset` (outside the CRC, so patching it keeps the CRC)."""
    encoded = encode_batch(
        values, keys=keys, headers=headers, now_ms=T0, codec=codec,
        compress=compress if codec else None,
    )  # fmt: skip
    raw = bytearray(encoded.tobytes())
    raw[0:8] = struct.pack(">q", base_offset)
    return bytes(raw)


def decoded(buf: Any) -> list[Message]:
    out: list[Message] = []
    decode_messages(buf, 0, TOPIC, 0, INT64_MIN, 1 << 30, out)
    return out


def test_implementation_names() -> None:
    assert implementation() in ("avx2", "generic")
    with search_implementation(False) as name:
        assert name == implementation() == "generic"
    assert implementation() in ("avx2", "generic")


@IMPLEMENTATIONS
@pytest.mark.parametrize("codec", [0, 3], ids=["none", "lz4"])
def test_needle_spanning_two_records_matches_neither(fast: bool, codec: int) -> None:
    """Bytes that occur in the records area only across a record boundary (value tail, the
    framing between, the next value's head) are in no key or value."""
    values: list[bytes | None] = [b"first value ends in ABC", b"XYZ starts the second"]
    area = batch_bytes(values, 0)[61:]
    end1, start2 = area.index(b"ABC") + 3, area.index(b"XYZ")
    buf = batch_bytes(values, 0, codec=codec)
    for needle in (
        area[end1 - 3 : start2 + 3],
        area[end1 - 1 : start2 + 1],
        area[end1 - 2 : end1 + 1],
    ):
        assert needle in area
        with search_implementation(fast):
            r = Query(needle=needle, in_key=True).scan(buf)
        assert r.messages == [] and r.records_scanned == 2 and r.reason == "end"
    with search_implementation(fast):
        r = Query(needle=b"ABC").scan(buf)
    assert [m.offset for m in r.messages] == [0]


@IMPLEMENTATIONS
def test_needle_in_a_key_or_header_only(fast: bool) -> None:
    """A needle in the records area but only in keys or headers: the batch is walked, nothing
    matches on values; in_key finds the key; headers never match."""
    buf = batch_bytes(
        [b"plain value", b"other value", None],
        0,
        keys=[b"key-NEEDLE", None, b"NEEDLE"],
        headers=[[("h", b"NEEDLE in a header")], [("NEEDLE", b"x")], None],
    )
    with search_implementation(fast):
        values_only = Query(needle=b"NEEDLE").scan(buf)
        with_keys = Query(needle=b"NEEDLE", in_key=True).scan(buf)
        header_only = Query(needle=b"in a header", in_key=True).scan(buf)
    assert values_only.messages == [] and values_only.records_scanned == 3
    assert [m.offset for m in with_keys.messages] == [0, 2]
    assert header_only.messages == []


@IMPLEMENTATIONS
@pytest.mark.parametrize("m", [1, 2, 3, 8, 33, 70])
def test_needle_across_chunk_borders_in_one_big_value(fast: bool, m: int) -> None:
    """One ~100 KB value holding the needle once, placed across every border the search works
    at (the 768-byte and 24 KiB rounds of the fused CRC, the generic search's 32 KiB chunks,
    the end of the area), with the batch at every alignment. The needle's first and last bytes
    are common in the filler, so most 32-byte steps have candidates to confirm."""
    needle = b"Q" * m if m < 3 else b"a" + b"Q" * (m - 2) + b"b"
    filler = (
        random.Random(m)
        .randbytes(100_000)
        .translate(bytes.maketrans(bytes(range(256)), b"abcdefgh" * 32))
    )
    absent = batch_bytes([b"x", filler], 0)
    value_start = len(absent) - 61 - 1 - len(filler)  # in the records area; then 0 headers
    borders = [*range(768, len(absent), 768), *range(32768, len(absent), 32768), len(absent) - 61]
    places = {0, len(filler) - m, len(filler) - m - 1}
    for border in borders:
        places |= {border - value_start - j for j in (0, 1, m - 1, m)}
    shifts = range(8) if m in (1, 8) else (0, 3)
    guard = Guarded(len(absent) + 8)  # a read past the batch faults
    with search_implementation(fast):
        for verify in (True, False):
            with guard.place(absent) as view:
                r = Query(needle=needle).scan(view, verify_crc=verify)
            assert r.messages == [] and r.records_scanned == 2
        for at in sorted(p for p in places if 0 <= p <= len(filler) - m):
            value = filler[:at] + needle + filler[at + m :]
            raw = batch_bytes([b"x", value], 0)
            for shift in shifts:
                with guard.place(b"\0" * shift + raw) as whole, whole[shift:] as view:
                    r = Query(needle=needle).scan(view, verify_crc=shift % 2 == 0)
                    assert [msg.offset for msg in r.messages] == [1], (at, shift)
    guard.map.close()


@IMPLEMENTATIONS
@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=CODECS)
def test_every_codec_against_the_brute_force(fast: bool, codec: int) -> None:
    """Batches of one codec where the needle is in no record, in one, or in many."""
    rng = random.Random(codec)
    buf, base = b"", 0
    for i in range(12):
        words = [
            b" ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 30))) for _ in range(40)
        ]
        if i % 3 == 1:
            words[rng.randrange(40)] += b" needle-here"
        if i % 3 == 2:
            words = [v + b" needle-here" if j % 2 else v for j, v in enumerate(words)]
        values: list[bytes | None] = [*words, None]
        buf += batch_bytes(values, base, codec=codec)
        base += len(values)
    messages = decoded(buf)
    for q in (Query(needle=b"needle-here"), Query(needle=b"never there"), Query(needle=b"e")):
        with search_implementation(fast):
            r = q.scan(buf, limit=1 << 30)
        assert r.messages == q.expected(messages)
        assert r.records_scanned == len(messages) and r.bytes_scanned == len(buf)


@IMPLEMENTATIONS
@pytest.mark.parametrize("codec", [0, 1, 3], ids=["none", "gzip", "lz4"])
@pytest.mark.parametrize("where", ["attributes", "header", "records-first", "middle", "last"])
def test_corrupt_batch_without_the_needle_still_raises(fast: bool, codec: int, where: str) -> None:
    """A flipped byte anywhere under the CRC of a batch the needle is absent from: the CRC check
    (fused with the search for uncompressed batches) raises before any result is returned."""
    batches = [batch_bytes([b"value %d" % (i * 10 + j) for j in range(10)], i * 10, codec=codec)
               for i in range(3)]  # fmt: skip
    pos, size = len(batches[0]), len(batches[1])
    at = {
        "attributes": 22,
        "header": 45,
        "records-first": 61,
        "middle": size // 2,
        "last": size - 1,
    }
    buf = bytearray(b"".join(batches))
    buf[pos + at[where]] ^= 0x10  # the transactional bit in attributes: still a valid header
    with search_implementation(fast), pytest.raises(CorruptRecordError, match="CRC") as err:
        Query(needle=b"absent").scan(bytes(buf), source="c.log", limit=1 << 30)
    assert err.value.position == pos and err.value.path == "c.log"


@IMPLEMENTATIONS
def test_what_a_passed_over_batch_is_checked_for(fast: bool) -> None:
    """The module comment's rule: a CRC-valid batch whose records are malformed is passed over
    by a search whose needle it does not hold; every walk of it raises (verify_crc=False
    scans, a needle it holds, no needle, an offset window cutting it)."""
    raw = bytearray(batch_bytes([b"has the word gamma", b"second"], 0))
    raw[61] = 0x7F  # first record's length varint: -64
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    buf = bytes(raw)
    with search_implementation(fast):
        passed = Query(needle=b"absent").scan(buf)
        assert passed.messages == [] and passed.records_scanned == 2 and passed.reason == "end"
        for q, kw in [
            (Query(needle=b"absent"), {"verify_crc": False}),
            (Query(needle=b"gamma"), {}),
            (Query(), {}),
            (Query(min_offset=1, needle=b"absent"), {}),
        ]:
            with pytest.raises(CorruptRecordError, match="varint|length"):
                q.scan(buf, **kw)


@st.composite
def small_segments(draw: st.DrawFn) -> bytes:
    """A few batches of random codecs, values over a small alphabet (so needles occur inside
    values, across fields and across records), keys, tags and null values."""
    text = st.binary(min_size=0, max_size=40).map(lambda b: b.translate(_SMALL_ALPHABET))
    out, base = b"", 0
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 12))
        values = draw(st.lists(st.one_of(st.none(), text), min_size=n, max_size=n))
        keys = draw(st.lists(st.one_of(st.none(), text), min_size=n, max_size=n))
        tags = draw(st.lists(st.sampled_from([None, b"TagA", b"ab"]), min_size=n, max_size=n))
        headers: list[list[tuple[str, bytes | None]] | None] = [
            None if t is None else [("tag", t)] for t in tags
        ]
        codec = draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4]))
        out += batch_bytes(values, base, keys=keys, headers=headers, codec=codec)
        base += n + draw(st.integers(0, 2))
    return out


_SMALL_ALPHABET = bytes.maketrans(bytes(range(256)), b"abc\x00\x01" * 51 + b"a")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    buf=small_segments(),
    needle=st.binary(min_size=1, max_size=4).map(lambda b: b.translate(_SMALL_ALPHABET)),
    in_key=st.booleans(),
    tag=st.sampled_from([None, b"TagA"]),
    window=st.tuples(st.integers(-1, 80), st.integers(0, 90)),
    limit=st.integers(1, 5),
    budget=st.one_of(st.just(INT64_MAX), st.integers(1, 20)),
)
def test_content_search_matches_a_brute_force_over_decode_messages(
    buf: bytes,
    needle: bytes,
    in_key: bool,
    tag: bytes | None,
    window: tuple[int, int],
    limit: int,
    budget: int,
) -> None:
    """Resumed scans over random batches give the brute force's matches with both needle
    searches, and every record of the offset window is counted as scanned exactly once,
    whether its batch was walked or passed over."""
    messages = decoded(buf)
    lo, hi = min(window), max(window)
    want = Query(lo, hi, needle=needle, in_key=in_key, tag=tag).expected(messages)
    in_window = sum(lo <= m.offset < hi for m in messages)
    for fast in (True, False):
        got: list[Message] = []
        scanned, pos, start = 0, 0, lo
        with search_implementation(fast):
            while True:
                q = Query(start, hi, needle=needle, in_key=in_key, tag=tag)
                r = q.scan(buf, pos, limit=limit, max_records=budget)
                got += r.messages
                scanned += r.records_scanned
                if r.reason == "end":
                    break
                pos, start = r.next_position, r.next_offset
        assert got == want
        assert scanned == in_window


# ---------------------------------------------------------------------------------------------
# Throughput (printed, not asserted)
# ---------------------------------------------------------------------------------------------


def test_throughput_against_a_python_loop(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """~64 MB of 1 KiB values, an 8-byte needle that never occurs: MB/s of scan_records over the
    segment's bytes against `needle in m.value` over Store.read()."""
    store = mqcore.open(str(tmp_path / "bench"), flush="os")
    store.create_topic("bench")
    alphabet = (b"abcdefghijklmnopqrstuvwxyz0123456789 ._-" * 7)[:256]
    table = bytes.maketrans(bytes(range(256)), alphabet)
    count, per_batch = 65536, 512
    for _ in range(count // per_batch):
        blob = os.urandom(1024 * per_batch).translate(table)
        store.append_batch("bench", [blob[i : i + 1024] for i in range(0, len(blob), 1024)])
    store.flush()
    with open(log_path(str(tmp_path / "bench"), "bench"), "rb") as f:
        buf = f.read()
    needle = b"NEEDLE!!"
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        r = Query(needle=needle).scan(buf)
        best = min(best, time.perf_counter() - start)
    assert r.messages == [] and r.records_scanned == count and r.bytes_scanned == len(buf)
    start = time.perf_counter()
    offset, hits = 0, 0
    while True:
        batch = store.read("bench", 0, offset, 8192)
        if not batch:
            break
        hits += sum(needle in m.value for m in batch if m.value is not None)
        offset = batch[-1].offset + 1
    loop = time.perf_counter() - start
    store.close()
    assert hits == 0 and offset == count
    mb = len(buf) / 1e6
    with capfd.disabled():
        print(
            f"\nsearch over {mb:.1f} MB: scan_records {mb / best:.0f} MB/s, "
            f"Python loop over Store.read {mb / loop:.0f} MB/s ({loop / best:.1f}x)"
        )
