"""Damaged stores, read every way (issue 32): a read of a damaged store answers or raises an
error of `mqcore.errors` naming what is wrong, never another exception; it never cuts or
rewrites a file on the strength of what the damage says (recovery alone decides what is cut),
and a read-only open and its reads change no file at all.

The random half damages whole stores (bit flips, truncations, 4-byte stamps in any of their
files) and reads each one read-only, then writable, with every read the store offers. The
quick run is part of the default suite; the 300-store measurement of the issue is marked slow.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import mqcore
from mqcore.errors import CorruptRecordError, MQCoreError

TOPIC = "t"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BASE_TS = 1_700_000_000_000
# four bytes written over a file: the extremes a length, offset or count field can take
STAMPS = (b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00")
BATCH_HEADER = struct.Struct(">qi")  # baseOffset, batchLength: parsed here without mqcore


def whole_batches_end(data: bytes) -> list[int]:
    """The end position of each whole batch of a `.log`, from its length fields alone."""
    ends, pos = [], 0
    while pos + 12 <= len(data):
        _base, length = BATCH_HEADER.unpack_from(data, pos)
        if pos + 12 + length > len(data):
            break
        pos += 12 + length
        ends.append(pos)
    return ends


def file_hashes(root: str) -> dict[str, str]:
    """Every file under root and the SHA-256 of its bytes."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


# -- a sealed segment cut short ------------------------------------------------------------------


def sealed_store(path: str) -> list[Path]:
    """A cleanly closed store of one partition with several sealed segments; its logs."""
    with mqcore.open(path, flush="os") as store:
        store.create_topic(TOPIC, segment_bytes=2000, index_interval_bytes=200)
        for i in range(120):
            store.append(TOPIC, b"value %d " % i * 4, key=b"k%d" % (i % 7), timestamp=BASE_TS + i)
    logs = sorted(Path(path, f"{TOPIC}-0").glob("*.log"))
    assert len(logs) >= 4
    return logs


@pytest.mark.parametrize("how", ["cut-mid-batch", "cut-in-header", "garbage-appended"])
@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_sealed_segment_cut_short_is_reported_not_truncated(
    fast_tmp: Path, how: str, read_only: bool
) -> None:
    """A sealed segment whose file ends inside a batch was trusted at its first use: its size
    became the end of its last whole batch and sealing it again truncated the file there
    (OSError 22 on the read-only descriptor; a writable one would have cut the bytes). Reads
    that reach it raise CorruptRecordError naming the file and where its whole batches end,
    and the file stays as it is; the other segments still read."""
    path = str(fast_tmp / "s")
    logs = sealed_store(path)
    victim = logs[1]
    data = victim.read_bytes()
    ends = whole_batches_end(data)
    if how == "cut-mid-batch":
        damaged, whole = data[: ends[-2] + 30], ends[-2]
    elif how == "cut-in-header":
        damaged, whole = data[: ends[-2] + 7], ends[-2]
    else:
        damaged, whole = data + b"\x00\x01\x02", len(data)
    victim.write_bytes(damaged)
    before = file_hashes(path)
    next_base = int(logs[2].name.split(".")[0])
    damaged_base = int(victim.name.split(".")[0])
    with mqcore.open(path, read_only=read_only, flush="os") as store:
        for call in (
            lambda: store.read(TOPIC, 0, 0, 10_000),
            lambda: store.read(TOPIC, 0, damaged_base, 1),
            lambda: store.get(TOPIC, 0, damaged_base),
            lambda: store.offset_for_time(TOPIC, 0, BASE_TS + damaged_base),
            lambda: store.read_arrow(TOPIC, 0),
        ):
            with pytest.raises(CorruptRecordError) as info:
                call()
            assert info.value.path == str(victim) and info.value.position == whole
        assert victim.read_bytes() == damaged
        later = store.read(TOPIC, 0, next_base, 10_000)
        assert [m.offset for m in later] == list(range(next_base, 120))
        assert store.get(TOPIC, 0, 0) is not None
    if read_only:
        assert file_hashes(path) == before
    assert victim.read_bytes() == damaged


# -- random damage over whole stores ---------------------------------------------------------


def build_store(path: str, rng: random.Random) -> tuple[list[str], list[str]]:
    """A cleanly closed store of two partitions, small segments, batches in every codec, keys,
    tags and unique IDs; returns the store IDs and unique IDs of the first record of each
    batch."""
    msg_ids, uids = [], []
    with mqcore.open(path, flush="os") as store:
        store.create_topic(TOPIC, partitions=2, segment_bytes=1500, index_interval_bytes=150)
        for i in range(rng.randint(30, 70)):
            n = rng.randint(1, 6)
            batch = store.append_batch(
                TOPIC,
                [b"value %d.%d " % (i, j) * rng.randint(1, 12) for j in range(n)],
                keys=[b"k%d" % rng.randrange(8) for _ in range(n)],
                headers=[[("tag", b"red" if j % 2 else b"blue")] for j in range(n)],
                partition=rng.randrange(2),
                timestamps=[BASE_TS + i * 10 + j for j in range(n)],
                compression=CODECS[i % len(CODECS)],
            )
            msg_ids.append(batch.msg_id(0))
            uid = batch.unique_id(0)
            if uid is not None:
                uids.append(uid)
    return msg_ids, uids


