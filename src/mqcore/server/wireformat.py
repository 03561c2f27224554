"""Kafka's primitive wire forms, written: what the hand-written responses (server/fetchwire.py,
server/producewire.py) put before each string, array and byte run.

    int16 / int32 length or count   big-endian, -1 for null       (non-flexible versions)
    unsigned varint of n + 1        0 for null                    (flexible versions)

An unsigned varint holds 7 bits a byte, low bits first, the high bit set on every byte but
the last.
"""

from __future__ import annotations

import struct

I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")


def uvarint(n: int) -> bytes:
    """`n` (>= 0) as an unsigned varint."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def count(n: int, flexible: bool) -> bytes:
    """An array's element count (`n` >= 0)."""
    return uvarint(n + 1) if flexible else I32.pack(n)


def string(value: str | None, flexible: bool) -> bytes:
    """A (nullable) string: its length, then its UTF-8 bytes."""
    if value is None:
        return b"\0" if flexible else I16.pack(-1)
    data = value.encode()
    return (uvarint(len(data) + 1) if flexible else I16.pack(len(data))) + data


def bytes_length(n: int | None, flexible: bool) -> bytes:
    """The length before `n` bytes (None: null bytes)."""
    if n is None:
        return b"\0" if flexible else I32.pack(-1)
    return uvarint(n + 1) if flexible else I32.pack(n)


__all__ = ["I16", "I32", "I64", "bytes_length", "count", "string", "uvarint"]
