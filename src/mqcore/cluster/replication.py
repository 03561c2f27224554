"""A partition's replication between its leader and its followers (issue 33; docs/cluster.md
"Replication"), as Kafka's Partition and AbstractFetcherThread decide it, over the embedding
API's ReplicaLog. Transport-free: a follower's fetch and its OffsetsForLeaderEpoch question are
callables, so the same decisions run over Kafka's Fetch and OffsetForLeaderEpoch on the wire
and, in tests, between two logs directly.

The rules:

- **A follower that starts following a new leader truncates first**, by leader epochs, never
  by its high watermark alone (KIP-101, KIP-279): it asks the leader where its own latest
  epoch ends; the leader answers the largest epoch it has at or below that one and where it
  ends. If the follower has that epoch, it truncates to the smaller of the two end offsets and
  is done. If not, it truncates to where its nearest lower epoch ends and asks again with its
  new latest epoch. A follower ahead of the new leader (it had records the old leader wrote
  but never committed) loses exactly those, and the logs then agree at every offset.
- **The leader tracks each follower's log end** (the offset it fetches from) and when it was
  last caught up (a fetch from the leader's log end). The high watermark is the smallest log
  end among the in-sync replicas, the leader included; it only grows.
- **A follower leaves the ISR** when it has not caught up for `replica_lag_time_max_ms`
  (Kafka's replica.lag.time.max.ms, 30 s), and **rejoins** once its log end reaches the high
  watermark and the start of the leader's epoch (so it holds everything committed and nothing
  of an older leader's uncommitted tail).
- **`acks=all`** is answered once the high watermark passes the batch; below
  `min.insync.replicas` in-sync replicas a write is refused before it is appended.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mqcore.errors import InvalidConfigError
from mqcore.log import ReplicaLog

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
# rounds of OffsetsForLeaderEpoch one truncation may take: each round drops at least one of
# the follower's epochs, so a log with more epochs than this is truncated in later fetches
MAX_TRUNCATION_ROUNDS = 64
REPLICA_LAG_TIME_MAX_MS = 30_000  # Kafka's replica.lag.time.max.ms default


def truncation_offset(
    follower: ReplicaLog, leader_epoch: int, leader_end_offset: int
) -> tuple[int, bool]:
    """Where `follower` truncates given the leader's answer (leader_epoch, leader_end_offset)
    to "where does my latest epoch end?": (offset, done). Not done: truncate there and ask
    again with the follower's new latest epoch (Kafka's getOffsetTruncationState)."""
    end = follower.log_end_offset
    if leader_end_offset == UNDEFINED_OFFSET:  # the leader knows no such epoch: keep what is
        return min(follower.high_watermark, end), True  # committed, Kafka's fallback
    if leader_epoch == UNDEFINED_EPOCH:
        return min(leader_end_offset, end), True
    own_epoch, own_end = follower.end_offset_for_epoch(leader_epoch)
    if own_epoch == UNDEFINED_EPOCH or own_end == UNDEFINED_OFFSET:
        return min(leader_end_offset, end), True  # it never saw that epoch: the leader's end
    if own_epoch != leader_epoch:  # its nearest lower epoch: cut there, ask again
        return min(own_end, end), False
    return min(leader_end_offset, own_end, end), True


def truncate_to_leader(
    follower: ReplicaLog, offsets_for_leader_epoch: Callable[[int], tuple[int, int]]
) -> int:
    """Before a follower fetches from a new leader: cut its log where it diverges from the
    leader's. `offsets_for_leader_epoch(epoch)` asks the leader (OffsetForLeaderEpoch) and
    returns its (epoch, end offset). A follower without epochs keeps its high watermark.
    Returns the follower's log end offset after truncation."""
    for _ in range(MAX_TRUNCATION_ROUNDS):
        latest = follower.latest_epoch
        if latest is None:
            if follower.log_end_offset > follower.high_watermark:
                follower.truncate_to(follower.high_watermark)
            return follower.log_end_offset
        leader_epoch, leader_end = offsets_for_leader_epoch(latest)
        offset, done = truncation_offset(follower, leader_epoch, leader_end)
        if offset < follower.log_end_offset:
            follower.truncate_to(offset)
        if done:
            return follower.log_end_offset
    return follower.log_end_offset


