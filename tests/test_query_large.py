"""Issue 3 acceptance at scale: on one store of 2 million messages (4 partitions, dozens of
segments each) every query kind returns exactly what a brute-force scan of the store returns.

The store is built once per module with `append_batch` (mixed codecs, duplicate and null keys,
extra `keys` words, tags, properties, shuffled timestamps, keys crafted to share key-index
slots), closed, and reopened read-only so every index comes from disk. The brute force reads
every message once with `read_arrow` into numpy columns; the queries are drawn by hypothesis and
each result is compared message for message, including its reason and cursor.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import xxhash
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import mqcore
from mqcore._ext.hashing import KEY_SEED
from mqcore.query.ids import encode_msg_id, uid_text

TOPIC = "events"
PARTITIONS = 4
MESSAGES = 2_000_000
SEGMENT_BYTES = 1 << 20  # rolls on size and on a full key index both happen
KEY_INDEX_ENTRIES = 1 << 15  # 16384 slots: chains of about two entries in a full segment
SEED = 20240611
T0 = 1_700_000_000_000
STEP_MS = 5  # the stream's clock advances 5 ms a message: 10,000 s for 2M messages
SPAN_MS = MESSAGES * STEP_MS
JITTER_MS = 30_000  # producers' clocks disagree by up to 30 s either way
LATE_MS = 300_000  # 0.5 % of messages arrive up to 5 minutes late
DAY_MS = 86_400_000
COLLIDE_BITS = 20  # crafted keys share their hash's low 20 bits: the same slot up to 2^20 slots
COLLIDING_PAIRS = 40

CODECS = ["none", "lz4", "zstd", "gzip", "snappy"]
CODEC_WEIGHTS = [0.4, 0.25, 0.25, 0.05, 0.05]
TAGS = ["TagA", "TagB", "TagC"]
REGIONS = ["eu", "us", "ap"]
AMOUNTS = [str(i) for i in range(100)] + ["-7", "3.5", "12.50", "abc", ""]
LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
SERVICES = ["auth", "billing", "cart", "search", "gateway", "orders", "mailer"]
METHODS = ["GET", "GET", "POST", "PUT"]
PATHS = ["/api/v1/users", "/api/v1/cart", "/api/v2/orders", "/health", "/login", "/api/v1/items"]
STATUSES = [200, 200, 200, 201, 204, 301, 404, 500]
RARE = b"OutOfMemoryError"
NEEDLES = [RARE, b"status=500", b"/api/v2/orders", b"segfault"]


def user_key(n: int) -> bytes:
    return b"user-%07d" % n


HOT_KEYS = 500  # user-0000000 .. user-0000499: about 600 messages each
WARM_KEYS = 60_000  # about 20 messages each
COLD_KEYS = 10_000_000  # mostly one or two messages each
ABSENT_KEYS = [b"user-x", b"", b"user-99999999", b"trace-zzzzz", b"order-"]


# -- the corpus: what is appended, in append order -----------------------------------------------


def colliding_keys() -> list[bytes]:
    """COLLIDING_PAIRS pairs of keys whose xxHash64 values share the low COLLIDE_BITS bits, so
    each pair lands in one slot of any key index with up to 2^COLLIDE_BITS slots."""
    seen: dict[int, bytes] = {}
    out: list[bytes] = []
    i = 0
    while len(out) < 2 * COLLIDING_PAIRS:
        key = b"order-%d" % i
        low = xxhash.xxh64_intdigest(key, KEY_SEED) & ((1 << COLLIDE_BITS) - 1)
        other = seen.pop(low, None)
        if other is None:
            seen[low] = key
        else:
            out += [other, key]
        i += 1
    return out


@dataclass
class Corpus:
    """Every appended message's fields (append order) and how they were cut into batches."""

    values: list[bytes | None]
    keys: list[bytes | None]
    timestamps: np.ndarray
    tag: np.ndarray  # index into TAGS, -1 none
    region: np.ndarray  # index into REGIONS, -1 none
    amount: np.ndarray  # index into AMOUNTS, -1 none
    extra: dict[int, bytes]  # message -> its `keys` header
    batches: list[tuple[int, int, int, str, bool]]  # (start, stop, partition, codec, via_api)
    crafted: list[bytes]


def log_lines(rng: np.random.Generator, n: int) -> list[bytes | None]:
    """Short access-log lines (30-80 B); a few carry RARE, a few are tombstones (None)."""
    prefixes = [
        f"{a} {b} {c} {d} status={e} ".encode()
        for a in LEVELS
        for b in SERVICES
        for c in METHODS
        for d in PATHS
        for e in STATUSES
    ]
    took = [b"%dms" % i for i in range(3000)]
    picks = rng.integers(0, len(prefixes), n).tolist()
    millis = rng.integers(1, 3000, n).tolist()
    lines: list[bytes | None] = [prefixes[a] + took[b] for a, b in zip(picks, millis, strict=True)]
    for i in np.flatnonzero(rng.random(n) < 0.0003).tolist():
        lines[i] = b"ERROR %s java.lang.%s: Java heap space" % (SERVICES[i % 7].encode(), RARE)
    for i in np.flatnonzero(rng.random(n) < 0.0005).tolist():
        lines[i] = None
    return lines


