"""The request versions Kafka 4 removed (KIP-896) and Kafka 3.9 still served, for the clients
that still send them: sarama at its default version, segmentio/kafka-go 0.2, Burrow 1.2, and
librdkafka before 2.x, which decides whether it may compress from Produce v2 and Fetch v2 being
listed. kio (generated from Kafka 4's schemas) has no types for them, so each is written here as
data, from Kafka 3.9's message schemas (clients/src/main/resources/common/message/*.json):

- the request is read by its field list and *lifted* to the lowest version kio has, the fields
  that version adds taking Kafka's defaults for the old version (`LegacyVersion.defaults`), so
  the handler of that version answers it unchanged;
- the handler's response (an entity of the lifted version) is *lowered*: written by the old
  version's field list, each field taken from the response by name, or computed by
  `LegacyVersion.derived` where the old version had a field the newer one has not.

Produce v0-v2 and Fetch v0-v3 are read and written by producewire.py and fetchwire.py (their
records are message sets of magic 0 and 1: mqcore.log.legacy converts them). Only Fetch's
request is lifted here.

Field kinds (non-flexible forms only: every removed version predates KIP-482): int8, int16,
int32, int64, bool; string (int16 length), nstring (nullable); ms32/ms64 (an int32/int64 of
milliseconds kio holds as a timedelta); a list of fields is a struct; [kind] an array of it
(int32 count), ("nullable", [kind]) an array that may be null.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mqcore.errors import ProtocolError

_INTS = {"int8": struct.Struct(">b"), "int16": struct.Struct(">h"), "int32": struct.Struct(">i"),
         "int64": struct.Struct(">q"), "bool": struct.Struct(">?"), "ms32": struct.Struct(">i"),
         "ms64": struct.Struct(">q")}  # fmt: skip

Fields = list[tuple[str, Any]]


@dataclass(frozen=True)
class LegacyVersion:
    """One removed version: its request and response fields, the version it is lifted to,
    the lifted fields' values for it, and the old response fields computed from the new."""

    key: int
    version: int
    lift_to: int
    request: Fields
    response: Fields
    defaults: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, Callable[[Any], Any]] = field(default_factory=dict)


def _offsets(partition: Any) -> list[int]:
    """ListOffsets v0's old_style_offsets: the one offset found, or none."""
    return [partition.offset] if partition.offset >= 0 else []


DEFAULT_CONFIG = 5  # DescribeConfigs' config_source of a default value
_TOPIC_CONFIGS = [("name", "string"), ("value", "nstring")]
_ASSIGNMENTS = [("partition_index", "int32"), ("broker_ids", ["int32"])]

LEGACY: dict[tuple[int, int], LegacyVersion] = {}  # (api key, version) -> its description


def _add(v: LegacyVersion) -> None:
    LEGACY[(v.key, v.version)] = v


_FETCH_PARTITIONS = [("partition", "int32"), ("fetch_offset", "int64"),
                     ("partition_max_bytes", "int32")]  # fmt: skip
for _v in range(4):
    _add(LegacyVersion(
        1, _v, 4,
        request=[("replica_id", "int32"), ("max_wait", "ms32"), ("min_bytes", "int32"),
                 *([("max_bytes", "int32")] if _v >= 3 else []),
                 ("topics", [[("topic", "string"), ("partitions", [_FETCH_PARTITIONS])]])],
        response=[],  # fetchwire.py writes v0-v3
        defaults={"max_bytes": 0x7FFFFFFF, "isolation_level": 0},
    ))  # fmt: skip
_add(LegacyVersion(
    2, 0, 1,
    request=[("replica_id", "int32"), ("topics", [[("name", "string"), ("partitions", [[
        ("partition_index", "int32"), ("timestamp", "int64"), ("max_num_offsets", "int32")]])]])],
    response=[("topics", [[("name", "string"), ("partitions", [[
        ("partition_index", "int32"), ("error_code", "int16"),
        ("old_style_offsets", ["int64"])]])]])],
    derived={"old_style_offsets": _offsets},
))  # fmt: skip
_COMMIT_RESPONSE = [("topics", [[("name", "string"), ("partitions", [[
    ("partition_index", "int32"), ("error_code", "int16")]])]])]  # fmt: skip
