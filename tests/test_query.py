"""Queries against brute force: key and unique-ID lookups through the key index, store IDs,
time ranges and searches; the key index across crashes, deletion and damage."""

from __future__ import annotations

import os
import random
import re
import textwrap
import threading
from typing import Any

import pytest
import xxhash
from crashchild import run_child
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore._ext.hashing import xxh64_hash
from mqcore.errors import CorruptRecordError, InvalidConfigError, InvalidMessageIdError
from mqcore.query import engine
from mqcore.query.ids import decode_msg_id, encode_msg_id, parse_uid, uid_time_ms

TOPIC = "q"
PARTS = 3
KEYS = [b"k%d" % i for i in range(12)]
T0 = 1_700_000_000_000  # ms (2023): smaller bounds draw an ImplausibleTimeWarning


def build(path: str, n: int = 1500, seed: int = 7, **config: object) -> list[mqcore.Message]:
    """A store with duplicate keys, shuffled timestamps, tags, properties, extra keys, several
    codecs and small segments; returns every message read back."""
    rng = random.Random(seed)
    cfg = {"segment_bytes": 16 << 10, "key_index_entries": 64, **config}
    with mqcore.open(path) as s:
        s.create_topic(TOPIC, partitions=PARTS, **cfg)
        i = 0
        while i < n:
            count = rng.randint(1, 40)
            colours = [rng.choice([b"red", b"green", b"blue"]) for _ in range(count)]
            props = [
                {"amount": str(rng.randrange(100)), "region": rng.choice("ab")} for _ in colours
            ]
            s.append_batch(
                TOPIC,
                [b"value %d %s" % (i + j, c) for j, c in enumerate(colours)],
                keys=[rng.choice([*KEYS, None]) for _ in colours],
                partition=rng.randrange(PARTS),
                timestamps=[T0 + rng.randrange(100_000) for _ in colours],
                tags=[rng.choice(["TagA", "TagB", None]) for _ in colours],
                properties=props,
                compression=rng.choice(["none", "gzip", "lz4", "zstd", "snappy"]),
            )
            i += count
        s.append(TOPIC, b"extra", key=b"main", keys=["alias-1", "alias-2"], partition=0)
        return [m for p in range(PARTS) for m in s.read(TOPIC, p, 0, 1 << 20)]


class Built(tuple):  # type: ignore[type-arg]
    """(path, messages) with a short repr, so hypothesis does not print every message."""

    def __repr__(self) -> str:
        return f"Built({self[0]!r})"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[mqcore.Message]]:
    path = str(tmp_path_factory.mktemp("query") / "store")
    return Built((path, build(path)))


def ids(msgs: object) -> list[tuple[int, int]]:
    return [(m.partition, m.offset) for m in msgs]  # type: ignore[attr-defined]


def test_store_has_many_segments_and_full_key_indexes(
    built: tuple[str, list[mqcore.Message]],
) -> None:
    path, _ = built
    names = os.listdir(os.path.join(path, f"{TOPIC}-0"))
    assert sum(n.endswith(".keyindex") for n in names) == sum(n.endswith(".log") for n in names) > 3


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(KEYS + [b"absent", b"alias-1", b"alias-2", b"main"]),
    window=st.tuples(st.integers(T0 - 10_000, T0 + 110_000), st.integers(0, 120_000)),
    limit=st.integers(1, 400),
)
def test_find_by_key_equals_brute_force(
    built: tuple[str, list[mqcore.Message]], key: bytes, window: tuple[int, int], limit: int
) -> None:
    path, msgs = built
    lo, hi = window[0], window[0] + window[1]
    expected = [
        m for m in msgs
        if lo <= m.timestamp < hi
        and (m.key == key or key in (m.header("keys") or b"").split(b" "))
    ]  # fmt: skip
    with mqcore.open(path, read_only=True) as s:
        got, cursor, rounds = [], None, 0
        while True:
            r = s.find_by_key(TOPIC, key, start=lo, end=hi, limit=limit, cursor=cursor)
            got.extend(r)
            rounds += 1
            if r.reason == "exhausted":
                break
            assert r.reason == "limit" and len(r) == limit and r.cursor
            cursor = r.cursor
        assert ids(got) == ids(expected)
        assert rounds <= len(expected) // limit + 1


