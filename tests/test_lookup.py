"""The point-lookup kernel (_ext/lookup.pyx) and the get kernel it drives (scan.read_at): reads
by offset through the memos of checked batches, store IDs decoded in C, key-index lookups that
probe every segment in one call; on good bytes they answer what a full decode answers, and on
bad bytes (damaged logs, damaged memos, damaged key tables, malformed IDs) they raise or
return None, never read outside their buffers."""

from __future__ import annotations

import base64
import bisect
import itertools
import os
import random
import struct
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore._ext import ids, lookup
from mqcore._ext.batch import Message, decode_messages, encode_batch
from mqcore._ext.crc32c import crc32c
from mqcore._ext.hashing import KEY_SEED, xxh64_hash
from mqcore._ext.keyindex import HEADER_BYTES, KeyTable, file_size, init_header
from mqcore._ext.scan import read_record
from mqcore._ext.segtable import SegmentTable
from mqcore._ext.varint import encode_varint
from mqcore.errors import CodecError, CorruptIndexError, CorruptRecordError, InvalidMessageIdError
from mqcore.query.ids import decode_msg_id, encode_msg_id
from tests.test_batch import GuardedArena

T0 = 1_700_000_000_000
BAD_BYTES = (CorruptRecordError, CodecError, ValueError)


def control(batch: bytes) -> bytes:
    """The batch with its control attribute set and its CRC made right again."""
    out = bytearray(batch)
    attributes = struct.unpack_from(">h", out, 21)[0] | 0x20
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def segment(seed: int) -> bytes:
    """A segment's bytes: batches of 1 to 300 records (sampled ones among them), some with
    offset gaps, compressed, under LogAppendTime, one a control batch."""
    from mqcore import compression

    rng = random.Random(seed)
    out, base = [], 0
    for b in range(rng.randint(3, 9)):
        n = rng.choice([1, 5, 63, 64, 100, 300])
        deltas = None
        if rng.random() < 0.3:
            deltas = sorted(rng.sample(range(n * 2), n))
        codec = rng.choice([0, 0, 0, 1, 3])
        batch = encode_batch(
            [rng.randbytes(rng.randint(0, 40)) for _ in range(n)],
            [rng.choice([None, b"k%d" % rng.randrange(9)]) for _ in range(n)],
            [[("uid", rng.randbytes(16))] if rng.random() < 0.5 else [] for _ in range(n)],
            [T0 + rng.randrange(1000) for _ in range(n)],
            codec=codec,
            compress=compression.compress,
            log_append_time=T0 + 5 if rng.random() < 0.2 else -1,
            offset_deltas=deltas,
        )
        batch.set_base_offset(base)
        data = batch.tobytes()
        if b == 1 and rng.random() < 0.5:
            data = control(data)
        out.append(data)
        base = batch.last_offset + 1 + rng.randrange(3)
    return b"".join(out)


def expected(data: bytes) -> dict[int, Message]:
    msgs: list[Message] = []
    decode_messages(data, 0, "t", 3, 0, 1 << 30, msgs)
    return {m.offset: m for m in msgs}


def batch_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return starts


