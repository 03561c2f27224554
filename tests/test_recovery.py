"""Durability and recovery on real files: killed writer processes, torn and damaged segments,
lost or broken indexes, read-only openers, the writer lock and interrupted segment swaps.

Every test works on real store directories and checks the bytes on disk, not only the API:
recovery must cut exactly the torn tail, refuse to open over mid-log damage without touching
the file, and rebuild indexes byte for byte as the append path wrote them.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import os
import random
import shutil
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from conftest import child_env
from crashchild import run_child

import mqcore
from mqcore._ext.keyindex import KeyTable
from mqcore.errors import CorruptRecordError, StoreLockedError

TOPIC = "t"
PARTITIONS = 3
CLEAN_MARKER = "mqcore-clean-shutdown"
CHECKPOINT = "mqcore-recovery-point-checkpoint"
BATCH_HEADER = struct.Struct(">qi")  # baseOffset, batchLength
CRC_COVERED_FROM = 16  # magic (16), crc (17..20), attributes.. end: bytes a flip must be caught in


# -- helpers shared with the writer child ------------------------------------------------------


def message_digest(
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
    timestamp: int,
) -> str:
    """A digest of everything a message carries; the child prints it for each acknowledged
    message and the parent recomputes it from what it reads back."""
    norm = tuple((k, v) for k, v in headers) if headers else ()
    return hashlib.sha1(repr((key, value, norm, timestamp)).encode()).hexdigest()


def stored_headers(
    headers: list[tuple[str, bytes | None]] | None, unique_id: str | None
) -> list[tuple[str, bytes | None]] | None:
    """The headers a message is stored with: the appended ones, then the ("uid", 16 bytes)
    header of the unique ID the append returned (none when the topic generates no IDs)."""
    if unique_id is None:
        return headers
    return [*(headers or []), ("uid", uuid.UUID(unique_id).bytes)]


def write_steps(store: mqcore.Store, seed: int) -> Iterator[list[tuple[int, int, str]]]:
    """Endless deterministic appends to three partitions (single messages and batches in every
    codec, null keys and values, headers, jittered timestamps); yields each step's acks as
    (partition, offset, digest), the digest covering the generated unique ID too. The killed
    child runs it; a replay in-process reruns it."""
    rng = random.Random(seed)
    codecs = ["none", "gzip", "snappy", "lz4", "zstd"]
    n = 0

    def record() -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int]:
        nonlocal n
        n += 1
        key = None if rng.random() < 0.2 else b"k%d" % n
        r = rng.random()
        value = None if r < 0.05 else b"" if r < 0.1 else b"%d:%d|" % (seed, n) * rng.randint(1, 30)
        headers = None if rng.random() < 0.6 else [("h", b"%d" % n), ("nil", None)]
        return key, value, headers, 1_000_000 + n * 10 + rng.randint(-15, 15)

    while True:
        p = rng.randrange(PARTITIONS)
        if rng.random() < 0.5:
            key, value, headers, ts = record()
            md = store.append(TOPIC, value, key=key, headers=headers, partition=p, timestamp=ts)
            stored = stored_headers(headers, md.unique_id)
            yield [(p, md.offset, message_digest(key, value, stored, ts))]
        else:
            recs = [record() for _ in range(rng.randint(1, 25))]
            bmd = store.append_batch(
                TOPIC,
                [r[1] for r in recs],
                keys=[r[0] for r in recs],
                headers=[r[2] for r in recs],
                partition=p,
                timestamps=[r[3] for r in recs],
                compression=rng.choice(codecs),
            )
            assert isinstance(bmd, mqcore.BatchMetadata)
            yield [
                (
                    p,
                    bmd.base_offset + j,
                    message_digest(k, v, stored_headers(h, bmd.unique_id(j)), t),
                )
                for j, (k, v, h, t) in enumerate(recs)
            ]


def open_writer_store(path: str, flush: str, unique_ids: bool) -> mqcore.Store:
    """The store the writer child appends to: small segments so that rolls happen."""
    store = mqcore.open(path, flush=flush, flush_interval_ms=3, flush_messages=7)
    store.create_topic(
        TOPIC,
        partitions=PARTITIONS,
        segment_bytes=2500,
        index_interval_bytes=200,
        unique_ids=unique_ids,
    )
    return store


WRITER = "\n".join(
    [
        "from __future__ import annotations",
        "import hashlib, random, sys, uuid",
        "from collections.abc import Iterable, Iterator",
        "import mqcore",
        f"TOPIC, PARTITIONS = {TOPIC!r}, {PARTITIONS}",
        inspect.getsource(message_digest),
        inspect.getsource(stored_headers),
        inspect.getsource(write_steps),
        inspect.getsource(open_writer_store),
        "store = open_writer_store(sys.argv[1], sys.argv[2], sys.argv[4] == 'uids')",
        "for acks in write_steps(store, int(sys.argv[3])):",
        "    sys.stdout.write(''.join(f'{p} {o} {d}\\n' for p, o, d in acks))",
        "    sys.stdout.flush()",
    ]
)

HOLDER = r"""
import sys

