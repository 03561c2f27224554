"""The `mqcore` command as a subprocess: `dump` of segment files (mqcore's and Kafka's, whole and
damaged) against what the kernels read, and `stats` against the store and its files."""

from __future__ import annotations

import json
import os
import pty
import struct
import subprocess
import sys
import warnings
from typing import Any

import pytest
from conftest import child_env, run_cli

import mqcore
from mqcore._ext import index as index_kernel
from mqcore._ext.batch import BatchInfo, read_batch_info
from mqcore._ext.crc32c import crc32c
from mqcore._ext.keyindex import KeyTable
from mqcore.cli import main
from mqcore.query.jsonform import json_bytes

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", r"(open|read)_text is deprecated", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

T0 = 1_700_000_000_000
SEGMENT0 = "00000000000000000000"


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def of_type(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["type"] == kind]


def batches_of(path: str) -> list[tuple[int, BatchInfo]]:
    """(position, BatchInfo) of every batch of a whole .log, as the kernel reads them."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        info = read_batch_info(data, pos)
        assert info is not None
        out.append((pos, info))
        pos += info.size
    return out


@pytest.fixture(scope="module")
def segments(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A closed store whose topic `t` has several sealed segments of mixed-codec batches, with
    index entries every few batches; returns the partition directory."""
    path = str(tmp_path_factory.mktemp("dump") / "store")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t", segment_bytes=6000, index_interval_bytes=300, key_index_entries=256)
        for i in range(60):
            s.append_batch(
                "t",
                [b"value %d-%d" % (i, j) for j in range(i % 4 + 1)],
                keys=[None if j % 3 else b"key-%d" % i for j in range(i % 4 + 1)],
                headers=[[("h", b"\xff" if i % 5 == 0 else b"x")]] * (i % 4 + 1),
                timestamps=[T0 + (i * 37) % 500] * (i % 4 + 1),
                compression=("none", "gzip", "zstd", "lz4")[i % 4],
                tags=["tg"] * (i % 4 + 1),
            )
    return os.path.join(path, "t-0")


