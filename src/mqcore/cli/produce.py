"""`mqcore produce`: append messages from stdin, a file or the command line.

The one command that writes: it opens the store writable (so it fails with StoreLockedError
while another process writes the store) and with flush="always", so every message whose
metadata it printed is on disk. Messages are appended as Kafka batches of up to --batch-size
(one at a time when reading a terminal, so each line is written as it is typed).

Bad lines (over the topic's max_message_bytes, a timestamp or field that does not parse, a
timestamp the topic refuses) follow one of two rules (README "Loading files and logs"):
`--file` naming a regular file and `--value` are checked whole before anything is written, and
nothing is written if any line is bad; stdin and other streams are written as they come, and a
bad line stops the run after everything before it is written and flushed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple, TextIO

import mqcore
from mqcore import compression
from mqcore.cli import hints, inputs, render, timestamps
from mqcore.cli.options import (
    UsageError,
    add_json,
    arg_bytes,
    integer,
    interrupts_deferred,
    non_negative,
    parse_pair,
    parse_time,
    positive,
    warn,
)
from mqcore.clock import now_ms
from mqcore.config import TopicConfig
from mqcore.errors import (
    InvalidConfigError,
    InvalidRecordError,
    MissingKeyError,
    RecordTooLargeError,
    StoreLockedError,
    UnknownPartitionError,
    UnknownTopicError,
)
from mqcore.log.append import key_partition
from mqcore.log.internal import refuse_internal
from mqcore.storage.logdir import LogDirectory
from mqcore.store import HeadersArg, check_message, message_headers

BATCH_SIZE = 1000

RULES = (
    "Bad lines: a line over the topic's max_message_bytes (as a batch of that one message), "
    "a timestamp or JSON field that does not parse, or a timestamp the topic refuses. With "
    "--file naming a regular file (and with --value) every line is checked first and nothing "
    "is written if one is bad: the error names the first bad line, how many are bad and the "
    "fix. From stdin or another stream (tail -f | mqcore produce) lines are written as they "
    "come: a bad line stops the run after every line before it is written and flushed, and "
    "the error says which lines and offsets were written. Exit status 1 in both cases. "
    "Raise the limit with --config max_message_bytes=N when produce creates the topic, or "
    "`mqcore config STORE TOPIC max_message_bytes=N` for an existing one."
)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "produce",
        help="append messages (the only command that writes)",
        description="Append one message per input line (stdin, or --file) or per --value, "
        "and print where each went: partition, offset, msg_id, unique_id (tab-separated; "
        "(null) when the topic does not assign unique IDs). Lines lose their trailing "
        "newline; an empty line is an empty value. Bytes are written as given. " + RULES,
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
    src.add_argument(
        "--file",
        metavar="PATH",
        help="read lines from PATH instead of stdin (a regular file is checked whole first)",
    )
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("-k", "--key", help="the key of every message (default: no key)")
    keys.add_argument(
        "-K",
        "--key-separator",
        metavar="SEP",
        help="split each line (or --value) at the first SEP into key and value (kcat -K); "
        "one without SEP gets no key",
    )
    keys.add_argument(
        "--key-field",
        metavar="FIELD",
        help="JSON lines: the key is this field (text as UTF-8, other values as JSON); a "
        "line without it gets no key",
    )
    p.add_argument(
        "-p",
        "--partition",
        type=integer,
        default=None,
        help="write to this partition (default: by key like Kafka's partitioner; messages "
        "without a key go round-robin, a batch at a time)",
    )
    tags = p.add_mutually_exclusive_group()
    tags.add_argument("--tag", help="the message tag (no spaces)")
    tags.add_argument(
        "--tag-field", metavar="FIELD", help="JSON lines: the tag is this field (no spaces)"
    )
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a property (a text header SQL92 selectors see); repeatable",
    )
    p.add_argument(
        "--property-field",
        action="append",
        default=[],
        metavar="NAME[=FIELD]",
        help="JSON lines: property NAME from field FIELD (default: the field NAME; a.b "
        "reaches into objects); a missing or null field gives no property; repeatable",
    )
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a raw record header; a bare NAME has a null value; repeatable",
    )
    p.add_argument(
        "--headers-delimiter",
        metavar="SEP",
        help="each line starts with its headers, NAME:VALUE[,NAME:VALUE...], up to the first "
        "SEP (kafka-console-producer's parse.headers with headers.delimiter); a NAME "
        "without ':' has a null value; a line without SEP is bad",
    )
    p.add_argument("--keys", metavar="'W1 W2'", help="extra keys, space-separated (indexed)")
    times = p.add_mutually_exclusive_group()
    times.add_argument(
        "--timestamp",
        metavar="TIME",
        help="the CreateTime of every message: ms since the epoch or ISO-8601 (UTC when no "
        "zone) (default: the append time)",
    )
    times.add_argument(
        "--timestamp-field",
        metavar="FIELD",
        help="JSON lines: each message's CreateTime is this field: a number of ms since the "
        "epoch (seconds with --timestamp-format s), or text read by --timestamp-format "
        "(default ISO-8601, or digits as ms); a line without it is bad",
    )
    times.add_argument(
        "--timestamp-regex",
        metavar="RE",
        help="each message's CreateTime is the text RE's first group (or whole match) finds "
        "in the line, read by --timestamp-format (default ISO-8601); a line without it is bad",
    )
    p.add_argument(
        "--timestamp-format",
        metavar="FMT",
        help="how times are written: iso (ISO-8601, the default), ms or s (epoch "
        "milliseconds or seconds, a fraction allowed for s), or a strptime format such as "
        "'%%d/%%b/%%Y:%%H:%%M:%%S %%z' (nginx); alone, the first time of that format in each "
        "line is each message's CreateTime; no zone means UTC",
    )
    p.add_argument(
        "--parse",
        action="append",
        default=[],
        metavar="RE",
        help="named groups of RE, found in each line (or record), give it: key, tag, timestamp "
        "(read by --timestamp-format) and, any other name, a property: "
        "'^(?P<timestamp>\\S+ \\S+) (?P<action>\\w+) (?P<package>\\S+)' for dpkg.log; a "
        "line RE does not match is bad; repeatable (each must match)",
    )
    p.add_argument(
        "--record-start",
        metavar="RE",
        help="multi-line records: a line RE matches starts a record, other lines continue it "
        "(joined with \\n; blank lines at its end are dropped): '^Start-Date:' for apt's "
        "history.log",
    )
    p.add_argument(
        "--skip",
        type=non_negative,
        default=0,
        metavar="N",
        help="pass over the first N input lines (to go on after an interrupted run: it says N)",
    )
    p.add_argument(
        "--create",
        action="store_true",
        help="create the store directory and the topic when missing; a topic it creates keeps "
        "every message, however old (retention_ms=-1), unless --config retention_ms=MS says "
        "otherwise",
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
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the topic produce creates (implies --create; any topic setting, "
        "e.g. max_message_bytes=8388608, message_timestamp_before_max_ms=...); an existing "
        "topic must have it already (change it with `mqcore config`); repeatable",
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


class Msg(NamedTuple):
    """One message to append."""

    key: bytes | None
    value: bytes
    timestamp: int | None
    headers: HeadersArg


class BadLine(Exception):
    """An input line that cannot become a message; the text says why."""


def cmd_produce(args: argparse.Namespace, out: TextIO) -> int:
    # internal topics (`__` names) are written only by mqcore: refused before anything opens
    refuse_internal(args.topic)
    settings = _settings(args.config)
    create = args.create or args.partitions is not None or bool(settings)
    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    if args.headers_delimiter == "":
        raise UsageError("--headers-delimiter must not be empty")
    parser = LineParser(args)  # refuses bad option values before the store opens
    source = inputs.Input(args)  # and a --file that cannot be read
    if not create:
        _check_exists(args)
    made = _missing_root(args.store)
    done = Done(source)
    try:
        _load(args, parser, source, settings, out, done)
    except KeyboardInterrupt:
        _forget(made, done)
        print(f"mqcore: produce interrupted: {done.resume()}", file=sys.stderr)
        return 130
    except BaseException:
        _forget(made, done)
        raise
    return 0


def _check_exists(args: argparse.Namespace) -> None:
    """Without --create: the store and the topic must exist. Checked before the writable
    open, which would make a store of any directory."""
    if not os.path.isdir(args.store):
        raise FileNotFoundError(f"store {args.store} does not exist (pass --create to make it)")
    if args.topic not in LogDirectory(args.store, writable=False).load_topics():
        raise UnknownTopicError(
            f"topic {args.topic!r} does not exist in {os.path.abspath(args.store)} "
            "(pass --create to create it)"
        )


def _missing_root(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (what a writable open
    makes), or None when `path` exists."""
    path = os.path.abspath(path)
    root = None
    while not os.path.lexists(path):
        root = path
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return root


