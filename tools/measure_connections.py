"""What hostile connections cost `mqcore serve`, measured on a real server process: its
resident memory and threads (from /proc) with N idle connections open, and with M connections
that each announce a request of S bytes and send only its first kilobyte; and how long a normal
client's ApiVersions takes meanwhile. The figures of issue 31's closing note and
docs/server.md "Limits and bad input" come from

    .venv/bin/python tools/measure_connections.py --idle 10000 --announcing 100

(PYTHONPATH=<another tree>/src measures another version of mqcore the same way; give it
--server '{}' when that version has no per-address limit.)
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmSize (KiB, resident and virtual) and Threads of a process."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmSize", "Threads"):
                out[key] = int(value.split()[0])
    return out


def api_versions_ms(address: tuple[str, int], rounds: int = 50) -> float:
    """The median time of an ApiVersions v0 on a fresh connection, in milliseconds."""
    payload = struct.pack(">hhih", 18, 0, 1, -1)
    frame = struct.pack(">i", len(payload)) + payload
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        with socket.create_connection(address, timeout=30) as sock:
            sock.sendall(frame)
            (size,) = struct.unpack(">i", recv(sock, 4))
            recv(sock, size)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


SERVE = """
import json, signal, sys, threading
from mqcore.server import Server
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
with Server(sys.argv[1], "127.0.0.1:0", **json.loads(sys.argv[2])) as srv:
    print(srv.bootstrap, flush=True)
    stop.wait()
"""


def serve(path: str, keywords: str) -> tuple[subprocess.Popen[str], tuple[str, int]]:
    """A Server in a process of its own (Server keywords as JSON)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, path, keywords],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    host, port = proc.stdout.readline().strip().rsplit(":", 1)
    return proc, (host, int(port))


def costs(base: dict[str, int], got: dict[str, int]) -> str:
    """Resident and virtual memory (and their growth since `base`) and threads, as text."""
    rss, vm = got["VmRSS"] / 1024, got["VmSize"] / 1024
    return (f"RSS {rss:.1f} MiB (+{rss - base['VmRSS'] / 1024:.1f}), virtual {vm:.1f} MiB "
            f"(+{vm - base['VmSize'] / 1024:.1f}), {got['Threads']} threads")  # fmt: skip


def settle(pid: int, seconds: float = 2.0) -> dict[str, int]:
    time.sleep(seconds)  # a measurement: let the server take in what was sent
    return proc_status(pid)


def measure(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as d:
        proc, address = serve(os.path.join(d, "store"), args.server)
        try:
            base = settle(proc.pid, 1.0)
            print(f"alone: RSS {base['VmRSS'] / 1024:.1f} MiB, {base['Threads']} threads, "
                  f"ApiVersions {api_versions_ms(address):.2f} ms")  # fmt: skip
            idle = [socket.create_connection(address, timeout=30) for _ in range(args.idle)]
            got = settle(proc.pid)
            print(
                f"{args.idle} idle connections: {costs(base, got)}, "
                f"ApiVersions {api_versions_ms(address):.2f} ms"
            )
            for s in idle:
                s.close()
            settle(proc.pid)
            hostile = []
            for _ in range(args.announcing):
                s = socket.create_connection(address, timeout=30)
                s.sendall(struct.pack(">i", args.size) + b"\0" * 1024)
                hostile.append(s)
            got = settle(proc.pid)
            print(
                f"{args.announcing} connections announcing {args.size >> 20} MiB: "
                f"{costs(base, got)}, ApiVersions {api_versions_ms(address):.2f} ms"
            )
            for s in hostile:
                s.close()
        finally:
            proc.terminate()
            proc.wait(60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--idle", type=int, default=10_000)
    p.add_argument("--announcing", type=int, default=100)
    p.add_argument("--size", type=int, default=100 << 20)
    p.add_argument(
        "--server",
        default='{"max_connections": 20000, "max_connections_per_ip": 20000, '
        '"max_partitions": 100}',
        help="Server keywords as JSON (default: room for the idle connections; the store "
        "keeps a descriptor for each of max_partitions)",
    )
    measure(p.parse_args())


if __name__ == "__main__":
    main()
