"""Power loss, simulated: the real code runs under a ledger of what it fsync'd (tests/powerloss.py),
then exactly the never-synced bytes and names are cut (or read back as zeros) and the store
reopens from that image. Each policy must keep what docs/operations.md "Durability" promises
after a power loss, exactly once, and never leave a hole or a store that refuses to open.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import powerloss
import pytest
from crashchild import helper_env, run_child

import mqcore

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Acks:
    """What the killed workload acknowledged, per partition, in order."""

    records: dict[int, list[tuple[int, bytes, int]]] = field(default_factory=dict)  # off, val, t
    flushes: list[int] = field(default_factory=list)


def run_workload(store: str, ledger: str, policy: str, seed: int, acks_wanted: int) -> Acks:
    """Run tests/powerloss_workload.py until it acknowledged `acks_wanted` appends, SIGKILL it
    while it goes on, and return every whole line it printed."""
    child = run_child(
        os.path.join(HERE, "powerloss_workload.py"), store, ledger, policy, str(seed),
        kill_when=lambda lines: sum(ln.startswith("A") for ln in lines) >= acks_wanted,
    )  # fmt: skip
    lines = child.lines
    acks = Acks({0: [], 1: []})
    counts = [0, 0]
    for line in lines:
        f = line.split()
        if f[0] == "F":
            acks.flushes.append(int(f[1]))
            continue
        p, base, n, t = int(f[1]), int(f[2]), int(f[3]), int(f[4])
        for i in range(n):
            acks.records[p].append((base + i, f"{seed}:{p}:{counts[p] + i}".encode() * 3, t))
        counts[p] += n
    assert sum(len(r) for r in acks.records.values()) >= acks_wanted, child.err
    return acks


def promised(policy: str, acks: Acks, ledger: str, store: str) -> dict[int, int]:
    """Per partition, how many of the acknowledged records docs/operations.md promises survive
    a power loss: always: every one; os: those acknowledged before the last flush() returned;
    interval: those acknowledged before the start of the partition's last fdatasync of a .log
    (a flusher pass, a roll or a flush syncs every segment of the partition with unsynced
    bytes). Only .log syncs count: a roll syncs the old segment's indexes and writes the
    producer snapshot before it syncs the log, and a power cut between the two keeps none of
    the log bytes those later-started syncs seemed to vouch for."""
    out = {}
    journal = powerloss.sync_journal(ledger)
    for p, recs in acks.records.items():
        if policy == "always":
            cutoff = 1 << 62
        elif policy == "os":
            cutoff = max(acks.flushes, default=-1)
        else:
            pdir = os.path.realpath(os.path.join(store, f"t-{p}"))
            cutoff = max(
                (
                    start
                    for start, _i, _s, where in journal
                    if os.path.dirname(where) == pdir and where.endswith(".log")
                ),
                default=-1,
            )
        out[p] = sum(1 for _o, _v, t in recs if t < cutoff)
    return out


def check_image(image: str, acks: Acks, must_keep: dict[int, int], seed: int) -> None:
    """The store in `image` opens (read-only, then writable) and each partition holds a prefix
    of what was acknowledged (no hole, no duplicate, nothing invented, nothing of the in-flight
    append but a whole prefix of it) at least `must_keep` long; key lookups match the log."""
    for read_only in (True, False):
        with mqcore.open(image, read_only=read_only, flush="always") as s:
            for p, recs in acks.records.items():
                got = s.read("t", p, s.start_offset("t", p), 1 << 30)
                values = [m.value for m in got]
                assert len(set(values)) == len(values), f"duplicates in partition {p}"
                acked_values = [v for _o, v, _t in recs]
                kept = values[: len(acked_values)]
                assert kept == acked_values[: len(kept)], f"partition {p} is not a prefix"
                assert [m.offset for m in got[: len(kept)]] == [o for o, _v, _t in recs][
                    : len(kept)
                ]
                assert len(kept) >= must_keep[p], (
                    f"partition {p} kept {len(kept)} of {len(recs)} acknowledged records, "
                    f"{must_keep[p]} were promised"
                )
                for m in got[len(acked_values) :]:  # the killed in-flight append, if any
                    unit = m.value[: len(m.value) // 3]
                    s_, p_, n_ = unit.split(b":")
                    assert (int(s_), int(p_)) == (seed, p) and int(n_) >= len(recs)
                for k in (b"k0", b"k3"):
                    found = s.find_by_key("t", k, partition=p, limit=1 << 20)
                    assert sorted(m.offset for m in found) == [m.offset for m in got if m.key == k]


@pytest.mark.parametrize("mode", ["cut", "zero"])
@pytest.mark.parametrize("policy", ["always", "interval", "os"])
def test_power_loss_keeps_what_each_flush_policy_promises(
    tmp_path: Path, policy: str, mode: str
) -> None:
    seed = {"always": 11, "interval": 12, "os": 13}[policy] + (mode == "zero")
    rng = random.Random(seed)
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    acks = run_workload(store, ledger, policy, seed, rng.randint(150, 400))
    report = powerloss.power_cut(store, ledger, image, mode)
    check_image(image, acks, promised(policy, acks, ledger, store), seed)
    assert report is not None


def run_script(script: str, *args: str, kill_after: int | None = None) -> list[str]:
    """Run a Python snippet (the ledger installed first, as the workload does); with
    `kill_after`, SIGKILL it once it printed that many lines. Returns the whole lines."""
    if kill_after is None:
        return run_child(script, *args).lines
    return run_child(script, *args, kill_when=lambda lines: len(lines) >= kill_after).lines


WRITER = """
import os, sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
s = mqcore.open(sys.argv[1], flush=sys.argv[3])
s.create_topic("t", partitions=1, segment_bytes=4096)
start = s.end_offset("t", 0)
for i in range(int(sys.argv[4])):
    md = s.append("t", b"%s-%d" % (sys.argv[5].encode(), i) * 20)
    os.write(1, b"%d %s-%d\\n" % (md.offset, sys.argv[5].encode(), i))
