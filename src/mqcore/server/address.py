"""Listen addresses, as `Server(listen=)` and `Server(http=)` take them: one parser for both."""

from __future__ import annotations

from mqcore.errors import InvalidConfigError


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (or :PORT, loopback; or [v6]:PORT) as (host, port); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidConfigError(f"listen address {text!r} is not HOST:PORT")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)
