"""`mqcore serve`: the store behind the Kafka protocol until Ctrl-C or SIGTERM (docs/server.md).

The store is opened with the writer lock, so nothing else may write it meanwhile; the reading
commands stay safe beside it, and a `produce` refused the lock is told to produce through this
server (its address is in the lock file: storage/logdir.describe_holder). A path that is not a
store is refused (NotAStoreError, nothing created: `mqcore serve ./lgos` is a typo, not a new
store) unless --create makes one there. One line on stdout says where it listens; a clean stop
exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from mqcore.config import REQUEST_PARTITIONS, TOPIC_PARTITIONS
from mqcore.consume.expiry import OFFSETS_RETENTION_MS
from mqcore.errors import InvalidConfigError, MQCoreError, NotAStoreError

FLUSH_POLICIES = ("always", "interval", "os")
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR}  # fmt: skip


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the store over the Kafka protocol (Kafka clients produce and consume)",
        description="Serve STORE to Kafka clients (any language: librdkafka, the Java client, "
        "kafka-python, kcat) until Ctrl-C or SIGTERM. Alone, one node: the controller, the "
        "group coordinator and the only replica; with --coordinator, a broker of a cluster "
        "(docs/cluster.md). Binds to loopback unless --listen names "
        "another address. Needs the server extra: pip install 'mqcore[server]'.",
    )
    p.add_argument("store", help="store directory (one that is not a store: see --create)")
    p.add_argument(
        "--create", action="store_true",
        help="make a new store at STORE when it is not one (without it, such a path is refused "
        "and nothing is created)",
    )  # fmt: skip
    p.add_argument(
        "--listen", default="127.0.0.1:9092", metavar="HOST:PORT",
        help="Kafka listener (default 127.0.0.1:9092; port 0 picks a free one)",
    )  # fmt: skip
    p.add_argument(
        "--http", metavar="HOST:PORT",
        help="also serve the JSON query API (docs/server.md) and the console (docs/console.md) "
        "there; loopback unless told",
    )  # fmt: skip
    p.add_argument(
        "--advertised-host", metavar="HOST",
        help="the host clients are told to connect to (default: the --listen host)",
    )  # fmt: skip
    p.add_argument(
        "--advertised-port", type=int, metavar="PORT",
        help="the port clients are told to connect to (default: the --listen port)",
    )  # fmt: skip
    p.add_argument(
        "--flush", choices=FLUSH_POLICIES, default="interval",
        help="when appends reach the disk: always (fdatasync before each produce is "
        "acknowledged), interval (every --flush-interval-ms, the default) or os",
    )  # fmt: skip
    p.add_argument("--flush-interval-ms", type=int, default=500, metavar="MS")
    p.add_argument(
        "--partitions", type=int, default=1, metavar="N",
        help="partitions of a topic created by a client's metadata request (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--no-auto-create", action="store_true",
        help="answer UNKNOWN_TOPIC_OR_PARTITION for unknown topics instead of creating them",
    )  # fmt: skip
    clu = p.add_argument_group("cluster (docs/cluster.md): without --coordinator, one node")
    clu.add_argument(
        "--coordinator", metavar="URL",
        help="join the cluster whose state is in ZooKeeper at zk://HOST:PORT[,HOST:PORT]/PATH",
    )  # fmt: skip
    clu.add_argument("--node-id", type=int, default=0, metavar="N",
                     help="this broker's ID in the cluster, unique among its brokers")  # fmt: skip
    clu.add_argument("--rack", metavar="NAME",
                     help="this broker's rack (Kafka's broker.rack): a topic's replicas are "
                     "placed on as many racks as there are")  # fmt: skip
    clu.add_argument(
        "--replication-factor", type=int, default=3, metavar="N",
        help="replicas of a topic created without one (at most the live brokers; default 3)",
    )  # fmt: skip
    clu.add_argument(
        "--zk-session-timeout-ms", type=int, default=18_000, metavar="MS",
        help="how long ZooKeeper waits for a silent broker before its partitions move "
        "(default 18000, Kafka's)",
    )  # fmt: skip
    clu.add_argument(
        "--replica-lag-time-max-ms", type=int, default=30_000, metavar="MS",
        help="a follower not caught up for this long leaves the ISR (default 30000, Kafka's)",
    )  # fmt: skip
    clu.add_argument(
        "--unclean-leader-election", action="store_true",
        help="let a replica out of the ISR lead when no in-sync one is alive (loses "
        "acknowledged writes; off by default, as Kafka)",
    )  # fmt: skip
    sec = p.add_argument_group('security (docs/server.md "Security")')
    sec.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (chain)")
    sec.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    sec.add_argument("--tls-ca", metavar="PEM", help="require client certificates from this CA")
    sec.add_argument(
        "--sasl-credentials", metavar="FILE",
        help="require SASL (PLAIN, SCRAM-SHA-256) with the users of this file "
        "(mqcore server-user add)",
    )  # fmt: skip
    sec.add_argument(
        "--sasl-mechanisms", metavar="M,M", default="SCRAM-SHA-256,PLAIN",
        help="the mechanisms offered (default SCRAM-SHA-256,PLAIN)",
    )  # fmt: skip
    sec.add_argument("--acl", metavar="FILE", help="per-user topic permissions (needs SASL)")
    p.add_argument(
        "--log-level", choices=list(LOG_LEVELS), default="warning",
        help="what the server logs on stderr (default warning: refused requests, logins and "
        "connections, once a minute each, and errors; info adds starts and stops, debug every "
        "closed connection)",
    )  # fmt: skip
    add_store_limits(p)
    add_network_limits(p)
    p.set_defaults(run=cmd_serve)


def add_network_limits(p: Any) -> None:
    """The bounds on what clients may hold (docs/server.md "Limits and bad input")."""
    from mqcore.server import defaults as d  # no kio: the help needs no server extra

    net = p.add_argument_group('network limits (docs/server.md "Limits and bad input")')
    for flag, default, meta, what in (
        ("--max-connections", d.MAX_CONNECTIONS, "N", "connections open at once (cut to "
         "what the open-files limit leaves the store)"),
        ("--max-connections-per-ip", d.MAX_CONNECTIONS_PER_IP, "N",
         "connections from one address"),
        ("--max-request-bytes", d.MAX_REQUEST_BYTES, "BYTES", "the largest request"),
        ("--max-unauthenticated-request-bytes", d.MAX_UNAUTHENTICATED_REQUEST_BYTES,
         "BYTES", "the largest request before SASL authentication"),
        ("--max-queued-request-bytes", d.MAX_QUEUED_REQUEST_BYTES, "BYTES",
         "what every connection's partial and pending requests may hold together"),
        ("--io-threads", d.IO_THREADS, "N", "request threads"),
        ("--controller-mutation-rate", d.MUTATION_RATE, "N",
         "partitions one principal may create per second (KIP-599)"),
    ):  # fmt: skip
        kind = float if isinstance(default, float) else int
        net.add_argument(flag, type=kind, default=default, metavar=meta,
                         help=f"{what} (default {default:,})")  # fmt: skip
    for flag, default, what in (
        ("--idle-timeout", d.IDLE_TIMEOUT, "a connection silent between requests this long "
         "is closed"),
        ("--request-timeout", d.REQUEST_TIMEOUT, "a request (or the TLS handshake, or SASL "
         "authentication) must arrive whole within this"),
        ("--group-consumer-session-timeout", d.CONSUMER_SESSION_TIMEOUT, "a KIP-848 consumer "
         "(group.protocol=consumer) silent this long leaves its group"),
        ("--group-consumer-heartbeat-interval", d.CONSUMER_HEARTBEAT_INTERVAL, "how often such a "
         "consumer is told to heartbeat"),
    ):  # fmt: skip
        net.add_argument(flag, type=float, default=default, metavar="SECONDS",
                         help=f"{what} (default {default:g})")  # fmt: skip
    for flag, default, meta, what in (
        ("--http-max-connections", d.HTTP_MAX_CONNECTIONS, "N", "HTTP connections open at once"),
        ("--http-max-connections-per-ip", d.HTTP_MAX_CONNECTIONS_PER_IP, "N",
         "HTTP connections from one address"),
        ("--http-request-timeout", d.HTTP_REQUEST_TIMEOUT, "SECONDS",
         "an HTTP request's headers and body must arrive within this"),
        ("--http-idle-timeout", d.HTTP_IDLE_TIMEOUT, "SECONDS",
         "an HTTP connection silent this long is closed"),
    ):  # fmt: skip
        kind = float if isinstance(default, float) else int
        net.add_argument(flag, type=kind, default=default, metavar=meta,
                         help=f"{what} (default {default:g})")  # fmt: skip
    net.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="a name browsers reach --http by besides its address (repeat for more); a "
        "request naming any other Host is refused, against DNS rebinding",
    )  # fmt: skip


def network_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The Server keywords of add_network_limits' flags."""
    return {
        "max_connections": args.max_connections,
        "max_connections_per_ip": args.max_connections_per_ip,
        "max_request_bytes": args.max_request_bytes,
        "max_unauthenticated_request_bytes": args.max_unauthenticated_request_bytes,
        "max_queued_request_bytes": args.max_queued_request_bytes,
        "io_threads": args.io_threads,
        "controller_mutation_rate": args.controller_mutation_rate,
        "idle_timeout": args.idle_timeout,
        "request_timeout": args.request_timeout,
        "group_consumer_session_timeout": args.group_consumer_session_timeout,
        "group_consumer_heartbeat_interval": args.group_consumer_heartbeat_interval,
        "http_allowed_hosts": tuple(args.allowed_host),
        "http_max_connections": args.http_max_connections,
        "http_max_connections_per_ip": args.http_max_connections_per_ip,
        "http_request_timeout": args.http_request_timeout,
        "http_idle_timeout": args.http_idle_timeout,
    }


