"""A cluster of real `mqcore serve` processes for the tests (issue 33): three brokers, each its
own process and store, coordinated by a real ZooKeeper (tests/zkserver.py), each behind two
TCP links the test can cut and heal.

Why links (a per-link TCP proxy) rather than network namespaces: every broker and ZooKeeper
run on loopback in the test's namespace, so a proxy in front of each broker's Kafka listener
(the address it advertises: clients and the other brokers all come through it) and in front
of its ZooKeeper connection cuts exactly that broker off, both ways, at once, and heals it
again, without root and without routing; an established connection is reset at the cut, as a
partitioned peer's TCP would eventually be. A namespace would also cut what the test does not
mean to (its loopback), and needs root that a developer's run may not have.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from zkserver import ZooKeeper, free_port

WAIT = 60.0
PUMP_BYTES = 1 << 16


class Link:
    """A TCP proxy on 127.0.0.1 to `target_port`. `cut()` resets every connection through
    it and refuses new ones (accepted, then closed at once) until `heal()`."""

    def __init__(self, target_port: int, name: str):
        self.target_port = target_port
        self.name = name
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.up = True
        self.closed = False
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._thread = threading.Thread(target=self._accept, name=f"link-{name}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.up or self.closed:
                _reset(client)
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _reset(client)
                continue
            server.settimeout(None)
            for sock in (client, server):  # each write goes on at once, as the peers' own do
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True,
                             name=f"link-{self.name}-pump").start()  # fmt: skip

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select(timeout=1.0):
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(PUMP_BYTES)
                    if not data:
                        return
                    key.data.sendall(data)
                with self._lock:
                    if (a, b) not in self._pairs:
                        return
        except OSError:
            return
        finally:
            sel.close()
            with self._lock:
                if (a, b) in self._pairs:
                    self._pairs.remove((a, b))
            _reset(a)
            _reset(b)

    def cut(self) -> None:
        with self._lock:
            self.up = False
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            _reset(a)
            _reset(b)

    def heal(self) -> None:
        self.up = True

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.sock.close()


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a peer that vanished is seen."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    with contextlib.suppress(OSError):
        s.close()


class BrokerProcess:
    """One `mqcore serve --coordinator` process: its store, its ports and its two links."""

    def __init__(self, node_id: int, directory: Path, zk: ZooKeeper, extra: list[str],
                 env: dict[str, str] | None = None, links: bool = True):  # fmt: skip
        self.node_id = node_id
        self.directory = directory
        self.port = free_port()
        self.zk = zk
        # links=False: clients and peers reach the broker, and it ZooKeeper, directly (what
        # a benchmark measures); the links stay, unused
        self.links = links
        self.kafka_link = Link(self.port, f"kafka-{node_id}")
        self.zk_link = Link(int(zk.address.rsplit(":", 1)[1]), f"zk-{node_id}")
        self.extra = extra
        self.env = env  # None: the test suite's child_env() (mqcore importable)
        self.proc: subprocess.Popen[str] | None = None
        self.log = directory.parent / f"broker-{node_id}.log"
        self.stopped = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.kafka_link.port if self.links else self.port}"

    def start(self) -> None:
        if self.env is None:
            from conftest import child_env

            self.env = child_env()
        zk = f"127.0.0.1:{self.zk_link.port}" if self.links else self.zk.address
        args = [sys.executable, "-m", "mqcore.cli", "serve", str(self.directory), "--create",
                "--listen", f"127.0.0.1:{self.port}", "--advertised-port",
                self.address.rsplit(":", 1)[1], "--node-id", str(self.node_id), "--coordinator",
                f"zk://{zk}/cluster", "--log-level", "info", *self.extra]  # fmt: skip
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(args, env=self.env, stdout=subprocess.PIPE,
                                         stderr=err, text=True)  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "serving" not in line:
            self.proc.kill()
            self.proc.wait(WAIT)
            raise AssertionError(f"broker {self.node_id} did not start: {line!r}; "
                                 f"{self.log.read_text()[-3000:]}")  # fmt: skip
        self.stopped = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.stopped:
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(WAIT)
        self._close_pipe()
        self.stopped = False

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.stopped:
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)
        self._close_pipe()
        self.stopped = False

    def cut(self) -> None:
        self.kafka_link.cut()
        self.zk_link.cut()

    def heal(self) -> None:
        self.kafka_link.heal()
        self.zk_link.heal()


class ProcessCluster:
    """`n` brokers (node IDs 1..n) on one ZooKeeper, started and stopped by the test."""

    def __init__(self, zk: ZooKeeper, directory: Path, n: int = 3, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, links: bool = True):  # fmt: skip
        self.zk = zk
        self.brokers = {i: BrokerProcess(i, directory / f"broker-{i}", zk, extra or [], env,
                                         links) for i in range(1, n + 1)}  # fmt: skip
        self._coordinator: Any = None
        self._coordinator_lock = threading.Lock()

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values())

    def start(self) -> ProcessCluster:
        for b in self.brokers.values():
            b.start()
        return self

    def stop(self) -> None:
        for b in self.brokers.values():
            b.terminate()
        for b in self.brokers.values():
            b.kafka_link.close()
            b.zk_link.close()
        if self._coordinator is not None:
            self._coordinator.close()

    @property
    def coordinator(self) -> Any:
        """A ZooKeeper session of the test's own, reading the cluster's state."""
        from mqcore.cluster.zk import ZkCoordinator

        with self._coordinator_lock:  # the tests' worker threads ask for it at once
            if self._coordinator is None:
                self._coordinator = ZkCoordinator(self.zk.url("/cluster"),
                                                  connect_timeout=20.0).start()  # fmt: skip
            return self._coordinator

    def state(self, topic: str, partition: int) -> Any:
        return self.coordinator.partition_state(topic, partition)

    def logs(self) -> str:
        return "\n".join(f"--- broker {b.node_id}\n{b.log.read_text()[-4000:]}"
                         for b in self.brokers.values() if b.log.exists())  # fmt: skip


def until(check: Callable[[], Any], what: str, timeout: float = WAIT, cluster: Any = None) -> Any:
    """Poll `check` (bounded) until it returns a true value; that value."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            more = "" if cluster is None else "\n" + cluster.logs()
            raise AssertionError(f"timed out waiting for {what}{more}")
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


