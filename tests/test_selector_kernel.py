"""The selector kernel (_ext/selector_impl.h, run by search.pyx's scan) against the Python
evaluator it mirrors (query/selector.py over Message.properties, the reference): random
selectors on random header sets agree on TRUE, FALSE and UNKNOWN for every message, the
RocketMQ case table gives the same answers through both paths, and bad header bytes never
crash the kernel."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore._ext.batch import Message
from mqcore._ext.encode import encode_batch
from mqcore._ext.search import scan_records
from mqcore.errors import SelectorSyntaxError
from mqcore.query.engine import selector_view
from mqcore.query.selector import Selector, compile_selector
from tests.test_selector import CASES, numeric_texts

Headers = list[tuple[str, bytes | None]]
NO_END = (1 << 63) - 1
NO_START = -(1 << 63)


def varint(n: int) -> bytes:
    """Kafka's zigzag varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte, z = z & 0x7F, z >> 7
        out.append(byte | 0x80 if z else byte)
        if not z:
            return bytes(out)


def encode_headers(headers: Headers) -> bytes:
    """A record's header area in Kafka's v2 encoding."""
    out = b""
    for key, value in headers:
        raw = key.encode("utf-8", "surrogateescape")
        out += varint(len(raw)) + raw
        out += varint(-1) if value is None else varint(len(value)) + value
    return out


def reference(selector: Selector, headers: Headers) -> bool | None:
    """What the Python evaluator says of a message carrying `headers`."""
    return selector.evaluate(selector_view(Message("t", 0, 0, 0, headers=headers)))


def kernel(selector: Selector, headers: Headers) -> bool | None:
    assert selector.program is not None, selector.text
    return selector.program.evaluate(encode_headers(headers), len(headers))


# ---- the RocketMQ case table through both paths -------------------------------------------


KERNEL_CASES = [case for case in CASES if compile_selector(case[0]).program is not None]


@pytest.mark.parametrize(("text", "props", "expected"), KERNEL_CASES)
def test_case_table_through_the_kernel(
    text: str, props: dict[str, str], expected: bool | None
) -> None:
    """Every case the kernel takes (not a property against a property): the same answer."""
    selector = compile_selector(text)
    headers = [(k, v.encode()) for k, v in props.items()]
    assert kernel(selector, headers) is expected
    assert reference(selector, headers) is expected


def test_most_of_the_case_table_runs_in_the_kernel() -> None:
    assert len(KERNEL_CASES) >= 0.85 * len(CASES)


@pytest.mark.parametrize(
    "text", ["a > b", "a = b", "a NOT BETWEEN b AND 'z'", "x = 1 OR a <> b", "NOT (a < b)"]
)
def test_property_against_property_falls_back_to_python(text: str) -> None:
    selector = compile_selector(text)
    assert selector.program is None
    assert selector.evaluate({"a": "2", "b": "10"}) in (True, False, None)


def test_more_names_than_the_kernel_holds_fall_back_to_python() -> None:
    many = " OR ".join(f"p{i} = '{i}'" for i in range(65))
    assert compile_selector(many).program is None
    assert compile_selector(" OR ".join(f"p{i} = '{i}'" for i in range(64))).program is not None


# ---- random selectors and header sets ----------------------------------------------------

NAMES = ["a", "b", "TAGS", "tag", "uid"]
TRICKY = [
    "", " ", "NaN", "nan", "inf", "-inf", "Infinity", "1e5", "1E+5", ".5", "5.", ".", "+", "-",
    "-0", "+0", "007", " 42 ", "\u30004\u3000", "\x1c5\x1f", "\u00a01.5\u2028", "\x855\x85",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "18446744073709551616", "1e309", "-1e309", "1e-400", "4.9e-324",
    "2.4703282292062327e-324", "2.4703282292062328e-324", "1.7976931348623157e308",
    "1.7976931348623158e308", "1.7976931348623159e308", "TRUE", " false ", "True ", "tru",
    "é", "日本", "\U0001f600", "0x10", "1_000", "١٢٣", "1.5e", "e5", "--1", "+-1", "1 2",
    "1.", "0.1", "0.10000000000000001", "x", "eu", "red", "'", "''", "a'b", "\u212a",
]  # fmt: skip
ORDER_OPS = ["=", "<>", "<", "<=", ">", ">="]

header_values = st.one_of(
    st.sampled_from(TRICKY).map(str.encode),
    numeric_texts().map(str.encode),
    st.text(max_size=6).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=6),  # mostly not UTF-8: no property
    st.none(),
)
header_sets = st.lists(
    st.tuples(st.sampled_from([*NAMES, "c", "A", "region"]), header_values), max_size=6
)


def quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


literals = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["0", "-0", "1", "42", "007", str(2**63 - 1), str(-(2**63))]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["1.5", "0.0", "-0.0", "1e5", "4.9e-324", "1.7976931348623157e308"]),
    st.sampled_from(TRICKY).map(quoted),
    st.text(max_size=4).map(quoted),
    st.sampled_from(["TRUE", "FALSE", "NULL"]),
)
in_items = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(TRICKY).map(quoted),
)


