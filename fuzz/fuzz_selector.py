"""Fuzz the SQL92 selector parser (mqcore.query.selector.compile_selector) and evaluating the
compiled selector on fuzzed properties. Input: selector text, a NUL byte, then `name=value`
lines for the properties."""

from __future__ import annotations

import fuzzcommon
from fuzzcommon import EXPECTED

selector = fuzzcommon.mqcore.query.selector


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


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
