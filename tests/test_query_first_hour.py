"""What a new user hits first in the query API (issue 17): reversed and implausible time bounds,
a selector naming a property no message has, Ctrl-C in a long scan, the IDs in to_arrow(), and
one name for the time bounds of every query."""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import mqcore
from mqcore.errors import ImplausibleTimeWarning, InvalidConfigError, QueryInterrupted
from mqcore.query import engine

T0 = 1_718_013_600_000  # 2024-06-10T10:00:00Z
TOPIC = "orders"
N = 600


def ids(msgs: Any) -> list[tuple[int, int]]:
    return [(m.partition, m.offset) for m in msgs]


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[mqcore.Message]]:
    """Three partitions of small segments; `service` on every message, `region` on some, a
    unique ID on some (the topic does not add them)."""
    path = str(tmp_path_factory.mktemp("first_hour") / "store")
    rng = random.Random(17)
    with mqcore.open(path) as s:
        s.create_topic(TOPIC, partitions=3, segment_bytes=4 << 10, unique_ids=False)
        for i in range(N):
            props = {"service": rng.choice(["payments", "billing"]), "n": str(i)}
            if i % 3 == 0:
                props["region"] = rng.choice("ab")
            s.append(
                TOPIC,
                b"order %d" % i,
                key=b"k%d" % (i % 7),
                partition=i % 3,
                timestamp=T0 + i * 1000,
                properties=props,
                tag=rng.choice(["TagA", "TagB"]),
                unique_id=f"01900000-0000-7000-8000-{i:012d}" if i % 2 else None,
            )
        msgs = [m for p in range(3) for m in s.read(TOPIC, p, 0, 10_000)]
    return path, msgs


QUERIES: dict[str, Callable[[mqcore.Store, int | None, int | None], mqcore.store.QueryResult]] = {
    "search": lambda s, lo, hi: s.search(TOPIC, start=lo, end=hi),
    "range": lambda s, lo, hi: s.range(TOPIC, lo, hi),
    "find_by_key": lambda s, lo, hi: s.find_by_key(TOPIC, b"k1", start=lo, end=hi),
    "find_by_unique_id": lambda s, lo, hi: s.find_by_unique_id(
        "01900000-0000-7000-8000-000000000001", start=lo, end=hi
    ),
}


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_reversed_time_range_is_refused(
    orders: tuple[str, list[mqcore.Message]], query: str
) -> None:
    path, _ = orders
    with mqcore.open(path, read_only=True) as s:
        assert len(QUERIES[query](s, T0, T0 + N * 1000)) > 0  # the window holds matches
        with pytest.raises(InvalidConfigError, match=r"start .* is after end .*reversed"):
            QUERIES[query](s, T0 + N * 1000, T0)


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_equal_bounds_are_the_empty_range(
    orders: tuple[str, list[mqcore.Message]], query: str
) -> None:
    path, _ = orders
    with mqcore.open(path, read_only=True) as s:
        r = QUERIES[query](s, T0 + 1000, T0 + 1000)  # message 1 is at T0 + 1000
        assert len(r) == 0 and r.reason == "exhausted"