@st.composite
def leaves(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    lit = draw(literals)
    kind = draw(st.integers(0, 7))
    if kind == 0:
        op = draw(st.sampled_from(ORDER_OPS if lit not in ("TRUE", "FALSE") else ["=", "<>"]))
        return f"{name} {op} {lit}"
    if kind == 1:  # the literal first: the comparison is mirrored
        op = draw(st.sampled_from(ORDER_OPS if lit not in ("TRUE", "FALSE") else ["=", "<>"]))
        return f"{lit} {op} {name}"
    if kind == 2:
        low, high = draw(literals), draw(literals)
        neg = draw(st.sampled_from(["", "NOT "]))
        return f"{name} {neg}BETWEEN {low} AND {high}"
    if kind == 3:
        items = draw(st.lists(in_items, min_size=1, max_size=4))
        return f"{name} {draw(st.sampled_from(['', 'NOT ']))}IN ({', '.join(items)})"
    if kind == 4:
        return f"{name} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 5:
        test = draw(st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]))
        needle = draw(st.one_of(st.sampled_from(["", "e", "1", "日", "'"]), st.text(max_size=3)))
        return f"{name} {draw(st.sampled_from(['', 'NOT ']))}{test} {quoted(needle)}"
    if kind == 6:  # literal against literal: folded to a constant
        op = draw(st.sampled_from(["=", "<>"]))
        return f"{lit} {op} {draw(literals)}"
    return f"{lit} IS NULL"


random_selectors = st.recursive(
    leaves(),
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=4).map(lambda p: " AND ".join(f"({s})" for s in p)),
        st.lists(inner, min_size=2, max_size=4).map(lambda p: " OR ".join(f"({s})" for s in p)),
        inner.map(lambda s: f"NOT ({s})"),
    ),
    max_leaves=10,
)


def compiled(text: str) -> Selector:
    try:
        return compile_selector(text)
    except SelectorSyntaxError:  # e.g. BETWEEN's bounds reversed, TRUE < x
        assume(False)
        raise


# 400 examples a run (was 800: 15 s of the suite); each run draws new ones, and
# fuzz/fuzz_selector.py checks the same agreement coverage-guided.
@settings(max_examples=400, deadline=None)
@given(random_selectors, st.lists(header_sets, min_size=1, max_size=8))
def test_kernel_agrees_with_the_python_evaluator(text: str, messages: list[Headers]) -> None:
    selector = compiled(text)
    for headers in messages:
        assert kernel(selector, headers) is reference(selector, headers), (text, headers)


@settings(max_examples=300, deadline=None)
@given(
    numeric_texts(),
    st.one_of(
        st.integers(-(2**63), 2**63 - 1).map(str),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
    ),
    st.sampled_from(ORDER_OPS),
)
def test_numeric_coercion_agrees_on_long_numbers(value: str, literal: str, op: str) -> None:
    """Up to 6,000 digits, with fractions and exponents: the integer rule past int64 and the
    float rule's rounding (the kernel hands strtod at most 801 significant digits)."""
    selector = compile_selector(f"a {op} {literal}")
    headers: Headers = [("a", value.encode())]
    assert kernel(selector, headers) is reference(selector, headers)


def test_whitespace_the_kernel_strips_is_pythons() -> None:
    """The kernel's white space is exactly str.isspace(): each code point around a number."""
    selector = compile_selector("a = 5")
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        headers: Headers = [("a", (chr(code) + "5").encode())]
        assert kernel(selector, headers) is reference(selector, headers), hex(code)


def test_boolean_coercion_folds_ascii_case_only() -> None:
    """`text.strip().lower()` is 'true'/'false' for no text the ASCII fold misses."""
    selector = compile_selector("a = TRUE")
    for text in ["true", "TRUE", "tRuE", " true\t", "\u212aTRUE", "truE\u0130", "ture", "true1"]:
        headers: Headers = [("a", text.encode())]
        assert kernel(selector, headers) is reference(selector, headers), text
    for code in range(0x80, 0x110000):
        if not 0xD800 <= code <= 0xDFFF:
            assert not any(c in "truefalsTRUEFALS" for c in chr(code).lower()), hex(code)


@settings(max_examples=300, deadline=None)
@given(random_selectors, st.binary(max_size=40), st.integers(-2, 8))
def test_bad_header_bytes_never_crash(text: str, raw: bytes, count: int) -> None:
    """Any bytes and any header count: an answer, never a crash (the scan's record cursor
    refuses such records before the kernel sees them; the kernel stays safe anyway)."""
    selector = compiled(text)
    assert selector.program is not None
    assert selector.program.evaluate(raw, count) in (True, False, None)


# ---- through the scan: matches, the budget and the names seen ----------------------------


def batch_bytes(messages: list[Headers]) -> bytes:
    batch = encode_batch([b"v%d" % i for i in range(len(messages))], headers=messages)
    batch.set_base_offset(0)
    return bytes(batch.tobytes())


