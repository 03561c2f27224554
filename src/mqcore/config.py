"""Topic configuration, flush policies and the naming rule, validated in one place."""

from __future__ import annotations

import re
import resource
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from mqcore.errors import InvalidConfigError, InvalidTopicError, PartitionLimitError

# Kafka's legal topic characters and length (org.apache.kafka.common.internals.Topic).
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_NAME_LENGTH = 249
MAX_PARTITIONS = 1_000_000  # partitions of one topic
MAX_TIMESTAMP_DIFF = (1 << 63) - 1  # Kafka's Long.MAX_VALUE: no bound

FLUSH_POLICIES = ("always", "interval", "os")
CLEANUP_POLICIES = ("delete", "compact")
# Kafka's default of flush.ms and flush.messages (Long.MAX_VALUE): never, the store's flush
# policy alone decides
NEVER = (1 << 63) - 1
# settings whose value is a comma-separated list (Kafka's LIST type): IncrementalAlterConfigs'
# APPEND and SUBTRACT apply to them
LIST_SETTINGS = frozenset({"cleanup_policy"})
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")

GiB = 1 << 30
MiB = 1 << 20
DAY_MS = 24 * 3600 * 1000


def validate_name(name: object, what: str = "topic") -> str:
    """Return `name` if it is a legal Kafka topic name, else raise InvalidTopicError.

    The rule keeps every name a plain file-name component: no separators, no '.' or '..', so
    no topic can escape the store directory.
    """
    if not isinstance(name, str):
        raise InvalidTopicError(f"{what} name must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidTopicError(f"{what} name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"{what} name cannot be {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTopicError(
            f"{what} name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if not _LEGAL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL_NAME.fullmatch(c)})
        raise InvalidTopicError(
            f"{what} name {name!r} has characters outside [a-zA-Z0-9._-]: {''.join(bad)!r}"
        )
    return name


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic settings; names follow Kafka's topic configs in snake_case."""

    partitions: int = 1
    segment_bytes: int = GiB
    segment_ms: int = 7 * DAY_MS
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10 * MiB
    # disk space reserved past the active segment's end, so appends skip block allocation
    # (docs/format.md "Reserved space"); 0 turns it off
    preallocate_bytes: int = 16 * MiB
    max_message_bytes: int = 1048588  # Kafka's message.max.bytes: 1 MiB + the log overhead
    timestamp_type: str = "CreateTime"
    # Kafka's message.timestamp.after.max.ms / before.max.ms (Kafka 4 defaults: an hour ahead,
    # any age): a CreateTime record stamped outside [now - before, now + after] is refused, so
    # one far-future record cannot hold time retention off forever
    message_timestamp_after_max_ms: int = 3_600_000
    message_timestamp_before_max_ms: int = MAX_TIMESTAMP_DIFF
    compression: str = "none"
    retention_ms: int = 7 * DAY_MS
    retention_bytes: int = -1
    cleanup_policy: str = "delete"
    # compaction (docs/consume.md): tombstones live this long after the pass that
    # first saw them; a topic is cleaned once this share of its sealed bytes is dirty
    delete_retention_ms: int = DAY_MS
    min_cleanable_dirty_ratio: float = 0.5
    # query support (docs/format.md "Unique IDs", "Key index")
    unique_ids: bool = True
    key_index: bool = True
    key_index_entries: int = 1 << 20
    # Kafka's flush.messages / flush.ms: fdatasync a partition once it holds this many unsynced
    # messages (in the append that reaches it), or once its oldest unsynced append is this old
    # (the flusher); 1 message or 0 ms: every append is durable before it returns
    # (docs/operations.md "Durability"). NEVER leaves it to the store's flush policy. (Named
    # apart from the store options flush_messages and flush_interval_ms.)
    flush_after_messages: int = NEVER
    flush_after_ms: int = NEVER
    # Kafka's min.insync.replicas: on a cluster (docs/cluster.md), an acks=all write is
    # refused with fewer in-sync replicas than this; a store of one node has one, always
    min_insync_replicas: int = 1

    def __post_init__(self) -> None:
        _positive_int("partitions", self.partitions, 1, MAX_PARTITIONS)
        _positive_int("segment_bytes", self.segment_bytes, 14 + 61, 0x7FFFFFFF)
        _positive_int("segment_ms", self.segment_ms, 1, 2**62)
        _positive_int("index_interval_bytes", self.index_interval_bytes, 0, 0x7FFFFFFF)
        _positive_int("segment_index_bytes", self.segment_index_bytes, 4 * 12, 0x7FFFFFFF)
        _positive_int("preallocate_bytes", self.preallocate_bytes, 0, 0x7FFFFFFF)
        _positive_int("max_message_bytes", self.max_message_bytes, 61, 0x7FFFFFF0)
        _positive_int("retention_ms", self.retention_ms, -1, 2**62)
        _positive_int("retention_bytes", self.retention_bytes, -1, 2**62)
        _choice("timestamp_type", self.timestamp_type, TIMESTAMP_TYPES)
        for name in ("message_timestamp_after_max_ms", "message_timestamp_before_max_ms"):
            _positive_int(name, getattr(self, name), 0, MAX_TIMESTAMP_DIFF)
        _choice("compression", self.compression, COMPRESSION_TYPES)
        object.__setattr__(self, "cleanup_policy", _cleanup_policy(self.cleanup_policy))
        _positive_int("delete_retention_ms", self.delete_retention_ms, 0, 2**62)
        _ratio("min_cleanable_dirty_ratio", self.min_cleanable_dirty_ratio)
        _flag("unique_ids", self.unique_ids)
        _flag("key_index", self.key_index)
        _positive_int("key_index_entries", self.key_index_entries, 16, 0xFFFFFFFF)
        _positive_int("flush_after_messages", self.flush_after_messages, 1, NEVER)
        _positive_int("flush_after_ms", self.flush_after_ms, 0, NEVER)
        _positive_int("min_insync_replicas", self.min_insync_replicas, 1, 0x7FFFFFFF)

    @property
    def cleanup_policies(self) -> tuple[str, ...]:
        """cleanup_policy as its list: "delete", "compact", both (in the order given) or none."""
        return tuple(split_list(self.cleanup_policy))

    @property
    def compacted(self) -> bool:
        """Whether compaction applies: records must then have a key (Kafka refuses keyless
        ones, docs/consume.md "Compaction")."""
        return "compact" in self.cleanup_policies

    @property
    def timed_flush(self) -> bool:
        """Whether the flusher syncs this topic's partitions by flush_after_ms (0 is every
        append, NEVER none)."""
        return 0 < self.flush_after_ms < NEVER

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicConfig:
        """Build from stored metadata, ignoring keys a newer mqcore may have added."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def with_changes(self, **changes: Any) -> TopicConfig:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise InvalidConfigError(
                f"unknown topic config: {', '.join(sorted(unknown))} (known: "
                f"{', '.join(f.name for f in fields(self))})"
            )
        return replace(self, **changes)

    @classmethod
    def parse_setting(cls, text: str) -> tuple[str, Any]:
        """`NAME=VALUE` as typed on a command line -> (name, value of the field's type).

        ints are written plainly (an optional minus and digits), floats as Python reads them,
        flags as true/false (also 1/0, yes/no, on/off); the range is checked later by the
        TopicConfig that receives the value. InvalidConfigError names the setting."""
        name, sep, raw = text.partition("=")
        if not sep or not name:
            raise InvalidConfigError(f"topic setting {text!r} is not NAME=VALUE")
        kinds = {f.name: f.type for f in fields(cls)}
        kind = kinds.get(name)
        if kind is None:
            raise InvalidConfigError(f"unknown topic setting {name!r} (known: {', '.join(kinds)})")
        value = raw.strip()
        if kind == "int":
            if re.fullmatch(r"-?[0-9]{1,19}", value) is None:
                raise InvalidConfigError(f"topic setting {name}={raw!r} is not an integer")
            return name, int(value)
        if kind == "float":
            try:
                number = float(value)
            except ValueError:
                raise InvalidConfigError(f"topic setting {name}={raw!r} is not a number") from None
            return name, number
        if kind == "bool":
            flag = _FLAGS.get(value.lower())
            if flag is None:
                raise InvalidConfigError(f"topic setting {name}={raw!r} is not true or false")
            return name, flag
        return name, value

    def changes_allowed(self, changes: dict[str, Any]) -> None:
        """Refuse (InvalidConfigError, naming the setting) a change to an existing topic of a
        setting fixed at creation: see FIXED_AT_CREATION."""
        for name in changes:
            why = FIXED_AT_CREATION.get(name)
            if why is not None and changes[name] != getattr(self, name):
                raise InvalidConfigError(
                    f"{name} cannot change on an existing topic: {why} (create a new topic "
                    "with the setting and copy the messages over)"
                )


_FLAGS = {"true": True, "1": True, "yes": True, "on": True,
          "false": False, "0": False, "no": False, "off": False}  # fmt: skip

# Settings alter_topic_config refuses, and why; every other one applies to the next append,
# roll or maintenance pass (docs/operations.md "Changing settings of an existing topic").
FIXED_AT_CREATION = {
    "partitions": "keys are routed by the partition count, so adding partitions moves keys",
    "segment_bytes": "the active segment is mapped to that many bytes of address space",
    "segment_index_bytes": "sizes the preallocated index files of open segments",
    "preallocate_bytes": "sizes the disk space reserved past the active segment",
    "key_index": "whether segments carry a .keyindex is part of their on-disk layout",
    "key_index_entries": "sizes the key index of open segments",
}


@dataclass(frozen=True)
class FlushPolicy:
    """When appended bytes are forced to stable storage (docs/operations.md "Durability")."""

    mode: str = "interval"
    interval_ms: int = 500
    messages: int = 10_000

    def __post_init__(self) -> None:
        _choice("flush", self.mode, FLUSH_POLICIES)
        _positive_int("flush_interval_ms", self.interval_ms, 1, 2**40)
        _positive_int("flush_messages", self.messages, 1, 2**62)

    def for_topic(self, cfg: TopicConfig) -> FlushPolicy:
        """The policy a topic's partitions follow: "always" when the topic wants every append
        durable before it returns (flush_after_messages 1 or flush_after_ms 0: Kafka's
        flush.messages and flush.ms), else the store's; the topic's other values add syncs to
        it (Partition.append at flush_after_messages, the flusher at flush_after_ms)."""
        if self.mode != "always" and (cfg.flush_after_messages == 1 or cfg.flush_after_ms == 0):
            return replace(self, mode="always")
        return self


# Partition bounds (docs/operations.md "Limits"): each open partition holds one descriptor (its
# active segment's .log) and, once written and read, four mappings (the .log and its three
# indexes) and about 1 GiB of address space; vm.max_map_count is 65,530 by default
REQUEST_PARTITIONS = 10_000  # Kafka's controller refuses more in one CreateTopics (KAFKA-17870)
TOPIC_PARTITIONS = 4_096
STORE_PARTITIONS_CAP = 10_000  # 40,000 mappings, with room for max_open_segments' 4,000


@dataclass(frozen=True)
class PartitionLimits:
    """How many partitions one call may create (`max_partitions_per_request`), one topic may
    have (`max_partitions_per_topic`) and the store may hold (`max_partitions`). Internal
    topics count towards the store's total but are never refused: mqcore's own state must be
    writable. `store=None` derives the store bound from the process's soft limit of open files
    at each creation: half of it (the other half for connections and segments being opened),
    at most STORE_PARTITIONS_CAP."""

    request: int = REQUEST_PARTITIONS
    topic: int = TOPIC_PARTITIONS
    store: int | None = None

    def __post_init__(self) -> None:
        _positive_int("max_partitions_per_request", self.request, 1, MAX_PARTITIONS)
        _positive_int("max_partitions_per_topic", self.topic, 1, MAX_PARTITIONS)
        if self.store is not None:
            _positive_int("max_partitions", self.store, 1, 1 << 30)

    def store_bound(self) -> int:
        """The store's bound: the one given, or half the soft RLIMIT_NOFILE, capped."""
        if self.store is not None:
            return self.store
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return STORE_PARTITIONS_CAP
        return max(1, min(soft // 2, STORE_PARTITIONS_CAP))

    def check_request(self, adding: int) -> None:
        """PartitionLimitError when one call would create more than the request bound."""
        if adding > self.request:
            raise PartitionLimitError(
                f"{adding} new partitions in one request; max_partitions_per_request is "
                f"{self.request}",
                "max_partitions_per_request",
                self.request,
            )

    def check(self, topic: str, adding: int, topic_total: int, store_total: int) -> None:
        """Refuse (PartitionLimitError naming the bound) giving `topic` `adding` more
        partitions, `topic_total` in all, in a store holding `store_total` now."""
        self.check_request(adding)
        if topic_total > self.topic:
            raise PartitionLimitError(
                f"topic {topic!r} would have {topic_total} partitions; max_partitions_per_topic "
                f"is {self.topic}",
                "max_partitions_per_topic",
                self.topic,
            )
        bound = self.store_bound()
        if store_total + adding > bound:
            raise PartitionLimitError(
                f"the store holds {store_total} partitions, and {adding} more for topic "
                f"{topic!r} would pass max_partitions ({bound}"
                + (", half the open-files limit" if self.store is None else "")
                + ")",
                "max_partitions",
                bound,
            )


def _positive_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidConfigError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidConfigError(f"{name}={value} is outside [{low}, {high}]")


def _ratio(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidConfigError(f"{name} must be a number, not {type(value).__name__}")
    if not 0.0 <= value <= 1.0:
        raise InvalidConfigError(f"{name}={value} is outside [0, 1]")


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidConfigError(f"{name} must be True or False, not {value!r}")


def split_list(text: str) -> list[str]:
    """A list setting's items as Kafka's ConfigDef reads them: split at commas, the spaces
    around each item dropped; blank text is the empty list."""
    text = text.strip()
    return [item.strip() for item in text.split(",")] if text else []


def _cleanup_policy(value: object) -> str:
    """cleanup_policy in its one written form: its items (each delete or compact, in any order)
    joined by ","; empty is no policy at all, which Kafka 3.9 accepts (neither retention nor
    compaction: everything is kept)."""
    if not isinstance(value, str):
        raise InvalidConfigError(f"cleanup_policy must be a str, not {type(value).__name__}")
    items = split_list(value)
    for item in items:
        if item not in CLEANUP_POLICIES:
            raise InvalidConfigError(
                f"cleanup_policy={value!r}: {item!r} is not delete or compact (the setting is a "
                "comma-separated list of them: delete, compact, compact,delete, or empty)"
            )
    return ",".join(items)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidConfigError(f"{name}={value!r}; expected one of {', '.join(allowed)}")


# Kafka's topic config names for TopicConfig's fields, where they differ from the field name
# with "." for "_" (the mqcore-only settings keep that form: key.index, unique.ids, ...)
KAFKA_CONFIG_NAMES = {
    "timestamp_type": "message.timestamp.type",
    "compression": "compression.type",
    "flush_after_messages": "flush.messages",
    "flush_after_ms": "flush.ms",
}
_FROM_KAFKA = {v: k for k, v in KAFKA_CONFIG_NAMES.items()}


_SETTINGS = frozenset(f.name for f in fields(TopicConfig)) - {"partitions"}


def kafka_config_name(field: str) -> str:
    """Kafka's name for a TopicConfig field."""
    return KAFKA_CONFIG_NAMES.get(field, field.replace("_", "."))


def config_field(kafka_name: str) -> str:
    """The TopicConfig field of a Kafka topic config name; InvalidConfigError for a name mqcore
    does not have (the partition count is not a setting: CreatePartitions changes it)."""
    field = _FROM_KAFKA.get(kafka_name, kafka_name.replace(".", "_"))
    if field not in _SETTINGS or kafka_config_name(field) != kafka_name:
        raise InvalidConfigError(f"unknown topic config {kafka_name!r}")
    return field


def setting_text(value: object) -> str:
    """A setting's value as Kafka's configs show it: true/false, plain numbers, text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_overrides(config: TopicConfig, base: TopicConfig) -> dict[str, str]:
    """The settings of `config` that differ from `base`, by Kafka's names, as text: a
    topic's overrides as a cluster keeps them (/config/topics/<t>)."""
    return {
        kafka_config_name(f.name): setting_text(getattr(config, f.name))
        for f in fields(TopicConfig)
        if f.name != "partitions" and getattr(config, f.name) != getattr(base, f.name)
    }


def topic_setting(kafka_name: str, value: str | None) -> tuple[str, Any]:
    """(TopicConfig field, value) for a Kafka topic config given as text."""
    field = config_field(kafka_name)
    if value is None:
        raise InvalidConfigError(f"topic config {kafka_name!r} needs a value")
    return TopicConfig.parse_setting(f"{field}={value}")
