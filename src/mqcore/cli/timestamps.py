"""Times found in input lines for `mqcore produce`: epoch numbers, ISO-8601 text, strptime
formats (also searched for inside a line, as in nginx's `[10/Oct/2000:13:55:36 -0700]`).

Every parser returns milliseconds since the epoch or raises BadTime naming what it could not
read. A time without a zone is UTC, like `--from`/`--to` of `mqcore query`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
UNITS = {"ms": 1, "s": 1000}  # --timestamp-format names of epoch numbers
INT64_MAX = (1 << 63) - 1


class BadTime(ValueError):
    """A time that does not parse; the message says why (the caller adds the line number)."""


def to_ms(dt: datetime) -> int:
    """Milliseconds since the epoch of `dt` (UTC when it has no zone); BadTime before 1970."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - EPOCH
    ms = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
    if ms < 0:
        raise BadTime(f"time {dt.isoformat()} is before 1970")
    return ms


# ISO-8601 as logs write it: a 'T' or a space between date and time, seconds and a fraction
# (after '.' or ',', any number of digits) optional, a zone as Z, +HH, +HHMM or +HH:MM
ISO = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})"
    r"(?:[T ](?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:[.,](?P<f>\d+))?)?)?"
    r"(?P<z>Z|z|[+-]\d{2}(?::?\d{2})?)?"
)


def iso_ms(match: re.Match[str]) -> int:
    """Milliseconds of an ISO match (ISO above); BadTime for a field out of range."""
    g = match.group
    try:
        dt = datetime(
            int(g("y")), int(g("mo")), int(g("d")),
            int(g("h") or 0), int(g("mi") or 0), int(g("s") or 0),
            int((g("f") or "0")[:6].ljust(6, "0")),
        )  # fmt: skip
    except ValueError as e:
        raise BadTime(f"{match.group()!r} is not a valid time ({e})") from None
    zone = g("z")
    if zone and zone not in "Zz":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:4] or 0))
        if offset >= timedelta(hours=24):
            raise BadTime(f"zone {zone!r} of {match.group()!r} is not a UTC offset")
        dt = dt.replace(tzinfo=timezone(sign * offset))
    return to_ms(dt)


def epoch_ms(text: str, unit: str) -> int:
    """`text` (digits, a fraction allowed for seconds) in `unit` ("ms" or "s") as ms."""
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        raise BadTime(f"{cut(text)} is not a number of {_UNIT_NAMES[unit]}") from None
    if not number.is_finite():
        raise BadTime(f"{cut(text)} is not a number of {_UNIT_NAMES[unit]}")
    ms = number * UNITS[unit]
    if ms != ms.to_integral_value():
        if unit == "ms":
            raise BadTime(
                f"{cut(text)} has a fraction of a millisecond (epoch seconds? pass "
                "--timestamp-format s)"
            )
        ms = ms.to_integral_value(rounding="ROUND_FLOOR")
    if not 0 <= ms <= INT64_MAX:
        raise BadTime(f"{cut(text)} is outside 1970 .. the 64-bit range of milliseconds")
    return int(ms)


_UNIT_NAMES = {"ms": "milliseconds since the epoch", "s": "seconds since the epoch"}


# strptime directives as regular expressions, to find a time of a given format inside a line
_DIRECTIVES = {
    "Y": r"\d{4}", "y": r"\d{2}", "m": r"\d{1,2}", "d": r"\d{1,2}", "j": r"\d{1,3}",
    "H": r"\d{1,2}", "I": r"\d{1,2}", "M": r"\d{1,2}", "S": r"\d{1,2}", "f": r"\d{1,6}",
    "b": r"[A-Za-z]{3}", "B": r"[A-Za-z]+", "a": r"[A-Za-z]{3}", "A": r"[A-Za-z]+",
    "p": r"[AaPp][Mm]", "z": r"(?:[Zz]|[+-]\d{2}(?::?\d{2}(?::?\d{2}(?:\.\d{1,6})?)?)?)",
    "Z": r"[A-Za-z]{1,5}", "%": "%",
}  # fmt: skip


def strptime_pattern(fmt: str, groups: bool = False) -> re.Pattern[str]:
    """A regular expression matching the text `fmt` formats (whitespace: any run of it, as
    strptime reads it; `groups`: each directive a group named by its letter); ValueError naming
    a directive it cannot search for."""
    out = []
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c == "%":
            d = fmt[i + 1 : i + 2]
            if d not in _DIRECTIVES:
                raise ValueError(
                    f"%{d} cannot be searched for in a line (searchable: "
                    f"{' '.join('%' + k for k in _DIRECTIVES)}); say where the time is with "
                    "--timestamp-regex"
                )
            out.append(f"(?P<{d}>{_DIRECTIVES[d]})" if groups and d != "%" else _DIRECTIVES[d])
            i += 2
        elif c.isspace():
            out.append(r"\s+")
            while i < len(fmt) and fmt[i].isspace():
                i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out))