def add_store_limits(p: Any) -> None:
    """The store's bounds on partitions and its group expiry (docs/operations.md "Limits")."""
    lim = p.add_argument_group('store limits (docs/operations.md "Limits")')
    lim.add_argument(
        "--max-partitions", type=int, metavar="N",
        help="partitions the store may hold (default: half the open-files limit, at most 10000)",
    )  # fmt: skip
    lim.add_argument(
        "--max-partitions-per-topic", type=int, default=TOPIC_PARTITIONS, metavar="N",
        help=f"partitions one topic may have (default {TOPIC_PARTITIONS})",
    )  # fmt: skip
    lim.add_argument(
        "--max-partitions-per-request", type=int, default=REQUEST_PARTITIONS, metavar="N",
        help=f"partitions one request may create (default {REQUEST_PARTITIONS}, as Kafka)",
    )  # fmt: skip
    lim.add_argument(
        "--offsets-retention-minutes", type=int, default=OFFSETS_RETENTION_MS // 60_000,
        metavar="MIN",
        help="delete the offsets of a consumer group left without members and commits this "
        "long (default 10080, 7 days, as Kafka; -1 keeps them)",
    )  # fmt: skip


def store_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The store options of add_store_limits' flags."""
    minutes = args.offsets_retention_minutes
    return {
        "max_partitions": args.max_partitions,
        "max_partitions_per_topic": args.max_partitions_per_topic,
        "max_partitions_per_request": args.max_partitions_per_request,
        "offsets_retention_ms": -1 if minutes == -1 else minutes * 60_000,
    }


