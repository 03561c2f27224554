"""KIP-848's consumer group protocol over the wire (`mqcore serve`, server/consumergroups.py).

First the coordinator itself, driven with Kafka's request types (kio) and a test clock: each
transition of the group and member state machines (docs/server.md "The consumer protocol"),
the epochs, Kafka's error codes, static members, the assignors, and what the APIs shared with
the classic protocol do with such groups. Then unmodified clients: confluent-kafka with
`group.protocol=consumer` in three OS processes, one SIGKILLed mid-way, nothing lost and
nothing twice but what the killed member processed after its last commit; a static member
back after a restart; the admin client's view."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from groupmembers import WAIT, Child, wait_until  # noqa: E402
from kafkaclients import KioWire  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

from mqcore.server import Server  # noqa: E402
from mqcore.server.common import Session, topic_id  # noqa: E402
from mqcore.server.consumergroups import range_assignor, uniform_assign  # noqa: E402
from mqcore.server.delayed import resolve  # noqa: E402
from mqcore.server.groups import GroupCoordinator  # noqa: E402
from mqcore.server.protocol import api, build  # noqa: E402

HB = load_payload_module(68, 1, EntityType.request)
SESSION = 45.0  # the coordinator's session timeout in these tests (Kafka's default)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Member:
    """One KIP-848 member talking to a GroupCoordinator as librdkafka would: its ID, epoch
    and what it owns, updated from each answer."""

    def __init__(self, coord: GroupCoordinator, group: str = "g", instance: str | None = None):
        self.coord, self.group, self.instance = coord, group, instance
        self.session = Session(("127.0.0.1", 40000), "cli")
        self.member_id = uuid.uuid4().hex
        self.epoch = 0
        self.owned: dict[str, set[int]] = {}

    def call(self, key: int, version: int, /, **values: Any) -> Any:
        found = api(key, version)
        assert found is not None
        body = build(found.request, **values)
        consumer = {68: self.coord.consumer.heartbeat, 69: self.coord.consumer.describe}
        handler = consumer.get(key) or self.coord.handlers()[key]
        return resolve(handler(found, body, self.session))

    def beat(self, *, topics: tuple[str, ...] | None = None, owned: bool = False,
             version: int = 1, **extra: Any) -> Any:  # fmt: skip
        """A heartbeat: `topics` (a new subscription; a join sends one), `owned` (report what
        it owns, as after a revocation or in a full request)."""
        joining = self.epoch == 0
        values: dict[str, Any] = dict(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch,
            instance_id=self.instance if joining else None,
            rebalance_timeout=datetime.timedelta(seconds=30 if joining else -0.001),
            subscribed_topic_names=topics, subscribed_topic_regex=None, server_assignor=None,
            topic_partitions=self.wire_owned() if owned or joining else None,
        )  # fmt: skip
        values.update(extra)
        r = self.call(68, version, **values)
        if r.error_code == ErrorCode.none:
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.owned = self.named(r.assignment.topic_partitions)
        return r

    def join(self, *topics: str, **extra: Any) -> Any:
        self.epoch, self.owned = 0, {}
        return self.beat(topics=topics, **extra)

    def leave(self, epoch: int = -1) -> Any:
        return self.call(68, 1, group_id=self.group, member_id=self.member_id,
                         member_epoch=epoch, instance_id=self.instance,
                         topic_partitions=None)  # fmt: skip

    def wire_owned(self) -> tuple[Any, ...]:
        return tuple(HB.TopicPartitions(topic_id=topic_id(t), partitions=tuple(sorted(ps)))
                     for t, ps in sorted(self.owned.items()) if ps)  # fmt: skip

    def named(self, listed: Any) -> dict[str, set[int]]:
        names = {topic_id(t): t for t in self.coord.store.topics()}
        return {names[tp.topic_id]: set(tp.partitions) for tp in listed}

    def revoke_to(self, keep: dict[str, set[int]]) -> Any:
        """Give up what the last answer no longer assigned (it already holds only `keep`)."""
        self.owned = {t: set(ps) for t, ps in keep.items()}
        return self.beat(owned=True)

    def parts(self, topic: str = "t") -> set[int]:
        return set(self.owned.get(topic, set()))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coord(store: mqcore.Store, clock: Clock) -> Iterator[GroupCoordinator]:
    store.create_topic("t", partitions=4)
    store.create_topic("u", partitions=2)
    c = GroupCoordinator(store, 7, "127.0.0.1", 9092, min_session_timeout=1.0, clock=clock,
                         consumer_session_timeout=SESSION)  # fmt: skip
    yield c
    c.close()


def described(coord: GroupCoordinator, group: str = "g", version: int = 1) -> Any:
    m = Member(coord)
    return m.call(69, version, group_ids=(group,), include_authorized_operations=False).groups[0]


def state(coord: GroupCoordinator, group: str = "g") -> str:
    return str(described(coord, group).group_state)


# -- the coordinator: joining, reconciling, epochs ----------------------------------------------


def test_the_first_member_gets_every_partition_at_the_group_epoch(
    coord: GroupCoordinator,
) -> None:
    """JOIN: epoch 0 makes the member and bumps the group epoch; its target is every
    partition and none is owned by another, so it has them all in the answer (ASSIGN)."""
    a = Member(coord)
    r = a.join("t")
    assert (r.error_code, r.member_id, r.member_epoch) == (ErrorCode.none, a.member_id, 1)
    assert r.heartbeat_interval == datetime.timedelta(seconds=5)
    assert a.parts() == {0, 1, 2, 3}
    assert state(coord) == "Stable"
    again = a.beat()
    assert (again.member_epoch, again.assignment) == (1, None)  # nothing new: not sent again


def test_a_second_member_waits_until_the_first_revoked(coord: GroupCoordinator) -> None:
    """REVOKE before ASSIGN: the newcomer gets the epoch but not the partitions still owned
    (UnreleasedPartitions); the first keeps its epoch and half its partitions until its
    heartbeat no longer lists the other half (UnrevokedPartitions, then REVOKED); then the
    newcomer's next heartbeat gets them (RELEASED) and the group is Stable."""
    a, b = Member(coord), Member(coord)
    a.join("t")
    r = b.join("t")
    assert (r.member_epoch, b.parts()) == (2, set())
    d = described(coord)
    assert (d.group_state, d.group_epoch, d.assignment_epoch) == ("Reconciling", 2, 2)
    r = a.beat()
    kept = a.parts()
    assert r.member_epoch == 1 and len(kept) == 2  # revoking the others, same epoch
    assert b.beat().assignment is None  # still owned by a
    assert a.revoke_to({"t": kept}).member_epoch == 2
    b.beat()
    assert b.parts() == {0, 1, 2, 3} - kept and b.epoch == 2
    assert state(coord) == "Stable"


