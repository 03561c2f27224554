"""Consumer groups over the wire (`mqcore serve`, server/groups.py).

First the coordinator itself, driven with Kafka's own request types (kio) and a test clock:
the states, generations and error codes of the classic protocol, session and rebalance
timeouts, static membership, and the offset APIs against the store's `__consumer_offsets`.
Then unmodified clients: confluent-kafka (librdkafka), kafka-python and aiokafka groups consume
every message once with commits after processing; committed offsets survive a server restart;
lag agrees between the admin clients and `store.group_lag()`; AdminClient describes, lists and
deletes groups; and a group of three OS processes loses a member to SIGKILL and rebalances
after its session timeout with nothing lost (slow)."""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from groupmembers import WAIT, Child, wait_until  # noqa: E402
from kafkaclients import KioWire  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

from mqcore.errors import GroupNotEmptyError, GroupTypeError, InvalidGroupError  # noqa: E402
from mqcore.server import Server  # noqa: E402
from mqcore.server.broker import Session  # noqa: E402
from mqcore.server.delayed import resolve  # noqa: E402
from mqcore.server.groups import GroupCoordinator  # noqa: E402
from mqcore.server.protocol import api, build  # noqa: E402


def subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0, written from Kafka's schema: int16 version, int32
    topic count, int16-length topic names, int32 user-data length (-1: null)."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Client:
    """Requests to a GroupCoordinator as one connection would send them."""

    def __init__(self, coord: GroupCoordinator, client_id: str = "cli"):
        self.coord = coord
        self.session = Session(("127.0.0.1", 40000), client_id)

    def call(self, key: int, version: int, /, **values: Any) -> Any:
        found = api(key, version)
        assert found is not None
        # a JoinGroup or SyncGroup that waits is a Delayed: waited for here, as Broker.handle does
        return resolve(
            self.coord.handlers()[key](found, build(found.request, **values), self.session)
        )

    def join(
        self,
        group: str,
        member_id: str = "",
        *,
        instance: str | None = None,
        topics: tuple[str, ...] = ("t",),
        protocols: tuple[str, ...] = ("range",),
        session: float = 6.0,
        rebalance: float = 20.0,
        version: int = 5,
    ) -> Any:
        m = load_payload_module(11, version, EntityType.request)
        protos = tuple(
            m.JoinGroupRequestProtocol(name=n, metadata=subscription(*topics)) for n in protocols
        )
        return self.call(
            11,
            version,
            group_id=group,
            session_timeout=datetime.timedelta(seconds=session),
            rebalance_timeout=datetime.timedelta(seconds=rebalance),
            member_id=member_id,
            group_instance_id=instance,
            protocol_type="consumer",
            protocols=protos,
        )

    def join_new(self, group: str, **kw: Any) -> Any:
        """A new dynamic member's join (KIP-394): MEMBER_ID_REQUIRED, then the rejoin."""
        first = self.join(group, **kw)
        assert first.error_code == ErrorCode.member_id_required and first.member_id
        return self.join(group, first.member_id, **kw)

    def sync(self, group: str, gen: int, member: str, assignments: dict[str, bytes]) -> Any:
        m = load_payload_module(14, 5, EntityType.request)
        given = tuple(
            m.SyncGroupRequestAssignment(member_id=k, assignment=v) for k, v in assignments.items()
        )
        return self.call(
            14,
            5,
            group_id=group,
            generation_id=gen,
            member_id=member,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=given,
        )

    def heartbeat(self, group: str, gen: int, member: str, instance: str | None = None) -> Any:
        return self.call(
            12,
            4,
            group_id=group,
            generation_id=gen,
            member_id=member,
            group_instance_id=instance,
        ).error_code

    def describe(self, group: str, version: int = 5) -> Any:
        return self.call(15, version, groups=(group,), include_authorized_operations=False).groups[
            0
        ]

    def commit(
        self,
        group: str,
        gen: int,
        member: str,
        offsets: dict[tuple[str, int], int],
        metadata: str = "",
    ) -> dict[tuple[str, int], int]:
        m = load_payload_module(8, 9, EntityType.request)
        topics = tuple(
            m.OffsetCommitRequestTopic(
                name=t,
                partitions=tuple(
                    m.OffsetCommitRequestPartition(
                        partition_index=p,
                        committed_offset=o,
                        committed_leader_epoch=-1,
                        committed_metadata=metadata,
                    )
                    for (tt, p), o in offsets.items()
                    if tt == t
                ),
            )
            for t in sorted({t for t, _ in offsets})
        )
        r = self.call(
            8,
            9,
            group_id=group,
            generation_id_or_member_epoch=gen,
            member_id=member,
            group_instance_id=None,
            topics=topics,
        )
        return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


class WireClient(Client):
    """The same requests over a real connection to a Server (kafkaclients.KioWire)."""

    def __init__(self, srv: Server, client_id: str = "wire"):
        self.wire = KioWire(srv.address, client_id)

    def call(self, key: int, version: int, /, **values: Any) -> Any:
        return self.wire.call(key, version, **values)

    def close(self) -> None:
        self.wire.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coord(store: mqcore.Store, clock: Clock) -> Iterator[GroupCoordinator]:
    store.create_topic("t", partitions=4)
    store.create_topic("u", partitions=2)
    c = GroupCoordinator(store, 7, "127.0.0.1", 9092, min_session_timeout=1.0, clock=clock)
    yield c
    c.close()


@pytest.fixture
def pool(coord: GroupCoordinator) -> Iterator[ThreadPoolExecutor]:
    """Threads for requests that block (a JoinGroup or SyncGroup waiting for a rebalance);
    closing the coordinator first answers any still waiting when a test failed."""
    with ThreadPoolExecutor(4) as ex:
        try:
            yield ex
        finally:
            coord.close()


def stable_member(
    cli: Client, group: str, assignment: bytes = b"a1", **join: Any
) -> tuple[str, int]:
    """A one-member group, through join and the leader's sync: (member ID, generation)."""
    r = cli.join_new(group, **join)
    assert r.error_code == ErrorCode.none and r.leader == r.member_id
    s = cli.sync(group, r.generation_id, r.member_id, {r.member_id: assignment})
    assert (s.error_code, s.assignment) == (ErrorCode.none, assignment)
    return r.member_id, r.generation_id


def state(cli: Client, group: str) -> str:
    return str(cli.describe(group).group_state)


# -- the coordinator --------------------------------------------------------------------------


