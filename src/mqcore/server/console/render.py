"""The console's HTML: one Jinja2 environment (autoescape on for every template: message
contents are attacker-controlled), the page response, and how bytes and times are shown."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone, tzinfo
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from mqcore._ext.batch import Message
from mqcore.query.jsonform import timestamp_type
from mqcore.server.console import csrf

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
PREVIEW_CHARS = 120  # characters of a key or value a result row shows
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,  # every template, whatever its name: never HTML from message data
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A whole page: `template` with the console's common context (store, read-only, write
    actions on, the CSRF token of the forms: csrf.py, whose session cookie it sets)."""
    state = request.app.state
    html = ENV.get_template(template).render(
        store_path=state.store.path,
        read_only=state.store.read_only,
        allow_write=state.console_allow_write,
        csrf=csrf.token(request),
        error=context.pop("error", None),
        **context,
    )
    response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
    csrf.attach(request, response)
    return response


def fragment(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


# a page loads only its own script and style: an injected <script> would not run even if it
# got past the escaping
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def text_of(b: bytes | None) -> str:
    """Bytes as text: UTF-8, with undecodable bytes as \\xNN (None: "")."""
    if b is None:
        return ""
    return b.decode("utf-8", "backslashreplace")


def header_value(b: bytes | None) -> str:
    """A header value: its text when it is printable UTF-8, else 0x and its hex (the binary
    `uid` header, say); "(null)" for None."""
    if b is None:
        return "(null)"
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + b.hex()
    return "0x" + b.hex() if _UNPRINTABLE.search(text) else text


def preview(b: bytes | None, chars: int = PREVIEW_CHARS) -> str:
    """The start of a key or value on one line, for a result row."""
    if b is None:
        return "(null)"
    text = _UNPRINTABLE.sub("\ufffd", text_of(b[: chars * 4]).replace("\n", " "))
    return text if len(text) <= chars and len(b) <= chars * 4 else text[:chars] + "\u2026"


def hexdump(b: bytes) -> str:
    """16 bytes a line: offset, hex, printable ASCII."""
    lines = []
    for i in range(0, len(b), 16):
        chunk = b[i : i + 16]
        ascii_ = "".join(chr(c) if 32 <= c < 127 else "." for c in chunk)
        lines.append(f"{i:08x}  {chunk.hex(' '):<47}  {ascii_}")
    return "\n".join(lines)


FORMATS = ("text", "json", "hex")


def value_as(b: bytes | None, wanted: str | None) -> tuple[str, str]:
    """(format, text) of a value: `wanted` when it applies, else JSON pretty-printed when the
    value is a JSON object or array, text when it is UTF-8, hex otherwise."""
    if b is None:
        return "text", ""
    try:
        text: str | None = b.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if wanted == "hex" or (wanted is None and text is None):
        return "hex", hexdump(b)
    if wanted in (None, "json") and text is not None:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, (dict, list)) or (wanted == "json" and doc is not None):
            return "json", json.dumps(doc, indent=2, ensure_ascii=False)
    if text is None:  # asked for text: shown with \xNN escapes
        return "text", text_of(b)
    return "text", text


def zone_name(tz: tzinfo) -> str:
    return "UTC" if tz is timezone.utc else str(tz)


def time_text(ms: int, tz: tzinfo) -> str:
    """A timestamp (ms) in `tz`, ISO 8601 with milliseconds and the offset; "-" for none."""
    if ms < 0:
        return "-"
    try:
        dt = datetime.fromtimestamp(ms / 1000, tz)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def row(m: Message, tz: tzinfo, with_topic: bool = False) -> dict[str, Any]:
    """What a result row shows of a message."""
    return {
        "topic": m.topic,
        "partition": m.partition,
        "offset": m.offset,
        "timestamp": time_text(m.timestamp, tz),
        "timestamp_type": timestamp_type(m.timestamp_type),
        "key": preview(m.key),
        "tag": m.tag or "",
        "value": preview(m.value),
        "with_topic": with_topic,
    }