import mqcore

store = mqcore.open(sys.argv[1], flush="os")
store.create_topic("t", partitions=1)
for i in range(50):
    store.append("t", b"held %d" % i, partition=0)
print(store.end_offset("t", 0), flush=True)
sys.stdin.read()
store.close()
"""


def digest_of(m: mqcore.Message) -> str:
    return message_digest(m.key, m.value, m.headers, m.timestamp)


def kill_after_acks(
    path: str, flush: str, seed: int, acks: int, unique_ids: bool = True
) -> dict[tuple[int, int], str]:
    """Run a writer child, read its acknowledgements until `acks` arrived, SIGKILL it."""
    uids = "uids" if unique_ids else "no-uids"
    child = run_child(
        WRITER, path, flush, str(seed), uids, kill_when=lambda lines: len(lines) >= acks
    )
    acked = {(int(p), int(off)): d for p, off, d in (ln.split() for ln in child.lines)}
    assert len(acked) >= acks, f"writer stopped after {len(acked)} acks:\n{child.err}"
    return acked


def batches(log: Path) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of each whole batch in a .log, parsed
    independently of mqcore (header fields only)."""
    data = log.read_bytes()
    out, pos = [], 0
    while pos + 27 <= len(data):
        base, length = BATCH_HEADER.unpack_from(data, pos)
        if pos + 12 + length > len(data):
            break
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        out.append((pos, 12 + length, base, base + last_delta))
        pos += 12 + length
    return out


