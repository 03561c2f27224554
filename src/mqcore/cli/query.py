"""`mqcore query`: find messages by store ID, unique ID, key, time range, tag, selector, content.

Index lookups (--id, --unique-id, --key) go through Store.get_by_id / find_by_unique_id /
find_by_key; everything else is one Store.search scan with its filters combined. Matches are
printed as they come, then a completion line: why the query ended, how much it scanned, and the
cursor to resume from (stderr in text mode; a final {"type": "summary"} object with --json).
With the progress bar on, a scan runs as a series of searches of at most CHUNK records each,
resumed by cursor, so the bar can follow it; the result is the same as one search.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import (
    UsageError,
    add_json,
    add_progress,
    arg_bytes,
    check_seconds,
    integer,
    parse_time,
    positive,
    progress_enabled,
)
from mqcore.cli.stats import partition_files

CHUNK = 50_000  # records one search scans between progress updates
DEFAULT_MAX_SCAN = 10_000_000  # Store.search's default

SCAN_OPTIONS = ("start", "end", "tag", "where", "contains", "regex")


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "query",
        help="find messages by ID, key, time, tag, SQL92 selector or content",
        description="Find messages. Give one of --id, --unique-id or --key, or any mix of "
        "the scan filters --from/--to/--tag/--where/--contains/--regex (all must hold); "
        "--key also takes --from/--to. Text output: topic, partition, offset, timestamp, "
        "msg_id, key, value, tab-separated, non-UTF-8 bytes as \\xNN; then a completion line "
        "on stderr (reason, records and bytes scanned, cursor to resume). Exit status 0 "
        "whenever the query ran, whatever it found.",
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
    p.add_argument("--to", dest="end", metavar="TIME", help="timestamp < TIME (as --from)")
    p.add_argument("--tag", help="messages with this tag")
    p.add_argument("--where", metavar="SQL92", help='properties selector, e.g. "amount > 10"')
    p.add_argument("--contains", metavar="TEXT", help="values containing these bytes")
    p.add_argument("--regex", metavar="PATTERN", help="values matching this regex (bytes)")
    p.add_argument("-p", "--partition", type=integer, default=None, help="only this partition")
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
    add_json(p, 'message objects, then {"type": "summary", ...}')
    add_progress(p)
    p.set_defaults(run=cmd_query)


def cmd_query(args: argparse.Namespace, out: TextIO) -> int:
    kind = _kind(args)
    check_seconds(args.timeout, "--timeout")
    start = None if args.start is None else parse_time(args.start, "--from")
    end = None if args.end is None else parse_time(args.end, "--to")
    limit: dict[str, Any] = {} if args.limit is None else {"limit": args.limit}  # else the API's
    with mqcore.open(args.store, read_only=True) as store:
        if args.topic is not None:
            store.partitions(args.topic)  # UnknownTopicError for a topic that is not there
        if kind == "id":
            msg = store.get_by_id(args.id)
            found = [] if msg is None or not _in_topic(msg, args.topic) else [msg]
            _print(out, args.json, found)
            _summary(args.json, out, "exhausted", len(found), 1, 0, None)
        elif kind == "unique_id":
            r = store.find_by_unique_id(args.unique_id, start=start, end=end, **limit)
            found = [m for m in r if _in_topic(m, args.topic)]
            _print(out, args.json, found)
            _summary(args.json, out, r.reason, len(found), r.scanned_records, 0, r.cursor)
        elif kind == "key":
            r = store.find_by_key(
                args.topic,
                arg_bytes(args.key),
                start=start,
                end=end,
                partition=args.partition,
                cursor=args.cursor,
                **limit,
            )
            _print(out, args.json, r.messages)
            _summary(args.json, out, r.reason, len(r), r.scanned_records, 0, r.cursor)
        else:
            _scan(store, args, start, end, out)
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
    allowed = {
        "id": set(),
        "unique_id": {"start", "end", "limit"},
        "key": {"start", "end", "limit", "partition", "cursor"},
        "scan": {*SCAN_OPTIONS, "limit", "partition", "cursor", "max_scan", "timeout"},
    }[kind]
    extra = [
        k
        for k in (*SCAN_OPTIONS, "limit", "partition", "cursor", "max_scan", "timeout")
        if getattr(args, k) is not None and k not in allowed
    ]
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
            render.emit(out, render.message_object(m))
        else:
            out.write(render.message_line(m) + "\n")
    out.flush()


def _summary(
    as_json: bool,
    out: TextIO,
    reason: str,
    found: int,
    records: int,
    scanned_bytes: int,
    cursor: str | None,
) -> None:
    if as_json:
        render.emit(
            out,
            {
                "type": "summary",
                "reason": reason,
                "complete": reason == "exhausted",
                "messages": found,
                "scanned_records": records,
                "scanned_bytes": scanned_bytes,
                "cursor": cursor,
            },
        )
        return
    line = f"mqcore: query {reason}: {render.plural(found, 'message')}, read {records:,} records"
    if scanned_bytes:
        line += f" ({render.human_bytes(scanned_bytes)})"
    if cursor is not None and reason != "exhausted":
        line += f"; resume with --cursor {cursor}"
    print(line, file=sys.stderr)


def _scan(
    store: mqcore.Store, args: argparse.Namespace, start: int | None, end: int | None, out: TextIO
) -> None:
    """One search, or with the progress bar a series of them resumed by cursor."""
    filters: dict[str, Any] = {
        "contains": None if args.contains is None else arg_bytes(args.contains),
        "regex": None if args.regex is None else arg_bytes(args.regex),
        "tag": args.tag,
        "where": args.where,
        "partition": args.partition,
        "start": start,
        "end": end,
    }
    limit = 1000 if args.limit is None else args.limit
    max_scan = DEFAULT_MAX_SCAN if args.max_scan is None else args.max_scan
    if not progress_enabled(args):
        r = store.search(
            args.topic,
            limit=limit,
            max_scan=max_scan,
            timeout=args.timeout,
            cursor=args.cursor,
            **filters,
        )
        _print(out, args.json, r.messages)
        _summary(args.json, out, r.reason, len(r), r.scanned_records, r.scanned_bytes, r.cursor)
        return
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    parts = store.available_partitions(args.topic) if args.partition is None else [args.partition]
    total = sum(
        os.path.getsize(f)
        for p in parts
        for f in partition_files(store.path, args.topic, p)
        if f.endswith(".log")
    )
    bar = render.Progress(f"query {args.topic}", total, True)
    found = records = scanned = 0
    cursor = args.cursor
    reason = "exhausted"
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            r = store.search(
                args.topic,
                limit=limit - found,
                max_scan=min(CHUNK, max_scan - records),
                timeout=left,
                cursor=cursor,
                **filters,
            )
            found += len(r)
            records += r.scanned_records
            scanned += r.scanned_bytes
            reason, cursor = r.reason, r.cursor
            bar.update(scanned, records)
            _print(out, args.json, r.messages)
            if reason != "max_scan" or records >= max_scan:
                break
    finally:
        bar.close(complete=reason == "exhausted")
    _summary(args.json, out, reason, found, records, scanned, cursor)