def reference(data: bytes, start: int, offset: int) -> Message | None:
    """What a get from the batch at `start` must answer: the record at `offset` in the first
    batch from there that reaches it (None: a gap, a control batch, or no such batch)."""
    msgs: list[Message] = []
    decode_messages(data, start, "t", 3, offset, 1, msgs, False, 1 << 20, None, 0, offset)
    return msgs[0] if msgs and msgs[0].offset == offset else None


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("verify", [True, False])
def test_reads_equal_a_full_decode_cold_and_through_memos(seed: int, verify: bool) -> None:
    """Every offset (gaps and past the end included), from every batch start, twice: the first
    reads make the memos, the second ones go through them (over batch headers and records they
    skip); both answer what decode_messages does."""
    data = segment(seed)
    last = max(expected(data), default=0)
    starts = batch_starts(data)
    verified: dict[int, bytes] = {}
    for _ in range(2):
        for offset in range(last + 3):
            for start in starts:
                got = read_record(data, start, offset, "t", 3, verify, verified, "s.log")
                assert got == reference(data, start, offset)
    assert len(verified) == len(starts)  # every batch has its memo


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 11), flips=st.lists(st.integers(0, 1 << 20), min_size=1, max_size=6))
def test_damage_after_the_memos_never_reads_outside_the_buffer(seed: int, flips: list[int]) -> None:
    """Bytes changed under memos made from the good ones (the memo trusts what the first get
    checked): reads through the stale memos stay inside the buffer and raise or answer."""
    data = bytearray(segment(seed))
    verified: dict[int, bytes] = {}
    want = expected(bytes(data))
    for offset in want:
        read_record(bytes(data), 0, offset, "t", 3, True, verified, "s.log")
    for f in flips:
        data[f % len(data)] ^= 1 + (f >> 8) % 255
    arena = GuardedArena(len(data) + 4096)
    try:
        with arena.place(bytes(data)) as view:
            for offset in list(want)[:40] + [max(want) + 5]:
                try:
                    got = read_record(view, 0, offset, "t", 3, True, verified, "s.log")
                except BAD_BYTES:
                    continue
                assert got is None or isinstance(got, Message)
    finally:
        arena.close()


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 11), junk=st.binary(min_size=0, max_size=200), at=st.integers(0, 8))
def test_garbage_memos_never_read_outside_the_buffer(seed: int, junk: bytes, at: int) -> None:
    """A caller's memo dict holding garbage (the kernel cannot tell): bounds still hold."""
    data = segment(seed)
    starts = batch_starts(data)
    verified = {starts[at % len(starts)]: junk}
    arena = GuardedArena(len(data) + 4096)
    try:
        with arena.place(data) as view:
            for offset in range(0, 40, 3):
                try:
                    got = read_record(view, 0, offset, "t", 3, False, verified, "s.log")
                except (*BAD_BYTES, TypeError):
                    continue
                assert got is None or got.offset == offset
    finally:
        arena.close()


# -- store IDs ----------------------------------------------------------------------------------

TOPIC_CHARS = "abcXYZ019._-"


class Text(str):
    """A str subclass: the fast decoder leaves it to the Python code (the reference)."""


@given(
    topic=st.text(TOPIC_CHARS, min_size=1, max_size=249).filter(lambda t: t not in (".", "..")),
    partition=st.integers(0, 0x7FFFFFFF),
    offset=st.integers(0, (1 << 63) - 1),
)
def test_store_ids_decode_in_c_as_in_python(topic: str, partition: int, offset: int) -> None:
    text = encode_msg_id(topic, partition, offset)
    assert ids.decode_store_id(text) == (topic, partition, offset)
    assert decode_msg_id(Text(text)) == (topic, partition, offset)


@given(
    topic=st.text(min_size=0, max_size=400),
    partition=st.integers(0, 0x7FFFFFFF),
    offset=st.integers(0, (1 << 63) - 1),
)
def test_store_ids_encode_in_c_as_the_format_says(topic: str, partition: int, offset: int) -> None:
    """The kernel's encoder (Message.msg_id, ids.encode_msg_id) against the format written
    with the standard library: "m1-" + unpadded base64url of the two varints and the topic."""
    try:
        name = topic.encode()
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8, no ID
        with pytest.raises(UnicodeEncodeError):
            ids.encode_store_id(topic, partition, offset)
        return
    raw = encode_varint(partition) + encode_varint(offset) + name
    expected = "m1-" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    assert ids.encode_store_id(topic, partition, offset) == expected
    assert encode_msg_id(topic, partition, offset) == expected


@given(raw=st.binary(min_size=16, max_size=16))
def test_unique_id_text_is_the_canonical_uuid(raw: bytes) -> None:
    assert ids.uid_text(raw) == str(uuid.UUID(bytes=raw))
    assert Message("t", 0, 0, 0, headers=[("uid", raw)]).unique_id == str(uuid.UUID(bytes=raw))


def test_unique_id_text_needs_16_bytes() -> None:
    for raw in (b"", bytes(15), bytes(17)):
        with pytest.raises(ValueError, match="16 bytes"):
            ids.uid_text(raw)


