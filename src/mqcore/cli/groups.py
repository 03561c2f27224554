"""`mqcore groups STORE [GROUP]`: consumer groups, their committed offsets and lag, and share
groups, their windows and backlog (records available and in flight).

Read-only (no lock, nothing written), so it runs beside the writer; it shows the groups as of
the moment it opened the store. Everything comes from the files: committed offsets from
`__consumer_offsets` (Store.group_lag), dead letters from `__dlq.<group>`. Members are not
shown: a group is coordinated inside the writer's process and nothing on disk records who its
members are (docs/consume.md "Consumer groups"), so `--json` gives "members": null. Share
groups come from `__share_group_state` (Store.share_group_lag): every record not done counts
as available there, as no lock outlives the writer's process.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, TextIO

import mqcore
from mqcore.cli import render
from mqcore.cli.options import add_json
from mqcore.consume.group import DLQ_PREFIX, RETRY_PREFIX, PartitionLag
from mqcore.consume.share import ShareLag
from mqcore.errors import UnknownGroupError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "groups",
        help="consumer and share groups: committed offsets and lag per partition",
        description="Without GROUP: one line per consumer group (its topics, lag, retry "
        "copies waiting, dead letters, last commit). With GROUP: its committed offset, end "
        "offset and lag (end - committed) per partition, retry levels included once they "
        "held a message. Read-only, so safe beside a running writer; it shows the store as "
        "it was when the command started. Members are not shown: groups are coordinated "
        "inside the writer's process and the store does not record them. Share groups "
        "follow in a table of their own: per group (or per partition with GROUP) the window "
        "start and end, records available (never delivered or released) and in flight.",
    )
    p.add_argument("store", help="store directory")
    p.add_argument("group", nargs="?", help="only this group, per partition")
    add_json(
        p,
        '{"type": "partition", ...} per partition with GROUP, {"type": "group", ...}; share '
        'groups: {"type": "share_partition", ...}, {"type": "share_group", ...}',
    )
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


def share_summary(group: str, rows: list[ShareLag]) -> dict[str, Any]:
    return {"type": "share_group", "group": group,
            "topics": sorted({r.topic for r in rows}), "partitions": len(rows),
            "available": sum(r.available for r in rows),
            "in_flight": sum(r.in_flight for r in rows)}  # fmt: skip


def share_partition(row: ShareLag) -> dict[str, Any]:
    return {"type": "share_partition", "group": row.group, "topic": row.topic,
            "partition": row.partition, "start": row.start, "end": row.end,
            "log_end": row.log_end, "available": row.available,
            "in_flight": row.in_flight}  # fmt: skip


def load(store: mqcore.Store, only: str | None, shares: bool = False) -> list[GroupSummary]:
    """Every group with a committed offset, a retry or a dead-letter topic (or just `only`).
    `shares`: `only` is a share group, so a missing consumer group is no error."""
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
    if only is not None and only not in groups and not shares:
        raise UnknownGroupError(
            f"no consumer group {only!r} in {store.path}: no committed offset, retry or "
            "dead-letter topic, and no share group state"
        )
    return [groups[g] for g in sorted(groups)]


def cmd_groups(args: argparse.Namespace, out: TextIO) -> int:
    with mqcore.open(args.store, read_only=True) as store:
        shares = store.share_group_lag(args.group)
        groups = load(store, args.group, bool(shares))
    if args.group is not None:
        if groups:
            _one_group(args, groups[0], out)
        if shares:
            _share_table(args, shares, out)
        return 0
    if args.json:
        for summary in groups:
            render.emit(out, summary.to_json())
    elif groups:
        cells = [("GROUP", "TOPICS", "PARTITIONS", "LAG", "RETRY", "DLQ", "LAST COMMIT")]
        for s in groups:
            doc = s.to_json()
            cells.append((s.group, ",".join(doc["topics"]) or "-", str(doc["partitions"]),
                          str(doc["lag"]), str(doc["retry_lag"]), str(doc["dead_letters"]),
                          render.iso_ms(doc["last_commit_time"])))  # fmt: skip
        out.write(render.table(cells))
    _share_table(args, shares, out)
    return 0


def _share_table(args: argparse.Namespace, shares: dict[str, list[ShareLag]], out: TextIO) -> None:
    """Share groups: a line each, or a line per partition of the one asked for."""
    if not shares:
        return
    if args.json:
        for group, rows in shares.items():
            if args.group is not None:
                for r in rows:
                    render.emit(out, share_partition(r))
            render.emit(out, share_summary(group, rows))
        return
    if args.group is not None:
        cells: list[tuple[str, ...]] = [
            ("SHARE GROUP", "TOPIC", "PARTITION", "START", "END", "LOG END", "AVAILABLE",
             "IN FLIGHT")
        ]  # fmt: skip
        cells += [(r.group, r.topic, str(r.partition), str(r.start), str(r.end),
                   str(r.log_end), str(r.available), str(r.in_flight))
                  for rows in shares.values() for r in rows]  # fmt: skip
    else:
        cells = [("SHARE GROUP", "TOPICS", "PARTITIONS", "AVAILABLE", "IN FLIGHT")]
        for group, rows in shares.items():
            doc = share_summary(group, rows)
            cells.append((group, ",".join(doc["topics"]) or "-", str(doc["partitions"]),
                          str(doc["available"]), str(doc["in_flight"])))  # fmt: skip
    out.write(render.table(cells))


def _one_group(args: argparse.Namespace, summary: GroupSummary, out: TextIO) -> None:
    """A consumer group's committed offset, end and lag per partition."""
    if args.json:
        for p in summary.partitions:
            render.emit(out, {"type": "partition", **p.to_json()})
        render.emit(out, summary.to_json())
        return
    cells: list[tuple[str, ...]] = [
        ("TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "COMMITTED AT")
    ]
    cells += [(p.topic, str(p.partition), str(p.committed), _or_dash(p.end_offset),
               _or_dash(p.lag), render.iso_ms(p.commit_time))
              for p in summary.partitions]  # fmt: skip
    out.write(render.table(cells))


def _or_dash(n: int | None) -> str:
    return "-" if n is None else str(n)
