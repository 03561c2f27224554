"""`mqcore compact` and `mqcore retention`: run a compaction or retention pass now.

Both open the store writable (they take the writer lock, like `produce`), draw a progress bar
on stderr counted in segments, and print a summary on stdout (`--json`: one object). They
delete and replace segment files, which only the store's writer may do, so beside a running
writer they are refused: stop it, or run the pass in its process (`store.compact()`,
`store.apply_retention()`; a writer also runs both on its own schedule, docs/consume.md).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import add_json, add_progress, parse_time, progress_enabled
from mqcore.errors import StoreLockedError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "compact",
        help="compact a topic now (keep the latest record per key)",
        description="Run one compaction pass over every partition of TOPIC, whose "
        "cleanup_policy must contain 'compact': sealed segments keep only the latest record "
        "of each key; tombstones go delete_retention_ms after the pass that first saw them. "
        "Offsets never change. Needs the writer lock: refused while a writer has the store "
        "open (call store.compact(topic) in that process instead).",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("topic", help="topic to compact")
    _common(p, '{"type": "compaction", "topic": ..., "cleaned_segments": [...], ...}')
    p.set_defaults(run=cmd_compact, method="store.compact(topic)")
    p = sub.add_parser(
        "retention",
        help="delete expired segments now (retention_ms, retention_bytes)",
        description="Run one retention pass over TOPIC (default: every topic whose "
        "cleanup_policy contains 'delete'): whole segments older than retention_ms, or beyond "
        "retention_bytes, are deleted from the start of each partition; the log start offset "
        "moves forward. The active segment is never deleted. Needs the writer lock: refused "
        "while a writer has the store open (call store.apply_retention() in that process "
        "instead).",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("topic", nargs="?", help="only this topic")
    _common(p, '{"type": "retention", "deleted_segments": [...], "start_offsets": [...], ...}')
    p.set_defaults(run=cmd_retention, method="store.apply_retention()")


def _common(p: argparse.ArgumentParser, json_what: str) -> None:
    p.add_argument(
        "--now",
        metavar="TIME",
        help="take TIME (ms since the epoch or ISO 8601) as the current time (default: now)",
    )
    add_json(p, json_what)
    add_progress(p)


class SegmentProgress(render.Progress):
    """The shared progress bar, counted in segments instead of bytes."""

    def line(self, width: int) -> str:
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        tail = f" {frac * 100:5.1f}% {self.done:,}/{self.total:,} segments"
        bar_width = max(10, min(40, width - len(self.label) - len(tail) - 4))
        filled = int(frac * bar_width)
        return f"{self.label} [{'#' * filled}{'.' * (bar_width - filled)}]{tail}"[:width]


def _run(args: argparse.Namespace, label: str, work: Any) -> Any:
    now = None if args.now is None else parse_time(args.now, "--now")
    bar = SegmentProgress(label, 0, progress_enabled(args))

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)

    try:
        try:
            store = mqcore.open(args.store, create=False)
        except StoreLockedError as e:
            raise StoreLockedError(
                f"{args.command} needs the writer lock of {e.path}, which another process "
                f"holds ({e.holder}): stop that writer first, or call {args.method} in the "
                "writer's process (its background tasks also run it on schedule)",
                e.path,
                e.holder,
            ) from None
        with store:
            return work(store, now, progress)
    finally:
        bar.close(complete=True)


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    report = _run(
        args,
        f"compact {args.topic}",
        lambda store, now, progress: store.compact(args.topic, now=now, progress=progress),
    )
    if args.json:
        render.emit(out, {"type": "compaction", "topic": args.topic, **report.to_json()})
        return 0
    out.write(
        f"compacted {args.topic}: {len(report.cleaned_segments)} of "
        f"{render.plural(report.segments_seen, 'sealed segment')} rewritten, "
        f"{render.plural(report.records_removed, 'record')} removed "
        f"({render.plural(report.tombstones_removed, 'tombstone')}), "
        f"{render.human_bytes(report.bytes_before)} -> {render.human_bytes(report.bytes_after)}\n"
    )
    return 0


def cmd_retention(args: argparse.Namespace, out: TextIO) -> int:
    report = _run(
        args,
        "retention" if args.topic is None else f"retention {args.topic}",
        lambda store, now, progress: store.apply_retention(args.topic, now=now, progress=progress),
    )
    if args.json:
        render.emit(out, {"type": "retention", **report.to_json()})
        return 0
    out.write(
        f"deleted {render.plural(len(report.deleted_segments), 'segment')} "
        f"({render.human_bytes(report.deleted_bytes)})\n"
    )
    for name in report.deleted_segments:
        out.write(f"  {name}\n")
    for (topic, partition), offset in sorted(report.start_offsets.items()):
        out.write(f"{topic}-{partition}: log start offset {offset}\n")
    return 0
