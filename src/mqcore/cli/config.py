"""`mqcore config`: print a topic's settings, or change them.

Without settings it opens the store read-only (no lock, safe beside a writer) and prints every
setting of the topic. With NAME=VALUE pairs it opens the store writable (the writer lock:
StoreLockedError while another process writes it) and calls Store.alter_topic_config, which
refuses the settings fixed at creation (docs/operations.md "Changing the settings of an
existing topic").
"""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import add_json
from mqcore.config import FIXED_AT_CREATION, TopicConfig
from mqcore.errors import StoreLockedError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "config",
        help="print a topic's settings, or change them",
        description="Print every setting of TOPIC (read-only: safe beside a writer), or with "
        "NAME=VALUE pairs change them (takes the writer lock, like produce) and print the "
        "settings it now has. Fixed at creation, refused: "
        + ", ".join(FIXED_AT_CREATION)
        + ". Every other setting applies from the next append, roll or maintenance pass.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("topic")
    p.add_argument(
        "settings",
        nargs="*",
        metavar="NAME=VALUE",
        help="settings to change, e.g. max_message_bytes=8388608 retention_ms=-1",
    )
    add_json(p, '{"type": "topic_config", "topic": ..., "config": {NAME: VALUE, ...}}')
    p.set_defaults(run=cmd_config)


def cmd_config(args: argparse.Namespace, out: TextIO) -> int:
    if not os.path.isdir(args.store):
        raise FileNotFoundError(f"store {args.store} does not exist")
    changes = dict(TopicConfig.parse_setting(text) for text in args.settings)
    if not changes:
        with mqcore.open(args.store, read_only=True) as store:
            cfg = store.topic_config(args.topic)
    else:
        # checked before the writable open, which would make a store of any directory
        with mqcore.open(args.store, read_only=True) as reader:
            reader.topic_config(args.topic)
        try:
            store = mqcore.open(args.store)
        except StoreLockedError as e:
            raise StoreLockedError(
                f"{e}; `mqcore config` changes settings only while no other process writes "
                "the store: stop the writer, or change them from it with "
                "Store.alter_topic_config"
            ) from None
        with store:
            cfg = store.alter_topic_config(args.topic, **changes)
    _print(out, args, cfg)
    return 0


def _print(out: TextIO, args: argparse.Namespace, cfg: TopicConfig) -> None:
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    if args.json:
        render.emit(out, {"type": "topic_config", "topic": args.topic, "config": values})
        return
    for name, value in values.items():  # NAME=VALUE, as `mqcore config` takes them back
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out.write(f"{name}={text}\n")
    out.flush()