def _forget(made: str | None, done: Done) -> None:
    """A run that failed or was interrupted before writing anything leaves no store
    directory behind when it made it."""
    if made is not None and done.count == 0 and os.path.isdir(made):
        shutil.rmtree(made, ignore_errors=True)


def _open(args: argparse.Namespace) -> mqcore.Store:
    """The store, writable and flushed at every append; a lock held by another process is
    refused saying who holds it and what to do instead."""
    try:
        return mqcore.open(args.store, flush="always")
    except StoreLockedError as e:
        raise StoreLockedError(
            f"{e.path} is open for writing by another process ({e.holder}), and mqcore "
            f"produce needs its writer lock: {hints.lock_advice(e.holder or '', args.topic)}",
            e.path,
            e.holder,
        ) from None


def _load(
    args: argparse.Namespace, parser: LineParser, source: inputs.Input,
    settings: dict[str, Any], out: TextIO, done: Done,
) -> None:  # fmt: skip
    """Check (a whole input) and write every item, creating the topic before the first."""
    with _open(args) as store:
        exists = args.topic in store.topics()
        cfg = _topic_config(store, args, settings, exists, parser.sets_timestamps)
        source.cap = cfg.max_message_bytes
        check = Checker(parser, cfg, args, source, created=not exists)
        count = check.all(source.items()) if source.whole else None
        writer = _Writer(store, args, cfg.partitions, out, done, _batch_size(args))
        if not exists:
            # before the first append, so a stream whose first line is bad creates nothing
            writer.before_first = lambda: _create_topic(store, args, settings, check)
        for item in itertools.islice(source.items(), count):
            try:
                msg = check.one(item)
            except BadLine as e:
                writer.write()
                raise InvalidRecordError(writer.stopped_at(item, str(e)) + check.fix()) from None
            writer.add(item, msg)
        writer.write()
        writer.finish()