def fetch_from_leader(
    follower: ReplicaLog, fetch: Callable[[int], bytes], *, max_rounds: int = 1
) -> int:
    """Copy what the leader has past the follower's log end: `fetch(offset)` returns whole
    batches from that offset (the records of a Fetch with replica_id set, read to the
    leader's log end), appended as they are. Returns how many records were appended."""
    copied = 0
    for _ in range(max_rounds):
        data = fetch(follower.log_end_offset)
        if not data:
            break
        copied += follower.append_as_follower(data).records
    return copied


@dataclass
class _Follower:
    log_end: int = UNDEFINED_OFFSET  # unknown until it fetches
    caught_up_ms: int = 0  # when a fetch last reached the leader's log end
    log_start: int = UNDEFINED_OFFSET  # its log start, as its last fetch said (v5+)


class LeaderPartition:
    """The leader's side of one partition for one leader epoch: make one when this broker
    becomes the partition's leader (it records the epoch's start in the log), feed it every
    follower fetch, and read the high watermark and the ISR changes it asks for."""

    def __init__(
        self,
        log: ReplicaLog,
        leader_id: int,
        leader_epoch: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        now_ms: int,
        *,
        replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS,
    ):
        self.log = log
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.isr = set(isr)
        if leader_id not in self.isr:
            raise InvalidConfigError(f"leader {leader_id} is not in the ISR {sorted(self.isr)}")
        self.lag_ms = replica_lag_time_max_ms
        log.lead(leader_epoch)  # the epoch starts at the current log end
        self.epoch_start = log.log_end_offset
        # followers in the ISR count as caught up now: a new leader gives each a full lag
        # time to fetch before it may drop them (Kafka resets lastCaughtUpTime the same way)
        self.followers = {r: _Follower(caught_up_ms=now_ms) for r in self.replicas
                          if r != leader_id}  # fmt: skip

    def follower_fetched(
        self, replica: int, fetch_offset: int, now_ms: int, log_start: int = UNDEFINED_OFFSET
    ) -> int:
        """A follower fetched from `fetch_offset`: everything before it is on its log, which
        starts at `log_start`. Returns the high watermark after it (it may have advanced)."""
        f = self.followers.get(replica)
        if f is None:
            raise InvalidConfigError(f"broker {replica} is not a replica of {self.log.topic}")
        f.log_end = fetch_offset
        f.log_start = log_start
        if fetch_offset >= self.log.log_end_offset:
            f.caught_up_ms = now_ms
        return self.advance_high_watermark()

    def advance_high_watermark(self) -> int:
        """The smallest log end in the ISR, the leader's own included; never moves back."""
        ends = [self.log.log_end_offset]
        ends += [self.followers[r].log_end for r in self.isr if r != self.leader_id]
        low = min(ends)
        if low > self.log.high_watermark:
            self.log.update_high_watermark(low)
        return self.log.high_watermark

    def low_watermark(self) -> int:
        """The smallest log start in the ISR, the leader's own included (Kafka's low
        watermark: what DeleteRecords waits for); a follower that has not said counts as 0."""
        starts = [self.log.log_start_offset]
        starts += [max(self.followers[r].log_start, 0) for r in self.isr if r != self.leader_id]
        return min(starts)

    def lagging(self, now_ms: int) -> set[int]:
        """In-sync followers that have not caught up for the lag time: the ISR to shrink."""
        return {r for r in self.isr if r != self.leader_id
                and now_ms - self.followers[r].caught_up_ms > self.lag_ms}  # fmt: skip

    def may_join(self) -> set[int]:
        """Out-of-sync followers whose log end reached the high watermark and this epoch's
        start: the ISR to expand."""
        floor = max(self.log.high_watermark, self.epoch_start)
        return {r for r, f in self.followers.items()
                if r not in self.isr and f.log_end >= floor}  # fmt: skip

    def set_isr(self, isr: Iterable[int]) -> int:
        """The ISR as written to the cluster's state (after a shrink or expansion took); the
        high watermark may advance once slow members are gone."""
        new = set(isr)
        if self.leader_id not in new:
            raise InvalidConfigError(f"leader {self.leader_id} left out of the ISR {sorted(new)}")
        self.isr = new
        return self.advance_high_watermark()

    def enough_replicas(self, min_insync_replicas: int) -> bool:
        """Whether an acks=all write may be taken: at least `min_insync_replicas` in sync
        (Kafka answers NOT_ENOUGH_REPLICAS otherwise, and appends nothing)."""
        return len(self.isr) >= min_insync_replicas

    def committed(self, last_offset: int) -> bool:
        """Whether an acks=all write ending at `last_offset` may be acknowledged."""
        return self.log.high_watermark > last_offset