def shuffled_timestamps(rng: np.random.Generator, n: int) -> np.ndarray:
    """A clock that advances STEP_MS a message, each producer off by up to JITTER_MS, 0.5 %
    late by up to LATE_MS, and 40 from clocks weeks off (beyond an i32 of ms deltas)."""
    ts = T0 + np.arange(n, dtype=np.int64) * STEP_MS + rng.integers(-JITTER_MS, JITTER_MS, n)
    late = rng.random(n) < 0.005
    ts[late] -= rng.integers(0, LATE_MS, int(late.sum()))
    wild = rng.choice(n, 40, replace=False)
    ts[wild] += rng.choice([-1, 1], 40) * rng.integers(30 * DAY_MS, 50 * DAY_MS, 40)
    return ts


def message_keys(rng: np.random.Generator, n: int, crafted: list[bytes]) -> list[bytes | None]:
    """10 % null, 15 % hot, 60 % warm, 12 % cold, 3 % crafted colliding keys."""
    kind = rng.random(n)
    hot = rng.integers(0, HOT_KEYS, n)
    warm = rng.integers(0, WARM_KEYS, n)
    cold = rng.integers(0, COLD_KEYS, n)
    pick = rng.integers(0, len(crafted), n)
    number = np.where(kind < 0.25, hot, np.where(kind < 0.85, warm, cold)).tolist()
    pool = [user_key(k) for k in range(WARM_KEYS)]
    keys: list[bytes | None] = [pool[k] if k < WARM_KEYS else user_key(k) for k in number]
    for i in np.flatnonzero(kind < 0.10).tolist():
        keys[i] = None
    for i in np.flatnonzero(kind >= 0.97).tolist():
        keys[i] = crafted[pick[i]]
    return keys


def build_corpus(n: int = MESSAGES, seed: int = SEED) -> Corpus:
    rng = np.random.default_rng(seed)
    crafted = colliding_keys()
    batches = []
    start = 0
    while start < n:
        stop = min(n, start + int(rng.integers(1000, 5001)))
        codec = str(rng.choice(CODECS, p=CODEC_WEIGHTS))
        batches.append((start, stop, int(rng.integers(0, PARTITIONS)), codec, rng.random() < 0.04))
        start = stop
    extra = {}
    for i in np.flatnonzero(rng.random(n) < 0.02).tolist():
        words = [b"trace-%05x" % int(rng.integers(0, 20_000))]
        if rng.random() < 0.3:
            words.append(user_key(int(rng.integers(0, WARM_KEYS))))
        extra[i] = b" ".join(words)
    return Corpus(
        values=log_lines(rng, n),
        keys=message_keys(rng, n, crafted),
        timestamps=shuffled_timestamps(rng, n),
        tag=rng.choice(np.arange(-1, len(TAGS)), n, p=[0.3, 0.3, 0.3, 0.1]),
        region=rng.choice(np.arange(-1, len(REGIONS)), n, p=[0.2, 0.4, 0.3, 0.1]),
        amount=np.where(rng.random(n) < 0.05, -1, rng.integers(0, len(AMOUNTS), n)),
        extra=extra,
        batches=batches,
        crafted=crafted,
    )


def write_store(path: str, corpus: Corpus) -> None:
    """Append the corpus; most batches pass raw headers, some use tags=/properties=."""
    a = len(AMOUNTS) + 1
    table = [
        [("tag", TAGS[t - 1].encode())] * (t > 0)
        + [("region", REGIONS[r - 1].encode())] * (r > 0)
        + [("amount", AMOUNTS[m - 1].encode())] * (m > 0)
        for t in range(len(TAGS) + 1)
        for r in range(len(REGIONS) + 1)
        for m in range(a)
    ]
    code = ((corpus.tag + 1) * (len(REGIONS) + 1) + corpus.region + 1) * a + corpus.amount + 1
    headers = [table[c] for c in code.tolist()]
    for i, words in corpus.extra.items():
        headers[i] = [*headers[i], ("keys", words)]
    tag, region, amount = corpus.tag.tolist(), corpus.region.tolist(), corpus.amount.tolist()
    ts = corpus.timestamps.tolist()
    with mqcore.open(path, flush="os") as s:
        s.create_topic(
            TOPIC,
            partitions=PARTITIONS,
            segment_bytes=SEGMENT_BYTES,
            key_index_entries=KEY_INDEX_ENTRIES,
        )
        for lo, hi, partition, codec, via_api in corpus.batches:
            if not via_api:
                s.append_batch(
                    TOPIC,
                    corpus.values[lo:hi],
                    corpus.keys[lo:hi],
                    headers[lo:hi],
                    partition,
                    ts[lo:hi],
                    codec,
                )
                continue
            rows = range(lo, hi)
            s.append_batch(
                TOPIC,
                corpus.values[lo:hi],
                corpus.keys[lo:hi],
                [[("keys", corpus.extra[i])] if i in corpus.extra else None for i in rows],
                partition,
                ts[lo:hi],
                codec,
                tags=[TAGS[tag[i]] if tag[i] >= 0 else None for i in rows],
                properties=[
                    {
                        **({"region": REGIONS[region[i]]} if region[i] >= 0 else {}),
                        **({"amount": AMOUNTS[amount[i]]} if amount[i] >= 0 else {}),
                    }
                    for i in rows
                ],
            )


