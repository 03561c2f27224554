"""`mqcore cluster status`: a cluster as its coordination state says it is (issue 33).

    mqcore cluster status --coordinator zk://HOST:PORT/PATH [--under-replicated] [--json]
                          [--timeout S]
    mqcore cluster elect-leaders --coordinator zk://HOST:PORT/PATH [--topic T [--partition P]]
                                 [--json] [--timeout S]
    mqcore cluster create-topic --coordinator zk://HOST:PORT/PATH TOPIC --partitions N
                                --replication-factor R [--config NAME=VALUE ...] [--timeout S]

Shows the controller and its epoch, the live brokers, and every partition's replicas, leader,
leader epoch and in-sync replicas, marking those under-replicated (fewer in-sync replicas than
replicas) and offline (no leader); `--under-replicated` lists only partitions that are either,
as kafka-topics' --under-replicated-partitions does. It reads ZooKeeper and nothing else: no
broker is asked, so it works while brokers are down. Exit status 0 when every partition has
all its replicas in sync and a leader, 3 otherwise, so a script can check the cluster's health.

`elect-leaders` is a preferred-leader election (kafka-leader-election.sh --election-type
PREFERRED): every partition (or the topic's, or one) whose first assigned replica is alive and
in sync but not leading gets it back as leader. The request goes to the controller through
ZooKeeper; the command waits (at most --timeout) until the controller is done, then prints who
leads each partition asked. Exit status 0 when each is led by its preferred replica, 3 when
some could not be (that replica dead or out of sync), naming them.

`create-topic` creates a replicated topic without a broker's help, as kafka-topics.sh
--zookeeper did: it places the replicas over the live brokers (racks apart), writes the topic,
and waits (at most --timeout) for the controller to give each partition its leader, then
prints them. The settings are Kafka's topic config names (retention.ms, min.insync.replicas).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any, TextIO

from mqcore.cli.options import UsageError
from mqcore.config import topic_setting, validate_name
from mqcore.errors import CoordinatorError, InvalidConfigError, UnknownTopicError

UNHEALTHY = 3
POLL = 0.05  # how often elect-leaders looks whether the controller is done


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
    elect = actions.add_parser(
        "elect-leaders",
        help="give partitions back to their preferred replicas (exit 3 if some could not be)",
    )
    elect.add_argument(
        "--coordinator", required=True, metavar="URL", help="zk://HOST:PORT[,HOST:PORT]/PATH"
    )
    elect.add_argument("--topic", help="only this topic's partitions")
    elect.add_argument("--partition", type=int, help="only this partition (needs --topic)")
    elect.add_argument("--json", action="store_true", help="one JSON object")
    elect.add_argument(
        "--timeout", type=float, default=30.0, metavar="S",
        help="seconds to wait for the coordinator and the controller (default 30)",
    )  # fmt: skip
    elect.set_defaults(run=cmd_elect)
    elect.set_defaults(parser=elect)
    create = actions.add_parser(
        "create-topic", help="create a replicated topic; waits for its partitions' leaders"
    )
    create.add_argument(
        "--coordinator", required=True, metavar="URL", help="zk://HOST:PORT[,HOST:PORT]/PATH"
    )
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument("--partitions", type=int, required=True, metavar="N")
    create.add_argument("--replication-factor", type=int, required=True, metavar="R")
    create.add_argument(
        "--config", action="append", default=[], metavar="NAME=VALUE",
        help="a topic setting by Kafka's name (retention.ms=...); repeat for more",
    )  # fmt: skip
    create.add_argument(
        "--timeout", type=float, default=30.0, metavar="S",
        help="seconds to wait for the coordinator and the controller (default 30)",
    )  # fmt: skip
    create.set_defaults(run=cmd_create_topic)
    create.set_defaults(parser=create)


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
            "deleting": view.deleting,
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
    for topic, waiting in view.deleting.items():
        on = f"waiting for brokers {waiting}" if waiting else "being finished by the controller"
        print(f"marked for deletion: {topic} ({on})", file=out)
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


def cmd_create_topic(args: argparse.Namespace, out: TextIO) -> int:
    if args.timeout <= 0:
        raise InvalidConfigError(f"--timeout must be positive: {args.timeout}")
    config = {}
    for item in args.config:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--config takes NAME=VALUE, not {item!r}")
        topic_setting(name, value)  # InvalidConfigError for a name or value mqcore lacks
        config[name] = value
    validate_name(args.topic)
    if args.topic.startswith("__"):
        raise InvalidConfigError(f"{args.topic!r} is an internal name: brokers make those")
    zk = _zk()
    from mqcore.cluster.controller import await_states, write_topic

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    with zk.ZkCoordinator(args.coordinator, connect_timeout=args.timeout) as coordinator:
        placement = write_topic(coordinator, args.topic, args.partitions,
                                args.replication_factor, config)  # fmt: skip
        states = await_states(coordinator, args.topic, placement, args.timeout)
    for p in sorted(placement):
        replicas = ",".join(map(str, placement[p]))
        print(f"{args.topic}-{p}  leader {states[p].leader}  replicas {replicas}", file=out)
    return 0


def cmd_elect(args: argparse.Namespace, out: TextIO) -> int:
    if args.timeout <= 0:
        raise InvalidConfigError(f"--timeout must be positive: {args.timeout}")
    if args.partition is not None and args.topic is None:
        raise UsageError("--partition needs --topic")
    zk = _zk()
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    deadline = time.monotonic() + args.timeout
    with zk.ZkCoordinator(args.coordinator, connect_timeout=args.timeout) as coordinator:
        asked = [
            p for p in coordinator.describe().partitions
            if (args.topic is None or p.topic == args.topic)
            and (args.partition is None or p.partition == args.partition)
        ]  # fmt: skip
        if not asked:
            what = "no partitions" if args.topic is None else f"no partition of {args.topic!r}"
            raise UnknownTopicError(f"{what} to elect leaders for")
        coordinator.request_preferred_election([(p.topic, p.partition) for p in asked])
        while coordinator.pending_preferred_election() is not None:
            if time.monotonic() > deadline:
                raise CoordinatorError(
                    f"the controller did not finish the election within {args.timeout:g} s "
                    "(is a controller running? `mqcore cluster status` names it); the request "
                    "stays and is carried out when one is"
                )
            time.sleep(POLL)
        now = {(p.topic, p.partition): p for p in coordinator.describe().partitions}
    rows = [now.get((p.topic, p.partition), p) for p in asked]
    missed = [p for p in rows if p.state is None or p.state.leader != p.replicas[0]]
    if args.json:
        print(json.dumps({
            "partitions": [{**_partition_json(p), "preferred": p.replicas[0]} for p in rows],
            "not_preferred": [f"{p.topic}-{p.partition}" for p in missed],
        }), file=out)  # fmt: skip
        return UNHEALTHY if missed else 0
    for p in rows:
        print(_partition_line(p), file=out)
    if missed:
        names = ", ".join(f"{p.topic}-{p.partition}" for p in missed)
        print(f"not led by their preferred replica (dead or out of sync): {names}", file=out)
        return UNHEALTHY
    print(f"{len(rows)} partition(s) led by their preferred replica", file=out)
    return 0