SWITCH_INTERVAL = 0.0005  # seconds; CPython's default is 0.005


def cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Server options of the cluster flags (none without --coordinator)."""
    if args.coordinator is None:
        return {"node_id": args.node_id}
    return {
        "node_id": args.node_id,
        "coordinator": args.coordinator,
        "default_replication_factor": args.replication_factor,
        "zk_session_timeout_ms": args.zk_session_timeout_ms,
        "replica_lag_time_max_ms": args.replica_lag_time_max_ms,
        "unclean_leader_election": args.unclean_leader_election,
        "rack": args.rack,
    }


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from mqcore.server import Server
    except ImportError as e:
        raise MQCoreError(
            f"mqcore serve needs the server extra ({e.name} is missing): "
            "pip install 'mqcore[server]' (Python 3.11+)"
        ) from None
    if args.partitions < 1:
        raise InvalidConfigError(f"--partitions must be >= 1, not {args.partitions}")
    # the server's threads hand each request on (network, request threads, purgatory, a
    # cluster's fetchers): a thread woken by another waits for the GIL up to the switch
    # interval, 5 ms by default, at each hand-off. 0.5 ms cut a replicated acks=all round trip
    # by a fifth (bench/README.md "Cluster"); this process is the server's alone
    sys.setswitchinterval(SWITCH_INTERVAL)
    # the server's log (refused versions, logins and connections, errors) on stderr, one line
    # each, from the start: the Server's own checks warn too (PLAIN without TLS)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("mqcore: %(levelname)s: %(message)s"))
    logging.getLogger("mqcore").addHandler(handler)
    logging.getLogger("mqcore").setLevel(LOG_LEVELS[args.log_level])
    # kazoo (ZooKeeper's client) logs each failed reconnect; the coordinator logs the
    # session's changes once each instead (cluster.zk), and kazoo's errors come out as ours
    kazoo = logging.getLogger("kazoo")
    kazoo.addHandler(handler)
    kazoo.setLevel(logging.ERROR)
    kazoo.propagate = False
    server = Server(
        args.store, args.listen, advertised_host=args.advertised_host,
        advertised_port=args.advertised_port,
        auto_create_topics=not args.no_auto_create, default_partitions=args.partitions,
        flush=args.flush, flush_interval_ms=args.flush_interval_ms, http=args.http,
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
        sasl_credentials=args.sasl_credentials,
        sasl_mechanisms=tuple(m.strip() for m in args.sasl_mechanisms.split(",") if m.strip()),
        acl=args.acl, create=args.create, **store_limits(args), **network_limits(args),
        **cluster_options(args),
    )  # fmt: skip
    with stop_signals() as stop, _started(server, args):
        print(f"mqcore: serving {args.store} to Kafka clients on {server.bootstrap}", file=out)
        if server.http_server is not None:
            url = server.http_server.url
            print(f"mqcore: HTTP query API on {url} (console: {url}/ui/)", file=out)
        out.flush()
        wait_for_stop(stop, server)
    if server.failure is not None:
        raise MQCoreError(f"mqcore serve stopped: {server.failure}")
    print("mqcore: stopped", file=out)
    return 0


@contextlib.contextmanager
def _started(server: Any, args: argparse.Namespace) -> Iterator[Any]:
    """`with server`, a path that is not a store refused saying how to make one there."""
    try:
        server.start()
    except NotAStoreError as e:
        raise NotAStoreError(f"{e} (pass --create to make a new store there)") from None
    with server:
        yield server


@contextlib.contextmanager
def stop_signals() -> Iterator[threading.Event]:
    """An event SIGTERM sets while the block runs (a service manager's stop)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for_stop(stop: threading.Event, server: Any = None) -> None:
    """Until SIGTERM (`stop`), Ctrl-C, or `server` (a Server) stopping on its own."""
    try:
        while not stop.wait(0.5):
            if server is not None and not server.serving:
                return
    except KeyboardInterrupt:
        pass
