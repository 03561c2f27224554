"""The controller's decisions that need no I/O: where a new topic's replicas go, and which
replica leads a partition whose leader is gone. Both follow Kafka's, so a cluster of ours
places and elects as a ZooKeeper-era Kafka cluster with the same brokers would (its
AdminUtils.assignReplicasToBrokers and the controller's offline-partition election).

Placement, Kafka's: the brokers in a fixed order (alternating racks when every broker has
one), partition p's first replica at (p + start) mod n, each further replica a shift away, the
shift growing by one every n partitions, so leaders and followers spread evenly and no two
partitions share a follower set more than needed. With racks, a further replica skips brokers
of racks the partition already uses until every rack has one.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

from mqcore.errors import InvalidConfigError, InvalidReplicaAssignmentError

NO_LEADER = -1
# Kafka's offsets.topic.replication.factor and share.coordinator.state.topic.replication.factor:
# the replicas of an internal topic (a coordinator's), at most the live brokers
INTERNAL_REPLICATION_FACTOR = 3


def state_topic_configs(segment_bytes: int) -> dict[str, str]:
    """Kafka's settings of an internal state topic as the cluster makes one (the offsets,
    share-group and transaction state): compacted, without mqcore's query indexes, segments of
    `segment_bytes`."""
    return {"cleanup.policy": "compact", "unique.ids": "false", "key.index": "false",
            "segment.bytes": str(segment_bytes)}  # fmt: skip


def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """Brokers ordered rack by rack in turn (racks by name, brokers by ID within a rack):
    0, 3, 1, 5, 4, 2 for {0: r1, 1: r3, 2: r3, 3: r2, 4: r2, 5: r1}."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(racks):
        by_rack.setdefault(racks[broker], []).append(broker)
    columns = [by_rack[r] for r in sorted(by_rack)]
    return [col[i] for i in range(max(map(len, columns), default=0)) for col in columns
            if i < len(col)]  # fmt: skip


def placement_order(brokers: Mapping[int, str | None]) -> list[int]:
    """The brokers in the order placement walks them: rack by rack in turn when every broker
    has a rack, by ID otherwise."""
    if brokers and all(r is not None for r in brokers.values()):
        return rack_alternated({b: r for b, r in brokers.items() if r is not None})
    return sorted(brokers)


def _shifted(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(
    brokers: Mapping[int, str | None],
    partitions: int,
    replication_factor: int,
    *,
    start: int | None = None,
    shift: int | None = None,
    first_partition: int = 0,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Replicas of partitions first_partition.. first_partition+partitions-1 over `brokers`
    (node ID -> rack or None), the preferred leader first. `start` and `shift` default to
    random ones, as Kafka's do, so topics created one after another do not all lead on the
    same broker; tests fix them. InvalidConfigError for a replication factor the brokers
    cannot hold, or racks given for some brokers only."""
    if partitions <= 0:
        raise InvalidConfigError(f"partitions must be positive: {partitions}")
    if replication_factor <= 0:
        raise InvalidConfigError(f"replication factor must be positive: {replication_factor}")
    if replication_factor > len(brokers):
        raise InvalidConfigError(
            f"replication factor {replication_factor} is larger than the {len(brokers)} "
            "live brokers"
        )
    with_rack = [b for b, r in brokers.items() if r is not None]
    if with_rack and len(with_rack) != len(brokers):
        no_rack = sorted(b for b, r in brokers.items() if r is None)
        raise InvalidConfigError(
            f"brokers {no_rack} have no rack while others do: give every broker a rack, or none"
        )
    rng = rng or random.Random()
    order = placement_order(brokers)
    n = len(order)
    start = rng.randrange(n) if start is None else start
    shift = rng.randrange(n) if shift is None else shift
    racks = {b: brokers[b] for b in order}
    rack_count = len(set(racks.values())) if with_rack else 0
    out: dict[int, list[int]] = {}
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [order[first]]
        if not with_rack:
            replicas += [order[_shifted(first, shift, j, n)] for j in range(replication_factor - 1)]
        else:
            used_racks, k = {racks[order[first]]}, 0
            while len(replicas) < replication_factor:
                broker = order[_shifted(first, shift * rack_count, k, n)]
                k += 1
                rack_ok = racks[broker] not in used_racks or len(used_racks) == rack_count
                if rack_ok and broker not in replicas:
                    replicas.append(broker)
                    used_racks.add(racks[broker])
        out[p] = replicas
    return out


def elect_leader(
    replicas: Sequence[int], isr: Sequence[int], live: set[int] | frozenset[int], *,
    unclean: bool = False,
) -> int:  # fmt: skip
    """The leader of a partition whose leader must change: the first replica, in assignment
    order (the preferred leader first), that is alive and in sync. None such: NO_LEADER, or
    with `unclean` (Kafka's unclean.leader.election.enable, off by default) the first live
    replica, which may lack acknowledged writes."""
    for r in replicas:
        if r in live and r in isr:
            return r
    if unclean:
        for r in replicas:
            if r in live:
                return r
    return NO_LEADER


def checked_assignment(
    assignment: Mapping[int, Sequence[int]],
    brokers: Collection[int],
    first_partition: int = 0,
    replication_factor: int | None = None,
) -> dict[int, list[int]]:
    """A replica assignment a client gave (CreateTopics, CreatePartitions), checked as Kafka
    checks it: partitions first_partition.. in a row, each with distinct replicas, all
    registered brokers, one replication factor (`replication_factor` if given: the topic's).
    InvalidReplicaAssignmentError naming what is wrong."""
    parts = sorted(assignment)
    if not parts or parts != list(range(first_partition, first_partition + len(parts))):
        raise InvalidReplicaAssignmentError(
            f"the assignment must give partitions {first_partition}.. in a row, not {parts}"
        )
    out: dict[int, list[int]] = {}
    for p in parts:
        replicas = list(assignment[p])
        if not replicas or len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(
                f"partition {p}: replicas must be distinct and at least one: {replicas}"
            )
        unknown = sorted(set(replicas) - set(brokers))
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"partition {p}: brokers {unknown} are not registered in the cluster"
            )
        if replication_factor is None:  # the first partition's, for the others
            replication_factor = len(replicas)
        if len(replicas) != replication_factor:
            raise InvalidReplicaAssignmentError(
                f"partition {p} has {len(replicas)} replicas, the topic {replication_factor}"
            )
        out[p] = replicas
    return out