if sys.argv[6] == "close":
    s.close()
"""


def test_unclean_open_syncs_what_a_killed_writer_left(tmp_path: Path) -> None:
    """A writer under flush="os" is killed with several rolled segments only in the page cache;
    the next writer (flush="always") opens, appends, rolls and closes cleanly. A power loss then
    must not take the first writer's bytes, which the second one recovered and built on: before
    the fix it sealed them without a sync and wrote the clean marker over them, and the store
    refused to open (or lost the always-acknowledged appends)."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    first = run_script(WRITER, store, ledger, "os", "100000", "a", "run", kill_after=150)
    second = run_script(WRITER, store, ledger, "always", "120", "b", "close")
    report = powerloss.power_cut(store, ledger, image, "zero")
    assert report["zeroed"] or report["cut"], report  # the power loss did take something
    with mqcore.open(image, read_only=True) as s:
        got = s.read("t", 0, 0, 1 << 30)
    have = {m.offset: m.value for m in got}
    for line in first + second:
        offset, stem = line.split()
        assert have.get(int(offset)) == stem.encode() * 20, f"offset {offset} lost"
    assert [m.offset for m in got] == list(range(len(got)))


def test_retention_command_on_an_unclean_store_syncs_before_the_clean_marker(
    tmp_path: Path,
) -> None:
    """`mqcore retention` opens an unclean store, changes nothing in the log, and closes it,
    which writes the clean marker: what the killed writer left must be synced first."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    first = run_script(WRITER, store, ledger, "os", "100000", "a", "run", kill_after=120)
    cli = (
        "import sys, powerloss\n"
        "powerloss.install(sys.argv[1], sys.argv[2])\n"
        "from mqcore.cli import main\n"
        "sys.exit(main(['retention', sys.argv[1]]))\n"
    )
    run_script(cli, store, ledger)
    assert os.path.exists(os.path.join(store, "mqcore-clean-shutdown"))
    powerloss.power_cut(store, ledger, image, "zero")
    with mqcore.open(image, read_only=True) as s:
        have = {m.offset: m.value for m in s.read("t", 0, 0, 1 << 30)}
    for line in first:
        offset, stem = line.split()
        assert have.get(int(offset)) == stem.encode() * 20, f"offset {offset} lost"


APPEND_AND_CUT = """
import os, sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
s = mqcore.open(sys.argv[1], flush="always")
for i in range(int(sys.argv[3])):
    md = s.append("t", b"after-%d" % i)
    os.write(1, b"%d after-%d\\n" % (md.offset, i))