def test_find_coordinator_names_this_node_in_both_forms(coord: GroupCoordinator) -> None:
    cli = Client(coord)
    r = cli.call(10, 3, key="any-group", key_type=0)
    assert (r.error_code, r.node_id, r.host, r.port) == (ErrorCode.none, 7, "127.0.0.1", 9092)
    r = cli.call(10, 4, key_type=0, coordinator_keys=("a", "b"))
    assert [(c.key, c.node_id, c.port, c.error_code) for c in r.coordinators] == [
        ("a", 7, 9092, ErrorCode.none),
        ("b", 7, 9092, ErrorCode.none),
    ]
    assert cli.call(10, 3, key="g", key_type=5).error_code == ErrorCode.invalid_request


def test_join_v4_asks_for_a_member_id_then_one_member_is_leader(
    coord: GroupCoordinator,
) -> None:
    cli = Client(coord, "app")
    first = cli.join("g")
    assert first.error_code == ErrorCode.member_id_required
    assert first.member_id.startswith("app-")
    assert state(cli, "g") == "Empty"  # a handed-out ID is not a member yet
    r = cli.join("g", first.member_id)
    assert (r.error_code, r.generation_id, r.leader, r.member_id) == (
        ErrorCode.none,
        1,
        first.member_id,
        first.member_id,
    )
    assert r.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in r.members] == [(r.member_id, subscription("t"))]
    assert state(cli, "g") == "CompletingRebalance"
    assert cli.heartbeat("g", 1, r.member_id) == ErrorCode.none
    s = cli.sync("g", 1, r.member_id, {r.member_id: b"mine"})
    assert (s.error_code, s.assignment, s.protocol_name) == (ErrorCode.none, b"mine", "range")
    d = cli.describe("g")
    assert (d.group_state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "range")
    assert [(m.member_id, m.client_id, m.client_host, m.member_assignment) for m in d.members] == [
        (r.member_id, "app", "/127.0.0.1", b"mine")
    ]
    # an old client (JoinGroup v3) gets its member ID at once
    old = cli.join("g2", version=3)
    assert old.error_code == ErrorCode.none and old.member_id and old.leader == old.member_id


def test_join_refuses_bad_input(coord: GroupCoordinator) -> None:
    cli = Client(coord)
    assert cli.join("g", session=0.5).error_code == ErrorCode.invalid_session_timeout
    assert cli.join("").error_code == ErrorCode.invalid_group_id
    assert cli.join("g", "never-given").error_code == ErrorCode.unknown_member_id
    member, _ = stable_member(cli, "g")
    # a new member must share the group's protocol type and one assignor
    assert cli.join("g", protocols=("sticky",)).error_code == ErrorCode.inconsistent_group_protocol
    assert cli.heartbeat("g", 1, member) == ErrorCode.none


def test_a_share_group_name_is_not_a_consumer_group(
    coord: GroupCoordinator, store: mqcore.Store
) -> None:
    """Kafka's answer for a classic join or commit to a share group's ID: GROUP_ID_NOT_FOUND."""
    with store.share_consumer("jobs", "t") as sc:
        sc.poll(1)
        sc.commit()
    cli = Client(coord)
    assert cli.join("jobs").error_code == ErrorCode.group_id_not_found
    assert cli.commit("jobs", -1, "", {("t", 0): 1}) == {("t", 0): ErrorCode.group_id_not_found}
    assert cli.join("other").error_code == ErrorCode.member_id_required  # the usual first step


def test_the_store_counts_the_coordinators_members(
    coord: GroupCoordinator, store: mqcore.Store, clock: Clock
) -> None:
    """A group of Kafka clients with members but no commit is a consumer group to the store
    (group_type said None before, so a share group could take its name), and its offsets are
    not deleted or altered under its members. Expired or departed members, and a closed
    coordinator's, no longer count."""
    cli = Client(coord, "app")
    member, _ = stable_member(cli, "wire", session=3.0)
    assert store.group_members("wire") == 1 and store.group_type("wire") == "consumer"
    with pytest.raises(GroupTypeError, match="'wire' is a consumer group"):
        store.share_consumer("wire", "t")
    with pytest.raises(GroupNotEmptyError):
        store.alter_group_offsets("wire", {("t", 0): 0})
    with pytest.raises(GroupNotEmptyError):
        store.delete_group("wire")
    assert "wire" not in store.group_lag()
    pending = cli.join("joining")  # a member ID handed out: joining, a member to be
    assert pending.error_code == ErrorCode.member_id_required
    assert store.group_members("joining") == 1
    clock.now += 4.0  # past the 3 s session: the member expired
    assert store.group_members("wire") == 0 and store.group_type("wire") is None
    store.alter_group_offsets("wire", {("t", 0): 0})
    assert cli.call(13, 2, group_id="wire", member_id=member).error_code == (
        ErrorCode.unknown_member_id
    )
    # a standalone commit (generation -1) under members of the store's own consumers: as under
    # the coordinator's, UNKNOWN_MEMBER_ID (accepted before, and undone by their next commit)
    local = store.consumer("local", "t")
    assert cli.commit("local", -1, "", {("t", 0): 0}) == {("t", 0): ErrorCode.unknown_member_id}
    local.close()
    assert cli.commit("local", -1, "", {("t", 0): 0}) == {("t", 0): ErrorCode.none}
    other = Client(coord, "b")
    stable_member(other, "held")
    assert store.group_members("held") == 1
    coord.close()
    assert store.group_members("held") == 0


def test_a_join_waits_until_every_member_rejoined(
    coord: GroupCoordinator, pool: ThreadPoolExecutor
) -> None:
    a, b = Client(coord, "a"), Client(coord, "b")
    ma, gen = stable_member(a, "g")
    first = b.join("g")
    joining: Future[Any] = pool.submit(b.join, "g", first.member_id, topics=("t", "u"))
    wait_until(lambda: state(a, "g") == "PreparingRebalance", why="b's join starts a rebalance")
    assert not joining.done()  # b waits for a, who has not rejoined
    assert a.heartbeat("g", gen, ma) == ErrorCode.rebalance_in_progress
    ra = a.join("g", ma)  # the last member in: the rebalance completes, a stays leader
    rb = joining.result(WAIT)
    assert ra.generation_id == rb.generation_id == gen + 1
    assert ra.leader == rb.leader == ma
    assert {m.member_id: m.metadata for m in ra.members} == {
        ma: subscription("t"),
        first.member_id: subscription("t", "u"),
    }
    assert rb.members == ()  # only the leader sees the members
    # b's sync waits for the leader's assignments
    syncing: Future[Any] = pool.submit(b.sync, "g", rb.generation_id, rb.member_id, {})
    wait_until(lambda: state(a, "g") == "CompletingRebalance")
    assert not syncing.done()
    sa = a.sync("g", ra.generation_id, ma, {ma: b"A", rb.member_id: b"B"})
    assert sa.assignment == b"A" and syncing.result(WAIT).assignment == b"B"
    assert state(a, "g") == "Stable"
    assert a.heartbeat("g", gen, ma) == ErrorCode.illegal_generation
    assert a.heartbeat("g", gen + 1, "stranger") == ErrorCode.unknown_member_id
    assert a.heartbeat("nogroup", 1, ma) == ErrorCode.unknown_member_id


