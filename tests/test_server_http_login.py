"""Failed HTTP Basic logins back off (issue 31: 738 wrong passwords were checked in 5 s): a
real HttpServer over real HTTP, the password checks (PBKDF2) counted where they happen."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from httpclient import Answer, Client

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytest.importorskip("starlette", reason="the server extra (starlette) is missing")
from mqcore.server.auth import PLAIN, Sasl, add_user  # noqa: E402
from mqcore.server.backoff import PEER_FREE, LoginBackoff  # noqa: E402
from mqcore.server.http import HttpServer, create_app  # noqa: E402
from mqcore.server.httpauth import HttpAuth  # noqa: E402


class Counted(Sasl):
    """The credentials, counting the passwords checked against them (each one is PBKDF2)."""

    def __init__(self, path: Path):
        super().__init__(path, (PLAIN,))
        self.checks = 0
        self._count_lock = threading.Lock()

    def check_password(self, user: str, password: str) -> bool:
        with self._count_lock:
            self.checks += 1
        return super().check_password(user, password)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def creds(tmp_path: Path) -> Path:
    path = tmp_path / "users"
    add_user(path, "alice", "wonder")
    return path


def serve(store: mqcore.Store, auth: HttpAuth) -> HttpServer:
    return HttpServer(create_app(store, console=False, auth=auth))


def test_wrong_passwords_back_off_with_429_before_any_check(
    store: mqcore.Store, creds: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After PEER_FREE wrong passwords from one address, each attempt is answered 429 with
    Retry-After and its password is not checked (no PBKDF2), the right one included; the
    lockout is logged once."""
    sasl = Counted(creds)
    with serve(store, HttpAuth(sasl)) as server, caplog.at_level(logging.WARNING):
        answers = [Client(server.url, "alice", f"guess-{i}").get("/v1/topics") for i in range(30)]
        right = Client(server.url, "alice", "wonder").get("/v1/topics")
    assert [a.status for a in answers] == [401] * PEER_FREE + [429] * (30 - PEER_FREE)
    assert sasl.checks == PEER_FREE
    refused = answers[-1]
    assert refused.error == "AuthenticationError" and int(refused.headers["retry-after"]) >= 1
    assert "try again in" in refused.json()["message"]
    assert right.status == 429 and sasl.checks == PEER_FREE
    warnings = [r for r in caplog.records if r.name == "mqcore.server.http"]
    assert [r.getMessage().split(":")[0] for r in warnings] == [
        f"{PEER_FREE} failed logins from 127.0.0.1 (last as 'alice')"
    ]


def test_parallel_guesses_do_not_get_round_the_backoff(store: mqcore.Store, creds: Path) -> None:
    """40 wrong passwords sent at once from one address: still only PEER_FREE are checked
    (the checks of one peer run one at a time), the rest answered 429."""
    sasl = Counted(creds)
    with serve(store, HttpAuth(sasl)) as server, ThreadPoolExecutor(40) as pool:
        clients = [Client(server.url, "alice", f"guess-{i}") for i in range(40)]
        answers: list[Answer] = list(pool.map(lambda c: c.get("/v1/topics"), clients))
    assert sorted(a.status for a in answers) == [401] * PEER_FREE + [429] * (40 - PEER_FREE)
    assert sasl.checks == PEER_FREE


@pytest.fixture
def fake_clock_server(store: mqcore.Store, creds: Path) -> Iterator[tuple[HttpServer, Clock]]:
    clock = Clock()
    auth = HttpAuth(Counted(creds), backoff=LoginBackoff(clock=clock))
    with serve(store, auth) as server:
        yield server, clock


def test_the_wait_ends_and_a_right_password_clears_it(
    fake_clock_server: tuple[HttpServer, Clock],
) -> None:
    server, clock = fake_clock_server
    for i in range(PEER_FREE):
        assert Client(server.url, "alice", f"guess-{i}").get("/v1/topics").status == 401
        clock.now += 0.001
    wait = int(Client(server.url, "alice", "wonder").get("/v1/topics").headers["retry-after"])
    clock.now += wait
    assert Client(server.url, "alice", "wonder").get("/v1/topics").status == 200
    assert Client(server.url, "alice", "guess").get("/v1/topics").status == 401  # free again