def test_a_small_limit_reads_only_what_it_returns(tmp_path: object) -> None:
    """A key with hundreds of messages: limit=N reads N + 1 records of a partition (the one
    past the limit says whether it cut the answer), not every candidate the index gives, and
    the pages still add up to brute force's answer."""
    with mqcore.open(str(tmp_path)) as s:
        s.create_topic(TOPIC, partitions=PARTS, segment_bytes=8 << 10)
        for i in range(0, 1800, 60):
            s.append_batch(
                TOPIC, [b"v%d" % j for j in range(i, i + 60)],
                keys=[b"hot" if j % 3 else b"cold" for j in range(i, i + 60)],
                partition=(i // 60) % PARTS,
            )  # fmt: skip
        expected = [
            m for p in range(PARTS) for m in s.read(TOPIC, p, 0, 1 << 20) if m.key == b"hot"
        ]
        assert len(expected) == 1200
        for limit in (1, 7):
            got, cursor = [], None
            while True:
                r = s.find_by_key(TOPIC, b"hot", limit=limit, cursor=cursor)
                got.extend(r)
                if r.reason == "exhausted":
                    break
                # limit + 1 records of the partition where it stops, fewer only at its end
                assert r.scanned_records <= limit + 1
                cursor = r.cursor
            assert ids(got) == ids(expected)


def test_ids_find_every_message(built: tuple[str, list[mqcore.Message]]) -> None:
    path, msgs = built
    with mqcore.open(path, read_only=True) as s:
        for m in random.Random(3).sample(msgs, 150):
            assert m.unique_id is not None
            assert s.get_by_id(m.msg_id) == m
            found = s.find_by_unique_id(m.unique_id)
            assert found.messages == [m]
        assert s.get_by_id(encode_msg_id(TOPIC, 0, 10**9)) is None
        assert s.get_by_id(encode_msg_id("nope", 0, 0)) is None
        assert len(s.find_by_unique_id("01234567-89ab-7def-8123-456789abcdef")) == 0


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lo=st.integers(T0 - 10_000, T0 + 110_000),
    width=st.integers(0, 50_000),
    contains=st.sampled_from([None, b"red", b"value 1", b"nothing"]),
    tag=st.sampled_from([None, "TagA", "TagB"]),
    where=st.sampled_from([None, "amount > 50", "region = 'a' AND amount BETWEEN 10 AND 20"]),
    partition=st.sampled_from([None, 0, 2]),
)
def test_search_and_range_equal_brute_force(
    built: tuple[str, list[mqcore.Message]],
    lo: int,
    width: int,
    contains: bytes | None,
    tag: str | None,
    where: str | None,
    partition: int | None,
) -> None:
    path, msgs = built
    hi = lo + width

    def match(m: mqcore.Message) -> bool:
        if not lo <= m.timestamp < hi or (partition is not None and m.partition != partition):
            return False
        if contains is not None and (m.value is None or contains not in m.value):
            return False
        if tag is not None and m.tag != tag:
            return False
        if where is not None:
            amount, region = int(m.properties.get("amount", "-1")), m.properties.get("region")
            ok = amount > 50 if where == "amount > 50" else region == "a" and 10 <= amount <= 20
            return ok and "amount" in m.properties
        return True

    with mqcore.open(path, read_only=True) as s:
        r = s.search(TOPIC, contains, None, tag, where, partition, start=lo, end=hi, limit=100_000)
        assert r.reason == "exhausted"
        assert ids(r) == ids([m for m in msgs if match(m)])
        if contains is None and tag is None and where is None:
            assert ids(s.range(TOPIC, lo, hi, partition, limit=100_000)) == ids(r)


