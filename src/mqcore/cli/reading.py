"""Read commands: `topics`, `consume` (kcat-like) and `get` (one message in full).

`topics` lists the topics users created; internal ones (`__consumer_offsets`, `__retry.<group>`,
... : log/internal.py) only with --all, as `kafka-topics.sh --list` hides them with
--exclude-internal.

They open the store with `read_only=True`: no lock is taken and nothing is written, so they are
safe beside a running writer (they see the log as it was when the command started).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import add_isolation, add_json, integer, parse_int, parse_time
from mqcore.errors import (
    InvalidConfigError,
    MessageNotFoundError,
    OffsetOutOfRangeError,
)
from mqcore.log.internal import is_internal
from mqcore.query import jsonform

PAGE = 1000  # messages fetched per read() call while consuming


def add_parsers(sub: Any) -> None:
    consume = sub.add_parser(
        "consume",
        help="print the messages of a topic (kcat-like)",
        description="Print messages, one per line: partition, offset, timestamp (ISO-8601 UTC "
        "and ms: 2024-06-10T10:00:00.123Z (1718013600123)), key, value, tab-separated; (null) "
        "marks a null key or value, bytes that are not UTF-8 "
        "appear as \\xNN and newlines/tabs as \\n/\\t. With --json, one kcat -J envelope per "
        "line.",
    )
    consume.add_argument("store", help="store directory")
    consume.add_argument("topic")
    consume.add_argument(
        "-p",
        "--partition",
        type=integer,
        default=None,
        help="only this partition (default: all, in order)",
    )
    consume.add_argument(
        "-o",
        "--offset",
        default="beginning",
        help="where to start in each partition: beginning (default), end, an "
        "offset N, -N (the last N messages), or s@TIME (the first message "
        "with timestamp >= TIME: ms since the epoch, or ISO-8601 such as "
        "2024-06-10T10:00:00Z; no zone means UTC)",
    )
    consume.add_argument(
        "-n",
        "--count",
        type=integer,
        default=None,
        help="stop after COUNT messages in total (default: to the end)",
    )
    consume.add_argument(
        "--json",
        action="store_true",
        help="kcat -J envelopes {topic, partition, offset, tstype, ts, headers, key, "
        "payload}, one per line; as in kcat, bytes that are not UTF-8 appear as \\xNN "
        "escapes (use get/query --json for lossless base64)",
    )
    add_isolation(consume)
    consume.set_defaults(run=cmd_consume)

    get = sub.add_parser(
        "get",
        help="print one message in full",
        description="Print the message at OFFSET of TOPIC-PARTITION with its timestamp and "
        "type, IDs, tag, properties and headers. Exit status 1 when there is none. Text shows "
        "bytes that are not UTF-8 as \\xNN.",
    )
    get.add_argument("store", help="store directory")
    get.add_argument("topic")
    get.add_argument("partition", type=integer)
    get.add_argument("offset", type=integer)
    add_json(get, "a message object")
    add_isolation(get)
    get.set_defaults(run=cmd_get)

    topics = sub.add_parser(
        "topics",
        help="list topics, partitions and their offsets",
        description="List each topic's partitions with their start and end offsets and "
        "message counts. Internal topics (names starting with __: committed offsets, retry "
        "and dead-letter topics, transactions, delays, trace) are left out unless --all.",
    )
    topics.add_argument("store", help="store directory")
    topics.add_argument(
        "--all", action="store_true", help="include internal topics (names starting with __)"
    )
    topics.add_argument("--json", action="store_true", help="print one JSON document")
    topics.set_defaults(run=cmd_topics)


# -- topics ---------------------------------------------------------------------------------------


def cmd_topics(args: argparse.Namespace, out: TextIO) -> int:
    """Print every topic with each partition's start and end offset."""
    with mqcore.open(args.store, read_only=True) as store:
        names = store.topics()
        shown = names if args.all else [t for t in names if not is_internal(t)]
        rows = [
            (t, p, store.start_offset(t, p), store.end_offset(t, p))
            for t in shown
            for p in store.available_partitions(t)
        ]
    hidden = len(names) - len(shown)
    if args.json:
        doc: dict[str, list[dict[str, int]]] = {}
        for t, p, start, end in rows:
            doc.setdefault(t, []).append({"partition": p, "start_offset": start, "end_offset": end})
        out.write(json.dumps({"topics": doc}) + "\n")
        return 0
    cells = [("TOPIC", "PARTITION", "START", "END", "MESSAGES")]
    cells += [(t, str(p), str(s), str(e), str(e - s)) for t, p, s, e in rows]
    out.write(render.table(cells))
    if hidden:
        print(f"mqcore: {render.plural(hidden, 'internal topic')} not shown (--all lists them)",
              file=sys.stderr)  # fmt: skip
    return 0


