"""`mqcore serve`: a store behind the Kafka protocol, for clients in any language.

Kafka's broker's shape: one network thread reads and writes every connection
(server/network.py), a pool of `io_threads` request threads answers the requests, and requests
that wait (a Fetch for min_bytes, a JoinGroup or SyncGroup for the rebalance) wait in the
purgatory (server/delayed.py) without a thread. A connection is muted from the moment its
request is read until its response is written, so its responses go out in the order of its
requests (Kafka's rule, which clients with several requests in flight rely on). The store's
own calls release the GIL where they wait (fdatasync, file reads).

Limits, each a keyword of Server (docs/server.md "Limits and bad input"): `max_connections`
and `max_connections_per_ip` (refused at accept: the socket is closed), `max_request_bytes`
(a frame announcing more is refused from its 4-byte size, before its body is read or
allocated: the connection closes), `max_unauthenticated_request_bytes` (the same, before SASL
authentication), `max_queued_request_bytes` (what every connection's partial and pending
requests may hold together), `idle_timeout` (a connection silent between requests is closed),
`request_timeout` (a request, or the TLS handshake, that has not wholly arrived this long after
its first byte is dropped with its connection; with SASL, a connection not authenticated this
long after it opened is closed). A frame that does not parse closes that connection only; the
server goes on serving the others.

Security (server.auth, docs/server.md "Security"): `tls_cert`/`tls_key` (and `tls_ca` to
require client certificates) make every connection TLS, its handshake done by the network
thread without blocking, under `request_timeout`. `sasl_credentials` turns SASL on: until a
connection has authenticated, only ApiVersions, SaslHandshake and SaslAuthenticate are
answered and anything else closes it. `acl` (with SASL) names the ACL file the broker checks
each topic and group operation against.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import logging
import os
import queue
import socket
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from mqcore.errors import (
    AuthenticationError,
    InvalidConfigError,
    MQCoreError,
    ProtocolError,
    UnsupportedVersionError,
)
from mqcore.server import bounds, httplimits, legacy, quota
from mqcore.server.address import parse_listen
from mqcore.server.auth import (
    MECHANISMS,
    PLAIN,
    Authorizer,
    Sasl,
    sasl_not_enabled,
    tls_context,
)
from mqcore.server.broker import Broker
from mqcore.server.common import CloseConnection
from mqcore.server.defaults import (
    CONSUMER_HEARTBEAT_INTERVAL,
    CONSUMER_SESSION_TIMEOUT,
    DEFAULT_PORT,
    IDLE_TIMEOUT,
    IO_THREADS,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_IP,
    MAX_QUEUED_REQUEST_BYTES,
    MAX_REQUEST_BYTES,
    MAX_UNAUTHENTICATED_REQUEST_BYTES,
    MUTATION_BURST,
    MUTATION_RATE,
    REQUEST_TIMEOUT,
)
from mqcore.server.delayed import NOT_YET, Delayed
from mqcore.server.fetchwire import FetchAnswer, FetchFrame, encode_fetch
from mqcore.server.groups import INITIAL_REBALANCE_DELAY
from mqcore.server.network import (
    NEED_MEMORY,
    WOULD_BLOCK,
    Connection,
    Limits,
    Network,
    PeerClosed,
)
from mqcore.server.producewire import ProduceAnswer, encode_produce
from mqcore.server.protocol import (
    API_VERSIONS,
    CONNECTION_APIS,
    Request,
    encode_response,
    frame_size,
    parse_request,
    peek_client_id,
    peek_header,
    unsupported_versions_response,
)
from mqcore.server.ratelog import RateLimitedLog
from mqcore.storage import durable, logdir
from mqcore.store import Store

if TYPE_CHECKING:
    from mqcore.cluster.replicas import ReplicaManager
    from mqcore.cluster.zk import ZkCoordinator
    from mqcore.server.http import HttpServer

log = logging.getLogger("mqcore.server")
refusals = RateLimitedLog(log)  # refused versions and logins: warnings, once a minute each

WATCH_INTERVAL = 0.5  # seconds between two looks at the store's health
HOT_REQUESTS = 16  # requests of one connection a request thread answers in a row at most
# a cluster's acks=all produces of one connection appended while the earlier ones wait for
# their replicas (librdkafka's max.in.flight for an idempotent producer)
PIPELINE = 5
PRODUCE = 0
CLUSTER_FILE = "mqcore-cluster-id"
_Failure = (OSError, ProtocolError, AuthenticationError, CloseConnection, PeerClosed, ssl.SSLError)


class Server:
    """The Kafka protocol over one store. `store` is an open Store (the server uses it, and
    leaves it open at stop) or a path (the server opens it with `store_options` and closes it
    at stop). Binds to loopback unless `listen` names another address. `http` ("HOST:PORT")
    also serves the JSON query API there (server/http.py; `http_server.url`), answering
    requests whose Host names the listen address, localhost on loopback, or one of
    `http_allowed_hosts` (the names clients browse it by: DNS rebinding is refused), bounded by
    `http_max_connections`, `http_max_connections_per_ip`, `http_request_timeout` and
    `http_idle_timeout` (HttpServer's limits, docs/server.md "HTTP query API"). Use as a
    context manager, or start() and stop()."""

    def __init__(
        self,
        store: Store | str | os.PathLike[str],
        listen: str = f"127.0.0.1:{DEFAULT_PORT}",
        *,
        advertised_host: str | None = None,
        advertised_port: int | None = None,
        node_id: int = 0,
        auto_create_topics: bool = True,
        default_partitions: int = 1,
        max_connections: int = MAX_CONNECTIONS,
        max_connections_per_ip: int = MAX_CONNECTIONS_PER_IP,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_unauthenticated_request_bytes: int = MAX_UNAUTHENTICATED_REQUEST_BYTES,
        max_queued_request_bytes: int = MAX_QUEUED_REQUEST_BYTES,
        idle_timeout: float = IDLE_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
        io_threads: int = IO_THREADS,
        controller_mutation_rate: float = MUTATION_RATE,
        controller_mutation_burst: int = MUTATION_BURST,
        group_initial_rebalance_delay: float = INITIAL_REBALANCE_DELAY,
        group_consumer_session_timeout: float = CONSUMER_SESSION_TIMEOUT,
        group_consumer_heartbeat_interval: float = CONSUMER_HEARTBEAT_INTERVAL,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        sasl_credentials: str | os.PathLike[str] | None = None,
        sasl_mechanisms: tuple[str, ...] = MECHANISMS,
        acl: str | os.PathLike[str] | None = None,
        http: str | None = None,
        http_allowed_hosts: tuple[str, ...] = (),
        http_max_connections: int = httplimits.MAX_CONNECTIONS,
        http_max_connections_per_ip: int = httplimits.MAX_CONNECTIONS_PER_IP,
        http_request_timeout: float = httplimits.REQUEST_TIMEOUT,
        http_idle_timeout: float = httplimits.IDLE_TIMEOUT,
        coordinator: str | None = None,
        zk_session_timeout_ms: int = 18_000,
        replica_lag_time_max_ms: int = 30_000,
        default_replication_factor: int = 3,
        unclean_leader_election: bool = False,
        rack: str | None = None,
        **store_options: Any,
    ):
        self.host, self.port = parse_listen(listen)
        # security: read (and refused when wrong) here, before a store is opened
        if tls_cert is None and (tls_key is not None or tls_ca is not None):
            raise InvalidConfigError("tls_key and tls_ca need tls_cert")
        if acl is not None and sasl_credentials is None:
            raise InvalidConfigError("an ACL file needs SASL (sasl_credentials): it names users")
        self.tls: ssl.SSLContext | None = (
            tls_context(os.fspath(tls_cert), _path(tls_key), _path(tls_ca))
            if tls_cert is not None
            else None
        )
        # one login backoff for the Kafka listener's SASL and the HTTP server's Basic logins
        self.sasl = Sasl(sasl_credentials, sasl_mechanisms) if sasl_credentials else None
        self.authorizer = Authorizer.load(acl) if acl is not None else None
        if self.sasl is not None and self.tls is None and PLAIN in self.sasl.mechanisms:
            log.warning("SASL/PLAIN without TLS: passwords cross the network in clear text")
        self.advertised_host = advertised_host
        # what Metadata names as this broker's port (a proxy or NAT in front of it); None: the
        # port listened on
        self.advertised_port = advertised_port
        self.node_id = node_id
        # -- a broker of a cluster (docs/cluster.md): `coordinator` is zk://HOST:PORT/PATH --
        if coordinator is not None:
            if self.tls is not None or self.sasl is not None:
                raise InvalidConfigError(
                    "a cluster's brokers replicate over plaintext, unauthenticated Kafka "
                    "connections for now: TLS, SASL and ACLs are not served with --coordinator "
                    "(docs/cluster.md, known gaps)"
                )
            if node_id < 0:
                raise InvalidConfigError(f"node ID {node_id} must be >= 0")
            bounds.check_counts(default_replication_factor=default_replication_factor)
        self.coordinator_url = coordinator
        self.zk_session_timeout_ms = zk_session_timeout_ms
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.default_replication_factor = default_replication_factor
        self.unclean_leader_election = unclean_leader_election
        if rack is not None and not rack.strip():
            raise InvalidConfigError("a broker's rack must be a non-empty name")
        self.rack = rack  # Kafka's broker.rack: replicas are placed racks apart
        self.replicas: ReplicaManager | None = None
        self._coordinator: ZkCoordinator | None = None
        self.auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        bounds.check_counts(
            max_connections=max_connections, max_connections_per_ip=max_connections_per_ip,
            io_threads=io_threads, max_request_bytes=max_request_bytes,
            max_unauthenticated_request_bytes=max_unauthenticated_request_bytes,
        )  # fmt: skip
        bounds.check_seconds(idle_timeout=idle_timeout, request_timeout=request_timeout)
        if max_queued_request_bytes < max_request_bytes:
            raise InvalidConfigError(
                f"max_queued_request_bytes={max_queued_request_bytes} is below "
                f"max_request_bytes={max_request_bytes}: the largest request could never be read"
            )
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip
        self.max_request_bytes = max_request_bytes
        self.max_unauthenticated_request_bytes = max_unauthenticated_request_bytes
        self.max_queued_request_bytes = max_queued_request_bytes
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.io_threads = io_threads
        # KIP-599: partitions one principal may create per second (server/quota.py)
        self.mutation_quota = quota.MutationQuota(controller_mutation_rate,
                                                  controller_mutation_burst)  # fmt: skip
        self.group_initial_rebalance_delay = group_initial_rebalance_delay
        bounds.check_seconds(
            group_consumer_session_timeout=group_consumer_session_timeout,
            group_consumer_heartbeat_interval=group_consumer_heartbeat_interval,
        )
        self.group_consumer = (group_consumer_session_timeout, group_consumer_heartbeat_interval)
        self._store_arg = store
        self._store_options = store_options
        self.store: Store | None = None
        self.broker: Broker | None = None
        self._owns_store = False
        self._sock: socket.socket | None = None
        self._network: Network | None = None
        self._threads: RequestThreads | None = None
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        # what stopped the server on its own (the store failed: its background tasks or its
        # flusher ended); None while it serves or after a stop() asked for
        self.failure: BaseException | None = None
        # -- HTTP query API (server/http.py): "HOST:PORT" or None --
        if http is not None:
            http_host, _ = parse_listen(http)  # a bad address is refused here, as `listen` is
            if self.sasl is not None:  # Basic passwords: over TLS or on loopback only
                from mqcore.server.httpauth import check_transport

                check_transport(http_host, self.tls is not None)
        self._tls_cert = _path(tls_cert)
        self._tls_key = _path(tls_key)
        self.http = http
        self.http_allowed_hosts = tuple(http_allowed_hosts)
        self.http_limits = httplimits.HttpLimits(
            http_max_connections, http_max_connections_per_ip, http_request_timeout,
            http_idle_timeout, named="http_",
        )  # fmt: skip
        self.http_server: HttpServer | None = None

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> Server:
        """Open the store (when given a path), bind, listen, and serve in background threads."""
        if self._sock is not None:
            return self
        bounds.raise_open_files_limit()  # before the store: its partition bound follows it
        if isinstance(self._store_arg, Store):
            self.store = self._store_arg
        else:
            import mqcore

            self.store = mqcore.open(os.fspath(self._store_arg), **self._store_options)
            self._owns_store = True
        try:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(512)
        except OSError as e:
            if self._owns_store:
                self.store.close()
            raise OSError(e.errno, f"cannot listen on {self.host}:{self.port}: {e.strerror}") from e
        self._sock = sock
        self.port = sock.getsockname()[1]
        logdir.describe_holder(self.store.path, f"mqcore serve on {self.bootstrap}")  # lock errors
        self._stopping.clear()
        self._threads = RequestThreads(self.io_threads)
        cluster_name = cluster_id(self.store.path)
        if self.coordinator_url is not None:
            try:
                self._join_cluster()
            except BaseException:
                sock.close()
                self._sock = None
                if self._owns_store:
                    self.store.close()
                raise
            assert self._coordinator is not None
            cluster_name = self._coordinator.cluster_id(cluster_name)
        self.broker = Broker(
            self.store, self.advertised_host or self.host, self.advertised_port or self.port,
            node_id=self.node_id,
            cluster_id=cluster_name, auto_create_topics=self.auto_create_topics,
            default_partitions=self.default_partitions, authorizer=self.authorizer,
            group_initial_rebalance_delay=self.group_initial_rebalance_delay,
            group_consumer_session_timeout=self.group_consumer[0],
            group_consumer_heartbeat_interval=self.group_consumer[1],
            execute=self._threads.submit, quota=self.mutation_quota, cluster=self.replicas,
            default_replication_factor=self.default_replication_factor,
        )  # fmt: skip
        http_connections, kafka_connections = bounds.split_room(
            self.store.log.limits.store_bound(),
            self.http_limits.max_connections if self.http is not None else None,
            self.max_connections,
        )
        limits = Limits(
            max_connections=kafka_connections,
            max_connections_per_ip=self.max_connections_per_ip,
            max_request_bytes=self.max_request_bytes,
            max_unauthenticated_request_bytes=self.max_unauthenticated_request_bytes,
            idle_timeout=self.idle_timeout,
            request_timeout=self.request_timeout,
            sasl=self.sasl is not None,
        )
        self._network = Network(
            sock, limits, self._dispatch, tls=self.tls,
            max_queued_request_bytes=self.max_queued_request_bytes,
        )  # fmt: skip
        self._network.start()
        self.failure = None
        self._watchdog = threading.Thread(target=self._watch, name="mqcore-watchdog", daemon=True)
        self._watchdog.start()
        log.info("serving %s on %s:%d", self.store.path, self.host, self.port)
        # -- HTTP query API: after the Kafka listener, before the broker registers (its
        # registration names it); a failure to bind stops the listener too --
        if self.http is not None:
            from mqcore.server.clusterread import LeaderView
            from mqcore.server.http import HttpServer, create_app  # starlette, uvicorn: only here
            from mqcore.server.httpauth import HttpAuth

            try:
                auth = None
                if self.sasl is not None:  # the same users (and ACLs) over HTTP Basic
                    auth = HttpAuth(self.sasl, self.authorizer, backoff=self.sasl.backoff)
                self.http_server = HttpServer(
                    create_app(self.store, auth=auth, group_members=self.broker.groups.member_list,
                               allowed_hosts=self._http_names(),
                               replicas=self._replica_view if self.replicas else None,
                               cluster=None if self.replicas is None
                               else LeaderView(self.store, self.replicas)),
                    self.http, tls_cert=self._tls_cert,
                    tls_key=self._tls_key,
                    max_connections=http_connections,
                    max_connections_per_ip=self.http_limits.max_connections_per_ip,
                    request_timeout=self.http_limits.request_timeout,
                    idle_timeout=self.http_limits.idle_timeout,
                ).start()  # fmt: skip
            except BaseException:
                self.stop()
                raise
        # -- end HTTP query API --
        if self.replicas is not None:  # registered once it answers: the others may fetch
            if self.http_server is not None:
                self.replicas.info = dataclasses.replace(
                    self.replicas.info, http=self._advertised_url(self.http_server.url)
                )
            try:
                self.replicas.start()
            except BaseException:
                self.stop()
                raise
        return self

    def _http_names(self) -> tuple[str, ...]:
        """The names the HTTP API answers to besides its own address: those given, and the
        advertised host (how the other brokers of a cluster reach it when it forwards)."""
        names = self.http_allowed_hosts
        if self.advertised_host is not None and self.advertised_host not in names:
            names = (*names, self.advertised_host)
        return names

    def _advertised_url(self, url: str) -> str:
        """The HTTP API's URL as the other brokers reach it: the advertised host in place of
        a wildcard or loopback bind when one is given."""
        parts = urllib.parse.urlsplit(url)
        host = self.advertised_host or parts.hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"{parts.scheme}://{host}:{parts.port}"

    def _replica_view(self, topic: str) -> dict[int, dict[str, Any]]:
        """What the HTTP API and the console show of a topic's partitions on a cluster: each
        one's leader, leader epoch, replicas, in-sync replicas, and this broker's high
        watermark of those it holds."""
        assert self.replicas is not None and self.store is not None
        out: dict[int, dict[str, Any]] = {}
        try:
            partitions = self.replicas.partitions(topic)
        except MQCoreError:
            return out
        for p, meta in partitions.items():
            state = meta.state
            out[p] = {
                "leader": state.leader if state is not None else -1,
                "leader_epoch": state.leader_epoch if state is not None else -1,
                "replicas": list(meta.replicas),
                "isr": list(state.isr) if state is not None else [],
            }
            if self.node_id in meta.replicas and self.store.log.has_topic(topic):
                out[p]["high_watermark"] = self.store.log.replica(topic, p).high_watermark
        return out

    def _join_cluster(self) -> None:
        """Connect to the coordinator and make this broker's ReplicaManager (started once
        the listener answers)."""
        from mqcore.cluster.replicas import ReplicaManager
        from mqcore.cluster.zk import BrokerInfo, ZkCoordinator
        from mqcore.server.interbroker import WireLeaderClient

        assert self.coordinator_url is not None and self.store is not None
        coordinator = ZkCoordinator(
            self.coordinator_url, session_timeout_ms=self.zk_session_timeout_ms
        ).start()
        node_id = self.node_id
        info = BrokerInfo(
            node_id,
            self.advertised_host or self.host,
            self.advertised_port or self.port,
            self.rack,
        )
        try:
            self.replicas = ReplicaManager(
                self.store, coordinator, info,
                lambda broker: WireLeaderClient(broker, f"mqcore-replica-{node_id}"),
                replica_lag_time_max_ms=self.replica_lag_time_max_ms,
                unclean_leader_election=self.unclean_leader_election,
            )  # fmt: skip
        except BaseException:
            coordinator.close()
            raise
        self._coordinator = coordinator

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) listened on (the port chosen when listen asked for port 0)."""
        return self.host, self.port

    @property
    def bootstrap(self) -> str:
        """HOST:PORT as clients' bootstrap.servers takes it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def serving(self) -> bool:
        """Started, and not stopped (by stop() or by a failed store: `failure`)."""
        return self._sock is not None and not self._stopping.is_set()

    def _watch(self) -> None:
        """Stop the server when its store fails (its background tasks or its flusher ended:
        every request would fail): a server that cannot serve says so and stops, rather
        than answer KAFKA_STORAGE_ERROR to everything."""
        assert self.store is not None
        while not self._stopping.wait(WATCH_INTERVAL):
            try:
                self.store.log.check_open()
            except (MQCoreError, OSError) as e:
                log.error("stopping: the store failed: %s", e)
                self.failure = e
                self.stop()
                return

    def stop(self) -> None:
        """Stop accepting, close every connection (requests in progress finish first, waiting
        fetches return at once), and close the store if the server opened it."""
        with self._stop_lock:
            self._stop()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()

    def _stop(self) -> None:
        if self._sock is None:
            return
        # -- HTTP query API: stopped first, while the store is still open --
        if self.http_server is not None:
            self.http_server.stop()
            self.http_server = None
        # -- end HTTP query API --
        self._stopping.set()
        assert self.broker is not None and self.store is not None
        assert self._network is not None and self._threads is not None
        # waiting fetches, joins and syncs answer now, on the request threads, which then
        # finish what they are doing; the network writes out what is queued and closes
        if self.replicas is not None:
            self.replicas.stop()
        if self._coordinator is not None:  # the registration ends: the controller moves on
            self._coordinator.close()
        self.broker.close()
        self._threads.stop()
        self._network.stop()
        self._sock.close()
        self._sock = None
        if self._owns_store:
            with contextlib.suppress(MQCoreError, OSError):  # a failed store: said already
                self.store.close()
        log.info("stopped serving %s", self.store.path)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def connection_count(self) -> int:
        """Connections open now."""
        return self._network.connection_count() if self._network is not None else 0

    def network_stats(self) -> dict[str, int]:
        """Connections open (and allowed), request-buffer bytes they hold, connections waiting
        for memory, the most from one address, and the requests waiting in the purgatory;
        with `http`, the HTTP listener's connections as http_*."""
        if self._network is None or self.broker is None:
            return {}
        stats = {**self._network.stats(), "waiting_requests": len(self.broker.purgatory)}
        if self.http_server is not None:  # the HTTP listener's, prefixed
            stats.update({f"http_{k}": v for k, v in self.http_server.stats().items()})
        return stats

    # -- requests (on the request threads) -----------------------------------------------------

    def _dispatch(self, conn: Connection, frame: memoryview) -> None:
        """A whole request arrived (network thread): answer it on a request thread."""
        assert self._threads is not None
        self._threads.submit(functools.partial(self._serve, conn, frame))

    def _serve(self, conn: Connection, frame: memoryview | bytes) -> None:
        """Answer `frame`, then the connection's next requests while they are already in
        (HOT_REQUESTS at most in a row, then its turn goes to the back of the queue)."""
        try:
            for _ in range(HOT_REQUESTS):
                response = self._respond(conn, frame)
                if isinstance(response, _Waiting):
                    assert self.broker is not None
                    if response.request.api.key == PRODUCE:
                        self._pipeline(conn, response)
                        return
                    done = functools.partial(self._delayed_done, conn, response.request)
                    self.broker.purgatory.add(response.delayed, done)
                    return
                got = self._send_and_read(conn, response)
                if got is None:
                    return
                frame = got
            assert self._threads is not None
            self._threads.submit(functools.partial(self._serve, conn, frame))
        except _Failure as e:
            self._close(conn, e)
        except Exception as e:  # a bug: this connection ends, the server serves the others
            self._close(conn, e, unexpected=True)

    def _pipeline(self, conn: Connection, first: _Waiting) -> None:
        """A produce waiting for its replicas (acks=all on a cluster): the connection's next
        produces already in are appended meanwhile (PIPELINE at most), so their replication
        overlaps, and all are answered in request order once each is replicated. Appends stay
        in request order: each is made before the next request is read. A request of another
        kind read on the way waits, unanswered, until they are (responses leave in order)."""
        assert self.broker is not None and self._network is not None
        # each a Request waiting (answered by the purgatory), or a response ready (None: none)
        chain: list[Any] = [first.request]
        waits = [first.delayed]
        pending: memoryview | None = None
        network = self._network
        while len(chain) < PIPELINE and isinstance(chain[-1], Request):
            got = conn.try_read(network.limits, network.pool, time.monotonic())
            if got is WOULD_BLOCK or got is NEED_MEMORY:
                break  # _send_and_read reads on once the chain is answered
            if peek_header(got)[0] != PRODUCE:
                pending = got  # its turn comes after the chain's answers
                break
            response = self._respond(conn, got)
            if isinstance(response, _Waiting):
                chain.append(response.request)
                waits.append(response.delayed)
            else:
                chain.append(response)
        done = functools.partial(self._chain_done, conn, chain, pending)
        self.broker.purgatory.add(_all_of(waits), done)

    def _chain_done(
        self,
        conn: Connection,
        chain: list[Any],
        pending: memoryview | None,
        bodies: Any,
        error: BaseException | None,
    ) -> None:
        """The answers of requests that waited (a pipelined chain, or one request), queued in
        request order and sent; then the request read meanwhile, or the next one (on a
        request thread)."""
        try:
            if error is not None:
                raise error
            answers = iter(bodies)
            for item in chain:
                frame = (response_frame(item, next(answers))
                         if isinstance(item, Request) else item)  # fmt: skip
                if frame is not None:
                    conn.queue(frame)
            if pending is not None:
                conn.try_send(time.monotonic())  # what the socket takes now; the rest after
                self._serve(conn, pending)
                return
            got = self._send_and_read(conn, None)
            if got is not None:
                self._serve(conn, got)
        except _Failure as e:
            self._close(conn, e)
        except Exception as e:
            self._close(conn, e, unexpected=True)

    def _delayed_done(
        self, conn: Connection, request: Request, body: Any, error: BaseException | None
    ) -> None:
        """A waiting request's answer (on a request thread): send it and serve on."""
        self._chain_done(conn, [request], None, [body], error)

    def _send_and_read(
        self, conn: Connection, response: bytes | FetchFrame | None
    ) -> memoryview | None:
        """Queue `response` and write it; then the next request if it is already in whole.
        None when the connection went back to the network thread (or closed)."""
        assert self._network is not None
        network = self._network
        if response is not None:
            conn.queue(response)
        if not conn.try_send(time.monotonic()):
            network.resume(conn)  # the network thread writes the rest
            return None
        if conn.close_after:
            raise CloseConnection("closed after the response, as the protocol says")
        if self._stopping.is_set():
            return None
        got = conn.try_read(network.limits, network.pool, time.monotonic())
        if got is WOULD_BLOCK:
            conn.release_buffer(network.pool)
            network.resume(conn)
            return None
        if got is NEED_MEMORY:
            network.wait_for_memory(conn)
            return None
        return got

    def _close(self, conn: Connection, e: BaseException, unexpected: bool = False) -> None:
        if unexpected:
            log.error("closing %s after an unexpected %s: %s", conn.peer, type(e).__name__, e)
            log.debug("the unexpected error's traceback", exc_info=e)
        elif isinstance(e, UnsupportedVersionError):  # what an operator must see, once a minute
            refusals.warning(
                (conn.ip, "version", e.api_key, e.api_version),
                "closing %s (client %s): %s",
                conn.peer,
                conn.session.client_id,
                e,
            )
        elif isinstance(e, AuthenticationError):  # a v0 handshake's bare token refused
            refusals.warning((conn.ip, "login"), "login refused from %s: %s", conn.peer, e)
        else:
            log.debug("closing %s: %s", conn.peer, e)
        assert self._network is not None
        self._network.close(conn)

    def _respond(self, conn: Connection, frame: memoryview | bytes) -> Any:
        """The response frame to one request (None: none), or _Waiting."""
        sasl, session = conn.sasl, conn.session
        if sasl.raw_tokens and sasl.principal is None:  # after SaslHandshake v0
            assert self.sasl is not None
            reply = self.sasl.raw_token(bytes(frame), sasl)
            session.principal = sasl.principal or session.principal
            return frame_size(len(reply)) + reply
        response = self._answer(frame, conn)
        if sasl.failed:
            refusals.warning((conn.ip, "login"), "login refused from %s: %s", conn.peer,
                             sasl.failure)  # fmt: skip
            conn.close_after = True
        return response

    def _answer(self, frame: memoryview | bytes, conn: Connection) -> Any:
        assert self.broker is not None
        session, sasl = conn.session, conn.sasl
        try:
            request = parse_request(frame)
        except ProtocolError:
            session.client_id = peek_client_id(frame)  # for the log of the refusal
            key, _, correlation = peek_header(frame)
            if key == API_VERSIONS:  # KIP-511: answer in v0 with the versions served
                return unsupported_versions_response(correlation)
            raise
        session.client_id = request.client_id
        key = request.api.key
        if key in CONNECTION_APIS:
            if self.sasl is None:
                body = sasl_not_enabled(request.api)
            else:
                body = self.sasl.handle(request.api, request.body, sasl)
                if sasl.principal is not None:
                    session.principal = sasl.principal
            return encode_response(request.api, request.correlation_id, body)
        if self.sasl is not None and sasl.principal is None and key != API_VERSIONS:
            raise ProtocolError(f"{request.api.name} before SASL authentication", key)
        try:
            body = self.broker.begin(request.api, request.body, session)
        except CloseConnection:
            raise
        except MQCoreError as e:
            # a request-level failure the handler could not put in its response
            raise ProtocolError(f"{request.api.name} failed: {e}") from e
        if isinstance(body, Delayed):
            return _Waiting(request, body)
        return response_frame(request, body)


