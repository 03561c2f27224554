"""Time order (issue 32): Store.search(order="time") and key searches with filters, against
brute force. Every query is paged to its end with its cursors; the pages together must be all
matching messages sorted by (timestamp, partition, offset), whatever the limit, the scan
budget, the filters, the key or a writer appending meanwhile (then a prefix of the final
answer at every page, and the whole of it once the writer stops)."""

from __future__ import annotations

import heapq
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore.errors import InvalidConfigError, QueryInterrupted
from mqcore.query import engine

TOPIC = "t"
PARTS = 4
T0 = 1_718_013_600_000  # 2024-06-10T10:00:00Z
KEYS = [b"k%d" % i for i in range(6)]
Ids = list[tuple[int, int]]


def fill(s: mqcore.Store, n: int, seed: int, ordered: bool = True) -> None:
    """Batches to random partitions of TOPIC; with `ordered`, one clock for all that moves
    by 0-2 ms a batch (each partition's timestamps never decrease, many are equal across
    partitions), else random timestamps within 5 s."""
    rng = random.Random(seed)
    clock, i = T0, 0
    while i < n:
        count = rng.randint(1, 30)
        clock += rng.randrange(3)
        s.append_batch(
            TOPIC,
            [b"line %d %s" % (i + j, rng.choice([b"GET", b"POST", b"PUT"])) for j in range(count)],
            keys=[rng.choice([*KEYS, None]) for _ in range(count)],
            partition=rng.randrange(PARTS),
            timestamps=[clock if ordered else T0 + rng.randrange(5000) for _ in range(count)],
            tags=[rng.choice(["a", "b", None]) for _ in range(count)],
            properties=[{"n": str(rng.randrange(10))} for _ in range(count)],
            compression=rng.choice(["none", "lz4", "zstd"]),
        )
        i += count


class Built(tuple):  # type: ignore[type-arg]
    """(path, messages) with a short repr, so hypothesis does not print every message."""

    def __repr__(self) -> str:
        return f"Built({self[0]!r})"


def build(path: str, ordered: bool) -> Built:
    with mqcore.open(path) as s:
        s.create_topic(TOPIC, partitions=PARTS, segment_bytes=8 << 10)
        fill(s, 2500, 11, ordered)
        return Built((path, [m for p in range(PARTS) for m in s.read(TOPIC, p, 0, 1 << 20)]))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(str(tmp_path_factory.mktemp("time_order") / "store"), ordered=True)


