"""How the `mqcore` command shows things: text fields, JSON values, tables, a progress bar.

Bytes (keys, values, header values) are shown as UTF-8 text when they decode. Otherwise text
output escapes the stray bytes as \\xNN, and control characters too (\\n, \\r, \\t by name,
others such as ESC as \\xNN), so one record stays on one line and a value cannot drive the
terminal. JSON output is mqcore.query.jsonform's, which the HTTP API writes too:
{"base64": "..."} in place of the string, so JSON never loses a byte.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from mqcore import Message
from mqcore.query import engine
from mqcore.query.jsonform import header_name, timestamp_type

NULL = "(null)"
# control characters in text output: \n \r \t by name, the others (ESC...) as \xNN
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
}


# -- single values ------------------------------------------------------------------------------


def text(b: bytes | None) -> str:
    """Bytes for a text line: UTF-8, other bytes as \\xNN, control characters escaped."""
    if b is None:
        return NULL
    return b.decode("utf-8", "backslashreplace").translate(_ESCAPES)


def header_text(name: str, value: bytes | None) -> str:
    """A header value for a text line; the binary `uid` header as its UUID text."""
    if name == "uid" and value is not None and len(value) == 16:
        h = value.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return text(value)


def plural(n: int, word: str) -> str:
    """'1 batch', '2 batches', '3 records', '0 entries'."""
    if n == 1:
        return f"{n} {word}"
    if word.endswith("y"):
        return f"{n} {word[:-1]}ies"
    return f"{n} {word}es" if word.endswith(("ch", "s", "x")) else f"{n} {word}s"


def iso_ms(ms: int) -> str:
    """A timestamp in ms as ISO-8601 UTC with milliseconds; '-' for none (negative)."""
    return "-" if ms < 0 else engine.iso_ms(ms)


def time_text(ms: int) -> str:
    """A message timestamp for text output: ISO-8601 UTC with milliseconds, then the epoch
    ms it is, `2024-06-10T10:00:00.123Z (1718013600123)`; `none (-1)` for no timestamp."""
    shown = iso_ms(ms)
    if shown == "-":
        return f"none ({ms})"
    return f"{shown} ({ms})" if shown != str(ms) else shown


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB' (exact bytes below 1 KiB)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


# -- messages -------------------------------------------------------------------------------------


def message_block(msg: Message) -> str:
    """One message in full, one field a line (get)."""
    lines = [
        f"topic:          {msg.topic}",
        f"partition:      {msg.partition}",
        f"offset:         {msg.offset}",
        f"timestamp:      {time_text(msg.timestamp)} {timestamp_type(msg.timestamp_type)}",
        f"msg_id:         {msg.msg_id}",
        f"unique_id:      {msg.unique_id or NULL}",
        f"tag:            {msg.tag or NULL}",
        f"key:            {text(msg.key)}",
        f"value:          {text(msg.value)}",
    ]
    props = msg.properties
    lines.append(f"properties:     {len(props)}")
    lines += [f"  {text(header_name(k))} = {text(v.encode())}" for k, v in props.items()]
    lines.append(f"headers:        {len(msg.headers)}")
    lines += [f"  {text(header_name(k))}: {header_text(k, v)}" for k, v in msg.headers]
    return "\n".join(lines)


def message_line(msg: Message) -> str:
    """topic, partition, offset, timestamp (time_text), msg_id, key, value: tab-separated
    (query)."""
    return "\t".join(
        (
            msg.topic,
            str(msg.partition),
            str(msg.offset),
            time_text(msg.timestamp),
            msg.msg_id,
            text(msg.key),
            text(msg.value),
        )
    )


# -- output -------------------------------------------------------------------------------------


def emit(out: TextIO, obj: dict[str, Any]) -> None:
    """One JSON object on one line."""
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")


def table(rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first `left` columns left-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


# -- progress -----------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr, redrawn at most every `interval` seconds.

    Draws only when `enabled` (a TTY, or --progress); the line is cleared at `close()` so it
    never mixes with what follows. Amounts are bytes (shown with units) plus a record count.
    """

    def __init__(
        self,
        label: str,
        total: int,
        enabled: bool,
        stream: TextIO | None = None,
        interval: float = 0.1,
    ):
        self.label = label
        self.total = max(0, total)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.done = 0
        self.records = 0
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False
        if enabled:
            self._draw()

    def update(self, done: int, records: int | None = None, force: bool = False) -> None:
        """Set the amount done so far (bytes) and the records seen; redraw when due."""
        self.done = done
        if records is not None:
            self.records = records
        if self.enabled and (force or time.monotonic() - self._last_draw >= self.interval):
            self._draw()

    def line(self, width: int) -> str:
        """The bar as text, `width` characters at most."""
        elapsed = time.monotonic() - self.started
        frac = min(1.0, self.done / self.total) if self.total else 1.0
        amount = f"{human_bytes(self.done)}/{human_bytes(self.total)}"
        tail = f" {frac * 100:5.1f}% {amount} {self.records:,} records {elapsed:.1f}s"
        bar_width = max(10, min(40, width - len(self.label) - len(tail) - 4))
        filled = int(frac * bar_width)
        return f"{self.label} [{'#' * filled}{'.' * (bar_width - filled)}]{tail}"[:width]

    def _width(self) -> int:
        """Columns of the terminal the bar is drawn on (80 when it is not one), less one."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = shutil.get_terminal_size((80, 24)).columns
        return max(40, columns - 1)

    def _draw(self) -> None:
        width = self._width()
        self.stream.write("\r" + self.line(width).ljust(width))
        self.stream.flush()
        self._last_draw = time.monotonic()
        self._drawn = True

    def close(self, complete: bool = False) -> None:
        """Draw the final state (full when `complete`), then clear the line."""
        if not self.enabled or not self._drawn:
            return
        if complete:
            self.done = max(self.done, self.total)
        self._draw()
        self.stream.write("\r" + " " * self._width() + "\r")
        self.stream.flush()
        self._drawn = False