def test_members_that_join_a_new_group_together_share_its_first_generation(
    coord: GroupCoordinator, pool: ThreadPoolExecutor
) -> None:
    """Both got their member IDs before either rejoined: the first rejoin waits for the
    second (a handed-out ID is awaited), and the second is not refused for the protocol type
    of a group that has not completed a rebalance yet."""
    a, b = Client(coord, "a"), Client(coord, "b")
    ida, idb = a.join("g").member_id, b.join("g").member_id
    joining = pool.submit(a.join, "g", ida)
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    assert not joining.done()
    rb = b.join("g", idb)
    assert rb.error_code == ErrorCode.none
    ra = joining.result(WAIT)
    assert ra.error_code == ErrorCode.none
    assert ra.generation_id == rb.generation_id == 1 and ra.leader == ida
    assert [m.member_id for m in ra.members] == [ida, idb]


def test_a_silent_member_expires_after_its_session_timeout(
    coord: GroupCoordinator, clock: Clock, pool: ThreadPoolExecutor
) -> None:
    a, b = Client(coord, "a"), Client(coord, "b")
    ma, gen = stable_member(a, "g")
    first = b.join("g", session=3.0)
    joining = pool.submit(b.join, "g", first.member_id, session=3.0)
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    ra, rb = a.join("g", ma), joining.result(WAIT)
    a.sync("g", ra.generation_id, ma, {ma: b"A", rb.member_id: b"B"})
    assert b.sync("g", rb.generation_id, rb.member_id, {}).assignment == b"B"
    gen = ra.generation_id
    # a heartbeats every 2 s; b never does again: b's 3 s run out, a's 6 s do not
    clock.now += 2.0
    assert a.heartbeat("g", gen, ma) == ErrorCode.none
    clock.now += 2.0
    assert a.heartbeat("g", gen, ma) == ErrorCode.rebalance_in_progress
    assert [m.member_id for m in a.describe("g").members] == [ma]
    r = a.join("g", ma)  # alone now: the rebalance completes at once
    assert (r.generation_id, [m.member_id for m in r.members]) == (gen + 1, [ma])
    assert b.heartbeat("g", gen, rb.member_id) == ErrorCode.unknown_member_id


def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout(
    coord: GroupCoordinator, clock: Clock, pool: ThreadPoolExecutor
) -> None:
    a, b, c = Client(coord, "a"), Client(coord, "b"), Client(coord, "c")
    ma, gen = stable_member(a, "g")
    first = b.join("g")
    joining_b = pool.submit(b.join, "g", first.member_id, rebalance=5.0)
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    ra, rb = a.join("g", ma, rebalance=5.0), joining_b.result(WAIT)
    a.sync("g", ra.generation_id, ma, {})
    # c joins; b rejoins, a keeps heartbeating (alive) but never rejoins
    first_c = c.join("g")
    joining_c = pool.submit(c.join, "g", first_c.member_id, rebalance=5.0)
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    joining_b = pool.submit(b.join, "g", rb.member_id, rebalance=5.0)
    wait_until(lambda: len([m for m in a.describe("g").members]) == 3)
    clock.now += 3.0
    assert a.heartbeat("g", ra.generation_id, ma) == ErrorCode.rebalance_in_progress
    assert not joining_b.done() and not joining_c.done()
    clock.now += 3.0  # past the 5 s rebalance timeout: the waiting joins complete without a
    rb2, rc = joining_b.result(WAIT), joining_c.result(WAIT)
    assert rb2.error_code == rc.error_code == ErrorCode.none
    assert rb2.generation_id == ra.generation_id + 1
    leader = rb2 if rb2.leader == rb2.member_id else rc
    assert {m.member_id for m in leader.members} == {rb.member_id, first_c.member_id}
    assert a.heartbeat("g", ra.generation_id, ma) == ErrorCode.unknown_member_id


def test_leave_group_one_member_or_a_batch(coord: GroupCoordinator) -> None:
    cli = Client(coord)
    member, _ = stable_member(cli, "g")
    assert cli.call(13, 2, group_id="g", member_id="stranger").error_code == (
        ErrorCode.unknown_member_id
    )
    assert cli.call(13, 2, group_id="g", member_id=member).error_code == ErrorCode.none
    assert (state(cli, "g"), cli.describe("g").members) == ("Empty", ())
    # v3+: several members, by member ID or group.instance.id (static members)
    s1 = cli.join("s", instance="i1")
    assert s1.error_code == ErrorCode.none  # a static member needs no second join
    cli.sync("s", s1.generation_id, s1.member_id, {})
    m = load_payload_module(13, 5, EntityType.request)
    r = cli.call(
        13,
        5,
        group_id="s",
        members=(
            m.MemberIdentity(member_id="wrong", group_instance_id="i1", reason=None),
            m.MemberIdentity(member_id="", group_instance_id="i9", reason=None),
            m.MemberIdentity(member_id="", group_instance_id="i1", reason="bye"),
        ),
    )
    assert r.error_code == ErrorCode.none
    assert [x.error_code for x in r.members] == [
        ErrorCode.fenced_instance_id,
        ErrorCode.unknown_member_id,
        ErrorCode.none,
    ]
    assert state(cli, "s") == "Empty"


def test_a_restarted_static_member_gets_its_assignment_back_without_a_rebalance(
    coord: GroupCoordinator, pool: ThreadPoolExecutor
) -> None:
    a, b = Client(coord, "a"), Client(coord, "b")
    ra = a.join("g", instance="ia")
    a.sync("g", ra.generation_id, ra.member_id, {ra.member_id: b"A"})
    joining = pool.submit(b.join, "g", instance="ib")
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    ra = a.join("g", ra.member_id, instance="ia")
    rb = joining.result(WAIT)
    a.sync("g", ra.generation_id, ra.member_id, {ra.member_id: b"A", rb.member_id: b"B"})
    assert b.sync("g", rb.generation_id, rb.member_id, {}).assignment == b"B"
    # b restarts: same instance ID, no member ID
    again = b.join("g", instance="ib")
    assert again.error_code == ErrorCode.none and again.member_id != rb.member_id
    assert again.generation_id == ra.generation_id and state(a, "g") == "Stable"
    assert b.sync("g", again.generation_id, again.member_id, {}).assignment == b"B"
    gen = ra.generation_id
    assert b.heartbeat("g", gen, rb.member_id, "ib") == ErrorCode.fenced_instance_id
    assert b.heartbeat("g", gen, again.member_id, "ib") == ErrorCode.none


