"""Share groups on a cluster's broker (issue 33; docs/cluster.md "Share groups"): one share
coordinator serves every share group, as a consumer group's coordinator serves it, and every
other broker forwards the share-group routes of the HTTP API (sharehttp.py) to it.

- **The coordinator** is the leader of `__share_group_state-0`, the share groups' durable state
  (consume/sharestate.py), an internal topic of the cluster replicated like
  `__consumer_offsets` (one partition, min(3, live brokers) replicas, compacted, and Kafka's
  min.insync.replicas for it, 2), made when a share request first needs it. Its members,
  locks and windows live in its memory, as on a node of one; its state is written to its
  replica of the topic, which the followers copy.
- **Records** are read from each partition's leader below its high watermark (ClusterSource:
  this broker's own replica where it leads, else the leader's search API asked from the
  window's end, with the group's tag and SQL92 filters run there), so a share group hands out
  only committed records, whichever broker leads each partition.
- **A commit** (and a member's close) returns once the state is fsynced on the coordinator and
  every in-sync replica of `__share_group_state-0` has it (`confirm`, Kafka's acks=all): a
  new coordinator after a failover has every acknowledgement a commit answered. A poll's
  acquisitions are written without waiting, as on a node of one.
- **When the coordinator moves** (a new leader epoch of `__share_group_state-0`), the broker
  that takes over drops the members it had from an older term and replays the state from its
  replica; the members' next requests are answered 404 and they join again. Records they held
  were written as available (no lock outlives its coordinator), so they go to the next poll.
- **Forwarding**: a request for the share routes that reaches another broker is sent on to the
  coordinator with the `X-Mqcore-Forwarded` header, body and Authorization as they came, and
  its answer relayed; a forwarded request that reaches a broker that is no longer the
  coordinator is answered 503 (ask again). At most MAX_SHARE_FORWARDS are forwarded at once,
  on threads of their own (503 past it), so waiting polls never hold the threads the broker
  answers the coordinator's reads with.
"""

from __future__ import annotations

import inspect
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from mqcore.cluster.assign import state_topic_configs
from mqcore.consume.fetch import FilteredFetch
from mqcore.consume.sharestate import SHARE_STATE_TOPIC, STATE_SEGMENT_BYTES
from mqcore.errors import (
    InvalidConfigError,
    MQCoreError,
    NotLeaderOrFollowerError,
    ReplicationError,
)
from mqcore.query.engine import QueryResult, decode_cursor, encode_cursor
from mqcore.server.clusterread import (
    FORWARD_TIMEOUT,
    FORWARDED,
    MAX_ANSWER_BYTES,
    ClusterReader,
    LeaderView,
    result_from_object,
)
from mqcore.server.httpbase import Bodies, Busy, error_answer
from mqcore.server.sharehttp import MAX_ACK_BODY, MAX_POLL_WAIT_MS, ShareSessions

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.cluster.zk import BrokerInfo

SHARE_STATE_CONFIGS = state_topic_configs(STATE_SEGMENT_BYTES)
# Kafka's share.coordinator.state.topic.min.isr: a commit is answered once two replicas have it
# (one on a cluster of one broker)
STATE_MIN_ISR = 2
CONFIRM_TIMEOUT = 5.0  # seconds a commit waits for the in-sync replicas (offsets.commit.timeout.ms)
REMOTE_POLL_INTERVAL = 0.1  # seconds a waiting poll sleeps before it asks the leaders again
FETCH_LIMIT = 1000  # records one fetch asks a leader for
MAX_SHARE_FORWARDS = 32  # share requests this broker forwards to the coordinator at once


class ClusterSource:
    """consume.share.RecordSource on a cluster: each partition read from its leader below the
    high watermark (a ClusterReader per call: its caches last one request)."""

    wait_cap = REMOTE_POLL_INTERVAL

    def __init__(self, view: LeaderView):
        self.view = view

    def partitions_of(self, topic: str) -> list[int]:
        return sorted(self.view.replicas.partitions(topic))

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        reader = ClusterReader(self.view)
        return reader.start_offset(topic, partition), reader.end_offset(topic, partition)

    def get(self, topic: str, partition: int, offset: int) -> Message | None:
        return ClusterReader(self.view).get(topic, partition, offset)

    def fetch(
        self,
        tp: tuple[str, int],
        filt: FilteredFetch,
        offset: int,
        room: int,
        budget: list[int],
    ) -> tuple[list[Message], int]:
        """The leader's one-partition search from `offset` with the group's filters: a page
        that reached the high watermark ends with the cursor there (clusterread.bounded), so
        the offset past every record examined is the cursor's, or past the last record."""
        topic, p = tp
        if filt.committed:
            raise InvalidConfigError(
                "read_committed share groups are not served on a cluster yet (docs/cluster.md)"
            )
        reader = ClusterReader(self.view)
        node = reader.leader_of(topic, p)
        at, want = encode_cursor(p, offset), min(room, FETCH_LIMIT)
        result: QueryResult
        if node is None:
            result = self.view.search(topic, None, None, filt.tag, filt.where, partition=p,
                                      limit=want, max_scan=budget[0], cursor=at)  # fmt: skip
        else:
            got = reader.ask(node, f"/v1/topics/{topic}/search",
                             {"tag": filt.tag, "where": filt.where, "partition": p, "cursor": at,
                              "limit": want, "max_scan": budget[0]})  # fmt: skip
            result = result_from_object(got)
        budget[0] -= max(1, result.scanned_records)
        msgs = [m for m in result.messages if m.offset >= offset]
        past = msgs[-1].offset + 1 if msgs else offset
        if result.cursor is not None:
            past = max(past, decode_cursor(result.cursor)[1])
        return msgs, past


