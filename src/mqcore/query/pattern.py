"""User-supplied regular expressions, matched by RE2 in time linear in the text.

Python's `re` backtracks: `^(a+)+$` against a 31-byte value ran for 38 s, and a search cannot
interrupt one match. RE2 (the `google-re2` package) never backtracks, so a search's `timeout`
holds whatever the pattern. The price is RE2's syntax (docs/query.md "Content search"): no
backreferences, lookaround, atomic groups or possessive quantifiers, `\\z` rather than `\\Z`,
counted repetitions up to 1000; a pattern RE2 refuses raises InvalidConfigError naming it.

Patterns are compiled over bytes in RE2's Latin-1 mode, one byte one character, as Python's bytes
patterns were: a str pattern is its UTF-8 bytes, `.` matches any byte but a newline, `\\xff`
matches the byte 0xff.
"""

from __future__ import annotations

from typing import Any

from mqcore.errors import InvalidConfigError

__all__ = ["BytesPattern", "compile_pattern"]


class BytesPattern:
    """A compiled user pattern: `search(value)` says whether it occurs anywhere in `value`."""

    __slots__ = ("pattern", "_search", "_fullmatch")

    def __init__(self, pattern: bytes, search: Any, fullmatch: Any) -> None:
        self.pattern = pattern
        self._search = search
        self._fullmatch = fullmatch

    def search(self, value: bytes) -> bool:
        return self._search(value) is not None

    def fullmatch(self, value: bytes) -> bool:
        """Whether the pattern matches all of `value` (Kafka's subscribePattern rule)."""
        return self._fullmatch(value) is not None

    def __repr__(self) -> str:
        return f"BytesPattern({self.pattern!r})"


def _options() -> Any:
    import re2

    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.log_errors = False  # RE2 would print the reason to stderr; the exception says it
    options.never_capture = True  # only "does it occur" is asked: no submatch bookkeeping
    return options


def compile_pattern(pattern: str | bytes, what: str = "regex") -> BytesPattern:
    """`pattern` compiled by RE2; InvalidConfigError (naming `what` and the pattern) when it is
    not text or bytes, or uses syntax RE2 does not have."""
    import re2

    if isinstance(pattern, str):
        try:
            raw = pattern.encode()
        except UnicodeEncodeError:
            raise InvalidConfigError(f"bad {what} {pattern!r}: not valid text (UTF-8)") from None
    elif isinstance(pattern, (bytes, bytearray, memoryview)):
        raw = bytes(pattern)
    else:
        raise InvalidConfigError(f"{what} must be str or bytes, not {type(pattern).__name__}")
    try:
        compiled = re2.compile(raw, _options())
    except re2.error as e:
        reason = (
            e.args[0].decode("utf-8", "replace")
            if e.args and isinstance(e.args[0], bytes)
            else str(e)
        )
        raise InvalidConfigError(
            f"bad {what} {pattern!r}: {reason} (RE2 syntax: no backreferences or lookaround)"
        ) from None
    return BytesPattern(raw, compiled.search, compiled.fullmatch)
