"""`mqcore query`: find messages by store ID, unique ID, key, time range, tag, selector, content.

Index lookups (--id, --unique-id) go through Store.get_by_id / find_by_unique_id; --key and
every scan are one Store.search with the filters combined (--key: the key index's hits, then
the filters). A query with --from or --to comes back in time order across partitions (a merge
by timestamp), any other in partition order; --order picks either. Matches are printed as they
come, then a completion line: why the query ended, how much it scanned, and the cursor to
resume from (stderr in text mode; a final {"type": "summary"} object with --json). With the
progress bar on, a scan runs as a series of searches of at most CHUNK records each, resumed by
cursor, so the bar can follow it; the result is the same as one search.

Ctrl-C during a scan prints what was found so far, then the completion line with reason
"interrupted" and the cursor to resume from; exit status 130. The search itself stops with
QueryInterrupted (its cursor is exact); Ctrl-C is held back while a chunk's matches print, so
a resumed scan neither repeats nor skips a message.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import mqcore
from mqcore.cli import hints, render
from mqcore.cli.options import (
    UsageError,
    add_isolation,
    add_json,
    add_progress,
    arg_bytes,
    check_seconds,
    integer,
    interrupts_deferred,
    parse_time,
    positive,
    progress_enabled,
    warn,
)
from mqcore.cli.stats import partition_files
from mqcore.errors import QueryInterrupted
from mqcore.query import jsonform
from mqcore.store import QueryResult

CHUNK = 50_000  # records one search scans between progress updates
ORDERS = ("time", "partition")
DEFAULT_MAX_SCAN = 10_000_000  # Store.search's default

SCAN_OPTIONS = ("start", "end", "tag", "where", "contains", "regex")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "query",
        help="find messages by ID, key, time, tag, SQL92 selector or content",
        description="Find messages. Give one of --id or --unique-id, or any mix of --key "
        "and the scan filters --from/--to/--tag/--where/--contains/--regex (all must hold; "
        "--key is looked up in the key index, the filters then test its hits). With --from "
        "or --to the messages come merged by timestamp across partitions, otherwise "
        "partition by partition (--order). Text output: topic, partition, offset, timestamp, "
        "msg_id, key, value, tab-separated (timestamp as 2024-06-10T10:00:00.123Z "
        "(1718013600123)), non-UTF-8 bytes as \\xNN; then a completion line on stderr "
        "(reason, records and bytes scanned, cursor to resume). Exit status 0 whenever the "
        "query ran, whatever it found; 130 when Ctrl-C stopped it (the completion line then "
        "gives the cursor to resume from).",
    )
    p.add_argument("store", help="store directory")
    p.add_argument(
        "topic", nargs="?", help="the topic (needed except for --id and --unique-id, "
        "which then only keep messages of this topic)"
    )  # fmt: skip
    p.add_argument("--id", metavar="MSG_ID", help="the message with this store ID (m1-...)")
    p.add_argument("--unique-id", metavar="UID", help="messages with this unique ID (any topic)")
    p.add_argument("--key", help="messages with this key (or extra key)")
    p.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="timestamp >= TIME: ms since the epoch, or ISO-8601 (2024-05-01T12:00:00Z; no "
        "zone means UTC)",
    )
    p.add_argument(
        "--to",
        dest="end",
        metavar="TIME",
        help="timestamp < TIME (as --from; --to before --from is refused, equal to it is empty)",
    )
    p.add_argument("--tag", help="messages with this tag")
    p.add_argument(
        "--where",
        metavar="SQL92",
        help='properties selector, e.g. "amount > 10" or "service = \'payments\'" (quote '
        "string values: service = payments compares two properties)",
    )
    p.add_argument("--contains", metavar="TEXT", help="values containing these bytes")
    p.add_argument("--regex", metavar="PATTERN", help="values matching this regex (bytes)")
    p.add_argument("-p", "--partition", type=integer, default=None, help="only this partition")
    p.add_argument(
        "--order",
        choices=ORDERS,
        default=None,
        help="time: merged across partitions by timestamp (the default with --from or --to, "
        "or a time-order --cursor); partition: partition by partition, each in offset order "
        "(the default otherwise)",
    )
    p.add_argument(
        "--limit",
        type=positive,
        default=None,
        help="at most this many messages (default: 1000; 1 for --unique-id)",
    )
    p.add_argument(
        "--max-scan",
        type=positive,
        default=None,
        metavar="N",
        help=f"scans stop after N records (default {DEFAULT_MAX_SCAN:,})",
    )
    p.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS", help="scans stop after this"
    )
    p.add_argument("--cursor", help="resume a --key query or a scan where it stopped")
    add_isolation(p)
    add_json(p, 'message objects, then {"type": "summary", ...}')
    add_progress(p)
    p.set_defaults(run=cmd_query)


def cmd_query(args: argparse.Namespace, out: TextIO) -> int:
    kind = _kind(args)
    check_seconds(args.timeout, "--timeout")
    start = None if args.start is None else parse_time(args.start, "--from")
    end = None if args.end is None else parse_time(args.end, "--to")
    if start is not None and start == end:
        warn(f"--from equals --to ({render.time_text(start)}): the range holds nothing (--to is "
             "exclusive)")  # fmt: skip
    limit: dict[str, Any] = {} if args.limit is None else {"limit": args.limit}  # else the API's
    with mqcore.open(args.store, read_only=True) as store:
        if args.topic is not None:
            store.partitions(args.topic)  # UnknownTopicError for a topic that is not there
        if kind == "id":
            msg = store.get_by_id(args.id, isolation_level=args.isolation_level)
            found = [] if msg is None or not _in_topic(msg, args.topic) else [msg]
            _print(out, args.json, found)
            _summary(args.json, out, Outcome("exhausted", len(found), 1))
        elif kind == "unique_id":
            r = store.find_by_unique_id(args.unique_id, start=start, end=end, **limit,
                                        isolation_level=args.isolation_level)  # fmt: skip
            found = [m for m in r if _in_topic(m, args.topic)]
            _print(out, args.json, found)
            _summary(args.json, out, Outcome(r.reason, len(found), r.scanned_records, 0, r.cursor))
        else:
            outcome = _scan(store, args, start, end, out)
            seen: list[str] = []
            if outcome.missing and not args.json:  # what the selector could have meant
                seen = hints.properties_seen(store, [args.topic])
            _summary(args.json, out, outcome, args.where, seen)
            if outcome.reason == "interrupted":
                return 130
    return 0


def _kind(args: argparse.Namespace) -> str:
    """Which query the options ask for; UsageError for options that do not go together."""
    lookups = [k for k in ("id", "unique_id", "key") if getattr(args, k) is not None]
    scans = [k for k in SCAN_OPTIONS if getattr(args, k) is not None]
    if len(lookups) > 1:
        raise UsageError("give only one of --id, --unique-id and --key")
    kind = lookups[0] if lookups else "scan"
    if kind == "scan" and not scans:
        raise UsageError(
            "give --id, --unique-id, --key or a scan filter (--from, --to, --tag, --where, "
            "--contains, --regex)"
        )
    scan = (*SCAN_OPTIONS, "limit", "partition", "cursor", "max_scan", "timeout", "order")
    allowed = {"id": (), "unique_id": ("start", "end", "limit")}.get(kind, scan)
    extra = [k for k in scan if getattr(args, k) is not None and k not in allowed]
    if extra:
        names = ", ".join(_flag(k) for k in extra)
        raise UsageError(f"{_flag(kind)} does not take {names}")
    if kind in ("key", "scan") and args.topic is None:
        raise UsageError(f"{_flag(kind)} needs a TOPIC")
    return kind


def _flag(dest: str) -> str:
    return {"start": "--from", "end": "--to", "scan": "a scan"}.get(
        dest, "--" + dest.replace("_", "-")
    )


def _in_topic(msg: mqcore.Message, topic: str | None) -> bool:
    return topic is None or msg.topic == topic


def _print(out: TextIO, as_json: bool, messages: list[mqcore.Message]) -> None:
    for m in messages:
        if as_json:
            render.emit(out, jsonform.message_object(m))
        else:
            out.write(render.message_line(m) + "\n")
    out.flush()


@dataclass
class Outcome:
    """How a query ended, for its completion line: summed over a scan's chunks."""

    reason: str = "exhausted"
    found: int = 0
    records: int = 0
    scanned_bytes: int = 0
    cursor: str | None = None
    # selector names no examined message carried (None: no selector, or nothing examined)
    missing: set[str] | None = None

    def add(self, r: QueryResult) -> None:
        """Count one search (a chunk) in: a name is missing when no chunk's messages had it."""
        self.reason, self.cursor = r.reason, r.cursor
        self.found += len(r)
        self.records += r.scanned_records
        self.scanned_bytes += r.scanned_bytes
        if r.missing_properties is not None:
            names = set(r.missing_properties)
            self.missing = names if self.missing is None else self.missing & names


