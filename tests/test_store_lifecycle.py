"""Store lifecycle (docs/operations.md "Store lifecycle"): what opening a new store, creating a
topic and closing cost in syncs, what each sync is there for, and what a power loss at any
point of the coalesced order leaves (tests/powerloss.py cuts every byte and name no sync made
durable).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import powerloss
import pytest
from crashchild import KILLED, run_child

import mqcore

SyncLog = list[tuple[str, str]]
QUIET = 600_000  # flush_interval_ms: the flusher's pass never comes during a test


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncLog]:
    """Every fsync/fdatasync of this process as (call, path synced), in order."""
    seen: SyncLog = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def wrapped(fd: int, real=real, name=name) -> None:  # type: ignore[no-untyped-def]
            seen.append((name, os.readlink(f"/proc/self/fd/{fd}")))
            real(fd)

        monkeypatch.setattr(os, name, wrapped)
    yield seen


def _rel(store: str, seen: SyncLog) -> list[tuple[str, str]]:
    """The synced paths relative to the store ("." for its directory), temp suffixes cut."""
    out = []
    for call, path in seen:
        rel = os.path.relpath(path, store)
        name = os.path.basename(rel)
        if ".tmp" in name:  # written as a temp file, then renamed to its name
            rel = os.path.join(os.path.dirname(rel), name.split(".snapshot.")[0] + ".snapshot"
                               if ".snapshot." in name else name[: name.index(".tmp")])  # fmt: skip
        out.append((call, rel))
    return out


def test_new_store_create_and_close_sync_only_what_they_must(
    store_path: str, syncs: SyncLog
) -> None:
    """open(new) + create_topic + close: 6 syncs where there were 15 (issue 20), each one
    docs/operations.md "Store lifecycle" lists: the new store's first files need none; the
    partition directory before the topic list names it; the topic list; the new segment's
    names; the checkpoint, and one directory fsync for its name and the clean marker's (an
    empty file: its name is all it says); no producer snapshot for an empty partition."""
    s = mqcore.open(store_path, flush_interval_ms=QUIET)
    assert syncs == []  # a new store: nothing to make durable yet
    s.create_topic("t")
    created = _rel(store_path, syncs)
    assert created == [
        ("fsync", "."),  # t-0 exists before mqcore-topics.json declares it
        ("fsync", "t-0"),  # the first segment's names (flush="interval" syncs them at once)
        ("fsync", "mqcore-topics.json"),
        ("fsync", "."),
    ]
    del syncs[:]
    s.close()
    assert _rel(store_path, syncs) == [
        ("fsync", "mqcore-recovery-point-checkpoint"),
        ("fsync", "."),  # the checkpoint's name and the clean marker's at once
    ]


def test_one_append_and_close_sync_the_log_snapshot_and_names_once(
    store_path: str, syncs: SyncLog
) -> None:
    """With one append: 9 syncs where there were 16. The snapshot's name and the segment's
    share the partition directory's one fsync at close."""
    s = mqcore.open(store_path, flush_interval_ms=QUIET)
    s.create_topic("t")
    s.append("t", b"v" * 100, key=b"k")
    del syncs[:]
    s.close()
    assert _rel(store_path, syncs) == [
        ("fsync", "t-0/00000000000000000001.snapshot"),
        ("fdatasync", "t-0/00000000000000000000.log"),
        ("fsync", "t-0"),  # the snapshot's name
        ("fsync", "mqcore-recovery-point-checkpoint"),
        ("fsync", "."),
    ]


def test_key_index_file_is_made_at_the_first_entry(store_path: str) -> None:
    """A new partition has no `.keyindex` until a batch with entries arrives (issue 20: the file
    and its mapping cost every partition, written or not); queries of the empty partition and
    of the written one answer as before, and after a reopen."""
    part = Path(store_path, "t-0")
    with mqcore.open(store_path) as s:
        s.create_topic("t")
        assert not list(part.glob("*.keyindex"))
        assert list(s.find_by_key("t", b"k")) == []
        s.append("t", b"v1", key=b"k")
        s.append("t", b"v2", key=b"other")
        assert [m.value for m in s.find_by_key("t", b"k")] == [b"v1"]
        assert len(list(part.glob("*.keyindex"))) == 1
    with mqcore.open(store_path) as s:
        assert [m.value for m in s.find_by_key("t", b"k")] == [b"v1"]
        assert s.recovery[("t", 0)].rebuilt_indexes == []


def test_batches_without_entries_still_leave_a_key_index_at_close(store_path: str) -> None:
    """A segment whose batches had no key, tag or generated ID never made its table: close
    writes the empty one (covering the log), so the next open trusts it instead of scanning."""
    part = Path(store_path, "t-0")
    with mqcore.open(store_path) as s:
        s.create_topic("t", unique_ids=False)
        s.append_batch("t", [b"a", b"b"])
        assert not list(part.glob("*.keyindex"))
    assert len(list(part.glob("*.keyindex"))) == 1
    with mqcore.open(store_path, read_only=True) as s:
        assert list(s.find_by_key("t", b"a")) == []