os._exit(0)  # the power goes: no close
"""


def _zero_page_in(path: str, at_least: int) -> None:
    """Zero the first whole 4 KiB page at or after `at_least` (what a lost page looks like)."""
    page = -(-at_least // 4096) * 4096
    with open(path, "r+b") as f:
        f.seek(page)
        f.write(bytes(4096))


def test_recovery_deletions_survive_a_power_loss(tmp_path: Path) -> None:
    """Recovery cuts a log at a zero hole and deletes the segments after it; the next appends are
    fdatasync'd (flush="always"). Before the fix the deletions were never made durable (no
    directory sync): after a power loss the deleted segment came back behind the new appends
    and the store refused to open (overlapping segments)."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store, flush="os") as s:
        s.create_topic("t", partitions=1, segment_bytes=16384)
        for i in range(150):
            s.append("t", b"before-%d" % i * 20)
        bases = s.segment_offsets("t", 0)
    assert len(bases) >= 3
    for name in ("mqcore-clean-shutdown", "mqcore-recovery-point-checkpoint"):
        os.unlink(os.path.join(store, name))  # as if that writer was killed before any flush
    second = os.path.join(store, "t-0", f"{bases[1]:020d}.log")
    _zero_page_in(second, 4096)
    powerloss.Ledger(store, ledger).snapshot_existing()  # all this is on disk already
    lines = run_script(APPEND_AND_CUT, store, ledger, "5")
    powerloss.power_cut(store, ledger, image, "cut")
    with mqcore.open(image, read_only=True) as s:
        have = {m.offset: m.value for m in s.read("t", 0, 0, 1 << 30)}
        assert s.segment_offsets("t", 0) == bases[:2]
    for line in lines:
        offset, value = line.split()
        assert have.get(int(offset)) == value.encode()


COMMIT_AND_CUT = """
import os, sys
import powerloss
powerloss.install(sys.argv[1], sys.argv[2])
import mqcore
s = mqcore.open(sys.argv[1], flush="os")
c = s.consumer("g", ["t"])
got = c.poll(max_records=7)
c.commit()
os.write(1, b"%d\\n" % (got[-1].offset + 1))
os._exit(0)  # the power goes: no close
"""


