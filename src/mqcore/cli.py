"""The `mqcore` command: look into a store from the shell.

    mqcore --version
    mqcore topics STORE [--json]
    mqcore dump STORE TOPIC [-p N] [-o OFFSET] [-n COUNT] [--json]

Every command opens the store with `read_only=True`: no lock is taken and nothing is written,
so it is safe beside a running writer (it sees the log as it was when the command started).
Errors mqcore raises on purpose print one line to stderr and exit with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

import mqcore
from mqcore.errors import InvalidConfigError, MQCoreError, OffsetOutOfRangeError

PAGE = 1000  # messages fetched per read() call while dumping


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors: keep main() callable in-process
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    try:
        return int(args.run(args, sys.stdout))
    except BrokenPipeError:
        # `mqcore dump ... | head`: the reader went away; stop quietly like other Unix tools
        _silence_stdout()
        return 0
    except (MQCoreError, OSError) as e:
        print(f"mqcore: error: {e}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mqcore", description="Inspect an mqcore store (or a Kafka log directory), read-only."
    )
    parser.add_argument("--version", action="version", version=f"mqcore {mqcore.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topics = sub.add_parser("topics", help="list topics, partitions and their offsets")
    topics.add_argument("store", help="store directory")
    topics.add_argument("--json", action="store_true", help="print one JSON document")
    topics.set_defaults(run=cmd_topics)

    dump = sub.add_parser(
        "dump",
        help="print messages (kcat-like)",
        description="Print messages, one per line: partition, offset, timestamp (ms), key, "
        "value, tab-separated; (null) marks a null key or value. With --json, one "
        "kcat -J envelope per line.",
    )
    dump.add_argument("store", help="store directory")
    dump.add_argument("topic")
    dump.add_argument(
        "-p",
        "--partition",
        type=int,
        default=None,
        help="only this partition (default: all, in order)",
    )
    dump.add_argument(
        "-o",
        "--offset",
        default="beginning",
        help="where to start in each partition: beginning (default), end, an "
        "offset N, -N (the last N messages), or s@MS (the first message "
        "with timestamp >= MS milliseconds)",
    )
    dump.add_argument(
        "-n",
        "--count",
        type=int,
        default=None,
        help="stop after COUNT messages in total (default: to the end)",
    )
    dump.add_argument(
        "--json",
        action="store_true",
        help="JSON lines {topic, partition, offset, tstype, ts, headers, key, "
        "payload}; bytes that are not UTF-8 appear as \\xNN escapes",
    )
    dump.set_defaults(run=cmd_dump)
    return parser


# -- topics -------------------------------------------------------------------------------------


def cmd_topics(args: argparse.Namespace, out: TextIO) -> int:
    """Print every topic with each partition's start and end offset."""
    with mqcore.open(args.store, read_only=True) as store:
        rows = [
            (t, p, store.start_offset(t, p), store.end_offset(t, p))
            for t in store.topics()
            for p in store.available_partitions(t)
        ]
    if args.json:
        doc: dict[str, list[dict[str, int]]] = {}
        for t, p, start, end in rows:
            doc.setdefault(t, []).append({"partition": p, "start_offset": start, "end_offset": end})
        out.write(json.dumps({"topics": doc}, indent=1) + "\n")
        return 0
    table = [("TOPIC", "PARTITION", "START", "END", "MESSAGES")]
    table += [(t, str(p), str(s), str(e), str(e - s)) for t, p, s, e in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        out.write(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
            + "\n"
        )
    return 0


# -- dump ---------------------------------------------------------------------------------------


def cmd_dump(args: argparse.Namespace, out: TextIO) -> int:
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
            for msg in iter_messages(store, args.topic, p, start, left):
                out.write((envelope(msg) if args.json else text_line(msg)) + "\n")
                if left is not None:
                    left -= 1
    return 0


def resolve_offset(store: mqcore.Store, topic: str, partition: int, spec: str) -> int:
    """Turn a kcat-style offset (beginning, end, N, -N, s@MS) into an offset of `partition`."""
    start, end = store.start_offset(topic, partition), store.end_offset(topic, partition)
    if spec == "beginning":
        return start
    if spec == "end":
        return end
    if spec.startswith("s@"):
        found = store.offset_for_time(topic, partition, _int(spec[2:], spec))
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
    try:
        return int(text)
    except ValueError:
        raise InvalidConfigError(f"offset {spec!r} is not beginning, end, N, -N or s@MS") from None


def iter_messages(
    store: mqcore.Store, topic: str, partition: int, offset: int, limit: int | None
) -> Iterator[mqcore.Message]:
    """Messages from `offset` to the end offset seen at open, at most `limit` of them."""
    end = store.end_offset(topic, partition)
    while offset < end and (limit is None or limit > 0):
        want = PAGE if limit is None else min(PAGE, limit)
        page = store.read(topic, partition, offset, want)
        if not page:
            return  # only control records or compacted gaps remain
        yield from page
        if limit is not None:
            limit -= len(page)
        offset = page[-1].offset + 1


def _text(b: bytes | None) -> str:
    """Bytes as text for display: UTF-8, other bytes as \\xNN, one line."""
    if b is None:
        return "(null)"
    s = b.decode("utf-8", "backslashreplace")
    return s.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def text_line(msg: mqcore.Message) -> str:
    """partition, offset, timestamp (ms), key, value: tab-separated, kcat's fields."""
    return "\t".join(
        (str(msg.partition), str(msg.offset), str(msg.timestamp), _text(msg.key), _text(msg.value))
    )


def _json_text(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "backslashreplace")


def envelope(msg: mqcore.Message) -> str:
    """kcat -J's envelope; headers as kcat writes them: a flat [key, value, key, value] list."""
    headers: list[str | None] = []
    for k, v in msg.headers:
        # header keys are decoded with surrogateescape; show stray bytes as \xNN instead
        key = k.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        headers += [key, _json_text(v)]
    return json.dumps(
        {
            "topic": msg.topic,
            "partition": msg.partition,
            "offset": msg.offset,
            "tstype": "logappend" if msg.timestamp_type == 1 else "create",
            "ts": msg.timestamp,
            "headers": headers,
            "key": _json_text(msg.key),
            "payload": _json_text(msg.value),
        },
        ensure_ascii=False,
    )


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
