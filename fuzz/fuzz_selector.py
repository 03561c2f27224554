"""Fuzz the SQL92 selector parser (mqcore.query.selector.compile_selector), evaluating the
compiled selector on fuzzed properties, and its scan-kernel program (_ext/selector_impl.h):
on the same properties encoded as record headers it must agree with the Python evaluator, and
on the raw fuzzed bytes taken as a header area it must answer without crashing. Input:
selector text, a NUL byte, then `name=value` lines for the properties."""

from __future__ import annotations

import fuzzcommon
from fuzzcommon import EXPECTED

selector = fuzzcommon.mqcore.query.selector


def varint(n: int) -> bytes:
    """Kafka's zigzag varint."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte, z = z & 0x7F, z >> 7
        out.append(byte | 0x80 if z else byte)
        if not z:
            return bytes(out)


def header_area(props: dict[str, str]) -> bytes:
    out = b""
    for name, value in props.items():
        key, raw = name.encode(), value.encode()
        out += varint(len(key)) + key + varint(len(raw)) + raw
    return out


def test_one_input(data: bytes) -> None:
    text_bytes, _, props_bytes = data.partition(b"\0")
    text = text_bytes.decode("utf-8", "replace")
    props: dict[str, str] = {}
    for line in props_bytes.decode("utf-8", "replace").split("\n"):
        name, sep, value = line.partition("=")
        if sep:
            props[name] = value
    try:
        sel = selector.compile_selector(text)
    except EXPECTED:
        return
    repr(sel)
    for p in (props, {}):
        assert sel.evaluate(p) in (True, False, None)
        assert sel.matches(p) in (True, False)
    if sel.program is None:
        return
    if "uid" not in props:  # Message.properties leaves a uid header out; so does the kernel
        view = dict(props)  # what engine.selector_view gives the Python evaluator
        if "tag" in view:
            view.setdefault("TAGS", view["tag"])
        assert sel.program.evaluate(header_area(props), len(props)) is sel.evaluate(view)
    for count in (0, 1, len(props_bytes)):
        assert sel.program.evaluate(props_bytes, count) in (True, False, None)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