def _topic_config(
    store: mqcore.Store, args: argparse.Namespace, settings: dict[str, Any], exists: bool,
    stamps: bool,
) -> TopicConfig:  # fmt: skip
    """The settings the topic has (or will have when produce creates it), checked against
    the options: the partition count, the timestamps asked for, -p."""
    if exists:
        cfg = store.topic_config(args.topic)
        if args.partitions is not None:
            store.create_topic(args.topic, args.partitions)  # refuses another count
        _same_settings(cfg, settings, args)
    else:
        cfg = store.new_topic_config(args.partitions, **_created(settings))
    if stamps and cfg.timestamp_type == "LogAppendTime":
        fix = (
            f"change it with `mqcore config {args.store} {args.topic} timestamp_type=CreateTime`"
            if exists
            else "create it with timestamp_type=CreateTime, the default"
        )
        raise InvalidConfigError(
            f"topic {args.topic!r} has timestamp_type=LogAppendTime: its records carry the "
            f"append time, so the timestamps produce was asked for would be lost ({fix})"
        )
    if args.partition is not None and not 0 <= args.partition < cfg.partitions:
        raise UnknownPartitionError(
            f"--partition {args.partition} is outside 0..{cfg.partitions - 1} of topic "
            f"{args.topic!r}"
        )
    return cfg


