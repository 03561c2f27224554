"""The cluster's state in ZooKeeper, in the layout Kafka kept there before KRaft, so that the
tools that read a ZooKeeper-era Kafka cluster read ours (issue 33; docs/cluster.md).

Nothing here decides anything by itself: ZooKeeper's ephemeral nodes say which brokers are
alive and which one is the controller, and every change of a partition's state is a
compare-and-set on its znode's version, fenced by the controller epoch's znode version when the
controller writes (Kafka's KafkaZkClient does the same with a multi-op and a CheckOp).

Znodes (under the chroot of the coordinator URL, `zk://HOST:PORT[,HOST:PORT]/PATH`):

    /brokers/ids/<id>           ephemeral  {"version":5,"host":H,"port":P,"endpoints":
                                           ["PLAINTEXT://H:P"],"listener_security_protocol_map":
                                           {"PLAINTEXT":"PLAINTEXT"},"jmx_port":-1,
                                           "features":{},"timestamp":"<ms>"[,"rack":R]
                                           [,"mqcore_http":"http://H:P"]}
    /controller                 ephemeral  {"version":1,"brokerid":N,"timestamp":"<ms>"}
    /controller_epoch           persistent "<epoch>"  (its znode version fences the controller)
    /brokers/topics/<t>         persistent {"version":2,"partitions":{"<p>":[replica ids]},
                                           "adding_replicas":{},"removing_replicas":{}}
    /brokers/topics/<t>/partitions/<p>/state
                                persistent {"controller_epoch":C,"leader":L,"version":1,
                                           "leader_epoch":E,"isr":[ids]}
    /config/topics/<t>          persistent {"version":1,"config":{"<name>":"<value>"}}
    /cluster/id                 persistent {"version":"1","id":"<cluster ID>"}
    /latest_producer_id_block   persistent {"version":1,"broker":N,"block_start":"<id>",
                                           "block_end":"<id>"}: the last block of producer
                                           IDs handed to a broker (each takes the next one)
    /admin/preferred_replica_election
                                persistent {"version":1,"partitions":[{"topic":T,
                                           "partition":P}]}: a request to the controller,
                                           which deletes it once done
    /admin/delete_topics/<t>    persistent (empty) a topic marked for deletion (Kafka's)
    /admin/delete_topics/<t>/<id>
                                persistent (empty) broker <id> deleted its replicas of <t>
                                           (mqcore's; the controller deletes the topic's
                                           znodes, these and the mark once every replica's
                                           broker has written one)

A leader of -1 means the partition has none (no replica of the ISR is alive).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from mqcore.cluster.assign import NO_LEADER
from mqcore.errors import (
    CoordinatorError,
    InvalidConfigError,
    NodeIdTakenError,
    StaleStateError,
    TopicExistsError,
    UnknownTopicError,
)

BROKERS = "/brokers/ids"
TOPICS = "/brokers/topics"
TOPIC_CONFIGS = "/config/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
PREFERRED_ELECTION = "/admin/preferred_replica_election"
DELETE_TOPICS = "/admin/delete_topics"
CLUSTER_ID = "/cluster/id"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's
MAX_BLOCK_ATTEMPTS = 64  # compare-and-set rounds lost to other brokers before giving up
log = logging.getLogger("mqcore.cluster")

# Kafka's zookeeper.session.timeout.ms default (18 s): how long ZooKeeper keeps a silent
# broker's ephemeral nodes, so how long a dead broker stays registered and leader
DEFAULT_SESSION_TIMEOUT_MS = 18_000
# how long start() waits for ZooKeeper to answer at all (Kafka's zookeeper.connection.timeout.ms
# defaults to the session timeout)
DEFAULT_CONNECT_TIMEOUT = 18.0


def parse_coordinator(url: str) -> tuple[str, str]:
    """`zk://HOST:PORT[,HOST:PORT...][/PATH]` as (hosts, chroot). The chroot keeps one cluster's
    znodes apart from another's on a shared ZooKeeper ("/" when no path is given)."""
    parts = urlsplit(url)
    if parts.scheme != "zk" or not parts.netloc:
        raise InvalidConfigError(
            f"coordinator {url!r} is not a ZooKeeper URL: zk://HOST:PORT[,HOST:PORT]/PATH"
        )
    for host in parts.netloc.split(","):
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidConfigError(f"coordinator {url!r}: {host!r} is not HOST:PORT")
    chroot = parts.path.rstrip("/") or "/"
    if parts.query or parts.fragment or "//" in chroot:
        raise InvalidConfigError(f"coordinator {url!r}: the path must be a plain /PATH")
    return parts.netloc, chroot


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A live broker as it registered: its node ID, where clients reach it, its rack, and
    the base URL of its HTTP query API if it serves one (mqcore's own field: Kafka's tools
    ignore it; the others forward queries there: server/clusterread.py)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    http: str | None = None

    def encode(self, now_ms: int) -> bytes:
        data: dict[str, Any] = {
            "version": 5,
            "host": self.host,
            "port": self.port,
            "endpoints": [f"PLAINTEXT://{self.host}:{self.port}"],
            "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
            "jmx_port": -1,
            "features": {},
            "timestamp": str(now_ms),
        }
        if self.rack is not None:
            data["rack"] = self.rack
        if self.http is not None:
            data["mqcore_http"] = self.http
        return json.dumps(data).encode()

    @classmethod
    def decode(cls, node_id: int, raw: bytes, path: str) -> BrokerInfo:
        data = _json(raw, path)
        try:
            http = data.get("mqcore_http")
            return cls(node_id, str(data["host"]), int(data["port"]), data.get("rack"),
                       None if http is None else str(http))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise CoordinatorError(f"{path} is not a broker registration: {e!r}") from None


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition's leader, leader epoch and in-sync replicas, as of `version` (its znode's
    version: the condition of the next update), written by controller epoch
    `controller_epoch`."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    version: int = -1

    def encode(self) -> bytes:
        return json.dumps({
            "controller_epoch": self.controller_epoch,
            "leader": self.leader,
            "version": 1,
            "leader_epoch": self.leader_epoch,
            "isr": list(self.isr),
        }).encode()  # fmt: skip

    @classmethod
    def decode(cls, raw: bytes, version: int, path: str) -> PartitionState:
        data = _json(raw, path)
        try:
            return cls(
                int(data["leader"]),
                int(data["leader_epoch"]),
                tuple(int(r) for r in data["isr"]),
                int(data["controller_epoch"]),
                version,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CoordinatorError(f"{path} is not a partition state: {e!r}") from None


@dataclass(frozen=True, slots=True)
class Controller:
    """This node's term as controller: its epoch, and the version of `/controller_epoch` that
    every write of the term is conditional on (a newer controller changes it, so the old one's
    writes fail with StaleStateError instead of undoing the new one's)."""

    node_id: int
    epoch: int
    epoch_version: int


def _json(raw: bytes, path: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise CoordinatorError(f"{path} does not hold JSON: {raw[:80]!r}") from None
    if not isinstance(data, dict):
        raise CoordinatorError(f"{path} does not hold a JSON object: {raw[:80]!r}")
    return data


def _assignment(raw: bytes, path: str) -> dict[int, tuple[int, ...]]:
    data = _json(raw, path)
    try:
        return {int(p): tuple(int(r) for r in rs) for p, rs in data["partitions"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CoordinatorError(f"{path} is not a replica assignment: {e!r}") from None


def _election_partitions(raw: bytes) -> list[tuple[str, int]]:
    """The partitions an election request names; none for a malformed one (logged), so the
    controller deletes it rather than let it block every later request."""
    try:
        items = _json(raw, PREFERRED_ELECTION)["partitions"]
        return [(str(i["topic"]), int(i["partition"])) for i in items]
    except (CoordinatorError, KeyError, TypeError, ValueError) as e:
        log.warning("%s is not an election request (%r): dropping it", PREFERRED_ELECTION, e)
        return []


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Watches:
    """The recipes keeping the watches alive (kazoo's watchers stop when collected)."""

    items: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as `describe()` shows it: replicas (preferred leader first) and state."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    state: PartitionState | None  # None: its state znode is missing (being created or gone)

    @property
    def offline(self) -> bool:
        return self.state is None or self.state.leader == NO_LEADER

    @property
    def under_replicated(self) -> bool:
        return self.state is None or len(self.state.isr) < len(self.replicas)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What `mqcore cluster status` shows: the live brokers, the controller and its epoch,
    every partition. Read znode by znode, so not one instant's picture: a change during the
    read may show half applied."""

    brokers: dict[int, BrokerInfo]
    controller: int | None
    controller_epoch: int
    partitions: list[PartitionView]
    # topics marked for deletion, each with the brokers still to delete their replicas
    deleting: dict[str, list[int]] = field(default_factory=dict)


class ZkCoordinator:
    """One node's session with ZooKeeper and the operations of the cluster's state over it.
    `start()` connects (CoordinatorError if ZooKeeper does not answer in time); `close()` ends
    the session, and with it this node's ephemeral znodes (its registration, its controller
    term). `session_lost` is set when ZooKeeper expired the session: the ephemeral znodes are
    gone then, so a broker must stop acting on them (re-register, step down as controller)."""

    def __init__(
        self,
        url: str,
        *,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ):
        self.url = url
        hosts, self.chroot = parse_coordinator(url)
        if session_timeout_ms <= 0:  # ZooKeeper bounds it to 2-20 of its ticks
            raise InvalidConfigError(f"session timeout {session_timeout_ms} ms must be positive")
        self.connect_timeout = connect_timeout
        # every request waits at most this long (kazoo's blocking calls would wait out a
        # ZooKeeper outage without end)
        self.request_timeout = connect_timeout
        # the chroot is prefixed here rather than by kazoo, which cannot make it (it only
        # warns that it is missing)
        self.root = "" if self.chroot == "/" else self.chroot
        self.session_timeout = session_timeout_ms / 1000
        self.client = KazooClient(hosts=hosts, timeout=self.session_timeout)
        self.session_lost = threading.Event()
        self._watches = _Watches()
        self._session_listeners: list[Callable[[bool], None]] = []
        self._lost = False
        self._closing = False  # close() ends the session on purpose: nothing to warn of
        self._suspended = False
        self.client.add_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.SUSPENDED:
            self._suspended = True
            log.warning("ZooKeeper at %s is unreachable; the session lasts %g s without it",
                        self.url, self.session_timeout)  # fmt: skip
        elif state == KazooState.LOST:
            if not self._closing:
                log.warning("the ZooKeeper session expired: this node's registration is gone")
            self._lost = True
            self.session_lost.set()
            for listener in self._session_listeners:
                listener(False)
        elif state == KazooState.CONNECTED and self._lost:
            log.warning("ZooKeeper at %s reached again, in a new session", self.url)
            self._lost = self._suspended = False
            for listener in self._session_listeners:
                listener(True)
        elif state == KazooState.CONNECTED and self._suspended:
            log.warning("ZooKeeper at %s reached again, the session kept", self.url)
            self._suspended = False

    def on_session(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(False)` when ZooKeeper expires this node's session (its ephemeral
        znodes are gone: stop acting on them) and `listener(True)` once a new session is
        connected after that (register again). On kazoo's thread: hand the work on."""
        self._session_listeners.append(listener)

    # -- the session ----------------------------------------------------------------------

    def start(self) -> ZkCoordinator:
        """Connect, and make the chroot and the persistent parents if they are missing."""
        try:
            self.client.start(timeout=self.connect_timeout)
        except KazooTimeoutError:
            self.client.stop()
            self.client.close()
            raise CoordinatorError(
                f"ZooKeeper at {self.url} did not answer within {self.connect_timeout:g} s"
            ) from None
        try:
            for path in (BROKERS, TOPICS, TOPIC_CONFIGS, DELETE_TOPICS):
                self._call(f"making {path}", self.client.ensure_path_async, self._p(path))
        except CoordinatorError:
            self.close()
            raise
        return self

    def close(self) -> None:
        """End the session: ZooKeeper drops this node's ephemeral znodes at once."""
        self._closing = True
        self.client.stop()
        self.client.close()

    def __enter__(self) -> ZkCoordinator:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def cluster_id(self, new_id: str) -> str:
        """The cluster's ID (Kafka's /cluster/id): the one written first, `new_id` if none
        was, so every broker of the cluster answers the same."""
        body = json.dumps({"version": "1", "id": new_id}).encode()
        try:
            self._call("making /cluster", self.client.ensure_path_async, self._p("/cluster"))
            self._call("writing /cluster/id", self.client.create_async, self._p(CLUSTER_ID), body)
        except NodeExistsError:
            pass
        found = self._data(CLUSTER_ID)
        if found is None:
            raise CoordinatorError(f"{CLUSTER_ID} vanished after it was written")
        return str(_json(found[0], CLUSTER_ID).get("id", new_id))

    def allocate_producer_ids(self, broker: int, size: int = PRODUCER_ID_BLOCK_SIZE) -> range:
        """A block of producer IDs no other broker gets (Kafka's ZooKeeper-era
        ProducerIdManager): the block after the latest one, taken by compare-and-set."""
        for _ in range(MAX_BLOCK_ATTEMPTS):
            found = self._data(PRODUCER_ID_BLOCK)
            start = 0
            if found is not None:
                data = _json(found[0], PRODUCER_ID_BLOCK)
                try:
                    start = int(data["block_end"]) + 1
                except (KeyError, TypeError, ValueError):
                    raise CoordinatorError(f"{PRODUCER_ID_BLOCK} has no block_end") from None
            end = start + size - 1
            body = json.dumps({"version": 1, "broker": broker, "block_start": str(start),
                               "block_end": str(end)}).encode()  # fmt: skip
            try:
                if found is None:
                    self._call("writing a producer ID block", self.client.create_async,
                               self._p(PRODUCER_ID_BLOCK), body)  # fmt: skip
                else:
                    self._call("writing a producer ID block", self.client.set_async,
                               self._p(PRODUCER_ID_BLOCK), body,
                               version=found[1].version)  # fmt: skip
            except (NodeExistsError, BadVersionError):
                continue  # another broker took it: the next one
            return range(start, end + 1)
        raise CoordinatorError(f"no producer ID block after {MAX_BLOCK_ATTEMPTS} lost updates")

    # -- brokers --------------------------------------------------------------------------

    def register_broker(self, info: BrokerInfo) -> None:
        """Register this node, ephemerally: it stays registered while the session lives.
        NodeIdTakenError if a live broker already holds the ID."""
        path = f"{BROKERS}/{info.node_id}"
        try:
            self._call(f"registering {path}", self.client.create_async, self._p(path),
                       info.encode(_now_ms()), ephemeral=True)  # fmt: skip
        except NodeExistsError:
            raise NodeIdTakenError(
                f"node ID {info.node_id} is registered by a live broker ({self.url}{path}); "
                "give this node another --node-id, or stop the other"
            ) from None

    def brokers(self) -> dict[int, BrokerInfo]:
        """The live brokers by node ID."""
        out = {}
        for child in self._children(BROKERS):
            if not child.isdigit():
                continue
            path = f"{BROKERS}/{child}"
            raw = self._data(path)
            if raw is not None:  # gone between the listing and the read
                out[int(child)] = BrokerInfo.decode(int(child), raw[0], path)
        return out

    def watch_brokers(self, on_change: Callable[[set[int]], None]) -> None:
        """Call `on_change(live node IDs)` now and whenever a broker comes or goes (on
        kazoo's event thread: hand the work to another thread)."""

        def changed(children: list[str]) -> None:
            on_change({int(c) for c in children if c.isdigit()})

        self._watches.items.append(ChildrenWatch(self.client, self._p(BROKERS), changed))

    # -- the controller -------------------------------------------------------------------

    def elect(self, node_id: int) -> Controller | None:
        """Try once to become the controller: create the ephemeral `/controller` and bump
        `/controller_epoch` in one multi-op, so no two terms share an epoch. The term, or None
        when another node is the controller (or won the same race)."""
        if self._data(CONTROLLER_EPOCH) is None:
            try:
                self._call("making the controller epoch", self.client.create_async,
                           self._p(CONTROLLER_EPOCH), b"0")  # fmt: skip
            except NodeExistsError:
                pass  # made meanwhile by another node
        raw, stat = self._data(CONTROLLER_EPOCH) or (b"", None)
        if stat is None:
            raise CoordinatorError(f"{CONTROLLER_EPOCH} vanished")
        epoch = self._int(raw, CONTROLLER_EPOCH) + 1
        body = json.dumps({"version": 1, "brokerid": node_id, "timestamp": str(_now_ms())})
        t = self.client.transaction()
        t.create(self._p(CONTROLLER), body.encode(), ephemeral=True)
        t.set_data(self._p(CONTROLLER_EPOCH), str(epoch).encode(), version=stat.version)
        results = self._commit(t, "electing the controller")
        if isinstance(results[0], NodeExistsError) or isinstance(results[1], BadVersionError):
            return None
        self._raise_failed(results, "electing the controller")
        return Controller(node_id, epoch, results[1].version)

    def controller(self) -> int | None:
        """The controller's node ID, or None while there is none."""
        found = self._data(CONTROLLER)
        if found is None:
            return None
        data = _json(found[0], CONTROLLER)
        try:
            return int(data["brokerid"])
        except (KeyError, TypeError, ValueError):
            raise CoordinatorError(f"{CONTROLLER} does not name a broker: {found[0]!r}") from None

    def controller_epoch(self) -> int:
        """The epoch of the newest term (0 before any election)."""
        found = self._data(CONTROLLER_EPOCH)
        return 0 if found is None else self._int(found[0], CONTROLLER_EPOCH)

    def watch_controller(self, on_change: Callable[[int | None], None]) -> None:
        """Call `on_change(controller node ID or None)` now and whenever it changes."""

        def changed(data: bytes | None, _stat: Any) -> None:
            if data is None:
                on_change(None)
                return
            try:
                on_change(int(_json(data, CONTROLLER)["brokerid"]))
            except (CoordinatorError, KeyError, TypeError, ValueError):
                on_change(None)

        self._watches.items.append(DataWatch(self.client, self._p(CONTROLLER), changed))

    # -- topics and partitions ------------------------------------------------------------

    def write_topic(
        self,
        topic: str,
        assignment: Mapping[int, Sequence[int]],
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Write a new topic's replica assignment and configs, in one multi-op: what any
        broker does for a CreateTopics, as Kafka's brokers did in the ZooKeeper era. Its
        partitions have no state yet: the controller, watching the topics, gives each its
        first one (init_partition_states). TopicExistsError if it exists."""
        partitions = sorted(assignment)
        if partitions != list(range(len(partitions))) or not partitions:
            raise InvalidConfigError(f"topic {topic!r}: partitions must be 0..n-1: {partitions}")
        for p in partitions:
            replicas = list(assignment[p])
            if not replicas or len(set(replicas)) != len(replicas):
                raise InvalidConfigError(
                    f"topic {topic!r} partition {p}: replicas must be distinct: {replicas}"
                )
        body = {
            "version": 2,
            "partitions": {str(p): list(assignment[p]) for p in partitions},
            "adding_replicas": {},
            "removing_replicas": {},
        }
        t = self.client.transaction()
        t.create(self._p(f"{TOPIC_CONFIGS}/{topic}"),
                 json.dumps({"version": 1, "config": dict(config or {})}).encode())  # fmt: skip
        t.create(self._p(f"{TOPICS}/{topic}"), json.dumps(body).encode())
        t.create(self._p(f"{TOPICS}/{topic}/partitions"), b"")
        for p in partitions:
            t.create(self._p(f"{TOPICS}/{topic}/partitions/{p}"), b"")
        results = self._commit(t, f"creating topic {topic!r}")
        if any(isinstance(r, NodeExistsError) for r in results[:2]):
            raise TopicExistsError(f"topic {topic!r} already exists")
        self._raise_failed(results, f"creating topic {topic!r}")

    def init_partition_states(
        self, term: Controller, topic: str, states: Mapping[int, PartitionState]
    ) -> dict[int, PartitionState]:
        """The controller gives partitions of a new topic their first state, in one multi-op
        conditional on its term: the states as written (version 0). StaleStateError if the
        term is over; a partition that has a state already keeps it (left out of the
        answer)."""
        todo = {p: s for p, s in states.items()
                if self._data(self._state_path(topic, p)) is None}  # fmt: skip
        if not todo:
            return {}
        t = self.client.transaction()
        t.check(self._p(CONTROLLER_EPOCH), term.epoch_version)
        for p, s in sorted(todo.items()):
            t.create(self._p(self._state_path(topic, p)), s.encode())
        results = self._commit(t, f"initialising the partitions of {topic!r}")
        if isinstance(results[0], BadVersionError):
            raise StaleStateError(f"initialising {topic!r}: controller epoch {term.epoch} is over")
        if any(isinstance(r, NodeExistsError) for r in results):
            return {}  # another writer was first: the watch sees its states
        if any(isinstance(r, NoNodeError) for r in results):
            raise UnknownTopicError(topic)  # deleted meanwhile
        self._raise_failed(results, f"initialising the partitions of {topic!r}")
        return {p: PartitionState(s.leader, s.leader_epoch, s.isr, s.controller_epoch, 0)
                for p, s in todo.items()}  # fmt: skip

    def watch_topics(self, on_change: Callable[[set[str]], None]) -> None:
        """Call `on_change(topic names)` now and whenever a topic is created or deleted (on
        kazoo's event thread: hand the work to another thread)."""

        def changed(children: list[str]) -> None:
            on_change(set(children))

        self._watches.items.append(ChildrenWatch(self.client, self._p(TOPICS), changed))

    def has_state(self, topic: str, partition: int) -> bool:
        return self._data(self._state_path(topic, partition)) is not None

    def topics(self) -> list[str]:
        return sorted(self._children(TOPICS))

    def assignment(self, topic: str) -> dict[int, tuple[int, ...]]:
        """Each partition's replicas, the preferred leader first."""
        path = f"{TOPICS}/{topic}"
        found = self._data(path)
        if found is None:
            raise UnknownTopicError(topic)
        return _assignment(found[0], path)

    def add_partitions(self, topic: str, added: Mapping[int, Sequence[int]]) -> None:
        """Append partitions to a topic's assignment (Kafka's AdminZkClient.addPartitions):
        one multi-op that replaces the assignment if it is still the one read, and makes the
        new partitions' znodes; the controller, watching the assignment, gives them their
        first states. StaleStateError when the assignment changed meanwhile; InvalidConfig-
        Error unless the new partitions follow the existing ones."""
        path = f"{TOPICS}/{topic}"
        found = self._data(path)
        if found is None:
            raise UnknownTopicError(topic)
        current = _assignment(found[0], path)
        if sorted(added) != list(range(len(current), len(current) + len(added))) or not added:
            raise InvalidConfigError(
                f"topic {topic!r} has partitions 0..{len(current) - 1}: new ones must follow, "
                f"not {sorted(added)}"
            )
        whole = {**current, **{p: tuple(r) for p, r in added.items()}}
        body = {"version": 2, "partitions": {str(p): list(whole[p]) for p in sorted(whole)},
                "adding_replicas": {}, "removing_replicas": {}}  # fmt: skip
        t = self.client.transaction()
        t.set_data(self._p(path), json.dumps(body).encode(), version=found[1].version)
        for p in sorted(added):
            t.create(self._p(f"{path}/partitions/{p}"), b"")
        results = self._commit(t, f"adding partitions to {topic!r}")
        if isinstance(results[0], BadVersionError):
            raise StaleStateError(f"{path} changed while partitions were added: read it again")
        self._raise_failed(results, f"adding partitions to {topic!r}")

    # -- deleting a topic (Kafka's ZooKeeper-era protocol, the brokers' acks mqcore's) --------

    def request_topic_deletion(self, topic: str) -> None:
        """Mark `topic` for deletion (what kafka-topics.sh --delete wrote): each broker holding
        a replica deletes it and says so, then the controller deletes the topic's znodes.
        UnknownTopicError for a topic of none; marking it twice is marking it once."""
        if self._data(f"{TOPICS}/{topic}") is None:
            raise UnknownTopicError(topic)
        try:
            self._call(f"marking {topic!r} for deletion", self.client.create_async,
                       self._p(f"{DELETE_TOPICS}/{topic}"), b"")  # fmt: skip
        except NodeExistsError:
            pass

    def pending_deletions(self) -> set[str]:
        return set(self._children(DELETE_TOPICS))

    def watch_deletions(self, on_change: Callable[[set[str]], None]) -> None:
        """Call `on_change(topics marked for deletion)` now and whenever the set changes."""

        def changed(children: list[str]) -> None:
            on_change(set(children))

        self._watches.items.append(ChildrenWatch(self.client, self._p(DELETE_TOPICS), changed))

    def ack_topic_deletion(self, topic: str, broker: int) -> None:
        """Broker `broker` deleted its replicas of `topic` (nothing if the deletion ended)."""
        try:
            self._call(f"acknowledging the deletion of {topic!r}", self.client.create_async,
                       self._p(f"{DELETE_TOPICS}/{topic}/{broker}"), b"")  # fmt: skip
        except (NodeExistsError, NoNodeError):
            pass

    def deletion_acks(self, topic: str) -> set[int]:
        return {int(c) for c in self._children(f"{DELETE_TOPICS}/{topic}") if c.isdigit()}

    def watch_deletion_acks(self, topic: str, on_change: Callable[[], None]) -> None:
        """Call `on_change()` whenever a broker acknowledges the deletion of `topic` (and once
        the mark is gone)."""

        def changed(_children: list[str]) -> bool | None:
            on_change()
            return None

        self._watches.items.append(
            ChildrenWatch(self.client, self._p(f"{DELETE_TOPICS}/{topic}"), changed)
        )

    def finish_topic_deletion(self, term: Controller, topic: str) -> None:
        """The controller deletes a marked topic's znodes (assignment, partitions and their
        states, configs) with the mark and its acks, in one multi-op conditional on its term:
        StaleStateError if the term is over."""
        t = self.client.transaction()
        t.check(self._p(CONTROLLER_EPOCH), term.epoch_version)
        base = f"{TOPICS}/{topic}"
        if self._data(base) is not None:
            parts = f"{base}/partitions"
            for p in self._children(parts):
                for child in self._children(f"{parts}/{p}"):
                    t.delete(self._p(f"{parts}/{p}/{child}"))
                t.delete(self._p(f"{parts}/{p}"))
            if self._data(parts) is not None:
                t.delete(self._p(parts))
            t.delete(self._p(base))
        if self._data(f"{TOPIC_CONFIGS}/{topic}") is not None:
            t.delete(self._p(f"{TOPIC_CONFIGS}/{topic}"))
        mark = f"{DELETE_TOPICS}/{topic}"
        for child in self._children(mark):
            t.delete(self._p(f"{mark}/{child}"))
        t.delete(self._p(mark))
        results = self._commit(t, f"deleting topic {topic!r}")
        if isinstance(results[0], BadVersionError):
            raise StaleStateError(f"deleting {topic!r}: controller epoch {term.epoch} is over")
        self._raise_failed(results, f"deleting topic {topic!r}")

    def watch_assignment(
        self, topic: str, on_change: Callable[[dict[int, tuple[int, ...]] | None], None]
    ) -> None:
        """Call `on_change(assignment or None)` now and whenever the topic's assignment
        changes (partitions added; None: the topic is gone)."""
        path = f"{TOPICS}/{topic}"

        def changed(data: bytes | None, _stat: Any) -> None:
            try:
                on_change(None if data is None else _assignment(data, path))
            except CoordinatorError:
                log.warning("%s is not a replica assignment", path)

        self._watches.items.append(DataWatch(self.client, self._p(path), changed))

    def topic_config(self, topic: str) -> dict[str, str]:
        return self.versioned_topic_config(topic)[0]

    def versioned_topic_config(self, topic: str) -> tuple[dict[str, str], int]:
        """A topic's config overrides (Kafka's names) and their znode's version."""
        path = f"{TOPIC_CONFIGS}/{topic}"
        found = self._data(path)
        if found is None:
            raise UnknownTopicError(topic)
        return _config(found[0], path), found[1].version

    def set_topic_config(
        self, topic: str, config: Mapping[str, str], expected_version: int
    ) -> None:
        """Replace a topic's config overrides if they are still the version read
        (StaleStateError otherwise): what kafka-configs.sh --zookeeper --alter wrote."""
        body = json.dumps({"version": 1, "config": dict(config)}).encode()
        try:
            self._call(f"changing the configs of {topic!r}", self.client.set_async,
                       self._p(f"{TOPIC_CONFIGS}/{topic}"), body, expected_version)  # fmt: skip
        except BadVersionError:
            raise StaleStateError(f"the configs of {topic!r} changed meanwhile") from None
        except NoNodeError:
            raise UnknownTopicError(topic) from None

    def watch_topic_config(
        self, topic: str, on_change: Callable[[dict[str, str] | None], None]
    ) -> None:
        """Call `on_change(overrides or None)` now and whenever the topic's configs change."""
        path = f"{TOPIC_CONFIGS}/{topic}"

        def changed(data: bytes | None, _stat: Any) -> None:
            try:
                on_change(None if data is None else _config(data, path))
            except CoordinatorError:
                log.warning("%s is not a topic config", path)

        self._watches.items.append(DataWatch(self.client, self._p(path), changed))

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        path = self._state_path(topic, partition)
        found = self._data(path)
        if found is None:
            raise UnknownTopicError(f"{topic}-{partition}")
        return PartitionState.decode(found[0], found[1].version, path)

    def set_partition_state(
        self,
        topic: str,
        partition: int,
        state: PartitionState,
        *,
        expected_version: int,
        term: Controller | None = None,
    ) -> PartitionState:
        """Replace a partition's state if its znode is still at `expected_version` (and, for a
        controller's write, `term` is still the newest): the state as written, with its new
        version. StaleStateError otherwise: nothing was written. A leader changing its ISR
        writes without a term, as Kafka's leaders did."""
        path = self._state_path(topic, partition)
        if term is None:
            try:
                stat = self._call(f"writing {path}", self.client.set_async, self._p(path),
                                  state.encode(), version=expected_version)  # fmt: skip
            except BadVersionError:
                raise StaleStateError(
                    f"{path} changed since version {expected_version}: read it again"
                ) from None
            except NoNodeError:
                raise UnknownTopicError(f"{topic}-{partition}") from None
            return PartitionState(
                state.leader, state.leader_epoch, state.isr, state.controller_epoch, stat.version
            )
        t = self.client.transaction()
        t.check(self._p(CONTROLLER_EPOCH), term.epoch_version)
        t.set_data(self._p(path), state.encode(), version=expected_version)
        results = self._commit(t, f"writing {path}")
        if isinstance(results[0], BadVersionError):
            raise StaleStateError(f"writing {path}: controller epoch {term.epoch} is over")
        if isinstance(results[1], BadVersionError):
            raise StaleStateError(f"{path} changed since version {expected_version}: read it again")
        if isinstance(results[1], NoNodeError):
            raise UnknownTopicError(f"{topic}-{partition}")
        self._raise_failed(results, f"writing {path}")
        return PartitionState(
            state.leader, state.leader_epoch, state.isr, state.controller_epoch,
            results[1].version,
        )  # fmt: skip

    def watch_partition_state(
        self, topic: str, partition: int, on_change: Callable[[PartitionState | None], None]
    ) -> None:
        """Call `on_change(state or None)` now and whenever the partition's state changes."""
        path = self._state_path(topic, partition)

        def changed(data: bytes | None, stat: Any) -> None:
            on_change(None if data is None else PartitionState.decode(data, stat.version, path))

        self._watches.items.append(DataWatch(self.client, self._p(path), changed))

    def describe(self) -> ClusterView:
        """The whole cluster as its state says it is now (see ClusterView)."""
        partitions = []
        for topic in self.topics():
            try:
                assignment = self.assignment(topic)
            except UnknownTopicError:
                continue  # deleted meanwhile
            for p, replicas in sorted(assignment.items()):
                try:
                    state: PartitionState | None = self.partition_state(topic, p)
                except UnknownTopicError:
                    state = None
                partitions.append(PartitionView(topic, p, replicas, state))
        deleting = {}
        for topic in sorted(self.pending_deletions()):
            try:
                holders = {b for r in self.assignment(topic).values() for b in r}
            except UnknownTopicError:
                holders = set()
            deleting[topic] = sorted(holders - self.deletion_acks(topic))
        return ClusterView(self.brokers(), self.controller(), self.controller_epoch(), partitions,
                           deleting)  # fmt: skip

    # -- preferred-leader election ----------------------------------------------------------

    def request_preferred_election(self, partitions: Sequence[tuple[str, int]]) -> None:
        """Ask the controller to give each partition back to its preferred replica (the first
        of its assignment), as Kafka's ZooKeeper-era tool asked: a znode the controller
        watches and deletes once done. CoordinatorError while an earlier request is pending."""
        body = {"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in partitions]}
        try:
            self._call(f"writing {PREFERRED_ELECTION}", self.client.create_async,
                       self._p(PREFERRED_ELECTION), json.dumps(body).encode(),
                       makepath=True)  # fmt: skip
        except NodeExistsError:
            raise CoordinatorError(
                "a preferred-leader election is already under way: wait for the controller "
                f"to finish it ({PREFERRED_ELECTION} is deleted then)"
            ) from None

    def pending_preferred_election(self) -> list[tuple[str, int]] | None:
        """The partitions of the preferred-leader election requested and not yet done."""
        found = self._data(PREFERRED_ELECTION)
        return None if found is None else _election_partitions(found[0])

    def watch_preferred_election(self, on_request: Callable[[list[tuple[str, int]]], None]) -> None:
        """Call `on_request(partitions)` whenever a preferred-leader election is requested
        (and now, if one is pending)."""

        def changed(data: bytes | None, _stat: Any) -> None:
            if data is not None:
                on_request(_election_partitions(data))

        self._watches.items.append(DataWatch(self.client, self._p(PREFERRED_ELECTION), changed))

    def finish_preferred_election(self) -> None:
        """Delete the request: the controller is done with it."""
        try:
            self._call(f"deleting {PREFERRED_ELECTION}", self.client.delete_async,
                       self._p(PREFERRED_ELECTION))  # fmt: skip
        except NoNodeError:
            pass

    # -- helpers --------------------------------------------------------------------------

    def _p(self, path: str) -> str:
        """`path` under the cluster's chroot."""
        return self.root + path

    @staticmethod
    def _state_path(topic: str, partition: int) -> str:
        return f"{TOPICS}/{topic}/partitions/{partition}/state"

    def _call(self, what: str, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One request, waited for at most `request_timeout` seconds. ZooKeeper's answers that
        callers act on (NoNode, NodeExists, BadVersion) are raised as kazoo raises them; any
        other failure, and no answer in time, is CoordinatorError naming `what`."""
        try:
            return request(*args, **kwargs).get(timeout=self.request_timeout)
        except (NoNodeError, NodeExistsError, BadVersionError):
            raise
        except KazooTimeoutError:
            raise CoordinatorError(
                f"{what}: ZooKeeper at {self.url} did not answer within {self.request_timeout:g} s"
            ) from None
        except KazooException as e:
            raise CoordinatorError(f"{what}: {e!r}") from None

    def _children(self, path: str) -> list[str]:
        try:
            return list(
                self._call(f"listing {path}", self.client.get_children_async, self._p(path))
            )
        except NoNodeError:
            return []

    def _data(self, path: str) -> tuple[bytes, Any] | None:
        try:
            data, stat = self._call(f"reading {path}", self.client.get_async, self._p(path))
        except NoNodeError:
            return None
        return data, stat

    @staticmethod
    def _int(raw: bytes, path: str) -> int:
        try:
            return int(raw.decode())
        except (UnicodeDecodeError, ValueError):
            raise CoordinatorError(f"{path} does not hold an integer: {raw[:40]!r}") from None

    def _commit(self, t: Any, what: str) -> list[Any]:
        return list(self._call(what, t.commit_async))

    @staticmethod
    def _raise_failed(results: list[Any], what: str) -> None:
        """A multi-op that failed for a reason the caller did not handle."""
        for r in results:
            if isinstance(r, Exception) and not isinstance(r, RolledBackError):
                raise CoordinatorError(f"{what}: {r!r}")


def _config(raw: bytes, path: str) -> dict[str, str]:
    config = _json(raw, path).get("config", {})
    if not isinstance(config, dict):
        raise CoordinatorError(f"{path} has no config object")
    return {str(k): str(v) for k, v in config.items()}
