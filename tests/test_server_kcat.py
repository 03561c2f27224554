"""`mqcore serve` driven by kcat (librdkafka's command-line client, from Debian's packages):
produce with every codec and headers, the codec each stored batch has, consume what mqcore's
API appended, a consumer group's commits against `Store.group_lag`, `-o s@TIME` against
offset_for_time, `-L` metadata, and SASL (SCRAM-SHA-256, PLAIN). `make test` installs kcat when
it is missing (as root)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from clients.harness import batch_codecs, committed

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


# librdkafka before 2.x decides whether a broker takes gzip, snappy and lz4 from ApiVersions:
# its compr_req table asks for Produce v0 (rdkafka_msgset_writer.c,
# rd_kafka_msgset_writer_select_MsgVersion). mqcore lists Produce v0-v11, so kcat 1.7.1 over
# Debian's librdkafka 2.0.2 compresses with each codec (Kafka 4 lists Produce v0-v2 for exactly
# this, KAFKA-18659); zstd asks for Produce v7.
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kcat_batches_are_stored_with_the_codec_it_was_told(
    kafka_server: Any, store: mqcore.Store, codec: str
) -> None:
    """`-X compression.codec=C`: every batch kcat sent lands with codec C (the server never
    re-encodes), the lines intact and in order. Lines that compress well, so librdkafka does
    not fall back to sending a batch uncompressed because compressing it gained nothing."""
    store.create_topic("z")
    lines = [b"line %d of a payload that compresses: payload payload payload" % i
             for i in range(300)]  # fmt: skip
    kcat(kafka_server, "-P", "-t", "z", "-p", "0", "-X", f"compression.codec={codec}",
         stdin=b"\n".join(lines) + b"\n")  # fmt: skip
    assert [m.value for m in store.read("z", 0, 0, 1000)] == lines
    assert set(batch_codecs(store, "z")) == {codec}


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


def test_kcat_consumer_group_commits_what_it_read(kafka_server: Any, store: mqcore.Store) -> None:
    """`kcat -G`: a balanced consumer (JoinGroup, SyncGroup, OffsetFetch, OffsetCommit) reads
    every partition from the earliest offset to the end and commits on leaving, so the group's
    lag in the store is 0 everywhere and its committed offsets are the ends."""
    store.create_topic("gr", partitions=3)
    for p in range(3):
        store.append_batch("gr", [b"p%d m%d" % (p, i) for i in range(20 + p)], partition=p)
    out = kcat(kafka_server, "-G", "kc-group", "-X", "auto.offset.reset=earliest", "-e", "-J", "gr")
    envelopes = [json.loads(line) for line in out.splitlines() if line.strip()]
    got = sorted((e["partition"], e["offset"], e["payload"]) for e in envelopes)
    assert got == [(p, i, f"p{p} m{i}") for p in range(3) for i in range(20 + p)]
    assert committed(store, "kc-group") == {("gr", p): (20 + p, 0) for p in range(3)}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_kcat_authenticates_with_sasl(store: mqcore.Store, tmp_path: Any, mechanism: str) -> None:
    """kcat over SASL_PLAINTEXT with each mechanism mqcore offers produces and consumes.
    librdkafka 2.0.2 repeats its own nonce in SCRAM's client-final message (librdkafka PR
    #4895), which Kafka takes; mqcore refused it until it checked the nonce as Kafka 3.8.1+
    does (its end)."""
    from mqcore.server import Server
    from mqcore.server.auth import add_user

    users = tmp_path / "users.jsonl"
    add_user(users, "alice", "alice-secret")
    with Server(store, "127.0.0.1:0", sasl_credentials=str(users)) as srv:
        login = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
                 "-X", "sasl.username=alice", "-X", "sasl.password=alice-secret"]  # fmt: skip
        kcat(srv, *login, "-P", "-t", "auth", "-k", "k", stdin=b"one\ntwo\n")
        out = kcat(srv, *login, "-C", "-t", "auth", "-e", "-f", "%k=%s\n")
    assert out.splitlines() == ["k=one", "k=two"]
    assert [m.value for m in store.read("auth", 0, 0, 10)] == [b"one", b"two"]


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
