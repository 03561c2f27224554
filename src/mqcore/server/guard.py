"""Every length and count of a request body checked against the bytes there are, before kio
reads it, and every null checked against the schema.

kio's native reader sizes an array from the count the client sent: a 158-byte Metadata request
claiming 2**31 topics made it ask for 200 GB and abort the whole process (Rust's allocation
failure is not an exception), found by fuzz/fuzz_server_request.py. So the body is walked here
first, by the same schema (kio's dataclasses and their field metadata), and a count or length
that cannot fit in what is left of the frame is a ProtocolError: the connection closes, the
server goes on. A null (-1) string, bytes or array where the schema's version has no null
(kio reads it as None, and 17 handlers then failed on it) is refused the same way: Kafka's
generated readers throw "non-nullable field ... was serialized as null" and its broker closes
the connection. A valid request costs one walk of its fields (records are skipped by length).

Wire forms (Kafka's protocol guide), per field kind, "flexible" versions in brackets:
    fixed       bool/int8 1, int16 2, int32 4, int64 8, uuid 16 bytes
    string      int16 length, -1 null          [uvarint length + 1, 0 null]
    bytes       int32 length, -1 null          [uvarint length + 1, 0 null]
    array       int32 count, -1 null           [uvarint count + 1, 0 null]
    struct      its fields in order            [then its tagged fields]
    tagged      uvarint count, then each: uvarint tag, uvarint size, size bytes
"""

from __future__ import annotations

import functools
import types
from dataclasses import fields, is_dataclass
from typing import Any, Union, get_args, get_origin

from mqcore.errors import ProtocolError
from mqcore.server.wireformat import uvarint

_FIXED = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4, "uint32": 4,
    "timedelta_i32": 4, "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8,
    "uuid": 16,
}  # fmt: skip
_STRING, _BYTES = "string", "bytes"
_LENGTH_KINDS = {"string": _STRING, "bytes": _BYTES, "records": _BYTES}

# A step: (kind, argument, flexible, nullable). kinds: "fixed" (argument: the size), "string"
# and "bytes", "array" (argument: the element's step), "struct" (argument: its plan); a plan is
# (steps, tagged: {tag: step} | None for a non-flexible struct). `nullable`: the field's type
# in this version admits None (kio writes `X | None` where Kafka's nullableVersions say so).
Step = tuple[str, Any, bool, bool]
Plan = tuple[tuple[Step, ...], "dict[int, Step] | None"]


def check_body(entity: type, buf: bytes | bytearray | memoryview, pos: int) -> bytes | None:
    """ProtocolError unless the body of `entity` at `pos` has every length and count within
    the buffer (what it does not check, kio's reader does). Returns the whole buffer without
    the tagged fields this version does not define (a newer client's additions: Kafka's broker
    keeps them aside unread, kio's reader refuses them), or None when there are none."""
    notes = _Notes(fields=False)
    view = memoryview(buf)
    _walk_struct(_plan(entity), view, pos, len(view), notes)
    return _without(view, notes.cuts) if notes.cuts else None


class _Notes:
    """What a walk notes down: the length fields it passed (`fields`, for length_fields) and
    the unknown tagged fields to cut: (start, end, replacement) byte ranges."""

    __slots__ = ("cuts", "fields")

    def __init__(self, fields: bool):
        self.fields: list[tuple[int, str, bool]] | None = [] if fields else None
        self.cuts: list[tuple[int, int, bytes]] = []


def _without(view: memoryview, cuts: list[tuple[int, int, bytes]]) -> bytes:
    """`view` with each (start, end) range replaced by its bytes."""
    out, at = bytearray(), 0
    for start, end, replacement in sorted(cuts):
        out += view[at:start]
        out += replacement
        at = end
    out += view[at:]
    return bytes(out)


def length_fields(entity: type, buf: bytes | bytearray | memoryview) -> list[tuple[int, str, bool]]:
    """(position, kind, compact) of every string, bytes and array in the body of `entity` at
    the start of `buf`, in the order they come (an array's elements after its count; tagged
    fields left out): where a test or a fuzzer finds a length or count to change. `compact`:
    the flexible form (unsigned varint of length + 1). ProtocolError as check_body."""
    notes = _Notes(fields=True)
    _walk_struct(_plan(entity), memoryview(buf), 0, len(buf), notes)
    assert notes.fields is not None
    return notes.fields


def check_header(flexible: bool, buf: bytes | bytearray | memoryview) -> int:
    """Request header v1 (v2 when `flexible`): api_key, api_version, correlation_id, then
    client_id, a nullable string with an int16 length even in v2, then v2's tagged fields.
    Returns where the body starts."""
    view = memoryview(buf)
    pos = _walk((_STRING, None, False, True), view, 8, len(view)) if len(view) >= 8 else 8
    if flexible:
        pos = _walk_struct(((), {}), view, pos, len(view))
    return pos


