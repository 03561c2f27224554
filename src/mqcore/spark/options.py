"""Options of `spark.read.format("mqcore")`, parsed and checked without Spark.

Names, defaults and precedence are Spark's Kafka source's (docs/spark.md "Options"): exactly
one of subscribe / subscribePattern / assign; a range bound comes from the first of
<side>Timestamp, <side>OffsetsByTimestamp, <side>Offsets that is set (the others are
ignored); a batch read starts at "earliest" and ends at "latest" unless told otherwise.
A streaming read (parse_stream_options) starts at "latest", has no ending side, and takes the
read limits (maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay) and mqcore's groupId.
Option names are case-insensitive, as in Spark. Everything here is plain data, so a parsed
ReadOptions pickles to the Spark executors.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mqcore.config import validate_name
from mqcore.errors import InvalidConfigError, InvalidTopicError, MQCoreError
from mqcore.query.pattern import BytesPattern, compile_pattern

# Kafka's special offsets in the per-partition JSON
EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]

STRATEGIES = ("subscribe", "subscribePattern", "assign")

ISOLATION_OPTION = "kafka.isolation.level"

# mqcore's queries, answered in the reader by the store's engine (spark/query.py): options of
# the DataFrame, so a reused DataFrame answers each query as a fresh one
QUERY_OPTIONS = ("key", "keys", "msgId", "uniqueId", "tag", "where", "contains", "regex")

# mqcore's own options: bounds of the Arrow batches read() yields
DEFAULT_MAX_RECORDS_PER_BATCH = 65536
DEFAULT_MAX_BYTES_PER_BATCH = 32 << 20

KNOWN_OPTIONS = (
    "path",
    *STRATEGIES,
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "failOnDataLoss",
    "includeHeaders",
    "includeExtras",
    "minPartitions",
    "maxRecordsPerPartition",
    "maxRecordsPerBatch",
    "maxBytesPerBatch",
    *QUERY_OPTIONS,
)

# Kafka source options that mean nothing to a batch read of a local store: accepted (a job
# written for Kafka runs unchanged) and ignored, like every `kafka.`-prefixed consumer setting
IGNORED_OPTIONS = (
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "groupIdPrefix",
    "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
)

# df.write.format("mqcore"): Kafka's sink options ("topic" overrides the topic column)
WRITE_OPTIONS = ("path", "topic")

# spark.readStream.format("mqcore"): the batch options less the ending side, plus the read
# limits and mqcore's groupId (commit the stream's position as that group's offsets)
_ENDING_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
STREAM_OPTIONS = (
    *(name for name in KNOWN_OPTIONS if name not in _ENDING_OPTIONS),
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "groupId",
)
STREAM_IGNORED_OPTIONS = tuple(name for name in IGNORED_OPTIONS if name not in STREAM_OPTIONS)
# Spark hands a streaming sink its checkpointLocation among the options
STREAM_WRITE_IGNORED_OPTIONS = ("checkpointLocation",)
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka's maxTriggerDelay default, 15m
_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                      "d": 86_400_000}  # fmt: skip

_OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-2},"topicB":{"0":-1}}'
_TIMESTAMPS_EXAMPLE = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
_ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[2,4]}'


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions to read: by topic list, topic-name pattern or explicit list."""

    kind: str  # one of STRATEGIES
    topics: tuple[str, ...] = ()  # subscribe
    pattern: str = ""  # subscribePattern (matches the whole topic name)
    assigned: tuple[TopicPartition, ...] = ()  # assign

    def matches(self, topic: str) -> bool:
        """Whether a subscribePattern subscription takes `topic` (RE2: linear time whatever
        the pattern, query/pattern.py)."""
        return _topic_pattern(self.pattern).fullmatch(topic.encode())


@functools.lru_cache(maxsize=64)
def _topic_pattern(pattern: str) -> BytesPattern:
    return compile_pattern(pattern, "option 'subscribePattern'")


@dataclass(frozen=True)
class Bound:
    """One end of the offset range of every partition read.

    kind "earliest" / "latest"; "offsets" (per-partition offsets, EARLIEST / LATEST allowed);
    "timestamp" (one timestamp in ms for every partition); "timestamps" (per partition).
    `option` names the option it came from, for error messages.
    """

    kind: str
    option: str
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    timestamp: int = -1

    @property
    def per_partition(self) -> bool:
        return self.kind in ("offsets", "timestamps")