_add(LegacyVersion(
    8, 0, 2,
    request=[("group_id", "string"), ("topics", [[("name", "string"), ("partitions", [[
        ("partition_index", "int32"), ("committed_offset", "int64"),
        ("committed_metadata", "nstring")]])]])],
    response=_COMMIT_RESPONSE,
    defaults={"generation_id_or_member_epoch": -1, "member_id": "",
              "retention_time": datetime.timedelta(milliseconds=-1)},
))  # fmt: skip
_add(LegacyVersion(
    8, 1, 2,
    request=[("group_id", "string"), ("generation_id_or_member_epoch", "int32"),
             ("member_id", "string"), ("topics", [[("name", "string"), ("partitions", [[
                 ("partition_index", "int32"), ("committed_offset", "int64"),
                 ("commit_timestamp", "int64"), ("committed_metadata", "nstring")]])]])],
    response=_COMMIT_RESPONSE,
    defaults={"retention_time": datetime.timedelta(milliseconds=-1)},
))  # fmt: skip
_add(LegacyVersion(
    9, 0, 1,
    request=[("group_id", "string"),
             ("topics", [[("name", "string"), ("partition_indexes", ["int32"])]])],
    response=[("topics", [[("name", "string"), ("partitions", [[
        ("partition_index", "int32"), ("committed_offset", "int64"), ("metadata", "nstring"),
        ("error_code", "int16")]])]])],
))  # fmt: skip
for _v in (0, 1):
    _add(LegacyVersion(
        19, _v, 2,
        request=[("topics", [[("name", "string"), ("num_partitions", "int32"),
                              ("replication_factor", "int16"), ("assignments", [_ASSIGNMENTS]),
                              ("configs", [_TOPIC_CONFIGS])]]),
                 ("timeout", "ms32"), *([("validate_only", "bool")] if _v else [])],
        response=[("topics", [[("name", "string"), ("error_code", "int16"),
                               *([("error_message", "nstring")] if _v else [])]])],
        defaults={"validate_only": False},
    ))  # fmt: skip
_add(LegacyVersion(
    20, 0, 1,
    request=[("topic_names", ["string"]), ("timeout", "ms32")],
    response=[("responses", [[("name", "string"), ("error_code", "int16")]])],
))  # fmt: skip
for _v in (0, 1):  # OffsetForLeaderEpoch: v1's answer adds the epoch found
    _add(LegacyVersion(
        23, _v, 2,
        request=[("topics", [[("topic", "string"), ("partitions", [[
            ("partition", "int32"), ("leader_epoch", "int32")]])]])],
        response=[("topics", [[("topic", "string"), ("partitions", [[
            ("error_code", "int16"), ("partition", "int32"),
            *([("leader_epoch", "int32")] if _v else []), ("end_offset", "int64")]])]])],
        defaults={"current_leader_epoch": -1},  # no check, as v2 without one
    ))  # fmt: skip
_add(LegacyVersion(
    32, 0, 1,
    request=[("resources", [[("resource_type", "int8"), ("resource_name", "string"),
                             ("configuration_keys", ("nullable", ["string"]))]])],
    response=[("throttle_time", "ms32"), ("results", [[
        ("error_code", "int16"), ("error_message", "nstring"), ("resource_type", "int8"),
        ("resource_name", "string"), ("configs", [[
            ("name", "string"), ("value", "nstring"), ("read_only", "bool"),
            ("is_default", "bool"), ("is_sensitive", "bool")]])]])],
    defaults={"include_synonyms": False},
    derived={"is_default": lambda entry: entry.config_source == DEFAULT_CONFIG},
))  # fmt: skip


# -- reading a request and lifting it -------------------------------------------------------------


def read_request(legacy: LegacyVersion, entity: type, buf: memoryview, pos: int) -> Any:
    """The request body at `pos`, read by the old version's fields and lifted into `entity`
    (the kio request of `legacy.lift_to`). ProtocolError when the bytes do not fit."""
    values, _ = _read_struct(legacy.request, _Cursor(buf, pos))
    return _lift(entity, values, legacy.defaults)


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int):
        self.buf, self.pos = buf, pos

    def take(self, n: int) -> memoryview:
        if n < 0 or n > len(self.buf) - self.pos:
            raise ProtocolError(f"a request ends {len(self.buf) - self.pos} bytes into a field "
                                f"of {n}")  # fmt: skip
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]