def damage(path: str, rng: random.Random) -> list[str]:
    """One to three bit flips, truncations or 4-byte stamps in the store's files (its `.log`s
    twice as often as each other kind); returns what was done, for the failure message."""
    files = sorted(
        os.path.join(d, n) for d, _s, names in os.walk(path) for n in names if n != ".mqcore.lock"
    )
    weighted = files + [f for f in files if f.endswith(".log")]
    done = []
    for _ in range(rng.randint(1, 3)):
        target = rng.choice(weighted)
        size = os.path.getsize(target)
        if size == 0:
            continue
        kind = rng.choice(("flip", "truncate", "stamp"))
        pos = rng.randrange(size)
        with open(target, "r+b") as f:
            if kind == "flip":
                f.seek(pos)
                byte = f.read(1)[0] ^ (1 << rng.randrange(8))
                f.seek(pos)
                f.write(bytes([byte]))
            elif kind == "truncate":
                f.truncate(pos)
            else:
                f.seek(min(pos, max(0, size - 4)))
                f.write(rng.choice((*STAMPS, rng.randbytes(4))))
        done.append(f"{kind} {os.path.relpath(target, path)}@{pos}")
    return done


def every_read(
    store: mqcore.Store, msg_ids: list[str], uids: list[str]
) -> list[tuple[str, Callable[[], Any]]]:
    """Each way the store reads a partition: scans, point reads, lookups by time, key, tag,
    selector, store ID and unique ID, and Arrow."""
    reads: list[tuple[str, Callable[[], Any]]] = []
    for p in (0, 1):
        reads += [
            (f"read p{p}", lambda p=p: store.read(TOPIC, p, 0, 100_000)),
            (f"get p{p}", lambda p=p: [store.get(TOPIC, p, o) for o in range(0, 400, 3)]),
            (f"offset_for_time p{p}", lambda p=p: store.offset_for_time(TOPIC, p, BASE_TS + 300)),
            (f"read_arrow p{p}", lambda p=p: store.read_arrow(TOPIC, p, include_headers=True)),
            (f"end_offset p{p}", lambda p=p: store.end_offset(TOPIC, p)),
        ]
    return reads + [
        ("search", lambda: store.search(TOPIC, contains=b"value 1", limit=100_000)),
        ("search where", lambda: store.search(TOPIC, tag="red", where="tag = 'red'")),
        ("range", lambda: store.range(TOPIC, BASE_TS + 100, BASE_TS + 400)),
        ("find_by_key", lambda: store.find_by_key(TOPIC, b"k3")),
        ("get_by_id", lambda: [store.get_by_id(m) for m in msg_ids]),
        ("find_by_unique_id", lambda: [store.find_by_unique_id(u) for u in uids[::5]]),
    ]


def outside_errors(what: str, call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run `call`: (its result or None, the error it raised if not one of mqcore.errors)."""
    try:
        return call(), []
    except MQCoreError:
        return None, []
    except Exception as e:
        where = "".join(traceback.format_exception(e)[-3:])
        return None, [f"{what}: {e!r}\n{where}"]


def read_damaged(path: str, msg_ids: list[str], uids: list[str], **options: Any) -> list[str]:
    """Open the store with `options` (recovery runs at open), read it every way, close it;
    every error raised that is not one of mqcore.errors."""
    mode = "read-only" if options.get("read_only") else "writable"
    store, bad = outside_errors(f"{mode} open", lambda: mqcore.open(path, **options))
    if store is None:
        return bad
    try:
        for what, call in every_read(store, msg_ids, uids):
            bad += outside_errors(f"{mode} {what}", call)[1]
    finally:
        bad += outside_errors(f"{mode} close", store.close)[1]
    return bad


def check_damaged_store(root: Path, seed: int) -> list[str]:
    """Build, damage and read one store; what went wrong, each line naming seed and damage."""
    rng = random.Random(seed)
    path = str(root / f"s{seed}")
    msg_ids, uids = build_store(path, rng)
    if rng.random() < 0.5:  # half of them as a crash left them: recovery scans at open
        os.unlink(os.path.join(path, "mqcore-clean-shutdown"))
    done = damage(path, rng)
    before = file_hashes(path)
    problems = read_damaged(path, msg_ids, uids, read_only=True)
    after = file_hashes(path)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        problems.append(f"read-only open and reads changed {changed}")
    problems += read_damaged(path, msg_ids, uids, flush="os")
    shutil.rmtree(path)
    return [f"seed {seed} ({'; '.join(done)}): {p}" for p in problems]


def check_damaged_stores(root: Path, seeds: range) -> None:
    problems = [p for seed in seeds for p in check_damaged_store(root, seed)]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])


def test_random_damage_is_read_as_mqcore_errors(fast_tmp: Path) -> None:
    """40 damaged stores (the slow test below runs 300): no read raises anything but an
    error of mqcore.errors, and a read-only open and its reads change no file."""
    check_damaged_stores(fast_tmp, range(40))


@pytest.mark.slow
def test_random_damage_over_300_stores(fast_tmp: Path) -> None:
    """Issue 32's measurement: 300 damaged stores of two partitions with every codec."""
    check_damaged_stores(fast_tmp, range(1000, 1300))