def scan(data: bytes, selector: Selector) -> tuple[list[int], int]:
    r = scan_records(
        data, 0, "t", 0, 0, NO_END, NO_START, NO_END, limit=10_000, selector=selector.program
    )
    return [m.offset for m in r.messages], r.properties_seen


@settings(max_examples=200, deadline=None)
@given(random_selectors, st.lists(header_sets, min_size=1, max_size=12))
def test_scan_keeps_exactly_the_true_messages(text: str, messages: list[Headers]) -> None:
    selector = compiled(text)
    negated = compile_selector(f"NOT ({text})")
    data = batch_bytes(messages)
    decoded = scan_records(data, 0, "t", 0, 0, NO_END, NO_START, NO_END, limit=10_000).messages
    views = [selector_view(m) for m in decoded]
    true, seen = scan(data, selector)
    false, _ = scan(data, negated)
    assert true == [m.offset for m, v in zip(decoded, views, strict=True) if selector.matches(v)]
    assert false == [m.offset for m, v in zip(decoded, views, strict=True) if negated.matches(v)]
    carried = {n for n in selector.properties if any(n in v for v in views)}
    names = selector.program_names
    assert {names[k] for k in range(len(names)) if seen >> k & 1} & selector.properties == carried


def test_scan_with_a_selector_and_a_tag_needs_both() -> None:
    messages: list[Headers] = [
        [("tag", b"red"), ("region", b"eu")],
        [("tag", b"blue"), ("region", b"eu")],
        [("tag", b"red"), ("region", b"us")],
    ]
    data = batch_bytes(messages)
    selector = compile_selector("region = 'eu' AND TAGS = 'red'")
    r = scan_records(
        data, 0, "t", 0, 0, NO_END, NO_START, NO_END, tag=b"red", selector=selector.program
    )
    assert [m.offset for m in r.messages] == [0]
    assert r.records_scanned == 3


def test_selector_program_rejects_malformed_ops() -> None:
    from mqcore._ext.search import SELECTOR_CODES, SelectorProgram

    cmp = SELECTOR_CODES["cmp_str"]
    with pytest.raises(ValueError, match="slot"):
        SelectorProgram([(cmp, 0, False, 3, 0, 0, 0.0, b"x")], [b"a"], 1)
    with pytest.raises(ValueError, match="at least one op"):
        SelectorProgram([], [b"a"], 1)
    with pytest.raises(ValueError, match="at most"):
        SelectorProgram([(cmp, 0, False, 0, 0, 0, 0.0, b"x")], [b"n"] * 65, 1)


# ---- the store's paths: consumer poll and search() --------------------------------------

STORE_WHERE = [
    "region = 'eu' AND n >= 10",  # the kernel
    "region = 'eu' AND n >= 10 AND (n > m OR n <= m)",  # a property against a property: Python
    "TAGS = 'red' OR n IN (3, 4.0, '5')",
    "nosuch = 1 OR region <> 'us'",
]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mqcore.Store]:
    store = mqcore.open(str(tmp_path_factory.mktemp("sel")))
    store.create_topic("t", partitions=2)
    regions = ["eu", "us", "eu ", ""]
    for b in range(6):
        idx = range(b * 50, (b + 1) * 50)
        store.append_batch(
            "t",
            [b"v%d" % i for i in idx],
            partition=b % 2,
            tags=["red" if i % 3 == 0 else "blue" for i in idx],
            properties=[{"region": regions[i % 4], "n": str(i), "m": "7"} for i in idx],
        )
    yield store
    store.close()


def everything(store: mqcore.Store) -> list[mqcore.Message]:
    return [m for p in (0, 1) for m in store.read("t", p, 0, 1000)]


@pytest.mark.parametrize("where", STORE_WHERE)
def test_poll_and_search_match_the_python_evaluator(filled: mqcore.Store, where: str) -> None:
    selector = compile_selector(where)
    truth = {
        (m.partition, m.offset) for m in everything(filled) if selector.matches(selector_view(m))
    }
    assert truth
    found = filled.search("t", where=where, limit=10_000)
    assert {(m.partition, m.offset) for m in found.messages} == truth
    assert found.missing_properties == (("nosuch",) if "nosuch" in where else ())
    consumer = filled.consumer(f"g-{STORE_WHERE.index(where)}", "t", where=where)
    try:
        polled: set[tuple[int, int]] = set()
        for _ in range(50):
            polled |= {(m.partition, m.offset) for m in consumer.poll(7)}
        assert polled == truth
    finally:
        consumer.close()


def test_poll_with_a_tag_and_a_kernel_selector(filled: mqcore.Store) -> None:
    where = "n < 100 AND region = 'eu'"
    selector = compile_selector(where)
    truth = {
        (m.partition, m.offset)
        for m in everything(filled)
        if m.tag == "red" and selector.matches(selector_view(m))
    }
    consumer = filled.consumer("g-tag", "t", tag="red", where=where)
    try:
        polled: set[tuple[int, int]] = set()
        for _ in range(20):
            polled |= {(m.partition, m.offset) for m in consumer.poll(3)}
        assert polled == truth and truth
    finally:
        consumer.close()