def test_a_member_that_says_nothing_of_its_partitions_is_still_revoking(
    coord: GroupCoordinator,
) -> None:
    """A heartbeat without topic_partitions (null: unchanged) does not release anything."""
    a, b = Member(coord), Member(coord)
    a.join("t")
    b.join("t")
    a.beat()
    assert a.beat().member_epoch == 1
    assert described(coord).members[0].member_epoch == 1


def test_epochs_are_checked_as_kafka_checks_them(coord: GroupCoordinator) -> None:
    """FENCED_MEMBER_EPOCH for an epoch ahead, or behind by more than a lost answer; the
    previous epoch with no more partitions than it has is taken (the answer was lost);
    UNKNOWN_MEMBER_ID for a member not in the group; GROUP_ID_NOT_FOUND for no group."""
    a, b = Member(coord), Member(coord)
    a.join("t")
    b.join("t")
    a.beat()
    a.revoke_to({"t": a.parts()})  # now at epoch 2, previous 1
    assert a.beat(member_epoch=3).error_code == ErrorCode.fenced_member_epoch
    assert a.beat(member_epoch=1, owned=True).error_code == ErrorCode.none
    assert a.beat(member_epoch=1).error_code == ErrorCode.fenced_member_epoch  # owned unknown
    stranger = Member(coord)
    stranger.epoch = 1
    assert stranger.beat().error_code == ErrorCode.unknown_member_id
    lost = Member(coord, "nowhere")
    lost.epoch = 1
    assert lost.beat().error_code == ErrorCode.group_id_not_found


