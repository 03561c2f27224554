"""Failed SASL logins on the Kafka listener back off per peer and per user (server/backoff.py),
with the same counts as the HTTP server's Basic logins: a peer that guessed wrong five times
gets its next attempts refused before any password or SCRAM proof is checked, even a right
one, until its wait is over; the HTTP API of the same server refuses that peer too."""

from __future__ import annotations

import base64
import secrets
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kafkaclients import KioWire

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402
from mqcore.server.backoff import LoginBackoff  # noqa: E402

SASL_AUTHENTICATION_FAILED = 58
PASSWORD = "right-Pa55word"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain_login(srv: Server, user: str, password: str) -> tuple[int, str | None]:
    wire = KioWire(srv.address)
    try:
        assert wire.call(17, 1, mechanism="PLAIN").error_code == 0
        r = wire.call(36, 2, auth_bytes=f"\0{user}\0{password}".encode())
        return int(r.error_code), r.error_message
    finally:
        wire.close()


def scram_first(srv: Server, user: str) -> tuple[int, str | None]:
    wire = KioWire(srv.address)
    try:
        assert wire.call(17, 1, mechanism="SCRAM-SHA-256").error_code == 0
        first = f"n,,n={user},r={secrets.token_urlsafe(18)}".encode()
        r = wire.call(36, 2, auth_bytes=first)
        return int(r.error_code), r.error_message
    finally:
        wire.close()


@pytest.fixture
def served(store: mqcore.Store, tmp_path: Path) -> Any:
    users = tmp_path / "users"
    add_user(users, "alice", PASSWORD)
    with Server(store, "127.0.0.1:0", sasl_credentials=users, http="127.0.0.1:0") as srv:
        assert srv.sasl is not None
        clock = Clock()
        srv.sasl.backoff.clock = clock  # one backoff: the HTTP server's is the same object
        yield srv, clock


def test_wrong_passwords_back_off_before_any_check(served: Any) -> None:
    srv, clock = served
    backoff: LoginBackoff = srv.sasl.backoff
    checked = []
    real = srv.sasl.check_password

    def counting(user: str, password: str) -> bool:
        checked.append(password)
        return real(user, password)

    srv.sasl.check_password = counting
    for i in range(5):  # the free ones: each checked and refused
        code, message = plain_login(srv, "alice", f"guess-{i}")
        assert code == SASL_AUTHENTICATION_FAILED and "wrong user name or password" in message
    assert len(checked) == 5
    code, message = plain_login(srv, "alice", PASSWORD)  # right, but during the backoff
    assert code == SASL_AUTHENTICATION_FAILED and "too many failed logins" in message
    code, message = scram_first(srv, "alice")  # SCRAM too, at its first message
    assert code == SASL_AUTHENTICATION_FAILED and "too many failed logins" in message
    assert len(checked) == 5  # neither was checked
    assert backoff.lockouts >= 1
    http = srv.http_server.url + "/v1/topics"
    token = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(
            urllib.request.Request(http, headers={"Authorization": f"Basic {token}"}), timeout=30
        )
    assert refused.value.code == 429  # the same peer over HTTP
    clock.now += backoff.wait("127.0.0.1", "alice") + 0.001
    assert plain_login(srv, "alice", PASSWORD) == (0, None)  # the wait is over
    assert len(checked) == 6


def test_a_successful_login_clears_the_peer(served: Any) -> None:
    srv, clock = served
    for i in range(4):
        assert plain_login(srv, "alice", f"guess-{i}")[0] == SASL_AUTHENTICATION_FAILED
    assert plain_login(srv, "alice", PASSWORD) == (0, None)
    for i in range(4):  # four more free ones: the success forgot the first four
        code, message = plain_login(srv, "alice", f"again-{i}")
        assert "wrong user name or password" in message
