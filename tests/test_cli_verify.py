"""`mqcore verify` as a subprocess: a clean store passes; each kind of damage the tests inject is
found, named by file and position; --repair rebuilds derived files and cuts only what it says."""

from __future__ import annotations

import json
import os
import shutil
import struct
from typing import Any

import pytest
from conftest import run_cli

import mqcore
from mqcore._ext.batch import read_batch_info

T0 = 1_700_000_000_000
SEG0 = "00000000000000000000"


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def problems(out: str) -> list[dict[str, Any]]:
    return [d for d in json_lines(out) if d["type"] == "problem"]


def positions(path: str) -> list[int]:
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        info = read_batch_info(data, pos)
        assert info is not None
        out.append(pos)
        pos += info.size
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A closed store: topic `t` (2 partitions, several segments, keys and tags) and `u`."""
    path = str(tmp_path_factory.mktemp("verify") / "store")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t", 2, segment_bytes=5000, index_interval_bytes=300, key_index_entries=256)
        s.create_topic("u")
        for i in range(80):
            s.append_batch(
                "t",
                [b"value %d-%d" % (i, j) for j in range(3)],
                keys=[b"key-%d" % (i % 7)] * 3,
                partition=i % 2,
                timestamps=[T0 + i] * 3,
                compression=("none", "gzip", "zstd")[i % 3],
                tags=["tg"] * 3,
            )
        s.append("u", b"only")
    return path


@pytest.fixture
def store_dir(pristine: str, tmp_path: os.PathLike[str]) -> str:
    copy = os.path.join(tmp_path, "store")
    shutil.copytree(pristine, copy)
    return copy


def part(store_dir: str, topic: str = "t", p: int = 0) -> str:
    return os.path.join(store_dir, f"{topic}-{p}")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def patch(path: str, at: int, fmt: str, *values: int) -> None:
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        struct.pack_into(fmt, data, at, *values)
        f.seek(0)
        f.write(data)


def messages(store_dir: str) -> dict[tuple[str, int], list[tuple[int, bytes | None]]]:
    with mqcore.open(store_dir, read_only=True) as s:
        return {
            (t, p): [(m.offset, m.value) for m in s.read(t, p, s.start_offset(t, p), 10**6)]
            for t in s.topics()
            for p in s.available_partitions(t)
        }


def test_a_clean_store_verifies(store_dir: str) -> None:
    rc, out, err = run_cli("verify", store_dir, "--json")
    assert rc == 0, err
    (summary,) = [d for d in json_lines(out) if d["type"] == "summary"]
    assert summary["problems"] == 0 and summary["partitions"] == 3
    assert summary["segments"] > 3 and summary["batches"] == 81
    rc, out, _ = run_cli("verify", store_dir, "t", "--deep")
    assert rc == 0 and out.strip().endswith("no problems")


def _crc(store_dir: str) -> tuple[str, int]:
    log = os.path.join(part(store_dir), SEG0 + ".log")
    at = positions(log)[1]
    with open(log, "r+b") as f:
        f.seek(at + 70)
        b = f.read(1)
        f.seek(at + 70)
        f.write(bytes([b[0] ^ 0x20]))
    return log, at


def _torn(store_dir: str) -> tuple[str, int]:
    d = part(store_dir, "t", 1)
    last = sorted(n for n in os.listdir(d) if n.endswith(".log"))[-1]
    log = os.path.join(d, last)
    at = positions(log)[-1]
    with open(log, "r+b") as f:
        f.truncate(at + 70)  # the header is whole, the records are cut short
    return log, at


def _backwards(store_dir: str) -> tuple[str, int]:
    log = os.path.join(part(store_dir), SEG0 + ".log")
    at = positions(log)[2]
    patch(log, at, ">q", 0)  # base offset 0 again; outside the CRC
    return log, at


def _index_nowhere(store_dir: str) -> tuple[str, int]:
    idx = os.path.join(part(store_dir), SEG0 + ".index")
    rel, pos = struct.unpack_from(">ii", _read(idx), 0)
    patch(idx, 0, ">ii", rel, pos + 3)
    return idx, 0


def _timeindex_order(store_dir: str) -> tuple[str, int]:
    ti = os.path.join(part(store_dir), SEG0 + ".timeindex")
    size = os.path.getsize(ti)
    assert size >= 24
    patch(ti, 12, ">q", T0 - 10**6)  # entry 1 earlier than entry 0
    return ti, 12


def _timeindex_value(store_dir: str) -> tuple[str, int]:
    ti = os.path.join(part(store_dir), SEG0 + ".timeindex")
    ts, rel = struct.unpack_from(">qi", _read(ti), 0)
    patch(ti, 0, ">q", ts - 1)
    return ti, 0


def _keyindex_header(store_dir: str) -> tuple[str, int]:
    ki = os.path.join(part(store_dir), SEG0 + ".keyindex")
    patch(ki, 0, ">I", 0x58585858)
    return ki, 0


def _keyindex_entry(store_dir: str) -> tuple[str, int]:
    ki = os.path.join(part(store_dir), SEG0 + ".keyindex")
    head = _read(ki)[:64]
    slots = struct.unpack_from(">I", head, 8)[0]
    first_entry = 64 + 4 * slots
    rel, pos = struct.unpack_from(">II", _read(ki), first_entry + 8)
    patch(ki, first_entry + 12, ">I", pos + 1)  # entry 0 points one byte past its batch
    return ki, 0


def _overlap(store_dir: str) -> tuple[str, int]:
    d = part(store_dir)
    second = sorted(n for n in os.listdir(d) if n.endswith(".log"))[1]
    base = int(second[:-4])
    for suffix in (".log", ".index", ".timeindex", ".keyindex"):
        os.rename(os.path.join(d, second[:-4] + suffix),
                  os.path.join(d, f"{base - 1:020d}{suffix}"))  # fmt: skip
    return os.path.join(d, f"{base - 1:020d}.log"), 0


def _leftover(store_dir: str) -> tuple[str, int]:
    path = os.path.join(part(store_dir), SEG0 + ".log.cleaned")  # a cleaner's unfinished output
    with open(path, "wb") as f:
        f.write(b"partial")
    return path, 0


def _missing_index(store_dir: str) -> tuple[str, int]:
    idx = os.path.join(part(store_dir), SEG0 + ".index")
    os.unlink(idx)
    return idx, 0


KINDS = {
    "crc": (_crc, "log", "CRC-32C mismatch"),
    "torn tail": (_torn, "log", "ends past the end of the file"),
    "offsets backwards": (_backwards, "log", "offsets go backwards"),
    "index entry points nowhere": (_index_nowhere, "index", "where no batch starts"),
    "time index out of order": (_timeindex_order, "timeindex", "breaks the index's order"),
    "time index wrong timestamp": (_timeindex_value, "timeindex", "has max timestamp"),
    "key index header": (_keyindex_header, "keyindex", "bad magic"),
    "key index entry": (_keyindex_entry, "keyindex", "does not point into a batch"),
    "segments overlap": (_overlap, "segments", "overlaps the previous segment"),
    "swap leftover": (_leftover, "leftover", "interrupted segment swap"),
    "missing index": (_missing_index, "index", "missing"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_verify_finds_each_kind_of_damage(store_dir: str, kind: str) -> None:
    inject, where, reason = KINDS[kind]
    path, at = inject(store_dir)
    rc, out, err = run_cli("verify", store_dir, "--json")
    assert rc == 1, (out, err)
    found = problems(out)
    assert any(p["path"] == path and p["kind"] == where and reason in p["reason"] for p in found), (
        found
    )
    if where in ("log", "index", "timeindex"):
        assert any(p["path"] == path and p["position"] == at for p in found)
    rc, text, _ = run_cli("verify", store_dir)
    assert rc == 1 and f"PROBLEM {where} {path}@" in text


@pytest.mark.parametrize(
    "kind",
    [k for k, (_, where, _) in KINDS.items() if where in ("index", "timeindex", "keyindex")]
    + ["swap leftover"],
)
def test_repair_rebuilds_derived_files_and_loses_nothing(store_dir: str, kind: str) -> None:
    before = messages(store_dir)
    KINDS[kind][0](store_dir)
    rc, out, err = run_cli("verify", store_dir, "--repair", "--json")
    assert rc == 0, (out, err)
    assert [d for d in json_lines(out) if d["type"] == "summary"][-1]["problems"] == 0
    assert messages(store_dir) == before
    assert run_cli("verify", store_dir)[0] == 0


def test_repair_cuts_a_torn_tail_and_says_so(store_dir: str) -> None:
    before = messages(store_dir)
    _torn(store_dir)
    rc, out, err = run_cli("verify", store_dir, "--repair")
    assert rc == 0, (out, err)
    lost = before[("t", 1)][-3:]  # the last batch of three records was torn
    assert "recovery cut" in out and f"offsets {lost[0][0]} to {lost[-1][0]} dropped" in out
    after = messages(store_dir)
    assert after[("t", 1)] == before[("t", 1)][:-3]
    assert after[("t", 0)] == before[("t", 0)]


def test_repair_leaves_mid_log_damage_unless_told_to_truncate(store_dir: str) -> None:
    before = messages(store_dir)
    log, at = _crc(store_dir)
    rc, out, _ = run_cli("verify", store_dir, "--repair")
    assert rc == 1
    assert "not repaired" in out and "--truncate" in out
    with open(log, "rb") as f:
        assert len(f.read()) > at  # nothing was cut
    rc, out, err = run_cli("verify", store_dir, "--repair", "--truncate")
    assert rc == 0, (out, err)
    first_lost = before[("t", 0)][3][0]  # the second batch (3 records each) is the damaged one
    assert f"offsets {first_lost} to {before[('t', 0)][-1][0]} of t-0 dropped" in out
    after = messages(store_dir)
    assert after[("t", 0)] == before[("t", 0)][:3]
    assert after[("t", 1)] == before[("t", 1)] and after[("u", 0)] == before[("u", 0)]


def test_verify_needs_a_real_topic(store_dir: str) -> None:
    rc, _, err = run_cli("verify", store_dir, "nope")
    assert rc == 1 and "no topic nope" in err
    rc, _, err = run_cli("verify", store_dir, "--truncate")
    assert rc == 2 and "--truncate only goes with --repair" in err


def test_verify_checks_the_sealed_segments_beside_a_writer_and_changes_nothing(
    store_dir: str,
) -> None:
    """Issue 17.2: verify took the writer lock, so it was refused beside a writer (and its hint,
    read_only=True, led to ReadOnlyStoreError). Now it reads only: the writer's active
    segments are skipped, damage in a sealed segment is still found, nothing is written."""
    with mqcore.open(store_dir, flush="os") as writer:
        writer.append("u", b"more")
        before = {n: os.stat(os.path.join(r, n)).st_mtime_ns
                  for r, _, ns in os.walk(store_dir) for n in ns}  # fmt: skip
        rc, out, err = run_cli("verify", store_dir, "--json")
        assert rc == 0, (out, err)
        (summary,) = [d for d in json_lines(out) if d["type"] == "summary"]
        assert summary["live_writer"] is True and summary["problems"] == 0
        assert summary["skipped_segments"] == 3  # one active segment per partition
        segments = sum(len(writer.segment_offsets(t, p)) for t, p in (("t", 0), ("t", 1), ("u", 0)))
        assert summary["segments"] == segments - 3
        after = {n: os.stat(os.path.join(r, n)).st_mtime_ns
                 for r, _, ns in os.walk(store_dir) for n in ns}  # fmt: skip
        assert after == before
        log, at = _crc(store_dir)  # segment 0 of t-0: sealed
        rc, out, err = run_cli("verify", store_dir, "--json")
        assert rc == 1, (out, err)
        assert any(p["path"] == log and p["position"] == at for p in problems(out))
        rc, text, _ = run_cli("verify", store_dir)
        assert "beside a live writer, 3 active or changing segments skipped" in text
        rc, _, err = run_cli("verify", store_dir, "--repair")
        assert rc == 1 and "verify --repair needs the writer lock" in err
        assert "stop that writer first" in err and "read_only" not in err
        writer.append("u", b"still writing")


def test_verify_beside_a_compacting_deleting_writer_reports_no_false_damage(
    tmp_path: os.PathLike[str],
) -> None:
    """tests/live_writer.py rolls, compacts and deletes segments while verify runs in a loop
    beside it: a segment the writer replaced or deleted meanwhile is skipped, never reported."""
    import subprocess
    import sys

    from tests.conftest import child_env

    path = os.path.join(tmp_path, "store")
    writer = subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "live_writer.py"), path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
    )  # fmt: skip
    assert writer.stdout is not None
    try:
        assert writer.stdout.readline() == b"READY\n"
        runs = [run_cli("verify", path, "--json") for _ in range(6)]
    finally:
        out, err = writer.communicate(b"", timeout=60)
    assert writer.returncode == 0, err.decode()
    for rc, out, err in runs:
        assert rc == 0, (out, err)
        (summary,) = [d for d in json_lines(out) if d["type"] == "summary"]
        assert summary["live_writer"] is True and summary["segments"] > 0


def test_repair_never_cuts_flushed_data_as_a_power_loss_hole(tmp_path: os.PathLike[str]) -> None:
    """A zeroed 4 KiB page inside data a clean close flushed (the disk lost a page, later
    batches intact): `--repair` without `--truncate` must refuse, not cut. It deleted the
    recovery checkpoint to force a full scan, so the power-loss hole rule, meant only for
    bytes past the last flush, covered the whole log and every offset after the page went."""
    path = os.path.join(tmp_path, "s")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("big", segment_bytes=1 << 20, compression="none")
        for i in range(40):
            s.append("big", bytes([65 + i % 26]) * 20_000, key=b"k%d" % i)
    before = messages(path)
    log = os.path.join(path, "big-0", SEG0 + ".log")
    starts = positions(log)
    page = (starts[10] + 4096) // 4096 * 4096  # a page inside batch 10's value
    assert page + 4096 < starts[11]
    with open(log, "r+b") as f:
        f.seek(page)
        f.write(bytes(4096))
    size = os.path.getsize(log)
    rc, out, _ = run_cli("verify", path, "--repair")
    assert rc == 1, out
    assert "not repaired" in out and "--truncate" in out
    assert os.path.getsize(log) == size  # nothing cut
    rc, out, err = run_cli("verify", path, "--repair", "--truncate")
    assert rc == 0, (out, err)
    assert messages(path)[("big", 0)] == before[("big", 0)][:10]
