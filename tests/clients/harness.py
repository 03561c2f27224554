"""What the tests of Debian's Kafka clients and tools share (tests/test_clients_*.py,
tests/test_server_kcat.py): the codec of each stored batch, read from the segments as Kafka's
format lays them out; bounded waits on a condition; programs run with a deadline; a daemon
stopped however it ends; the configurations of tests/clients filled in; and the group lag
table the tools are compared with."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import mqcore

CONFIGS = Path(__file__).resolve().parent
WAIT = 60.0
N = 40  # messages a client program sends or reads per partition: several batches, quick
# what a client program puts after "<client> <i> " in each value: a batch of even one message
# compresses to less than its size, else librdkafka sends it uncompressed (it keeps a
# compressed batch only when smaller) and the codec checks would depend on batch sizes
PADDING = b"." * 200
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")  # Kafka's attribute values 0-4
T = TypeVar("T")


def batch_codecs(store: mqcore.Store, topic: str, partition: int = 0) -> list[str]:
    """The codec of every record batch of the partition, in log order, from its segment
    files: a v2 batch header has its length at byte 8 (what follows byte 12) and the codec in
    the low 3 bits of the attributes at bytes 21-22 (docs/format.md). What a client sent is
    what the store keeps, never re-encoded, so this is the client's choice."""
    directory = os.path.join(store.path, f"{topic}-{partition}")
    codecs: list[str] = []
    for base in store.segment_offsets(topic, partition):
        with open(os.path.join(directory, f"{base:020d}.log"), "rb") as f:
            data = f.read()
        pos = 0
        while pos + 23 <= len(data):
            length = int.from_bytes(data[pos + 8 : pos + 12], "big")
            if length == 0:  # a preallocated tail
                break
            codecs.append(CODECS[data[pos + 22] & 7])
            pos += 12 + length
    return codecs


def wait_for(condition: Callable[[], T], what: str | Callable[[], str], timeout: float = WAIT) -> T:
    """The first true value of `condition`, polled every 0.1 s; fails naming `what` (or what
    it returns then: a daemon's log) once `timeout` seconds pass without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {said}")
        time.sleep(0.1)


def run(argv: list[str], *, stdin: bytes | None = None, env: dict[str, str] | None = None,
        timeout: float = WAIT) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`argv` to its end within `timeout` seconds, output as text (bytes that are not UTF-8
    escaped); the caller checks the exit status."""
    proc = subprocess.run(
        argv, input=stdin, env=env, capture_output=True, timeout=timeout, check=False
    )
    return subprocess.CompletedProcess(
        argv, proc.returncode, proc.stdout.decode("utf-8", "surrogateescape"),
        proc.stderr.decode("utf-8", "surrogateescape"),
    )  # fmt: skip


@contextmanager
def running(argv: list[str], log: str, env: dict[str, str] | None = None) -> Iterator[Any]:
    """`argv` as a background process (a daemon kept in the foreground) writing stdout and
    stderr to the file `log`; SIGTERM at the end, SIGKILL if it has not exited 10 s later."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def tail(path: str, n: int = 3000) -> str:
    """The last `n` characters of a log file, for an assertion's message."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-n:]
    except OSError as e:
        return f"({path}: {e})"


def committed(store: mqcore.Store, group: str) -> dict[tuple[str, int], tuple[int, int | None]]:
    """(topic, partition) -> (committed offset, lag) of `group`, as `mqcore groups` and
    `Store.group_lag` show it."""
    return {
        (x.topic, x.partition): (x.committed, x.lag) for x in store.group_lag(group).get(group, [])
    }


def fill_config(name: str, path: str, **fields: str) -> str:
    """tests/clients/NAME with its @FIELD@s (upper case) filled in, written to `path`."""
    text = (CONFIGS / name).read_text()
    for key, value in fields.items():
        text = text.replace(f"@{key.upper()}@", value)
    assert not re.search(r"@[A-Z_]+@", text), f"a field of {name} is not filled in:\n{text}"
    Path(path).write_text(text)
    return path


def free_port() -> int:
    """A loopback port nothing listens on now, for a program that cannot be told port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client(
    program: list[str], command: str, srv: Any, topic: str, *args: str
) -> list[dict[str, Any]]:
    """Run a client program of tests/clients (its argv up to the command) to its end; the
    JSON lines it printed. Fails with its stderr when it fails (a request the server refused
    shows up there as EOF)."""
    argv = [*program, command, "-brokers", srv.bootstrap, "-topic", topic, "-timeout", "30"]
    proc = run([*argv, *args], timeout=90)
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr[-2000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def fill(store: mqcore.Store, topic: str, partitions: int, compression: str = "none") -> None:
    """N messages in each partition, keyed, in batches of 10 with `compression`."""
    store.create_topic(topic, partitions=partitions)
    for p in range(partitions):
        for start in range(0, N, 10):
            store.append_batch(
                topic, [b"p%d value %d" % (p, i) for i in range(start, start + 10)],
                keys=[b"k%d" % i for i in range(start, start + 10)], partition=p,
                compression=compression,
            )  # fmt: skip


def stored(store: mqcore.Store, topic: str, partitions: int) -> list[tuple[int, int, str, str]]:
    """Every message of `topic` as (partition, offset, key, value), in log order."""
    return [
        (p, m.offset, (m.key or b"").decode(), (m.value or b"").decode())
        for p in range(partitions)
        for m in store.read(topic, p, 0, 10 * N)
    ]


def seen(records: list[dict[str, Any]]) -> list[tuple[int, int, str, str]]:
    """What a client printed, in the order it saw each partition's messages."""
    return sorted(
        ((r["partition"], r["offset"], r["key"], r["value"]) for r in records),
        key=lambda r: r[0],  # stable: keeps each partition's order as seen
    )


def check_produced(store: mqcore.Store, topic: str, prefix: str, codec: str) -> None:
    """Partition 1 holds N messages k<i> -> "<prefix> <i> <padding>" in order, in batches of
    `codec`.
    (This module's asserts say what they saw themselves: pytest rewrites only test files.)"""
    got = [(m.offset, m.key, m.value) for m in store.read(topic, 1, 0, 10 * N)]
    want = [(i, b"k%d" % i, b"%s %d %s" % (prefix.encode(), i, PADDING)) for i in range(N)]
    assert got == want, f"stored {got[:5]}... ({len(got)}), wanted {want[:5]}... ({N})"
    codecs = batch_codecs(store, topic, 1)
    assert set(codecs) == {codec}, f"batches stored with {codecs}, sent with {codec}"