@pytest.fixture(scope="module")
def disordered(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(str(tmp_path_factory.mktemp("time_disorder") / "store"), ordered=False)


def ids(msgs: Any) -> Ids:
    return [(m.partition, m.offset) for m in msgs]


def by_time(msgs: list[mqcore.Message]) -> Ids:
    return ids(sorted(msgs, key=lambda m: (m.timestamp, m.partition, m.offset)))


def carries(m: mqcore.Message, key: bytes) -> bool:
    return m.key == key or key in (m.header("keys") or b"").split(b" ")


def page_all(
    s: mqcore.Store, between: Callable[[list[Ids]], None] | None = None, **query: Any
) -> tuple[list[Ids], list[str]]:
    """Every page of a query, cursor after cursor, and each page's reason."""
    pages, reasons, cursor = [], [], None
    while True:
        r = s.search(TOPIC, cursor=cursor, **query)
        pages.append(ids(r))
        reasons.append(r.reason)
        assert len(r) <= query.get("limit", 1000)
        if r.complete:
            assert r.cursor is None
            return pages, reasons
        assert r.cursor is not None and r.cursor.startswith("t1")
        cursor = r.cursor
        if between is not None:
            between(pages)


FILTERS = st.sampled_from(
    [{}, {"tag": "a"}, {"contains": b"POST"}, {"where": "n > 6"}, {"regex": "line [0-9]*7 "},
     {"contains": b"GET", "where": "n = 3 OR n = 4"}]
)  # fmt: skip


def accepted(m: mqcore.Message, f: dict[str, Any]) -> bool:
    """FILTERS in plain Python."""
    if "tag" in f and m.tag != f["tag"]:
        return False
    if "contains" in f and f["contains"] not in (m.value or b""):
        return False
    n = int(m.properties["n"])
    if f.get("where") == "n > 6" and not n > 6:
        return False
    if f.get("where") == "n = 3 OR n = 4" and n not in (3, 4):
        return False
    return "regex" not in f or (m.value or b"").split(b" ")[1].endswith(b"7")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lo=st.integers(T0 - 20, T0 + 200),
    width=st.integers(0, 250),
    filters=FILTERS,
    limit=st.integers(1, 300),
    max_scan=st.sampled_from([None, None, 97, 700]),
    partition=st.sampled_from([None, None, 2]),
)
def test_time_order_pages_equal_brute_force(
    built: Built,
    lo: int,
    width: int,
    filters: dict[str, Any],
    limit: int,
    max_scan: int | None,
    partition: int | None,
) -> None:
    """Pages of every size, scan budgets down to one record: together, in order, exactly the
    matches sorted by (timestamp, partition, offset); a page cut by its limit is full."""
    path, msgs = built
    hi = lo + width
    expected = by_time([
        m for m in msgs
        if lo <= m.timestamp < hi and accepted(m, filters)
        and (partition is None or m.partition == partition)
    ])  # fmt: skip
    budget = {} if max_scan is None else {"max_scan": max_scan}
    with mqcore.open(path, read_only=True) as s:
        pages, reasons = page_all(s, start=lo, end=hi, order="time", limit=limit,
                                  partition=partition, **filters, **budget)  # fmt: skip
    assert [i for page in pages for i in page] == expected
    for page, reason in zip(pages, reasons, strict=True):
        assert reason in ("limit", "exhausted") if max_scan is None else True
        if reason == "limit":
            assert len(page) == limit
    if max_scan is None:
        assert len(pages) == len(expected) // limit + 1


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from([*KEYS, b"absent"]),
    window=st.sampled_from([(None, None), (T0 + 300, T0 + 1800)]),
    filters=FILTERS,
    limit=st.integers(1, 200),
    order=st.sampled_from(["time", "partition"]),
    max_scan=st.sampled_from([None, 1, 50]),
)
def test_key_with_filters_equals_brute_force(
    built: Built,
    key: bytes,
    window: tuple[int | None, int | None],
    filters: dict[str, Any],
    limit: int,
    order: str,
    max_scan: int | None,
) -> None:
    """search(key=...) with tag/contains/where/regex: the key index's hits that pass every
    filter, in either order, paged to the end."""
    path, msgs = built
    lo, hi = window
    found = [
        m for m in msgs
        if carries(m, key) and accepted(m, filters)
        and (lo is None or lo <= m.timestamp) and (hi is None or m.timestamp < hi)
    ]  # fmt: skip
    expected = by_time(found) if order == "time" else ids(found)
    budget = {} if max_scan is None else {"max_scan": max_scan}
    got, cursor = [], None
    with mqcore.open(path, read_only=True) as s:
        while True:
            r = s.search(TOPIC, key=key, start=lo, end=hi, order=order, limit=limit,
                         cursor=cursor, **filters, **budget)  # fmt: skip
            got += ids(r)
            if r.complete:
                break
            cursor = r.cursor
    assert got == expected


