"""What `mqcore produce` reads, as items that each become one message.

The items are the --value arguments, or the lines of a file or stdin, or with `--record-start`
groups of lines. A line loses its `\\n` ending, and the `\\r` of a `\\r\\n` ending too. `--skip N`
passes over the first N input lines (how an interrupted run goes on). Each item carries the
input lines it spans (1-based, counted from the start of the input, skipped lines included), so
every message that says what was written, or which line is bad, names the lines of the file.

Records (`--record-start RE`): a line RE matches (searched for, as re.search does) starts a
record, every other line continues the current one; a record is its lines joined with `\\n`.
Blank lines at the end of a record (the blank line between apt's history.log blocks) separate
records and are not kept, and a record of blank lines only is none. Lines before the first
line that starts a record form a record of their own. A record is complete only once the next
one starts, or at the end of the input.

Input that looks binary (a compressed file's magic number, NUL bytes in a line) gets one
warning: its bytes are stored as they are, which is rarely what was meant.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import stat
import sys
from collections.abc import Iterator
from typing import cast

from mqcore.cli.options import UsageError, arg_bytes, warn
from mqcore.errors import InvalidConfigError

# the first bytes of compressed files a log rotation leaves (access.log.2.gz, ...)
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    b"\x04\x22\x4d\x18": "lz4",
    b"PK\x03\x04": "zip",
}
BLOCK = 1 << 16  # bytes read at a time
DECOMPRESS = {"gzip": "zcat", "zstd": "zstdcat", "xz": "xzcat", "bzip2": "bzcat", "lz4": "lz4cat"}


# One message's input: (first, last, data, cut): the input lines it spans (1-based; --value:
# its number twice), its bytes, and whether it is a record longer than Input.cap of which only
# the start was kept. A plain tuple, not a NamedTuple: one is made per input line, and making a
# NamedTuple costs four times what reading the line does.
Item = tuple[int, int, bytes, bool]


class Input:
    """The items of one run, readable from the start again (a regular file is read twice:
    checked whole, then written)."""

    def __init__(self, args: argparse.Namespace):
        self.values = None if args.value is None else [arg_bytes(v) for v in args.value]
        self.path: str | None = None if args.file in (None, "-") else args.file
        self.skip: int = args.skip
        self.record_start = _record_start(args.record_start)
        if self.values is not None and (self.skip or self.record_start is not None):
            raise UsageError("--skip and --record-start read input lines; --value gives values")
        self.whole = self.values is not None or (self.path is not None and _regular(self.path))
        self.label = "record" if self.record_start is not None else "line"
        if self.values is not None:
            self.label = "value"
        self.cap: int | None = None  # a record is not gathered past this many bytes
        self.warned: set[str] = set()  # the warnings given (a file read twice warns once)

    @property
    def source(self) -> str:
        return "stdin" if self.path is None else self.path

    def items(self) -> Iterator[Item]:
        """Every item, from the start of the input."""
        if self.values is not None:
            return ((n, n, v, False) for n, v in enumerate(self.values, 1))
        lines = self._lines()
        return lines if self.record_start is None else self._records(lines)

    def name(self, item: Item) -> str:
        """How messages name an item: "line 12", "value 3", "the record at lines 12-15"."""
        first, last, _, _ = item
        if self.label != "record":
            return f"{self.label} {first}"
        return f"the record at {self.span(first, last)}"

    def span(self, first: int, last: int) -> str:
        """ "lines 1-1500", "line 7", "values 1-3": input lines, or values."""
        unit = "value" if self.values is not None else "line"
        return f"{unit} {first}" if first == last else f"{unit}s {first}-{last}"

    # -- lines ------------------------------------------------------------------------------

    def _lines(self) -> Iterator[Item]:
        """The lines after --skip, each an Item of itself, endings cut. Read a block at a time
        and split (three times as fast as readline() per line); read1 returns what a pipe
        has, so the lines of a stream come as they arrive."""
        n = 0  # lines before the block
        pending: list[bytes] = []  # blocks of a line whose end has not been read yet
        with _opened(self.path) as stream:
            for block in iter(lambda: stream.read1(BLOCK), b""):
                if n == 0 and not pending:
                    self._sniff_start(block)
                if b"\n" not in block:
                    pending.append(block)  # joined once the line ends: never copied twice
                    continue
                data = b"".join([*pending, block]) if pending else block
                lines = data.split(b"\n")
                rest = lines.pop()
                pending = [rest] if rest else []
                self._check(n, data)
                yield from self._numbered(lines, n, b"\r" in data)
                n += len(lines)
        if pending:  # a last line without \n: kept whole
            last = [b"".join(pending)]
            self._check(n, last[0])
            yield from self._numbered(last, n, False)
            n += 1
        if n < self.skip:
            self._once("skip", f"--skip {self.skip} passed over every line of {self.source} "
                       f"(it has {n:,}): nothing to write")  # fmt: skip

    def _check(self, before: int, data: bytes) -> None:
        """One warning for the first line of `data` (lines before + 1, ...) holding a NUL."""
        if b"\0" in data:
            at = data.index(b"\0")
            self._nul(before + data.count(b"\n", 0, at) + 1)

    def _numbered(self, lines: list[bytes], before: int, cr: bool) -> Iterator[Item]:
        """`lines` (numbered from before + 1) past --skip, the `\r` of `\r\n` cut when `cr`."""
        if cr:
            lines = [line[:-1] if line[-1:] == b"\r" else line for line in lines]
        n = max(before, self.skip)
        for line in lines[n - before :]:
            n += 1
            yield n, n, line, False

    def _nul(self, n: int) -> None:
        if n > self.skip and "magic" not in self.warned:
            self._once("nul", f"line {n} of {self.source} holds NUL bytes: binary input? "
                       "Every line is stored as it is")  # fmt: skip

    def _sniff_start(self, first: bytes) -> None:
        kind = next((k for magic, k in MAGIC.items() if first.startswith(magic)), None)
        if kind is None:
            return
        tool = DECOMPRESS.get(kind, "unzip -p")
        name = self.path or "FILE"
        self._once("magic", f"{self.source} starts like a {kind} file: its bytes would be "
                   f"stored as they are, compressed; decompress it first: {tool} {name} | "
                   "mqcore produce ...")  # fmt: skip

    def _once(self, what: str, message: str) -> None:
        if what not in self.warned:
            self.warned.add(what)
            warn(message)

    # -- records ----------------------------------------------------------------------------

    def _records(self, lines: Iterator[Item]) -> Iterator[Item]:
        """Lines gathered into records (module doc); past `cap` bytes a record keeps counting
        its lines but not their bytes."""
        assert self.record_start is not None
        starts = self.record_start.search
        parts: list[bytes] = []
        first = last = size = 0
        gathering = False
        for n, _, line, _ in lines:
            if gathering and starts(line.decode("utf-8", "surrogateescape")):
                record = _record(first, last, parts, size, self.cap)
                if record is not None:
                    yield record
                gathering = False
            if not gathering:
                gathering, parts, first, size = True, [], n, -1
            last = n
            size += 1 + len(line)  # joined with \n
            if self.cap is None or size <= self.cap:
                parts.append(line)
        record = _record(first, last, parts, size, self.cap)
        if record is not None:
            yield record


def _record(first: int, last: int, parts: list[bytes], size: int, cap: int | None) -> Item | None:
    """The record of `parts` without its trailing blank lines; None when all are blank."""
    cut = cap is not None and size > cap
    while parts and not parts[-1].strip():
        parts.pop()
    if not parts and not cut:
        return None
    return first, last, b"\n".join(parts), cut


def _opened(path: str | None) -> contextlib.AbstractContextManager[io.BufferedIOBase]:
    """The file at `path`, or stdin (left open) for None."""
    if path is None:
        return contextlib.nullcontext(cast(io.BufferedIOBase, sys.stdin.buffer))
    return open(path, "rb")


def _record_start(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InvalidConfigError(
            f"--record-start {pattern!r} is not a regular expression: {e}"
        ) from None


def _regular(path: str) -> bool:
    """Whether --file `path` is a regular file (else a pipe or device: read as a stream);
    a clear error for a directory or a path that cannot be read."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise InvalidConfigError(f"--file {path}: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise InvalidConfigError(
            f"--file {path} is a directory; give one file (several: cat {path}/*.log | "
            "mqcore produce ...)"
        )
    if not os.access(path, os.R_OK):
        raise InvalidConfigError(f"--file {path}: permission denied")
    return stat.S_ISREG(mode)
