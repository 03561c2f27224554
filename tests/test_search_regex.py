"""Regex searches (issue 32): the literal a pattern requires (query/pattern.py
required_literal) prefilters records in the scan kernel, so it must be in every text the
pattern matches. Patterns are generated with a text each matches by construction, RE2 checks
the pair, and the literal must be in the text; searches with a literal equal brute force."""

from __future__ import annotations

import os
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mqcore
from mqcore.query import engine
from mqcore.query.pattern import compile_pattern, required_literal

PLAIN = b"abcXYZ019 _-=:/,\"'<>@#%&~!`;"  # bytes that stand for themselves
PUNCT = b".*+?()[]{}|^$\\/"  # escaped, they stand for themselves


def atom(data: st.DataObject, folded: bool) -> tuple[bytes, bytes]:
    """(pattern, a text it matches) for one element; `folded`: a flag group (?i) before it,
    so its letters may match in either case."""
    kind = data.draw(st.sampled_from(["plain", "plain", "plain", "punct", "dot", "class",
                                      "escape", "brace", "group"]))  # fmt: skip
    if kind == "plain":
        c = bytes([data.draw(st.sampled_from(PLAIN))])
        return c, c.swapcase() if folded and data.draw(st.booleans()) else c
    if kind == "punct":
        c = bytes([data.draw(st.sampled_from(PUNCT))])
        return b"\\" + c, c
    if kind == "dot":
        return b".", bytes([data.draw(st.sampled_from(b"a.Z\t\xff"))])
    if kind == "class":
        return data.draw(st.sampled_from([(b"[a-c]", b"b"), (b"[^x]", b"y"), (b"[]a]", b"]"),
                                          (b"[[:digit:]]", b"7"), (b"[\\]x]", b"]")]))  # fmt: skip
    if kind == "escape":
        return data.draw(st.sampled_from([(b"\\d", b"4"), (b"\\w", b"q"), (b"\\s", b" "),
                                          (b"\\x41", b"A"), (b"\\x{42}", b"B"), (b"\\n", b"\n"),
                                          (b"\\C", b"\x00")]))  # fmt: skip
    if kind == "brace":
        return data.draw(st.sampled_from([(b"{", b"{"), (b"}", b"}"), (b"]", b"]"),
                                          (b"{,2}", b"{,2}"), (b"{x}", b"{x}")]))  # fmt: skip
    return group(data, folded)


def group(data: st.DataObject, folded: bool) -> tuple[bytes, bytes]:
    opening = data.draw(st.sampled_from([b"(", b"(?:", b"(?P<g>", b"(?i:"]))
    inner, text = sequence(data, folded or opening == b"(?i:", depth=1)
    if data.draw(st.booleans()):
        other, other_text = sequence(data, folded or opening == b"(?i:", depth=1)
        inner, text = inner + b"|" + other, data.draw(st.sampled_from([text, other_text]))
    return opening + inner + b")", text


def quantified(data: st.DataObject, folded: bool) -> tuple[bytes, bytes]:
    pattern, text = atom(data, folded)
    if pattern in (b"{,2}", b"{x}"):
        return pattern, text  # nothing to repeat, or not one element
    q, low, high = data.draw(st.sampled_from([(b"", 1, 1), (b"", 1, 1), (b"*", 0, 3),
                                              (b"+", 1, 3), (b"?", 0, 1), (b"{0,2}", 0, 2),
                                              (b"{1,3}", 1, 3), (b"{2}", 2, 2), (b"*?", 0, 2),
                                              (b"+?", 1, 2)]))  # fmt: skip
    if q and len(pattern) > 1 and pattern[-1:] in (b"{", b"}") and pattern[:1] != b"\\":
        return pattern, text
    return pattern + q, text * data.draw(st.integers(low, high))


def sequence(data: st.DataObject, folded: bool, depth: int = 0) -> tuple[bytes, bytes]:
    pattern, text = b"", b""
    for _ in range(data.draw(st.integers(1, 6 if depth == 0 else 3))):
        if depth == 0 and data.draw(st.integers(0, 9)) == 0:
            pattern += b"(?i)"
            folded = True
            continue
        p, t = quantified(data, folded) if depth < 2 else atom(data, folded)
        if pattern.endswith(b"{") and p[:1].isdigit():
            continue  # "{" then digits could form a repetition
        pattern, text = pattern + p, text + t
    return pattern, text