def _created(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of a topic produce creates: a load keeps what it loaded (retention_ms=-1,
    as old times would otherwise be deleted by the next retention pass) unless told."""
    return {"retention_ms": -1, **settings}


def _create_topic(
    store: mqcore.Store, args: argparse.Namespace, settings: dict[str, Any], check: Checker
) -> None:
    store.create_topic(args.topic, args.partitions, **_created(settings))
    check.created = False  # from now on a fix is `mqcore config`, not --config


def _settings(pairs: list[str]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for text in pairs:
        name, value = TopicConfig.parse_setting(text)
        if name == "partitions":
            raise UsageError("give the partition count with --partitions, not --config")
        settings[name] = value
    TopicConfig().with_changes(**settings)  # each value in its range, before anything opens
    return settings


def _same_settings(cfg: TopicConfig, settings: dict[str, Any], args: argparse.Namespace) -> None:
    """--config on an existing topic: its settings must already be those."""
    differ = [f"{k}={getattr(cfg, k)!r}" for k, v in settings.items() if getattr(cfg, k) != v]
    if differ:
        wanted = " ".join(f"{k}={settings[k]}" for k in settings)
        raise InvalidConfigError(
            f"topic {args.topic!r} exists with {', '.join(differ)}; --config applies only to a "
            f"topic produce creates: change it with `mqcore config {args.store} {args.topic} "
            f"{wanted}`"
        )


def _batch_size(args: argparse.Namespace) -> int:
    reading_tty = args.value is None and args.file in (None, "-") and sys.stdin.isatty()
    return 1 if reading_tty else int(args.batch_size)


class LineParser:
    """Turns one input line into a message: headers prefix, key, value, timestamp, tag and
    properties, as the options ask. BadLine for a line that cannot be one."""

    def __init__(self, args: argparse.Namespace):
        self.fixed_key = None if args.key is None else arg_bytes(args.key)
        self.key_sep = None if args.key_separator is None else arg_bytes(args.key_separator)
        self.headers_sep = (
            None if args.headers_delimiter is None else arg_bytes(args.headers_delimiter)
        )
        self.raw_headers = _headers(args.header)
        self.tag: str | None = args.tag
        self.properties: dict[str, object] = {}
        for item in args.property:
            name, value = parse_pair(item, "--property")
            self.properties[name] = value
        self.keys = args.keys.split() if args.keys else None
        self.key_field: str | None = args.key_field
        self.tag_field: str | None = args.tag_field
        self.property_fields: list[tuple[str, str]] = []
        for item in args.property_field:
            name, field = parse_pair(item, "--property-field", need_value=False)
            self.property_fields.append((name, field or name))
        self.json_lines = bool(
            self.key_field or self.tag_field or self.property_fields or args.timestamp_field
        )
        if args.timestamp_format is not None and args.timestamp is not None:
            raise UsageError("--timestamp-format reads times from lines; --timestamp is one time")
        self.fields = Fields(args.parse) if args.parse else None
        if self.fields is not None:
            self.fields.refuse_others(args)
        self.fixed_ts = (
            None if args.timestamp is None else parse_time(args.timestamp, "--timestamp")
        )
        self.ts_field: str | None = args.timestamp_field
        self.ts_group = self.fields is not None and "timestamp" in self.fields.names
        self.ts_text = timestamps.text_parser(args.timestamp_format)
        self.ts_unit = args.timestamp_format if args.timestamp_format in timestamps.UNITS else "ms"
        self.ts_find: Callable[[str], int] | None = None
        self.ts_regex: re.Pattern[str] | None = None
        if args.timestamp_regex is not None:
            try:
                self.ts_regex = re.compile(args.timestamp_regex)
            except re.error as e:
                raise InvalidConfigError(
                    f"--timestamp-regex {args.timestamp_regex!r} is not a regular expression: {e}"
                ) from None
        elif args.timestamp_format is not None and self.ts_field is None and not self.ts_group:
            try:
                self.ts_find = timestamps.line_finder(args.timestamp_format)
            except ValueError as e:
                raise InvalidConfigError(
                    f"--timestamp-format {args.timestamp_format!r}: {e}"
                ) from None
        self.sets_timestamps = (
            self.ts_group
            or self.fixed_ts is not None
            or self.ts_field is not None
            or self.ts_regex is not None
            or self.ts_find is not None
        )
        # the headers of every message when nothing varies per line: built once
        self.per_line_headers = bool(
            self.headers_sep
            or self.tag_field
            or self.property_fields
            or (self.fields is not None and self.fields.sets_headers)
        )
        self.run_headers = (
            None
            if self.per_line_headers
            else message_headers(self.raw_headers, self.tag, self.properties, self.keys)
        )

    def parse(self, line: bytes) -> Msg:
        line_headers: list[tuple[str, bytes | None]] = []
        if self.headers_sep is not None:
            text, found, line = line.partition(self.headers_sep)
            if not found:
                raise BadLine(f"has no headers delimiter {os.fsdecode(self.headers_sep)!r}")
            line_headers = _line_headers(text)
        key = self.fixed_key
        if self.key_sep is not None:
            k, found, rest = line.partition(self.key_sep)
            key, line = (k, rest) if found else (None, line)
        doc = _json_object(line) if self.json_lines else None
        ts = self.fixed_ts
        groups: dict[str, str] = {}
        if self.fields is not None:
            groups = self.fields.find(line)
            key, ts = self._group_key_time(groups, key, ts)
        if doc is not None:
            if self.key_field is not None:
                found_key = _field(doc, self.key_field)
                key = None if found_key is None else _text(found_key).encode()
            if self.ts_field is not None:
                ts = self._field_time(doc)
        if self.ts_regex is not None:
            ts = self._regex_time(line)
        elif self.ts_find is not None:
            ts = _time(self.ts_find, line.decode("latin-1"))
        if not self.per_line_headers:
            return Msg(key, line, ts, self.run_headers)
        tag = groups.get("tag", self.tag)
        properties = self.properties
        extra = {k: v for k, v in groups.items() if k not in Fields.RESERVED}
        if extra:
            properties = {**properties, **extra}
        if doc is not None:
            if self.tag_field is not None:
                found_tag = _field(doc, self.tag_field)
                tag = None if found_tag is None else _text(found_tag)
            if self.property_fields:
                properties = dict(properties)
                for name, field in self.property_fields:
                    value = _field(doc, field)
                    if value is not None:
                        properties[name] = _text(value)
        try:
            headers = message_headers(
                [*(self.raw_headers or ()), *line_headers], tag, properties, self.keys
            )
        except InvalidRecordError as e:
            raise BadLine(str(e)) from None
        return Msg(key, line, ts, headers)

    def _group_key_time(
        self, groups: dict[str, str], key: bytes | None, ts: int | None
    ) -> tuple[bytes | None, int | None]:
        """The key and the time --parse found in a line (else the ones it had)."""
        if "key" in groups:
            key = groups["key"].encode("utf-8", "surrogateescape")
        if self.ts_group:
            if "timestamp" not in groups:
                raise BadLine("has no timestamp: the group 'timestamp' of --parse matched nothing")
            ts = _time(self.ts_text, groups["timestamp"])
        return key, ts

    def _field_time(self, doc: dict[str, Any]) -> int:
        assert self.ts_field is not None
        value = _field(doc, self.ts_field)
        if value is None:
            raise BadLine(f"has no timestamp field {self.ts_field!r}")
        if isinstance(value, bool) or not isinstance(value, (str, int, Decimal)):
            raise BadLine(f"timestamp field {self.ts_field!r} is {json.dumps(_plain(value))}")
        if isinstance(value, str):
            return _time(self.ts_text, value)
        return _time(lambda t: timestamps.epoch_ms(t, self.ts_unit), str(value))

    def _regex_time(self, line: bytes) -> int:
        assert self.ts_regex is not None
        m = self.ts_regex.search(line.decode("latin-1"))
        if m is None:
            raise BadLine(f"has no match of --timestamp-regex '{self.ts_regex.pattern}'")
        text = m.group(1) if self.ts_regex.groups else m.group()
        if text is None:
            raise BadLine(f"--timestamp-regex '{self.ts_regex.pattern}' found no time in it")
        return _time(self.ts_text, text)


class Fields:
    """--parse: regular expressions whose named groups, found in each line (or record), give
    its key, tag and timestamp, and every other name a property (the --where of a query)."""

    RESERVED = frozenset({"key", "tag", "timestamp"})

    def __init__(self, patterns: list[str]):
        self.patterns: list[re.Pattern[str]] = []
        self.names: set[str] = set()
        for text in patterns:
            try:
                pattern = re.compile(text)
            except re.error as e:
                raise InvalidConfigError(
                    f"--parse {text!r} is not a regular expression: {e}"
                ) from None
            if not pattern.groupindex:
                raise InvalidConfigError(
                    f"--parse {text!r} has no named group: name what it finds, e.g. "
                    "'(?P<level>[A-Z]+)' for a property level"
                )
            twice = self.names & pattern.groupindex.keys()
            if twice:
                raise InvalidConfigError(f"--parse: group {min(twice)!r} is named twice")
            self.names |= pattern.groupindex.keys()
            self.patterns.append(pattern)
        self.sets_headers = bool(self.names - {"key", "timestamp"})

    def refuse_others(self, args: argparse.Namespace) -> None:
        """A group named key, tag or timestamp and an option giving the same: one or the other."""
        for group, flags in (
            ("key", ("key", "key_separator", "key_field")),
            ("tag", ("tag", "tag_field")),
            ("timestamp", ("timestamp", "timestamp_field", "timestamp_regex")),
        ):
            given = [f for f in flags if getattr(args, f) is not None]
            if group in self.names and given:
                flag = "--" + given[0].replace("_", "-")
                raise UsageError(f"--parse has a group {group!r}, so {flag} cannot give it too")

    def find(self, line: bytes) -> dict[str, str]:
        """The groups each pattern found in `line` (UTF-8; other bytes kept as surrogates);
        BadLine when a pattern does not match it. A group that matched nothing is left out."""
        text = line.decode("utf-8", "surrogateescape")
        found: dict[str, str] = {}
        for pattern in self.patterns:
            m = pattern.search(text)
            if m is None:
                raise BadLine(f"does not match --parse '{pattern.pattern}'")
            found.update((k, v) for k, v in m.groupdict().items() if v is not None)
        return found


def _time(parse: Callable[[str], int], text: str) -> int:
    try:
        return parse(text)
    except timestamps.BadTime as e:
        raise BadLine(f"timestamp: {e}") from None


def _json_object(line: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(line, parse_float=Decimal)
    except (ValueError, RecursionError) as e:
        raise BadLine(f"is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise BadLine("is JSON but not an object")
    return doc


def _field(doc: dict[str, Any], name: str) -> Any:
    """Field `name` of a JSON object, or a dotted path into nested objects; None if absent."""
    if name in doc:
        return doc[name]
    value: Any = doc
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _text(value: Any) -> str:
    """A JSON value as text: a string as it is, true/false, a number as written, else JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Decimal)):
        return str(value)
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)