@contextlib.contextmanager
def process_cluster(zk: ZooKeeper, directory: Path, n: int = 3, extra: list[str] | None = None,
                    env: dict[str, str] | None = None,
                    links: bool = True) -> Iterator[ProcessCluster]:  # fmt: skip
    cluster = ProcessCluster(zk, directory, n, extra, env, links)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def read_partition(path: Path, topic: str, partition: int) -> tuple[bytes, list[tuple[int, bytes]]]:
    """A stopped broker's replica of one partition: its whole log's stored bytes and its
    (offset, value) records, read from its store directory."""
    import mqcore

    with mqcore.open(str(path), read_only=True) as store:
        handle = store.log.replica(topic, partition)
        raw = bytes(handle.read_bytes(handle.log_start_offset, 1 << 30, "log_end").data)
        records = [(m.offset, bytes(m.value or b""))
                   for m in store.read(topic, partition, 0, 1 << 30)]  # fmt: skip
    return raw, records


def check_histories(
    replicas: dict[int, list[tuple[int, bytes]]], acknowledged: set[bytes]
) -> dict[bytes, int]:
    """The history checker of one partition: `replicas` each replica's (offset, value) list.
    No two replicas disagree at any offset they both hold, offsets have no gaps, no value is
    at two offsets, and every acknowledged value of this partition is at one offset on every
    replica. Returns value -> offset."""
    longest = max(replicas.values(), key=len)
    for node, records in replicas.items():
        offsets = [o for o, _ in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, (
            f"broker {node}: offsets with gaps"
        )
        common = longest[: len(records)]
        for (o1, v1), (o2, v2) in zip(common, records, strict=True):
            assert (o1, v1) == (o2, v2), f"broker {node} holds {v2!r} at {o2}, another {v1!r}"
    where: dict[bytes, int] = {}
    for offset, value in longest:
        assert value not in where, f"{value!r} at offsets {where[value]} and {offset}"
        where[value] = offset
    for node, records in replicas.items():
        held = {v for _, v in records}
        missing = {v for v in acknowledged if v in where and v not in held}
        assert not missing, f"broker {node} lacks acknowledged {sorted(missing)[:5]}"
    return where
