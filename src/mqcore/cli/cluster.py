"""`mqcore cluster status`: a cluster as its coordination state says it is (issue 33).

    mqcore cluster status --coordinator zk://HOST:PORT/PATH [--under-replicated] [--json]
                          [--timeout S]

Shows the controller and its epoch, the live brokers, and every partition's replicas, leader,
leader epoch and in-sync replicas, marking those under-replicated (fewer in-sync replicas than
replicas) and offline (no leader); `--under-replicated` lists only partitions that are either,
as kafka-topics' --under-replicated-partitions does. It reads ZooKeeper and nothing else: no
broker is asked, so it works while brokers are down. Exit status 0 when every partition has
all its replicas in sync and a leader, 3 otherwise, so a script can check the cluster's health.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any, TextIO

from mqcore.errors import InvalidConfigError

UNHEALTHY = 3


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "cluster",
        help="a cluster's brokers, controller and partitions, from its coordinator",
        description="Inspect a cluster of `mqcore serve` brokers through its coordinator "
        "(ZooKeeper): docs/cluster.md.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status",
        help="brokers, controller, leaders, in-sync replicas (exit 3 if a partition is "
        "under-replicated or offline)",
    )
    status.add_argument(
        "--coordinator", required=True, metavar="URL", help="zk://HOST:PORT[,HOST:PORT]/PATH"
    )
    status.add_argument(
        "--under-replicated", action="store_true",
        help="list only partitions with fewer in-sync replicas than replicas, or no leader",
    )  # fmt: skip
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.add_argument(
        "--timeout", type=float, default=10.0, metavar="S",
        help="seconds to wait for the coordinator (default 10)",
    )  # fmt: skip
    status.set_defaults(run=cmd_status)
    status.set_defaults(parser=status)


def _zk() -> Any:
    try:
        from mqcore.cluster import zk
    except ImportError as e:
        raise InvalidConfigError(f"cluster needs the server extra (mqcore[server]): {e}") from e
    return zk


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    if args.timeout <= 0:
        raise InvalidConfigError(f"--timeout must be positive: {args.timeout}")
    zk = _zk()
    # kazoo logs each refused connection; the command says what failed in one line itself
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    with zk.ZkCoordinator(args.coordinator, connect_timeout=args.timeout) as coordinator:
        view = coordinator.describe()
    unhealthy = [p for p in view.partitions if p.under_replicated or p.offline]
    shown = unhealthy if args.under_replicated else view.partitions
    if args.json:
        print(json.dumps({
            "controller": view.controller,
            "controller_epoch": view.controller_epoch,
            "brokers": [{"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                        for b in sorted(view.brokers.values(), key=lambda b: b.node_id)],
            "partitions": [_partition_json(p) for p in shown],
            "under_replicated": sum(p.under_replicated for p in view.partitions),
            "offline": sum(p.offline for p in view.partitions),
        }), file=out)  # fmt: skip
        return UNHEALTHY if unhealthy else 0
    controller = "none" if view.controller is None else f"broker {view.controller}"
    print(f"controller: {controller} (epoch {view.controller_epoch})", file=out)
    print(f"brokers: {len(view.brokers)} live", file=out)
    for b in sorted(view.brokers.values(), key=lambda b: b.node_id):
        rack = f"  rack {b.rack}" if b.rack is not None else ""
        print(f"  {b.node_id}  {b.host}:{b.port}{rack}", file=out)
    topics = len({p.topic for p in view.partitions})
    print(
        f"partitions: {len(view.partitions)} in {topics} topic(s), "
        f"{sum(p.under_replicated for p in view.partitions)} under-replicated, "
        f"{sum(p.offline for p in view.partitions)} offline",
        file=out,
    )
    for p in shown:
        print("  " + _partition_line(p), file=out)
    return UNHEALTHY if unhealthy else 0


def _partition_json(p: Any) -> dict[str, Any]:
    s = p.state
    return {
        "topic": p.topic,
        "partition": p.partition,
        "replicas": list(p.replicas),
        "leader": None if s is None or p.offline else s.leader,
        "leader_epoch": None if s is None else s.leader_epoch,
        "isr": [] if s is None else list(s.isr),
        "under_replicated": p.under_replicated,
        "offline": p.offline,
    }


def _partition_line(p: Any) -> str:
    s = p.state
    if s is None:
        return f"{p.topic}-{p.partition}  replicas {list(p.replicas)}  no state yet"
    leader = "none" if p.offline else str(s.leader)
    marks = [m for m, on in (("offline", p.offline), ("under-replicated", p.under_replicated))
             if on]  # fmt: skip
    return (
        f"{p.topic}-{p.partition}  leader {leader}  epoch {s.leader_epoch}  "
        f"replicas {list(p.replicas)}  isr {list(s.isr)}"
        + ("  " + ", ".join(marks) if marks else "")
    )