def test_dump_lists_what_the_kernels_read(segments: str) -> None:
    log = os.path.join(segments, SEGMENT0 + ".log")
    rc, out, err = run_cli("dump", log, "--records", "--index", "--json")
    assert rc == 0 and err == "", err
    docs = json_lines(out)
    assert docs[0] == {
        "type": "segment",
        "path": log,
        "size": os.path.getsize(log),
        "base_offset": 0,
    }

    expected = batches_of(log)
    assert len(expected) > 5
    assert [
        (
            d["position"], d["base_offset"], d["last_offset"], d["count"], d["size"], d["crc"],
            d["max_timestamp"], d["base_timestamp"], d["producer_id"], d["is_control"],
        )
        for d in of_type(docs, "batch")
    ] == [
        (
            pos, b.base_offset, b.last_offset, b.records_count, b.size, b.crc, b.max_timestamp,
            b.base_timestamp, b.producer_id, b.is_control,
        )
        for pos, b in expected
    ]  # fmt: skip
    assert {d["compression"] for d in of_type(docs, "batch")} == {"none", "gzip", "zstd", "lz4"}
    assert all(d["crc_valid"] for d in of_type(docs, "batch"))

    last = expected[-1][1].last_offset
    with mqcore.open(os.path.dirname(segments), read_only=True) as s:
        msgs = s.read("t", 0, 0, last + 1)
    records = of_type(docs, "record")
    assert [(r["offset"], r["timestamp"], r["key"], r["value"], r["headers"]) for r in records] == [
        (m.offset, m.timestamp, json_bytes(m.key), json_bytes(m.value),
         [[k, json_bytes(v)] for k, v in m.headers])
        for m in msgs
    ]  # fmt: skip
    assert {"base64": "/w=="} in [h[1] for r in records for h in r["headers"]]

    # the sibling indexes, entry by entry, as the index kernel reads them
    with open(os.path.join(segments, SEGMENT0 + ".index"), "rb") as f:
        raw = f.read()
    entries = [index_kernel.offset_entry(raw, i) for i in range(len(raw) // 8)]
    assert len(entries) >= 2
    assert [(d["offset"], d["position"]) for d in of_type(docs, "index_entry")] == entries
    with open(os.path.join(segments, SEGMENT0 + ".timeindex"), "rb") as f:
        raw = f.read()
    times = [index_kernel.time_entry(raw, i) for i in range(len(raw) // 12)]
    assert [(d["timestamp"], d["offset"]) for d in of_type(docs, "timeindex_entry")] == times

    # the key index summary, as KeyTable reads its header
    (kx,) = of_type(docs, "keyindex")
    with open(os.path.join(segments, SEGMENT0 + ".keyindex"), "rb") as f:
        table = KeyTable(f.read(), False)
    assert (kx["slots"], kx["key_entries"], kx["tag_entries"], kx["covered_position"]) == (
        table.slot_count, table.key_count, table.tag_count, table.covered_position,
    )  # fmt: skip
    assert kx["current"] and kx["chains_valid"] and kx["tag_entries"] == len(msgs)
    (summary,) = of_type(docs, "summary")
    assert summary["batches"] == len(expected) and summary["records"] == len(msgs)
    assert summary["damaged"] == 0 and summary["walked_bytes"] == os.path.getsize(log)


def test_dump_text_is_kafka_dump_log_like_with_a_progress_bar(segments: str) -> None:
    log = os.path.join(segments, SEGMENT0 + ".log")
    rc, out, err = run_cli("dump", log, "--print-data-log", "--progress")
    assert rc == 0
    lines = out.splitlines()
    expected = batches_of(log)
    heads = [line for line in lines if line.startswith("baseOffset: ")]
    assert len(heads) == len(expected)
    pos, first = expected[1]
    assert heads[1].startswith(
        f"baseOffset: {first.base_offset} lastOffset: {first.last_offset} count: "
        f"{first.records_count} position: {pos} size: {first.size} CreateTime: "
        f"{first.max_timestamp} compresscodec: gzip crc: {first.crc} isValid: true"
    )
    assert "isTransactional: false isControl: false" in heads[1]
    records = [line for line in lines if line.startswith("| offset: ")]
    assert len(records) == sum(b.records_count for _, b in expected)
    assert "key: key-0 payload: value 0-0" in records[0] and "headers: [h=\\xff" in records[0]
    assert f"\r{SEGMENT0}.log [" in err and "100.0%" in err
    rc, _, err = run_cli("dump", log)
    assert rc == 0 and err == ""  # no bar unless asked (stderr is not a terminal)


@pytest.mark.parametrize("suffix", [".index", ".timeindex", ".keyindex"])
def test_dump_of_an_index_file(segments: str, suffix: str) -> None:
    path = os.path.join(segments, SEGMENT0 + suffix)
    rc, out, err = run_cli("dump", path, "--json")
    assert rc == 0 and err == ""
    docs = json_lines(out)
    with open(path, "rb") as f:
        raw = f.read()
    if suffix == ".index":
        got = [(d["offset"], d["position"]) for d in of_type(docs, "index_entry")]
        assert got == [index_kernel.offset_entry(raw, i) for i in range(len(raw) // 8)]
    elif suffix == ".timeindex":
        got = [(d["timestamp"], d["offset"]) for d in of_type(docs, "timeindex_entry")]
        assert got == [index_kernel.time_entry(raw, i) for i in range(len(raw) // 12)]
    else:
        assert of_type(docs, "keyindex")[0]["key_entries"] == KeyTable(raw, False).key_count
    assert not of_type(docs, "damage")


def kafka_batch(
    base: int, records: list[tuple[bytes | None, bytes]], codec: int = 0, pid: int = -1,
    epoch: int = -1, seq: int = -1, control: bool = False,
) -> bytes:  # fmt: skip
    """A batch kafka-python builds (a broker's bytes); `control` turns it into a transaction
    marker batch, CRC recomputed, as a coordinator writes one."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=pid >= 0, producer_id=pid,
        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20,
    )  # fmt: skip
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=T0 + i, key=key, value=value, headers=[])
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)
    if control:
        (attrs,) = struct.unpack_from(">h", buf, 21)
        struct.pack_into(">h", buf, 21, attrs | 0x20)
        struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:])))
    return bytes(buf)


def test_dump_of_a_kafka_written_segment(tmp_path: os.PathLike[str]) -> None:
    log = os.path.join(tmp_path, "00000000000000000100.log")
    with open(log, "wb") as f:
        big = b"compressible " * 20  # kafka-python compresses only when it pays
        f.write(kafka_batch(100, [(b"a", big), (None, b"2"), (b"c", b"3")], codec=1))
        f.write(kafka_batch(103, [(b"t", b"in txn"), (b"u", b"too")], pid=42, epoch=3, seq=10))
        marker = (struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 5))  # COMMIT, epoch 5
        f.write(kafka_batch(105, [marker], pid=42, epoch=3, seq=-1, control=True))
    rc, out, err = run_cli("dump", log, "--records", "--json")
    assert rc == 0 and err == ""
    docs = json_lines(out)
    assert docs[0]["base_offset"] == 100
    b = of_type(docs, "batch")
    assert [(d["base_offset"], d["last_offset"], d["compression"]) for d in b] == [
        (100, 102, "gzip"), (103, 104, "none"), (105, 105, "none"),
    ]  # fmt: skip
    assert (b[1]["producer_id"], b[1]["producer_epoch"], b[1]["base_sequence"]) == (42, 3, 10)
    assert b[1]["last_sequence"] == 11
    assert [(d["is_transactional"], d["is_control"]) for d in b] == [
        (False, False), (True, False), (True, True),
    ]  # fmt: skip
    recs = of_type(docs, "record")
    assert [(r["offset"], r["key"], r["value"]) for r in recs[:5]] == [
        (100, "a", "compressible " * 20), (101, None, "2"), (102, "c", "3"), (103, "t", "in txn"),
        (104, "u", "too"),
    ]  # fmt: skip
    assert (recs[5]["offset"], recs[5]["control"], recs[5]["coordinator_epoch"]) == (
        105,
        "COMMIT",
        5,
    )
    rc, out, _ = run_cli("dump", log, "--records")
    assert rc == 0 and "| offset: 105 CreateTime: " in out and "endTxnMarker: COMMIT" in out


def damage(data: bytearray, how: str, positions: list[int]) -> int:
    """Damage a copy of a .log; returns the position where the damage should be reported."""
    second, last = positions[1], positions[-1]
    if how == "flipped byte":
        data[second + 70] ^= 0x40  # inside the second batch's records: its CRC fails
        return second
    if how == "truncated":
        del data[last + 30 :]
        return last
    if how == "bad length":
        struct.pack_into(">i", data, second + 8, 0x7FFFFFFF)
        return second
    if how == "bad magic":
        data[second + 16] = 7
        return second
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "bad length", "bad magic"])
def test_dump_of_a_damaged_segment_reports_the_position(
    segments: str, tmp_path: os.PathLike[str], how: str
) -> None:
    src = os.path.join(segments, SEGMENT0 + ".log")
    positions = [pos for pos, _ in batches_of(src)]
    with open(src, "rb") as f:
        data = bytearray(f.read())
    at = damage(data, how, positions)
    log = os.path.join(tmp_path, SEGMENT0 + ".log")
    with open(log, "wb") as f:
        f.write(data)
    rc, out, err = run_cli("dump", log, "--records", "--json")
    assert rc == 1
    assert err.startswith(f"mqcore: error: {log} is damaged at position {at}: ")
    assert err.count("\n") == 1
    docs = json_lines(out)
    assert of_type(docs, "damage")[0]["position"] == at
    listed = [d["position"] for d in of_type(docs, "batch")]
    if how == "flipped byte":  # the framing holds: every batch is still listed
        assert listed == positions
        assert [d["crc_valid"] for d in of_type(docs, "batch")][:3] == [True, False, True]
        assert "CRC-32C mismatch" in err
    elif how == "truncated":
        assert listed == positions[:-1] and "ends past the end of the file" in err
    else:  # the length or magic of the second batch is gone: nothing after it can be found
        assert listed == positions[:1]
    # the text form reports the same place
    rc, out, _ = run_cli("dump", log)
    assert rc == 1 and f"DAMAGE at position {at} of {SEGMENT0}.log: " in out


def test_dump_finds_an_index_entry_that_points_nowhere(
    segments: str, tmp_path: os.PathLike[str]
) -> None:
    for suffix in (".log", ".index", ".timeindex"):
        with open(os.path.join(segments, SEGMENT0 + suffix), "rb") as f:
            data = bytearray(f.read())
        if suffix == ".index":
            rel, pos = struct.unpack_from(">ii", data, 8)
            struct.pack_into(">ii", data, 8, rel, pos + 1)  # entry 1: one byte off its batch
        with open(os.path.join(tmp_path, SEGMENT0 + suffix), "wb") as f:
            f.write(data)
    rc, out, err = run_cli("dump", os.path.join(tmp_path, SEGMENT0 + ".log"), "--index")
    assert rc == 1
    assert f"{SEGMENT0}.index is damaged at position 8: entry 1 (offset {rel}) points at " \
        f"position {pos + 1}, where no batch starts" in err  # fmt: skip
    assert f"DAMAGE at position 8 of {SEGMENT0}.index" in out


def test_dump_of_a_live_writers_active_segment(store_path: str) -> None:
    writer = mqcore.open(store_path, flush="os")
    try:
        writer.create_topic("live", index_interval_bytes=100, key_index_entries=256)
        for i in range(20):
            writer.append_batch("live", [b"x" * 80, b"y%d" % i])
        stem = os.path.join(store_path, "live-0", SEGMENT0)
        assert os.path.getsize(stem + ".index") > 8 * 20  # preallocated: zeros after the entries
        rc, out, err = run_cli("dump", stem + ".log", "--index", "--json")
    finally:
        writer.close()
    assert rc == 0 and err == ""
    docs = json_lines(out)
    assert len(of_type(docs, "batch")) == 20 and not of_type(docs, "damage")
    tail = [d for d in of_type(docs, "index_tail") if d["path"].endswith(".index")]
    assert tail and tail[0]["zero_entries"] > 0
    assert len(of_type(docs, "index_entry")) == 19  # every batch after the first
    (kx,) = of_type(docs, "keyindex")
    assert kx["current"] is False  # the writer updates its header when it flushes


@pytest.mark.parametrize(
    ("argv", "status", "needle"),
    [
        (["{dir}"], 2, "to print a topic's messages use `mqcore consume STORE TOPIC`"),
        (["{dir}/x.txt"], 2, "dump reads .log, .index, .timeindex, .keyindex files, not .txt"),
        (["{dir}/missing.log"], 1, "missing.log does not exist"),
    ],
)
def test_dump_usage(
    tmp_path: os.PathLike[str],
    capfd: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    needle: str,
) -> None:
    assert main(["dump", *(a.format(dir=tmp_path) for a in argv)]) == status
    assert needle in capfd.readouterr().err


# -- stats ----------------------------------------------------------------------------------------


def test_stats_matches_the_store_and_its_files(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("a", partitions=2, segment_bytes=2000, key_index_entries=128)
        s.create_topic("b", timestamp_type="LogAppendTime")
        s.create_topic("empty")
        for i in range(30):
            s.append_batch("a", [b"v%d" % i] * 5, partition=i % 2, timestamps=[T0 + i] * 5)
        s.append("b", b"one")
    rc, out, err = run_cli("stats", store_path, "--json")
    assert rc == 0 and err == ""
    *rows, total = json_lines(out)
    with mqcore.open(store_path, read_only=True) as s:
        for r in rows:
            t, p = r["topic"], r["partition"]
            msgs = s.read(t, p, 0, 1 << 20)
            assert (r["start_offset"], r["end_offset"]) == (
                s.start_offset(t, p),
                s.end_offset(t, p),
            )
            assert r["messages"] == len(msgs)
            assert r["first_timestamp"] == (msgs[0].timestamp if msgs else -1)
            assert r["last_timestamp"] == (msgs[-1].timestamp if msgs else -1)
            assert r["max_timestamp"] == max((m.timestamp for m in msgs), default=-1)
            files = sorted(os.listdir(os.path.join(store_path, f"{t}-{p}")))
            sizes = {
                kind: sum(
                    os.path.getsize(os.path.join(store_path, f"{t}-{p}", n))
                    for n in files
                    if n.endswith("." + kind)
                )
                for kind in ("log", "index", "timeindex", "keyindex")
            }
            assert {k: r[f"{k}_bytes"] for k in sizes} == sizes
            assert r["segments"] == sum(n.endswith(".log") for n in files)
    assert [(r["topic"], r["partition"]) for r in rows] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
        ("empty", 0),
    ]
    assert rows[0]["segments"] > 1
    assert total["type"] == "total" and total["partitions"] == 4
    for name in ("messages", "segments", "log_bytes", "keyindex_bytes", "disk_bytes"):
        assert total[name] == sum(r[name] for r in rows)
    assert total["messages"] == 151

    rc, out, err = run_cli("stats", store_path, "a", "--progress")
    assert rc == 0 and "\rstats [" in err and "100.0%" in err
    lines = out.splitlines()
    assert lines[0].split()[:6] == ["TOPIC", "PARTITION", "START", "END", "MESSAGES", "SEGMENTS"]
    assert [line.split()[:5] for line in lines[1:3]] == [
        ["a", "0", "0", "75", "75"], ["a", "1", "0", "75", "75"],
    ]  # fmt: skip
    assert lines[3].split()[:3] == ["TOTAL", "150", str(rows[0]["segments"] + rows[1]["segments"])]


def stderr_on_a_terminal(*argv: str) -> tuple[int, str]:
    """Run the command with stderr on a pseudo-terminal: (exit status, what it drew there)."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mqcore.cli", *argv],
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
            timeout=120,
            check=False,
        )
    finally:
        os.close(slave)
    chunks = []
    try:
        while chunk := os.read(master, 1 << 16):
            chunks.append(chunk)
    except OSError:
        pass  # EIO: the terminal's other end is closed and everything was read
    finally:
        os.close(master)
    return proc.returncode, b"".join(chunks).decode()


def test_progress_bar_is_drawn_on_a_terminal_unless_turned_off(store_path: str) -> None:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t")
        s.append_batch("t", [b"x"] * 10)
    rc, drawn = stderr_on_a_terminal("stats", store_path)
    assert rc == 0 and "\rstats [" in drawn and "100.0%" in drawn
    rc, drawn = stderr_on_a_terminal("stats", store_path, "--no-progress")
    assert rc == 0 and drawn == ""
