"""The HTTP query API and the console on a cluster's broker (issue 33; docs/cluster.md "Query
and console"): every answer for the whole cluster, each partition read by its leader up to its
high watermark, so a page shows what a consumer would see, from whichever broker it is asked.

Two views stand where the app's store stood (server/http.py lends one per request):

- `LeaderView`, for a request another broker forwarded (it carries the `X-Mqcore-Forwarded`
  header): this broker's replicas as their leader answers for them. It lists and reads only the
  partitions it leads now, each below its high watermark, and refuses the others with
  NotLeaderOrFollowerError (503: leadership moved while the request travelled). It never
  forwards again, so no request goes round between brokers. A search or key page of one
  partition that reaches the high watermark ends "exhausted" with the cursor `c1-P-HW`: the
  asking broker learns where the partition's committed records end in the same answer.
- `ClusterReader`, for a client's request: the Store's read calls (topics, offsets, reads,
  searches, key and unique-ID lookups, group lag) answered by each partition's leader: its
  own LeaderView where it leads, else the leader's HTTP API (registered in ZooKeeper beside
  its Kafka listener), asked with the forwarded header. A query over a topic asks the
  partitions in turn (partition order: `c1-P-O` means the same on every broker, so a
  partition's own cursor is the query's) or merges one stream per partition by timestamp
  (query.merge; each stream's fetch is a partition-order page asked of that partition's
  leader). What it does not route (disk use, share groups, a store's path) is this broker's
  own, as on a node of one.

A broker that does not answer in time, or answers something that is not the API's JSON, makes
the request fail with ReplicationError (503), naming the broker; a refusal it gives (an
unknown topic, a bad selector) comes back as the same mqcore error. A broker forwards at most
MAX_FORWARDS requests at once (503 with Retry-After past it, after FORWARD_SLOT_WAIT): fewer
than its HTTP threads, so brokers flooded with requests for each other's partitions keep
threads to answer each other's forwards instead of waiting on each other.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mqcore import errors
from mqcore.config import TopicConfig
from mqcore.consume.group import PartitionLag
from mqcore.consume.share import ShareLag
from mqcore.consume.sharestate import SHARE_STATE_TOPIC
from mqcore.errors import (
    InvalidConfigError,
    MessageNotFoundError,
    MQCoreError,
    NotLeaderOrFollowerError,
    ReplicationError,
    UnknownTopicError,
)
from mqcore.query.engine import (
    EXHAUSTED,
    LIMIT,
    NO_END,
    PARTITION_ORDER,
    QueryResult,
    check_order,
    decode_cursor,
    encode_cursor,
    page_budget,
)
from mqcore.query.ids import decode_msg_id
from mqcore.query.jsonform import message_from_object
from mqcore.query.keyfilter import in_partition_order
from mqcore.query.merge import Fetched, merge_by_time
from mqcore.server.httpbase import Busy

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.cluster.replicas import ReplicaManager
    from mqcore.store import Store

FORWARDED = "X-Mqcore-Forwarded"
FORWARD_TIMEOUT = 30.0  # seconds a forwarded request may take beyond its own scan time
# requests this broker forwards at once: fewer than the HTTP server's threads (Starlette's 40),
# so two brokers forwarding to each other always keep threads to answer each other
MAX_FORWARDS = 16
FORWARD_SLOT_WAIT = 2.0  # seconds a request waits for a forwarding slot, then 503
MAX_ANSWER_BYTES = 256 << 20  # a broker's answer read at most (a page of max_limit messages)
OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class RemotePlace:
    """A partition as the merge of a cluster-wide query sees it: read to wherever its leader's
    high watermark is when each fetch asks (no end fixed when the page began)."""

    partition: int
    end_offset: int = NO_END


def bounded(result: QueryResult, partition: int, hw: int) -> QueryResult:
    """A one-partition page cut at the high watermark `hw`: a page that reached it (a match
    at or past it, or a cursor there) is exhausted, with the cursor `c1-P-HW`."""
    kept = [m for m in result.messages if m.offset < hw]
    reached = result.cursor is not None and decode_cursor(result.cursor)[1] >= hw
    if result.reason == EXHAUSTED or reached or len(kept) < len(result.messages):
        result.messages, result.reason = kept, EXHAUSTED
        result.cursor = encode_cursor(partition, hw)
    return result


def one_partition(partition: int | None) -> int:
    if partition is None:
        raise InvalidConfigError(
            "a forwarded query names its partition (partition=): the broker that forwarded it "
            "asks each partition's leader"
        )
    return partition


class LeaderView:
    """This broker's replicas as their leader answers for them (module doc): the partitions
    it leads now, each read below its high watermark."""

    read_only = False

    def __init__(self, store: Store, replicas: ReplicaManager, max_forwards: int = MAX_FORWARDS):
        self.store, self.replicas = store, replicas
        self.path = store.path
        # what the broker's ClusterReaders may forward at once (ClusterReader.ask)
        self.forwarding = threading.BoundedSemaphore(max_forwards)

    def __getattr__(self, name: str) -> Any:  # this broker's own: disk use, share groups...
        return getattr(self.store, name)

    def high_watermark(self, topic: str, partition: int) -> int:
        """The high watermark of a partition this broker leads (NotLeaderOrFollowerError)."""
        return self.replicas.leader_log(topic, partition).high_watermark

    def leads(self, topic: str, partition: int) -> bool:
        try:
            self.replicas.leader_log(topic, partition)
        except NotLeaderOrFollowerError:
            return False
        return True

    def topics(self) -> list[str]:
        return [t for t in self.store.topics() if self.available_partitions(t)]

    def available_partitions(self, topic: str) -> list[int]:
        return [p for p in self.store.available_partitions(topic) if self.leads(topic, p)]

    def start_offset(self, topic: str, partition: int = 0) -> int:
        self.high_watermark(topic, partition)
        return self.store.start_offset(topic, partition)

    def end_offset(self, topic: str, partition: int = 0) -> int:
        return self.high_watermark(topic, partition)

    def read(
        self, topic: str, partition: int = 0, offset: int = 0, max_records: int = 500,
        **isolation: str,
    ) -> list[Message]:  # fmt: skip
        hw = self.high_watermark(topic, partition)
        got = self.store.read(topic, partition, offset, max_records, **isolation)
        return [m for m in got if m.offset < hw]

    def get(self, topic: str, partition: int, offset: int, **isolation: str) -> Message | None:
        hw = self.high_watermark(topic, partition)
        m = self.store.get(topic, partition, offset, **isolation)
        return m if m is not None and m.offset < hw else None

    def get_by_id(self, msg_id: str, **isolation: str) -> Message | None:
        topic, partition, offset = decode_msg_id(msg_id)
        return self.get(topic, partition, offset, **isolation)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        hw = self.high_watermark(topic, partition)
        found = self.store.offset_for_time(topic, partition, timestamp)
        return found if found is not None and found < hw else None

    def search(
        self,
        topic: str,
        contains: bytes | str | None = None,
        regex: str | bytes | None = None,
        tag: str | None = None,
        where: str | None = None,
        partition: int | None = None,
        **kwargs: Any,
    ) -> QueryResult:
        """Store.search of one partition (the forwarder names it), cut at its high watermark."""
        p = one_partition(partition)
        hw = self.high_watermark(topic, p)
        found = self.store.search(topic, contains, regex, tag, where, p, **kwargs)
        return bounded(found, p, hw)

    def find_by_key(self, topic: str, key: bytes | str, *, partition: int | None = None,
                    **kwargs: Any) -> QueryResult:  # fmt: skip
        p = one_partition(partition)
        hw = self.high_watermark(topic, p)
        return bounded(self.store.find_by_key(topic, key, partition=p, **kwargs), p, hw)

    def find_by_unique_id(self, unique_id: str, **kwargs: Any) -> QueryResult:
        """The store's lookup, keeping the matches in partitions this broker leads, below
        their high watermarks (a follower's copy is its leader's to report)."""
        result = self.store.find_by_unique_id(unique_id, **kwargs)
        hws: dict[tuple[str, int], int] = {}
        kept = []
        for m in result.messages:
            place = (m.topic, m.partition)
            if place not in hws:
                hws[place] = self.high_watermark(*place) if self.leads(*place) else -1
            if m.offset < hws[place]:
                kept.append(m)
        result.messages = kept
        return result


class ClusterReader:
    """The Store's read calls for the whole cluster (module doc), for one request:
    `authorization` (the request's header, if any) goes along to the brokers it asks."""

    read_only = False

    def __init__(
        self,
        leader: LeaderView,
        *,
        authorization: str | None = None,
        timeout: float = FORWARD_TIMEOUT,
    ):
        self.leader, self.replicas = leader, leader.replicas
        self.path = leader.path
        self.authorization, self.timeout = authorization, timeout
        self._offsets: dict[str, dict[int, dict[str, int]]] = {}  # this request's, per topic

    def __getattr__(self, name: str) -> Any:
        return getattr(self.leader.store, name)

    # -- who answers ------------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The node leading the partition (None: this broker); NotLeaderOrFollowerError when
        it has no leader now."""
        meta = self.replicas.partitions(topic).get(partition)
        if meta is None:
            raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
        if self.leader.leads(topic, partition):
            return None
        state = meta.state
        if state is None or state.leader < 0 or state.leader not in self.replicas.brokers():
            raise NotLeaderOrFollowerError(f"{topic}-{partition} has no leader now: try again")
        return state.leader

    def ask(self, node: int, path: str, params: dict[str, Any] | None = None,
            timeout: float | None = None) -> Any:  # fmt: skip
        """GET `path` of broker `node`'s HTTP API (forwarded), its JSON; its refusal raised as
        the mqcore error it names, no answer as ReplicationError."""
        info = self.replicas.brokers().get(node)
        if info is None or info.http is None:
            raise ReplicationError(f"broker {node} is not live or serves no HTTP API")
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        url = f"{info.http}{urllib.parse.quote(path)}" + (f"?{query}" if query else "")
        headers = {FORWARDED: "1", "Accept": "application/json"}
        if self.authorization is not None:
            headers["Authorization"] = self.authorization
        request = urllib.request.Request(url, headers=headers)
        wait = self.timeout if timeout is None else timeout + self.timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        if not self.leader.forwarding.acquire(timeout=FORWARD_SLOT_WAIT):
            raise Busy(
                "this broker is forwarding as many requests to the others as it may "
                "(MAX_FORWARDS): try again"
            )
        try:
            with opener.open(request, timeout=wait) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            with e:
                raise answered_error(node, e.code, e.read(1 << 16)) from None
        except (OSError, ValueError) as e:
            raise ReplicationError(f"broker {node} ({info.http}) did not answer: {e}") from None
        finally:
            self.leader.forwarding.release()
        if len(body) > MAX_ANSWER_BYTES:
            raise ReplicationError(f"broker {node}'s answer is over {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(body)
        except ValueError:
            raise ReplicationError(f"broker {node}'s answer is not JSON") from None

    # -- topics and offsets -------------------------------------------------------------------

    def topics(self) -> list[str]:
        return self.replicas.topics()

    def partitions(self, topic: str) -> int:
        return len(self.replicas.partitions(topic))

    def available_partitions(self, topic: str) -> list[int]:
        return sorted(self.replicas.partitions(topic))

    def topic_config(self, topic: str) -> TopicConfig:
        """The topic's config as a broker holding it has it (this one if it does)."""
        if self.leader.store.log.has_topic(topic):
            return self.leader.store.topic_config(topic)
        for p in self.available_partitions(topic):
            node = self.leader_of(topic, p)
            if node is not None:
                return TopicConfig(**self.ask(node, f"/v1/topics/{topic}")["config"])
        raise UnknownTopicError(f"no broker holding {topic!r} answers")

    def disk_bytes(self, topic: str, partition: int = 0) -> int:
        """This broker's replica's disk use (0 where it holds none)."""
        store = self.leader.store
        if not store.log.has_topic(topic) or partition not in store.available_partitions(topic):
            return 0
        return store.disk_bytes(topic, partition)

    def segment_offsets(self, topic: str, partition: int) -> list[int]:
        """This broker's replica's segments ([] where it holds none)."""
        store = self.leader.store
        if not store.log.has_topic(topic) or partition not in store.available_partitions(topic):
            return []
        return store.segment_offsets(topic, partition)

    def _offsets_of(self, topic: str, partition: int) -> dict[str, int]:
        """{"start_offset", "end_offset"} of a partition from its leader (the end: the high
        watermark); a topic's remote partitions are asked once per request, a leader at once."""
        node = self.leader_of(topic, partition)
        if node is None:
            return {"start_offset": self.leader.start_offset(topic, partition),
                    "end_offset": self.leader.end_offset(topic, partition)}  # fmt: skip
        known = self._offsets.setdefault(topic, {})
        if partition not in known:
            described = self.ask(node, f"/v1/topics/{topic}")
            for entry in described["partitions"]:
                known[int(entry["partition"])] = entry
        entry = known.get(partition)
        if entry is None:
            raise NotLeaderOrFollowerError(f"broker {node} no longer leads {topic}-{partition}")
        return {"start_offset": int(entry["start_offset"]), "end_offset": int(entry["end_offset"])}

    def start_offset(self, topic: str, partition: int = 0) -> int:
        return self._offsets_of(topic, partition)["start_offset"]

    def end_offset(self, topic: str, partition: int = 0) -> int:
        return self._offsets_of(topic, partition)["end_offset"]

    # -- reading ----------------------------------------------------------------------------

    def read(
        self, topic: str, partition: int = 0, offset: int = 0, max_records: int = 500,
        **isolation: str,
    ) -> list[Message]:  # fmt: skip
        node = self.leader_of(topic, partition)
        if node is None:
            return self.leader.read(topic, partition, offset, max_records, **isolation)
        if max_records == 0:
            return []
        got = self.ask(node, f"/v1/topics/{topic}/partitions/{partition}/messages",
                       {"offset": offset, "limit": max_records, **isolation})  # fmt: skip
        return [message_from_object(m) for m in got["messages"]]

    def get(self, topic: str, partition: int, offset: int, **isolation: str) -> Message | None:
        node = self.leader_of(topic, partition)
        if node is None:
            return self.leader.get(topic, partition, offset, **isolation)
        try:
            got = self.ask(node, f"/v1/topics/{topic}/partitions/{partition}/offsets/{offset}",
                           dict(isolation))  # fmt: skip
        except MessageNotFoundError:
            return None
        return message_from_object(got["message"])

    def get_by_id(self, msg_id: str, **isolation: str) -> Message | None:
        topic, partition, offset = decode_msg_id(msg_id)
        return self.get(topic, partition, offset, **isolation)

    def offset_for_time(self, topic: str, partition: int, timestamp: int) -> int | None:
        """The earliest offset with a timestamp >= `timestamp` below the high watermark (the
        leader's time index here; a one-match search of the leader elsewhere)."""
        node = self.leader_of(topic, partition)
        if node is None:
            return self.leader.offset_for_time(topic, partition, timestamp)
        got = self.search(topic, partition=partition, start=timestamp, limit=1)
        return got.messages[0].offset if got.messages else None

    # -- queries ----------------------------------------------------------------------------

    def search(
        self,
        topic: str,
        contains: bytes | str | None = None,
        regex: str | bytes | None = None,
        tag: str | None = None,
        where: str | None = None,
        partition: int | None = None,
        *,
        start: int | None = None,
        end: int | None = None,
        limit: int = 1000,
        max_scan: int = 10_000_000,
        timeout: float | None = None,
        cursor: str | None = None,
        threads: int | None = None,
        key: bytes | str | None = None,
        order: str = PARTITION_ORDER,
        isolation_level: str = "read_uncommitted",
    ) -> QueryResult:
        """Store.search across the cluster (module doc); `threads` is each leader's own."""
        if key is not None:
            raise InvalidConfigError("a search by key on a cluster: use find_by_key (by-key)")
        if isinstance(contains, str):
            contains = contains.encode()
        if isinstance(regex, bytes):
            regex = regex.decode("utf-8", "surrogateescape")
        filters = {"tag": tag, "where": where, "regex": regex, "start": start, "end": end,
                   "isolation_level": isolation_level,
                   "contains_base64": None if contains is None
                   else base64.b64encode(contains).decode()}  # fmt: skip

        def page(p: int, at: str, want: int, records: int, seconds: float) -> QueryResult:
            node = self.leader_of(topic, p)
            if node is None:
                return self.leader.search(
                    topic, contains, regex, tag, where, partition=p, start=start, end=end,
                    limit=want, max_scan=records, timeout=seconds, cursor=at, threads=threads,
                    isolation_level=isolation_level,
                )  # fmt: skip
            got = self.ask(node, f"/v1/topics/{topic}/search",
                           {**filters, "partition": p, "cursor": at, "limit": want,
                            "max_scan": records, "timeout": f"{seconds:.3f}"},
                           timeout=seconds)  # fmt: skip
            return result_from_object(got)

        return self._query(topic, partition, page, limit, max_scan, timeout, cursor, order)

    def find_by_key(
        self,
        topic: str,
        key: bytes | str,
        *,
        start: int | None = None,
        end: int | None = None,
        limit: int = 1000,
        partition: int | None = None,
        cursor: str | None = None,
        isolation_level: str = "read_uncommitted",
    ) -> QueryResult:
        raw = key.encode() if isinstance(key, str) else key

        def page(p: int, at: str, want: int, records: int, seconds: float) -> QueryResult:
            node = self.leader_of(topic, p)
            if node is None:
                return self.leader.find_by_key(topic, raw, start=start, end=end, limit=want,
                                               partition=p, cursor=at,
                                               isolation_level=isolation_level)  # fmt: skip
            got = self.ask(node, f"/v1/topics/{topic}/by-key",
                           {"key_base64": base64.b64encode(raw).decode(), "start": start,
                            "end": end, "partition": p, "cursor": at, "limit": want,
                            "isolation_level": isolation_level})  # fmt: skip
            return result_from_object(got)

        return self._query(topic, partition, page, limit, NO_END, None, cursor, PARTITION_ORDER)

    def _query(
        self,
        topic: str,
        partition: int | None,
        page: Callable[[int, str, int, int, float], QueryResult],
        limit: int,
        max_scan: int,
        timeout: float | None,
        cursor: str | None,
        order: str,
    ) -> QueryResult:
        """One page of a query over the topic's partitions (or `partition`), each partition's
        pages asked of its leader through `page(p, cursor, want, records, seconds)`."""
        order = check_order(order)
        known = self.available_partitions(topic)
        if partition is not None and partition not in known:
            raise UnknownTopicError(f"topic {topic!r} has no partition {partition}")
        places = [RemotePlace(p) for p in (known if partition is None else [partition])]
        budget = page_budget(limit, max_scan, timeout)

        def fetch(place: RemotePlace, offset: int, end: int, want: int, records: int,
                  deadline: float) -> Fetched:  # fmt: skip
            p = place.partition
            seconds = min(max(0.0, deadline - time.monotonic()), FORWARD_TIMEOUT)
            r = page(p, encode_cursor(p, offset), want, records, seconds)
            kept = [m for m in r.messages if m.offset < end]
            if r.reason == EXHAUSTED or len(kept) < len(r.messages):
                reached = decode_cursor(r.cursor)[1] if r.cursor is not None else offset
                # the page's limit met at the partition's end: LIMIT, resuming there
                stop = LIMIT if len(kept) >= want else None
                return Fetched(kept, max(offset, min(end, reached)), stop,
                               r.scanned_records, r.scanned_bytes)  # fmt: skip
            next_offset = decode_cursor(r.cursor)[1] if r.cursor is not None else offset
            return Fetched(kept, max(offset, next_offset), r.reason, r.scanned_records,
                           r.scanned_bytes)  # fmt: skip

        if order != PARTITION_ORDER:
            return merge_by_time(places, fetch, budget, cursor)
        decode_cursor(cursor)  # a bad cursor is refused before anything is asked
        result = QueryResult()
        in_partition_order(places, fetch, budget, cursor, result)
        return result

    def find_by_unique_id(
        self,
        unique_id: str,
        *,
        start: int | None = None,
        end: int | None = None,
        limit: int = 1,
        topics: Callable[[str], bool] | None = None,
        isolation_level: str = "read_uncommitted",
    ) -> QueryResult:
        """Every live broker's matches in the partitions it leads, in (topic, partition,
        offset) order, `limit` at most; `topics` filters them here (each broker was asked
        for all it may show the request's principal)."""
        result = self.leader.find_by_unique_id(unique_id, start=start, end=end, limit=limit,
                                               topics=topics,
                                               isolation_level=isolation_level)  # fmt: skip
        found = list(result.messages)
        more = result.reason != EXHAUSTED  # a broker that stopped at the limit has more
        for node in sorted(self.replicas.brokers()):
            if node == self.replicas.node_id:
                continue
            got = self.ask(node, f"/v1/unique-ids/{unique_id}",
                           {"start": start, "end": end, "limit": limit,
                            "isolation_level": isolation_level})  # fmt: skip
            found += [m for m in map(message_from_object, got["messages"])
                      if topics is None or topics(m.topic)]  # fmt: skip
            more |= got.get("reason") != EXHAUSTED
        found.sort(key=lambda m: (m.topic, m.partition, m.offset))
        result.messages = found[:limit]
        result.reason = LIMIT if more or len(found) > limit else EXHAUSTED
        return result

    # -- groups -----------------------------------------------------------------------------

    def share_group_lag(self, group: str | None = None) -> dict[str, list[ShareLag]]:
        """The share groups' backlog as their coordinator (the leader of
        __share_group_state-0: sharecluster.py) has it; {} before any share group."""
        if not self.replicas.has_topic(SHARE_STATE_TOPIC):
            return {}
        node = self.leader_of(SHARE_STATE_TOPIC, 0)
        if node is None:
            return self.leader.store.share_group_lag(group)
        path = "/v1/share-groups" if group is None else f"/v1/share-groups/{group}"
        try:
            got = self.ask(node, path)
        except errors.UnknownGroupError:
            return {}
        found = [got] if group is not None else got["share_groups"]
        return {g["group"]: [ShareLag(g["group"], p["topic"], p["partition"], p["start"],
                                      p["end"], p["log_end"], p["available"], p["in_flight"])
                             for p in g["partitions"]]
                for g in found}  # fmt: skip

    def group_lag(self, group: str | None = None) -> dict[str, list[PartitionLag]]:
        """The groups' committed offsets as their coordinator (the leader of
        __consumer_offsets-0) has them, each lag against the partition leader's high
        watermark (None where its leader does not answer now)."""
        node = self.leader_of(OFFSETS_TOPIC, 0) if self.replicas.has_topic(OFFSETS_TOPIC) else None
        if node is None:
            lags = self.leader.store.group_lag(group)
        else:
            path = "/v1/groups" if group is None else f"/v1/groups/{group}"
            try:
                got = self.ask(node, path)
            except errors.UnknownGroupError:
                return {}
            found = [got] if group is not None else got["groups"]
            lags = {g["group"]: [PartitionLag(**p) for p in g["partitions"]] for g in found}
        for parts in lags.values():
            for i, p in enumerate(parts):
                try:
                    end: int | None = self.end_offset(p.topic, p.partition)
                except MQCoreError:
                    end = None
                lag = None if end is None else max(0, end - p.committed)
                parts[i] = PartitionLag(p.group, p.topic, p.partition, p.committed, end, lag,
                                        p.commit_time)  # fmt: skip
        return lags


def result_from_object(obj: Any) -> QueryResult:
    """A QueryResult from a broker's JSON answer (httpbase.result_object's shape)."""
    try:
        missing = obj.get("missing_properties")
        return QueryResult(
            messages=[message_from_object(m) for m in obj["messages"]],
            reason=str(obj["reason"]),
            scanned_records=int(obj["scanned_records"]),
            scanned_bytes=int(obj["scanned_bytes"]),
            cursor=obj["cursor"],
            missing_properties=None if missing is None else tuple(missing),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ReplicationError(
            f"a broker's query answer is not in the API's shape: {e!r}"
        ) from None


def answered_error(node: int, status: int, body: bytes) -> MQCoreError:
    """The mqcore error a broker's JSON error answer names (ReplicationError if none)."""
    try:
        obj = json.loads(body)
        name, message = str(obj["error"]), str(obj["message"])
    except (ValueError, KeyError, TypeError):
        return ReplicationError(f"broker {node} answered HTTP {status}")
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, MQCoreError):
        return cls(message)
    return ReplicationError(f"broker {node} answered HTTP {status}: {message}")