def greedy_merge(msgs: list[mqcore.Message]) -> Ids:
    """The reference merge: each partition's messages in offset order, the smallest
    (timestamp, partition, offset) head taken first."""
    streams = [
        [((m.timestamp, m.partition, m.offset), m) for m in msgs if m.partition == p]
        for p in range(PARTS)
    ]
    out: Ids = []
    heads = [(s[0][0], p, 0) for p, s in enumerate(streams) if s]
    heapq.heapify(heads)
    while heads:
        _, p, i = heapq.heappop(heads)
        out.append((p, streams[p][i][1].offset))
        if i + 1 < len(streams[p]):
            heapq.heappush(heads, (streams[p][i + 1][0], p, i + 1))
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=st.integers(1, 400), filters=FILTERS)
def test_timestamps_out_of_order_in_a_partition_merge_greedily(
    disordered: Built, limit: int, filters: dict[str, Any]
) -> None:
    """Where a partition's timestamps go back, the answer is the greedy merge of the
    partitions (each in offset order): every match once, none lost."""
    path, msgs = disordered
    with mqcore.open(path, read_only=True) as s:
        pages, _ = page_all(s, order="time", limit=limit, start=T0, **filters)
    got = [i for page in pages for i in page]
    assert got == greedy_merge([m for m in msgs if accepted(m, filters)])


def test_pages_beside_a_writer_are_a_prefix(tmp_path: object) -> None:
    """A writer thread appends (timestamps after all before) while pages are read: what the
    pages gave is at every step a prefix of the final answer, never a repeat or a gap, and
    paging on after the writer stops reaches the whole of it. A page that finds the end
    while the writer still runs is asked again (an exhausted answer has no cursor)."""
    with mqcore.open(str(tmp_path)) as s:
        s.create_topic(TOPIC, partitions=PARTS, segment_bytes=8 << 10)
        fill(s, 300, 5)
        done = threading.Event()

        def write() -> None:
            rng = random.Random(9)
            for i in range(400):
                s.append(TOPIC, b"late %d" % i, partition=rng.randrange(PARTS),
                         timestamp=T0 + 10_000 + i, tag="a")  # fmt: skip
            done.set()

        seen: list[Ids] = []
        got: Ids = []
        cursor = None
        writer = threading.Thread(target=write)
        writer.start()
        while True:
            last = done.is_set()
            r = s.search(TOPIC, start=T0, tag="a", order="time", limit=7, cursor=cursor)
            seen.append(got + ids(r))
            if r.complete and last:
                break
            if not r.complete:
                got, cursor = seen[-1], r.cursor
        writer.join()
        final = by_time([m for p in range(PARTS) for m in s.read(TOPIC, p, 0, 1 << 20)
                         if m.tag == "a"])  # fmt: skip
    assert seen[-1] == final and len(final) > 400 and len(seen) > 10
    for prefix in seen:
        assert prefix == final[: len(prefix)]


