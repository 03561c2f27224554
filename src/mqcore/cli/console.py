"""`mqcore console`: the operations console (docs/console.md) over a store on disk, until
Ctrl-C or SIGTERM.

Read-only by default: the store is opened with read_only=True (no lock taken, nothing
written), so it is safe beside a running writer or `mqcore serve`. `--allow-write` opens it
writable instead (the writer lock: refused while another process holds it) and turns the
write actions on. One line on stdout gives the URL; a clean stop exits 0.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

import mqcore
from mqcore.cli.serve import stop_signals, wait_for_stop
from mqcore.errors import InvalidConfigError, MQCoreError

DEFAULT_HTTP = "127.0.0.1:8080"


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "console",
        help="browse the store in a web browser (read-only unless --allow-write)",
        description="Serve the operations console (overview, message browser, lookups, "
        "message detail and trace, groups) for STORE over HTTP until Ctrl-C or SIGTERM. "
        "Read-only: no lock is taken, so it runs beside a writer. Binds to loopback unless "
        "--http names another address. Needs the server extra: pip install 'mqcore[server]'.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument(
        "--http", default=DEFAULT_HTTP, metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_HTTP}; port 0 picks a free one)",
    )  # fmt: skip
    p.add_argument(
        "--allow-write", action="store_true",
        help="open the store writable (takes the writer lock) and offer the write actions: "
        "produce a test message, reset a group's offsets, resend a dead-lettered message",
    )  # fmt: skip
    sec = p.add_argument_group('security (docs/console.md "Security")')
    sec.add_argument(
        "--auth-credentials", metavar="FILE",
        help="require HTTP Basic with the users of this SCRAM credentials file (the one "
        "`mqcore serve --sasl-credentials` reads); only over TLS or on loopback",
    )  # fmt: skip
    sec.add_argument("--acl", metavar="FILE", help="who may write (needs --auth-credentials)")
    sec.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="a host name browsers may reach the console by, besides the listen address and "
        "localhost (the Host header is checked against DNS rebinding); repeatable",
    )  # fmt: skip
    sec.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate")
    sec.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    lim = p.add_argument_group('limits (docs/console.md "Limits")')
    lim.add_argument(
        "--max-connections", type=int, metavar="N",
        help="connections at once (default 1024, at most a quarter of the open-files limit); "
        "one more is closed at accept",
    )  # fmt: skip
    lim.add_argument(
        "--max-connections-per-ip", type=int, metavar="N",
        help="connections at once from one address (default 256)",
    )  # fmt: skip
    lim.add_argument(
        "--request-timeout", type=float, metavar="S",
        help="seconds a request may take to arrive from its first byte, and a client to take "
        "any of its response (default 30)",
    )  # fmt: skip
    lim.add_argument(
        "--idle-timeout", type=float, metavar="S",
        help="seconds a connection may stay without a request (default 5)",
    )  # fmt: skip
    p.set_defaults(run=cmd_console)


LIMITS = ("max_connections", "max_connections_per_ip", "request_timeout", "idle_timeout")


def cmd_console(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from mqcore.server.address import parse_listen
        from mqcore.server.http import HttpServer, create_app
        from mqcore.server.httpauth import HttpAuth, check_transport
        from mqcore.server.httplimits import HttpLimits
    except ImportError as e:
        raise MQCoreError(
            f"mqcore console needs the server extra ({e.name} is missing): "
            "pip install 'mqcore[server]' (Python 3.11+)"
        ) from None
    host, _port = parse_listen(args.http)
    if args.acl and not args.auth_credentials:
        raise InvalidConfigError("--acl needs --auth-credentials: an ACL names users")
    if args.tls_key and not args.tls_cert:
        raise InvalidConfigError("--tls-key needs --tls-cert")
    limits = {k: getattr(args, k) for k in LIMITS if getattr(args, k) is not None}
    HttpLimits(**limits)  # a limit that cannot work is refused before the store is opened
    auth = None
    if args.auth_credentials:
        check_transport(host, args.tls_cert is not None)
        auth = HttpAuth.load(args.auth_credentials, args.acl)
    with stop_signals() as stop:
        # never makes a store: a typo in the path is an error, not a new empty store
        with mqcore.open(args.store, read_only=not args.allow_write, create=False) as store:
            app = create_app(
                store, allow_write=args.allow_write, auth=auth, allowed_hosts=args.allowed_host
            )
            server = HttpServer(
                app, args.http, tls_cert=args.tls_cert, tls_key=args.tls_key, **limits
            )
            with server:
                mode = "write actions on" if args.allow_write else "read-only"
                print(f"mqcore: console for {args.store} ({mode}) on {server.url}/ui/", file=out)
                out.flush()
                wait_for_stop(stop)
    print("mqcore: stopped", file=out)
    return 0