def test_a_silent_member_is_fenced_after_the_session_timeout(
    coord: GroupCoordinator, clock: Clock
) -> None:
    """SESSION_EXPIRED: a member silent for the session timeout is dropped and the others
    get its partitions at once (nothing of them is owned any more)."""
    a, b = Member(coord), Member(coord)
    a.join("t")
    b.join("t")
    a.revoke_to({"t": a.beat() and a.parts()})
    b.beat()
    assert len(b.parts()) == 2
    clock.now += SESSION - 1
    b.beat()
    clock.now += 2  # a's session is over, b's is not
    r = b.beat()
    assert r.member_epoch == 3 and b.parts() == {0, 1, 2, 3}
    assert a.beat().error_code == ErrorCode.unknown_member_id  # rejoins with epoch 0


def test_a_member_that_does_not_revoke_in_time_is_fenced(
    coord: GroupCoordinator, clock: Clock
) -> None:
    """REVOKE_TIMEOUT: partitions still owned a rebalance timeout (30 s here) after they were
    to be given up fence the member, so the others are not held up forever."""
    a, b = Member(coord), Member(coord)
    a.join("t")
    b.join("t")
    a.beat()  # UnrevokedPartitions
    for _ in range(3):
        clock.now += 10.5
        b.beat()
        a.beat()
    assert b.parts() == {0, 1, 2, 3}
    assert a.beat().error_code == ErrorCode.unknown_member_id


def test_a_member_that_leaves_hands_its_partitions_over(coord: GroupCoordinator) -> None:
    """LEFT (epoch -1): the member is gone at once, the answer says epoch -1."""
    a, b = Member(coord), Member(coord)
    a.join("t")
    b.join("t")
    a.revoke_to({"t": a.beat() and a.parts()})
    r = a.leave()
    assert (r.error_code, r.member_id, r.member_epoch) == (ErrorCode.none, a.member_id, -1)
    b.beat()
    assert b.parts() == {0, 1, 2, 3} and state(coord) == "Stable"
    assert a.leave().error_code == ErrorCode.unknown_member_id
    b.leave()
    assert state(coord) == "Empty"


def test_a_static_member_that_steps_out_is_replaced_without_a_rebalance(
    coord: GroupCoordinator, clock: Clock
) -> None:
    """STATIC_LEFT (epoch -2) keeps the member's partitions; its successor (same instance ID,
    new member ID) takes them at the same group epoch (STATIC_REPLACED); before that, a
    second instance is UNRELEASED_INSTANCE_ID, and the old member ID is FENCED_INSTANCE_ID."""
    a, b = Member(coord, instance="ia"), Member(coord)
    a.join("t")
    b.join("t")
    a.revoke_to({"t": a.beat() and a.parts()})
    b.beat()
    mine, epoch = a.parts(), described(coord).group_epoch
    twin = Member(coord, instance="ia")
    assert twin.join("t").error_code == ErrorCode.unreleased_instance_id
    assert a.leave(-2).member_epoch == -2
    b.beat()
    assert len(b.parts()) == 2  # nothing moved
    successor = Member(coord, instance="ia")
    r = successor.join("t")
    assert (r.error_code, successor.parts()) == (ErrorCode.none, mine)
    assert described(coord).group_epoch == epoch
    a.epoch = 2
    a.instance = "ia"
    assert a.beat(instance_id="ia").error_code == ErrorCode.fenced_instance_id


def test_a_static_member_that_never_comes_back_is_dropped_at_its_session_end(
    coord: GroupCoordinator, clock: Clock
) -> None:
    a, b = Member(coord, instance="ia"), Member(coord)
    a.join("t")
    b.join("t")
    a.revoke_to({"t": a.beat() and a.parts()})
    a.leave(-2)
    clock.now += SESSION - 1
    b.beat()
    assert len(b.parts()) == 2  # still a's
    clock.now += 2  # a's session is over, b's is not
    b.beat()
    assert b.parts() == {0, 1, 2, 3}