@pytest.mark.parametrize("version", [5, 9])
def test_a_restarted_static_leader_keeps_its_assignment_without_a_rebalance(
    coord: GroupCoordinator, pool: ThreadPoolExecutor, version: int
) -> None:
    """Regression (librdkafka test 0102): a static member that was the leader rejoined with a
    rebalance. KIP-345/KIP-814, as Kafka answers: the generation stays; JoinGroup v9 makes it
    the leader again with every member and skip_assignment, older versions name the old
    member ID as leader so the client syncs as a follower; its assignment comes back."""
    a, b = Client(coord, "a"), Client(coord, "b")
    ra = a.join("g", instance="ia")
    a.sync("g", ra.generation_id, ra.member_id, {ra.member_id: b"A"})
    joining = pool.submit(b.join, "g", instance="ib")
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    ra = a.join("g", ra.member_id, instance="ia")
    rb = joining.result(WAIT)
    gen = ra.generation_id
    assert ra.leader == ra.member_id
    a.sync("g", gen, ra.member_id, {ra.member_id: b"A", rb.member_id: b"B"})
    assert b.sync("g", gen, rb.member_id, {}).assignment == b"B"
    restarted = pool.submit(a.join, "g", instance="ia", version=version)  # the leader restarted
    wait_until(restarted.done, why="the join answered at once: no rebalance to wait for")
    again = restarted.result()
    assert (again.error_code, again.generation_id) == (ErrorCode.none, gen)
    assert state(a, "g") == "Stable"
    if version >= 9:
        assert again.leader == again.member_id and again.skip_assignment
        assert sorted(m.member_id for m in again.members) == sorted([again.member_id, rb.member_id])
    else:
        assert again.leader == ra.member_id and not again.members
    assert a.sync("g", gen, again.member_id, {}).assignment == b"A"
    assert b.heartbeat("g", gen, rb.member_id, "ib") == ErrorCode.none  # no rebalance
    assert a.heartbeat("g", gen, again.member_id, "ia") == ErrorCode.none
    assert a.heartbeat("g", gen, ra.member_id, "ia") == ErrorCode.fenced_instance_id


def test_offset_commit_checks_member_and_generation(
    coord: GroupCoordinator, store: mqcore.Store, pool: ThreadPoolExecutor
) -> None:
    cli = Client(coord)
    # a standalone consumer (generation -1, no member ID) commits to a group without members
    assert cli.commit("solo", -1, "", {("t", 0): 5, ("t", 1): 7}, "meta") == {
        ("t", 0): ErrorCode.none,
        ("t", 1): ErrorCode.none,
    }
    assert store.offset_store().committed("solo", "t", 0).offset == 5
    member, gen = stable_member(cli, "g")
    assert cli.commit("g", -1, "", {("t", 0): 1})[("t", 0)] == ErrorCode.unknown_member_id
    assert cli.commit("g", gen, "other", {("t", 0): 1})[("t", 0)] == ErrorCode.unknown_member_id
    assert cli.commit("g", gen + 1, member, {("t", 0): 1})[("t", 0)] == (
        ErrorCode.illegal_generation
    )
    assert cli.commit("g", gen, member, {("t", 3): 9, ("t", 4): 1, ("zz", 0): 1}) == {
        ("t", 3): ErrorCode.none,
        ("t", 4): ErrorCode.unknown_topic_or_partition,
        ("zz", 0): ErrorCode.unknown_topic_or_partition,
    }
    assert cli.commit("g", gen, member, {("t", 2): 1}, "x" * 5000)[("t", 2)] == (
        ErrorCode.offset_metadata_too_large
    )
    assert cli.commit("", -1, "", {("t", 0): 1})[("t", 0)] == ErrorCode.invalid_group_id
    # between JoinGroup and SyncGroup a member's commit is refused
    other = Client(coord, "o")
    first = other.join("g")
    joining = pool.submit(other.join, "g", first.member_id)
    wait_until(lambda: state(cli, "g") == "PreparingRebalance")
    # during PreparingRebalance the current generation may still commit
    assert cli.commit("g", gen, member, {("t", 0): 2})[("t", 0)] == ErrorCode.none
    r = cli.join("g", member)
    joining.result(WAIT)
    assert state(cli, "g") == "CompletingRebalance"
    assert cli.commit("g", r.generation_id, member, {("t", 0): 3})[("t", 0)] == (
        ErrorCode.rebalance_in_progress
    )
    assert store.offset_store().group_offsets("g") == {
        ("t", 3): store.offset_store().committed("g", "t", 3),
        ("t", 0): store.offset_store().committed("g", "t", 0),
    }
    assert store.offset_store().committed("g", "t", 0).offset == 2


