"""What `mqcore serve` tells its operator: refused request versions, refused logins and refused
connections are warnings (a server whose clients all fail logged only "serving" and "stopped"
before), at most once a minute per address and reason, the lines held back counted; `mqcore
serve --log-level` chooses how much; every line has the `mqcore: LEVEL:` prefix, the SASL/PLAIN
without TLS warning included."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import child_env
from kafkaclients import KioWire, closed_by_peer

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import add_user  # noqa: E402
from mqcore.server.ratelog import RateLimitedLog  # noqa: E402

WAIT = 30.0


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and text in r.getMessage()]  # fmt: skip


def send_fetch_v13(srv: Server) -> None:
    """A Fetch v13 (topic IDs: not served): the server closes the connection."""
    payload = struct.pack(">hhih", 1, 13, 1, 3) + b"cli" + b"\0" * 40
    with socket.create_connection(srv.address, timeout=WAIT) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert closed_by_peer(sock)


def test_a_refused_version_is_a_warning_once_a_minute(
    kafka_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="mqcore"):
        for _ in range(3):
            send_fetch_v13(kafka_server)
    lines = warnings_of(caplog, "API 1 version 13 is not served (Fetch v0-v12)")
    assert len(lines) == 1 and "client cli" in lines[0]


def test_a_refused_login_is_a_warning_naming_the_user(
    store: mqcore.Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    users = tmp_path / "users"
    add_user(users, "alice", "right-password")
    with Server(store, "127.0.0.1:0", sasl_credentials=users) as srv:
        with caplog.at_level(logging.DEBUG, logger="mqcore"):
            wire = KioWire(srv.address)
            try:
                assert wire.call(17, 1, mechanism="PLAIN").error_code == 0
                r = wire.call(36, 2, auth_bytes=b"\0alice\0wrong")
                assert r.error_code == 58
            finally:
                wire.close()
    (line,) = warnings_of(caplog, "login refused from")
    assert "wrong user name or password for 'alice'" in line


def test_the_rate_limited_log_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = RateLimitedLog(logging.getLogger("mqcore.test"), interval=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="mqcore.test"):
        assert log.warning("k", "first")
        assert not log.warning("k", "again")
        assert not log.warning("k", "again")
        assert log.warning("other", "another key")
        now[0] += 61
        assert log.warning("k", "later")
    assert [r.getMessage() for r in caplog.records] == [
        "first", "another key", "later (2 more like it in the last 60 s not logged)"
    ]  # fmt: skip


def test_serve_logs_with_its_prefix_from_the_start(tmp_path: Path) -> None:
    """`mqcore serve --sasl-credentials` without TLS: the PLAIN warning comes with the same
    `mqcore: WARNING:` prefix as the rest (it was logged before the CLI's handler existed);
    --log-level info adds the start line."""
    users = tmp_path / "users"
    add_user(users, "alice", "pw-pw-pw")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "serve", str(tmp_path / "s"), "--create",
         "--listen", "127.0.0.1:0", "--sasl-credentials", str(users), "--log-level", "info"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # serving: it is up
    finally:
        proc.terminate()
        err: Any = proc.communicate(timeout=WAIT)[1]
    assert "mqcore: WARNING: SASL/PLAIN without TLS" in err
    assert "mqcore: INFO: serving" in err