def test_new_partitions_and_topics_bump_the_group_epoch(
    coord: GroupCoordinator, store: mqcore.Store
) -> None:
    """TOPICS_CHANGED: partitions added to a subscribed topic, or a topic made that the
    member's regular expression matches, reach it at its next heartbeat."""
    a = Member(coord)
    a.join(subscribed_topic_regex="^(t|new)$")
    assert a.owned == {"t": {0, 1, 2, 3}}
    store.add_partitions("t", 6)
    assert a.beat().member_epoch == 2 and a.parts() == set(range(6))
    store.create_topic("new", partitions=1)
    store.create_topic("news", partitions=1)  # not matched: the whole name must match
    a.beat()
    assert a.owned == {"t": set(range(6)), "new": {0}}


def test_bad_heartbeats_get_kafkas_codes(coord: GroupCoordinator) -> None:
    a = Member(coord)
    invalid = ErrorCode.invalid_request
    assert a.beat(topics=("t",), member_id="").error_code == invalid
    assert a.beat(topics=("t",), group_id=" ").error_code == invalid
    assert (
        a.beat(topics=("t",), rebalance_timeout=datetime.timedelta(seconds=-0.001)).error_code
        == invalid
    )
    assert a.beat(topics=("t",), topic_partitions=None).error_code == invalid
    assert a.beat(topics=None).error_code == invalid
    assert a.beat(topics=("t",), member_epoch=-3).error_code == invalid
    assert a.beat(topics=("t",), server_assignor="sticky").error_code == (
        ErrorCode.unsupported_assignor
    )
    assert a.beat(topics=None, subscribed_topic_regex="(").error_code == (
        ErrorCode.invalid_regular_expression
    )
    v0 = Member(coord)
    v0.member_id = ""
    r = v0.beat(topics=("t",), version=0, subscribed_topic_regex=None)
    assert r.error_code == ErrorCode.none and r.member_id  # v0: the coordinator names it


def test_the_uniform_assignor_balances_and_keeps_what_it_can() -> None:
    two = uniform_assign({"a": frozenset({"t"}), "b": frozenset({"t"})}, {"t": 6}, {})
    assert sorted(len(x["t"]) for x in two.values()) == [3, 3]
    three = uniform_assign({m: frozenset({"t"}) for m in "abc"}, {"t": 6}, two)
    assert sorted(len(x.get("t", ())) for x in three.values()) == [2, 2, 2]
    moved = sum(len(two[m]["t"] - three[m].get("t", frozenset())) for m in "ab")
    assert moved == 2  # only what the newcomer needs
    mixed = uniform_assign({"a": frozenset({"t", "u"}), "b": frozenset({"t"})},
                           {"t": 2, "u": 2}, {})  # fmt: skip
    assert mixed["a"]["u"] == {0, 1} and len(mixed["b"].get("t", ())) == 2


def test_the_range_assignor_gives_consecutive_ranges_per_topic() -> None:
    got = range_assignor({"b": frozenset({"t"}), "a": frozenset({"t"})}, {"t": 5}, {})
    assert got == {"a": {"t": frozenset({0, 1, 2})}, "b": {"t": frozenset({3, 4})}}


# -- the APIs both protocols share --------------------------------------------------------------


def commit(
    m: Member, epoch: int, offset: int, version: int = 9, member_id: str | None = None
) -> Any:
    """OffsetCommit of t-0 at `offset` with `epoch` (the member epoch, -1: none)."""
    mod = load_payload_module(8, version, EntityType.request)
    part = mod.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
        committed_metadata="",
    )  # fmt: skip
    r = m.call(8, version, group_id=m.group, generation_id_or_member_epoch=epoch,
               member_id=m.member_id if member_id is None else member_id,
               group_instance_id=None, retention_time=datetime.timedelta(-1),
               topics=(mod.OffsetCommitRequestTopic(name="t", partitions=(part,)),))  # fmt: skip
    return r.topics[0].partitions[0].error_code


def fetch(m: Member, member_id: str | None, epoch: int) -> Any:
    mod = load_payload_module(9, 9, EntityType.request)
    group = mod.OffsetFetchRequestGroup(group_id=m.group, member_id=member_id, member_epoch=epoch,
                                        topics=None)  # fmt: skip
    return m.call(9, 9, groups=(group,), require_stable=False).groups[0]


