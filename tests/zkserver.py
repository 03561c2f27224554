"""A real ZooKeeper for the tests (Debian's `zookeeper` package: `make test-tools` installs it):
a standalone server on a free loopback port with its own data directory, which a test can stop
and start again on the same port and data (an outage that ends)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
TICK_MS = 500
# ZooKeeper expires a session on its tick after the timeout (an expiry bucket per tick), so the
# tick is how late an expiry can be; the sessions it accepts are set here, not 2 to 20 ticks
MIN_SESSION_MS = 1000
MAX_SESSION_MS = 30000
WAIT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(port: int) -> bool:
    """Whether the ZooKeeper on the loopback port serves requests: its `srvr` command shows
    its mode then (it accepts connections, and closes them, before that)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"srvr")
            return b"Mode:" in sock.makefile("rb").read()
    except OSError:
        return False


class ZooKeeper:
    """One ZooKeeper process: `address` (HOST:PORT), `start()`, `stop()` (SIGKILL: an outage,
    not a shutdown), `url(path)` for a coordinator URL."""

    def __init__(self, directory: Path, tick_ms: int = TICK_MS):
        java = shutil.which("java")
        if java is None or not os.path.exists(ZOOKEEPER_JAR):
            pytest.skip("ZooKeeper is not installed (apt-get install zookeeper; make test-tools)")
        self.java = java
        self.directory = directory
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = directory / "zookeeper.log"
        self.tick_ms = tick_ms
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, path: str = "/mqcore") -> str:
        return f"zk://{self.address}{path}"

    def start(self) -> ZooKeeper:
        options = ["-Dzookeeper.admin.enableServer=false",
                   "-Dzookeeper.4lw.commands.whitelist=srvr"]  # fmt: skip
        config = self.directory / "zoo.cfg"
        config.write_text(f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                          f"dataDir={self.directory / 'data'}\ntickTime={self.tick_ms}\n"
                          f"minSessionTimeout={MIN_SESSION_MS}\n"
                          f"maxSessionTimeout={MAX_SESSION_MS}\n")  # fmt: skip
        argv = [self.java, *options, "-cp", ZOOKEEPER_JAR, MAIN, str(config)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT
        while not serving(self.port):
            assert self.proc.poll() is None, self.tail()
            assert time.monotonic() < deadline, f"ZooKeeper did not serve in {WAIT} s"
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(WAIT)
        self.proc = None

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError as e:
            return f"({self.log}: {e})"