def _all_of(waits: list[Delayed]) -> Delayed:
    """One Delayed for several: each one's answer, in order, once all have one (polled
    together, woken by any of their keys, final at the earliest deadline)."""
    answers: dict[int, Any] = {}

    def poll(final: bool) -> Any:
        for i, d in enumerate(waits):
            if i not in answers:
                got = d.poll(final)
                if got is not NOT_YET:
                    answers[i] = d.then(got)
        return [answers[i] for i in range(len(waits))] if len(answers) == len(waits) else NOT_YET

    deadlines = [d.deadline for d in waits if d.deadline is not None]
    keys = {k for d in waits for k in d.keys}
    return Delayed(poll, lambda: [d.wait() for d in waits],
                   deadline=min(deadlines) if deadlines else None, keys=keys)  # fmt: skip


def response_frame(request: Request, body: Any) -> bytes | FetchFrame | None:
    """The frame of the handler's response `body` to `request` (None: no response), in the
    client's version (a version Kafka 4 removed is lowered from the one that answered it:
    server/legacy.py)."""
    if body is None:
        return None
    version = request.version if request.version >= 0 else request.api.version
    if isinstance(body, FetchAnswer):  # records sent from the files (server/fetchwire.py)
        return encode_fetch(version, request.correlation_id, body.topics)
    if isinstance(body, ProduceAnswer):  # written by hand (server/producewire.py)
        return encode_produce(version, request.correlation_id, body)
    if request.legacy is not None:
        return legacy.encode_response(request.legacy, request.correlation_id, body)
    return encode_response(request.api, request.correlation_id, body)


class _Waiting:
    """A request whose answer waits in the purgatory."""

    __slots__ = ("delayed", "request")

    def __init__(self, request: Request, delayed: Delayed):
        self.request, self.delayed = request, delayed


class RequestThreads:
    """`count` threads answering requests (Kafka's request handler pool): every call given to
    submit() runs on one of them, in order of submission."""

    def __init__(self, count: int):
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"mqcore-request-{i}", daemon=True)
            for i in range(count)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[], None]) -> None:
        self._queue.put(fn)

    def stop(self) -> None:
        """Run what was submitted, then end the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()

    def _run(self) -> None:
        while (fn := self._queue.get()) is not None:
            try:
                fn()
            except Exception:  # each call reports its own; this keeps the thread alive
                log.exception("a request thread's call failed")


def _path(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)


def cluster_id(store_path: str) -> str:
    """The store's cluster ID (Kafka's 22-character base64 of a UUID), made once and kept in
    the store directory, so clients see the same cluster across restarts."""
    path = os.path.join(store_path, CLUSTER_FILE)
    try:
        with open(path) as f:
            found = f.read().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    with contextlib.suppress(OSError):  # a read-only store serves a fresh ID
        durable.write_atomic(path, (made + "\n").encode())
    return made