_NEW_STORE = """
import sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
s = mqcore.open(sys.argv[1], flush=sys.argv[3])
print("open", flush=True)
if sys.argv[4] == "topic":
    s.create_topic("t", partitions=3)
    print("created", flush=True)
input()  # killed here
"""


@pytest.mark.parametrize("policy", ["always", "interval", "os"])
@pytest.mark.parametrize("step", ["open", "topic"])
def test_power_loss_after_open_or_create_topic(tmp_path: Path, policy: str, step: str) -> None:
    """A power loss right after open() of a new store (which syncs nothing now) leaves a
    directory that opens as the same empty store; one after create_topic returned keeps the
    topic with every partition, readable and writable."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    wanted = 2 if step == "topic" else 1
    lines = run_child(
        _NEW_STORE, store, ledger, policy, step, kill_when=lambda got: len(got) >= wanted
    ).lines
    assert lines[-1] == ("created" if step == "topic" else "open")
    for mode in ("cut", "zero"):
        powerloss.power_cut(store, ledger, image, mode)
        if step == "topic" and policy != "os":
            # under "os" the segments' names wait for flush()/close(): a writable open makes
            # the first segment of an empty partition directory again
            with mqcore.open(image, read_only=True) as ro:
                assert ro.topics() == ["t"]
                assert [ro.end_offset("t", p) for p in range(3)] == [0, 0, 0]
        with mqcore.open(image, flush="always") as s:
            assert s.topics() == (["t"] if step == "topic" else [])
            s.create_topic("t", partitions=3)
            assert [s.append("t", b"x", partition=p).offset for p in range(3)] == [0, 0, 0]


_CLOSING = """
import os, signal, sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
from mqcore import crashpoints
s = mqcore.open(sys.argv[1], flush=sys.argv[3])
s.create_topic("t", partitions=2)
for i in range(40):
    md = s.append("t", b"v%d" % i, key=b"k%d" % (i % 3), partition=i % 2)
    print("A", md.partition, md.offset, i, flush=True)
s.flush()
print("F", flush=True)
crashpoints.arm(sys.argv[4])
s.close()
print("closed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the same end for every run: the ledger decides
"""


@pytest.mark.parametrize("policy", ["always", "os"])
@pytest.mark.parametrize("point", ["checkpoint.after_fsync", "checkpoint.after_rename"])
def test_power_loss_during_close(tmp_path: Path, policy: str, point: str) -> None:
    """Close writes the producer snapshots and the checkpoint, renaming each in place, and
    creates the clean marker, before the one directory fsync that makes their names durable.
    A power loss at each of those steps (and after close, which covers the marker created but
    its name not synced: nothing is synced in between) must leave a store that opens,
    read-only and writable, with every append flush() made durable, under the key index's
    answers."""
    visit = 1
    while True:
        run = tmp_path / f"{visit}"
        store, ledger, image = (str(run / n) for n in ("store", "ledger", "image"))
        child = run_child(_CLOSING, store, ledger, policy, f"{point}:{visit}", expect=KILLED)
        acked = [ln.split() for ln in child.lines if ln.startswith("A")]
        assert len(acked) == 40 and "F" in child.lines
        for mode in ("cut", "zero"):
            powerloss.power_cut(store, ledger, image, mode)
            for read_only in (True, False):
                with mqcore.open(image, read_only=read_only) as s:
                    for p in range(2):
                        got = s.read("t", p, 0, 100)
                        want = [(int(o), b"v%s" % i.encode()) for _a, pp, o, i in acked
                                if int(pp) == p]  # fmt: skip
                        assert [(m.offset, m.value) for m in got] == want
                        for k in (b"k0", b"k1", b"k2"):
                            hits = s.find_by_key("t", k, partition=p, limit=100)
                            assert sorted(m.offset for m in hits) == [
                                m.offset for m in got if m.key == k
                            ]
        if "closed" in child.lines:
            break  # every visit of the point during close was cut at
        visit += 1
    # the checkpoint (and under "always" each partition's snapshot): each write was cut at
    assert visit >= (2 if policy == "os" else 4)


def _store_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("mqcore-")}


def test_new_store_starts_its_threads_at_the_first_write(store_path: str, tmp_path: Path) -> None:
    """A new store's flusher and task thread start with its first write, not at open (a thread's
    start and join cost up to ms on a busy 2-core VM, for an open + create_topic + close that
    writes nothing); an existing store starts them at open, as before. Appends made before
    the flusher started are flushed by it all the same."""
    before = _store_threads()
    s = mqcore.open(store_path, flush_interval_ms=50)
    try:
        s.create_topic("t")
        assert _store_threads() == before
        s.append("t", b"v")
        assert _store_threads() - before == {"mqcore-flusher", "mqcore-tasks"}
        part = s.log.partition("t", 0)
        deadline = time.monotonic() + 30
        while part.recovery_point < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the flusher's pass every 50 ms
        assert part.recovery_point == 1  # the flusher's pass synced it
    finally:
        s.close()
    assert _store_threads() == before
    with mqcore.open(store_path) as again:  # not new: at open
        assert _store_threads() - before == {"mqcore-flusher", "mqcore-tasks"}
        assert again.end_offset("t", 0) == 1
