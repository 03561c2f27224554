"""`mqcore serve` fed by the system log daemons Debian 12 ships with a Kafka output: rsyslog's
omkafka (rsyslog-kafka) and syslog-ng's kafka-c destination (syslog-ng-mod-rdkafka), both over
Debian's librdkafka 2.0.2. Each test runs a real daemon with a configuration of ours
(tests/clients/rsyslog.conf, syslog-ng.conf) that reads a Unix datagram socket of the test's and
writes to the server; the test sends syslog lines there and checks that every one arrives
intact, in order, in batches of the codec the daemon was told to use. `make test-tools`
installs rsyslog-kafka and unpacks syslog-ng (it conflicts with rsyslog) as root; a missing
daemon skips its tests."""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from clients.harness import batch_codecs, fill_config, running, tail, wait_for

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytestmark = pytest.mark.slow  # outside programs: a build, a daemon or an interpreter each

SYSLOG_NG_UNPACKED = "/opt/mqcore-test-tools/syslog-ng"  # make test-tools puts it there
N = 200
CODECS = ["none", "gzip"]


@pytest.fixture
def short_dir() -> Iterator[str]:
    """A directory with a short path: a Unix socket's path holds at most 107 bytes."""
    d = tempfile.mkdtemp(prefix="mq-syslog-", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def send_lines(path: str, what: str) -> list[bytes]:
    """N syslog datagrams to the daemon's socket (once it exists); the texts it must pass on."""
    wait_for(lambda: os.path.exists(path), f"{what} to open {path}")
    texts = [b"%s line %d: a log line that compresses, compresses, compresses" % (
        what.encode(), i) for i in range(N)]  # fmt: skip
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for text in texts:
            sock.sendto(b"<13>mqtest: " + text, path)
    return texts


def check_arrived(
    store: mqcore.Store, topic: str, texts: list[bytes], codec: str, log: str
) -> None:
    """Every text arrived in order, and every batch has `codec`."""
    wait_for(
        lambda: store.end_offset(topic) >= len(texts), lambda: f"{len(texts)} messages\n{tail(log)}"
    )
    assert [m.value for m in store.read(topic, 0, 0, 2 * N)] == texts
    assert set(batch_codecs(store, topic)) == {codec}


def omkafka() -> str:
    """rsyslogd, when its omkafka module is there; else skip."""
    rsyslogd = shutil.which("rsyslogd") or shutil.which("rsyslogd", path="/usr/sbin:/sbin")
    if rsyslogd is None or not glob.glob("/usr/lib/*/rsyslog/omkafka.so"):
        pytest.skip("rsyslog's omkafka is not installed (apt-get install rsyslog-kafka; "
                    "make test-tools as root)")  # fmt: skip
    return rsyslogd


@pytest.mark.parametrize("codec", CODECS)
def test_rsyslog_omkafka_delivers_every_line(
    kafka_server: Any, store: mqcore.Store, short_dir: str, codec: str
) -> None:
    """rsyslogd with omkafka: N lines in, N messages out, in order, with the codec asked."""
    rsyslogd = omkafka()
    store.create_topic("rsyslog")
    sock = os.path.join(short_dir, "log.sock")
    conf = fill_config(
        "rsyslog.conf",
        os.path.join(short_dir, "rsyslog.conf"),
        workdir=short_dir,
        bootstrap=kafka_server.bootstrap,
        topic="rsyslog",
        codec=codec,
        socket=sock,
    )
    log = os.path.join(short_dir, "rsyslogd.log")
    argv = [rsyslogd, "-n", "-f", conf, "-i", os.path.join(short_dir, "rsyslogd.pid")]
    with running(argv, log):
        texts = send_lines(sock, "rsyslog")
        check_arrived(store, "rsyslog", texts, codec, log)


def syslog_ng() -> tuple[list[str], dict[str, str], str]:
    """(argv prefix, environment, config version) of a syslog-ng with the kafka module: the
    system's, else the one make test-tools unpacked; else skip."""
    env = dict(os.environ)
    system = shutil.which("syslog-ng") or shutil.which("syslog-ng", path="/usr/sbin:/sbin")
    if system and glob.glob("/usr/lib/syslog-ng/*/libkafka.so"):
        argv = [system]
    elif os.access(f"{SYSLOG_NG_UNPACKED}/usr/sbin/syslog-ng", os.X_OK):
        (modules,) = glob.glob(f"{SYSLOG_NG_UNPACKED}/usr/lib/syslog-ng/*/libkafka.so")
        argv = [f"{SYSLOG_NG_UNPACKED}/usr/sbin/syslog-ng",
                f"--module-path={os.path.dirname(modules)}"]  # fmt: skip
        env["LD_LIBRARY_PATH"] = f"{SYSLOG_NG_UNPACKED}/usr/lib/syslog-ng"
    else:
        pytest.skip("syslog-ng's kafka module is not installed (syslog-ng-mod-rdkafka; "
                    "make test-tools as root unpacks it)")  # fmt: skip
    out = subprocess.run([*argv, "--version"], env=env, capture_output=True, text=True, check=True)
    version = re.search(r"^syslog-ng \d+ \((\d+\.\d+)", out.stdout, re.M)
    assert version, out.stdout
    return argv, env, version.group(1)


@pytest.mark.parametrize("codec", CODECS)
def test_syslog_ng_kafka_destination_delivers_every_line(
    kafka_server: Any, store: mqcore.Store, short_dir: str, codec: str
) -> None:
    """syslog-ng's kafka-c: N lines in, N messages out, in order, with the codec asked."""
    argv, env, version = syslog_ng()
    store.create_topic("syslog-ng")
    sock = os.path.join(short_dir, "log.sock")
    conf = fill_config(
        "syslog-ng.conf",
        os.path.join(short_dir, "syslog-ng.conf"),
        version=version,
        bootstrap=kafka_server.bootstrap,
        topic="syslog-ng",
        codec=codec,
        socket=sock,
    )
    log = os.path.join(short_dir, "syslog-ng.log")
    state = {
        flag: os.path.join(short_dir, name)
        for flag, name in [("-R", "persist"), ("-p", "pid"), ("-c", "ctl")]
    }
    argv = [*argv, "-F", "-e", "-f", conf, *(x for item in state.items() for x in item)]
    with running(argv, log, env=env):
        texts = send_lines(sock, "syslog-ng")
        check_arrived(store, "syslog-ng", texts, codec, log)
