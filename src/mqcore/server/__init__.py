"""`mqcore serve`: the store behind the Kafka protocol (docs/server.md).

    from mqcore.server import Server
    with Server("data", listen="127.0.0.1:0") as server:
        print(server.bootstrap)   # bootstrap.servers for any Kafka client

Needs the `server` extra (`pip install 'mqcore[server]'`: kio, Kafka's message schemas).
"""

from mqcore.server.address import parse_listen
from mqcore.server.server import Server

__all__ = ["Server", "parse_listen"]