def _plain(value: Any) -> Any:
    """Decimals (how JSON numbers with a fraction are read here) back to JSON-encodable floats."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _line_headers(text: bytes) -> list[tuple[str, bytes | None]]:
    """`NAME:VALUE,NAME:VALUE` (a bare NAME: a null value; empty text: no headers)."""
    out: list[tuple[str, bytes | None]] = []
    if not text:
        return out
    for item in text.split(b","):
        name, colon, value = item.partition(b":")
        try:
            name_text = name.decode()
        except UnicodeDecodeError:
            raise BadLine(f"header name {name!r} is not UTF-8") from None
        if not name_text:
            raise BadLine(f"header {item!r} has no name")
        out.append((name_text, value if colon else None))
    return out


def _headers(items: list[str]) -> HeadersArg:
    pairs: list[tuple[str, bytes | None]] = []
    for item in items:
        name, value = parse_pair(item, "--header", need_value=False)
        pairs.append((name, None if value is None else arg_bytes(value)))
    return pairs or None


@dataclass
class Problem:
    """The first bad line of an input, and what else is known about the bad ones."""

    name: str  # "line 12", "the record at lines 12-15"
    reason: str
    bad: int = 1
    largest_batch: int = 0  # of the lines over max_message_bytes


_WINDOW = ("message_timestamp_after_max_ms", "message_timestamp_before_max_ms")


class Checker:
    """Parses items into messages and checks each as the store would (check_message)."""

    def __init__(
        self, parser: LineParser, cfg: TopicConfig, args: argparse.Namespace,
        source: inputs.Input, created: bool,
    ):  # fmt: skip
        self.parser = parser
        self.cfg = cfg
        self.topic: str = args.topic
        self.store: str = args.store
        self.compression: str | None = args.compression
        self.source = source
        self.created = created
        self.largest = 0
        self.window: set[str] = set()  # timestamp-window settings that refused a line
        # times before this are past time retention (docs/consume.md): warned about once
        deletes = cfg.retention_ms >= 0 and "delete" in cfg.cleanup_policy
        self.expired = now_ms() - cfg.retention_ms if deletes else -1
        self.warned = False

    def one(self, item: inputs.Item) -> Msg:
        """The message of `item`; BadLine naming what is wrong with it."""
        _, _, data, cut = item
        if cut:
            raise BadLine(self._cut())
        msg = self.parser.parse(data)
        try:
            check_message(
                self.cfg, self.topic, msg.value, msg.key, msg.headers, msg.timestamp,
                compression=self.compression,
            )  # fmt: skip
        except RecordTooLargeError as e:
            size = e.size or 0
            self.largest = max(self.largest, size)
            raise BadLine(
                f"is {len(data):,} bytes ({size:,} as a record batch), over "
                f"max_message_bytes={self.cfg.max_message_bytes:,} of topic {self.topic!r}"
            ) from None
        except MissingKeyError:
            raise BadLine(
                f"has no key, and topic {self.topic!r} is compacted (cleanup_policy="
                f"{self.cfg.cleanup_policy}), which keeps only records with a key: give "
                "each one with --key or --key-separator"
            ) from None
        except InvalidRecordError as e:
            setting = next((s for s in _WINDOW if s in str(e)), None)
            if setting is not None:
                self.window.add(setting)
            raise BadLine(str(e)) from None
        if msg.timestamp is not None and msg.timestamp < self.expired and not self.warned:
            self.warned = True
            warn(
                f"the time of {self.source.name(item)} is older than "
                f"retention_ms={self.cfg.retention_ms} of topic {self.topic!r}: retention "
                "deletes a sealed segment once its newest time is that old (to keep loaded "
                f"logs: {self.how('retention_ms=-1')})"
            )
        return msg

    def _cut(self) -> str:
        """Why a record over the size limit is bad (it was not read whole)."""
        limit = self.cfg.max_message_bytes
        self.largest = max(self.largest, limit + 1)
        pattern = self.source.record_start.pattern if self.source.record_start else ""
        return (
            f"is over max_message_bytes={limit:,} of topic {self.topic!r} (does --record-start "
            f"{pattern!r} match the first line of every record?)"
        )

    def all(self, items: Iterator[inputs.Item]) -> int:
        """Check every item; returns their count, or raises (nothing written) naming the first
        bad one, how many are bad and how to fix it."""
        problem: Problem | None = None
        n = 0
        for item in items:
            n += 1
            try:
                self.one(item)
            except BadLine as e:
                if problem is None:
                    problem = Problem(self.source.name(item), str(e))
                else:
                    problem.bad += 1
        if problem is None:
            return n
        label = self.source.label
        what = f"{label}s" if n != 1 else label
        verb = "is" if problem.bad == 1 else "are"
        raise InvalidRecordError(
            f"{problem.name} {problem.reason}; {problem.bad:,} of {n:,} {what} {verb} bad "
            f"(every {label} is checked first); nothing was written{self.fix()}"
        )

    def fix(self) -> str:
        """How to change the topic settings that refused lines ('' if none did): the largest
        batch seen over max_message_bytes, the timestamp window's settings."""
        changes = [f"max_message_bytes={self.largest}"] if self.largest else []
        changes += [f"{name}=N" for name in sorted(self.window)]
        if not changes:
            return ""
        what = "raise the limit" if self.largest and not self.window else "change the topic"
        return f"; {what} with {self.how(*changes)}"

    def how(self, *changes: str) -> str:
        """How to give the topic settings `changes` (NAME=VALUE): --config if produce creates
        the topic, `mqcore config` once it exists."""
        if self.created:
            return " ".join(f"--config {c}" for c in changes)
        return f"`mqcore config {self.store} {self.topic} {' '.join(changes)}`"