def test_search_budget_stops_with_a_cursor(built: tuple[str, list[mqcore.Message]]) -> None:
    path, msgs = built
    with mqcore.open(path, read_only=True) as s:
        r = s.search(TOPIC, contains=b"value", max_scan=100)
        assert r.reason == "max_scan" and r.cursor and r.scanned_records >= 100
        rest = s.search(TOPIC, contains=b"value", cursor=r.cursor, limit=100_000)
        assert ids(list(r) + list(rest)) == ids([m for m in msgs if b"value" in (m.value or b"")])
        assert s.search(TOPIC, regex=rb"value \d+ gre+n", limit=5).reason == "limit"
        with pytest.raises(InvalidConfigError):
            s.search(TOPIC, limit=0)
        with pytest.raises(InvalidConfigError):
            s.search(TOPIC, cursor="bogus")
        table = s.search(TOPIC, tag="TagA", limit=10).to_arrow()
        assert table.num_rows == 10 and table.column_names[:3] == ["key", "value", "topic"]


# -- scans on several threads (engine.ScanAhead) ---------------------------------------------


def answer(r: engine.QueryResult) -> tuple[object, ...]:
    """Everything a caller can see of a result."""
    return (ids(r), r.reason, r.cursor, r.scanned_records, r.scanned_bytes, r.missing_properties)


def helper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mqcore-scan-ahead"]


def helpers_end(seconds: float = 30.0) -> bool:
    """Every scan-ahead helper ends on its own: told to stop when its scan ends, it finishes
    the kernel call under way (joined here, with a bound far above one call's time)."""
    for t in helper_threads():
        t.join(seconds)
    return helper_threads() == []


@pytest.fixture
def ahead_always(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every segment is scanned ahead however small (this store's are 16 KiB, the threshold is
    4 MiB); returns a list that counts the helper results the scans took."""
    taken: list[int] = []
    take = engine.ScanAhead.take

    def counting(self: engine.ScanAhead, pos: int, offset: int) -> list[Any]:
        got = take(self, pos, offset)
        taken.append(len(got))
        return got

    monkeypatch.setattr(engine, "SCAN_AHEAD_BYTES", 0)
    monkeypatch.setattr(engine.ScanAhead, "take", counting)
    return taken


@pytest.fixture
def small_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel calls of at most 5 matches and 23 records: the helper's calls meet the caller's
    bounds inside a segment, as they do past 4096 matches and 262,144 records in a real one."""
    monkeypatch.setattr(engine, "SCAN_CHUNK", 5)
    monkeypatch.setattr(engine, "SCAN_CALL_RECORDS", 23)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lo=st.sampled_from([None, T0 + 20_000]),
    contains=st.sampled_from([None, b"red", b"value 1", b"nothing"]),
    regex=st.sampled_from([None, rb"value \d+ gre+n"]),
    tag=st.sampled_from([None, "TagA"]),
    where=st.sampled_from([None, "amount > 50", "region = 'a' AND amount < 30", "absent = 'x'"]),
    partition=st.sampled_from([None, 0, 2]),
    limit=st.sampled_from([1, 7, 100, 100_000]),
    max_scan=st.sampled_from([1, 25, 400, 10_000_000]),
    timeout=st.sampled_from([None, 0]),
    threads=st.sampled_from([2, 3, 8]),
)
def test_scans_on_several_threads_give_the_one_thread_answer(
    built: tuple[str, list[mqcore.Message]],
    ahead_always: list[int],
    small_calls: None,
    lo: int | None,
    contains: bytes | None,
    regex: bytes | None,
    tag: str | None,
    where: str | None,
    partition: int | None,
    limit: int,
    max_scan: int,
    timeout: float | None,
    threads: int,
) -> None:
    """Every page of a query, followed by its cursors, is the same with helper threads as
    without: messages, reason, cursor, counts and the selector's missing names; the kernel
    filters, the Python ones (regex), limits, budgets and a zero timeout alike, with kernel
    calls cut short by their bounds (small_calls) as well as by segment ends."""
    path, _ = built
    query: dict[str, Any] = {"contains": contains, "regex": regex, "tag": tag, "where": where,
             "partition": partition, "start": lo, "limit": limit, "max_scan": max_scan,
             "timeout": timeout}  # fmt: skip
    with mqcore.open(path, read_only=True) as s:
        cursors: dict[int, str | None] = {1: None, threads: None}
        for _ in range(6):
            pages = {n: s.search(TOPIC, **query, cursor=cursors[n], threads=n) for n in cursors}
            assert answer(pages[threads]) == answer(pages[1])
            if pages[1].cursor is None:
                break
            cursors = {n: pages[n].cursor for n in cursors}
    assert helpers_end()


