"""`mqcore server-user`: the users of a `mqcore serve` SASL credentials file.

    mqcore server-user add FILE USER [--password-stdin] [--iterations N]
    mqcore server-user remove FILE USER

The password is asked for on the terminal (twice), or read as one line from stdin with
--password-stdin; never taken as an argument, where `ps` and shell history would show it. The
file keeps SCRAM-SHA-256 salted keys only (docs/server.md "Security").
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any, TextIO

from mqcore.errors import InvalidConfigError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "server-user",
        help="add or remove a user of a `mqcore serve` SASL credentials file",
        description="Add a user (or change their password) or remove one in a credentials file "
        "for `mqcore serve` (SASL PLAIN and SCRAM-SHA-256). Only salted SCRAM keys are written.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add a user or change their password")
    add.add_argument("file", help="credentials file (made when missing)")
    add.add_argument("user", help="user name (the principal is User:NAME)")
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password as one line from stdin"
    )
    add.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations (>= 4096)")
    add.set_defaults(run=cmd_add)
    remove = actions.add_parser("remove", help="remove a user")
    remove.add_argument("file", help="credentials file")
    remove.add_argument("user", help="user name")
    remove.set_defaults(run=cmd_remove)
    for command in (add, remove):
        command.set_defaults(parser=command)


def _auth() -> Any:
    try:
        from mqcore.server import auth
    except ImportError as e:
        raise InvalidConfigError(f"server-user needs the server extra (mqcore[server]): {e}") from e
    return auth


def cmd_add(args: argparse.Namespace, out: TextIO) -> int:
    auth = _auth()
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.user}: ")
        if getpass.getpass("again: ") != password:
            raise InvalidConfigError("the passwords differ")
    auth.add_user(args.file, args.user, password, iterations=args.iterations)
    print(f"user {args.user} saved in {args.file}", file=out)
    return 0


def cmd_remove(args: argparse.Namespace, out: TextIO) -> int:
    _auth().remove_user(args.file, args.user)
    print(f"user {args.user} removed from {args.file}", file=out)
    return 0
