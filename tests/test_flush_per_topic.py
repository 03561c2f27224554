"""A topic's own flush settings, Kafka's flush.messages and flush.ms (TopicConfig's
flush_after_messages and flush_after_ms), tested as every durability promise is: the writer runs
under the sync ledger (tests/powerloss.py), the bytes it never synced are cut, and the store
reopened from that image must hold what docs/operations.md "Durability" promises. The store
itself runs flush="os" (nothing synced but what the topic asks for), so each sync seen is the
topic setting's doing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import powerloss
import pytest
from crashchild import helper_env, run_child

import mqcore

WAIT = 30.0
NEVER = (1 << 63) - 1  # Kafka's default of flush.ms and flush.messages, Long.MAX_VALUE

APPENDS = """
import os, sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
s = mqcore.open(sys.argv[1], flush="os")
s.create_topic("every", flush_after_messages=1)
s.create_topic("zero", flush_after_ms=0)
s.create_topic("seven", flush_after_messages=7)
s.create_topic("plain")
for i in range(30):
    for topic in ("every", "zero", "seven", "plain"):
        md = s.append(topic, b"%s-%d" % (topic.encode(), i))
        os.write(1, b"%s %d\\n" % (topic.encode(), md.offset))
os._exit(0)  # the power goes: no close, no flush
"""


def kept(image: str, topic: str) -> list[bytes]:
    """The values a topic's partition 0 holds in the image (none when the power loss took the
    partition itself)."""
    with mqcore.open(image, read_only=True) as s:
        if topic not in s.topics() or s.log.find_partition(topic, 0) is None:
            return []
        return [m.value for m in s.read(topic, 0, 0, 1 << 20)]


def log_syncs(ledger: str, topic: str) -> int:
    """How many times the writer fdatasync'd the .log of the topic's partition 0."""
    return sum(
        1 for _t, _i, _s, path in powerloss.sync_journal(ledger)
        if os.path.basename(os.path.dirname(path)) == f"{topic}-0" and path.endswith(".log")
    )  # fmt: skip


def test_flush_messages_1_or_flush_ms_0_make_every_append_durable(tmp_path: Path) -> None:
    """flush.messages=1 and flush.ms=0 sync each append before it returns, as flush="always";
    flush.messages=7 syncs every seventh message, in the append that reaches it (Kafka's
    rule), and no more often; a topic without either is left to the store's "os"."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    lines = run_child(APPENDS, store, ledger).lines
    assert len(lines) == 120
    powerloss.power_cut(store, ledger, image, "cut")
    for topic in ("every", "zero"):
        assert kept(image, topic) == [b"%s-%d" % (topic.encode(), i) for i in range(30)]
    assert log_syncs(ledger, "seven") == 30 // 7
    assert kept(image, "seven") == [b"seven-%d" % i for i in range(28)]
    assert log_syncs(ledger, "plain") == 0
    assert kept(image, "plain") == []


TIMED = """
import os, sys, threading
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
part_dir = os.path.join(sys.argv[1], "timed-0")
log_path = os.path.join(part_dir, "%020d.log" % 0)
seen = []
synced = threading.Event()

def watching(sync):  # tells this process when a flush of timed-0 completed: log, then names
    def watch(fd):
        sync(fd)
        if not os.path.exists(log_path):
            return
        inode = os.fstat(fd).st_ino
        if inode == os.stat(log_path).st_ino:
            seen.append("log")
        elif inode == os.stat(part_dir).st_ino and seen:
            synced.set()
    return watch

os.fdatasync, os.fsync = watching(os.fdatasync), watching(os.fsync)
s = mqcore.open(sys.argv[1], flush="os")
s.create_topic("timed", flush_after_ms=int(sys.argv[3]))
s.create_topic("plain")
for topic in ("timed", "plain"):  # one append each: any flush of timed-0 covers all of it
    s.append_batch(topic, [b"%s-%d" % (topic.encode(), i) for i in range(5)])
os.write(1, b"synced\\n" if synced.wait(60) else b"never synced\\n")
sys.stdin.readline()  # the test kills this process here: the power goes
"""