def test_offset_fetch_every_version_reads_the_store_offsets(
    coord: GroupCoordinator, store: mqcore.Store
) -> None:
    cli = Client(coord)
    with store.consumer("g", "t") as c:  # an in-process consumer's commit ...
        c.commit({("t", 1): 4})
    cli.commit("g", -1, "", {("t", 2): 6}, "m")  # ... and a wire commit, one set of offsets
    m1 = load_payload_module(9, 1, EntityType.request)
    r = cli.call(
        9,
        1,
        group_id="g",
        topics=(m1.OffsetFetchRequestTopic(name="t", partition_indexes=(0, 1, 2)),),
    )
    got = {p.partition_index: (p.committed_offset, p.metadata) for p in r.topics[0].partitions}
    assert got == {0: (-1, ""), 1: (4, ""), 2: (6, "m")}
    r = cli.call(9, 7, group_id="g", topics=None, require_stable=True)  # every partition
    assert r.error_code == ErrorCode.none
    assert {
        (t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions
    } == {("t", 1): 4, ("t", 2): 6}
    m9 = load_payload_module(9, 9, EntityType.request)
    r = cli.call(
        9,
        9,
        require_stable=False,
        groups=(
            m9.OffsetFetchRequestGroup(group_id="g", member_id=None, member_epoch=-1, topics=None),
            m9.OffsetFetchRequestGroup(
                group_id="none",
                member_id=None,
                member_epoch=-1,
                topics=(m9.OffsetFetchRequestTopics(name="t", partition_indexes=(0,)),),
            ),
        ),
    )
    assert [(g.group_id, g.error_code) for g in r.groups] == [
        ("g", ErrorCode.none),
        ("none", ErrorCode.none),
    ]
    assert {p.partition_index: p.committed_offset for p in r.groups[0].topics[0].partitions} == {
        1: 4,
        2: 6,
    }
    assert r.groups[1].topics[0].partitions[0].committed_offset == -1


def test_offset_delete_and_delete_groups(coord: GroupCoordinator, store: mqcore.Store) -> None:
    cli = Client(coord)
    m = load_payload_module(47, 0, EntityType.request)

    def offset_delete(group: str, topic: str, *parts: int) -> Any:
        return cli.call(
            47,
            0,
            group_id=group,
            topics=(
                m.OffsetDeleteRequestTopic(
                    name=topic,
                    partitions=tuple(
                        m.OffsetDeleteRequestPartition(partition_index=p) for p in parts
                    ),
                ),
            ),
        )

    def delete_groups(*groups: str) -> list[Any]:
        r = cli.call(42, 2, groups_names=groups)
        return [x.error_code for x in r.results]

    assert offset_delete("nobody", "t", 0).error_code == ErrorCode.group_id_not_found
    assert delete_groups("nobody") == [ErrorCode.group_id_not_found]
    member, gen = stable_member(cli, "g")  # subscribed to "t" only
    cli.commit("g", gen, member, {("t", 0): 3, ("u", 0): 4, ("u", 1): 5})
    r = offset_delete("g", "t", 0)
    assert r.error_code == ErrorCode.none
    assert r.topics[0].partitions[0].error_code == ErrorCode.group_subscribed_to_topic
    r = offset_delete("g", "u", 0)
    assert r.topics[0].partitions[0].error_code == ErrorCode.none
    assert set(store.offset_store().group_offsets("g")) == {("t", 0), ("u", 1)}
    assert delete_groups("g") == [ErrorCode.non_empty_group]
    cli.call(13, 2, group_id="g", member_id=member)
    assert delete_groups("g") == [ErrorCode.none]
    assert store.offset_store().group_offsets("g") == {}
    assert store.group_lag("g") == {}
    d = cli.describe("g", version=6)
    assert (d.error_code, d.group_state) == (ErrorCode.group_id_not_found, "Dead")
    assert cli.describe("g", version=5).group_state == "Dead"


def test_list_groups_filters_by_state_and_type(coord: GroupCoordinator) -> None:
    cli = Client(coord)
    stable_member(cli, "live")
    cli.commit("old", -1, "", {("t", 0): 1})  # only committed offsets: an Empty group

    def listed(version: int = 5, **filters: Any) -> dict[str, tuple[str, str]]:
        r = cli.call(16, version, **filters)
        return {g.group_id: (getattr(g, "group_state", ""), g.protocol_type) for g in r.groups}

    assert listed(states_filter=(), types_filter=()) == {
        "live": ("Stable", "consumer"),
        "old": ("Empty", ""),
    }
    assert listed(states_filter=("stable",), types_filter=()) == {"live": ("Stable", "consumer")}
    assert listed(states_filter=(), types_filter=("consumer",)) == {}  # KIP-848 groups: none
    assert set(listed(version=0)) == {"live", "old"}


def test_abandoned_groups_are_forgotten(coord: GroupCoordinator, clock: Clock) -> None:
    """Groups whose members all went (here: sessions expired, as when their processes were
    killed) are Dead once Empty without committed offsets: no longer listed or kept (500
    one-member groups stayed listed forever); a group with commits stays, Empty."""
    cli = Client(coord)
    for i in range(500):
        stable_member(cli, f"gone-{i}", session=6.0)
    member, generation = stable_member(cli, "kept", session=6.0)
    cli.commit("kept", generation, member, {("t", 0): 3})

    def listed() -> dict[str, str]:
        return {g.group_id: g.group_state for g in cli.call(16, 4, states_filter=()).groups}

    assert len(listed()) == 501
    clock.now += 7.0  # every session is over
    assert listed() == {"kept": "Empty"}
    assert state(cli, "gone-3") == "Dead"
    assert coord.member_count("gone-3") == 0
    stable_member(cli, "gone-3")  # the name can be used again, from generation 1
    assert cli.describe("gone-3").group_state == "Stable"


def test_a_group_whose_offsets_expire_is_forgotten(
    coord: GroupCoordinator, store: mqcore.Store, clock: Clock
) -> None:
    """A wire group left Empty keeps its state while it has committed offsets; when the
    store's expiry (offsets_retention_ms) deletes them, the coordinator hears of it
    (Store.add_group_expiry_listener) and the group is Dead."""
    cli = Client(coord)
    member, generation = stable_member(cli, "old", session=6.0)
    cli.commit("old", generation, member, {("t", 0): 0})
    clock.now += 7.0  # its member's session is over: Empty, with offsets
    assert state(cli, "old") == "Empty"
    week_later = store.log.clock() + 8 * 24 * 3600 * 1000
    assert store.expire_groups(now=week_later) == ["old"]
    assert state(cli, "old") == "Dead"
    assert "old" not in {g.group_id for g in cli.call(16, 4, states_filter=()).groups}


def test_close_answers_a_waiting_join(coord: GroupCoordinator, pool: ThreadPoolExecutor) -> None:
    a, b = Client(coord, "a"), Client(coord, "b")
    stable_member(a, "g")
    first = b.join("g")
    joining = pool.submit(b.join, "g", first.member_id)
    wait_until(lambda: state(a, "g") == "PreparingRebalance")
    coord.close()
    assert joining.result(WAIT).error_code == ErrorCode.rebalance_in_progress


def test_server_stop_answers_a_join_waiting_for_a_rebalance(store: mqcore.Store) -> None:
    """A JoinGroup blocked in its connection's thread (waiting for a member that has 60 s to
    rejoin, or 30 s to expire) does not hold up Server.stop()."""
    srv = Server(store, listen="127.0.0.1:0").start()
    a, b = WireClient(srv, "a"), WireClient(srv, "b")
    try:
        stable_member(a, "g", session=30.0, rebalance=60.0)
        first = b.join("g", rebalance=60.0)
        with ThreadPoolExecutor(1) as ex:
            joining = ex.submit(b.join, "g", first.member_id, rebalance=60.0)
            wait_until(lambda: state(a, "g") == "PreparingRebalance")
            started = time.monotonic()
            srv.stop()
            assert time.monotonic() - started < 10.0  # not the 60 s rebalance timeout
            try:
                answer = joining.result(WAIT).error_code
            except ConnectionError:  # the connection closed before the answer went out
                answer = ErrorCode.rebalance_in_progress
            assert answer == ErrorCode.rebalance_in_progress
    finally:
        srv.stop()
        a.close()
        b.close()


# -- real clients ------------------------------------------------------------------------------

kafka = pytest.importorskip("kafka")
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300}  # librdkafka