@settings(max_examples=1000, deadline=None)  # new cases each run; 3,000 took 12 s
@given(data=st.data(), prefix=st.binary(max_size=6), suffix=st.binary(max_size=6))
def test_the_required_literal_is_in_every_match(
    data: st.DataObject, prefix: bytes, suffix: bytes
) -> None:
    pattern, text = sequence(data, folded=False)
    if data.draw(st.integers(0, 5)) == 0:
        other, other_text = sequence(data, folded=False)
        pattern, text = pattern + b"|" + other, data.draw(st.sampled_from([text, other_text]))
    try:
        compiled = compile_pattern(pattern)
    except mqcore.errors.InvalidConfigError:
        return  # a pattern RE2 refuses (a repeated empty group, ...) is never searched
    haystack = prefix + text + suffix
    assert compiled.search(haystack), (pattern, haystack)  # the generator's own check
    literal = required_literal(pattern)
    assert literal is None or literal in haystack, (pattern, literal, haystack)


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        (rb'"POST /api/orders/[0-9]+ HTTP/1.1" 5\d\d', b'"POST /api/orders/'),
        (rb"error: \d+ failed", b"error: "),
        (rb"ab+c", b"ab"),
        (rb"abc?d", b"ab"),
        (rb"hello(?i)world", b"hello"),
        (rb"\$\{HOME\}", b"${HOME}"),
        (rb"x[[:alpha:]]yz", b"yz"),
        (rb"timeout after \d{5,}ms|status=9\d\d", None),
        (rb"(?i)timeout", None),
        (rb"\Qab\E*cd", None),
        (rb"\101bc", None),
        (rb"a.b.c", None),
    ],
)
def test_literals_of_known_patterns(pattern: bytes, literal: bytes | None) -> None:
    assert required_literal(pattern) == literal


def test_a_regex_with_a_literal_decodes_only_the_records_holding_it(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel passes over the records without the literal: a regex search returns what
    brute force over every value gives, and the kernel hands Python only the records that
    hold the literal (it handed over every record), while scanned_records counts them all."""
    candidates: list[int] = []
    scan_chunk = engine.scan_chunk

    def counting(*args: Any, **kwargs: Any) -> Any:
        r = scan_chunk(*args, **kwargs)
        candidates.append(len(r.messages))
        return r

    monkeypatch.setattr(engine, "scan_chunk", counting)
    rng = random.Random(3)
    with mqcore.open(str(tmp_path)) as s:
        s.create_topic("logs", partitions=2)
        for _ in range(20):
            s.append_batch("logs", [
                b'10.0.0.%d "%s /api/orders/%d HTTP/1.1" %d' % (
                    rng.randrange(9), rng.choice([b"GET", b"GET", b"GET", b"POST"]),
                    rng.randrange(999), rng.choice([200, 500, 503]))
                for _ in range(200)
            ], partition=rng.randrange(2), compression=rng.choice(["none", "zstd"]))  # fmt: skip
        every = [m for p in range(2) for m in s.read("logs", p, 0, 1 << 20)]
        pattern = rb'"POST /api/orders/[0-9]+ HTTP/1.1" 5\d\d'
        r = s.search("logs", regex=pattern, limit=100_000)
        expected = [(m.partition, m.offset) for m in every if re.search(pattern, m.value)]
        assert [(m.partition, m.offset) for m in r] == expected and r.complete
        assert r.scanned_records == len(every)
        holding = [m for m in every if b'"POST /api/orders/' in m.value]
        assert sum(candidates) == len(holding) < len(every) / 2


def log_bytes(path: str, topic: str, partitions: int) -> int:
    return sum(
        os.path.getsize(os.path.join(path, f"{topic}-{p}", name))
        for p in range(partitions)
        for name in os.listdir(os.path.join(path, f"{topic}-{p}"))
        if name.endswith(".log")
    )


@pytest.mark.parametrize("order", ["partition", "time"])
@pytest.mark.parametrize(
    "query",
    [{"regex": rb"\d{9}"}, {"contains": b"absent"}, {"regex": rb"\d{9}", "max_scan": 1500},
     {"contains": b"absent", "max_scan": 777}, {"where": "n > 100"}],
)  # fmt: skip
def test_scanned_bytes_count_each_batch_once(
    tmp_path: object, query: dict[str, Any], order: str
) -> None:
    """A full scan reports the bytes of the log it read, each batch once: a regex whose
    candidates are every record (kernel calls that stop inside batches, 4096 candidates
    each) or a scan resumed by cursor every few hundred records used to count the batch it
    resumed in again (870 MiB of 701)."""
    path = str(tmp_path)
    with mqcore.open(path) as s:
        s.create_topic("t", partitions=2)
        for i in range(24):
            s.append_batch("t", [b"line %d" % j for j in range(1000)], partition=i % 2,
                           properties=[{"n": str(j)} for j in range(1000)],
                           compression=["none", "zstd"][i // 2 % 2])  # fmt: skip
        s.flush()
        total, cursor = 0, None
        while True:
            r = s.search("t", limit=100_000, cursor=cursor, order=order, **query)
            total += r.scanned_bytes
            if r.complete:
                break
            cursor = r.cursor
    assert total == log_bytes(path, "t", 2)