def _read(kind: Any, c: _Cursor) -> Any:
    if isinstance(kind, str) and kind in _INTS:
        st = _INTS[kind]
        (value,) = st.unpack(c.take(st.size))
        return datetime.timedelta(milliseconds=value) if kind.startswith("ms") else value
    if kind in ("string", "nstring"):
        (n,) = _INTS["int16"].unpack(c.take(2))
        if n == -1 and kind == "nstring":
            return None
        try:
            return str(c.take(n), "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("a string of the request is not UTF-8") from None
    nullable = isinstance(kind, tuple)
    element = (kind[1] if nullable else kind)[0]
    (count,) = _INTS["int32"].unpack(c.take(4))
    if count == -1 and nullable:
        return None
    if count < 0 or count > len(c.buf) - c.pos:  # each element takes a byte at least
        raise ProtocolError(f"an array of {count} elements where {len(c.buf) - c.pos} bytes are")
    if isinstance(element, list):
        return [_read_struct(element, c)[0] for _ in range(count)]
    return [_read(element, c) for _ in range(count)]


def _read_struct(fields_: Fields, c: _Cursor) -> tuple[dict[str, Any], int]:
    return {name: _read(kind, c) for name, kind in fields_}, c.pos


def _lift(entity: type, values: dict[str, Any], defaults: dict[str, Any]) -> Any:
    """An instance of kio's `entity` from the old version's values (by field name), the fields
    it lacks from `defaults`."""
    kwargs = {}
    for f in dataclasses.fields(entity):
        if f.name in values:
            kwargs[f.name] = _lift_value(f.type, values[f.name], defaults)
        elif f.name in defaults:
            kwargs[f.name] = defaults[f.name]
        else:
            raise LookupError(f"no value for {entity.__name__}.{f.name} in a lifted request")
    return entity(**kwargs)


def _lift_value(tp: Any, value: Any, defaults: dict[str, Any]) -> Any:
    if value is None:
        return None
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is tuple:
        element = typing.get_args(tp)[0]
        return tuple(_lift_value(element, v, defaults) for v in value)
    if dataclasses.is_dataclass(tp):
        return _lift(tp, value, defaults)  # type: ignore[arg-type]
    return value


# -- lowering a response and writing it -----------------------------------------------------------


def encode_response(legacy: LegacyVersion, correlation_id: int, body: Any) -> bytes:
    """The whole frame (size first, response header v0) of the old version's response to
    `body`, the handler's response of the lifted version."""
    out = bytearray(b"\0\0\0\0")
    out += _INTS["int32"].pack(correlation_id)
    _write_struct(legacy.response, body, legacy.derived, out)
    _INTS["int32"].pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _write_struct(fields_: Fields, obj: Any, derived: dict[str, Any], out: bytearray) -> None:
    for name, kind in fields_:
        value = derived[name](obj) if name in derived else getattr(obj, name)
        _write(kind, value, derived, out)


def _write(kind: Any, value: Any, derived: dict[str, Any], out: bytearray) -> None:
    if isinstance(kind, str) and kind in _INTS:
        if kind.startswith("ms"):
            value = int(value.total_seconds() * 1000)
        out += _INTS[kind].pack(int(value))
    elif kind in ("string", "nstring"):
        if value is None:
            out += _INTS["int16"].pack(-1)
        else:
            data = value.encode("utf-8")
            out += _INTS["int16"].pack(len(data)) + data
    else:
        nullable = isinstance(kind, tuple)
        element = (kind[1] if nullable else kind)[0]
        if value is None:
            out += _INTS["int32"].pack(-1)
            return
        out += _INTS["int32"].pack(len(value))
        for item in value:
            if isinstance(element, list):
                _write_struct(element, item, derived, out)
            else:
                _write(element, item, derived, out)


__all__ = ["LEGACY", "LegacyVersion", "encode_response", "read_request"]
