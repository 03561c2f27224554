"""Abandoned consumer groups expire (issue 31), as Kafka's offsets.retention.minutes expires
them (KIP-211): a group with no member, no commit and no member seen for the retention loses
its committed offsets, in tombstones as durable as a commit, and leaves group_lag() and every
listing. Before, 5,000 one-member groups a client made and left stayed listed forever. Time is
the store's clock, a fake one here."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import mqcore
from mqcore.consume.expiry import OFFSETS_RETENTION_MS
from mqcore.errors import InvalidConfigError

DAY = 24 * 3600 * 1000
T0 = 1_700_000_000_000


class FakeClock:
    """The store's clock, moved by hand (ms)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def commit(store: mqcore.Store, group: str, offset: int = 1) -> None:
    """A commit as `assign()` consumers make it: the group has no member."""
    store.alter_group_offsets(group, {("t", 0): offset})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(store_path: str, clock: FakeClock) -> Iterator[mqcore.Store]:
    s = mqcore.open(store_path, flush="os", clock=clock, offsets_retention_ms=DAY,
                    offsets_retention_check_interval_ms=0)  # fmt: skip
    s.create_topic("t")
    s.append_batch("t", [b"a", b"b"])
    yield s
    s.close()


def test_kafkas_default_retention_is_seven_days() -> None:
    assert OFFSETS_RETENTION_MS == 10_080 * 60_000


def test_a_group_without_members_expires_a_retention_after_its_last_commit(
    store: mqcore.Store, clock: FakeClock, store_path: str
) -> None:
    clock.now = T0 + DAY  # the store opened at T0: its own floor is past
    commit(store, "gone")
    commit(store, "kept")
    clock.now += DAY // 2
    commit(store, "kept", 2)
    clock.now += DAY // 2 - 1
    assert store.expire_groups() == []
    clock.now += 1
    assert store.expire_groups() == ["gone"]
    assert sorted(store.group_lag()) == ["kept"]
    assert store.group_type("gone") is None  # the name is free again
    clock.now += DAY // 2
    assert store.expire_groups() == ["kept"] and store.group_lag() == {}
    store.close()
    with mqcore.open(store_path, read_only=True) as ro:  # tombstones, durable
        assert ro.group_lag() == {}


def test_many_abandoned_groups_go_in_one_pass(store: mqcore.Store, clock: FakeClock) -> None:
    clock.now = T0 + DAY
    groups = [f"g{i:04d}" for i in range(300)]
    offsets = store.offset_store()
    from mqcore.consume.offsets import OffsetAndMetadata

    for g in groups:
        offsets.commit(g, {("t", 0): OffsetAndMetadata(1, "", clock.now)})
    clock.now += DAY
    assert store.expire_groups() == groups
    assert store.group_lag() == {}


def test_a_group_with_members_is_kept_and_counts_from_its_last_member(
    store: mqcore.Store, clock: FakeClock
) -> None:
    clock.now = T0 + DAY
    c = store.consumer("live", "t", auto_offset_reset="earliest")
    assert len(c.poll(10)) == 2
    c.commit()
    clock.now += 10 * DAY  # a member that stopped committing is still a member
    assert store.expire_groups() == []
    c.close()
    clock.now += DAY - 1  # the pass saw it with a member 10 days in: counted from then
    assert store.expire_groups() == []
    clock.now += 1
    assert store.expire_groups() == ["live"]


def test_members_of_a_member_source_keep_their_group(store: mqcore.Store, clock: FakeClock) -> None:
    """mqcore serve's coordinator counts its Kafka clients through add_member_source."""
    clock.now = T0 + DAY
    commit(store, "wire")
    members = {"wire": 1}
    source = members.get
    store.add_member_source(lambda g: source(g, 0))
    clock.now += 5 * DAY
    assert store.expire_groups() == []
    members.clear()
    assert store.expire_groups() == []  # seen with a member a moment ago
    clock.now += DAY
    assert store.expire_groups() == ["wire"]


def test_a_reopened_store_gives_old_groups_a_full_retention(
    store_path: str, clock: FakeClock
) -> None:
    """After a restart (or a server down for days), no group expires before a retention has
    passed since the open: its consumers get the time to come back."""
    with mqcore.open(store_path, flush="os", clock=clock, offsets_retention_ms=DAY) as s:
        s.create_topic("t")
        s.append("t", b"a")
        commit(s, "old")
    clock.now += 30 * DAY
    with mqcore.open(store_path, flush="os", clock=clock, offsets_retention_ms=DAY) as s:
        assert s.expire_groups() == []
        clock.now += DAY
        assert s.expire_groups() == ["old"]


def test_a_commit_after_the_cutoff_keeps_its_group(store: mqcore.Store, clock: FakeClock) -> None:
    """The newest commit is checked under the offsets' lock, where commits are made: one that
    landed after the pass chose its candidates keeps the group."""
    clock.now = T0 + DAY
    commit(store, "g")
    offsets = store.offset_store()
    assert offsets.expire({"g": clock.now - 1}) == []
    assert offsets.expire({"g": clock.now}) == ["g"]


def test_the_background_pass_tells_its_listeners(store_path: str, clock: FakeClock) -> None:
    heard: list[list[str]] = []
    expired = threading.Event()

    def listener(groups: list[str]) -> None:
        heard.append(groups)
        if groups:
            expired.set()

    with mqcore.open(store_path, flush="os", clock=clock, offsets_retention_ms=DAY,
                     offsets_retention_check_interval_ms=20) as s:  # fmt: skip
        s.create_topic("t")
        s.append("t", b"a")
        s.add_group_expiry_listener(listener)
        assert "group_expiry" in s.log.tasks.names()
        clock.now += DAY
        commit(s, "abandoned")
        clock.now += DAY
        assert expired.wait(30)
        assert ["abandoned"] in heard and s.group_lag() == {}
        s.remove_group_expiry_listener(listener)


def test_retention_minus_one_keeps_every_group(store_path: str, clock: FakeClock) -> None:
    with mqcore.open(store_path, flush="os", clock=clock, offsets_retention_ms=-1) as s:
        s.create_topic("t")
        s.append("t", b"a")
        commit(s, "g")
        clock.now += 1000 * DAY
        assert s.expire_groups() == [] and list(s.group_lag()) == ["g"]


@pytest.mark.parametrize(
    "bad",
    [{"offsets_retention_ms": 0}, {"offsets_retention_ms": -2}, {"offsets_retention_ms": 1.5},
     {"offsets_retention_check_interval_ms": -1}],
)  # fmt: skip
def test_bad_retention_settings_are_refused(store_path: str, bad: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError, match=next(iter(bad))):
        mqcore.open(store_path, **bad)


def test_a_read_only_store_expires_nothing(store_path: str, clock: FakeClock) -> None:
    with mqcore.open(store_path, flush="os", clock=clock) as s:
        s.create_topic("t")
    with mqcore.open(store_path, read_only=True) as ro:
        assert "group_expiry" not in ro.log.tasks.names()
        with pytest.raises(mqcore.errors.ReadOnlyStoreError):
            ro.expire_groups()