# -- the brute force: every message read back once -----------------------------------------------


@dataclass
class Truth:
    """Every message of the store in (partition, offset) order, as numpy columns."""

    starts: list[int]  # first row of each partition (and the total at the end)
    partition: np.ndarray
    offset: np.ndarray
    timestamp: np.ndarray
    key_id: np.ndarray  # index into key_names, -1 null
    key_names: list[bytes]
    key_ids: dict[bytes, int]
    tag: np.ndarray  # index into TAGS, -1 none
    region: np.ndarray  # index into REGIONS, -1 none
    amount: np.ndarray  # index into AMOUNTS, -1 none
    word_rows: dict[bytes, np.ndarray]  # each word of a `keys` header -> rows carrying it
    values: list[pa.Array]  # per partition
    uids: list[pa.Array]  # per partition
    contains: dict[bytes, np.ndarray] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return self.starts[-1]

    def where(self, row: int) -> tuple[int, int]:
        return int(self.partition[row]), int(self.offset[row])

    def ids(self, rows: np.ndarray) -> list[tuple[int, int]]:
        return list(zip(self.partition[rows].tolist(), self.offset[rows].tolist(), strict=True))

    def value(self, row: int) -> bytes | None:
        p, o = self.where(row)
        return self.values[p][o].as_py()

    def key(self, row: int) -> bytes | None:
        k = int(self.key_id[row])
        return None if k < 0 else self.key_names[k]

    def uid(self, row: int) -> str:
        p, o = self.where(row)
        return uid_text(self.uids[p][o].as_py())

    def key_rows(self, key: bytes) -> np.ndarray:
        """Rows whose key is `key` or whose `keys` header has the word `key`."""
        k = self.key_ids.get(key)
        rows = np.flatnonzero(self.key_id == k) if k is not None else np.zeros(0, np.int64)
        words = self.word_rows.get(key)
        return rows if words is None else np.union1d(rows, words)

    def in_window(self, lo: int | None, hi: int | None) -> np.ndarray:
        mask = np.ones(self.count, bool)
        if lo is not None:
            mask &= self.timestamp >= lo
        if hi is not None:
            mask &= self.timestamp < hi
        return mask

    def in_partition(self, partition: int | None) -> np.ndarray:
        if partition is None:
            return np.ones(self.count, bool)
        mask = np.zeros(self.count, bool)
        mask[self.starts[partition] : self.starts[partition + 1]] = True
        return mask


def header_column(
    names: pa.Array, values: pa.Array, parents: np.ndarray, name: str
) -> tuple[np.ndarray, pa.Array]:
    """(rows, values) of the headers called `name`."""
    hit = np.asarray(pc.equal(names, name).to_numpy(zero_copy_only=False), bool)
    return parents[hit], values.filter(pa.array(hit))


def coded(rows: np.ndarray, values: pa.Array, vocab: list[str], size: int) -> np.ndarray:
    """A column of vocab indices (-1 absent) from header rows and their text values."""
    out = np.full(size, -1, np.int16)
    lookup = {v: i for i, v in enumerate(vocab)}
    enc = values.dictionary_encode()
    codes = np.array([lookup[v.decode()] for v in enc.dictionary.to_pylist()], np.int16)
    out[rows] = codes[enc.indices.to_numpy()]
    return out


