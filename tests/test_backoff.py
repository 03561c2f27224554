"""LoginBackoff (mqcore.server.backoff) on a fake clock: a peer's free failures and its
doubling waits up to the cap, a user name's gentler backoff that spares peers which logged in
as that user before, forgetting, bounded memory, one log line per lockout."""

from __future__ import annotations

import logging

import pytest

from mqcore.server.backoff import (
    FIRST_WAIT,
    FORGET,
    PEER_CAP,
    PEER_FREE,
    USER_CAP,
    USER_FREE,
    LoginBackoff,
    peer_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def fail_until_waiting(b: LoginBackoff, clock: Clock, peer: str, user: str) -> list[float]:
    """Fail as soon as allowed, each time, until the cap holds; the waits earned."""
    waits = []
    for _ in range(40):
        clock.now += b.wait(peer, user)
        assert b.wait(peer, user) == 0
        waits.append(b.failed(peer, user))
    return waits


def test_a_peer_fails_freely_then_waits_doubling_up_to_the_cap(clock: Clock) -> None:
    b = LoginBackoff(clock=clock, user_free=10_000)
    waits = fail_until_waiting(b, clock, "10.0.0.1", "bob")
    assert waits[: PEER_FREE - 1] == [0] * (PEER_FREE - 1)
    assert waits[PEER_FREE - 1 : PEER_FREE + 3] == [FIRST_WAIT * 2**i for i in range(4)]
    assert max(waits) == PEER_CAP == waits[-1]
    clock.now += 1
    assert b.wait("10.0.0.1", "bob") == PEER_CAP - 1
    assert b.wait("10.0.0.1", "alice") == PEER_CAP - 1  # the peer waits, whatever the name
    assert b.wait("10.0.0.2", "bob") == 0  # another peer does not (bob is not locked yet)


def test_a_user_name_backs_off_gently_over_every_peer_but_not_for_its_own(clock: Clock) -> None:
    b = LoginBackoff(clock=clock)
    b.succeeded("10.0.0.9", "bob")  # bob's own machine, once
    waits = [b.failed(f"10.1.0.{i}", "bob") for i in range(USER_FREE + 8)]  # a spread guesser
    assert waits[: USER_FREE - 1] == [0] * (USER_FREE - 1)
    assert waits[USER_FREE - 1] == FIRST_WAIT and max(waits) == USER_CAP
    assert b.wait("10.2.0.1", "bob") == USER_CAP  # any new peer, as bob
    assert b.wait("10.2.0.1", "carol") == 0  # another name
    assert b.wait("10.0.0.9", "bob") == 0  # bob's machine is not locked out by strangers


def test_a_success_forgets_its_peers_failures_and_time_forgets_everything(clock: Clock) -> None:
    b = LoginBackoff(clock=clock)
    for _ in range(PEER_FREE + 2):
        b.failed("10.0.0.1", "bob")
    b.succeeded("10.0.0.1", "bob")
    assert b.wait("10.0.0.1", "bob") == 0 and b.failed("10.0.0.1", "bob") == 0
    assert b.wait("10.0.0.1", "bob") == 0
    for _ in range(USER_FREE + 2):
        b.failed("10.0.0.2", "carol")
    assert b.wait("10.0.0.3", "carol") > 0
    clock.now += FORGET + 1
    assert b.wait("10.0.0.2", "carol") == 0 == b.wait("10.0.0.3", "carol")
    assert b.failed("10.0.0.2", "carol") == 0  # counting starts afresh


def test_memory_is_bounded_the_least_recent_evicted(clock: Clock) -> None:
    b = LoginBackoff(clock=clock, max_keys=100, peer_free=0, user_free=0)
    for i in range(1000):
        b.failed(f"10.0.{i // 256}.{i % 256}", f"user{i}")
        b.succeeded(f"10.9.{i // 256}.{i % 256}", f"user{i}")
    assert b.wait("10.0.3.231", "user999") > 0  # the latest is kept
    assert b.wait("10.0.0.0", "user0") == 0  # the first was evicted
    assert b.tracked() == (100, 100, 100)


def test_each_lockout_is_logged_once_and_the_lines_are_rate_limited(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("mqcore.test.backoff")
    b = LoginBackoff(clock=clock, logger=log, log_interval=10, user_free=1000)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(PEER_FREE + 6):  # one lockout, however long it goes on
            b.failed("10.0.0.1", "bob")
        assert [r.getMessage() for r in caplog.records] == [
            f"{PEER_FREE} failed logins from 10.0.0.1 (last as 'bob'): its attempts wait "
            f"from now on, up to {PEER_CAP:g} s each"
        ]
        clock.now += 9
        for i in range(2, 5):  # three more lockouts within the interval: held back
            for _ in range(PEER_FREE + 1):
                b.failed(f"10.0.0.{i}", "x")
        assert len(caplog.records) == 1 and b.lockouts == 4
        clock.now += 1
        for _ in range(PEER_FREE + 1):
            b.failed("10.0.0.9", "y")
        assert len(caplog.records) == 2
        assert caplog.records[1].getMessage().endswith("; 3 more lockouts since the last line")


def test_peer_keys() -> None:
    assert peer_key("192.0.2.7") == "192.0.2.7"
    assert peer_key("2001:db8::1") == peer_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert peer_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert peer_key(None) == "" and peer_key("some-host") == "some-host"