def test_flush_ms_syncs_a_topics_partitions_in_the_background(tmp_path: Path) -> None:
    """flush.ms=20 under flush="os": the flusher syncs the topic's partition once its oldest
    unsynced append is that old, and only that topic's. The writer waits for that flush (the
    log's fdatasync, then its directory's fsync: an event it sees through os, not a time),
    then the power is cut."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    child = run_child(TIMED, store, ledger, "20", kill_when=lambda lines: bool(lines))
    assert child.lines == ["synced"], child.err[-2000:]
    powerloss.power_cut(store, ledger, image, "cut")
    assert kept(image, "timed") == [b"timed-%d" % i for i in range(5)]
    assert log_syncs(ledger, "plain") == 0
    assert kept(image, "plain") == []


def test_topic_flush_settings_validate_and_describe(store: mqcore.Store) -> None:
    cfg = store.log.new_topic_config()
    assert (cfg.flush_after_messages, cfg.flush_after_ms) == (NEVER, NEVER)
    for bad in ({"flush_after_messages": 0}, {"flush_after_ms": -1}, {"flush_after_ms": "5"}):
        with pytest.raises(mqcore.errors.InvalidConfigError):
            store.create_topic("bad", **bad)
    store.create_topic("t", flush_after_ms=250)
    assert store.alter_topic_config("t", flush_after_messages=3).flush_after_messages == 3


SERVER = """
import os, sys, threading
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
from mqcore.server import Server
server = Server(sys.argv[1], listen="127.0.0.1:0", flush="os").start()
os.write(1, (server.bootstrap + "\\n").encode())
threading.Event().wait()
"""


def test_flush_messages_set_over_the_wire_makes_acknowledged_produces_durable(
    tmp_path: Path,
) -> None:
    """IncrementalAlterConfigs sets flush.messages=1 on a topic of a server running flush="os":
    every produce acknowledged afterwards survives a power cut, and so do those before it,
    in segments rolled under "os" (the change first syncs what "os" left: the appends then sync
    only their own segment). DescribeConfigs shows both settings with Kafka's
    default, Long.MAX_VALUE, for the one not set."""
    ck = pytest.importorskip("confluent_kafka")
    pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store) as s:
        s.create_topic("t", segment_bytes=1024)  # the appends before the change roll under "os"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, store, ledger],
        env=helper_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    acked: list[bytes] = []
    try:
        assert server.stdout is not None
        bootstrap = server.stdout.readline().strip()
        p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})

        def report(err: Any, msg: Any) -> None:
            assert err is None, err
            acked.append(msg.value())

        for i in range(10):  # a batch each: segments of three batches, rolled under "os"
            p.produce("t", value=b"before-%d-" % i + b"x" * 200, on_delivery=report)
            assert p.flush(WAIT) == 0
        admin = AdminClient({"bootstrap.servers": bootstrap})
        one = ConfigEntry("flush.messages", "1", incremental_operation=AlterConfigOpType.SET)
        res = ConfigResource(ResourceType.TOPIC, "t", incremental_configs=[one])
        admin.incremental_alter_configs([res])[res].result(WAIT)
        shown = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "t")])
        entries = next(iter(shown.values())).result(WAIT)
        assert (entries["flush.messages"].value, entries["flush.ms"].value) == ("1", str(NEVER))
        assert entries["flush.ms"].is_default and not entries["flush.messages"].is_default
        for i in range(20):
            p.produce("t", value=b"after-%d-" % i + b"y" * 200, on_delivery=report)
            p.poll(0)
        assert p.flush(WAIT) == 0
        os.kill(server.pid, signal.SIGKILL)
        server.wait(WAIT)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()
    assert len(acked) == 30
    powerloss.power_cut(store, ledger, image, "cut")
    assert kept(image, "t") == acked