def test_offsets_are_committed_with_the_member_epoch(
    coord: GroupCoordinator, store: mqcore.Store
) -> None:
    """OffsetCommit v9 from a member: its current epoch or STALE_MEMBER_EPOCH (a member that
    has not caught up may not commit); an unknown member UNKNOWN_MEMBER_ID; before v9
    UNSUPPORTED_VERSION; epoch -1 (an admin's commit) only while the group has no members.
    OffsetFetch v9 naming a member checks it the same way."""
    a = Member(coord)
    a.join("t")
    assert commit(a, 1, 5) == ErrorCode.none
    assert store.offset_store().committed("g", "t", 0).offset == 5
    assert commit(a, 2, 6) == ErrorCode.stale_member_epoch
    assert commit(a, 1, 6, member_id="other") == ErrorCode.unknown_member_id
    assert commit(a, 1, 6, version=8) == ErrorCode.unsupported_version
    assert commit(a, -1, 6, member_id="") == ErrorCode.unknown_member_id
    assert fetch(a, a.member_id, 1).error_code == ErrorCode.none
    assert fetch(a, a.member_id, 0).error_code == ErrorCode.stale_member_epoch
    assert fetch(a, "other", 1).error_code == ErrorCode.unknown_member_id
    got = fetch(a, None, -1)  # no member named: anyone may read
    assert got.topics[0].partitions[0].committed_offset == 5
    a.leave()
    assert commit(a, -1, 7, member_id="") == ErrorCode.none
    assert store.offset_store().committed("g", "t", 0).offset == 7


def test_a_group_name_is_of_one_protocol(coord: GroupCoordinator, store: mqcore.Store) -> None:
    """Kafka's answers, without its online migration: a classic group with members refuses a
    consumer-protocol join (GROUP_ID_NOT_FOUND, "not a consumer group"), a consumer group with
    members a classic JoinGroup (INCONSISTENT_GROUP_PROTOCOL); an Empty group of either kind
    takes the other. The store knows the name's type from the members (group_type)."""
    m = Member(coord, "kip848")
    m.join("t")
    assert store.group_type("kip848") == "consumer" and store.group_members("kip848") == 1
    join = load_payload_module(11, 5, EntityType.request)
    proto = (join.JoinGroupRequestProtocol(name="range", metadata=b""),)
    classic = dict(session_timeout=datetime.timedelta(seconds=6),
                   rebalance_timeout=datetime.timedelta(seconds=6), member_id="",
                   group_instance_id=None, protocol_type="consumer", protocols=proto)  # fmt: skip
    r = m.call(11, 5, group_id="kip848", **classic)
    assert r.error_code == ErrorCode.inconsistent_group_protocol
    r = m.call(11, 5, group_id="old", **classic)
    assert r.error_code == ErrorCode.member_id_required
    assert m.call(11, 5, group_id="old", **{**classic, "member_id": r.member_id}).error_code == 0
    other = Member(coord, "old")
    assert other.join("t").error_code == ErrorCode.group_id_not_found
    m.leave()
    assert m.call(11, 5, group_id="kip848", **classic).error_code == ErrorCode.member_id_required
    with store.share_consumer("shared", "t"):
        assert Member(coord, "shared").join("t").error_code == ErrorCode.group_id_not_found


