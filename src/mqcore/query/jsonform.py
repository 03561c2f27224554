"""Messages as JSON objects: the one form `mqcore get/query --json` and the HTTP query API
(mqcore.server.http) both write, so a script or the console reads one shape from either.

Bytes (keys, values, header names and values) are the UTF-8 string when they decode; otherwise
the object {"base64": "..."} (standard alphabet, padded) stands in place of the string, so JSON
never loses a byte and a reader tells the two apart by the JSON type alone. None stays null.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mqcore.config import TIMESTAMP_TYPES
from mqcore.errors import InvalidConfigError

if TYPE_CHECKING:
    from mqcore._ext.batch import Message


def json_bytes(b: bytes | None) -> str | dict[str, str] | None:
    """Bytes for JSON: the UTF-8 string, or {"base64": ...} when they are not UTF-8."""
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode("ascii")}


def header_name(name: str) -> bytes:
    """A header name's original bytes (the decoder keeps stray bytes as surrogates)."""
    return name.encode("utf-8", "surrogateescape")


def json_headers(headers: Sequence[tuple[str, bytes | None]]) -> list[list[Any]]:
    """Headers as [name, value] pairs, in order (names may repeat), each as json_bytes."""
    return [[json_bytes(header_name(k)), json_bytes(v)] for k, v in headers]


def bytes_of(value: Any, what: str) -> bytes | None:
    """json_bytes read back: a string's UTF-8, a {"base64": ...} object's bytes, null None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, dict) and set(value) == {"base64"} and isinstance(value["base64"], str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except ValueError:
            pass
    raise InvalidConfigError(f'{what} is not a JSON string, {{"base64": ...}} or null')


def timestamp_type(code: int) -> str:
    """CreateTime, LogAppendTime, or typeN for a code Kafka does not define."""
    return TIMESTAMP_TYPES[code] if code in (0, 1) else f"type{code}"


def message_object(msg: Message) -> dict[str, Any]:
    """Everything a message carries, as a JSON object."""
    return {
        "type": "message",
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "timestamp": msg.timestamp,
        "timestamp_type": timestamp_type(msg.timestamp_type),
        "msg_id": msg.msg_id,
        "unique_id": msg.unique_id,
        "tag": msg.tag,
        "properties": msg.properties,
        "key": json_bytes(msg.key),
        "value": json_bytes(msg.value),
        "headers": json_headers(msg.headers),
    }


def message_from_object(obj: Any) -> Message:
    """The Message a message_object was made of (a cluster's broker reads another broker's
    answer with it): the place, timestamp, key, value and headers; the IDs, tag and
    properties follow from those. InvalidConfigError names what is not in the shape."""
    from mqcore._ext.batch import Message

    try:
        kind = obj["timestamp_type"]
        code = TIMESTAMP_TYPES.index(kind) if kind in TIMESTAMP_TYPES else int(kind[4:])
        headers = [
            ((bytes_of(k, "a header name") or b"").decode("utf-8", "surrogateescape"),
             bytes_of(v, "a header value"))
            for k, v in obj["headers"]
        ]  # fmt: skip
        return Message(
            str(obj["topic"]), int(obj["partition"]), int(obj["offset"]), int(obj["timestamp"]),
            code, bytes_of(obj["key"], "key"), bytes_of(obj["value"], "value"), headers,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidConfigError(f"not a message object: {e!r}") from None