def fill(store: mqcore.Store, topic: str, partitions: int, per: int, tag: str) -> set[str]:
    """`per` messages appended to each partition with mqcore's API; their values."""
    values = set()
    for p in range(partitions):
        batch = [f"{tag}-{p}-{i}" for i in range(per)]
        store.append_batch(topic, [v.encode() for v in batch], partition=p)
        values.update(batch)
    return values


def all_committed(store: mqcore.Store, group: str, topic: str, partitions: int) -> bool:
    """Every partition's commit is at its end (the group processed everything)."""
    lags = {(x.topic, x.partition): x.lag for x in store.group_lag().get(group, [])}
    return all(lags.get((topic, p)) == 0 for p in range(partitions))


class Members:
    """Consumer threads of one group; each records what it processed and its assignment."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, str]] = []
        self.assigned: dict[int, set[int]] = {}
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def start(self, loop: Callable[[int], None], count: int) -> None:
        def run(i: int) -> None:
            try:
                loop(i)
            except BaseException as e:  # noqa: BLE001 - re-raised by finish()
                self.errors.append(e)

        for i in range(count):
            self.assigned[i] = set()
            t = threading.Thread(target=run, args=(i,))
            t.start()
            self.threads.append(t)

    def balanced(self, partitions: int) -> bool:
        """Every member holds some partitions, none twice, all of them covered."""
        sets = list(self.assigned.values())
        assert not self.errors, self.errors
        union = set().union(*sets)
        return all(sets) and sum(map(len, sets)) == len(union) == partitions

    def record(self, partition: int, offset: int, value: str) -> None:
        with self.lock:
            self.seen.append((partition, offset, value))

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(WAIT)
        assert not any(t.is_alive() for t in self.threads)
        assert not self.errors, self.errors


def confluent_member(bootstrap: str, group: str, topic: str, members: Members, i: int) -> None:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **FAST,
        }
    )
    c.subscribe([topic])
    try:
        while not members.stop.is_set():
            m = c.poll(0.1)
            members.assigned[i] = {tp.partition for tp in c.assignment()}
            if m is None:
                continue
            assert m.error() is None, m.error()
            members.record(m.partition(), m.offset(), m.value().decode())
            c.commit(message=m, asynchronous=False)  # after processing
    finally:
        c.close()


def kafka_python_member(bootstrap: str, group: str, topic: str, members: Members, i: int) -> None:
    c = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
    )
    try:
        while not members.stop.is_set():
            got = c.poll(timeout_ms=100)
            members.assigned[i] = {tp.partition for tp in c.assignment()}
            for msgs in got.values():
                for m in msgs:
                    members.record(m.partition, m.offset, m.value.decode())
            if got:
                c.commit()  # the positions after what this poll returned and was processed
    finally:
        c.close()


def aiokafka_member(bootstrap: str, group: str, topic: str, members: Members, i: int) -> None:
    aiokafka = pytest.importorskip("aiokafka")

    async def run() -> None:
        c = aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=300,
        )
        await c.start()
        try:
            while not members.stop.is_set():
                got = await c.getmany(timeout_ms=100)
                members.assigned[i] = {tp.partition for tp in c.assignment()}
                for msgs in got.values():
                    for m in msgs:
                        members.record(m.partition, m.offset, m.value.decode())
                if got:
                    await c.commit()  # after processing what getmany returned
        finally:
            await c.stop()

    asyncio.run(run())


MEMBERS = {"confluent": confluent_member, "kafka-python": kafka_python_member,
           "aiokafka": aiokafka_member}  # fmt: skip


@pytest.mark.parametrize("client", list(MEMBERS))
def test_a_group_of_two_consumes_every_message_once(
    kafka_server: Any, store: mqcore.Store, client: str
) -> None:
    store.create_topic("work", partitions=4)
    member = MEMBERS[client]
    members = Members()
    members.start(lambda i: member(kafka_server.bootstrap, "grp", "work", members, i), 2)
    try:
        wait_until(lambda: members.balanced(4), why="two members share four partitions")
        want = fill(store, "work", 4, 25, "a")
        wait_until(
            lambda: len(members.seen) >= len(want) and all_committed(store, "grp", "work", 4),
            why="every message processed and committed",
        )
    finally:
        members.finish()
    values = [v for _, _, v in members.seen]
    assert sorted(values) == sorted(want)  # each once
    assert {(x.partition, x.committed) for x in store.group_lag("grp")["grp"]} == {
        (p, store.end_offset("work", p)) for p in range(4)
    }


def test_committed_offsets_survive_a_server_restart(tmp_path: Any) -> None:
    path = str(tmp_path / "store")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("r", partitions=2)
        first = fill(st, "r", 2, 10, "one")
    conf = {
        "group.id": "keep",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        **FAST,
    }
    with Server(path, listen="127.0.0.1:0", flush="os") as srv:
        members = Members()
        members.start(lambda i: confluent_member(srv.bootstrap, "keep", "r", members, i), 1)
        try:
            wait_until(lambda: len(members.seen) >= len(first))
        finally:
            members.finish()
        assert srv.store is not None
        wait_until(lambda: all_committed(srv.store, "keep", "r", 2))
    with mqcore.open(path, flush="os") as st:
        second = fill(st, "r", 2, 5, "two")
    with Server(path, listen="127.0.0.1:0", flush="os") as srv:
        c = ck.Consumer({"bootstrap.servers": srv.bootstrap, **conf})
        try:
            parts = [ck.TopicPartition("r", p) for p in range(2)]
            assert [tp.offset for tp in c.committed(parts, timeout=WAIT)] == [10, 10]
            c.subscribe(["r"])
            got: list[str] = []
            deadline = time.monotonic() + WAIT
            while len(got) < len(second) and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None:
                    assert m.error() is None, m.error()
                    got.append(m.value().decode())
            assert sorted(got) == sorted(second)  # resumed at the commits: nothing old again
        finally:
            c.close()


def test_a_committed_leader_epoch_is_fetched_back_across_a_restart(tmp_path: Any) -> None:
    """Regression: OffsetCommit's committed_leader_epoch was dropped and OffsetFetch answered
    -1. confluent-kafka commits epoch 5 and reads 5 back, from this server and from the next
    one over the same store."""
    path = str(tmp_path / "store")
    with mqcore.open(path, flush="os") as st:
        st.create_topic("r", partitions=2)
    conf = {"group.id": "epochs", "enable.auto.commit": False}
    tp = ck.TopicPartition("r", 1, 3, leader_epoch=5)
    for restart in (False, True):
        with Server(path, listen="127.0.0.1:0", flush="os") as srv:
            c = ck.Consumer({"bootstrap.servers": srv.bootstrap, **conf})
            try:
                if not restart:
                    c.commit(offsets=[tp], asynchronous=False)
                (got,) = c.committed([ck.TopicPartition("r", 1)], timeout=WAIT)
                assert (got.offset, got.leader_epoch) == (3, 5)
            finally:
                c.close()


def test_a_group_id_with_a_comma_is_a_group_id(kafka_server: Any, store: mqcore.Store) -> None:
    """Regression (librdkafka's test 0132): Kafka takes any non-empty group ID, and the
    server refused "a,b" (INVALID_GROUP_ID: mqcore's topic-name rule). A group of that name
    now consumes, commits, is fetched, described, listed and deleted; mqcore's own consumers,
    whose retry and dead-letter topics are named after the group, still need a topic-safe
    name."""
    store.create_topic("c", partitions=2)
    fill(store, "c", 2, 3, "x")
    name = "a,b / c"
    conf = {"group.id": name, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    c = ck.Consumer({"bootstrap.servers": kafka_server.bootstrap, **conf, **FAST})
    ca = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    try:
        c.subscribe(["c"])
        got = []
        deadline = time.monotonic() + WAIT
        while len(got) < 6 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
                c.commit(message=m, asynchronous=False)
        assert len(got) == 6
        parts = c.committed([ck.TopicPartition("c", p) for p in range(2)], timeout=WAIT)
        assert [tp.offset for tp in parts] == [3, 3]
        d = ca.describe_consumer_groups([name])[name].result(WAIT)
        assert (d.group_id, d.state, len(d.members)) == (name, ck.ConsumerGroupState.STABLE, 1)
    finally:
        c.close()
    listed = ca.list_consumer_groups().result(WAIT)
    assert name in {g.group_id for g in listed.valid}
    assert [lag.committed for lag in store.group_lag(name)[name]] == [3, 3]
    with pytest.raises(InvalidGroupError, match="group name"):
        store.consumer(name, "c")  # its __retry.<group> topic could not be made
    ca.delete_consumer_groups([name])[name].result(WAIT)
    assert store.group_lag(name) == {}


def test_lag_agrees_between_admin_clients_and_the_store(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("lag", partitions=3)
    fill(store, "lag", 3, 10, "x")
    kp = kafka.KafkaConsumer(
        bootstrap_servers=kafka_server.bootstrap, group_id="lg", enable_auto_commit=False
    )
    tps = [kafka.TopicPartition("lag", p) for p in range(3)]
    try:
        kp.assign(tps)
        # a standalone consumer's commit (generation -1) through the wire
        kp.commit(
            {
                tps[0]: kafka.OffsetAndMetadata(4, "", -1),
                tps[1]: kafka.OffsetAndMetadata(10, "", -1),
            }
        )
        # and one by mqcore's own consumer of the same group, in process
        with store.consumer("lg", "lag") as own:
            assert own.committed("lag", 0) == 4  # sees the wire commit
            own.commit({("lag", 2): 7})
        assert kp.committed(tps[2]) == 7  # the wire sees mqcore's commit
        ends = kp.end_offsets(tps)
    finally:
        kp.close()
    mine = {x.partition: x.lag for x in store.group_lag("lg")["lg"]}
    assert mine == {0: 6, 1: 0, 2: 3}
    # kafka-python's admin client
    admin = kafka.KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap)
    try:
        offsets = admin.list_group_offsets({"lg": None})
        offsets = offsets.get("lg", offsets)
        assert {tp.partition: ends[tp] - om.offset for tp, om in offsets.items()} == mine
    finally:
        admin.close()
    # confluent-kafka's admin client: committed offsets and the partitions' ends
    ca = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    req = ck.ConsumerGroupTopicPartitions("lg")
    res = ca.list_consumer_group_offsets([req])["lg"].result(WAIT)
    committed = {tp.partition: tp.offset for tp in res.topic_partitions}
    latest = ca.list_offsets(
        {ck.TopicPartition("lag", p): ck.admin.OffsetSpec.latest() for p in range(3)}
    )
    end = {tp.partition: f.result(WAIT).offset for tp, f in latest.items()}
    assert {p: end[p] - committed[p] for p in committed} == mine


def test_admin_client_describes_lists_and_deletes_groups(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("d", partitions=2)
    fill(store, "d", 2, 3, "d")
    ca = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    members = Members()
    members.start(lambda i: confluent_member(kafka_server.bootstrap, "dg", "d", members, i), 1)
    try:
        wait_until(lambda: members.balanced(2) and len(members.seen) >= 6)
        wait_until(lambda: all_committed(store, "dg", "d", 2))
        listed = ca.list_consumer_groups().result(WAIT)
        assert {g.group_id: g.state for g in listed.valid}["dg"] == ck.ConsumerGroupState.STABLE
        d = ca.describe_consumer_groups(["dg"])["dg"].result(WAIT)
        assert d.state == ck.ConsumerGroupState.STABLE and not d.is_simple_consumer_group
        assert d.partition_assignor == "range"
        (member,) = d.members
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1]
        assert d.coordinator.id == kafka_server.broker.node_id
        with pytest.raises(ck.KafkaException) as refused:
            ca.delete_consumer_groups(["dg"])["dg"].result(WAIT)
        assert refused.value.args[0].code() == ck.KafkaError.NON_EMPTY_GROUP
    finally:
        members.finish()
    d = ca.describe_consumer_groups(["dg"])["dg"].result(WAIT)
    assert d.state == ck.ConsumerGroupState.EMPTY and d.members == []
    assert store.group_lag("dg")  # the offsets stay until the group is deleted
    ca.delete_consumer_groups(["dg"])["dg"].result(WAIT)
    assert store.group_lag() == {}
    listed = ca.list_consumer_groups().result(WAIT)
    assert "dg" not in {g.group_id for g in listed.valid}


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_three_processes_share_six_partitions_and_survive_a_sigkill(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """Three confluent-kafka consumers in three OS processes: every message processed once;
    one killed with SIGKILL is dropped after its session timeout and the other two take over
    its partitions at its commits: nothing lost, nothing twice."""
    store.create_topic("six", partitions=6)
    children = [Child(kafka_server.bootstrap, "procs", "six", 6000) for _ in range(3)]
    try:

        def balanced(kids: list[Child]) -> bool:
            sets = [k.assigned() for k in kids]
            return all(sets) and sum(map(len, sets)) == len(set().union(*sets)) == 6

        wait_until(lambda: balanced(children), why="three members share six partitions")
        want = fill(store, "six", 6, 20, "one")
        wait_until(
            lambda: (
                set(sum((k.processed() for k in children), [])) >= want
                and all_committed(store, "procs", "six", 6)
            ),
            why="all processed, committed",
        )
        victim, survivors = children[0], children[1:]
        orphaned = victim.assigned()
        os.kill(victim.proc.pid, signal.SIGKILL)
        assert victim.proc.wait(WAIT) == -signal.SIGKILL
        # the victim's session (6 s) runs out, the group rebalances, the others take over
        wait_until(lambda: balanced(survivors), why="two survivors share six partitions")
        more = fill(store, "six", 6, 20, "two")
        wait_until(
            lambda: (
                set(sum((k.processed() for k in survivors), [])) >= more
                and all_committed(store, "procs", "six", 6)
            ),
            why="the rest processed",
        )
        taken = set().union(*(k.assigned() for k in survivors))
        assert orphaned <= taken
    finally:
        for k in children:
            k.close()
    processed = sum((k.processed() for k in children), [])
    assert sorted(processed) == sorted(want | more)  # each message once
    assert all(not ln.startswith(("error", "commit-failed")) for k in children for ln in k.lines)


def test_a_restarted_static_confluent_consumer_replaces_its_old_self(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """librdkafka with group.instance.id does not leave on close; its successor under the same
    instance ID takes the old member's place at once instead of waiting out its session."""
    store.create_topic("st", partitions=2)
    conf = {"bootstrap.servers": kafka_server.bootstrap, "group.id": "sg",
            "group.instance.id": "inst-1", "enable.auto.commit": False, **FAST}  # fmt: skip
    ca = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    ids = []
    for _ in range(2):
        c = ck.Consumer(conf)
        try:
            c.subscribe(["st"])
            wait_until(lambda c=c: c.poll(0.1) is None and len(c.assignment()) == 2)
            d = ca.describe_consumer_groups(["sg"])["sg"].result(WAIT)
            assert d.state == ck.ConsumerGroupState.STABLE
            (member,) = d.members  # one member: the old one was replaced, not kept
            assert member.group_instance_id == "inst-1"
            ids.append(member.member_id)
        finally:
            c.close()
        # a static member does not leave on close (KIP-345): it is still in until replaced
        d = ca.describe_consumer_groups(["sg"])["sg"].result(WAIT)
        assert [m.member_id for m in d.members] == ids[-1:]
    assert ids[0] != ids[1]


def test_a_restarted_static_confluent_leader_gets_its_partitions_back_at_once(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """Regression (librdkafka test 0102): the static leader restarts (librdkafka does not
    leave on close) and its successor gets the old partitions at once, without a rebalance:
    the other member, not polled meanwhile, could not have rejoined one, and its rebalance
    callbacks never run again. Before, the successor's JoinGroup waited for that rejoin."""
    store.create_topic("sl", partitions=2)
    base = {"bootstrap.servers": kafka_server.bootstrap, "group.id": "slg",
            "enable.auto.commit": False, "session.timeout.ms": 30000,
            "heartbeat.interval.ms": 300}  # fmt: skip
    events: list[str] = []
    a = ck.Consumer({**base, "group.instance.id": "ia"})
    b = ck.Consumer({**base, "group.instance.id": "ib"})
    open_ = [a, b]
    try:
        a.subscribe(["sl"])
        wait_until(lambda: a.poll(0.1) is None and len(a.assignment()) == 2)  # alone: leader
        b.subscribe(["sl"], on_assign=lambda c, ps: events.append("assign"),
                    on_revoke=lambda c, ps: events.append("revoke"))  # fmt: skip
        wait_until(lambda: [a.poll(0.1), b.poll(0.1)] and len(b.assignment()) == 1
                   and len(a.assignment()) == 1)  # fmt: skip
        mine = {p.partition for p in a.assignment()}
        theirs = b.assignment()
        seen = list(events)
        open_.remove(a)
        a.close()
        a2 = ck.Consumer({**base, "group.instance.id": "ia"})
        open_.append(a2)
        a2.subscribe(["sl"])
        wait_until(lambda: a2.poll(0.1) is None and {p.partition for p in a2.assignment()} == mine,
                   why="the restarted leader has its partition back")  # fmt: skip
        b.poll(0.5)
        assert (events, b.assignment()) == (seen, theirs)
    finally:
        for c in open_:
            c.close()


def test_a_new_groups_first_rebalance_waits_the_initial_delay(
    store: mqcore.Store, clock: Clock, pool: ThreadPoolExecutor
) -> None:
    """Kafka's group.initial.rebalance.delay.ms: the first member of an Empty group waits the
    delay, a member joining meanwhile extends it, and both land in generation 1 (with no
    delay the first would have completed alone, and the second forced generation 2; a
    kafka-python leader caught in that second rebalance stopped, seen under load)."""
    coord = GroupCoordinator(store, 0, "127.0.0.1", 9092, clock=clock,
                             initial_rebalance_delay=3.0)  # fmt: skip
    try:
        a, b = Client(coord, "a"), Client(coord, "b")
        ida = a.join("g").member_id
        first = pool.submit(a.join, "g", ida)
        wait_until(lambda: state(a, "g") == "PreparingRebalance")
        clock.now += 2.0  # within the delay: describing the group checks its deadlines
        assert state(a, "g") == "PreparingRebalance"
        idb = b.join("g").member_id
        second = pool.submit(b.join, "g", idb)  # extends the delay to 3 s from now
        wait_until(lambda: len(a.describe("g").members) == 2)
        clock.now += 2.5  # past the first delay, within the extended one
        assert state(a, "g") == "PreparingRebalance"
        clock.now += 1.0  # past the extended delay: the join completes
        ra, rb = first.result(WAIT), second.result(WAIT)
        assert ra.generation_id == rb.generation_id == 1
        assert sorted(m.member_id for m in ra.members) == sorted([ida, idb])
    finally:
        coord.close()


def test_consumer_assignments_decode_as_kafka_python_encodes_them() -> None:
    """The console's member list decodes the leader's assignment bytes (a client's bytes):
    compared with kafka-python's own encoder; anything else is None, never an exception."""
    from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberAssignment_v0 as A

    from mqcore.server.groups import consumer_assignment

    raw = A(0, [("orders", [2, 0]), ("pay", [1])], b"user").encode()
    assert consumer_assignment(raw) == {"orders": [0, 2], "pay": [1]}
    assert consumer_assignment(b"") == {}
    rng = random.Random(7)
    for cut in range(len(raw)):
        assert consumer_assignment(raw[:cut]) in (None, {})
    for _ in range(2000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        got = consumer_assignment(junk)
        assert got is None or isinstance(got, dict)