class Done:
    """What a run has written so far (whole chunks only): for the messages that say so and
    tell how to go on."""

    def __init__(self, source: inputs.Input):
        self.source = source
        self.count = 0  # messages written
        self.first = 0  # the first and last input line (or value) written
        self.last = 0
        self.offsets: dict[int, tuple[int, int]] = {}  # partition -> first, last offset

    def add(self, first: int, last: int, count: int) -> None:
        """`count` more messages written, of input lines (or values) `first` to `last`."""
        self.first = self.first or first
        self.last = last
        self.count += count

    def wrote(self) -> str:
        """ "wrote lines 1-1500 (partition 0 offsets 0-1499)", or "wrote nothing"."""
        if self.count == 0:
            return "wrote nothing"
        spans = ", ".join(
            f"partition {p} offsets {a}-{b}" for p, (a, b) in sorted(self.offsets.items())
        )
        if self.source.label == "record":
            spans = f"{render.plural(self.count, 'record')}: {spans}"
        return f"wrote {self.source.span(self.first, self.last)} ({spans})"

    def resume(self) -> str:
        """What an interrupted run wrote, that it is on disk, and how to go on."""
        if self.count == 0:
            return "wrote nothing"
        if self.source.values is not None:
            return f"{self.wrote()}, on disk; the values after value {self.last} were not written"
        again = "the same file" if self.source.path is not None else "the same input"
        return (
            f"{self.wrote()}, on disk (flushed); nothing after line {self.last} was written. "
            f"To go on, run the same command on {again} with --skip {self.last}"
        )