def read_truth(store: mqcore.Store) -> Truth:
    """Read every message once with read_arrow into numpy columns."""
    starts = [0]
    parts: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    key_ids: list[np.ndarray] = []
    tags: list[np.ndarray] = []
    regions: list[np.ndarray] = []
    amounts: list[np.ndarray] = []
    values: list[pa.Array] = []
    uids: list[pa.Array] = []
    key_names: list[bytes] = []
    key_index: dict[bytes, int] = {}
    word_rows: dict[bytes, list[int]] = {}
    for p in range(PARTITIONS):
        rb = store.read_arrow(TOPIC, p, include_headers=True)
        n, base = rb.num_rows, starts[-1]
        parts.append(np.full(n, p, np.int8))
        offsets.append(rb.column("offset").to_numpy())
        stamps.append(pc.cast(rb.column("timestamp"), pa.int64()).to_numpy() // 1000)
        keys = rb.column("key").dictionary_encode()
        mapping = []
        for k in keys.dictionary.to_pylist():
            if k not in key_index:
                key_index[k] = len(key_names)
                key_names.append(k)
            mapping.append(key_index[k])
        ids = np.array(mapping, np.int32)[keys.indices.fill_null(0).to_numpy()]
        ids[np.asarray(keys.indices.is_null().to_numpy(zero_copy_only=False), bool)] = -1
        key_ids.append(ids)
        headers = rb.column("headers")
        flat = headers.flatten()
        names, hvalues = flat.field("key"), flat.field("value")
        parents = pc.list_parent_indices(headers).to_numpy()
        for name, vocab, sink in (("tag", TAGS, tags), ("region", REGIONS, regions)):
            rows, vals = header_column(names, hvalues, parents, name)
            sink.append(coded(rows, vals, vocab, n))
        rows, vals = header_column(names, hvalues, parents, "amount")
        amounts.append(coded(rows, vals, AMOUNTS, n))
        rows, vals = header_column(names, hvalues, parents, "keys")
        for row, words in zip(rows.tolist(), vals.to_pylist(), strict=True):
            for w in set(words.split(b" ")):
                word_rows.setdefault(w, []).append(base + row)
        rows, vals = header_column(names, hvalues, parents, "uid")
        assert np.array_equal(rows, np.arange(n)), "every message carries exactly one uid"
        uids.append(vals)
        values.append(rb.column("value"))
        starts.append(base + n)
    truth = Truth(
        starts=starts,
        partition=np.concatenate(parts),
        offset=np.concatenate(offsets),
        timestamp=np.concatenate(stamps),
        key_id=np.concatenate(key_ids),
        key_names=key_names,
        key_ids=key_index,
        tag=np.concatenate(tags),
        region=np.concatenate(regions),
        amount=np.concatenate(amounts),
        word_rows={w: np.array(r, np.int64) for w, r in word_rows.items()},
        values=values,
        uids=uids,
    )
    for needle in NEEDLES:
        truth.contains[needle] = np.concatenate(
            [
                np.asarray(
                    pc.match_substring(v, needle.decode())
                    .fill_null(False)
                    .to_numpy(zero_copy_only=False),
                    bool,
                )
                for v in values
            ]
        )
    return truth


# -- the store, built once -----------------------------------------------------------------------


@dataclass
class Big:
    path: str
    store: mqcore.Store
    truth: Truth
    corpus: Corpus

    def __repr__(self) -> str:  # hypothesis prints its arguments on failure
        return f"Big({self.path!r})"


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Big]:
    """The 2M-message store: written, closed, reopened read-only, read back once."""
    directory = tmp_path_factory.mktemp("large")
    path = str(directory / "store")
    corpus = build_corpus()
    write_store(path, corpus)
    store = mqcore.open(path, read_only=True)
    try:
        yield Big(path, store, read_truth(store), corpus)
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


# No shrinking: each example costs milliseconds to a second, and shrinking a failure would
# run hundreds of them; the labelled draws of the failing example are printed as they are.
QUERY_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- checking results ----------------------------------------------------------------------------


def check_messages(truth: Truth, messages: list[mqcore.Message], rows: np.ndarray) -> None:
    """The messages are those rows, in order, with their stored fields (a sample is read)."""
    assert [(m.partition, m.offset) for m in messages] == truth.ids(rows)
    picks = range(len(messages)) if len(messages) <= 200 else range(0, len(messages), 97)
    for i in picks:
        m, row = messages[i], int(rows[i])
        assert m.topic == TOPIC and m.timestamp == int(truth.timestamp[row])
        assert m.key == truth.key(row) and m.value == truth.value(row)


def page_through(
    query: Callable[[str | None], Any], truth: Truth, rows: np.ndarray, limit: int, max_pages: int
) -> None:
    """Run `query(cursor)` page by page (at most max_pages): every page is consistent, the
    pages join into a prefix of `rows`, and all of it once a page says it is exhausted."""
    event(f"expected {'0' if not len(rows) else '1-99' if len(rows) < 100 else '100+'}")
    got: list[mqcore.Message] = []
    cursor = None
    for page in range(max_pages):
        r = query(cursor)
        assert len(r) <= limit
        if r.reason == "exhausted":
            assert r.complete and r.cursor is None
            got.extend(r)
            check_messages(truth, got, rows)
            event(f"complete after {page + 1} page(s)")
            return
        assert r.reason == "limit" and not r.complete
        assert len(r) == limit and isinstance(r.cursor, str)
        got.extend(r)
        cursor = r.cursor
    check_messages(truth, got, rows[: len(got)])
    event("stopped paging before the end")


Window = tuple[int | None, int | None]


