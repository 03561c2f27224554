"""`mqcore serve` fed by ProFTPD's mod_kafka (Debian 12: proftpd-mod-kafka 0.1, over
librdkafka 2.0.2): a proftpd of ours (tests/clients/proftpd.conf) publishes a JSON object to
the topic `proftpd` for every FTP connection; the test opens N sessions and checks that N
objects arrive, each naming the client's address. `make test-tools` installs
proftpd-mod-kafka as root; without it the test skips."""

from __future__ import annotations

import ftplib
import json
import os
import shutil
from typing import Any

import pytest
from clients.harness import fill_config, free_port, running, tail, wait_for

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytestmark = pytest.mark.slow  # outside programs: a build, a daemon or an interpreter each

MODULE = "/usr/lib/proftpd/mod_kafka.so"
N = 10


def test_proftpd_mod_kafka_logs_every_connection(
    kafka_server: Any, store: mqcore.Store, tmp_path: Any
) -> None:
    """N FTP sessions, N JSON objects in the topic, in order, each with the client's address."""
    proftpd = shutil.which("proftpd") or shutil.which("proftpd", path="/usr/sbin")
    if proftpd is None or not os.path.exists(MODULE):
        pytest.skip("proftpd's mod_kafka is not installed (apt-get install proftpd-mod-kafka; "
                    "make test-tools)")  # fmt: skip
    store.create_topic("proftpd")
    port = free_port()
    conf = fill_config("proftpd.conf", str(tmp_path / "proftpd.conf"), dir=str(tmp_path),
                       port=str(port), bootstrap=kafka_server.bootstrap)  # fmt: skip
    log = str(tmp_path / "proftpd.out")
    with running([proftpd, "-n", "-c", conf], log) as proc:
        # listening once it says so on stderr (a probing connection would be one more message)
        wait_for(lambda: "STARTUP" in tail(log) or proc.poll() is not None, "proftpd to listen")
        assert proc.poll() is None, tail(log)
        for _ in range(N):
            ftp = ftplib.FTP()
            ftp.connect("127.0.0.1", port, timeout=30)
            ftp.quit()
        wait_for(
            lambda: store.end_offset("proftpd") >= N,
            lambda: f"{N} messages\n{tail(log)}\n{tail(str(tmp_path / 'kafka.log'))}",
        )
    values = [json.loads(m.value or b"") for m in store.read("proftpd", 0, 0, 2 * N)]
    assert values == [{"remote_ip": "127.0.0.1"}] * N