def test_a_page_reads_the_partitions_as_they_were_when_it_began(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages appended while a page is read wait for the next query: partition 0 is read to
    its end, then both partitions get a newer message before partition 1 is read. Had the page
    taken partition 1's and not partition 0's (older), its answer would not be a prefix of
    the log's order."""
    with mqcore.open(str(tmp_path)) as s:
        s.create_topic(TOPIC, partitions=2)
        for p in range(2):
            s.append_batch(TOPIC, [b"a", b"b"], partition=p, timestamps=[T0, T0 + 1])
        calls: list[int] = []
        real = engine.scan_partition

        def appending(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:
                s.append(TOPIC, b"new 0", partition=0, timestamp=T0 + 100)
                s.append(TOPIC, b"new 1", partition=1, timestamp=T0 + 101)
            return real(*args, **kwargs)

        monkeypatch.setattr("mqcore.query.merge.scan_partition", appending)
        r = s.search(TOPIC, start=T0, order="time", limit=10)
        final = by_time([m for p in range(2) for m in s.read(TOPIC, p, 0, 100)])
    assert len(calls) == 2 and r.complete
    assert ids(r) == final[: len(r)] == [(0, 0), (1, 0), (0, 1), (1, 1)]


@pytest.mark.parametrize(
    ("budget", "reason", "hi"), [({"max_scan": 1}, "max_scan", T0 + 52),
                                 ({"timeout": 0}, "timeout", T0 + 1000)]
)  # fmt: skip
def test_a_budget_of_one_record_still_makes_progress(
    built: Built, budget: dict[str, int], reason: str, hi: int
) -> None:
    """max_scan=1 or timeout=0: each page examines a record or more of every partition and
    returns a message once every partition has one at hand; paged to the end the answer is
    brute force's."""
    path, msgs = built
    lo = T0 + 40
    expected = by_time([m for m in msgs if lo <= m.timestamp < hi])
    with mqcore.open(path, read_only=True) as s:
        pages, reasons = page_all(s, start=lo, end=hi, order="time", limit=1000, **budget)
    assert [i for page in pages for i in page] == expected and len(expected) > 20
    assert len(pages) >= 2 and set(reasons[:-1]) == {reason}


def test_time_order_is_the_default_nowhere_in_the_api_and_cursors_say_their_order(
    built: Built,
) -> None:
    path, msgs = built
    with mqcore.open(path, read_only=True) as s:
        r = s.range(TOPIC, T0, T0 + 1000, limit=5)
        assert r.cursor is not None and r.cursor.startswith("c1-")
        assert ids(r) == ids(sorted(msgs, key=lambda m: (m.partition, m.offset)))[:5]
        t = s.range(TOPIC, T0, T0 + 1000, limit=5, order="time")
        assert t.cursor is not None and t.cursor.startswith("t1-")
        with pytest.raises(InvalidConfigError, match="resumes a query in time order"):
            s.range(TOPIC, T0, T0 + 1000, cursor=t.cursor)
        with pytest.raises(InvalidConfigError, match="resumes a query in partition order"):
            s.range(TOPIC, T0, T0 + 1000, cursor=r.cursor, order="time")
        with pytest.raises(InvalidConfigError, match="order must be 'partition' or 'time'"):
            s.search(TOPIC, tag="a", order="timestamp")


@pytest.mark.parametrize(
    "cursor",
    ["t1-", "t1-0", "t1-0.5-0.6", "t1-1.5-0.6", "t1-0.0", "t1-00.5", "t1-0.05", "t1--1.5",
     "t1-0.9223372036854775808", "t1-2147483648.1", "t1-0.5,1.6", "t2-0.5", " t1-0.5"],
)  # fmt: skip
def test_time_cursors_are_canonical(built: Built, cursor: str) -> None:
    """One text per position: a cursor the query did not write is refused, never resumed
    somewhere else."""
    with mqcore.open(built[0], read_only=True) as s:
        with pytest.raises(InvalidConfigError, match="cursor"):
            s.search(TOPIC, tag="a", order="time", cursor=cursor)


def test_ctrl_c_in_a_time_ordered_query_resumes_exactly(
    built: Built, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt in the middle of a fetch: QueryInterrupted carries what was
    returned and a cursor from which the rest follows, nothing repeated or lost."""
    path, msgs = built
    calls = []
    real = engine.scan_partition

    def interrupting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with mqcore.open(path, read_only=True) as s:
        monkeypatch.setattr("mqcore.query.merge.scan_partition", interrupting)
        with pytest.raises(QueryInterrupted) as stop:
            s.search(TOPIC, start=T0, order="time", limit=400)
        monkeypatch.undo()
        first = stop.value.result
        assert first.reason == "interrupted" and first.cursor and len(first) > 0
        rest, _ = page_all(s, start=T0, order="time", limit=100_000)
        resumed = s.search(TOPIC, start=T0, order="time", limit=100_000, cursor=first.cursor)
    assert ids(first) + ids(resumed) == by_time(msgs) == rest[0]


def test_a_search_by_key_needs_the_key_index(tmp_path: object) -> None:
    with mqcore.open(str(tmp_path)) as s:
        s.create_topic(TOPIC, key_index=False)
        s.append(TOPIC, b"x", key=b"k")
        with pytest.raises(InvalidConfigError, match="keeps no key index"):
            s.search(TOPIC, key="k", tag="a")