@st.composite
def windows(
    draw: st.DrawFn, max_width: int, anchors: np.ndarray | None = None, unbounded: bool = True
) -> Window:
    """[start, end) in ms. Mostly a span around one of `anchors` (timestamps of messages that
    should match, so most draws find something), else a span anywhere, a half-open or empty
    window, everything, or the weeks where a few producers' clocks were."""
    kinds = ["anchored"] * 6 + ["span", "span", "from", "until", "weeks", "empty", "all"]
    kind = draw(st.sampled_from(kinds), label="window kind")
    scale = draw(st.sampled_from([max_width, max_width // 8, 60_000, 2_000, 50]))
    width = draw(st.integers(max(1, scale // 2), max(1, scale)))
    lo = draw(st.integers(T0 - 600_000, T0 + SPAN_MS + 600_000))
    if kind == "anchored" and anchors is not None and len(anchors):
        anchor = int(anchors[draw(st.integers(0, len(anchors) - 1))])
        lo = anchor - draw(st.integers(0, width))
        return lo, lo + width + 1
    if kind == "from":
        return T0 + SPAN_MS - draw(st.integers(-JITTER_MS, max_width)), None
    if kind == "until":
        return None, T0 + draw(st.integers(-JITTER_MS, max_width))
    if kind == "weeks":
        sign = draw(st.sampled_from([-1, 1]))
        return ordered((T0 + sign * 20 * DAY_MS, T0 + sign * 60 * DAY_MS))
    if kind == "empty":
        return lo, lo
    if kind == "all" and unbounded:
        return None, None
    return lo, lo + width


def ordered(window: Window) -> Window:
    lo, hi = window
    if lo is not None and hi is not None and hi < lo:
        return hi, lo
    return lo, hi


# -- SQL92 selectors and a reference evaluator ---------------------------------------------------

# (text, value) literals; the reference coerces property text to the literal's type itself
INTS = [(str(v), v) for v in (50, -10, -7, 0, 3, 12, 42, 99, 100)]
FLOATS = [("3.5", 3.5), ("12.5", 12.5), ("50.0", 50.0), ("-7.0", -7.0), ("2.5e1", 25.0)]
STRINGS = [("'abc'", "abc"), ("'3.5'", "3.5"), ("''", ""), ("'42'", "42"), ("'o''k'", "o'k")]
TEXTS = [(f"'{v}'", v) for v in (*REGIONS, *TAGS, "xx")]
OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": lambda a, b: a >= b,
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
}
MIRROR = {"=": "=", "<>": "<>", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
Props = dict[str, str | None]
Tri = bool | None


def coerce(text: str, like: object) -> object:
    """Property text as the literal's type, or None (UNKNOWN) when it does not read as one."""
    if isinstance(like, str):
        return text
    t = text.strip()
    if isinstance(like, int):
        return int(t) if re.fullmatch(r"[+-]?\d+", t) else None
    return float(t) if re.fullmatch(r"[+-]?\d+(\.\d*)?", t) else None


def compare(props: Props, name: str, op: str, literal: object) -> Tri:
    text = props.get(name)
    value = None if text is None else coerce(text, literal)
    return None if value is None else OPS[op](value, literal)


def tri_and(a: Tri, b: Tri) -> Tri:
    return False if a is False or b is False else (None if a is None or b is None else True)


def tri_or(a: Tri, b: Tri) -> Tri:
    return True if a is True or b is True else (None if a is None or b is None else False)


def tri_not(a: Tri) -> Tri:
    return None if a is None else not a


@dataclass(frozen=True)
class Sel:
    """A selector's text and its meaning under SQL's three-valued logic."""

    text: str
    meaning: Callable[[Props], Tri]


def atom_compare(name: str, op: str, lit: tuple[str, object], flipped: bool) -> Sel:
    text = f"{lit[0]} {MIRROR[op]} {name}" if flipped else f"{name} {op} {lit[0]}"
    return Sel(text, lambda p: compare(p, name, op, lit[1]))


def atom_between(lo: tuple[str, object], hi: tuple[str, object], negated: bool, kw: str) -> Sel:
    # bounds in order: a reversed pair is a syntax error (RocketMQ's rule, test_selector.py)
    lo, hi = sorted((lo, hi), key=lambda bound: bound[1])  # type: ignore[arg-type, return-value]

    def meaning(p: Props) -> Tri:
        inside = tri_and(compare(p, "amount", ">=", lo[1]), compare(p, "amount", "<=", hi[1]))
        return tri_not(inside) if negated else inside

    return Sel(f"amount {'NOT ' if negated else ''}{kw} {lo[0]} AND {hi[0]}", meaning)


def atom_in(name: str, items: list[tuple[str, object]], negated: bool) -> Sel:
    def meaning(p: Props) -> Tri:
        found: Tri = False
        for _, v in items:
            found = tri_or(found, compare(p, name, "=", v))
        return tri_not(found) if negated else found

    listed = ", ".join(t for t, _ in items)
    return Sel(f"{name} {'NOT ' if negated else ''}IN ({listed})", meaning)


def atom_null(name: str, negated: bool) -> Sel:
    return Sel(
        f"{name} IS {'NOT ' if negated else ''}NULL",
        lambda p: (p.get(name) is not None) if negated else (p.get(name) is None),
    )


def atom_text(name: str, kind: str, needle: str, negated: bool) -> Sel:
    tests = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}

    def meaning(p: Props) -> Tri:
        text = p.get(name)
        hit = None if text is None else tests[kind](text, needle)
        return tri_not(hit) if negated else hit

    return Sel(f"{name} {'NOT ' if negated else ''}{kind} '{needle}'", meaning)


def combine(kind: str, a: Sel, b: Sel | None = None) -> Sel:
    if kind == "NOT":
        return Sel(f"NOT ({a.text})", lambda p: tri_not(a.meaning(p)))
    assert b is not None
    join = tri_and if kind == "AND" else tri_or
    return Sel(f"({a.text}) {kind} ({b.text})", lambda p: join(a.meaning(p), b.meaning(p)))


amount_literal = st.sampled_from(INTS + FLOATS + STRINGS)
atoms = st.one_of(
    st.builds(atom_compare, st.just("amount"), st.sampled_from(list(OPS)), amount_literal,
              st.booleans()),
    st.builds(atom_compare, st.sampled_from(["region", "TAGS", "tag"]),
              st.sampled_from(list(OPS)), st.sampled_from(TEXTS), st.booleans()),
    st.builds(atom_between, st.sampled_from(INTS + FLOATS), st.sampled_from(INTS + FLOATS),
              st.booleans(), st.sampled_from(["BETWEEN", "between"])),
    st.builds(atom_in, st.just("amount"), st.lists(st.sampled_from(INTS), min_size=1, max_size=4),
              st.booleans()),
    st.builds(atom_in, st.sampled_from(["region", "TAGS"]),
              st.lists(st.sampled_from(TEXTS), min_size=1, max_size=3), st.booleans()),
    st.builds(atom_null, st.sampled_from(["region", "amount", "tag"]), st.booleans()),
    st.builds(atom_text, st.sampled_from(["region", "amount"]),
              st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
              st.sampled_from(["u", "e", "p", "1", "5", "."]), st.booleans()),
)  # fmt: skip
selectors = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.builds(combine, st.just("NOT"), inner),
        st.builds(combine, st.sampled_from(["AND", "OR"]), inner, inner),
    ),
    max_leaves=4,
)


def selector_mask(truth: Truth, sel: Sel) -> np.ndarray:
    """Rows whose properties make `sel` TRUE, evaluated once per (tag, region, amount)."""
    a = len(AMOUNTS) + 1
    combo = ((truth.tag.astype(np.int32) + 1) * 4 + truth.region + 1) * a + truth.amount + 1
    table = np.zeros(4 * 4 * a, bool)
    for c in np.unique(combo).tolist():
        t, rest = divmod(c, 4 * a)
        r, am = divmod(rest, a)
        tag = TAGS[t - 1] if t else None
        props: Props = {
            "tag": tag,
            "TAGS": tag,
            "region": REGIONS[r - 1] if r else None,
            "amount": AMOUNTS[am - 1] if am else None,
        }
        table[c] = sel.meaning(props) is True
    return table[combo]


# -- the store itself ----------------------------------------------------------------------------


def segment_files(path: str, partition: int, suffix: str) -> list[str]:
    d = os.path.join(path, f"{TOPIC}-{partition}")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(suffix))


def batch_codecs(log_path: str) -> set[int]:
    """The codec (attributes & 7) of every batch of a .log file, walking the batch headers."""
    out = set()
    with open(log_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        while pos < size:
            f.seek(pos)
            head = f.read(23)
            out.add(int.from_bytes(head[21:23], "big") & 7)
            pos += 12 + int.from_bytes(head[8:12], "big")
    return out


def test_store_holds_the_corpus_in_many_segments(big: Big) -> None:
    truth, corpus = big.truth, big.corpus
    assert truth.count == MESSAGES
    codecs: set[int] = set()
    for p in range(PARTITIONS):
        lo, hi = truth.starts[p], truth.starts[p + 1]
        assert np.array_equal(truth.offset[lo:hi], np.arange(hi - lo))
        assert big.store.end_offset(TOPIC, p) == hi - lo
        logs = segment_files(big.path, p, ".log")
        assert len(logs) >= 8 and len(segment_files(big.path, p, ".keyindex")) == len(logs)
        assert np.any(np.diff(truth.timestamp[lo:hi]) < 0)  # timestamps out of order
        for log in logs:
            codecs |= batch_codecs(log)
    assert codecs == {0, 1, 2, 3, 4}
    # the read-back equals what was appended: appends are in offset order within a partition
    where = np.concatenate([np.full(hi - lo, p) for lo, hi, p, _, _ in corpus.batches])
    order = np.argsort(where, kind="stable")
    assert np.array_equal(truth.timestamp, corpus.timestamps[order])
    assert np.array_equal(truth.tag, corpus.tag[order])
    assert np.array_equal(truth.region, corpus.region[order])
    assert np.array_equal(truth.amount, corpus.amount[order])
    keys = [corpus.keys[i] for i in order.tolist()]
    assert [truth.key_names[k] if k >= 0 else None for k in truth.key_id.tolist()] == keys
    values = [v for col in truth.values for v in col.to_pylist()]
    assert values == [corpus.values[i] for i in order.tolist()]
    counts = np.bincount(truth.key_id[truth.key_id >= 0])
    assert counts.max() > 300 and (counts == 1).sum() > 1000 and (truth.key_id < 0).sum() > 0
    assert sum(len(r) for r in truth.word_rows.values()) > 10_000


def test_keys_share_index_slots(big: Big) -> None:
    """Slot collisions really happen: distinct key hashes share slots in every segment, and the
    crafted pairs sit in one slot of the same segment."""
    truth = big.truth
    hashes = np.array(
        [xxhash.xxh64_intdigest(k, KEY_SEED) for k in truth.key_names], dtype=np.uint64
    )
    crafted = {truth.key_ids[k] for k in big.corpus.crafted if k in truth.key_ids}
    pairs_together = collisions = segments = 0
    for p in range(PARTITIONS):
        files = segment_files(big.path, p, ".keyindex")
        bases = [int(os.path.basename(f).split(".")[0]) for f in files]
        ends = [*bases[1:], truth.starts[p + 1] - truth.starts[p]]
        for f, lo, hi in zip(files, bases, ends, strict=True):
            with open(f, "rb") as fh:
                head = fh.read(64)
            assert head[:4] == b"MQKI"
            slots = int.from_bytes(head[8:12], "big")
            assert slots <= 1 << COLLIDE_BITS
            ids = np.unique(truth.key_id[truth.starts[p] + lo : truth.starts[p] + hi])
            ids = ids[ids >= 0]
            h = hashes[ids]
            collisions += len(h) - len(np.unique(h & np.uint64(slots - 1)))
            segments += 1
            present = crafted & set(ids.tolist())
            for a, b in zip(big.corpus.crafted[::2], big.corpus.crafted[1::2], strict=True):
                if truth.key_ids.get(a) in present and truth.key_ids.get(b) in present:
                    pairs_together += 1
    assert segments >= 8 * PARTITIONS
    assert collisions > 10 * segments
    assert pairs_together >= COLLIDING_PAIRS


# -- the queries against the brute force ---------------------------------------------------------


def key_choices(truth: Truth) -> dict[str, list[bytes]]:
    return {
        "warm": [user_key(i) for i in range(0, WARM_KEYS, 7)],
        "hot": [user_key(i) for i in range(HOT_KEYS)],
        "cold": [k for k in truth.key_names[::997] if k.startswith(b"user-")],
        "crafted": [],  # filled from the corpus
        "word": sorted(truth.word_rows)[::13],
        "absent": ABSENT_KEYS,
    }


@QUERY_SETTINGS
@given(data=st.data())
def test_find_by_key_equals_brute_force(big: Big, data: st.DataObject) -> None:
    truth = big.truth
    choices = key_choices(truth)
    choices["crafted"] = big.corpus.crafted
    kind = data.draw(st.sampled_from(list(choices)), label="kind")
    key = data.draw(st.sampled_from(choices[kind]), label="key")
    rows = truth.key_rows(key)
    lo, hi = ordered(data.draw(windows(SPAN_MS, truth.timestamp[rows]), label="window"))
    partition = data.draw(st.sampled_from([None, None, 0, PARTITIONS - 1]), label="partition")
    rows = rows[truth.in_window(lo, hi)[rows] & truth.in_partition(partition)[rows]]
    limit = data.draw(st.integers(max(1, len(rows) // 3), max(1, len(rows) + 2)), label="limit")
    as_text = data.draw(st.booleans(), label="as_text") and key.isascii()

    def query(cursor: str | None) -> Any:
        return big.store.find_by_key(
            TOPIC, key.decode() if as_text else key, start=lo, end=hi, limit=limit,
            partition=partition, cursor=cursor,
        )  # fmt: skip

    page_through(query, truth, rows, limit, max_pages=5)


def test_queries_around_clocks_weeks_off(big: Big) -> None:
    """The messages stamped weeks away are beyond the key index's i32 time deltas (saturated):
    windows that just hold or just miss them still give the brute-force answer."""
    truth, store = big.truth, big.store
    wild = np.flatnonzero(np.abs(truth.timestamp - T0) > 20 * DAY_MS)
    assert len(wild) == 40
    for n, row in enumerate(wild.tolist()):
        ts = int(truth.timestamp[row])
        for lo, hi in ((ts, ts + 1), (ts + 1, ts + 10 * DAY_MS), (ts - 10 * DAY_MS, ts)):
            window = truth.in_window(lo, hi)
            key = truth.key(row)
            if key is not None:
                rows = truth.key_rows(key)
                r = store.find_by_key(TOPIC, key, start=lo, end=hi, limit=100_000)
                assert r.reason == "exhausted"
                check_messages(truth, r.messages, rows[window[rows]])
            if n % 5 == 0:
                r = store.range(TOPIC, lo, hi, limit=100_000)
                assert r.reason == "exhausted"
                check_messages(truth, r.messages, np.flatnonzero(window))
        r = store.find_by_unique_id(truth.uid(row), start=ts, end=ts + 1)
        check_messages(truth, r.messages, np.array([row]))
        assert len(store.find_by_unique_id(truth.uid(row), start=ts + 1)) == 0


@QUERY_SETTINGS
@given(data=st.data())
def test_find_by_unique_id_equals_brute_force(big: Big, data: st.DataObject) -> None:
    truth, store = big.truth, big.store
    row = data.draw(st.integers(0, truth.count - 1), label="row")
    uid = truth.uid(row)
    ts = int(truth.timestamp[row])
    lo, hi = data.draw(
        st.sampled_from([(None, None), (ts, ts + 1), (ts - 5000, ts + 5000), (ts + 1, None),
                         (None, ts), (0, T0 - DAY_MS)]),
        label="window",
    )  # fmt: skip
    limit = data.draw(st.sampled_from([1, 2, 10]), label="limit")
    r = store.find_by_unique_id(uid, start=lo, end=hi, limit=limit)
    rows = np.array([row]) if truth.in_window(lo, hi)[row] else np.zeros(0, np.int64)
    check_messages(truth, r.messages, rows)
    assert r.reason == "exhausted" and r.complete  # "limit" only when more than `limit` match
    assert all(m.unique_id == uid for m in r)
    flipped = uid[:-1] + ("0" if uid[-1] != "0" else "1")
    absent = store.find_by_unique_id(flipped, start=lo, end=hi, limit=limit)
    assert len(absent) == 0 and absent.reason == "exhausted" and absent.complete


@QUERY_SETTINGS
@given(data=st.data())
def test_get_by_id_equals_brute_force(big: Big, data: st.DataObject) -> None:
    truth, store = big.truth, big.store
    for row in data.draw(st.lists(st.integers(0, truth.count - 1), min_size=1, max_size=20)):
        p, o = truth.where(row)
        m = store.get_by_id(encode_msg_id(TOPIC, p, o))
        assert m is not None and (m.topic, m.partition, m.offset) == (TOPIC, p, o)
        assert m.msg_id == encode_msg_id(TOPIC, p, o)
        assert m.timestamp == int(truth.timestamp[row])
        assert m.key == truth.key(row) and m.value == truth.value(row)
        assert m.unique_id == truth.uid(row)
        tag = int(truth.tag[row])
        assert m.tag == (TAGS[tag] if tag >= 0 else None)
        props = m.properties
        region, amount = int(truth.region[row]), int(truth.amount[row])
        assert props.get("region") == (REGIONS[region] if region >= 0 else None)
        assert props.get("amount") == (AMOUNTS[amount] if amount >= 0 else None)
    p = data.draw(st.integers(0, PARTITIONS - 1), label="past_partition")
    past = truth.starts[p + 1] - truth.starts[p] + data.draw(st.integers(0, 10**6), label="past")
    assert store.get_by_id(encode_msg_id(TOPIC, p, past)) is None
    assert store.get_by_id(encode_msg_id(TOPIC, PARTITIONS + p, 0)) is None
    assert store.get_by_id(encode_msg_id("no-such-topic", 0, 0)) is None


@QUERY_SETTINGS
@given(data=st.data())
def test_range_equals_brute_force(big: Big, data: st.DataObject) -> None:
    truth = big.truth
    lo, hi = ordered(data.draw(windows(20 * 60_000, truth.timestamp, False), label="window"))
    partition = data.draw(st.sampled_from([None, None, 0, 1, 2, 3]), label="partition")
    rows = np.flatnonzero(truth.in_window(lo, hi) & truth.in_partition(partition))
    limit = data.draw(
        st.sampled_from([1, 10, 1000, 100_000, max(1, len(rows) // 3), len(rows) + 1]),
        label="limit",
    )

    def query(cursor: str | None) -> Any:  # None: unbounded (range's bounds are optional)
        return big.store.range(TOPIC, lo, hi, partition, limit=limit, cursor=cursor)

    page_through(query, truth, rows, limit, max_pages=4)


def run_search(
    big: Big,
    data: st.DataObject,
    mask: np.ndarray,
    max_width: int,
    limits: list[int],
    **criteria: Any,
) -> None:
    """search(**criteria) over a drawn window and partition, paged, against `mask`."""
    truth = big.truth
    lo, hi = ordered(data.draw(windows(max_width, truth.timestamp[mask]), label="window"))
    partition = data.draw(st.sampled_from([None, None, 0, 3]), label="partition")
    rows = np.flatnonzero(mask & truth.in_window(lo, hi) & truth.in_partition(partition))
    limit = data.draw(st.sampled_from([*limits, len(rows) + 1]), label="limit")

    def query(cursor: str | None) -> Any:
        return big.store.search(
            TOPIC, partition=partition, start=lo, end=hi, limit=min(limit, 100_000),
            cursor=cursor, **criteria,
        )  # fmt: skip

    page_through(query, truth, rows, min(limit, 100_000), max_pages=3)


@QUERY_SETTINGS
@given(data=st.data())
def test_search_by_tag_equals_brute_force(big: Big, data: st.DataObject) -> None:
    tag = data.draw(st.sampled_from([*TAGS, "TagZ"]), label="tag")
    mask = big.truth.tag == (TAGS.index(tag) if tag in TAGS else -2)
    run_search(big, data, mask, 10 * 60_000, [1, 50, 5000], tag=tag)


@QUERY_SETTINGS
@given(data=st.data())
def test_search_by_selector_equals_brute_force(big: Big, data: st.DataObject) -> None:
    sel = data.draw(selectors, label="where")
    run_search(big, data, selector_mask(big.truth, sel), 90_000, [1, 20, 2000], where=sel.text)


@QUERY_SETTINGS
@given(data=st.data())
def test_search_by_content_equals_brute_force(big: Big, data: st.DataObject) -> None:
    needle = data.draw(st.sampled_from(NEEDLES), label="needle")
    as_text = data.draw(st.booleans(), label="as_text")
    contains = needle.decode() if as_text else needle
    run_search(big, data, big.truth.contains[needle], SPAN_MS, [1, 100, 10_000], contains=contains)


@QUERY_SETTINGS
@given(data=st.data())
def test_combined_search_equals_brute_force(big: Big, data: st.DataObject) -> None:
    truth = big.truth
    tag = data.draw(st.sampled_from(TAGS), label="tag")
    sel = data.draw(selectors, label="where")
    needle = data.draw(st.sampled_from([None, *NEEDLES]), label="needle")
    mask = (truth.tag == TAGS.index(tag)) & selector_mask(truth, sel)
    criteria: dict[str, Any] = {"tag": tag, "where": sel.text}
    if needle is not None:
        mask &= truth.contains[needle]
        criteria["contains"] = needle
    run_search(big, data, mask, 5 * 60_000, [1, 30, 3000], **criteria)