def test_first_offset_commit_survives_a_power_loss_under_os(tmp_path: Path) -> None:
    """docs/consume.md: a commit survives a power loss under every flush policy. The first
    commit creates `__consumer_offsets-0`; under flush="os" its directory (and its entry in
    the store directory) were never synced, so the commit vanished with them."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store, flush="os") as s:
        s.create_topic("t", partitions=1)
        s.append_batch("t", [b"m%d" % i for i in range(20)])
    powerloss.Ledger(store, ledger).snapshot_existing()
    (line,) = run_script(COMMIT_AND_CUT, store, ledger)
    powerloss.power_cut(store, ledger, image, "cut")
    with mqcore.open(image, flush="os") as s:
        c = s.consumer("g", ["t"])
        assert c.committed("t", 0) == int(line) == 7
        c.close()


def test_cleanmark_survives_a_power_loss(tmp_path: Path) -> None:
    """A compaction pass that cleans nothing writes only `.cleanmark` files (the start of the
    tombstone clock); before the fix the rename was never made durable (no directory sync)."""
    store, ledger, image = (str(tmp_path / n) for n in ("store", "ledger", "image"))
    with mqcore.open(store, flush="os") as s:
        s.create_topic("c", partitions=1, cleanup_policy="compact", segment_bytes=4096)
        for i in range(100):
            s.append("c", b"v%d" % i * 10, key=b"k%d" % i)  # unique keys: nothing to remove
    powerloss.Ledger(store, ledger).snapshot_existing()
    script = (
        "import os, sys, powerloss\n"
        "powerloss.install(sys.argv[1], sys.argv[2])\n"
        "import mqcore\n"
        "s = mqcore.open(sys.argv[1], flush='os')\n"
        "r = s.compact('c', now=5000)\n"
        "os.write(1, b'%d\\n' % r.segments_seen)\n"
        "os._exit(0)\n"
    )
    (seen,) = run_script(script, store, ledger)
    assert int(seen) >= 2
    powerloss.power_cut(store, ledger, image, "cut")
    marks = [n for n in os.listdir(os.path.join(image, "c-0")) if n.endswith(".cleanmark")]
    assert len(marks) == int(seen)


@pytest.mark.parametrize("region", ["entries", "slots"])
def test_damaged_key_index_page_is_not_trusted(tmp_path: Path, region: str) -> None:
    """One page of a sealed segment's key entries (or of its slots) zeroed after a clean stop
    (a page the disk lost): a clean open must not trust the file. Before the fix find_by_key
    silently returned only the hits outside that page and `mqcore verify` found nothing."""
    from mqcore._ext.keyindex import HEADER_BYTES, KEY_ENTRY_BYTES, KeyTable
    from mqcore.query.engine import key_hash

    store = str(tmp_path / "store")
    with mqcore.open(store, flush="os") as s:
        s.create_topic("t", partitions=1, segment_bytes=64 << 10, key_index_entries=4096)
        for i in range(1200):
            s.append("t", b"v%d" % i, key=b"hot" if i % 200 == 7 else b"k%d" % i)
        s.append("t", b"x" * 60000, key=b"roll")  # rolls: the hot keys lie in sealed segments
        want = [m.offset for m in s.read("t", 0, 0, 1 << 30) if m.key == b"hot"]
    assert len(want) == 6
    _raw, hashed = key_hash(b"hot")
    d = os.path.join(store, "t-0")
    damaged = 0
    for name in sorted(n for n in os.listdir(d) if n.endswith(".keyindex")):
        with open(os.path.join(d, name), "r+b") as f:
            data = bytearray(f.read())
            table = KeyTable(data, False)
            first, count = HEADER_BYTES + 4 * table.slot_count, table.key_count
            table.release()
            for i in range(count):
                at = first + i * KEY_ENTRY_BYTES
                if int.from_bytes(data[at : at + 8], "big") == hashed:
                    if region == "slots":  # the page holding the chain's head
                        at = HEADER_BYTES + 4 * (hashed & (table.slot_count - 1))
                    page = at // 4096 * 4096
                    # a small table's slots share the header's page: keep the header, or the
                    # damage is only a bad magic
                    start = max(page, HEADER_BYTES) if region == "slots" else page
                    f.seek(start)
                    f.write(bytes(page + 4096 - start))
                    damaged += 1
                    break
    assert damaged >= 1
    with mqcore.open(store, read_only=True) as s:
        assert sorted(m.offset for m in s.find_by_key("t", b"hot", limit=100)) == want
    verify = _verify(store)
    assert verify.returncode != 0 and "not what was sealed" in verify.stdout, verify.stdout
    with mqcore.open(store) as s:  # a writer rebuilds it on first use
        assert sorted(m.offset for m in s.find_by_key("t", b"hot", limit=100)) == want
    verify = _verify(store)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _verify(store: str) -> subprocess.CompletedProcess[str]:
    """`mqcore verify STORE`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "mqcore.cli", "verify", store],
        capture_output=True,
        text=True,
        env=helper_env(),
    )
