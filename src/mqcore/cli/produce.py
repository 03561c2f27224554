"""`mqcore produce`: append messages from stdin, a file or the command line.

The one command that writes: it opens the store writable (so it fails with StoreLockedError
while another process writes the store) and with flush="always", so every message whose
metadata it printed is on disk. Messages are appended as Kafka batches of up to --batch-size
(one at a time when reading a terminal, so each line is written as it is typed).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import IO, Any, TextIO

import mqcore
from mqcore import compression
from mqcore._ext.hashing import kafka_partition
from mqcore.cli import render
from mqcore.cli.options import UsageError, add_json, arg_bytes, integer, parse_pair, positive
from mqcore.consume.internal import refuse_internal
from mqcore.errors import UnknownPartitionError, UnknownTopicError
from mqcore.storage.logdir import LogDirectory
from mqcore.store import HeadersArg, message_headers

BATCH_SIZE = 1000


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "produce",
        help="append messages (the only command that writes)",
        description="Append one message per input line (stdin, or --file) or per --value, "
        "and print where each went: partition, offset, msg_id, unique_id (tab-separated; "
        "(null) when the topic does not assign unique IDs). Lines lose their trailing "
        "newline; an empty line is an empty value. Bytes are written as given.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("topic")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--value",
        action="append",
        default=None,
        metavar="VALUE",
        help="a message value (repeatable); stdin is not read",
    )
    src.add_argument("--file", metavar="PATH", help="read lines from PATH instead of stdin")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("-k", "--key", help="the key of every message (default: no key)")
    keys.add_argument(
        "-K",
        "--key-separator",
        metavar="SEP",
        help="split each line (or --value) at the first SEP into key and value (kcat -K); "
        "one without SEP gets no key",
    )
    p.add_argument(
        "-p",
        "--partition",
        type=integer,
        default=None,
        help="write to this partition (default: by key like Kafka's partitioner; messages "
        "without a key go round-robin, a batch at a time)",
    )
    p.add_argument("--tag", help="the message tag (no spaces)")
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a property (a text header SQL92 selectors see); repeatable",
    )
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a raw record header; a bare NAME has a null value; repeatable",
    )
    p.add_argument("--keys", metavar="'W1 W2'", help="extra keys, space-separated (indexed)")
    p.add_argument(
        "--create",
        action="store_true",
        help="create the store directory and the topic when missing",
    )
    p.add_argument(
        "--partitions",
        type=positive,
        default=None,
        metavar="N",
        help="partition count of a topic --create makes (implies --create; an existing "
        "topic must have N partitions)",
    )
    p.add_argument(
        "--compression",
        choices=compression.CODEC_NAMES,
        default=None,
        help="compress the batches (default: the topic's setting)",
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        default=BATCH_SIZE,
        metavar="N",
        help=f"messages per batch (default {BATCH_SIZE}; 1 when reading a terminal)",
    )
    add_json(p, '{"type": "produced", topic, partition, offset, msg_id, unique_id}')
    p.set_defaults(run=cmd_produce)


def cmd_produce(args: argparse.Namespace, out: TextIO) -> int:
    # internal topics (`__` names) are written only by mqcore: refused before anything opens
    refuse_internal(args.topic)
    create = args.create or args.partitions is not None
    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    if not create:
        # checked before the writable open, which would make a store of any directory
        if not os.path.isdir(args.store):
            raise FileNotFoundError(f"store {args.store} does not exist (pass --create to make it)")
        if args.topic not in LogDirectory(args.store, writable=False).load_topics():
            raise UnknownTopicError(
                f"topic {args.topic!r} does not exist in {os.path.abspath(args.store)} "
                "(pass --create to create it)"
            )
    properties: dict[str, object] = {}
    for item in args.property:
        name, value = parse_pair(item, "--property")
        properties[name] = value
    headers = message_headers(
        _headers(args.header), args.tag, properties, args.keys.split() if args.keys else None
    )
    with mqcore.open(args.store, flush="always") as store:
        if args.topic not in store.topics() or args.partitions is not None:
            # idempotent for an existing topic of that many partitions, refuses another count
            store.create_topic(args.topic, args.partitions)
        count = store.partitions(args.topic)
        if args.partition is not None and not 0 <= args.partition < count:
            raise UnknownPartitionError(
                f"--partition {args.partition} is outside 0..{count - 1} of topic {args.topic!r}"
            )
        writer = _Writer(store, args, headers, count, out)
        for chunk in _chunks(_messages(args), _batch_size(args)):
            writer.write(chunk)
    return 0


def _headers(items: list[str]) -> HeadersArg:
    pairs: list[tuple[str, bytes | None]] = []
    for item in items:
        name, value = parse_pair(item, "--header", need_value=False)
        pairs.append((name, None if value is None else arg_bytes(value)))
    return pairs or None


Pair = tuple[bytes | None, bytes]  # (key, value) of one message


def _messages(args: argparse.Namespace) -> Iterator[Pair]:
    fixed = None if args.key is None else arg_bytes(args.key)
    sep = None if args.key_separator is None else arg_bytes(args.key_separator)
    texts = (arg_bytes(v) for v in args.value) if args.value is not None else _lines(args.file)
    for line in texts:
        if sep is not None:
            key, found, value = line.partition(sep)
            yield (key, value) if found else (None, line)
        else:
            yield fixed, line


def _lines(path: str | None) -> Iterator[bytes]:
    stream: IO[bytes]
    if path is None or path == "-":
        stream = sys.stdin.buffer
        yield from _strip(stream)
        return
    with open(path, "rb") as stream:
        yield from _strip(stream)


def _strip(stream: IO[bytes]) -> Iterator[bytes]:
    for line in iter(stream.readline, b""):
        yield line[:-1] if line.endswith(b"\n") else line


def _batch_size(args: argparse.Namespace) -> int:
    reading_tty = args.value is None and args.file in (None, "-") and sys.stdin.isatty()
    return 1 if reading_tty else int(args.batch_size)


def _chunks(pairs: Iterator[Pair], size: int) -> Iterator[list[Pair]]:
    chunk: list[Pair] = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Writer:
    """Appends chunks as batches and prints each message's metadata in input order."""

    def __init__(
        self,
        store: mqcore.Store,
        args: argparse.Namespace,
        headers: HeadersArg,
        partitions: int,
        out: TextIO,
    ):
        self.store = store
        self.topic: str = args.topic
        self.partition: int | None = args.partition
        self.compression: str | None = args.compression
        self.headers = headers
        self.partitions = partitions
        self.json: bool = args.json
        self.out = out

    def write(self, chunk: list[Pair]) -> None:
        """Append one chunk: one batch per partition it goes to."""
        groups: dict[int | None, list[int]] = {}
        for i, (key, _) in enumerate(chunk):
            if self.partition is not None:
                p: int | None = self.partition
            elif key is None:
                p = None  # the store's round robin picks one partition for these
            else:
                p = int(kafka_partition(key, self.partitions))
            groups.setdefault(p, []).append(i)
        placed: list[tuple[int, int, str, str | None]] = [(0, 0, "", None)] * len(chunk)
        for p, idx in sorted(groups.items(), key=lambda g: -1 if g[0] is None else g[0]):
            values = [chunk[i][1] for i in idx]
            headers = None if self.headers is None else [self.headers] * len(idx)
            if p is None:
                md = self.store.append_batch(
                    self.topic, values, None, headers, partition=None, compression=self.compression
                )
            else:
                keys = [chunk[i][0] for i in idx]
                md = self.store.append_batch(
                    self.topic, values, keys, headers, p, compression=self.compression
                )
            for j, i in enumerate(idx):
                placed[i] = (md.partition, md.base_offset + j, md.msg_id(j), md.unique_id(j))
        for partition, offset, msg_id, uid in placed:
            if self.json:
                render.emit(
                    self.out,
                    {
                        "type": "produced",
                        "topic": self.topic,
                        "partition": partition,
                        "offset": offset,
                        "msg_id": msg_id,
                        "unique_id": uid,
                    },
                )
            else:
                fields = (str(partition), str(offset), msg_id, uid or render.NULL)
                self.out.write("\t".join(fields) + "\n")
        self.out.flush()