def _summary(
    as_json: bool, out: TextIO, o: Outcome, where: str | None = None, seen: list[str] | None = None
) -> None:
    missing = sorted(o.missing or ())
    if as_json:
        render.emit(
            out,
            {
                "type": "summary",
                "reason": o.reason,
                "complete": o.reason == "exhausted",
                "messages": o.found,
                "scanned_records": o.records,
                "scanned_bytes": o.scanned_bytes,
                "cursor": o.cursor,
                "missing_properties": missing,
            },
        )
        return
    line = (
        f"mqcore: query {o.reason}: {render.plural(o.found, 'message')}, read {o.records:,} records"
    )
    if o.scanned_bytes:
        line += f" ({render.human_bytes(o.scanned_bytes)})"
    if o.cursor is not None and o.reason != "exhausted":
        line += f"; resume with --cursor {o.cursor}"
    print(line, file=sys.stderr)
    for name in missing:
        note = _missing_note(name, where or "")
        if seen is not None:  # and the names it may have meant
            note += f"; {hints.property_hint(name, seen)}"
        print(f"mqcore: note: {note}", file=sys.stderr)


def _missing_note(name: str, where: str) -> str:
    """What to say of a selector name no scanned message had: most often a string value
    written without quotes, so show the user's own selector with it quoted when it stands on
    the right of a comparison."""
    note = f"no scanned message has property {name!r}: quote string values, e.g. "
    bare = re.compile(rf"((?:=|<>|!=|<|>)\s*){re.escape(name)}(?![\w.$])")
    if bare.search(where) is None:
        return note + "--where \"service = 'payments'\""
    quoted = bare.sub(lambda m: f"{m[1]}'{name}'", where)
    return note + f"--where {json.dumps(quoted, ensure_ascii=False)}"


