"""The controller's placement and election decisions (mqcore.cluster.assign) against Kafka's
own expected answers (its AdminTest and AdminRackAwareTest cases) and, for every broker count,
rack layout and replication factor, against the properties those answers have."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mqcore.cluster.assign import NO_LEADER, assign_replicas, elect_leader, rack_alternated
from mqcore.errors import InvalidConfigError

RACKS = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}


def test_kafkas_rack_unaware_answer() -> None:
    """AdminTest.testReplicaAssignment: 5 brokers, 10 partitions, 3 replicas, start 0."""
    got = assign_replicas({b: None for b in range(5)}, 10, 3, start=0, shift=0)
    assert got == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
        5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2],
    }  # fmt: skip


def test_kafkas_rack_aware_answer() -> None:
    """AdminRackAwareTest.testGetRackAlternatedBrokerListAndAssignReplicasToBrokers."""
    assert rack_alternated(RACKS) == [0, 3, 1, 5, 4, 2]
    assert rack_alternated({b: r for b, r in RACKS.items() if b != 5}) == [0, 3, 1, 4, 2]
    got = assign_replicas(RACKS, 7, 3, start=0, shift=0)
    assert got == {0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0],
                   5: [2, 0, 3], 6: [0, 4, 2]}  # fmt: skip


@pytest.mark.parametrize("brokers", [1, 2, 3, 5, 6, 9])
@pytest.mark.parametrize("racks", [0, 2, 3])
def test_every_placement_spreads_leaders_and_racks(brokers: int, racks: int) -> None:
    """For random starts: each partition's replicas are distinct brokers; with racks, they
    cover as many racks as they can; a multiple of the broker count of partitions gives each
    broker the same number of leaders and of replicas."""
    rng = random.Random(brokers * 10 + racks)
    layout = {b: (f"r{b % racks}" if racks else None) for b in range(brokers)}
    rack_count = len({r for r in layout.values()}) if racks else 0
    for rf in range(1, brokers + 1):
        for _ in range(5):
            got = assign_replicas(layout, brokers * 4, rf, rng=rng)
            assert sorted(got) == list(range(brokers * 4))
            for replicas in got.values():
                assert len(replicas) == rf == len(set(replicas))
                if racks:
                    assert len({layout[b] for b in replicas}) == min(rf, rack_count)
            leaders = Counter(r[0] for r in got.values())
            assert set(leaders.values()) == {4}
            if not racks or brokers % max(rack_count, 1) == 0:
                assert set(Counter(b for r in got.values() for b in r).values()) == {4 * rf}


def test_placement_refusals() -> None:
    with pytest.raises(InvalidConfigError, match="replication factor 4 is larger than the 3"):
        assign_replicas({1: None, 2: None, 3: None}, 1, 4)
    with pytest.raises(InvalidConfigError, match=r"brokers \[2\] have no rack"):
        assign_replicas({1: "a", 2: None}, 1, 1)
    for partitions, rf in ((0, 1), (1, 0)):
        with pytest.raises(InvalidConfigError, match="must be positive"):
            assign_replicas({1: None}, partitions, rf)


def test_a_leader_is_the_first_live_in_sync_replica() -> None:
    assert elect_leader([3, 1, 2], [1, 2, 3], {1, 2, 3}) == 3  # the preferred leader
    assert elect_leader([3, 1, 2], [1, 2], {1, 2, 3}) == 1  # 3 is out of sync
    assert elect_leader([3, 1, 2], [2, 3], {1, 2}) == 2  # 3 is dead, 1 out of sync
    assert elect_leader([3, 1, 2], [3], {1, 2}) == NO_LEADER  # clean: nobody may lead
    assert elect_leader([3, 1, 2], [3], {1, 2}, unclean=True) == 1
    assert elect_leader([3, 1, 2], [3], set(), unclean=True) == NO_LEADER