def test_groups_are_listed_described_and_deleted_with_their_type(
    coord: GroupCoordinator, store: mqcore.Store
) -> None:
    """ListGroups shows a consumer-protocol group as type "consumer" (v5 filters by it and by
    its state); ConsumerGroupDescribe describes it (members, epochs, current and target
    assignments by topic ID and name) and answers GROUP_ID_NOT_FOUND for a classic group;
    DescribeGroups, as in Kafka, answers for it as for no classic group; DeleteGroups is
    NON_EMPTY_GROUP while it has members; OffsetDelete refuses a subscribed topic."""
    a = Member(coord)
    a.join("t", server_assignor="range")
    commit(a, 1, 3)
    listing = a.call(16, 5, states_filter=(), types_filter=("CONSUMER",)).groups
    assert [(g.group_id, g.group_type, g.protocol_type, g.group_state) for g in listing] == [
        ("g", "consumer", "consumer", "Stable")
    ]
    assert a.call(16, 5, states_filter=(), types_filter=("classic",)).groups == ()
    d = described(coord)
    (mem,) = d.members
    assert (d.error_code, d.group_epoch, d.assignor_name) == (ErrorCode.none, 1, "range")
    assert (mem.member_id, mem.member_epoch, mem.subscribed_topic_names) == (a.member_id, 1, ("t",))
    assert [
        (tp.topic_id, tp.topic_name, tp.partitions) for tp in mem.assignment.topic_partitions
    ] == [(topic_id("t"), "t", (0, 1, 2, 3))]
    assert mem.target_assignment == mem.assignment and mem.member_type == 1
    commit(Member(coord, "classic"), -1, 1)
    assert described(coord, "classic").error_code == ErrorCode.group_id_not_found
    classic_view = a.call(15, 6, groups=("g",), include_authorized_operations=False).groups[0]
    assert (classic_view.group_state, classic_view.error_code) == (
        "Dead",
        ErrorCode.group_id_not_found,
    )
    od = load_payload_module(47, 0, EntityType.request)
    topics = (
        od.OffsetDeleteRequestTopic(
            name="t", partitions=(od.OffsetDeleteRequestPartition(partition_index=0),)
        ),
    )
    r = a.call(47, 0, group_id="g", topics=topics)
    assert r.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic
    assert a.call(42, 2, groups_names=("g",)).results[0].error_code == ErrorCode.non_empty_group
    a.leave()
    assert a.call(42, 2, groups_names=("g",)).results[0].error_code == ErrorCode.none
    assert (
        store.group_lag("g") == {} and described(coord).error_code == ErrorCode.group_id_not_found
    )


def test_heartbeats_and_describes_need_the_group_grants(store: mqcore.Store, clock: Clock) -> None:
    """With ACLs, a heartbeat needs `read` on the group and ConsumerGroupDescribe `describe`
    (GROUP_AUTHORIZATION_FAILED), as the classic APIs do."""
    from mqcore.server.auth import Access

    store.create_topic("t", partitions=1)
    coord = GroupCoordinator(store, 7, "127.0.0.1", 9092, clock=clock,
                             access=lambda session: Access(Nobody()))  # fmt: skip
    try:
        m = Member(coord)
        assert m.join("t").error_code == ErrorCode.group_authorization_failed
        assert described(coord).error_code == ErrorCode.group_authorization_failed
        assert store.group_type("g") is None
    finally:
        coord.close()


def test_describe_answers_the_authorized_operations_when_asked(
    coord: GroupCoordinator,
) -> None:
    """ConsumerGroupDescribe's authorized_operations: every operation Kafka has on a group
    (READ 3, DELETE 6, DESCRIBE 8) without ACLs when asked, Kafka's "not asked" otherwise."""
    m = Member(coord)
    assert m.join("t").error_code == ErrorCode.none
    asked = m.call(69, 1, group_ids=("g",), include_authorized_operations=True).groups[0]
    assert asked.authorized_operations == (1 << 3) | (1 << 6) | (1 << 8)
    assert described(coord).authorized_operations == -(2**31)


class Nobody:
    """An authorizer that grants nothing."""

    def allows(self, principal: str, operation: str, topic: str) -> bool:
        return False

    def allows_group(self, principal: str, operation: str, group: str) -> bool:
        return False


# -- real clients: confluent-kafka with group.protocol=consumer ---------------------------------

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

FAST_SESSION = 6.0  # the coordinator's session timeout for the real clients' tests
FAST_HEARTBEAT = 0.5  # and the heartbeat interval it tells them


@pytest.fixture
def server(store: mqcore.Store) -> Iterator[Server]:
    """`mqcore serve` over the test's store, its consumer groups' session and heartbeat
    short (Kafka's 45 s and 5 s would only slow the tests)."""
    with Server(store, listen="127.0.0.1:0") as srv:
        groups = srv.broker.groups.consumer
        groups.session_timeout, groups.heartbeat_interval = FAST_SESSION, FAST_HEARTBEAT
        yield srv


def produce(
    store: mqcore.Store, topic: str, partitions: int, per: int, tag: str
) -> set[tuple[int, int]]:
    """`per` messages appended to each partition; their (partition, offset)."""
    out = set()
    for p in range(partitions):
        start = store.end_offset(topic, p)
        store.append_batch(topic, [f"{tag}-{p}-{i}".encode() for i in range(per)], partition=p)
        out.update((p, start + i) for i in range(per))
    return out