def _scan(
    store: mqcore.Store, args: argparse.Namespace, start: int | None, end: int | None, out: TextIO
) -> Outcome:
    """One search, or with the progress bar a series of them resumed by cursor; matches are
    printed as each search returns. Ctrl-C ends it with reason "interrupted" (module doc)."""
    filters: dict[str, Any] = {
        "contains": None if args.contains is None else arg_bytes(args.contains),
        "regex": None if args.regex is None else arg_bytes(args.regex),
        "tag": args.tag,
        "where": args.where,
        "key": None if args.key is None else arg_bytes(args.key),
        "partition": args.partition,
        "start": start,
        "end": end,
        "order": query_order(args.order, start, end, args.cursor),
        "isolation_level": args.isolation_level,
    }
    limit = 1000 if args.limit is None else args.limit
    max_scan = DEFAULT_MAX_SCAN if args.max_scan is None else args.max_scan
    progress = progress_enabled(args) and args.key is None  # a key reads no log bytes
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    bar: render.Progress | None = None
    done = Outcome(cursor=args.cursor)
    more = True  # the scan has more to do (a Ctrl-C now interrupts it)
    try:
        while more:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                r = store.search(
                    args.topic,
                    limit=limit - done.found,
                    max_scan=min(CHUNK, max_scan - done.records) if progress else max_scan,
                    timeout=left,
                    cursor=done.cursor,
                    **filters,
                )
            except QueryInterrupted as stop:
                r = stop.result
            with interrupts_deferred():  # the chunk's matches print, and count, whole
                _print(out, args.json, r.messages)
                done.add(r)
                first = bar is None
                if bar is None:  # drawn after the first search: its warnings come before
                    total = _log_bytes(store, args) if progress else 0
                    bar = render.Progress(f"query {args.topic}", total, progress)
                bar.update(done.scanned_bytes, done.records, force=first)
                more = progress and done.reason == "max_scan" and done.records < max_scan
    except KeyboardInterrupt:  # between searches: `done` holds what was printed
        if more:  # else the scan had ended: its own reason stands
            done.reason = "interrupted"
    finally:
        if bar is not None:
            bar.close(complete=done.reason == "exhausted")
    return done


def query_order(order: str | None, start: int | None, end: int | None, cursor: str | None) -> str:
    """--order, else time order for a time window or a time-order cursor ("what happened
    between 10:00 and 10:05" reads by time), else partition order."""
    if order is not None:
        return order
    timed = start is not None or end is not None or (cursor or "").startswith("t1")
    return "time" if timed else "partition"


def _log_bytes(store: mqcore.Store, args: argparse.Namespace) -> int:
    """Bytes of the .log files the scan reads, the progress bar's total."""
    parts = store.available_partitions(args.topic) if args.partition is None else [args.partition]
    return sum(
        os.path.getsize(f)
        for p in parts
        for f in partition_files(store.path, args.topic, p)
        if f.endswith(".log")
    )
