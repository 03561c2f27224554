"""User-supplied regular expressions, matched by RE2 in time linear in the text.

Python's `re` backtracks: `^(a+)+$` against a 31-byte value ran for 38 s, and a search cannot
interrupt one match. RE2 (the `google-re2` package) never backtracks, so a search's `timeout`
holds whatever the pattern. The price is RE2's syntax (docs/query.md "Content search"): no
backreferences, lookaround, atomic groups or possessive quantifiers, `\\z` rather than `\\Z`,
counted repetitions up to 1000; a pattern RE2 refuses raises InvalidConfigError naming it.

Patterns are compiled over bytes in RE2's Latin-1 mode, one byte one character, as Python's bytes
patterns were: a str pattern is its UTF-8 bytes, `.` matches any byte but a newline, `\\xff`
matches the byte 0xff.

A pattern's required literal (`BytesPattern.literal`, issue 32) is the longest run of bytes
every match contains: a search hands it to the scan kernel as a needle, which passes over every
batch and record without it, so RE2 runs only on the records that hold it. It is read off the
pattern's top level, conservatively: literal bytes and escaped punctuation in sequence, a run
broken by anything else (a class, a group, `.`, an escape like `\\d`, an anchor) and cut
before a byte that `*`, `?` or `{0,n}` make optional; a flag group such as `(?i)` ends the
runs (the rest of the pattern matches otherwise). A pattern with `|` at its top level,
`\\Q...\\E`, octal escapes or Unicode classes has none (None): a literal that is not
required would lose matches, one missed costs only speed.
"""

from __future__ import annotations

import re
from typing import Any

from mqcore.errors import InvalidConfigError

__all__ = ["BytesPattern", "compile_pattern", "required_literal"]


class BytesPattern:
    """A compiled user pattern: `search(value)` says whether it occurs anywhere in `value`;
    `literal` is bytes every match contains (None: none known), the scan's prefilter."""

    __slots__ = ("pattern", "literal", "_search", "_fullmatch")

    def __init__(self, pattern: bytes, search: Any, fullmatch: Any) -> None:
        self.pattern = pattern
        self.literal = required_literal(pattern)
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


# -- the required literal ----------------------------------------------------------------------

MIN_LITERAL = 2  # a shorter run is in nearly every value: no use as a prefilter
# what makes a pattern's literals unsafe to read off its text (module doc): \Q...\E quotes
# syntax, \0-\7 are octal codes, \p/\P Unicode classes
_UNSAFE = re.compile(rb"\\[QEpP0-9]")
_FLAGS = re.compile(rb"\(\?[a-zA-Z-]*\)")  # (?i): the rest of the group matches otherwise
_REPEAT = re.compile(rb"\{([0-9]+)(,[0-9]*)?\}")  # RE2 takes any other "{" as a literal
_SPECIAL = frozenset(b"\\.[()*+?|^$")  # "]" and "}" alone are literals


def required_literal(pattern: bytes) -> bytes | None:
    """The longest byte string every match of `pattern` contains, at least MIN_LITERAL long,
    or None (module doc: conservative, never a string a match may lack)."""
    if _UNSAFE.search(pattern):
        return None
    runs = _literal_runs(pattern)
    best = max(runs, key=len, default=b"")
    return best if len(best) >= MIN_LITERAL else None


def _literal_runs(pattern: bytes) -> list[bytes]:
    """The runs of literal bytes at the top level of `pattern` ([] when it has a top-level
    alternation, since then no run is required)."""
    runs: list[bytes] = []
    run = bytearray()
    at, flagged = 0, False
    while at < len(pattern):
        literal, after = _next_element(pattern, at)
        if literal == b"|":
            return []
        repeat, after = _quantifier(pattern, after)
        flagged = flagged or literal == b"(?"  # the rest matches otherwise: no more runs
        if literal is None or flagged:
            runs.append(bytes(run))
            run.clear()
        elif repeat == "optional":
            runs.append(bytes(run))
            run.clear()
        else:
            run += literal
            if repeat == "repeated":  # "ab+c" holds "ab" and "bc"
                runs.append(bytes(run))
                run[:] = literal
        at = after
    runs.append(bytes(run))
    return runs


def _next_element(pattern: bytes, at: int) -> tuple[bytes | None, int]:
    """The element at `at` and where it ends: its byte when it is a literal one, b"|" for an
    alternation, b"(?" for a flag group, None for anything else (class, group, dot, anchor,
    an escape that is not a punctuation byte)."""
    c = pattern[at]
    if c == ord("\\"):
        return _escape(pattern, at)
    if c == ord("|"):
        return b"|", at + 1
    if c == ord("["):
        return None, _class_end(pattern, at)
    if c == ord("("):
        end = _group_end(pattern, at)
        return (b"(?" if _FLAGS.fullmatch(pattern, at, end) else None), end
    if c == ord("{") and _REPEAT.match(pattern, at) is None:
        return b"{", at + 1
    if c in _SPECIAL:
        return None, at + 1
    return bytes([c]), at + 1


def _escape(pattern: bytes, at: int) -> tuple[bytes | None, int]:
    """A backslash escape: escaped punctuation is that byte, \\xHH (or \\x{...}) skipped,
    any other (\\d, \\b, \\n, ...) one letter."""
    if at + 1 >= len(pattern):
        return None, at + 1
    c = pattern[at + 1]
    if not (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122):
        return bytes([c]), at + 2
    if c == ord("x"):
        if pattern.startswith(b"{", at + 2):
            close = pattern.find(b"}", at + 2)
            return None, len(pattern) if close < 0 else close + 1
        return None, min(len(pattern), at + 4)
    return None, at + 2


def _class_end(pattern: bytes, at: int) -> int:
    """Where the character class opening at `at` ends ("]" first in it is a member)."""
    i = at + 1
    if pattern.startswith(b"^", i):
        i += 1
    if pattern.startswith(b"]", i):
        i += 1
    while i < len(pattern):
        if pattern[i] == ord("\\"):
            i += 2
            continue
        if pattern.startswith(b"[:", i):
            close = pattern.find(b":]", i + 2)
            i = len(pattern) if close < 0 else close + 2
            continue
        if pattern[i] == ord("]"):
            return i + 1
        i += 1
    return len(pattern)


def _group_end(pattern: bytes, at: int) -> int:
    """Where the group opening at `at` ends (its classes and escapes skipped)."""
    depth, i = 0, at
    while i < len(pattern):
        c = pattern[i]
        if c == ord("\\"):
            i += 2
            continue
        if c == ord("["):
            i = _class_end(pattern, i)
            continue
        depth += (c == ord("(")) - (c == ord(")"))
        i += 1
        if depth == 0:
            return i
    return len(pattern)


def _quantifier(pattern: bytes, at: int) -> tuple[str, int]:
    """The quantifier at `at` (and its lazy "?"): "optional" (* ? {0...}), "repeated"
    (+ {n...} with n >= 1) or "once" (none), and where it ends."""
    repeat, end = "once", at
    if pattern.startswith((b"*", b"?"), at):
        repeat, end = "optional", at + 1
    elif pattern.startswith(b"+", at):
        repeat, end = "repeated", at + 1
    else:
        match = _REPEAT.match(pattern, at)
        if match is not None:
            repeat = "optional" if int(match[1]) == 0 else "repeated"
            end = match.end()
    if repeat != "once" and pattern.startswith(b"?", end):
        end += 1
    return repeat, end
