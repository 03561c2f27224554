"""`mqcore trace`: what happened to one message (store.trace), oldest event first.

Reads the store's `__trace` topic through its key index (read-only, safe beside a writer), and
the share groups' pull logs (`__pull.<group>`, always on) for the message the unique ID names:
their entries show as events `share_delivered`, `share_accepted`, ... with the member and the
delivery count. Exit status 1 when nothing is recorded for the unique ID (tracing off, not
sampled, no share group got it, or unknown).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import add_json
from mqcore.query.ids import parse_uid, uid_text


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="the recorded events of one message (needs a store opened with trace=)",
        description="Every trace event recorded for the message with this unique ID, oldest "
        "first: TIME, EVENT, where the message was (TOPIC, PARTITION, OFFSET), GROUP, DETAIL. "
        "Exit status 1 when none is recorded.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("unique_id", help="the message's unique ID (a UUID)")
    add_json(p, "one TraceEvent object per event")
    p.set_defaults(run=cmd_trace)


def cmd_trace(args: argparse.Namespace, out: TextIO) -> int:
    uid = uid_text(parse_uid(args.unique_id))  # canonical form: the trace topic's key
    with mqcore.open(args.store, read_only=True) as store:
        found = store.find_by_unique_id(uid, limit=10).messages
        # the message and the copies that kept its ID; once it is gone (retention), its trace
        events = store.history(*found) if found else store.trace(uid)
    if not events:
        print(f"mqcore: no trace events recorded for {uid}", file=sys.stderr)
        return 1
    if args.json:
        for e in events:
            render.emit(out, e.to_json())
        return 0
    rows = [["TIME", "EVENT", "TOPIC", "PARTITION", "OFFSET", "GROUP", "DETAIL"]]
    for e in events:
        rows.append(
            [
                render.iso_ms(e.time),
                e.event,
                e.topic,
                str(e.partition),
                str(e.offset),
                e.group or "-",
                json.dumps(e.detail, sort_keys=True, separators=(",", ":")) if e.detail else "-",
            ]
        )
    out.write(render.table(rows, left=3))
    return 0
