"""`mqcore groups STORE [GROUP]`: consumer groups, their committed offsets and lag.

Read-only (no lock, nothing written), so it runs beside the writer; it shows the groups as of
the moment it opened the store. Everything comes from the files: committed offsets from
`__consumer_offsets` (Store.group_lag), dead letters from `__dlq.<group>`. Members are not
shown: a group is coordinated inside the writer's process and nothing on disk records who its
members are (docs/consume.md "Consumer groups"), so `--json` gives "members": null.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import add_json
from mqcore.consume.group import DLQ_PREFIX, RETRY_PREFIX, PartitionLag
from mqcore.errors import UnknownGroupError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "groups",
        help="consumer groups: committed offsets and lag per partition",
        description="Without GROUP: one line per consumer group (its topics, lag, retry "
        "copies waiting, dead letters, last commit). With GROUP: its committed offset, end "
        "offset and lag (end - committed) per partition, retry levels included once they "
        "held a message. Read-only, so safe beside a running writer; it shows the store as "
        "it was when the command started. Members are not shown: groups are coordinated "
        "inside the writer's process and the store does not record them.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("group", nargs="?", help="only this group, per partition")
    add_json(p, '{"type": "partition", ...} per partition with GROUP, {"type": "group", ...}')
    p.set_defaults(run=cmd_groups)


@dataclass
class GroupSummary:
    group: str
    partitions: list[PartitionLag] = field(default_factory=list)
    dead_letters: int = 0

    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions if not p.topic.startswith("__")})

    def lag(self, retry: bool) -> int:
        return sum(p.lag or 0 for p in self.partitions if p.topic.startswith(RETRY_PREFIX) == retry)

    def to_json(self) -> dict[str, Any]:
        last = max((p.commit_time for p in self.partitions), default=-1)
        return {"type": "group", "group": self.group, "topics": self.topics(),
                "partitions": len(self.partitions), "lag": self.lag(False),
                "retry_lag": self.lag(True), "dead_letters": self.dead_letters,
                "last_commit_time": last, "members": None}  # fmt: skip


def load(store: mqcore.Store, only: str | None) -> list[GroupSummary]:
    """Every group with a committed offset, a retry or a dead-letter topic (or just `only`)."""
    groups = {g: GroupSummary(g, lags) for g, lags in store.group_lag(only).items()}
    for topic in store.topics():
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            name = topic[len(prefix) :]
            if topic.startswith(prefix) and only in (None, name):
                summary = groups.setdefault(name, GroupSummary(name))
                if prefix == DLQ_PREFIX:
                    summary.dead_letters = sum(
                        store.end_offset(topic, p) - store.start_offset(topic, p)
                        for p in store.available_partitions(topic)
                    )
    if only is not None and only not in groups:
        raise UnknownGroupError(
            f"no consumer group {only!r} in {store.path}: no committed offset, retry or "
            "dead-letter topic"
        )
    return [groups[g] for g in sorted(groups)]


def cmd_groups(args: argparse.Namespace, out: TextIO) -> int:
    with mqcore.open(args.store, read_only=True) as store:
        groups = load(store, args.group)
    if args.group is not None:
        (summary,) = groups
        if args.json:
            for p in summary.partitions:
                render.emit(out, {"type": "partition", **p.to_json()})
            render.emit(out, summary.to_json())
            return 0
        cells: list[tuple[str, ...]] = [
            ("TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "COMMITTED AT")
        ]
        cells += [(p.topic, str(p.partition), str(p.committed), _or_dash(p.end_offset),
                   _or_dash(p.lag), render.iso_ms(p.commit_time))
                  for p in summary.partitions]  # fmt: skip
        out.write(render.table(cells))
        return 0
    if args.json:
        for summary in groups:
            render.emit(out, summary.to_json())
        return 0
    cells = [("GROUP", "TOPICS", "PARTITIONS", "LAG", "RETRY", "DLQ", "LAST COMMIT")]
    for s in groups:
        doc = s.to_json()
        cells.append((s.group, ",".join(doc["topics"]) or "-", str(doc["partitions"]),
                      str(doc["lag"]), str(doc["retry_lag"]), str(doc["dead_letters"]),
                      render.iso_ms(doc["last_commit_time"])))  # fmt: skip
    out.write(render.table(cells))
    return 0


def _or_dash(n: int | None) -> str:
    return "-" if n is None else str(n)