def strptime_ms(text: str, fmt: str) -> int:
    try:
        return to_ms(datetime.strptime(text, fmt))
    except ValueError as e:
        raise BadTime(f"{cut(text)} does not match {fmt!r} ({e})") from None


def text_parser(fmt: str | None) -> Callable[[str], int]:
    """The parser of a whole time text for --timestamp-format `fmt` (None or "iso": ISO-8601
    or digits as ms; "ms"/"s": epoch numbers; else a strptime format)."""
    if fmt is None or fmt == "iso":

        def parse_iso(text: str) -> int:
            s = text.strip()
            if s.isdigit():
                return epoch_ms(s, "ms")
            m = ISO.fullmatch(s)
            if m is None:
                raise BadTime(f"{cut(text)} is neither ISO-8601 nor milliseconds")
            return iso_ms(m)

        return parse_iso
    if fmt in UNITS:
        return lambda text: epoch_ms(text, fmt)
    return lambda text: strptime_ms(text.strip(), fmt)


def line_finder(fmt: str | None) -> Callable[[str], int]:
    """The parser that finds the first time of format `fmt` inside a non-JSON line."""
    if fmt is None or fmt == "iso":

        def find_iso(line: str) -> int:
            m = ISO.search(line)
            if m is None:
                raise BadTime("no ISO-8601 time in the line")
            return iso_ms(m)

        return find_iso
    if fmt in UNITS:
        number = re.compile(r"\d+(?:\.\d+)?")

        def find_number(line: str) -> int:
            m = number.search(line)
            if m is None:
                raise BadTime("no number in the line")
            return epoch_ms(m.group(), fmt)

        return find_number
    pattern = strptime_pattern(fmt)
    fields = _fast_fields(fmt)
    if fields is None:

        def find_format(line: str) -> int:
            m = pattern.search(line)
            if m is None:
                raise BadTime(f"no time of format {fmt!r} in the line")
            return strptime_ms(m.group(), fmt)

        return find_format
    grouped = strptime_pattern(fmt, groups=True)
    seen: dict[str, int] = {}  # log lines repeat a time: each second's lines share one text

    def find_fast(line: str) -> int:
        m = grouped.search(line)
        if m is None:
            raise BadTime(f"no time of format {fmt!r} in the line")
        text = m.group()
        ms = seen.get(text)
        if ms is None:
            ms = _from_groups(m, fmt)
            if len(seen) >= 4096:
                seen.clear()
            seen[text] = ms
        return ms

    return find_fast


_MONTHS = {
    name: i + 1
    for i, names in enumerate(
        zip(
            "jan feb mar apr may jun jul aug sep oct nov dec".split(),
            "january february march april may june july august september october november "
            "december".split(),
            strict=True,
        )
    )
    for name in names
}
# directives _from_groups reads itself (strptime is ~20x slower per line); a format with any
# other directive, or one twice, is read by strptime
_FAST = set("YymdHIpMSfbBz")


def _fast_fields(fmt: str) -> list[str] | None:
    found = re.findall(r"%(.)", fmt)
    ok = all(d in _FAST for d in found) and len(set(found)) == len(found)
    return found if ok else None


def _from_groups(m: re.Match[str], fmt: str) -> int:
    """Milliseconds of a match of strptime_pattern(fmt, groups=True), read as strptime would
    read the same text (no year: 1900; %y: 1969-2068; %I with %p)."""
    g = m.groupdict()
    try:
        if g.get("Y") is not None:
            year = int(g["Y"])
        elif g.get("y") is not None:
            two = int(g["y"])
            year = 1900 + two if two >= 69 else 2000 + two
        else:
            year = 1900
        month_name = g.get("b") or g.get("B")
        month = _MONTHS.get(month_name.lower(), 0) if month_name else int(g.get("m") or 1)
        hour = int(g.get("H") or g.get("I") or 0)
        if g.get("I") is not None and g.get("p") is not None:
            hour = hour % 12 + (12 if g["p"].lower() == "pm" else 0)
        dt = datetime(
            year, month, int(g.get("d") or 1), hour, int(g.get("M") or 0),
            int(g.get("S") or 0), int((g.get("f") or "0").ljust(6, "0")),
        )  # fmt: skip
    except ValueError:
        return strptime_ms(m.group(), fmt)  # strptime's own words for what is wrong
    zone = g.get("z")
    if zone:
        if zone in "Zz":
            dt = dt.replace(tzinfo=timezone.utc)
        else:
            digits = zone[1:].replace(":", "")
            if len(digits) != 4:  # +HHMMSS and fractions: strptime reads those
                return strptime_ms(m.group(), fmt)
            offset = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            if offset >= timedelta(hours=24):
                return strptime_ms(m.group(), fmt)
            dt = dt.replace(tzinfo=timezone(-offset if zone[0] == "-" else offset))
    return to_ms(dt)


def cut(text: str, limit: int = 60) -> str:
    """repr(text) for a message, cut to about `limit` characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[: limit - 20]}...({len(text):,} characters)"