def committed(store: mqcore.Store, group: str) -> dict[int, int]:
    return {lag.partition: lag.committed for lag in store.group_lag(group).get(group, [])}


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_three_consumer_protocol_processes_survive_a_sigkill(
    server: Server, store: mqcore.Store
) -> None:
    """Three confluent-kafka consumers (group.protocol=consumer) in three OS processes share
    six partitions; one, which stopped committing after its first messages, is SIGKILLed
    mid-way. Every message produced is processed; the only ones processed twice are those the
    killed member processed at or after its partitions' last committed offsets, each exactly
    twice, redelivered to the member that took the partition over after its session ended."""
    store.create_topic("six", partitions=6)
    group = "procs848"
    victim = Child(server.bootstrap, group, "six", 0, "consumer", "12")
    survivors = [Child(server.bootstrap, group, "six", 0, "consumer") for _ in range(2)]
    children = [victim, *survivors]
    try:

        def balanced(kids: list[Child]) -> bool:
            sets = [k.assigned() for k in kids]
            return all(sets) and sum(map(len, sets)) == len(set().union(*sets)) == 6

        wait_until(lambda: balanced(children), why="three members share six partitions")
        produced = produce(store, "six", 6, 40, "one")
        wait_until(lambda: len(victim.messages()) >= 20, why="the victim is mid-way")
        os.kill(victim.proc.pid, signal.SIGKILL)
        assert victim.proc.wait(WAIT) == -signal.SIGKILL
        at_kill = committed(store, group)  # its partitions are its own until its session ends
        wait_until(lambda: balanced(survivors), why="the survivors took its partitions over")
        produced |= produce(store, "six", 6, 10, "two")
        ends = {p: store.end_offset("six", p) for p in range(6)}
        wait_until(lambda: committed(store, group) == ends, why="everything committed")
    finally:
        for k in children:
            k.close()
    seen = [(p, o) for k in children for p, o, _ in k.messages()]
    theirs = {(p, o) for p, o, _ in victim.messages()}
    twice = {(p, o) for p, o in theirs if o >= at_kill.get(p, 0)}
    assert set(seen) == produced  # nothing lost
    assert sorted(seen) == sorted([*produced, *twice])  # those twice, the rest once
    assert twice and twice <= {(p, o) for k in survivors for p, o, _ in k.messages()}
    assert all(not ln.startswith(("error", "commit-failed")) for k in survivors for ln in k.lines)
    print(f"produced {len(produced)}, processed {len(seen)}, twice {len(twice)}: "
          f"{sorted(twice)}; the victim's commits at its kill {at_kill}")  # fmt: skip


def poll_until(consumers: list[Any], done: Any, why: str) -> None:
    """Poll every consumer (0.1 s each) until `done()`, within the bounded wait."""
    wait_until(lambda: [c.poll(0.1) for c in consumers] and done(), why=why)


def test_a_static_member_back_from_a_restart_has_its_partition_and_nothing_moves(
    server: Server, store: mqcore.Store
) -> None:
    """librdkafka's static member leaves with epoch -2 on close; its successor under the same
    group.instance.id gets the same partition at the same group epoch, and the other member's
    partition never moved."""
    store.create_topic("st", partitions=2)
    base = {"bootstrap.servers": server.bootstrap, "group.id": "sg848",
            "group.protocol": "consumer", "enable.auto.commit": False}  # fmt: skip
    a = ck.Consumer({**base, "group.instance.id": "ia"})
    b = ck.Consumer({**base, "group.instance.id": "ib"})
    open_ = [a, b]
    try:
        a.subscribe(["st"])
        b.subscribe(["st"])
        poll_until([a, b], lambda: len(a.assignment()) == len(b.assignment()) == 1, "shared")
        mine, theirs = a.assignment(), b.assignment()
        epoch = described(server.broker.groups, "sg848").group_epoch
        open_.remove(a)
        a.close()
        d = described(server.broker.groups, "sg848")
        assert sorted(m.member_epoch for m in d.members)[0] == -2 and d.group_epoch == epoch
        a2 = ck.Consumer({**base, "group.instance.id": "ia"})
        open_.append(a2)
        a2.subscribe(["st"])
        poll_until([a2], lambda: a2.assignment() == mine, "the successor has its partition")
        assert described(server.broker.groups, "sg848").group_epoch == epoch
        b.poll(0.1)
        assert b.assignment() == theirs
    finally:
        for c in open_:
            c.close()