@settings(max_examples=400)
@given(
    text=st.one_of(
        st.text(max_size=40),
        st.text("m1-ABCDEFabcdef0123456789-_+/=", max_size=40).map(lambda t: "m1-" + t),
        st.binary(max_size=30).map(
            lambda b: "m1-" + __import__("base64").urlsafe_b64encode(b).decode().rstrip("=")
        ),
    )
)
def test_any_text_the_c_decoder_takes_python_takes_alike(text: str) -> None:
    """The C decoder accepts exactly canonical IDs: whatever it returns, the Python decoder
    returns too; whatever it refuses, the Python decoder refuses with InvalidMessageIdError."""
    fast = ids.decode_store_id(text)
    try:
        slow = decode_msg_id(Text(text))
    except InvalidMessageIdError:
        assert fast is None
    else:
        assert fast == slow


@pytest.mark.parametrize(
    "text",
    [
        "m1-", "m1-A", "m1-AAA=", "m1-AA+A", "m1-AB", "m1-AAE", "m1-gAAAA", "m1-AAAu",
        "m1-AAAuLg", "m1-AAB0ZQ%", "m1-AAB0w6k", "n1-AAB0", "", "m1-" + "A" * 600,
    ],
)  # fmt: skip
def test_malformed_store_ids_are_refused_by_both(text: str) -> None:
    """Empty or lone-character bodies, padding, '+', unused bits set, overlong varints, the
    topics '.' and '..', a non-ASCII topic, another prefix, an overlong body."""
    assert ids.decode_store_id(text) is None
    with pytest.raises(InvalidMessageIdError):
        decode_msg_id(text)


def test_non_str_ids_are_refused() -> None:
    for value in (None, 5, b"m1-AAB0"):
        assert ids.decode_store_id(value) is None
        with pytest.raises(InvalidMessageIdError):
            decode_msg_id(value)


# -- get and find on a store ------------------------------------------------------------------


def fill(store: mqcore.Store, topic: str, rng: random.Random, n: int) -> None:
    i = 0
    while i < n:
        count = rng.choice([1, 3, 70, 200])
        store.append_batch(
            topic,
            [b"v%d" % (i + j) for j in range(count)],
            keys=[b"k%d" % rng.randrange(20) for _ in range(count)],
            partition=0,
            compression=rng.choice(["none", "none", "gzip", "zstd"]),
        )
        i += count