def test_scan_ahead_is_used_and_its_threads_end(
    built: tuple[str, list[mqcore.Message]], ahead_always: list[int]
) -> None:
    """The helpers' results are what the scan takes (not redone), the answer is brute force's,
    and every helper ends, also when the limit stops the scan in the first segment."""
    path, msgs = built
    with mqcore.open(path, read_only=True) as s:
        r = s.search(TOPIC, contains=b"red", limit=100_000, threads=2)
        assert r.reason == "exhausted"
        assert ids(r) == ids([m for m in msgs if b"red" in (m.value or b"")])
        assert len(ahead_always) > 10 and all(ahead_always)
        assert helpers_end()
        first = s.search(TOPIC, contains=b"red", limit=1, threads=4)
        assert first.reason == "limit" and len(first) == 1
    assert helpers_end()  # helpers told to stop may outlive the search and the store's close


def test_a_helper_holds_a_bounded_number_of_candidates(
    built: tuple[str, list[mqcore.Message]],
    ahead_always: list[int],
    small_calls: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A regex without a literal makes every record a candidate for the Python filter: a
    helper stops once it holds SCAN_AHEAD_CANDIDATES of them (plus at most one call's room),
    not a whole segment's, and the caller scans the rest; the answer is one thread's."""
    path, msgs = built
    held: list[int] = []
    take = engine.ScanAhead.take

    def measuring(self: engine.ScanAhead, pos: int, offset: int) -> list[Any]:
        got = take(self, pos, offset)
        held.append(sum(len(r.messages) for r, _, _ in got))
        return got

    monkeypatch.setattr(engine, "SCAN_AHEAD_CANDIDATES", 8)
    monkeypatch.setattr(engine.ScanAhead, "take", measuring)
    with mqcore.open(path, read_only=True) as s:
        query = {"regex": rb"\d+ (red|blue)", "limit": 100_000}
        many = s.search(TOPIC, **query, threads=2)  # type: ignore[arg-type]
        assert answer(many) == answer(s.search(TOPIC, **query, threads=1))  # type: ignore[arg-type]
    assert ids(many) == ids([m for m in msgs if re.search(rb"\d+ (red|blue)", m.value or b"")])
    assert held and max(held) <= 8 + 5 - 1 and sum(held) > 0


def test_interrupted_scan_with_helpers_resumes_where_it_stopped(
    built: tuple[str, list[mqcore.Message]],
    ahead_always: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C while helpers scan ahead: QueryInterrupted's cursor resumes exactly past what was
    returned, and the helpers are stopped before it propagates."""
    path, msgs = built
    calls = {"n": 0}
    filter_chunk = engine.filter_chunk

    def interrupting(*args: object) -> object:
        calls["n"] += 1
        if calls["n"] == 9:
            raise KeyboardInterrupt
        return filter_chunk(*args)  # type: ignore[arg-type]

    with mqcore.open(path, read_only=True) as s:
        monkeypatch.setattr(engine, "filter_chunk", interrupting)
        with pytest.raises(mqcore.errors.QueryInterrupted) as stop:
            s.search(TOPIC, contains=b"green", limit=100_000, threads=3)
        assert helpers_end()
        monkeypatch.setattr(engine, "filter_chunk", filter_chunk)
        first = stop.value.result
        rest = s.search(TOPIC, contains=b"green", limit=100_000, cursor=first.cursor, threads=3)
    assert rest.reason == "exhausted" and len(first) > 0
    assert ids(first) + ids(rest) == ids([m for m in msgs if b"green" in (m.value or b"")])


def test_scans_ahead_beside_a_writer_see_a_prefix(
    tmp_path: object, ahead_always: list[int]
) -> None:
    """A writer thread appends (rolling 16 KiB segments) while another thread searches with
    helpers: every answer is a prefix of the final log's matches, in order, never a torn or
    repeated message, and once the writer stops the answer is the whole list."""
    with mqcore.open(str(tmp_path)) as s:
        s.create_topic(TOPIC, segment_bytes=16 << 10)
        done = threading.Event()
        answers: list[list[tuple[int, int]]] = []

        def write() -> None:
            for i in range(300):
                s.append_batch(TOPIC, [b"v%d-%d %s" % (i, j, b"needle" * (j % 3 == 0))
                                       for j in range(20)])  # fmt: skip
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        while not done.is_set():
            answers.append(ids(s.search(TOPIC, contains=b"needle", limit=100_000, threads=3)))
        writer.join()
        final = ids(s.search(TOPIC, contains=b"needle", limit=100_000, threads=3))
        brute = [
            (0, m.offset) for m in s.read(TOPIC, 0, 0, 1 << 20) if b"needle" in (m.value or b"")
        ]
    assert final == brute and len(brute) == 300 * 7
    assert len(answers) > 3 and sum(ahead_always) > 0
    for got in answers:
        assert got == brute[: len(got)]
    assert helpers_end()


def test_corruption_ahead_is_reported_as_on_one_thread(tmp_path: object) -> None:
    """A damaged batch in a later segment: the same CorruptRecordError with helpers as without
    (the helper's own error is dropped; the caller's call meets it); a query that ends before
    it is answered, and the file is left as it was."""
    path = str(tmp_path)
    build(path, n=600)
    directory = os.path.join(path, f"{TOPIC}-0")
    last = sorted(n for n in os.listdir(directory) if n.endswith(".log"))[-2]
    log = os.path.join(directory, last)
    with open(log, "r+b") as f:
        data = bytearray(f.read())
        at = data.rindex(b"value ")
        data[at] ^= 0x20  # a value byte: the batch's CRC no longer matches
        f.seek(0)
        f.write(data)
    errors = {}
    with mqcore.open(path, read_only=True) as s:
        for threads in (1, 2, 3):
            with pytest.raises(CorruptRecordError) as err:
                s.search(TOPIC, contains=b"nothing", partition=0, threads=threads)
            errors[threads] = str(err.value)
            assert helpers_end()
            early = s.search(TOPIC, contains=b"value", partition=0, limit=3, threads=threads)
            assert early.reason == "limit" and len(early) == 3
    assert errors[2] == errors[3] == errors[1] and last in errors[1]
    with open(log, "rb") as f:
        assert f.read() == bytes(data)


def test_store_closed_while_helpers_still_scan(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search whose limit is met at once returns while its helpers are about to scan 8 MiB
    segments (held at a gate before their kernel call), and the store is closed right then,
    its mappings with it; let go, the helpers scan through the views they hold, nothing
    crashes, and every helper ends."""
    path = str(tmp_path)
    value = b"x" * 1000
    with mqcore.open(path) as s:
        s.create_topic(TOPIC, segment_bytes=8 << 20)
        s.append(TOPIC, b"hit " + value)
        for _ in range(30):
            s.append_batch(TOPIC, [value] * 1000)
    gate = threading.Event()
    scan_chunk = engine.scan_chunk

    def gated(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("note") is False:  # a helper's call
            gate.wait(30)
        return scan_chunk(*args, **kwargs)

    monkeypatch.setattr(engine, "scan_chunk", gated)
    s = mqcore.open(path, read_only=True)
    r = s.search(TOPIC, contains=b"hit", limit=1, threads=4)
    s.close()
    assert r.reason == "limit" and ids(r) == [(0, 0)]
    assert len(helper_threads()) == 3  # segments 1-3, each still to be scanned
    gate.set()
    assert helpers_end()
    with mqcore.open(path, read_only=True) as s:
        assert s.search(TOPIC, contains=b"hit", limit=10, threads=4).reason == "exhausted"
    assert helpers_end()


@pytest.fixture
def key_tables_asked(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The segments whose key table is asked for (which may load or rebuild it), in order."""
    from mqcore.storage.segment import LogSegment

    asked: list[object] = []
    key_table = LogSegment.key_table

    def counting(self: LogSegment) -> object:
        asked.append(self)
        return key_table(self)

    monkeypatch.setattr(LogSegment, "key_table", counting)
    return asked


def test_a_scan_loads_only_the_segments_it_reaches_and_reads_ahead(
    built: tuple[str, list[mqcore.Message]],
    ahead_always: list[int],
    key_tables_asked: list[object],
) -> None:
    """A scan asks a segment's key table (which may load or rebuild it) only for a bounded end
    and only of the segments it reaches or reads ahead: a limit met in the first segment costs
    one or `threads` of them, not the partition's 15 or so (the first version asked every
    planned segment before scanning one)."""
    path, _ = built
    asked = key_tables_asked
    with mqcore.open(path, read_only=True) as s:
        for threads in (1, 2, 3):
            asked.clear()
            r = s.search(TOPIC, contains=b"value", partition=0, end=T0 + 200_000, limit=1,
                         threads=threads)  # fmt: skip
            assert r.reason == "limit" and len(asked) == threads
        asked.clear()
        assert s.search(TOPIC, contains=b"value", partition=0, limit=1, threads=2).reason == "limit"
        assert asked == []  # no end: no key table can rule a segment out
    assert helpers_end()


def test_segments_too_small_to_read_ahead_are_not_loaded_ahead(
    built: tuple[str, list[mqcore.Message]], key_tables_asked: list[object]
) -> None:
    """With the real threshold (4 MiB; this store's segments are 16 KiB) no segment is read
    ahead, so none is asked ahead either: a limit met in the first segment asks one key
    table, as with one thread."""
    path, _ = built
    asked = key_tables_asked
    with mqcore.open(path, read_only=True) as s:
        r = s.search(TOPIC, contains=b"value", partition=0, end=T0 + 200_000, limit=1, threads=8)
    assert r.reason == "limit" and len(asked) == 1 and helper_threads() == []


def test_a_scan_without_threads_to_start_scans_alone(
    built: tuple[str, list[mqcore.Message]],
    ahead_always: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a helper thread cannot be started (RuntimeError: can't start new thread), the
    caller scans that segment itself and the answer is the same."""
    path, _ = built

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with mqcore.open(path, read_only=True) as s:
        want = answer(s.search(TOPIC, contains=b"red", limit=100_000, threads=1))
        monkeypatch.setattr(threading.Thread, "start", refuse)
        assert answer(s.search(TOPIC, contains=b"red", limit=100_000, threads=3)) == want
    assert ahead_always and not any(ahead_always)


def test_threads_is_checked() -> None:
    """`threads`: None (2 where two CPUs are usable) or an int in [1, 64]; anything else is
    refused before anything is read."""
    assert engine.check_threads(None) == (2 if engine.usable_cpus() >= 2 else 1)
    assert engine.check_threads(1) == 1 and engine.check_threads(64) == 64
    for bad in (0, -1, 65, True, 2.0, "2"):
        with pytest.raises(InvalidConfigError, match="threads"):
            engine.check_threads(bad)


@given(data=st.binary(max_size=300), seed=st.integers(0, 2**64 - 1))
def test_xxh64_equals_the_reference(data: bytes, seed: int) -> None:
    assert xxh64_hash(data, seed) == xxhash.xxh64_intdigest(data, seed)


def test_id_texts_are_told_apart_and_checked() -> None:
    mid = encode_msg_id("orders.eu", 7, 123456789)
    assert mid.startswith("m1-") and decode_msg_id(mid) == ("orders.eu", 7, 123456789)
    for bad in ["", "m1-", "m1-!!", "x1-AQB0", mid + "A", 5]:
        with pytest.raises(InvalidMessageIdError):
            decode_msg_id(bad)
    with pytest.raises(InvalidMessageIdError):
        parse_uid(mid)
    for bad in ["", "xyz", "0123456789abcdef0123456789abcdeg", "0123"]:
        with pytest.raises(InvalidMessageIdError):
            parse_uid(bad)
    raw = parse_uid("01a2044d-1a45-7260-8267-32790a7e7511")
    assert uid_time_ms(raw) == 0x01A2044D1A45
    assert uid_time_ms(bytes(16)) is None


def test_generated_unique_ids_are_v7_ordered_and_distinct(store: mqcore.Store) -> None:
    store.create_topic("u")
    bm = store.append_batch("u", [b"x"] * 500)
    uids = bm.unique_ids
    assert len(set(uids)) == 500 and uids == sorted(uids)  # type: ignore[type-var]
    assert all(u is not None and u[14] == "7" and u[19] in "89ab" for u in uids)
    md = store.append("u", b"y", unique_id="01234567-89ab-7def-8123-456789abcdef")
    assert md.unique_id == "01234567-89ab-7def-8123-456789abcdef"
    assert store.get("u", 0, md.offset).unique_id == md.unique_id  # type: ignore[union-attr]
    assert store.find_by_unique_id(md.unique_id).messages[0].value == b"y"


def test_reused_unique_id_is_reported_not_truncated_silently(store: mqcore.Store) -> None:
    """A producer that reuses an ID: limit=1 says "limit" (more exist); a larger limit
    returns every copy, in offset order, exhausted. A single copy is "exhausted"."""
    uid = "01234567-89ab-7def-8123-456789abcdef"
    store.create_topic("r", partitions=2)
    a = store.append("r", b"first", unique_id=uid, partition=1)
    store.append_batch("r", [b"filler"] * 50, partition=0)
    b = store.append("r", b"again", unique_id=uid, partition=0)
    one = store.find_by_unique_id(uid)
    assert one.reason == "limit" and len(one) == 1 and not one.complete
    every = store.find_by_unique_id(uid, limit=10)
    assert every.reason == "exhausted" and every.complete
    assert [(m.partition, m.offset) for m in every] == [(0, b.offset), (1, a.offset)]
    single = store.append("r", b"only").unique_id
    assert single is not None and store.find_by_unique_id(single).reason == "exhausted"


def test_topic_without_key_index_refuses_key_lookups(store: mqcore.Store) -> None:
    """key_index=False: find_by_key says why it cannot answer (no silent empty result);
    search still finds by scanning; find_by_unique_id looks only where an index is kept."""
    uid = "01234567-89ab-7def-8123-456789abcdef"
    store.create_topic("noidx", key_index=False)
    store.create_topic("idx")
    store.append("noidx", b"v", key=b"k", unique_id=uid)
    with pytest.raises(InvalidConfigError, match="'noidx' keeps no key index"):
        store.find_by_key("noidx", b"k")
    assert [m.key for m in store.search("noidx", contains=b"v")] == [b"k"]
    assert len(store.find_by_unique_id(uid)) == 0
    md = store.append("idx", b"w", unique_id=uid)
    assert [(m.topic, m.offset) for m in store.find_by_unique_id(uid)] == [("idx", md.offset)]
    assert not os.path.exists(os.path.join(store.path, "noidx-0", f"{0:020d}.keyindex"))


def test_keys_as_one_space_separated_string(store: mqcore.Store) -> None:
    """keys="a b" (RocketMQ's KEYS) is the words a and b, like keys=["a", "b"]."""
    store.create_topic("kw")
    one = store.append("kw", b"1", keys="order-17  invoice-9").offset
    two = store.append("kw", b"2", keys=["invoice-9"]).offset
    assert [m.offset for m in store.find_by_key("kw", "invoice-9")] == [one, two]
    assert [m.offset for m in store.find_by_key("kw", b"order-17")] == [one]
    assert len(store.find_by_key("kw", "order-17  invoice-9")) == 0


def _query_state(path: str) -> list[object]:
    with mqcore.open(path, read_only=True) as s:
        return [ids(s.find_by_key(TOPIC, k, limit=100_000)) for k in KEYS]


def test_deleted_or_damaged_key_index_is_rebuilt(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "s")
    build(path, n=600)
    before = _query_state(path)
    d = os.path.join(path, f"{TOPIC}-1")
    files = sorted(n for n in os.listdir(d) if n.endswith(".keyindex"))
    os.unlink(os.path.join(d, files[0]))
    with open(os.path.join(d, files[-1]), "r+b") as f:
        f.write(b"garbage!")
    with mqcore.open(path, read_only=True) as s:  # read-only: rebuilt in memory, not written
        assert [ids(s.find_by_key(TOPIC, k, limit=100_000)) for k in KEYS] == before
    assert not os.path.exists(os.path.join(d, files[0]))
    with mqcore.open(path) as s:  # writable: a sealed segment's file is rebuilt on first use
        assert not os.path.exists(os.path.join(d, files[0]))
        assert [ids(s.find_by_key(TOPIC, k, limit=100_000)) for k in KEYS] == before
        assert os.path.exists(os.path.join(d, files[0]))
    assert _query_state(path) == before


def test_damaged_entry_positions_fall_back_to_the_offset_index(tmp_path: object) -> None:
    """Every key entry's batch position overwritten (the file still trusted: its header and
    chains are intact): lookups go by the entry's offset through the offset index and still
    return exactly what they did."""
    import mmap

    from mqcore._ext.keyindex import HEADER_BYTES, KEY_ENTRY_BYTES, KeyTable

    path = os.path.join(str(tmp_path), "s")
    build(path, n=600)
    before = _query_state(path)
    d = os.path.join(path, f"{TOPIC}-1")
    rng = random.Random(4)
    damaged = 0
    for name in sorted(n for n in os.listdir(d) if n.endswith(".keyindex")):
        with open(os.path.join(d, name), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            table = KeyTable(m, False)
            first, count = HEADER_BYTES + 4 * table.slot_count, table.key_count
            table.release()
            for i in range(count):
                at = first + i * KEY_ENTRY_BYTES + 12  # the entry's batch position
                m[at : at + 4] = rng.choice([0, 1, 7, 0x7FFFFFFF]).to_bytes(4, "big")
                damaged += 1
            # a fresh content CRC: the file vouches for the damage (a writer bug, not a disk)
            table = KeyTable(m, True)
            table.store_header(True, table.covered_position)
            table.release()
    assert damaged > 100
    assert _query_state(path) == before


WRITER = textwrap.dedent(
    """
    import sys, mqcore
    s = mqcore.open(sys.argv[1], flush="always")
    s.create_topic("q", partitions=1, key_index_entries=256, segment_bytes=1 << 16)
    i = 0
    while True:
        md = s.append("q", b"v%d" % i, key=b"k%d" % (i % 5))
        print(md.offset, md.unique_id, flush=True)
        i += 1
    """
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_key_index_survives_sigkill(tmp_path: object, seed: int) -> None:
    path = os.path.join(str(tmp_path), "s")
    acked: list[tuple[int, str]] = []
    rng = random.Random(seed)
    for _ in range(3):
        n = rng.randint(50, 600)
        child = run_child(WRITER, path, kill_when=lambda lines, n=n: len(lines) >= n)
        assert len(child.lines) >= n, child.err
        acked += [(int(off), uid) for off, uid in (ln.split() for ln in child.lines)]
    with mqcore.open(path) as s:
        msgs = s.read(TOPIC, 0, 0, 1 << 20)
        for k in range(5):
            want = [m.offset for m in msgs if m.key == b"k%d" % k]
            assert [m.offset for m in s.find_by_key(TOPIC, b"k%d" % k, limit=100_000)] == want
        for off, uid in acked[-50:]:
            assert [m.offset for m in s.find_by_unique_id(uid)] == [off]