@dataclass(frozen=True)
class Query:
    """The query options of a read, checked: at most one lookup (keys, a store ID or a unique
    ID) and any of the scan filters; every record read must match them all."""

    keys: tuple[bytes, ...] = ()
    msg_id: tuple[str, int, int] | None = None  # (topic, partition, offset)
    unique_id: str | None = None
    tag: str | None = None
    where: str | None = None
    contains: bytes | None = None
    regex: str | None = None

    @property
    def scan_filters(self) -> dict[str, Any]:
        """The filters as Store.search's arguments."""
        return {"tag": self.tag, "where": self.where, "contains": self.contains,
                "regex": self.regex}  # fmt: skip


@dataclass(frozen=True)
class ReadOptions:
    """A checked batch read: the store, the partitions, the range and how to split it."""

    path: str
    subscription: Subscription
    starting: Bound
    ending: Bound
    starting_strategy: str = "error"  # startingOffsetsByTimestampStrategy: error | latest
    fail_on_data_loss: bool = True
    include_headers: bool = False
    include_extras: bool = False  # mqcore's msg_id and tag columns, after the Kafka ones
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_records_per_batch: int = DEFAULT_MAX_RECORDS_PER_BATCH
    max_bytes_per_batch: int = DEFAULT_MAX_BYTES_PER_BATCH
    # Kafka's consumer setting, which Spark's Kafka source takes as kafka.isolation.level:
    # read_committed reads to the last stable offset, without aborted transactions' records
    isolation_level: str = "read_uncommitted"
    query: Query | None = None  # mqcore's query options (None: every record)

    @property
    def committed(self) -> bool:
        return self.isolation_level == "read_committed"


@dataclass(frozen=True)
class StreamOptions:
    """A checked streaming read: the batch read's fields (its `ending` is unused) plus the read
    limits of each micro-batch and the consumer group its position is committed to."""

    read: ReadOptions
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    group_id: str | None = None