def snapshot(root: str) -> dict[str, tuple[bytes, int]]:
    """Every file under root: bytes and mtime_ns (to prove an opener wrote nothing)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = (Path(full).read_bytes(), os.stat(full).st_mtime_ns)
    return out


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x5A
    path.write_bytes(bytes(data))


def part_dir(store_path: str, partition: int = 0) -> Path:
    return Path(store_path) / f"{TOPIC}-{partition}"


def logs(store_path: str, partition: int = 0) -> list[Path]:
    return sorted(part_dir(store_path, partition).glob("*.log"))


def mark_unclean(store_path: str, drop_checkpoint: bool = False) -> None:
    """Make the store look as a crashed writer left it: no clean-shutdown marker."""
    os.unlink(os.path.join(store_path, CLEAN_MARKER))
    if drop_checkpoint:
        os.unlink(os.path.join(store_path, CHECKPOINT))


def check_partition(store: mqcore.Store, p: int, expected: dict[int, str]) -> list[mqcore.Message]:
    """All messages of partition p: dense offsets from 0, every expected digest present, the
    same rows through read, read_arrow and get."""
    end = store.end_offset(TOPIC, p)
    assert store.start_offset(TOPIC, p) == 0
    msgs = store.read(TOPIC, p, 0, end + 10)
    assert [m.offset for m in msgs] == list(range(end))
    got = {m.offset: digest_of(m) for m in msgs}
    missing = {o: d for o, d in expected.items() if got.get(o) != d}
    assert not missing, f"partition {p}: acknowledged messages lost or changed: {missing}"
    rb = store.read_arrow(TOPIC, p, include_headers=True)
    assert rb.column("offset").to_pylist() == list(range(end))
    assert rb.column("value").to_pylist() == [m.value for m in msgs]
    assert rb.column("key").to_pylist() == [m.key for m in msgs]
    stamps = rb.column("timestamp").cast("int64").to_pylist()
    assert stamps == [m.timestamp * 1000 for m in msgs]
    for m in msgs[:: max(1, len(msgs) // 25)] + msgs[-1:]:
        g = store.get(TOPIC, p, m.offset)
        assert g is not None and digest_of(g) == got[m.offset]
    assert store.get(TOPIC, p, end) is None
    return msgs


# -- killed writers -----------------------------------------------------------------------------


@pytest.mark.parametrize(("flush", "iterations"), [("always", 20), ("interval", 6), ("os", 6)])
def test_sigkill_keeps_every_acknowledged_message(
    store_path: str, flush: str, iterations: int
) -> None:
    """SIGKILL a writer at random points, many times over the same store: every acknowledged
    message survives, identical, with dense offsets, and appending continues after it.

    Under "always" the acknowledgement came after fdatasync (it would survive a power loss too);
    under "interval" and "os" it came after write() only, and a process kill (unlike a power
    loss) leaves the page cache intact, so every acknowledged message must still be there.
    """
    rng = random.Random(f"sigkill-{flush}")
    expected: dict[int, dict[int, str]] = {p: {} for p in range(PARTITIONS)}
    for it in range(iterations):
        acked = kill_after_acks(store_path, flush, rng.randrange(1 << 30), rng.randint(1, 400))
        for (p, off), d in acked.items():
            expected[p][off] = d
        if it % 3 == 0:
            with mqcore.open(store_path, read_only=True) as ro:
                for p in range(PARTITIONS):
                    check_partition(ro, p, expected[p])
        with mqcore.open(store_path, flush="os") as store:
            for p in range(PARTITIONS):
                assert store.recovery[(TOPIC, p)].recovered_segments, "the kill went unnoticed"
                check_partition(store, p, expected[p])
                end = store.end_offset(TOPIC, p)
                md = store.append(TOPIC, b"after kill %d" % it, partition=p, timestamp=7)
                assert md.offset == end
                stored = stored_headers(None, md.unique_id)
                expected[p][md.offset] = message_digest(None, b"after kill %d" % it, stored, 7)
    with mqcore.open(store_path, flush="os") as store:
        assert sum(len(logs(store_path, p)) for p in range(PARTITIONS)) > PARTITIONS, (
            "segments never rolled: the kills missed roll and recovery across segments"
        )
        for p in range(PARTITIONS):
            check_partition(store, p, expected[p])


# -- torn tails ---------------------------------------------------------------------------------


def build_store(
    path: str,
    *,
    count: int = 40,
    compression: str = "none",
    segment_bytes: int = 1 << 30,
    index_interval_bytes: int = 256,
) -> None:
    """A closed store: single appends and one final batch (the tail the tests tear)."""
    with mqcore.open(path, flush="os") as store:
        store.create_topic(
            TOPIC,
            partitions=1,
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
        )
        for i in range(count):
            store.append(
                TOPIC,
                b"value %03d " % i * (1 + i % 7),
                key=b"k%d" % i,
                headers=[("i", b"%d" % i)] if i % 3 == 0 else None,
                partition=0,
                timestamp=10_000 + 100 * i,
            )
        store.append_batch(
            TOPIC,
            [b"tail %d" % j * 5 for j in range(6)],
            partition=0,
            timestamps=[10_000 + 100 * count + j for j in range(6)],
            compression=compression,
        )


def reference(path: str) -> list[mqcore.Message]:
    with mqcore.open(path, read_only=True) as store:
        return store.read(TOPIC, 0, 0, 1 << 20)


def same_messages(a: list[mqcore.Message], b: list[mqcore.Message]) -> bool:
    return [(m.offset, digest_of(m)) for m in a] == [(m.offset, digest_of(m)) for m in b]


def expect_recovered_tail(
    path: str, good: list[mqcore.Message], cut_bytes: int, valid_size: int
) -> None:
    """Reopen writable: the tail is cut to `valid_size`, the rest reads back, appends continue."""
    with mqcore.open(path, flush="os") as store:
        assert store.recovery[(TOPIC, 0)].truncated_bytes == cut_bytes
        assert logs(path)[-1].stat().st_size == valid_size
        assert store.end_offset(TOPIC, 0) == len(good)
        assert same_messages(store.read(TOPIC, 0, 0, 1 << 20), good)
        md = store.append(TOPIC, b"next", partition=0, timestamp=1)
        assert md.offset == len(good)
    with mqcore.open(path, flush="os") as store:
        msgs = store.read(TOPIC, 0, 0, 1 << 20)
        assert same_messages(msgs[:-1], good) and msgs[-1].value == b"next"
        assert msgs[-1].offset == len(good)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_torn_tail_at_every_byte_of_the_last_batch(fast_tmp: Path, compression: str) -> None:
    """Cut the active segment at every position inside its last batch (a crash mid-write):
    recovery cuts back to the last whole batch and reports exactly the bytes it cut."""
    origin = str(fast_tmp / "origin")
    build_store(origin, compression=compression)
    full = reference(origin)
    last_pos, last_size, last_base, _ = batches(logs(origin)[-1])[-1]
    good = [m for m in full if m.offset < last_base]
    for cut in range(last_pos, last_pos + last_size):
        path = str(fast_tmp / f"cut{cut}")
        shutil.copytree(origin, path)
        mark_unclean(path)
        os.truncate(logs(path)[-1], cut)
        expect_recovered_tail(path, good, cut - last_pos, last_pos)
        shutil.rmtree(path)


@pytest.mark.parametrize("garbage", ["zeros", "zero-page", "random", "half-header"])
def test_garbage_after_the_last_batch_is_cut(tmp_path: Path, garbage: str) -> None:
    """Bytes after the last batch (a crash that extended the file but not its data) are cut."""
    path = str(tmp_path / "s")
    build_store(path)
    full = reference(path)
    tail = {
        "zeros": bytes(100),
        "zero-page": bytes(4096),
        "random": random.Random(3).randbytes(3000),
        "half-header": struct.pack(">qi", len(full), 500) + b"\x00\x00\x00\x00\x02",
    }[garbage]
    size = logs(path)[-1].stat().st_size
    with open(logs(path)[-1], "ab") as f:
        f.write(tail)
    mark_unclean(path)
    expect_recovered_tail(path, full, len(tail), size)


def test_flipped_byte_in_the_last_batch_cuts_it(fast_tmp: Path) -> None:
    """Damage inside the last batch (length, magic, CRC or anything it covers) makes it the
    torn tail: it is cut, nothing before it is lost."""
    origin = str(fast_tmp / "origin")
    build_store(origin, compression="gzip")
    full = reference(origin)
    last_pos, last_size, last_base, _ = batches(logs(origin)[-1])[-1]
    good = [m for m in full if m.offset < last_base]
    positions = [8, 9, 10, 11] + list(range(CRC_COVERED_FROM, last_size))
    for rel in positions:
        path = str(fast_tmp / f"flip{rel}")
        shutil.copytree(origin, path)
        mark_unclean(path)
        flip(logs(path)[-1], last_pos + rel)
        expect_recovered_tail(path, good, last_size, last_pos)
        shutil.rmtree(path)


def test_trusted_segment_with_a_torn_tail_is_not_appended_after(tmp_path: Path) -> None:
    """A torn tail on a store that says it closed cleanly (the marker survived, the data did
    not) must not stay between old and new batches: the next append would bury it mid-log."""
    path = str(tmp_path / "s")
    build_store(path)
    full = reference(path)
    last_pos, last_size, last_base, _ = batches(logs(path)[-1])[-1]
    os.truncate(logs(path)[-1], last_pos + last_size // 2)
    good = [m for m in full if m.offset < last_base]
    with mqcore.open(path, flush="os") as store:
        assert store.end_offset(TOPIC, 0) == last_base
        store.append(TOPIC, b"next", partition=0, timestamp=1)
    mark_unclean(path, drop_checkpoint=True)
    with mqcore.open(path, flush="os") as store:
        msgs = store.read(TOPIC, 0, 0, 1 << 20)
        assert same_messages(msgs[:-1], good) and msgs[-1].value == b"next"


# -- damage before the tail ---------------------------------------------------------------------


def test_mid_log_damage_refuses_to_open_and_leaves_the_file(fast_tmp: Path) -> None:
    """A flipped byte in an earlier batch of the active segment, good batches after it: open
    raises CorruptRecordError naming the file and the damaged batch, and the log is untouched."""
    origin = str(fast_tmp / "origin")
    build_store(origin)
    full = reference(origin)
    pos, size, _base, _last = batches(logs(origin)[-1])[10]
    for rel in [8, 11, 16, 17, 20, 21, 23, 30, 40, 56, 60] + list(range(61, size, 4)):
        path = str(fast_tmp / f"flip{pos + rel}")
        shutil.copytree(origin, path)
        mark_unclean(path)
        log = logs(path)[-1]
        flip(log, pos + rel)
        damaged = log.read_bytes()
        for read_only in (False, True):
            with pytest.raises(CorruptRecordError) as info:
                mqcore.open(path, flush="os", read_only=read_only)
            assert info.value.path == str(log) and info.value.position == pos
            assert str(log) in str(info.value) and f"position {pos}" in str(info.value)
            assert log.read_bytes() == damaged
            del info  # its traceback holds the half-opened store: no collection while it lives
        # both half-opened stores, collected, must not write the clean marker (one collection
        # for the two: each costs a walk of the whole test process's heap)
        gc.collect()
        assert not os.path.exists(os.path.join(path, CLEAN_MARKER))
        flip(log, pos + rel)
        with mqcore.open(path, flush="os") as store:  # the failed opens left no lock
            assert store.recovery[(TOPIC, 0)].truncated_bytes == 0
            assert same_messages(store.read(TOPIC, 0, 0, 1 << 20), full)
        shutil.rmtree(path)


def zero_page_store(tmp_path: Path, name: str, drop_checkpoint: bool) -> tuple[str, Path, int]:
    """A crashed store whose active segment has one whole 4 KiB page of zeros with whole batches
    after it; returns (path, log, position of the first damaged batch)."""
    origin = str(tmp_path / "origin")
    if not os.path.exists(origin):
        build_store(origin, count=300)
    path = str(tmp_path / name)
    shutil.copytree(origin, path)
    mark_unclean(path, drop_checkpoint=drop_checkpoint)
    log = logs(path)[-1]
    log_batches = batches(log)
    hole = (log_batches[150][0] + 4095) // 4096 * 4096
    assert hole + 4096 <= log_batches[-1][0]  # whole batches after the hole
    data = bytearray(log.read_bytes())
    data[hole : hole + 4096] = bytes(4096)
    log.write_bytes(bytes(data))
    return path, log, max(b[0] for b in log_batches if b[0] <= hole)


def test_power_loss_hole_before_later_data_is_cut_not_refused(tmp_path: Path) -> None:
    """A power loss can keep pages written after the last flush while losing earlier ones: a
    page of zeros past the recovery point, whole batches after it. Recovery cuts at the first
    damaged batch (nothing from there on was known flushed) and reports it, where a flipped
    byte with good data after it is refused (test_mid_log_damage_refuses_to_open...)."""
    origin = str(tmp_path / "origin")
    build_store(origin, count=300)
    full = reference(origin)
    for read_only in (True, False):
        path, log, bad_pos = zero_page_store(tmp_path, f"hole-{read_only}", drop_checkpoint=True)
        size = log.stat().st_size
        kept = next(b[2] for b in batches(Path(origin) / log.relative_to(path)) if b[0] == bad_pos)
        with mqcore.open(path, flush="os", read_only=read_only) as store:
            report = store.recovery[(TOPIC, 0)]
            assert report.unflushed_holes == [f"{log.name}@{bad_pos}"]
            assert report.truncated_bytes == size - bad_pos
            assert store.end_offset(TOPIC, 0) == kept
            assert same_messages(store.read(TOPIC, 0, 0, 1 << 20), full[:kept])
        assert log.stat().st_size == (size if read_only else bad_pos)


def test_zero_page_below_the_recovery_point_is_damage(tmp_path: Path) -> None:
    """The same page of zeros in data the checkpoint says was flushed cannot be a power-loss
    hole: open refuses it and changes nothing."""
    path, log, bad_pos = zero_page_store(tmp_path, "flushed", drop_checkpoint=False)
    damaged = log.read_bytes()
    with pytest.raises(CorruptRecordError) as info:
        mqcore.open(path, flush="os")
    assert info.value.position == bad_pos and log.read_bytes() == damaged


def test_mid_log_damage_in_the_offset_field_is_not_cut_as_a_tail(tmp_path: Path) -> None:
    """The base offset is outside the CRC; a damaged one shows as offsets going backwards at the
    next batch. Valid batches follow, so this is damage, never a tail to drop silently."""
    origin = str(tmp_path / "origin")
    build_store(origin)
    pos = batches(logs(origin)[-1])[10][0]
    for rel in range(8):
        path = str(tmp_path / f"off{rel}")
        shutil.copytree(origin, path)
        mark_unclean(path)
        log = logs(path)[-1]
        flip(log, pos + rel)
        damaged = log.read_bytes()
        with pytest.raises(CorruptRecordError) as info:
            mqcore.open(path, flush="os")
        assert info.value.path == str(log)
        assert log.read_bytes() == damaged
        shutil.rmtree(path)


def damaged_sealed_store(path: str) -> tuple[Path, int, int, list[mqcore.Message]]:
    """A closed store of several segments with one byte flipped in a middle batch of the
    first; returns the log, the damaged batch's position and base offset, and the messages."""
    build_store(path, count=120, segment_bytes=2000)
    full = reference(path)
    first = logs(path)[0]
    assert len(logs(path)) > 2
    pos, size, base, _ = batches(first)[len(batches(first)) // 2]
    flip(first, pos + size - 3)
    return first, pos, base, full


def test_damage_in_a_sealed_segment_is_found_by_reads(tmp_path: Path) -> None:
    """After a clean close, sealed segments are trusted at open; a read that meets the damaged
    batch raises CorruptRecordError naming the file and position instead of returning it."""
    path = str(tmp_path / "s")
    log, pos, base, full = damaged_sealed_store(path)
    with mqcore.open(path, flush="os") as store:
        for call in (
            lambda: store.read(TOPIC, 0, 0, 1 << 20),
            lambda: store.read(TOPIC, 0, base, 1),
            lambda: store.get(TOPIC, 0, base),
            lambda: store.read_arrow(TOPIC, 0),
        ):
            with pytest.raises(CorruptRecordError) as info:
                call()
            assert info.value.path == str(log) and info.value.position == pos
            assert f"position {pos}" in str(info.value)
        later = [m for m in full if m.offset > base + 5]
        assert same_messages(store.read(TOPIC, 0, later[0].offset, 1 << 20), later)
        first = store.get(TOPIC, 0, 0)
        assert first is not None and digest_of(first) == digest_of(full[0])


@pytest.mark.parametrize("checkpoint", ["missing", "zero"])
def test_damage_in_a_sealed_segment_is_found_by_recovery(tmp_path: Path, checkpoint: str) -> None:
    """With the checkpoint behind the damage, recovery scans the sealed segment and refuses
    to open (later segments hold good data), naming the file and position."""
    path = str(tmp_path / "s")
    log, pos, _base, _full = damaged_sealed_store(path)
    mark_unclean(path, drop_checkpoint=checkpoint == "missing")
    if checkpoint == "zero":
        Path(path, CHECKPOINT).write_text(f"0\n1\n{TOPIC} 0 0\n")
    damaged = log.read_bytes()
    with pytest.raises(CorruptRecordError) as info:
        mqcore.open(path, flush="os")
    assert info.value.path == str(log) and info.value.position == pos
    assert log.read_bytes() == damaged
    assert all(p.stat().st_size > 0 for p in logs(path))


# -- indexes ------------------------------------------------------------------------------------


def index_files(path: str) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(part_dir(path).iterdir())
        if p.suffix in (".index", ".timeindex")
    }