class ShareCluster:
    """A cluster's broker's part in share groups (module doc): finds the coordinator, serves
    the requests there, forwards them from the others."""

    def __init__(self, view: LeaderView, sessions: ShareSessions):
        self.view, self.replicas, self.sessions = view, view.replicas, sessions
        self._term: int | None = None  # the state's leader epoch this broker's members are of
        self._term_lock = threading.Lock()
        self._forwards = threading.BoundedSemaphore(MAX_SHARE_FORWARDS)
        self._threads = anyio.CapacityLimiter(MAX_SHARE_FORWARDS)  # their own: never the pool's
        view.store.host_share_groups(ClusterSource(view), self.confirm)

    def coordinator(self) -> BrokerInfo:
        """The share coordinator (ReplicationError while there is none)."""
        info = self.replicas.internal_leader(SHARE_STATE_TOPIC, SHARE_STATE_CONFIGS, STATE_MIN_ISR)
        if info is None:
            raise ReplicationError(
                f"share groups have no coordinator now ({SHARE_STATE_TOPIC} has no leader): "
                "try again"
            )
        return info

    def target(self, forwarded: bool) -> BrokerInfo | None:
        """None when this broker serves the request (it is the coordinator: members of an
        older term dropped first), else the coordinator to forward it to; NotLeaderOrFollower
        for a forwarded request that reached a broker that is not the coordinator now."""
        info = self.coordinator()
        if info.node_id != self.replicas.node_id:
            if forwarded:
                raise NotLeaderOrFollowerError(
                    f"broker {self.replicas.node_id} is not the share coordinator now: try again"
                )
            if info.http is None:
                raise ReplicationError(f"the share coordinator {info.node_id} serves no HTTP API")
            return info
        self._take_term()
        return None

    def _take_term(self) -> None:
        """Drop the members and the state of an older term when the state's leader epoch
        changed since this broker last served share requests."""
        meta = self.replicas.partitions(SHARE_STATE_TOPIC).get(0)
        epoch = None if meta is None or meta.state is None else meta.state.leader_epoch
        with self._term_lock:
            if epoch == self._term:
                return
            self.sessions.drop_all()
            self.view.store.reset_share_groups()
            self._term = epoch

    def confirm(self) -> None:
        """Return once every in-sync replica of the state has what this broker appended so
        far (called after the fsync of a commit); NotLeaderOrFollower when it stopped being
        the coordinator, ReplicationError after CONFIRM_TIMEOUT."""
        last = self.view.store.log.replica(SHARE_STATE_TOPIC, 0).log_end_offset - 1
        self.replicas.await_committed(SHARE_STATE_TOPIC, 0, last,
                                      time.monotonic() + CONFIRM_TIMEOUT,
                                      ": the commit may not survive a failover")  # fmt: skip

    async def forward(self, request: Request, info: BrokerInfo) -> Response:
        """The request sent on to the coordinator, its answer relayed."""
        body = None
        if request.method == "POST":
            bodies: Bodies = request.app.state.bodies
            async with bodies.read(request, MAX_ACK_BODY, "the request body") as raw:
                body = bytes(raw)
        if not self._forwards.acquire(blocking=False):
            return error_answer(request, Busy(
                "this broker is forwarding as many share requests to the coordinator as it "
                "may (MAX_SHARE_FORWARDS): try again"))  # fmt: skip
        try:
            assert info.http is not None
            sent = request.scope.get("raw_path")  # as the client sent it, still quoted
            path = sent.decode("latin-1") if sent else urllib.parse.quote(request.url.path)
            url = info.http + path
            if request.url.query:
                url += "?" + request.url.query
            headers = {FORWARDED: "1", "Accept": "application/json"}
            for name in ("Authorization", "Content-Type"):
                if name in request.headers:
                    headers[name] = request.headers[name]
            send = _sender(url, request.method, body, headers, info.node_id)
            status, answer, retry = await anyio.to_thread.run_sync(send, limiter=self._threads)
        except MQCoreError as e:
            return error_answer(request, e)
        finally:
            self._forwards.release()
        return Response(answer, status, {} if retry is None else {"Retry-After": retry},
                        media_type="application/json")  # fmt: skip


def _sender(
    url: str, method: str, body: bytes | None, headers: dict[str, str], node: int
) -> Callable[[], tuple[int, bytes, str | None]]:
    """The blocking send of a forwarded share request: (status, body, Retry-After)."""

    def send() -> tuple[int, bytes, str | None]:
        request = urllib.request.Request(url, data=body, headers=headers, method=method)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        timeout = MAX_POLL_WAIT_MS / 1000 + FORWARD_TIMEOUT
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status, response.read(MAX_ANSWER_BYTES), None
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.read(1 << 16), e.headers.get("Retry-After")
        except (OSError, ValueError) as e:
            raise ReplicationError(f"the share coordinator {node} did not answer: {e}") from None

    return send


def routed(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """A share route served here or forwarded to the coordinator on a cluster's broker
    (`app.state.share_cluster`; None on a node of one)."""

    is_async = inspect.iscoroutinefunction(endpoint)  # else Starlette's thread pool runs it

    async def handler(request: Request) -> Any:
        cluster: ShareCluster | None = request.app.state.share_cluster
        if cluster is not None:
            forwarded = FORWARDED in request.headers
            try:
                info = await anyio.to_thread.run_sync(cluster.target, forwarded)
            except MQCoreError as e:
                return error_answer(request, e)
            if info is not None:
                return await cluster.forward(request, info)
        if is_async:
            return await endpoint(request)
        return await run_in_threadpool(endpoint, request)

    return handler
