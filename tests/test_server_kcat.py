"""`mqcore serve` driven by kcat (librdkafka's command-line client, from Debian's packages):
produce with every codec and headers, consume what mqcore's API appended, `-o s@TIME` against
offset_for_time, and `-L` metadata. `make test` installs kcat when it is missing (as root)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (apt-get install kcat; `make test` does it as root)"
)
WAIT = 60


def kcat(srv: Any, *args: str, stdin: bytes | None = None) -> str:
    assert KCAT is not None
    proc = subprocess.run(
        [KCAT, "-b", srv.bootstrap, *args], input=stdin, capture_output=True, timeout=WAIT
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    # -J writes header values as they are: mqcore's `uid` header is 16 raw bytes
    return proc.stdout.decode("utf-8", "surrogateescape")


def consumed(srv: Any, topic: str, *args: str) -> list[dict[str, Any]]:
    """kcat -C -J envelopes from the start of every partition to the end (-e)."""
    out = kcat(srv, "-C", "-t", topic, "-e", "-J", *args)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_kcat_produces_what_the_store_reads(
    kafka_server: Any, store: mqcore.Store, codec: str
) -> None:
    store.create_topic("kc", partitions=2)
    lines = b"".join(b"key%d:value %d \xc3\xa9\n" % (i % 7, i) for i in range(200))
    kcat(kafka_server, "-P", "-t", "kc", "-p", "1", "-K:", "-z", codec, "-H", "app=kcat",
         "-H", "n=1", stdin=lines)  # fmt: skip
    got = store.read("kc", 1, 0, 1000)
    assert [(m.key, m.value) for m in got] == [
        (b"key%d" % (i % 7), "value %d é".encode() % i) for i in range(200)
    ]
    assert all(list(m.headers) == [("app", b"kcat"), ("n", b"1")] for m in got)
    assert len(store.find_by_key("kc", b"key3")) == len([i for i in range(200) if i % 7 == 3])


def test_kcat_consumes_what_the_store_appended(kafka_server: Any, store: mqcore.Store) -> None:
    store.create_topic("st", partitions=3, compression="gzip")
    for p in range(3):
        store.append_batch(
            "st", [f"p{p} message {i}".encode() for i in range(50)],
            keys=[b"k%d" % i for i in range(50)], partition=p,
            headers=[[("i", b"%d" % i)] for i in range(50)],
        )  # fmt: skip
    envelopes = consumed(kafka_server, "st")
    got = sorted(
        (e["partition"], e["offset"], e["key"], e["payload"], tuple(e["headers"]))
        for e in envelopes
    )
    want = sorted(
        (m.partition, m.offset, m.key.decode(), m.value.decode(),
         tuple(x for k, v in m.headers for x in (k, v.decode("utf-8", "surrogateescape"))))
        for p in range(3) for m in store.read("st", p, 0, 100)
    )  # fmt: skip
    assert got == want and len(got) == 150
    assert {e["ts"] for e in envelopes} == {
        m.timestamp for p in range(3) for m in store.read("st", p, 0, 100)
    }


def test_kcat_offset_by_time_equals_offset_for_time(kafka_server: Any, store: mqcore.Store) -> None:
    store.create_topic("tm")
    t0 = 1_790_000_000_000
    store.append_batch("tm", [b"%d" % i for i in range(100)], partition=0,
                       timestamps=[t0 + 1000 * i for i in range(100)])  # fmt: skip
    for ts in (t0 - 1, t0, t0 + 1, t0 + 42_000, t0 + 42_001, t0 + 99_000):
        first = store.offset_for_time("tm", 0, ts)
        assert first is not None
        envelopes = consumed(kafka_server, "tm", "-p", "0", "-o", f"s@{ts}")
        assert [e["offset"] for e in envelopes] == list(range(first, 100)), ts


def test_kcat_lists_the_metadata(kafka_server: Any, store: mqcore.Store) -> None:
    store.create_topic("a", partitions=3)
    store.create_topic("b")
    listing = json.loads(kcat(kafka_server, "-L", "-J"))
    assert [b["id"] for b in listing["brokers"]] == [0]
    topics = {t["topic"]: len(t["partitions"]) for t in listing["topics"]}
    assert topics == {"a": 3, "b": 1}
    for t in listing["topics"]:
        assert all(p["leader"] == 0 and p["isrs"] == [{"id": 0}] for p in t["partitions"])


def readme_serve_block() -> list[tuple[str, list[str]]]:
    """The README's `mqcore serve` console example as (command, expected output lines)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"```console\n(\$ mqcore serve .*?)```", text, re.S)
    assert block, "README.md lost its `mqcore serve` example"
    steps: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_readme_serve_example_runs(tmp_path: Any) -> None:
    """The README's console example, command by command: `mqcore serve` in a process of its
    own (on a free port instead of 9092), then each kcat line, output compared; SIGTERM stops
    the server cleanly."""
    import os
    import signal
    import sys

    from conftest import child_env

    steps = readme_serve_block()
    serve, serve_out = steps[0]
    assert serve.endswith("&") and "--listen 127.0.0.1:9092" in serve
    argv = serve.rstrip("&").split()
    assert argv[:3] == ["mqcore", "serve", "./data"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", *argv[1:-2], "--listen", "127.0.0.1:0"],
        cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        bootstrap = first.rsplit(" ", 1)[-1]
        assert first == serve_out[0].replace("127.0.0.1:9092", bootstrap)
        for command, expected in steps[1:]:
            assert command.split()[0] == "printf" or command.startswith("kcat ")
            run = subprocess.run(
                command.replace("127.0.0.1:9092", bootstrap).replace("kcat ", f"{KCAT} "),
                shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=WAIT,
            )  # fmt: skip
            assert run.returncode == 0, run.stderr
            assert run.stdout.splitlines() == expected, command
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
        assert out.strip() == "mqcore: stopped"
        assert os.path.exists(tmp_path / "data" / "orders-0")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