def brute_offset_for_time(msgs: list[mqcore.Message], ts: int) -> int | None:
    return next((m.offset for m in msgs if m.timestamp >= ts), None)


def check_lookups(store: mqcore.Store, full: list[mqcore.Message]) -> None:
    for m in full:
        g = store.get(TOPIC, 0, m.offset)
        assert g is not None and digest_of(g) == digest_of(m)
    stamps = sorted({m.timestamp for m in full})
    for ts in [0, stamps[0] - 1] + stamps + [s + 1 for s in stamps[::7]] + [stamps[-1] + 1]:
        assert store.offset_for_time(TOPIC, 0, ts) == brute_offset_for_time(full, ts), ts


def damage_indexes(path: str, how: str) -> None:
    rng = random.Random(how)
    for p in part_dir(path).iterdir():
        if p.suffix not in (".index", ".timeindex"):
            continue
        data = p.read_bytes()
        entry = 8 if p.suffix == ".index" else 12
        if (
            how == "delete"
            or (how == "delete-offset" and entry == 8)
            or (how == "delete-time" and entry == 12)
        ):
            p.unlink()
        elif how == "empty":
            p.write_bytes(b"")
        elif how == "truncate-entries":
            p.write_bytes(data[: (len(data) // entry // 2) * entry])
        elif how == "truncate-odd":
            p.write_bytes(data[: max(0, len(data) - entry - 5)])
        elif how == "garbage":
            p.write_bytes(rng.randbytes(len(data) or entry * 3))
        elif how == "garbage-entry":
            p.write_bytes(data + rng.randbytes(entry))
        elif how == "zero-tail":
            p.write_bytes(data + bytes(10 << 20))
        elif how == "shifted" and entry == 8:  # plausible entries, each one byte off its batch
            p.write_bytes(
                b"".join(
                    struct.pack(">ii", rel, pos + 1) for rel, pos in struct.iter_unpack(">ii", data)
                )
            )


INDEX_DAMAGE = [
    "delete",
    "delete-offset",
    "delete-time",
    "empty",
    "truncate-entries",
    "truncate-odd",
    "garbage",
    "garbage-entry",
    "zero-tail",
    "shifted",
]


@pytest.mark.parametrize("unclean", [False, True], ids=["clean", "crash"])
@pytest.mark.parametrize("how", INDEX_DAMAGE)
def test_damaged_indexes_are_rebuilt_byte_for_byte(tmp_path: Path, how: str, unclean: bool) -> None:
    """Missing, short, garbage or untrimmed index files are rebuilt on open, and after a clean
    close they are byte-identical to what the append path wrote; lookups stay right."""
    path = str(tmp_path / "s")
    build_store(path, count=300, segment_bytes=6000, index_interval_bytes=300)
    full = reference(path)
    want = index_files(path)
    assert len(logs(path)) >= 3 and all(v for v in want.values())
    damage_indexes(path, how)
    if unclean:
        mark_unclean(path)
    with mqcore.open(path, flush="os") as store:
        check_lookups(store, full)
    assert index_files(path) == want
    with mqcore.open(path, read_only=True) as store:
        check_lookups(store, full)


@pytest.mark.parametrize("how", ["delete", "garbage", "truncate-entries", "shifted"])
def test_read_only_open_serves_damaged_indexes_without_writing(tmp_path: Path, how: str) -> None:
    """Read-only, damaged indexes are not trusted (lookups stay right) and not rewritten."""
    path = str(tmp_path / "s")
    build_store(path, count=300, segment_bytes=6000, index_interval_bytes=300)
    full = reference(path)
    damage_indexes(path, how)
    before = snapshot(path)
    with mqcore.open(path, read_only=True) as store:
        check_lookups(store, full)
    assert snapshot(path) == before


def test_full_scan_without_marker_and_checkpoint(tmp_path: Path) -> None:
    """No clean-shutdown marker and no checkpoint: every segment is scanned and rebuilt."""
    path = str(tmp_path / "s")
    build_store(path, count=300, segment_bytes=6000, index_interval_bytes=300)
    full = reference(path)
    want = index_files(path)
    mark_unclean(path, drop_checkpoint=True)
    with mqcore.open(path, flush="os") as store:
        report = store.recovery[(TOPIC, 0)]
        assert report.recovered_segments == [p.name for p in logs(path)]
        assert report.truncated_bytes == 0
        check_lookups(store, full)
    assert index_files(path) == want


def _empty_segment_file(name: str, data: bytes) -> bool:
    """A file of a segment that holds nothing: empty, or for the key index an empty table (its
    file is made with the segment, header and slots written)."""
    if not name.endswith(".keyindex"):
        return data == b""
    table = KeyTable(data, False)
    return table.key_count == 0 and table.tag_count == 0


def _assert_replay_matches(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    """The killed partition's files ``a`` equal the replay's ``b``, except for the files of one
    empty segment an interrupted roll left after every replayed segment."""
    extra = set(a) - set(b)
    assert all(_empty_segment_file(n, a[n]) for n in extra), extra
    # compare base offsets, not names: the snapshot is named by the end offset, the empty
    # segment's base, and "...277.snapshot" sorts after "...277.index"
    last_base = max(int(n.split(".")[0]) for n in b if n.endswith(".log"))
    assert all(int(n.split(".")[0]) > last_base for n in extra), extra
    assert {n: a[n] for n in b} == b


def test_replay_comparison_allows_an_empty_segment_at_the_snapshot_offset() -> None:
    """The oracle itself: an interrupted roll at offset 277 leaves 277.* files while the
    replay's snapshot is 277.snapshot (a name comparison refused this and failed CI runs)."""
    seg = f"{250:020d}"
    end = f"{277:020d}"
    b = {f"{seg}.log": b"x", f"{seg}.index": b"", f"{end}.snapshot": b"s"}
    a = dict(b, **{f"{end}.log": b"", f"{end}.index": b"", f"{end}.timeindex": b""})
    _assert_replay_matches(a, b)
    with pytest.raises(AssertionError):
        _assert_replay_matches(dict(a, **{f"{end}.log": b"y"}), b)
    with pytest.raises(AssertionError):
        _assert_replay_matches(dict(b, **{f"{100:020d}.log": b""}), b)


# where the writer dies: SIGKILL from the parent after 700 acks (anywhere), or at a crash point
# inside a roll; producer_snapshot.after_write:9 left four snapshot files (the pruning never ran
# and the reopen had nothing new to write), failing a CI run that hit it by chance
REPLAY_KILLS = [
    "acks",
    "roll.after_seal:6",
    "roll.after_new_segment:6",
    "roll.before_dir_fsync:6",
    "producer_snapshot.after_write:9",
    "index.after_trim:40",
]


@pytest.mark.parametrize("kill", REPLAY_KILLS)
def test_crashed_writer_files_match_a_clean_replay(tmp_path: Path, kill: str) -> None:
    """After a SIGKILL, recovery plus a clean close leaves every file (logs, the rebuilt,
    trimmed indexes of sealed and active segments, the newest producer snapshots) byte-identical
    to what the append path writes when the same appends run in-process and close cleanly.
    Without generated unique IDs: random ones would make the two runs' bytes differ."""
    killed = str(tmp_path / "killed")
    if kill == "acks":
        kill_after_acks(killed, "os", 11, 700, unique_ids=False)
    else:
        run_child(WRITER, killed, "os", "11", "no-uids", crash_at=kill)
    with mqcore.open(killed, flush="os") as store:
        total = sum(store.end_offset(TOPIC, p) for p in range(PARTITIONS))
    replay = str(tmp_path / "replay")
    with open_writer_store(replay, "os", unique_ids=False) as store:
        steps = write_steps(store, 11)
        while sum(store.end_offset(TOPIC, p) for p in range(PARTITIONS)) < total:
            next(steps)
        assert sum(store.end_offset(TOPIC, p) for p in range(PARTITIONS)) == total
    for p in range(PARTITIONS):
        a = {f.name: f.read_bytes() for f in part_dir(killed, p).iterdir()}
        b = {f.name: f.read_bytes() for f in part_dir(replay, p).iterdir()}
        assert len(b) >= 6, "the replay never rolled a segment"
        _assert_replay_matches(a, b)


# -- read-only openers and the writer lock ------------------------------------------------------


@pytest.fixture
def holder(store_path: str) -> Iterator[subprocess.Popen[str]]:
    """A writer process that holds the store open (lock taken, 50 messages appended, clean
    marker gone) until its stdin closes."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, store_path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env(),
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "50"
        yield proc
        proc.stdin.close()
        assert proc.wait() == 0


def test_read_only_beside_a_live_writer_writes_nothing(
    store_path: str, holder: subprocess.Popen[str]
) -> None:
    """A read-only open while another process writes: no lock error, the data is there, and
    not one file (bytes or mtime) changes."""
    before = snapshot(store_path)
    with mqcore.open(store_path, read_only=True) as store:
        msgs = store.read(TOPIC, 0, 0, 100)
        assert [m.value for m in msgs] == [b"held %d" % i for i in range(50)]
        assert store.get(TOPIC, 0, 49) is not None
    assert snapshot(store_path) == before


def test_second_writer_in_another_process_is_locked_out(
    store_path: str, holder: subprocess.Popen[str]
) -> None:
    before = snapshot(store_path)
    with pytest.raises(StoreLockedError):
        mqcore.open(store_path, flush="os")
    assert snapshot(store_path) == before
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait() == 0
    with mqcore.open(store_path, flush="os") as store:
        assert store.end_offset(TOPIC, 0) == 50


def test_second_writer_in_the_same_process_is_locked_out(store_path: str) -> None:
    first = mqcore.open(store_path, flush="os")
    first.create_topic(TOPIC)
    first.append(TOPIC, b"one", partition=0)
    with pytest.raises(StoreLockedError):
        mqcore.open(store_path, flush="os")
    with mqcore.open(store_path, read_only=True) as ro:
        assert ro.end_offset(TOPIC, 0) == 1
    first.append(TOPIC, b"two", partition=0)
    first.close()
    with mqcore.open(store_path, flush="os") as store:
        assert [m.value for m in store.read(TOPIC, 0, 0, 10)] == [b"one", b"two"]


def test_read_only_open_of_a_store_needing_recovery_does_not_truncate(tmp_path: Path) -> None:
    """Read-only over a torn tail: the whole batches are served, the tail is reported, and the
    file keeps every byte (only a writer may cut)."""
    path = str(tmp_path / "s")
    build_store(path)
    full = reference(path)
    last_pos, last_size, last_base, _ = batches(logs(path)[-1])[-1]
    os.truncate(logs(path)[-1], last_pos + last_size - 1)
    mark_unclean(path)
    before = snapshot(path)
    with mqcore.open(path, read_only=True) as store:
        assert store.recovery[(TOPIC, 0)].truncated_bytes == last_size - 1
        assert store.end_offset(TOPIC, 0) == last_base
        assert same_messages(store.read(TOPIC, 0, 0, 1 << 20), full[:last_base])
        assert store.get(TOPIC, 0, last_base) is None
    assert snapshot(path) == before


# -- interrupted segment replacement ------------------------------------------------------------


def compacted_copy(log: Path) -> tuple[bytes, set[int]]:
    """The segment's bytes without its odd-numbered batches (what a cleaner could write: the
    same offsets, with gaps) and the offsets that were dropped."""
    data = log.read_bytes()
    kept: list[bytes] = []
    dropped: set[int] = set()
    for i, (pos, size, base, last) in enumerate(batches(log)):
        if i % 2:
            dropped.update(range(base, last + 1))
        else:
            kept.append(data[pos : pos + size])
    return b"".join(kept), dropped


@pytest.mark.parametrize("stage", ["cleaned", "swap-and-deleted", "swap-beside-old"])
def test_interrupted_segment_swap_is_finished_at_load(tmp_path: Path, stage: str) -> None:
    """Kafka's rule: `.cleaned` and `.deleted` files are dropped, a `.swap` replaces its
    segment; the log then reads as the cleaner left it."""
    path = str(tmp_path / "s")
    build_store(path, count=120, segment_bytes=2000)
    full = reference(path)
    first = logs(path)[0]
    stem = first.with_suffix("")
    old_bytes = first.read_bytes()
    new_bytes, dropped = compacted_copy(first)
    if stage == "cleaned":
        Path(f"{first}.cleaned").write_bytes(new_bytes)
        Path(f"{stem}.index.cleaned").write_bytes(b"\x00" * 16)
        expected = full
    else:
        Path(f"{first}.swap").write_bytes(new_bytes)
        for suffix in (".index", ".timeindex"):
            os.replace(f"{stem}{suffix}", f"{stem}{suffix}.deleted")
        if stage == "swap-and-deleted":
            os.replace(first, f"{first}.deleted")
        expected = [m for m in full if m.offset not in dropped]
    with mqcore.open(path, flush="os") as store:
        msgs = store.read(TOPIC, 0, 0, 1 << 20)
        assert same_messages(msgs, expected)
        for off in sorted(dropped)[:5]:
            got = store.get(TOPIC, 0, off)
            assert (got is None) == (stage != "cleaned")
        assert store.end_offset(TOPIC, 0) == len(full)
    leftovers = [
        p.name for p in part_dir(path).iterdir() if p.suffix in (".cleaned", ".swap", ".deleted")
    ]
    assert leftovers == []
    assert first.read_bytes() == (old_bytes if stage == "cleaned" else new_bytes)
