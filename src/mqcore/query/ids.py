"""Message IDs (docs/format.md "Message IDs"): the store ID and the unique ID, told apart by text.

Store ID (`msg_id`): where a message lives, decodable with no index.
    "m1-" + base64url, unpadded, of: varint partition | varint offset | UTF-8 topic
    (Kafka's zigzag varints, _ext/varint.pyx)
Unique ID (`unique_id`): 16 bytes carried by the record's `uid` header (a UUIDv7 when mqcore
assigns it, see _ext/encode.pyx), written as a canonical UUID: 8-4-4-4-12 lowercase hex.
A store ID always starts with "m1-"; a unique ID never holds anything but hex and hyphens.
"""

from __future__ import annotations

import binascii

from mqcore._ext.ids import STORE_ID_PREFIX, decode_store_id, encode_store_id, uid_text
from mqcore._ext.varint import decode_varint, encode_varint
from mqcore.config import validate_name
from mqcore.errors import CorruptRecordError, InvalidMessageIdError, InvalidTopicError

__all__ = [
    "STORE_ID_PREFIX",
    "decode_msg_id",
    "encode_msg_id",
    "id_kind",
    "parse_uid",
    "uid_text",
    "uid_time_ms",
]

_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")


# the store ID of the message at (topic, partition, offset): the kernel Message.msg_id uses
encode_msg_id = encode_store_id


def decode_msg_id(text: object) -> tuple[str, int, int]:
    """(topic, partition, offset) of a store ID; InvalidMessageIdError names what is wrong.

    Only the canonical text of an ID decodes (one ID per message): the body must re-encode to
    itself and each varint must be its shortest form. The kernel decodes those (_ext/ids.pyx);
    the code below names what is wrong with any other text."""
    fast = decode_store_id(text)
    if fast is not None:
        return fast
    if not isinstance(text, str) or not text.startswith(STORE_ID_PREFIX):
        raise InvalidMessageIdError(f"{text!r} is not a store ID (they start with 'm1-')")
    body = text[len(STORE_ID_PREFIX) :].encode("ascii", "replace")
    try:
        raw = binascii.a2b_base64(body.translate(_FROM_URLSAFE) + b"=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise InvalidMessageIdError(f"store ID {text!r} is not valid base64url") from None
    if binascii.b2a_base64(raw, newline=False).translate(_TO_URLSAFE).rstrip(b"=") != body:
        raise InvalidMessageIdError(f"store ID {text!r} is not in canonical form")
    try:
        partition, at = decode_varint(raw, 0)
        offset, at = decode_varint(raw, at)
    except CorruptRecordError:
        raise InvalidMessageIdError(f"store ID {text!r} is truncated") from None
    if not 0 <= partition <= 0x7FFFFFFF or offset < 0:
        raise InvalidMessageIdError(f"store ID {text!r} names an impossible partition or offset")
    # byte for byte: a 10-byte varint may carry bits past 64 that decoding drops (as Kafka's
    # does), so equal lengths do not make it canonical
    if raw[:at] != encode_varint(partition) + encode_varint(offset):
        raise InvalidMessageIdError(f"store ID {text!r} is not in canonical form")
    try:
        topic = validate_name(raw[at:].decode())
    except (UnicodeDecodeError, InvalidTopicError):
        raise InvalidMessageIdError(f"store ID {text!r} does not name a valid topic") from None
    return topic, partition, offset


def parse_uid(text: object) -> bytes:
    """The 16 bytes of a unique ID written as a UUID (hyphens optional, any case)."""
    if isinstance(text, str) and text.startswith(STORE_ID_PREFIX):
        raise InvalidMessageIdError(f"{text!r} is a store ID, not a unique ID (use get_by_id)")
    if not isinstance(text, str):
        raise InvalidMessageIdError(f"a unique ID must be a str, not {type(text).__name__}")
    digits = text.replace("-", "")
    if len(digits) != 32 or (len(text) != 32 and len(text) != 36):
        raise InvalidMessageIdError(f"{text!r} is not a unique ID (a UUID of 32 hex digits)")
    try:
        raw = bytes.fromhex(digits)
    except ValueError:
        raw = b""
    if len(raw) != 16:  # fromhex skips whitespace: "01a2 52 ..." would give fewer bytes
        raise InvalidMessageIdError(f"{text!r} is not a unique ID (non-hex digits)")
    return raw


def uid_time_ms(raw: bytes) -> int | None:
    """The unix milliseconds a UUIDv7 carries; None for other versions."""
    if len(raw) != 16 or raw[6] >> 4 != 7:
        return None
    return int.from_bytes(raw[:6], "big")


def id_kind(text: str) -> str:
    """'store' or 'unique' from the text alone."""
    return "store" if text.startswith(STORE_ID_PREFIX) else "unique"
