"""Concurrency soak: writers, readers, a consumer group (two members, and a
third that joins mid-run and leaves) and retention on one store at once.

Runs MQCORE_SOAK_SECONDS (default 12) seconds, then drains the group and checks: no acknowledged
message lost (each was consumed, or retention removed it: it lies below the final log start),
no duplicate consumption within a partition, offsets strictly increasing in every read and
poll, every value whole and consistent with the writer's sequence, and no exception anywhere.
Figures go to stdout (`pytest -s`) for docs/testing.md.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable

import mqcore
from mqcore.consume.consumer import Consumer
from mqcore.errors import OffsetOutOfRangeError

TOPIC = "soak"
PARTITIONS = 3
WRITERS = 3
READERS = 2
CONSUMERS = 2
VISITOR_MESSAGES = 3000  # the third consumer leaves after this many
JOIN_AFTER = 2000  # it joins once writer 0 has appended this many
PAD = b"." * 40


def soak_seconds() -> float:
    return float(os.environ.get("MQCORE_SOAK_SECONDS", "12"))


def encode(writer: int, seq: int) -> bytes:
    return b"%d:%d:" % (writer, seq) + PAD


def decode(value: bytes | None) -> tuple[int, int]:
    """(writer, seq) of a soak value; AssertionError on anything partial or foreign."""
    assert value is not None
    writer, seq, pad = value.split(b":")
    assert pad == PAD, value
    return int(writer), int(seq)


class Soak:
    def __init__(self, store: mqcore.Store):
        self.store = store
        self.stop = threading.Event()  # writers, readers and retention stop
        self.drain = threading.Event()  # consumers: the writers are done, catch up and leave
        self.midway = threading.Event()  # writer 0 has appended JOIN_AFTER: the visitor joins
        self.errors: list[BaseException] = []
        self.acked: list[list[tuple[int, int, int]]] = [[] for _ in range(WRITERS)]
        self.consumed: list[list[tuple[int, int, bytes | None]]] = [
            [] for _ in range(CONSUMERS + 1)
        ]
        self.reads = 0
        self.read_records = 0
        self.retention_passes = 0
        self.retention_deleted = 0

    def guard(self, fn: Callable[..., None], *args: object) -> threading.Thread:
        def run() -> None:
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - collected and failed on by the test
                self.errors.append(e)
                self.stop.set()
                self.drain.set()
                self.midway.set()

        t = threading.Thread(target=run, name=fn.__name__)
        t.start()
        return t

    def writer(self, wid: int) -> None:
        seq = 0
        out = self.acked[wid]
        while not self.stop.is_set():
            p = (seq + wid) % PARTITIONS
            md = self.store.append(TOPIC, encode(wid, seq), partition=p)
            out.append((p, md.offset, seq))
            seq += 1
            if seq == JOIN_AFTER:
                self.midway.set()

    def reader(self, rid: int) -> None:
        rng = random.Random(rid)
        s = self.store
        while not self.stop.is_set():
            p = rng.randrange(PARTITIONS)
            start, end = s.start_offset(TOPIC, p), s.end_offset(TOPIC, p)
            if end == start:
                continue
            offset = rng.randrange(start, end)
            kind = rng.randrange(3)
            try:
                if kind == 0:
                    msgs = s.read(TOPIC, p, offset, 50)
                    self.check_run(offset, [(m.offset, m.value) for m in msgs])
                elif kind == 1:
                    m = s.get(TOPIC, p, offset)
                    if m is not None:
                        assert m.offset == offset
                        decode(m.value)
                        self.read_records += 1
                else:
                    for rb in s.iter_arrow(TOPIC, p, offset, min(end, offset + 200)):
                        offs = rb.column("offset").to_pylist()
                        vals = rb.column("value").to_pylist()
                        self.check_run(offset, list(zip(offs, vals, strict=True)))
                        offset = offs[-1] + 1 if offs else offset
            except OffsetOutOfRangeError:
                pass  # retention moved the log start past the offset since we looked
            self.reads += 1

    def check_run(self, first: int, run: list[tuple[int, bytes | None]]) -> None:
        """Offsets strictly increasing from `first`; each value whole."""
        last = first - 1
        for offset, value in run:
            assert offset > last, (first, offset, last)
            last = offset
            decode(value)
        self.read_records += len(run)

    def consumer(self, cid: int, consumer: Consumer, ready: threading.Barrier) -> None:
        out = self.consumed[cid]
        last: dict[int, int] = {}
        ready.wait()
        while True:
            msgs = consumer.poll(max_records=200)
            for m in msgs:
                assert m.offset > last.get(m.partition, -1), (m.partition, m.offset)
                last[m.partition] = m.offset
                decode(m.value)
                out.append((m.partition, m.offset, m.value))
            consumer.commit()
            if self.drain.is_set() and not msgs and not any(consumer.lag().values()):
                return

    def visitor(self, cid: int, ready: threading.Barrier) -> None:
        """A third member that joins mid-run, consumes a while, commits and leaves: two
        rebalances (handoffs) while the others poll."""
        out = self.consumed[cid]
        ready.wait()
        self.midway.wait()
        if self.stop.is_set():
            return
        consumer = self.store.consumer("g", [TOPIC])
        try:
            while len(out) < VISITOR_MESSAGES and not self.stop.is_set():
                for m in consumer.poll(max_records=200):
                    decode(m.value)
                    out.append((m.partition, m.offset, m.value))
                consumer.commit()
        finally:
            consumer.close()

    def retention(self) -> None:
        while not self.stop.is_set():
            report = self.store.apply_retention(TOPIC)
            self.retention_passes += 1
            self.retention_deleted += len(report.deleted_segments)


def test_soak(store_path: str) -> None:
    seconds = soak_seconds()
    with mqcore.open(store_path, flush="os") as store:
        store.create_topic(TOPIC, partitions=PARTITIONS, segment_bytes=8192, retention_bytes=32768)
        soak = Soak(store)
        consumers = [store.consumer("g", [TOPIC]) for _ in range(CONSUMERS)]
        ready = threading.Barrier(CONSUMERS + 1)
        began = time.monotonic()
        group = [soak.guard(soak.consumer, i, c, ready) for i, c in enumerate(consumers)]
        group.append(soak.guard(soak.visitor, CONSUMERS, ready))
        others = [soak.guard(soak.writer, w) for w in range(WRITERS)]
        others += [soak.guard(soak.reader, r) for r in range(READERS)]
        others.append(soak.guard(soak.retention))
        soak.stop.wait(seconds)
        soak.stop.set()
        soak.midway.set()
        for t in others:
            t.join(120)
        elapsed = time.monotonic() - began
        soak.drain.set()
        for t in group:
            t.join(120)
        assert not any(t.is_alive() for t in others + group)
        for c in consumers:
            c.close()
        assert not soak.errors, soak.errors
        starts = [store.start_offset(TOPIC, p) for p in range(PARTITIONS)]
        ends = [store.end_offset(TOPIC, p) for p in range(PARTITIONS)]

    consumed: dict[int, dict[int, bytes | None]] = {p: {} for p in range(PARTITIONS)}
    for part in soak.consumed:
        for p, offset, value in part:
            assert offset not in consumed[p], f"offset {offset} of partition {p} consumed twice"
            consumed[p][offset] = value
    appended = 0
    lost = []
    for wid, acks in enumerate(soak.acked):
        last_offset: dict[int, int] = {}
        for p, offset, seq in acks:
            assert offset > last_offset.get(p, -1)  # one writer's offsets grow per partition
            last_offset[p] = offset
            appended += 1
            if offset in consumed[p]:
                assert decode(consumed[p][offset]) == (wid, seq)
            elif offset >= starts[p]:
                lost.append((p, offset, wid, seq))
    assert not lost, f"{len(lost)} acknowledged messages neither consumed nor retained: {lost[:5]}"
    assert appended == sum(ends)
    total_consumed = sum(len(c) for c in consumed.values())
    print(
        f"\nsoak {elapsed:.1f}s: {appended} appends ({appended / elapsed:.0f}/s), "
        f"{soak.reads} reads ({soak.read_records} records), {total_consumed} consumed "
        f"({len(soak.consumed[CONSUMERS])} by the visitor), "
        f"{soak.retention_passes} retention passes ({soak.retention_deleted} segments deleted)"
    )
    assert soak.retention_deleted > 0
    assert total_consumed > 0
    assert soak.consumed[CONSUMERS], "the visiting consumer got nothing: no handoff exercised"
