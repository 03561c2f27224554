"""A hypothesis state machine that drives a real store against a plain Python model of the log.

The model is a list of (key, value, headers, timestamp) per partition; an offset is a list
index. Appends, reads at any offset, gets, time lookups, Arrow slices, segment rolls (tiny
segment_bytes and segment_ms against the records' timestamps), clean reopens and crashes run in
random order; after every step the store's offsets must match the model.

A crash is a copy of the store directory taken while the writer still has it open (what a
SIGKILL leaves: the page cache, indexes preallocated and untrimmed, no clean-shutdown marker),
with the last segment of one partition then cut at a random byte (what a power loss can leave
of unsynced data). What is legitimately lost is every batch not wholly before the cut; the
model drops exactly those records, and the reopened store must agree.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import mqcore

TOPIC = "log"
PARTITIONS = 2
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]

Headers = tuple[tuple[str, bytes | None], ...]
Record = tuple[bytes | None, bytes | None, Headers, int]

keys = st.none() | st.binary(max_size=8)
values = st.none() | st.binary(max_size=120)
headers = st.lists(
    st.tuples(st.text("abcxyz", min_size=1, max_size=3), st.none() | st.binary(max_size=5)),
    max_size=2,
).map(tuple)
timestamps = st.integers(min_value=0, max_value=6000)
records = st.tuples(keys, values, headers, timestamps)
partitions = st.integers(min_value=0, max_value=PARTITIONS - 1)


def as_record(m: mqcore.Message) -> tuple[int, bytes | None, bytes | None, Headers, int]:
    return (m.offset, m.key, m.value, tuple(m.headers), m.timestamp)


def expected(model: list[Record], start: int, stop: int) -> list[tuple[object, ...]]:
    return [(o, *model[o]) for o in range(start, min(stop, len(model)))]


def whole_batches_before(log: Path, cut: int) -> int | None:
    """Base offset of the first batch in `log` that does not end at or before `cut` (parsed
    from the headers alone), or None when every batch does."""
    data = log.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > cut:
            return base
        pos += 12 + length
    return None


class LogMachine(RuleBasedStateMachine):
    """A store and its model, kept in step by the rules below."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="mqcore-sm-")
        self.generation = 0
        self.path = os.path.join(self.root, "g0")
        self.store = mqcore.open(self.path, flush="os")
        self.store.create_topic(
            TOPIC,
            partitions=PARTITIONS,
            segment_bytes=1500,
            segment_ms=1000,
            index_interval_bytes=150,
            # no generated uid header: the model holds exactly the headers appended, and the
            # files' sizes (which the crash rule draws its cut from) do not depend on random IDs,
            # so hypothesis can replay and shrink a run
            unique_ids=False,
        )
        self.model: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        self.crashes = 0

    def teardown(self) -> None:
        segments = len(list(Path(self.path).glob("*/*.log")))
        event(f"segments at the end: {min(segments, 6)}{'+' if segments >= 6 else ''}")
        self.store.close()
        shutil.rmtree(self.root)

    # -- writes ---------------------------------------------------------------------------------

    @rule(p=partitions, rec=records)
    def append(self, p: int, rec: Record) -> None:
        key, value, hdrs, ts = rec
        md = self.store.append(TOPIC, value, key=key, headers=list(hdrs), partition=p, timestamp=ts)
        assert (md.partition, md.offset, md.timestamp) == (p, len(self.model[p]), ts)
        self.model[p].append(rec)

    @rule(
        p=partitions, recs=st.lists(records, min_size=1, max_size=20), codec=st.sampled_from(CODECS)
    )
    def append_batch(self, p: int, recs: list[Record], codec: str) -> None:
        md = self.store.append_batch(
            TOPIC,
            [r[1] for r in recs],
            keys=[r[0] for r in recs],
            headers=[list(r[2]) for r in recs],
            partition=p,
            timestamps=[r[3] for r in recs],
            compression=codec,
        )
        assert md == mqcore.BatchMetadata(p, len(self.model[p]), len(recs), TOPIC)
        self.model[p].extend(recs)

    # -- reads ----------------------------------------------------------------------------------

    @rule(p=partitions, data=st.data())
    def read(self, p: int, data: st.DataObject) -> None:
        n = len(self.model[p])
        offset = data.draw(st.integers(0, n), label="offset")
        max_records = data.draw(st.integers(0, 60), label="max_records")
        got = [as_record(m) for m in self.store.read(TOPIC, p, offset, max_records)]
        assert got == expected(self.model[p], offset, offset + max_records)

    @rule(p=partitions, data=st.data())
    def get(self, p: int, data: st.DataObject) -> None:
        n = len(self.model[p])
        offset = data.draw(st.integers(0, n + 2), label="offset")
        m = self.store.get(TOPIC, p, offset)
        if offset < n:
            assert m is not None and as_record(m) == (offset, *self.model[p][offset])
        else:
            assert m is None

    @rule(p=partitions, ts=st.integers(min_value=-1, max_value=6100))
    def offset_for_time(self, p: int, ts: int) -> None:
        want = next((o for o, r in enumerate(self.model[p]) if r[3] >= ts), None)
        assert self.store.offset_for_time(TOPIC, p, ts) == want

    @rule(p=partitions, data=st.data())
    def read_arrow(self, p: int, data: st.DataObject) -> None:
        n = len(self.model[p])
        start = data.draw(st.integers(0, n), label="start")
        end = data.draw(st.integers(start, n), label="end")
        rb = self.store.read_arrow(TOPIC, p, start, end, include_headers=True)
        rows = list(
            zip(
                rb.column("offset").to_pylist(),
                rb.column("key").to_pylist(),
                rb.column("value").to_pylist(),
                [
                    tuple((h["key"], h["value"]) for h in hs)
                    for hs in rb.column("headers").to_pylist()
                ],
                [us // 1000 for us in rb.column("timestamp").cast("int64").to_pylist()],
                strict=True,
            )
        )
        assert rows == expected(self.model[p], start, end)

    @rule(p=partitions)
    def read_only_beside_the_writer(self, p: int) -> None:
        """A read-only opener next to the open writer (unclean to its eyes) sees the model."""
        with mqcore.open(self.path, read_only=True) as ro:
            assert ro.end_offset(TOPIC, p) == len(self.model[p])
            got = [as_record(m) for m in ro.read(TOPIC, p, 0, len(self.model[p]) + 1)]
            assert got == expected(self.model[p], 0, len(self.model[p]))

    # -- lifecycle ------------------------------------------------------------------------------

    @rule()
    def reopen(self) -> None:
        """Clean close and open: nothing is lost, nothing needs recovery."""
        self.store.close()
        self.store = mqcore.open(self.path, flush="os")
        for p in range(PARTITIONS):
            assert self.store.recovery[(TOPIC, p)].truncated_bytes == 0

    @precondition(lambda self: self.crashes < 4)
    @rule(p=partitions, data=st.data())
    def crash(self, p: int, data: st.DataObject) -> None:
        """Copy the directory as a killed writer leaves it, cut partition p's last segment at
        a byte, reopen the copy; the model loses exactly the batches past the cut."""
        self.crashes += 1
        self.generation += 1
        copy = os.path.join(self.root, f"g{self.generation}")
        shutil.copytree(self.path, copy)
        self.store.close()
        shutil.rmtree(self.path)
        self.path = copy
        log = sorted(Path(copy, f"{TOPIC}-{p}").glob("*.log"))[-1]
        cut = data.draw(st.integers(0, log.stat().st_size), label="cut")
        lost_from = whole_batches_before(log, cut)
        os.truncate(log, cut)
        self.store = mqcore.open(self.path, flush="os")
        report = self.store.recovery[(TOPIC, p)]
        assert report.recovered_segments, "a crashed store must be recovered"
        assert report.truncated_bytes == cut - log.stat().st_size
        if lost_from is not None:
            event("crash lost records" + (" mid-batch" if report.truncated_bytes else ""))
            self.model[p] = self.model[p][:lost_from]
        else:
            event("crash lost nothing")
            assert report.truncated_bytes == 0

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def offsets_match_the_model(self) -> None:
        for p in range(PARTITIONS):
            assert self.store.start_offset(TOPIC, p) == 0
            assert self.store.end_offset(TOPIC, p) == len(self.model[p])


LogMachine.TestCase.settings = settings(
    max_examples=35,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
test_log_against_model = LogMachine.TestCase