@dataclass(frozen=True)
class WriteOptions:
    """A checked write: the store, and the topic every row goes to (else the topic column);
    a streaming write also knows its query's checkpointLocation when Spark gave it."""

    path: str
    topic: str | None = None
    checkpoint_location: str | None = None


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Check the options of a batch read; raise InvalidConfigError naming the bad one."""
    opts = _canonical(options, KNOWN_OPTIONS, IGNORED_OPTIONS)
    return _read_options(
        opts,
        path=_path(opts, "spark.read.format('mqcore').load"),
        starting=_bound(opts, "starting", "earliest"),
        ending=_bound(opts, "ending", "latest"),
    )


def _read_options(opts: dict[str, str], path: str, starting: Bound, ending: Bound) -> ReadOptions:
    """The fields a batch and a streaming read share, from canonical options."""
    return ReadOptions(
        path=path,
        subscription=_subscription(opts),
        starting=starting,
        ending=ending,
        starting_strategy=_choice(opts, "startingOffsetsByTimestampStrategy", ("error", "latest")),
        fail_on_data_loss=_boolean(opts, "failOnDataLoss", True),
        include_headers=_boolean(opts, "includeHeaders", False),
        include_extras=_boolean(opts, "includeExtras", False),
        min_partitions=_positive(opts, "minPartitions"),
        max_records_per_partition=_positive(opts, "maxRecordsPerPartition"),
        max_records_per_batch=_positive(opts, "maxRecordsPerBatch")
        or DEFAULT_MAX_RECORDS_PER_BATCH,
        max_bytes_per_batch=_positive(opts, "maxBytesPerBatch") or DEFAULT_MAX_BYTES_PER_BATCH,
        isolation_level=_choice(opts, ISOLATION_OPTION, ("read_uncommitted", "read_committed")),
        query=_query(opts),
    )


def _query(opts: dict[str, str]) -> Query | None:
    """The query options, checked as the store checks them (InvalidConfigError naming the
    option); None when the read has none."""
    from mqcore.query.engine import make_spec
    from mqcore.query.ids import decode_msg_id, parse_uid

    given = {name: opts[name] for name in QUERY_OPTIONS if name in opts}
    if not given:
        return None
    lookups = [name for name in ("key", "keys", "msgId", "uniqueId") if name in given]
    if len(lookups) > 1:
        raise InvalidConfigError(
            f"options {' and '.join(repr(n) for n in lookups)} are each a lookup: give one of "
            "key/keys, msgId, uniqueId (with any of tag, where, contains, regex)"
        )
    keys: tuple[bytes, ...] = ()
    if "key" in given:
        keys = (given["key"].encode(),)
    elif "keys" in given:
        try:
            listed = json.loads(given["keys"])
        except ValueError:
            listed = None
        if not isinstance(listed, list) or not listed or \
                not all(isinstance(k, str) for k in listed):  # fmt: skip
            raise InvalidConfigError(
                f'option \'keys\' must be a JSON array of strings, like ["a","b"], not '
                f"{given['keys'][:80]!r}"
            )
        keys = tuple(dict.fromkeys(k.encode() for k in listed))
    msg_id = unique_id = None
    try:
        if "msgId" in given:
            msg_id = decode_msg_id(given["msgId"].strip())
        if "uniqueId" in given:
            parse_uid(given["uniqueId"].strip())
            unique_id = given["uniqueId"].strip()
    except MQCoreError as e:
        raise InvalidConfigError(f"option {lookups[0]!r}: {e}") from None
    contains = given["contains"].encode() if "contains" in given else None
    q = Query(keys, msg_id, unique_id, given.get("tag"), given.get("where"), contains,
              given.get("regex"))  # fmt: skip
    for name, filters in (("tag", {"tag": q.tag}), ("where", {"where": q.where}),
                          ("regex", {"regex": q.regex})):  # fmt: skip
        try:  # a bad tag, selector or regex is named now, not in a task
            make_spec(None, None, **filters)
        except MQCoreError as e:
            raise InvalidConfigError(f"option {name!r}: {e}") from None
    return q


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    """Check the options of spark.readStream.format("mqcore"); raise InvalidConfigError naming
    the bad one. startingOffsets defaults to "latest", as in Kafka's streaming source."""
    for name in _ENDING_OPTIONS:
        if any(key.lower() == name.lower() for key in options):
            raise InvalidConfigError(
                f"option {name!r} is not valid for a streaming read: a stream has no end "
                f"(use a batch read, spark.read, for a bounded range)"
            )
    opts = _canonical(options, STREAM_OPTIONS, STREAM_IGNORED_OPTIONS)
    read = _read_options(
        opts,
        path=_path(opts, "spark.readStream.format('mqcore').load"),
        starting=_bound(opts, "starting", "latest", streaming=True),
        ending=Bound("latest", "endingOffsets"),
    )
    max_per_trigger = _positive(opts, "maxOffsetsPerTrigger")
    min_per_trigger = _positive(opts, "minOffsetsPerTrigger")
    if max_per_trigger is not None and (min_per_trigger or 0) > max_per_trigger:
        raise InvalidConfigError(
            f"option 'minOffsetsPerTrigger' ({min_per_trigger}) must not be higher than "
            f"'maxOffsetsPerTrigger' ({max_per_trigger}), as in Kafka's source"
        )
    delay = DEFAULT_MAX_TRIGGER_DELAY_MS
    if "maxTriggerDelay" in opts:
        delay = _duration_ms(opts["maxTriggerDelay"], "maxTriggerDelay")
    group = opts.get("groupId", "").strip() or None
    if group is not None:
        _group_name(group)
    return StreamOptions(read, max_per_trigger, min_per_trigger, delay, group)


def parse_write_options(options: Mapping[str, str], streaming: bool = False) -> WriteOptions:
    """Check the options of df.write.format("mqcore") (or writeStream, which also carries
    Spark's checkpointLocation)."""
    ignored = STREAM_WRITE_IGNORED_OPTIONS if streaming else ()
    opts = _canonical(options, WRITE_OPTIONS, ignored)
    topic = opts.get("topic", "").strip() or None
    if topic is not None:
        _topic_name(topic, "topic")
    call = (
        "df.writeStream.format('mqcore').start" if streaming else "df.write.format('mqcore').save"
    )
    checkpoint = opts.get("checkpointLocation", "").strip() or None
    return WriteOptions(_path(opts, call), topic, checkpoint)


