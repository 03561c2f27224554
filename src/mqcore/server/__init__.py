"""`mqcore serve`: the store behind the Kafka protocol (docs/server.md).

    from mqcore.server import Server
    with Server("data", listen="127.0.0.1:0") as server:
        print(server.bootstrap)   # bootstrap.servers for any Kafka client

Needs the `server` extra (`pip install 'mqcore[server]'`: kio, Kafka's message schemas).
"""

from typing import TYPE_CHECKING, Any

from mqcore.server.address import parse_listen

if TYPE_CHECKING:
    from mqcore.server.server import Server

__all__ = ["Server", "parse_listen"]


def __getattr__(name: str) -> Any:
    """Server on first use: `mqcore.server.defaults` (what the command line's help shows)
    imports without the server extra."""
    if name == "Server":
        from mqcore.server.server import Server

        return Server
    raise AttributeError(f"module 'mqcore.server' has no attribute {name!r}")
