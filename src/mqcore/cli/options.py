"""Arguments shared by several commands, and the parsing of their values."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any, NoReturn

from mqcore.cli.hints import did_you_mean
from mqcore.cli.timestamps import INT64_MAX, ISO, BadTime, cut, iso_ms
from mqcore.errors import InvalidConfigError


class UsageError(Exception):
    """Options that do not go together: printed with the command's usage, exit status 2."""


class Parser(argparse.ArgumentParser):
    """The parser of `mqcore` and of each command (subparsers take their parent's class):
    options are matched whole, never by prefix (`--fro` is not taken for `--from`, nor a
    future option's prefix for today's), and an unknown command gets a "did you mean"."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        hint = _choice_hint(message)
        more = f"{self.prog}: {hint}\n" if hint else ""
        self.exit(2, f"{self.prog}: error: {message}\n{more}")


def _choice_hint(message: str) -> str:
    """ "did you mean 'query'?" for argparse's "invalid choice: 'quer' (choose from ...)"."""
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if m is None:
        return ""
    return did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))


def add_json(parser: argparse.ArgumentParser, what: str = "") -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line"
        + (f" ({what})" if what else "")
        + '; bytes that are not UTF-8 appear as {"base64": "..."}',
    )


def add_progress(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        default=None,
        help="draw a progress bar on stderr even when it is not a terminal",
    )
    group.add_argument(
        "--no-progress",
        dest="progress",
        action="store_const",
        const=False,
        help="never draw the progress bar (default: drawn when stderr is a terminal)",
    )


def progress_enabled(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def arg_bytes(text: str) -> bytes:
    """A command-line string as the bytes the user typed (undecodable bytes survive argv)."""
    return os.fsencode(text)


_INTEGER = re.compile(r"-?[0-9]{1,19}")  # ASCII digits only: int() also takes "1_000", " 5"


def parse_int(text: str) -> int | None:
    """`text` as a 64-bit signed integer written plainly (an optional minus and at most 19
    ASCII digits), or None. The digit count is checked before int() runs."""
    if _INTEGER.fullmatch(text) is None:
        return None
    n = int(text)
    return n if -INT64_MAX - 1 <= n <= INT64_MAX else None


def integer(text: str) -> int:
    """argparse type: a 64-bit signed integer."""
    n = parse_int(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in the 64-bit range")
    return n


def check_seconds(value: float | None, what: str) -> float | None:
    """A parsed duration in seconds: >= 0 (inf allowed), not NaN; None stays None."""
    if value is not None and not value >= 0:
        raise InvalidConfigError(f"{what} must be a number of seconds >= 0, not {value}")
    return value


def parse_time(text: str, what: str) -> int:
    """Milliseconds since the epoch from `123456789000` or an ISO-8601 date or datetime
    (`2024-05-01`, `2024-05-01T12:30:00.5+02:00`, a trailing `Z`); no zone means UTC. Every
    option that takes a time parses it here (query --from/--to, consume -o s@TIME, --now)."""
    s = text.strip()
    if s.lstrip("-").isdigit():
        number = parse_int(s)
        if number is None:
            raise InvalidConfigError(
                f"{what} {cut(text)} is not a count of milliseconds in the 64-bit range"
            )
        ms = number
    else:
        # the same ISO-8601 reading as produce's per-line times (cli/timestamps.py), on every
        # Python this package supports (3.10's fromisoformat takes neither Z nor a comma)
        match = ISO.fullmatch(s)
        if match is None:
            raise InvalidConfigError(
                f"{what} {cut(text)} is neither milliseconds nor an ISO-8601 datetime"
            )
        try:
            ms = iso_ms(match)
        except BadTime as e:
            raise InvalidConfigError(f"{what} {cut(text)}: {e}") from None
    if ms < 0:
        raise InvalidConfigError(f"{what} {text!r} is before 1970")
    return ms


def parse_pair(text: str, what: str, need_value: bool = True) -> tuple[str, str | None]:
    """`name=value` -> (name, value); a bare `name` gives (name, None) unless `need_value`."""
    name, sep, value = text.partition("=")
    if not name:
        raise InvalidConfigError(f"{what} {text!r} has no name (expected name=value)")
    if not sep:
        if need_value:
            raise InvalidConfigError(f"{what} {text!r} is not name=value")
        return name, None
    return name, value


def non_negative(text: str) -> int:
    """argparse type: an int >= 0."""
    n = parse_int(text)
    if n is None:
        raise argparse.ArgumentTypeError(f"{cut(text)} is not an integer in the 64-bit range")
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return n


def positive(text: str) -> int:
    """argparse type: an int >= 1."""
    n = non_negative(text)
    if n == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n


def warn(message: str) -> None:
    """One `mqcore: warning: ...` line on stderr: the command goes on."""
    print(f"mqcore: warning: {' '.join(message.splitlines())}", file=sys.stderr)


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Show every Python warning raised inside as one `mqcore: warning:` line (no source line,
    no traceback), each once, whatever filters the caller had (even -W error)."""

    def show(message: Warning | str, *_args: Any, **_kwargs: Any) -> None:
        warn(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[list[int]]:
    """Hold back Ctrl-C (SIGINT) inside the block and raise KeyboardInterrupt at its end if one
    came: what the block does (print a chunk of results, move the cursor past them) is done
    whole or not at all. Only the main thread can; elsewhere the block runs as is."""
    pending: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    try:
        old = signal.signal(signal.SIGINT, note)
    except ValueError:  # not the main thread
        yield pending
        return
    try:
        yield pending
    finally:
        signal.signal(signal.SIGINT, old)
    if pending:
        raise KeyboardInterrupt


def add_isolation(p: argparse.ArgumentParser) -> None:
    """--isolation-level, for every command that reads messages."""
    p.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_uncommitted (default, as Kafka's consumer and kcat): every record; "
        "read_committed: only below the last stable offset, without the records of aborted "
        "Kafka transactions",
    )