def test_the_admin_client_lists_and_describes_consumer_protocol_groups(
    server: Server, store: mqcore.Store
) -> None:
    """confluent-kafka's AdminClient: ListGroups gives the group's type (CONSUMER), and
    DescribeConsumerGroups (ConsumerGroupDescribe first, DescribeGroups for classic groups)
    shows each group with its members, whichever its protocol."""
    store.create_topic("ad", partitions=3)
    base = {"bootstrap.servers": server.bootstrap, "enable.auto.commit": False}
    new = ck.Consumer({**base, "group.id": "new", "group.protocol": "consumer"})
    old = ck.Consumer({**base, "group.id": "old", "session.timeout.ms": 6000,
                       "heartbeat.interval.ms": 300})  # fmt: skip
    ca = AdminClient({"bootstrap.servers": server.bootstrap})
    try:
        for c in (new, old):
            c.subscribe(["ad"])
        poll_until([new, old], lambda: len(new.assignment()) == len(old.assignment()) == 3, "in")
        listed = {g.group_id: g for g in ca.list_consumer_groups().result(WAIT).valid}
        assert listed["new"].type == ck.ConsumerGroupType.CONSUMER
        assert listed["old"].type == ck.ConsumerGroupType.CLASSIC
        got = {k: f.result(WAIT) for k, f in ca.describe_consumer_groups(["new", "old"]).items()}
        for name in ("new", "old"):
            assert got[name].state == ck.ConsumerGroupState.STABLE
            (member,) = got[name].members
            assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1, 2]
        assert got["new"].type == ck.ConsumerGroupType.CONSUMER
    finally:
        new.close()
        old.close()


def test_metadata_names_topics_by_id(server: Server, store: mqcore.Store) -> None:
    """KIP-848 assignments name topics by ID, which a client resolves with Metadata v10+
    (KIP-516): every topic has one (common.topic_id, the same across restarts), a topic is
    found by it, and an ID of no topic is UNKNOWN_TOPIC_ID."""
    store.create_topic("byid", partitions=2)
    md = load_payload_module(3, 12, EntityType.request)
    wire = KioWire(server.address)
    try:
        named = wire.call(3, 12, topics=(md.MetadataRequestTopic(topic_id=None, name="byid"),),
                          allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False)  # fmt: skip
        assert named.topics[0].topic_id == topic_id("byid")
        nobody = uuid.uuid4()
        asked = tuple(md.MetadataRequestTopic(topic_id=t, name=None)
                      for t in (topic_id("byid"), nobody))  # fmt: skip
        r = wire.call(3, 12, topics=asked, allow_auto_topic_creation=False,
                      include_topic_authorized_operations=False)  # fmt: skip
        got = {t.topic_id: (t.error_code, t.name, len(t.partitions)) for t in r.topics}
        assert got == {topic_id("byid"): (ErrorCode.none, "byid", 2),
                       nobody: (ErrorCode.unknown_topic_id, None, 0)}  # fmt: skip
    finally:
        wire.close()


def test_the_consumer_protocols_timeouts_are_server_settings(store: mqcore.Store) -> None:
    """Server(group_consumer_session_timeout=, group_consumer_heartbeat_interval=), as
    `mqcore serve --group-consumer-session-timeout/--group-consumer-heartbeat-interval`, reach
    the coordinator; a value that cannot work is refused before anything starts."""
    from mqcore.errors import InvalidConfigError

    with Server(store, "127.0.0.1:0", group_consumer_session_timeout=12.5,
                group_consumer_heartbeat_interval=1.5) as srv:  # fmt: skip
        assert srv.broker is not None
        consumer = srv.broker.groups.consumer
        assert (consumer.session_timeout, consumer.heartbeat_interval) == (12.5, 1.5)
    with pytest.raises(InvalidConfigError, match="group_consumer_session_timeout"):
        Server(store, "127.0.0.1:0", group_consumer_session_timeout=0)