# -- consume --------------------------------------------------------------------------------------


def cmd_consume(args: argparse.Namespace, out: TextIO) -> int:
    """Print the messages of one topic, partition by partition."""
    if args.count is not None and args.count < 0:
        raise InvalidConfigError(f"--count must be >= 0, not {args.count}")
    with mqcore.open(args.store, read_only=True) as store:
        parts = (
            store.available_partitions(args.topic) if args.partition is None else [args.partition]
        )
        left = args.count
        for p in parts:
            if left == 0:
                break
            start = resolve_offset(store, args.topic, p, args.offset)
            for msg in iter_messages(store, args.topic, p, start, left, args.isolation_level):
                out.write((envelope(msg) if args.json else consume_line(msg)) + "\n")
                if left is not None:
                    left -= 1
    return 0


def resolve_offset(store: mqcore.Store, topic: str, partition: int, spec: str) -> int:
    """Turn a kcat-style offset (beginning, end, N, -N, s@TIME) into an offset of `partition`."""
    start, end = store.start_offset(topic, partition), store.end_offset(topic, partition)
    if spec == "beginning":
        return start
    if spec == "end":
        return end
    if spec.startswith("s@"):
        found = store.offset_for_time(
            topic, partition, parse_time(spec[2:], f"offset {spec[:60]!r}:")
        )
        return end if found is None else found
    n = _int(spec, spec)
    if n < 0:
        return max(start, end + n)
    if not start <= n <= end:
        raise OffsetOutOfRangeError(
            f"offset {n} is outside [{start}, {end}] of {topic}-{partition}"
        )
    return n


def _int(text: str, spec: str) -> int:
    n = parse_int(text)
    if n is None:
        raise InvalidConfigError(
            f"offset {spec[:60]!r} is not beginning, end, N, -N or s@TIME (N in 64 bits)"
        )
    return n


def iter_messages(
    store: mqcore.Store,
    topic: str,
    partition: int,
    offset: int,
    limit: int | None,
    isolation_level: str = "read_uncommitted",
) -> Iterator[mqcore.Message]:
    """Messages from `offset` to the end offset seen at open, at most `limit` of them."""
    end = store.end_offset(topic, partition)
    while offset < end and (limit is None or limit > 0):
        want = PAGE if limit is None else min(PAGE, limit)
        page = store.read(topic, partition, offset, want, isolation_level=isolation_level)
        if not page:
            return  # only control records or compacted gaps remain
        yield from page
        if limit is not None:
            limit -= len(page)
        offset = page[-1].offset + 1


def consume_line(msg: mqcore.Message) -> str:
    """partition, offset, timestamp (render.time_text), key, value: tab-separated, kcat's
    fields."""
    return "\t".join(
        (
            str(msg.partition),
            str(msg.offset),
            render.time_text(msg.timestamp),
            render.text(msg.key),
            render.text(msg.value),
        )
    )


def _escaped(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "backslashreplace")


def envelope(msg: mqcore.Message) -> str:
    """kcat -J's envelope; headers as kcat writes them: a flat [key, value, key, value] list."""
    headers: list[str | None] = []
    for k, v in msg.headers:
        headers += [_escaped(jsonform.header_name(k)), _escaped(v)]
    return json.dumps(
        {
            "topic": msg.topic,
            "partition": msg.partition,
            "offset": msg.offset,
            "tstype": "logappend" if msg.timestamp_type == 1 else "create",
            "ts": msg.timestamp,
            "headers": headers,
            "key": _escaped(msg.key),
            "payload": _escaped(msg.value),
        },
        ensure_ascii=False,
    )


# -- get ------------------------------------------------------------------------------------------


def cmd_get(args: argparse.Namespace, out: TextIO) -> int:
    """Print one message in full; exit status 1 when there is none at the offset."""
    with mqcore.open(args.store, read_only=True) as store:
        msg = store.get(args.topic, args.partition, args.offset,
                        isolation_level=args.isolation_level)  # fmt: skip
        if msg is None:
            start = store.start_offset(args.topic, args.partition)
            end = store.end_offset(args.topic, args.partition)
            where = f"{args.topic}-{args.partition}"
            if args.isolation_level == "read_committed" and start <= args.offset < end:
                why = "not committed: past the last stable offset, or an aborted transaction's"
            elif start <= args.offset < end:
                why = "a gap left by compaction or a control record"
            else:
                why = f"its offsets are {start}..{end - 1}" if end > start else "it is empty"
            raise MessageNotFoundError(f"no message at offset {args.offset} of {where} ({why})")
    if args.json:
        render.emit(out, jsonform.message_object(msg))
    else:
        out.write(render.message_block(msg) + "\n")
    return 0