@pytest.mark.parametrize(
    ("bound", "unit"),
    [
        (T0 // 1000, "seconds"),
        (T0 * 1000, "microseconds"),
        (T0 * 1_000_000, "nanoseconds"),
        (5, None),  # before 2001 and no unit fits
    ],
)
@pytest.mark.parametrize("query", sorted(QUERIES))
def test_implausible_bound_warns_with_the_likely_unit(
    orders: tuple[str, list[mqcore.Message]], query: str, bound: int, unit: str | None
) -> None:
    path, _ = orders
    with mqcore.open(path, read_only=True) as s:
        with pytest.warns(ImplausibleTimeWarning) as caught:
            QUERIES[query](s, bound, None)
        assert len(caught) == 1
        text = str(caught[0].message)
        assert text.startswith(f"start={bound} is ")
        if unit is None:
            assert "looks like" not in text
        else:
            assert f"looks like {unit}" in text and "2024-06-10T10:00:00.000Z" in text
        # the warning names the line that passed the value, not mqcore's inside
        assert caught[0].filename == __file__


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_plausible_and_unbounded_bounds_do_not_warn(
    orders: tuple[str, list[mqcore.Message]], query: str
) -> None:
    path, _ = orders
    with mqcore.open(path, read_only=True) as s, warnings.catch_warnings():
        warnings.simplefilter("error")
        for lo, hi in [(None, None), (0, None), (T0, T0 + 5000), (None, (1 << 63) - 1)]:
            QUERIES[query](s, lo, hi)


def test_missing_properties_name_what_no_message_carried(
    orders: tuple[str, list[mqcore.Message]],
) -> None:
    path, msgs = orders
    cases = {
        "service = payments": ["payments"],  # the unquoted string: a second property
        "service = 'payments'": [],
        "region = 'a' OR colour = 'red'": ["colour"],
        "zone IS NULL AND TAGS = 'TagA'": ["zone"],
    }
    with mqcore.open(path, read_only=True) as s:
        for where, expected in cases.items():
            r = s.search(TOPIC, where=where)
            assert r.reason == "exhausted"
            assert list(r.missing_properties or ()) == expected, where
        # only the messages the selector examined count: region is on every third message
        # only, so a window without one of them has it missing
        holding = [m for m in msgs if "region" in m.properties]
        lo = min(m.timestamp for m in holding) + 1
        hi = min(m.timestamp for m in holding if m.timestamp > lo)
        window = [m for m in msgs if lo <= m.timestamp < hi]
        assert window and not any("region" in m.properties for m in window)
        r = s.search(TOPIC, where="region = 'a'", start=lo, end=hi)
        assert r.missing_properties == ("region",)
        # no selector, or a selector that examined nothing: None
        assert s.search(TOPIC, contains=b"order").missing_properties is None
        assert s.search(TOPIC, where="x = 1", start=T0 - 5000, end=T0).missing_properties is None
        assert s.find_by_key(TOPIC, b"k1").missing_properties is None


def test_to_arrow_has_msg_id_and_unique_id(orders: tuple[str, list[mqcore.Message]]) -> None:
    pa = pytest.importorskip("pyarrow")
    path, msgs = orders
    with mqcore.open(path, read_only=True) as s:
        r = s.search(TOPIC, contains=b"order", limit=N)
        table = r.to_arrow()
    assert len(r) == N
    assert table.schema.field("msg_id").type == pa.string()
    assert not table.schema.field("msg_id").nullable
    assert table.schema.field("unique_id").type == pa.string()
    assert table.column("msg_id").to_pylist() == [m.msg_id for m in r]
    assert table.column("unique_id").to_pylist() == [m.unique_id for m in r]
    assert {m.unique_id is None for m in msgs} == {True, False}  # both kinds are there
    assert table.column("offset").to_pylist() == [m.offset for m in r]


def test_range_takes_start_and_end_like_search(orders: tuple[str, list[mqcore.Message]]) -> None:
    path, _ = orders
    lo, hi = T0 + 10_000, T0 + 90_000
    with mqcore.open(path, read_only=True) as s:
        expected = ids(s.search(TOPIC, start=lo, end=hi))
        assert expected
        assert ids(s.range(TOPIC, start=lo, end=hi)) == expected
        assert ids(s.range(TOPIC, lo, hi)) == expected
        with pytest.warns(
            DeprecationWarning,
            match=r"(start_ts= is deprecated, use start=|end_ts= is deprecated, use end=)",
        ) as w:
            assert ids(s.range(TOPIC, start_ts=lo, end_ts=hi)) == expected
        assert len(w) == 2 and {x.filename for x in w} == {__file__}
        with pytest.raises(InvalidConfigError, match="both start= and its deprecated name"):
            s.range(TOPIC, lo, hi, start_ts=lo)


def brute_force(msgs: list[mqcore.Message]) -> list[tuple[int, int]]:
    return ids(m for m in msgs if m.properties.get("service") == "payments")


def interrupt_at(k: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """`real`, raising KeyboardInterrupt (as Ctrl-C would) on its k-th call instead."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == k:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize(
    ("where", "k"),
    [("selector_view", k) for k in (1, 2, 57, 200, 401, 599)]
    + [("scan_records", k) for k in (1, 2, 3, 5, 8)],
)
def test_interrupted_scan_resumes_where_it_stopped(
    orders: tuple[str, list[mqcore.Message]],
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    k: int,
) -> None:
    """Ctrl-C inside the Python filter (between candidates) or at a kernel call: QueryInterrupted
    carries what was found and a cursor from which the rest, and only the rest, is found. The
    kernel evaluates `service = 'payments'` itself; a property compared with a property keeps
    the selector in Python (with `other` missing, the OR is TRUE exactly where the first is)."""
    path, msgs = orders
    selector = "service = 'payments'"
    if where == "selector_view":
        selector += " OR service = other"
    with mqcore.open(path, read_only=True) as s:
        with monkeypatch.context() as patch:
            patch.setattr(engine, where, interrupt_at(k, getattr(engine, where)))
            with pytest.raises(KeyboardInterrupt) as stop:  # code that does not look stops
                s.search(TOPIC, where=selector)
        assert isinstance(stop.value, QueryInterrupted)
        first = stop.value.result
        assert first.reason == "interrupted" and first.cursor is not None
        rest = s.search(TOPIC, where=selector, cursor=first.cursor)
        assert rest.reason == "exhausted"
    assert ids(first) + ids(rest) == brute_force(msgs)