def test_get_record_answers_read_and_releases_its_mappings(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s")
    store = mqcore.open(path)
    store.create_topic("t", segment_bytes=8 << 10, key_index_entries=256)
    fill(store, "t", random.Random(1), 2500)
    msgs = store.read("t", 0, 0, 1 << 20)
    part = store.log.partition("t", 0)
    assert len(part.segments) > 3
    for _ in range(2):
        for m in msgs:
            assert lookup.get_record(part.table, m.offset) == m
            assert store.get_by_id(m.msg_id) == m
    for offset in (-1, len(msgs), len(msgs) + 10, 1 << 70, -(1 << 70)):
        assert lookup.get_record(part.table, offset) is None
    mappings = [seg.mapped for seg in part.segments]
    assert all(m is not None for m in mappings)
    store.close()
    assert all(m.closed for m in mappings)  # no buffer taken by a lookup was left behind


def test_a_failed_get_releases_its_mapping_too(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s")
    with mqcore.open(path) as store:
        store.create_topic("t")
        store.append_batch("t", [b"x" * 100] * 100, partition=0)
    log = os.path.join(path, "t-0", "00000000000000000000.log")
    with open(log, "r+b") as f:
        f.seek(200)
        f.write(b"\xff\xfe")  # inside the records: a CRC mismatch for the first get
    store = mqcore.open(path, read_only=True)
    part = store.log.partition("t", 0)
    with pytest.raises(CorruptRecordError):
        lookup.get_record(part.table, 50)
    mapped = part.segments[0].mapped
    store.close()
    assert mapped.closed


def miscount_first_batch(log: str, records_count: int) -> None:
    """Rewrite the recordsCount of the log's first batch and make its CRC right again."""
    with open(log, "r+b") as f:
        data = bytearray(f.read())
        struct.pack_into(">i", data, 57, records_count)
        struct.pack_into(
            ">I", data, 17, crc32c(bytes(data[21 : 12 + struct.unpack_from(">i", data, 8)[0]]))
        )
        f.seek(0)
        f.write(data)


@pytest.mark.parametrize("n", [5, 100])  # below and above the memo's sampling threshold (64)
@pytest.mark.parametrize("compression", ["none", "gzip"])
@pytest.mark.parametrize("verify_crc", [True, False])
@pytest.mark.parametrize("missing", [1, 2])
def test_get_refuses_a_batch_holding_more_records_than_its_count_like_read(
    tmp_path: object, n: int, compression: str, verify_crc: bool, missing: int
) -> None:
    """Issue 16: a CRC-valid batch whose recordsCount is smaller than the records it holds
    (a faulty writer's) made Store.read raise but get() answered from it. Every path that
    reads the batch (get, get_by_id, find_by_key, read) must raise CorruptRecordError."""
    path = os.path.join(str(tmp_path), "s")
    with mqcore.open(path) as store:
        store.create_topic("t")
        md = store.append_batch(
            "t", [b"v%d" % i for i in range(n)], keys=[b"k"] * n, partition=0,
            compression=compression,
        )  # fmt: skip
        ids = md.msg_ids
    miscount_first_batch(os.path.join(path, "t-0", "00000000000000000000.log"), n - missing)
    with mqcore.open(path, read_only=True, verify_crc=verify_crc) as store:
        with pytest.raises(CorruptRecordError, match="bytes left over after the last record"):
            store.read("t", 0, 0, n)
        for offset in (0, n // 2, n - 1):  # a read that wants fewer records than the batch has
            with pytest.raises(CorruptRecordError, match="bytes left over"):
                store.read("t", 0, offset, 1)
        with pytest.raises(CorruptRecordError, match="bytes left over"):
            store.read_arrow("t", 0, 0, 1)
        for offset in range(n):  # the first read of the batch and every later one
            with pytest.raises(CorruptRecordError, match="bytes left over"):
                store.get("t", 0, offset)
            with pytest.raises(CorruptRecordError, match="bytes left over"):
                store.get_by_id(ids[offset])
        with pytest.raises(CorruptRecordError):
            store.find_by_key("t", b"k")


def insert_entry(table: KeyTable, key: bytes, rel_offset: int, position: int) -> None:
    """A key entry for `key` naming the record at rel_offset: a collision when that record
    carries another key."""
    # KeyHit (hashing.pxd): hash, timestamp, offset delta, kind KEY, ts_max, run fields 0
    hit = struct.pack("=QqiiqII", xxh64_hash(key, KEY_SEED), T0, 0, 1, T0, 0, 0)
    assert table.room_for(1, 0)
    table.insert(hit, rel_offset, position)


def test_colliding_and_damaged_entries_are_verified_away(tmp_path: object) -> None:
    """Entries whose hash matches but whose record carries another key (as a 64-bit hash
    collision would) are read, counted, and dropped; a `keys` header matches word by word
    exactly as bytes.split(b" ") cuts it, empty words included."""
    path = os.path.join(str(tmp_path), "s")
    with mqcore.open(path) as store:
        store.create_topic("t", key_index_entries=1024)
        store.append("t", b"a", key=b"alpha", partition=0)
        store.append("t", b"b", key=b"beta", keys=["x", "y"], partition=0)
        store.append("t", b"c", key=b"gamma", headers={"keys": b"p  q "}, partition=0)
        seg = store.log.partition("t", 0).segments[0]
        table = seg.key_table()
        positions = [seg.position_for(o) for o in range(3)]
        insert_entry(table, b"alpha", 1, positions[1])  # alpha -> beta's record
        insert_entry(table, b"", 2, positions[2])  # b"" -> the record whose keys have ""
        insert_entry(table, b"zeta", 0, 0x7FFF0000)  # a position past the log
        r = store.find_by_key("t", b"alpha")
        assert [m.value for m in r] == [b"a"] and r.scanned_records == 2
        assert [m.value for m in store.find_by_key("t", b"y")] == [b"b"]
        assert [m.value for m in store.find_by_key("t", b"")] == [b"c"]  # "p  q ".split(" ")
        r = store.find_by_key("t", b"zeta")  # read through the offset index: alpha's record
        assert len(r) == 0 and r.scanned_records == 1
        found, read = lookup.find_hashed(
            store.log.partition("t", 0).table,
            b"alpha",
            lookup.KEY_KIND,
            0,
            (1 << 63) - 1,
            1,
            1 << 20,
        )
        assert [m.offset for m in found] == [] and read == 1  # from_offset 1: beta's only


@pytest.mark.parametrize("damage", ["slot", "chain"])
def test_a_damaged_key_table_raises(tmp_path: object, damage: str) -> None:
    path = os.path.join(str(tmp_path), "s")
    store = mqcore.open(path)
    try:
        store.create_topic("t", key_index_entries=64)
        store.append("t", b"a", key=b"alpha", partition=0)
        table = store.log.partition("t", 0).segments[0].key_table()
        slot = xxh64_hash(b"alpha", KEY_SEED) & (table.slot_count - 1)
        raw = memoryview(store.log.partition("t", 0).segments[0].key_index.mapping).cast("B")
        if damage == "slot":
            raw[HEADER_BYTES + 4 * slot : HEADER_BYTES + 4 * slot + 4] = (99).to_bytes(4, "big")
        else:  # the entry's link points at itself: not an older entry
            at = HEADER_BYTES + 4 * table.slot_count + 20
            raw[at : at + 4] = (1).to_bytes(4, "big")
        raw.release()
        with pytest.raises(CorruptIndexError):
            store.find_by_key("t", b"alpha")
    finally:
        store.close()


@settings(max_examples=200, deadline=None)
@given(
    body=st.binary(min_size=0, max_size=512),
    keys=st.integers(0, 40),
    h=st.integers(0, 2**64 - 1),
)
def test_probing_garbage_tables_stays_inside_them(body: bytes, keys: int, h: int) -> None:
    """A table whose header is right and whose slots and entries are anything: probe raises
    CorruptIndexError or answers, and reads nothing past the table."""
    slots, capacity = 16, 40
    size = file_size(slots, capacity, 0)
    buf = bytearray(size)
    init_header(buf, slots, capacity, 0)
    struct.pack_into(">I", buf, 20, min(keys, capacity))
    fill = body or b"\x00"
    buf[HEADER_BYTES:] = (fill * (size // len(fill) + 1))[: size - HEADER_BYTES]
    arena = GuardedArena(size)
    try:
        with arena.place(bytes(buf)) as view:
            table = KeyTable(view, False)
            try:
                hits = table.probe(h, 1000)
            except CorruptIndexError:
                hits = []
            finally:
                table.release()
            assert len(hits) <= min(keys, capacity)
    finally:
        arena.close()


def test_lookups_racing_retention_answer_or_miss_but_never_fail(tmp_path: object) -> None:
    """Lookups in one thread while another appends and deletes old segments: each answer is the
    message or None (its segment is gone), never an error; once the store closes, every mapping
    a lookup held a buffer of is unmapped."""
    import threading

    path = os.path.join(str(tmp_path), "s")
    store = mqcore.open(path)
    store.create_topic("t", segment_bytes=4 << 10, key_index_entries=128, retention_bytes=16 << 10)
    ids = [store.append("t", b"v%d" % i, key=b"k%d" % (i % 7), partition=0) for i in range(400)]
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[object] = []

    def churn() -> None:
        try:
            i = 400
            while not stop.is_set():
                store.append("t", b"v%d" % i, key=b"k%d" % (i % 7), partition=0)
                store.apply_retention("t")
                seen.extend(seg.mapped for seg in store.log.partition("t", 0).segments)
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for round_ in range(30):
            for md in ids[round_ * 13 % 400 :][:40]:
                m = store.get_by_id(md.msg_id)
                assert m is None or (m.offset, m.value) == (md.offset, b"v%d" % md.offset)
            for k in range(7):
                for m in store.find_by_key("t", b"k%d" % k):
                    assert m.key == b"k%d" % k and m.value == b"v%d" % m.offset
    finally:
        stop.set()
        worker.join(30)
    assert not errors, errors
    assert store.start_offset("t", 0) > 0  # retention did delete segments meanwhile
    store.close()
    assert all(m is None or m.closed for m in seen)


# -- the segment table ------------------------------------------------------------------------


class FakeSegment:
    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset


@settings(max_examples=200)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 12), st.lists(st.integers(0, 400))),
        max_size=12,
    ),
    probes=st.lists(st.integers(-5, 500), max_size=20),
)
def test_segment_table_splices_like_a_list_and_bisects_like_bisect(
    steps: list[tuple[int, int, list[int]]], probes: list[int]
) -> None:
    """SegmentTable.splice against list slice assignment (a splice that would leave the base
    offsets out of order is refused and changes nothing); floor_index against bisect."""
    table: SegmentTable[Any] = SegmentTable(threading.RLock(), "t", 3)
    model: list[FakeSegment] = []
    for start, stop, bases in steps:
        new = [FakeSegment(b) for b in bases]
        after = model[:start] + new + model[stop:] if start <= stop <= len(model) else None
        ordered = after is not None and all(
            a.base_offset < b.base_offset for a, b in itertools.pairwise(after)
        )
        if ordered:
            table.splice(start, stop, new)
            model[start:stop] = new
        else:
            with pytest.raises((IndexError, ValueError)):
                table.splice(start, stop, new)
        assert table.segments == model
        assert table.bases() == [s.base_offset for s in model]
    bases = table.bases()
    for offset in probes:
        if model:
            assert table.floor_index(offset) == max(0, bisect.bisect_right(bases, offset) - 1)
    assert (table.topic, table.partition, len(table)) == ("t", 3, len(model))


def keyed_batches(path: str, batches: int, n: int) -> list[str]:
    """A store of `batches` keyed batches of n records (key b"k<offset>", timestamps T0 +
    offset), closed cleanly; returns the store IDs by offset."""
    ids_out: list[str] = []
    with mqcore.open(path) as store:
        store.create_topic("t", index_interval_bytes=0)
        for b in range(batches):
            md = store.append_batch(
                "t", [b"v%06d" % (b * n + i) for i in range(n)],
                keys=[b"k%d" % (b * n + i) for i in range(n)], partition=0,
                timestamps=[T0 + b * n + i for i in range(n)],
            )  # fmt: skip
            ids_out.extend(md.msg_ids)
    return ids_out


def log_batches(log: str) -> list[int]:
    """The positions of the batches of a .log, from their length fields."""
    with open(log, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos + 12 <= len(data) and struct.unpack_from(">i", data, pos + 8)[0] > 0:
        out.append(pos)
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return out


@pytest.mark.parametrize("n", [5, 1000])  # below the memo's sampling threshold, and far above
@pytest.mark.parametrize("read_only", [False, True])
def test_a_flipped_bit_in_a_cold_store_is_found_by_every_first_lookup(
    tmp_path: object, n: int, read_only: bool
) -> None:
    """Issue 20 (cold lookups): a store closed cleanly is opened without checking its batches,
    so nothing vouches for them; one bit flipped in a value (only the CRC can tell) makes the
    first get, get_by_id, find_by_key and offset_for_time that land in that batch raise
    CorruptRecordError, and every later one too (a batch that failed is never remembered as
    checked), while the batches around it, read first, answer as written."""
    path = os.path.join(str(tmp_path), "s")
    msg_ids = keyed_batches(path, 3, n)
    log = os.path.join(path, "t-0", "00000000000000000000.log")
    second = log_batches(log)[1]
    with open(log, "r+b") as f:
        f.seek(second + 61 + 4)  # inside the second batch's first record, past its length
        byte = f.read(1)[0]
        f.seek(second + 61 + 4)
        f.write(bytes([byte ^ 0x10]))
    bad = range(n, 2 * n)
    with mqcore.open(path, read_only=read_only) as store:
        for offset in (0, n - 1, 2 * n, 3 * n - 1):  # good batches first: their memos are made
            m = store.get("t", 0, offset)
            assert m is not None and m.value == b"v%06d" % offset and m.key == b"k%d" % offset
        for _ in range(2):  # the first lookups in the bad batch, then again
            for offset in (bad[0], bad[-1], bad[len(bad) // 2]):
                with pytest.raises(CorruptRecordError, match="CRC"):
                    store.get("t", 0, offset)
                with pytest.raises(CorruptRecordError, match="CRC"):
                    store.get_by_id(msg_ids[offset])
                with pytest.raises(CorruptRecordError, match="CRC"):
                    store.find_by_key("t", b"k%d" % offset)
                with pytest.raises(CorruptRecordError, match="CRC"):
                    store.offset_for_time("t", 0, T0 + offset)
        assert [m.offset for m in store.find_by_key("t", b"k%d" % (2 * n))] == [2 * n]