class _Writer:
    """Appends chunks, one batch per partition in input order, and prints each message's
    metadata in input order."""

    def __init__(
        self, store: mqcore.Store, args: argparse.Namespace, partitions: int, out: TextIO,
        done: Done, size: int,
    ):  # fmt: skip
        self.store = store
        self.topic: str = args.topic
        self.partition: int | None = args.partition
        self.compression: str | None = args.compression
        self.partitions = partitions
        self.json: bool = args.json
        self.out = out
        self.done = done
        self.round_robin = 0  # chunks with messages without a key so far
        self.size = size  # messages per chunk
        self.chunk: list[Msg] = []  # the messages of the chunk being gathered
        self.lines = (0, 0)  # and its first and last input line
        # runs once, before the first append (produce creating the topic)
        self.before_first: Callable[[], None] | None = None

    def add(self, item: inputs.Item, msg: Msg) -> None:
        """Gather `msg` into the chunk, and write it once it holds `size` messages."""
        first, last, _, _ = item
        self.lines = (self.lines[0] if self.chunk else first, last)
        self.chunk.append(msg)
        if len(self.chunk) >= self.size:
            self.write()

    def write(self) -> None:
        """Append the chunk gathered whole: a Ctrl-C meanwhile takes effect once it is
        written, its metadata printed and counted in `done`."""
        if not self.chunk:
            return
        with interrupts_deferred():
            self._start()
            placed = self._append(self.chunk)
            self.done.add(*self.lines, len(self.chunk))
            self.chunk = []
            self._print(placed)

    def finish(self) -> None:
        """The end of the input: the topic exists even when nothing was written."""
        self._start()

    def _start(self) -> None:
        if self.before_first is not None:
            self.before_first()
            self.before_first = None

    def _route(self, msgs: list[Msg]) -> dict[int, list[int]]:
        """Indexes of `msgs` per partition, each list in input order (the order Kafka's
        producer keeps within a partition): -p, else by key, else the chunk's round-robin
        partition, the same for every message of the chunk without a key."""
        unkeyed = self.round_robin % self.partitions
        groups: dict[int, list[int]] = {}
        for i, msg in enumerate(msgs):
            if self.partition is not None:
                p = self.partition
            elif msg.key is None:
                p = unkeyed
            else:
                p = key_partition(msg.key, self.partitions)
            groups.setdefault(p, []).append(i)
        if self.partition is None and any(m.key is None for m in msgs):
            self.round_robin += 1
        return groups

    def _append(self, msgs: list[Msg]) -> list[tuple[int, int, str, str | None]]:
        """One batch per partition; (partition, offset, msg_id, unique_id) of each message."""
        placed: list[tuple[int, int, str, str | None]] = [(0, 0, "", None)] * len(msgs)
        for p, idx in sorted(self._route(msgs).items()):
            batch = [msgs[i] for i in idx]
            stamps = None if batch[0].timestamp is None else [m.timestamp or 0 for m in batch]
            md = self.store.append_batch(
                self.topic, [m.value for m in batch], [m.key for m in batch],
                [m.headers for m in batch], p, stamps, compression=self.compression,
            )  # fmt: skip
            first, _ = self.done.offsets.get(p, (md.base_offset, 0))
            self.done.offsets[p] = (first, md.base_offset + len(idx) - 1)
            for j, i in enumerate(idx):
                placed[i] = (p, md.base_offset + j, md.msg_id(j), md.unique_id(j))
        return placed

    def _print(self, placed: list[tuple[int, int, str, str | None]]) -> None:
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

    def stopped_at(self, item: inputs.Item, reason: str) -> str:
        """The error of a stream stopped by a bad item: what was written before it."""
        return (
            f"{self.done.wrote()}, {self.done.source.name(item)} {reason}; nothing after it "
            "was written"
        )