def _path(opts: dict[str, str], call: str) -> str:
    path = opts.get("path", "").strip()
    if not path:
        raise InvalidConfigError(
            f"option 'path' (the store directory) is required: {call}('/data/store') "
            f"or .option('path', ...)"
        )
    if not os.path.isabs(path):
        raise InvalidConfigError(
            f"option 'path' must be an absolute path, not {path!r}: Spark's Python workers do "
            f"not run in the driver's working directory"
        )
    return path


def _canonical(
    options: Mapping[str, str], known: tuple[str, ...], ignored: tuple[str, ...]
) -> dict[str, str]:
    """Options under their canonical names; unknown names are refused with a suggestion."""
    canonical = {name.lower(): name for name in known + ignored}
    out: dict[str, str] = {}
    for key, value in options.items():
        lower = key.lower()
        if lower == ISOLATION_OPTION:  # the one consumer setting a read of the log honours
            out[ISOLATION_OPTION] = value
            continue
        if lower.startswith("kafka."):
            continue
        name = canonical.get(lower)
        if name is None:
            close = difflib.get_close_matches(lower, list(canonical), n=1)
            hint = f" (did you mean {canonical[close[0]]!r}?)" if close else ""
            raise InvalidConfigError(
                f"unknown option {key!r} for mqcore{hint}; it takes {', '.join(known)}"
            )
        if not isinstance(value, str):
            raise InvalidConfigError(f"option {name!r} must be a string, not {value!r}")
        out[name] = value
    return out


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [name for name in STRATEGIES if name in opts]
    if len(given) != 1:
        which = "none of them was" if not given else f"{' and '.join(given)} were"
        raise InvalidConfigError(
            f"exactly one of the options {', '.join(STRATEGIES)} is required; {which} given"
        )
    kind = given[0]
    text = opts[kind]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        if not topics:
            raise InvalidConfigError(f"option 'subscribe' names no topic: {text!r}")
        for topic in topics:
            _topic_name(topic, "subscribe")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        pattern = text.strip()
        if not pattern:
            raise InvalidConfigError("option 'subscribePattern' is empty")
        compile_pattern(pattern, "option 'subscribePattern'")  # InvalidConfigError naming it
        return Subscription(kind, pattern=pattern)
    return Subscription(kind, assigned=_assignment(text))


def _assignment(text: str) -> tuple[TopicPartition, ...]:
    data = _json_object(text, "assign", _ASSIGN_EXAMPLE)
    out: list[TopicPartition] = []
    for topic, parts in data.items():
        _topic_name(topic, "assign")
        if not isinstance(parts, list) or not all(_is_int(p) and p >= 0 for p in parts):
            raise InvalidConfigError(
                f"option 'assign': topic {topic!r} needs a list of partition numbers >= 0, "
                f"not {json.dumps(parts)}; e.g. {_ASSIGN_EXAMPLE}"
            )
        out.extend((topic, p) for p in parts)
    if not out:
        raise InvalidConfigError(f"option 'assign' names no partition: {text!r}")
    return tuple(sorted(set(out)))


def _bound(opts: dict[str, str], side: str, default: str, streaming: bool = False) -> Bound:
    """The bound of one side from the first option set in Kafka's order of precedence; a
    stream may start at "latest" (its default)."""
    ts_option = f"{side}Timestamp"
    by_ts_option = f"{side}OffsetsByTimestamp"
    offsets_option = f"{side}Offsets"
    if ts_option in opts:
        return Bound("timestamp", ts_option, timestamp=_timestamp(opts[ts_option], ts_option))
    if by_ts_option in opts:
        stamps = _partition_numbers(opts[by_ts_option], by_ts_option, _TIMESTAMPS_EXAMPLE)
        for (topic, p), ts in stamps.items():
            if ts < 0:
                raise InvalidConfigError(
                    f"option {by_ts_option!r}: timestamp {ts} of {topic}-{p} is negative"
                )
        return Bound("timestamps", by_ts_option, offsets=stamps)
    text = opts.get(offsets_option, default).strip()
    word = text.lower()
    forbidden = "latest" if side == "starting" else "earliest"
    if word == forbidden and not streaming:
        raise InvalidConfigError(
            f"option {offsets_option!r} cannot be {forbidden!r} for a batch read"
        )
    if word in ("earliest", "latest"):
        return Bound(word, offsets_option)
    offsets = _partition_numbers(text, offsets_option, _OFFSETS_EXAMPLE)
    bad_special = LATEST if side == "starting" else EARLIEST
    for (topic, p), off in offsets.items():
        if off == bad_special and not streaming:
            raise InvalidConfigError(
                f"option {offsets_option!r}: {topic}-{p} cannot be {off} ({forbidden}) "
                f"for a batch read"
            )
        if off < EARLIEST:
            raise InvalidConfigError(
                f"option {offsets_option!r}: offset {off} of {topic}-{p} is negative "
                f"(only {EARLIEST} for earliest and {LATEST} for latest are allowed)"
            )
    return Bound("offsets", offsets_option, offsets=offsets)


