"""Filter pushdown for the mqcore source: the comparisons the store answers exactly.

Each taken filter becomes a set of half-open integer intervals on one column, or a set of
values looked up in an index:
  topic       EqualTo / In / Not of them -> the topic-partitions planned
  partition   = <> < <= > >= IN, NOT IN  -> the topic-partitions planned
  offset      = <> < <= > >= IN, NOT IN  -> the offset ranges planned (untouched offsets and
                                            segments are never read)
  timestamp   = < <= > >= (microseconds) -> a lower bound starts each range at the first offset
                                            with timestamp >= it (time index); every bound is
                                            then applied to each Arrow batch with pyarrow.compute
  key         = X, <=> X, IN (X, ...)    -> the key index of each segment names the batches
                                            that may hold X; only those are planned (pieces of
                                            the range); each Arrow batch is then filtered on the
                                            key column (hash collisions, `keys` words)
  msg_id      = 'm1-...', IN (...)       -> the ID is decoded to (topic, partition, offset):
    (includeExtras)                         only that offset is planned
  value       StringContains 'needle'    -> the search kernel passes over every batch whose
                                            records do not hold the needle (UTF-8 bytes);
                                            the others are decoded from their first match and
                                            filtered on the value column
Everything else (headers, tag, NOT of a key, a NULL in a list, a value of another type) goes
back to Spark, by reference, as pushFilters requires. Spark itself never pushes StringContains
on `value` (a binary column); it arrives from callers of pushFilters that build it.
topic, partition, offset, timestamp and msg_id are never NULL, so NOT is the plain complement.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqcore.errors import InvalidMessageIdError
from mqcore.query.ids import decode_msg_id
from mqcore.spark.plan import OffsetRange, pieced

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore.store import Store

LOW = -(1 << 63)
HIGH = 1 << 63
Intervals = tuple[tuple[int, int], ...]  # sorted, disjoint, each [lo, hi)
EVERYTHING: Intervals = ((LOW, HIGH),)
NOTHING: Intervals = ()

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_INT_COLUMNS = ("partition", "offset")


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def union(a: Intervals, b: Intervals) -> Intervals:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(a + b):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def complement(a: Intervals) -> Intervals:
    out, low = [], LOW
    for lo, hi in a:
        if lo > low:
            out.append((low, lo))
        low = hi
    if low < HIGH:
        out.append((low, HIGH))
    return tuple(out)


def _comparison(kind: str, v: int) -> Intervals | None:
    """The values of a column that satisfy `column <kind> v`."""
    return {
        "EqualTo": ((v, v + 1),),
        "EqualNullSafe": ((v, v + 1),),
        "GreaterThan": ((v + 1, HIGH),),
        "GreaterThanOrEqual": ((v, HIGH),),
        "LessThan": ((LOW, v),),
        "LessThanOrEqual": ((LOW, v + 1),),
    }.get(kind)


def _micros(value: object) -> int | None:
    """A Spark timestamp literal (an aware datetime) as microseconds since the epoch."""
    if not isinstance(value, datetime.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // datetime.timedelta(microseconds=1)


def _number(column: str, value: object) -> int | None:
    if column == "timestamp":
        return _micros(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def filter_intervals(f: Any) -> tuple[str, Intervals] | None:
    """(column, intervals) for a filter this module answers exactly, else None."""
    kind = type(f).__name__
    if kind == "Not":
        inner = filter_intervals(f.child)
        return None if inner is None else (inner[0], complement(inner[1]))
    attribute: tuple[str, ...] = getattr(f, "attribute", ())
    if len(attribute) != 1 or attribute[0] not in ("partition", "offset", "timestamp"):
        return None
    column = attribute[0]
    if kind == "IsNotNull":
        return column, EVERYTHING
    if kind == "IsNull":
        return column, NOTHING
    if kind == "In":
        numbers = [_number(column, v) for v in f.value]
        if any(n is None for n in numbers):
            return None
        return column, union(NOTHING, tuple((n, n + 1) for n in numbers if n is not None))
    number = _number(column, getattr(f, "value", None))
    if number is None:
        return None
    found = _comparison(kind, number)
    return None if found is None else (column, found)


def _equal_values(f: Any, column: str, kinds: tuple[type, ...]) -> list[Any] | None:
    """The values of `column = v` / `column <=> v` / `column IN (...)` when every one is of
    one of `kinds`, else None."""
    kind = type(f).__name__
    if getattr(f, "attribute", ()) != (column,) or kind not in ("EqualTo", "EqualNullSafe", "In"):
        return None
    values = list(f.value) if kind == "In" else [f.value]
    return values if all(isinstance(v, kinds) for v in values) else None


def key_values(f: Any) -> frozenset[bytes] | None:
    """The keys of key = X / key <=> X / key IN (...) (binary literals)."""
    values = _equal_values(f, "key", (bytes, bytearray))
    return None if values is None else frozenset(bytes(v) for v in values)


def msg_id_targets(f: Any) -> frozenset[tuple[str, int, int]] | None:
    """(topic, partition, offset) of msg_id = '...' / IN (...); text that is no store ID
    names no record."""
    values = _equal_values(f, "msg_id", (str,))
    if values is None:
        return None
    out = set()
    for text in values:
        try:
            out.add(decode_msg_id(text))
        except InvalidMessageIdError:
            pass
    return frozenset(out)


def value_needle(f: Any) -> bytes | None:
    """The UTF-8 bytes of StringContains(value, '...')."""
    if type(f).__name__ != "StringContains" or getattr(f, "attribute", ()) != ("value",):
        return None
    return f.value.encode("utf-8") if isinstance(f.value, str) else None


def topic_names(f: Any) -> tuple[frozenset[str], bool] | None:
    """(names, negated) for topic = 'x', topic IN (...), IS [NOT] NULL, and NOT of them."""
    kind = type(f).__name__
    if kind == "Not":
        inner = topic_names(f.child)
        return None if inner is None else (inner[0], not inner[1])
    if getattr(f, "attribute", ()) != ("topic",):
        return None
    if kind in ("IsNotNull", "IsNull"):  # a topic is never null: every topic, or none
        return frozenset(), kind == "IsNotNull"
    values = f.value if kind == "In" else (getattr(f, "value", None),)
    if kind not in ("EqualTo", "EqualNullSafe", "In") or not all(
        isinstance(v, str) for v in values
    ):
        return None
    return frozenset(values), False


@dataclass
class Pushdown:
    """The filters a reader took, as intervals per column; empty means no filter."""

    partitions: Intervals = EVERYTHING
    offsets: Intervals = EVERYTHING
    timestamps: Intervals = EVERYTHING  # microseconds, as in the Arrow column
    topics: frozenset[str] | None = None  # None: every subscribed topic
    excluded_topics: frozenset[str] = frozenset()
    keys: frozenset[bytes] | None = None  # None: any key
    msg_ids: frozenset[tuple[str, int, int]] | None = None  # None: any record
    needles: tuple[bytes, ...] = ()  # the value contains each of them
    taken: list[str] = field(default_factory=list)  # what was pushed, for tests and logs

    def push(self, filters: Sequence[Any]) -> list[Any]:
        """Take the filters answered here; return the others (the same objects) to Spark."""
        rest = []
        for f in filters:
            if self._take(f):
                self.taken.append(repr(f))
            else:
                rest.append(f)
        return rest

    def _take(self, f: Any) -> bool:
        keys = key_values(f)
        if keys is not None:
            self.keys = keys if self.keys is None else self.keys & keys
            return True
        targets = msg_id_targets(f)
        if targets is not None:
            self.msg_ids = targets if self.msg_ids is None else self.msg_ids & targets
            return True
        if type(f).__name__ == "IsNotNull" and f.attribute == ("msg_id",):
            return True
        needle = value_needle(f)
        if needle is not None:
            self.needles += (needle,)
            return True
        names = topic_names(f)
        if names is not None:
            if names[1]:
                self.excluded_topics |= names[0]
            else:
                self.topics = names[0] if self.topics is None else self.topics & names[0]
            return True
        found = filter_intervals(f)
        if found is None:
            return False
        column, intervals = found
        if column == "partition":
            self.partitions = intersect(self.partitions, intervals)
        elif column == "offset":
            self.offsets = intersect(self.offsets, intervals)
        else:
            self.timestamps = intersect(self.timestamps, intervals)
        return True

    @property
    def active(self) -> bool:
        return bool(self.taken)

    def keeps(self, topic: str, partition: int) -> bool:
        if topic in self.excluded_topics or (self.topics is not None and topic not in self.topics):
            return False
        return bool(intersect(self.partitions, ((partition, partition + 1),)))

    @property
    def lookups(self) -> bool:
        """Whether a key or msg_id filter picks single records (the plan is pieces)."""
        return self.keys is not None or self.msg_ids is not None

    def narrow(self, store: Store, ranges: list[OffsetRange]) -> list[OffsetRange]:
        """The resolved ranges cut down to the offsets the filters can match (before Spark's
        split, so minPartitions applies to what is left)."""
        if not self.active:
            return ranges
        out: list[OffsetRange] = []
        for rng in ranges:
            if not self.keeps(rng.topic, rng.partition):
                continue
            start = rng.start
            if self.timestamps and self.timestamps[0][0] > LOW:
                first_ms = -(-self.timestamps[0][0] // 1000)  # the first whole ms at or after it
                found = store.offset_for_time(rng.topic, rng.partition, first_ms)
                start = rng.end if found is None else max(start, found)
            allowed = intersect(self.offsets, ((start, rng.end),)) if self.timestamps else ()
            if self.lookups:
                found_range = pieced(
                    rng.topic,
                    rng.partition,
                    self._looked_up(store, rng.topic, rng.partition, allowed),
                )
                out.extend([found_range] if found_range is not None else [])
            else:
                out.extend(OffsetRange(rng.topic, rng.partition, lo, hi) for lo, hi in allowed)
        return out

    def _looked_up(self, store: Store, topic: str, partition: int, allowed: Intervals) -> Intervals:
        """The spans of `allowed` that the msg_id and key filters can match: the IDs' offsets,
        and the batches the key index names."""
        if self.msg_ids is not None:
            offsets = tuple((o, o + 1) for t, p, o in self.msg_ids if (t, p) == (topic, partition))
            allowed = intersect(allowed, union(NOTHING, offsets))
        if self.keys is not None and allowed:
            lo, hi = allowed[0][0], allowed[-1][1]
            spans: Intervals = NOTHING
            for key in sorted(self.keys):
                spans = union(spans, tuple(store.key_spans(topic, partition, key, lo, hi)))
            allowed = intersect(allowed, spans)
        return allowed

    @property
    def filters_rows(self) -> bool:
        """Whether filter_batch has anything to do (offsets and msg_ids are exact as read)."""
        return self.timestamps != EVERYTHING or self.keys is not None or bool(self.needles)

    def filter_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of `batch` inside the timestamp bounds, with one of the keys and a value
        holding every needle (offsets and msg_ids are already exact)."""
        if not self.filters_rows:
            return batch
        import pyarrow as pa
        import pyarrow.compute as pc

        masks = []
        if self.timestamps != EVERYTHING:
            masks.append(self._time_mask(batch))
        if self.keys is not None:
            wanted = pa.array(sorted(self.keys), pa.binary())
            masks.append(pc.is_in(batch.column("key"), value_set=wanted))
        for needle in self.needles:
            # a null value holds nothing: the null mask entry drops the row
            masks.append(pc.match_substring(batch.column("value"), needle.decode("utf-8")))
        mask = masks[0]
        for more in masks[1:]:
            mask = pc.and_(mask, more)
        return batch.filter(mask)

    def _time_mask(self, batch: pa.RecordBatch) -> pa.Array:
        import pyarrow as pa
        import pyarrow.compute as pc

        micros = batch.column("timestamp").cast("int64")
        mask = None
        for lo, hi in self.timestamps:
            # LOW and HIGH stand for no bound (and are past int64)
            checks = [pc.greater_equal(micros, lo)] if lo > LOW else []
            checks += [pc.less(micros, hi)] if hi < HIGH else []
            inside = checks[0] if len(checks) == 1 else pc.and_(*checks)
            mask = inside if mask is None else pc.or_(mask, inside)
        if mask is None:
            return pa.repeat(pa.scalar(False), batch.num_rows)
        return mask
