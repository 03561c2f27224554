"""`mqcore stats`: per partition offsets, message counts, segments, bytes on disk, timestamps.

Offsets come from the store; message and batch counts and the largest timestamp from a walk over
every batch header of every segment (mqcore._ext.batch.peek_batch_header on a read-only map,
no record decoded), which is the long part on a big store and drives the progress bar.
"""

from __future__ import annotations

import argparse
import mmap
import os
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import mqcore
from mqcore._ext.batch import peek_batch_header
from mqcore.cli import render
from mqcore.cli.options import add_json, add_progress, progress_enabled

SUFFIXES = {".log": "log", ".index": "index", ".timeindex": "timeindex", ".keyindex": "keyindex"}


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "stats",
        help="offsets, message counts, segments, bytes and timestamps per partition",
        description="Per topic-partition: start and end offset, messages (records outside "
        "control batches), segments, bytes of .log, .index + .timeindex and .keyindex files "
        "(their sizes; DISK is the space all the partition's files take: blocks allocated, "
        "smaller than the sizes of preallocated sparse files), timestamps of "
        "the first and last message; then totals.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("topic", nargs="?", help="only this topic")
    add_json(
        p,
        '{"type": "partition", ...} per partition, then {"type": "total", ...}; byte counts exact',
    )
    add_progress(p)
    p.set_defaults(run=cmd_stats)


@dataclass
class PartitionStats:
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    messages: int = 0
    batches: int = 0
    segments: int = 0
    log_bytes: int = 0
    index_bytes: int = 0
    timeindex_bytes: int = 0
    keyindex_bytes: int = 0
    disk_bytes: int = 0
    first_timestamp: int = -1
    last_timestamp: int = -1
    max_timestamp: int = -1


def partition_files(store_path: str, topic: str, partition: int) -> list[str]:
    """The segment files (.log, .index, .timeindex, .keyindex) of one partition, sorted."""
    directory = os.path.join(store_path, f"{topic}-{partition}")
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [
        os.path.join(directory, n)
        for n in names
        if os.path.splitext(n)[1] in SUFFIXES and os.path.splitext(n)[0].isdigit()
    ]


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    with mqcore.open(args.store, read_only=True) as store:
        topics = store.topics() if args.topic is None else [args.topic]
        work = [(t, p) for t in topics for p in store.available_partitions(t)]
        files = {tp: partition_files(store.path, *tp) for tp in work}
        total_log = sum(
            os.path.getsize(f) for fs in files.values() for f in fs if f.endswith(".log")
        )
        bar = render.Progress("stats", total_log, progress_enabled(args))
        rows: list[PartitionStats] = []
        try:
            for t, p in work:
                rows.append(_partition_stats(store, t, p, files[(t, p)], bar))
        finally:
            bar.close(complete=True)
    total = PartitionStats("*", -1, 0, 0)
    for r in rows:
        for name in ("messages", "batches", "segments", "log_bytes", "index_bytes",
                     "timeindex_bytes", "keyindex_bytes", "disk_bytes"):  # fmt: skip
            setattr(total, name, getattr(total, name) + getattr(r, name))
        total.max_timestamp = max(total.max_timestamp, r.max_timestamp)
        total.last_timestamp = max(total.last_timestamp, r.last_timestamp)
        if r.first_timestamp >= 0 and not 0 <= total.first_timestamp <= r.first_timestamp:
            total.first_timestamp = r.first_timestamp
    if args.json:
        for r in rows:
            render.emit(out, {"type": "partition", **asdict(r)})
        doc = asdict(total)
        for name in ("topic", "partition", "start_offset", "end_offset"):
            del doc[name]
        render.emit(out, {"type": "total", "partitions": len(rows), **doc})
        return 0
    out.write(render.table(_text_rows(rows, total)))
    return 0


def _text_rows(rows: list[PartitionStats], total: PartitionStats) -> list[tuple[str, ...]]:
    head = ("TOPIC", "PARTITION", "START", "END", "MESSAGES", "SEGMENTS", "LOG", "INDEXES",
            "KEYINDEX", "DISK", "FIRST", "LAST")  # fmt: skip
    cells: list[tuple[str, ...]] = [head]
    for r in [*rows, total]:
        is_total = r is total
        cells.append(
            (
                "TOTAL" if is_total else r.topic,
                "" if is_total else str(r.partition),
                "" if is_total else str(r.start_offset),
                "" if is_total else str(r.end_offset),
                str(r.messages),
                str(r.segments),
                render.human_bytes(r.log_bytes),
                render.human_bytes(r.index_bytes + r.timeindex_bytes),
                render.human_bytes(r.keyindex_bytes),
                render.human_bytes(r.disk_bytes),
                render.iso_ms(r.first_timestamp),
                render.iso_ms(r.last_timestamp),
            )
        )
    return cells


def _partition_stats(
    store: mqcore.Store, topic: str, partition: int, files: list[str], bar: render.Progress
) -> PartitionStats:
    st = PartitionStats(
        topic,
        partition,
        store.start_offset(topic, partition),
        store.end_offset(topic, partition),
        disk_bytes=store.disk_bytes(topic, partition),
    )
    last_base = -1
    for path in files:
        info = os.stat(path)
        kind = SUFFIXES[os.path.splitext(path)[1]]
        setattr(st, f"{kind}_bytes", getattr(st, f"{kind}_bytes") + info.st_size)
        if kind == "log":
            st.segments += 1
            base = _walk_log(path, st, bar)
            if base >= 0:
                last_base = base
    if st.messages:
        first = store.read(topic, partition, st.start_offset, 1)
        if first:
            st.first_timestamp = first[0].timestamp
        if last_base >= 0:
            tail = store.read(topic, partition, max(last_base, st.start_offset), 1 << 20)
            if tail:
                st.last_timestamp = tail[-1].timestamp
    return st


def _walk_log(path: str, st: PartitionStats, bar: render.Progress) -> int:
    """Count the batches and records of one .log from their headers; returns the base offset
    of its last data batch (-1: none). Stops at the first header that does not parse or a
    batch that runs past the end (a writer's unfinished append)."""
    last_base = -1
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return last_base
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                pos = 0
                done_before, records_before, messages_before = bar.done, bar.records, st.messages
                while pos < size:
                    info = peek_batch_header(view, pos)
                    if info is None or pos + info.size > size:
                        break
                    pos += info.size
                    st.batches += 1
                    if not info.is_control:
                        st.messages += info.records_count
                        if info.records_count:
                            last_base = info.base_offset
                    st.max_timestamp = max(st.max_timestamp, info.max_timestamp)
                    if st.batches % 4096 == 0:
                        bar.update(
                            done_before + pos, records_before + st.messages - messages_before
                        )
                bar.update(done_before + size, records_before + st.messages - messages_before)
            finally:
                view.release()
    return last_base