@functools.cache
def _plan(entity: type) -> Plan:
    flexible = bool(getattr(entity, "__flexible__", False))
    steps: list[Step] = []
    tagged: dict[int, Step] = {}
    for f in fields(entity):
        step = _step(f.type, f.metadata, flexible)
        if "tag" in f.metadata:
            tagged[int(f.metadata["tag"])] = step
        else:
            steps.append(step)
    return tuple(steps), (tagged if flexible else None)


def _step(tp: Any, metadata: Any, flexible: bool) -> Step:
    """The wire form of a field of type `tp` (kio's annotations: `X | None` is nullable, which
    the wire form itself carries; `tuple[X, ...]` an array; a dataclass a struct)."""
    nullable = False
    if get_origin(tp) in (types.UnionType, Union):
        nullable = type(None) in get_args(tp)
        tp = next(a for a in get_args(tp) if a is not type(None))
    if get_origin(tp) is tuple:
        return ("array", _step(get_args(tp)[0], metadata, flexible), flexible, nullable)
    if is_dataclass(tp):
        return ("struct", _plan(tp), flexible, nullable)  # type: ignore[arg-type]
    kafka_type = metadata["kafka_type"]
    if kafka_type in _FIXED:
        return ("fixed", _FIXED[kafka_type], flexible, nullable)
    if kafka_type in _LENGTH_KINDS:
        return (_LENGTH_KINDS[kafka_type], None, flexible, nullable)
    raise LookupError(f"no wire form known for kafka_type {kafka_type!r}")


def _uvarint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise ProtocolError("a request ends inside a varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("a varint in the request is longer than 5 bytes")


def _int(buf: memoryview, pos: int, end: int, size: int) -> tuple[int, int]:
    if pos + size > end:
        raise ProtocolError(f"a request ends {end - pos} bytes into a {size}-byte field")
    return int.from_bytes(buf[pos : pos + size], "big", signed=True), pos + size


def _length(buf: memoryview, pos: int, end: int, step: Step, size: int) -> tuple[int, int]:
    """A length or count: -1 for null, where the step's field may be null."""
    if step[2]:
        n, pos = _uvarint(buf, pos, end)
        n -= 1
    else:
        n, pos = _int(buf, pos, end, size)
    if n < -1:
        raise ProtocolError(f"a negative length or count ({n}) in the request")
    if n == -1 and not step[3]:
        raise ProtocolError(f"a null {step[0]} where the request's schema has no null")
    return n, pos


def _walk(step: Step, buf: memoryview, pos: int, end: int, notes: _Notes | None = None) -> int:
    kind = step[0]
    if notes is not None and notes.fields is not None and kind not in ("fixed", "struct"):
        notes.fields.append((pos, kind, step[2]))
    if kind == "fixed":
        if pos + step[1] > end:
            raise ProtocolError("a request ends inside a field")
        return int(pos + step[1])
    if kind in (_STRING, _BYTES):
        n, pos = _length(buf, pos, end, step, 2 if kind == _STRING else 4)
        if n > end - pos:
            raise ProtocolError(f"a {kind} of {n} bytes where {end - pos} are left")
        return pos + max(n, 0)
    if kind == "array":
        n, pos = _length(buf, pos, end, step, 4)
        if n > end - pos:  # every element takes a byte at least
            raise ProtocolError(f"an array of {n} elements where {end - pos} bytes are left")
        for _ in range(max(n, 0)):
            pos = _walk(step[1], buf, pos, end, notes)
        return pos
    return _walk_struct(step[1], buf, pos, end, notes)


def _walk_struct(
    plan: Plan, buf: memoryview, pos: int, end: int, notes: _Notes | None = None
) -> int:
    steps, tagged = plan
    for step in steps:
        pos = _walk(step, buf, pos, end, notes)
    if tagged is not None:
        pos = _walk_tagged(tagged, buf, pos, end, notes)
    return pos


def _walk_tagged(tagged: dict[int, Step], buf: memoryview, pos: int, end: int,
                 notes: _Notes | None) -> int:  # fmt: skip
    """A struct's tagged fields: the known ones walked, the unknown ones noted to be cut
    (their count rewritten to what is kept)."""
    count_at = pos
    count, pos = _uvarint(buf, pos, end)
    count_end = pos
    if count > end - pos:
        raise ProtocolError(f"{count} tagged fields where {end - pos} bytes are left")
    unknown = []
    for _ in range(count):
        entry = pos
        tag, pos = _uvarint(buf, pos, end)
        size, pos = _uvarint(buf, pos, end)
        if size > end - pos:
            raise ProtocolError(f"a tagged field of {size} bytes where {end - pos} are left")
        known = tagged.get(tag)
        if known is not None:
            _walk(known, buf, pos, pos + size)  # cuts inside a kept field would change its size
        else:
            unknown.append((entry, pos + size, b""))
        pos += size
    if unknown and notes is not None:
        notes.cuts.append((count_at, count_end, uvarint(count - len(unknown))))
        notes.cuts += unknown
    return pos