def _partition_numbers(text: str, option: str, example: str) -> dict[TopicPartition, int]:
    """{"topic": {"partition": number}} -> {(topic, partition): number}."""
    data = _json_object(text, option, example)
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        _topic_name(topic, option)
        if not isinstance(parts, dict):
            raise InvalidConfigError(
                f"option {option!r}: topic {topic!r} needs an object of partition -> number, "
                f"not {json.dumps(parts)}; e.g. {example}"
            )
        for key, number in parts.items():
            if not key.isdigit() or not _is_int(number):
                raise InvalidConfigError(
                    f"option {option!r}: topic {topic!r} maps partition {key!r} to "
                    f"{json.dumps(number)}; partitions are numbers >= 0 in quotes and values "
                    f"integers, e.g. {example}"
                )
            out[(topic, int(key))] = number
    if not out:
        raise InvalidConfigError(f"option {option!r} names no partition: {text!r}")
    return out


def _json_object(text: str, option: str, example: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise InvalidConfigError(
            f"option {option!r} must be a JSON object like {example}: {text!r}"
        )
    return data


def _topic_name(topic: str, option: str) -> None:
    try:
        validate_name(topic)
    except InvalidTopicError as e:
        raise InvalidConfigError(f"option {option!r}: {e}") from None


def _group_name(group: str) -> None:
    from mqcore.consume.group import validate_group

    try:
        validate_group(group)
    except InvalidTopicError as e:  # InvalidGroupError
        raise InvalidConfigError(f"option 'groupId': {e}") from None


def _duration_ms(text: str, option: str) -> int:
    """Spark's time strings: an integer with an optional unit (ms, s, m or min, h, d); a bare
    number is milliseconds."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    unit = (m.group(2) or "ms") if m else ""
    if m is None or unit not in _DURATION_UNITS_MS:
        raise InvalidConfigError(
            f"option {option!r} must be a duration like 30s, 5m or 500ms, not {text!r}"
        )
    return int(m.group(1)) * _DURATION_UNITS_MS[unit]


def _timestamp(text: str, option: str) -> int:
    value = _integer(text, option)
    if value < 0:
        raise InvalidConfigError(f"option {option!r} must be a timestamp in ms >= 0, not {text!r}")
    return value


def _integer(text: str, option: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidConfigError(f"option {option!r} must be an integer, not {text!r}") from None


def _positive(opts: dict[str, str], option: str) -> int | None:
    if option not in opts:
        return None
    value = _integer(opts[option], option)
    if value <= 0:
        raise InvalidConfigError(f"option {option!r} must be a positive integer, not {value}")
    return value


def _boolean(opts: dict[str, str], option: str, default: bool) -> bool:
    if option not in opts:
        return default
    word = opts[option].strip().lower()
    if word not in ("true", "false"):
        raise InvalidConfigError(f"option {option!r} must be true or false, not {opts[option]!r}")
    return word == "true"


def _choice(opts: dict[str, str], option: str, allowed: tuple[str, ...]) -> str:
    word = opts.get(option, allowed[0]).strip().lower()
    if word not in allowed:
        raise InvalidConfigError(
            f"option {option!r} must be one of {', '.join(allowed)}, not {opts[option]!r}"
        )
    return word


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
