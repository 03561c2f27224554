"""Streamed appends (batch.pyx "Streaming"): a large uncompressed batch is written by a
background thread while it is encoded, its header last.

The bytes must equal those of the encode-then-write path; a failure part way (bad input, a
full disk) must leave the log as it was; a process killed between the records and the header
leaves a tail that recovery cuts; the writer thread survives fork.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import child_env
from hypothesis import given
from hypothesis import strategies as st

import mqcore
from mqcore._ext.batch import encode_batch, stream_bound
from mqcore._ext.crc32c import combine, crc32c
from mqcore._ext.writer import BackgroundWriter
from mqcore.errors import InvalidRecordError
from mqcore.storage.writers import STREAM_MIN_BYTES

T0 = 1_700_000_000_000
HEADER = 61


def stream_to_file(path: Path, position: int, base_offset: int, *args: object, **kw: object):
    """Stream a batch into `path` at `position` with a fresh writer; returns the batch."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return encode_batch(
            *args, writer=BackgroundWriter(), fd=fd, position=position,
            base_offset=base_offset, **kw,
        )  # fmt: skip
    finally:
        os.close(fd)


def reference(base_offset: int, *args: object, **kw: object) -> bytes:
    batch = encode_batch(*args, **kw)
    batch.set_base_offset(base_offset)
    return batch.tobytes()


def big_values(rng: random.Random, n: int, size: int) -> list[bytes | None]:
    return [None if rng.random() < 0.02 else rng.randbytes(rng.randint(0, size)) for _ in range(n)]


@given(
    st.binary(max_size=3000), st.binary(max_size=3000), st.binary(max_size=200)
)  # fmt: skip
def test_crc_combine_joins_any_split(a: bytes, b: bytes, c: bytes) -> None:
    assert combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
    assert combine(combine(crc32c(a), crc32c(b), len(b)), crc32c(c), len(c)) == crc32c(a + b + c)


SHAPES = {
    # many small records: chunks close on record boundaries inside the glue buffer
    "small": dict(n=4000, size=400, keys=True, headers=False, timestamps=True),
    # values of 16 KiB and more are referenced, not copied: pieces outside the glue buffer
    "referenced": dict(n=120, size=60_000, keys=False, headers=False, timestamps=False),
    # headers are not in the glue estimate: the buffer grows (and drains) mid-stream
    "headers": dict(n=3000, size=300, keys=True, headers=True, timestamps=True),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("uid_index", [False, True])
def test_streamed_bytes_equal_the_encoded_batch(
    tmp_path: Path, shape: str, uid_index: bool
) -> None:
    """The file gets exactly the bytes encode-then-write makes (generated unique IDs aside,
    which are compared by decoding), after earlier bytes that stay untouched."""
    cfg = SHAPES[shape]
    rng = random.Random(shape)
    n = int(cfg["n"])
    values = big_values(rng, n, int(cfg["size"]))
    keys = [None if i % 5 == 0 else b"key-%d" % i for i in range(n)] if cfg["keys"] else None
    headers = (
        [[("h", rng.randbytes(i % 90)), ("nil", None)] for i in range(n)]
        if cfg["headers"]
        else None
    )
    timestamps = [T0 + rng.randint(-5000, 5000) for _ in range(n)] if cfg["timestamps"] else None
    extra = dict(uid_ms=T0, index=True) if uid_index else {}
    path = tmp_path / "seg.log"
    prior = rng.randbytes(12345)
    path.write_bytes(prior)
    batch = stream_to_file(path, len(prior), 777, values, keys, headers, timestamps, T0, **extra)
    data = path.read_bytes()
    assert batch.written and data[: len(prior)] == prior
    assert len(data) == len(prior) + batch.size
    want = reference(777, values, keys, headers, timestamps, T0, **extra)
    got = data[len(prior) :]
    if not uid_index:
        assert got == want
        return
    # unique IDs differ per encode: same length, and equal once both IDs are read back
    assert len(got) == len(want)
    from mqcore._ext.batch import decode_messages

    mine: list[mqcore.Message] = []
    decode_messages(got, 0, "t", 0, 0, 1 << 30, mine, True)
    uids = batch.uids
    assert [m.header("uid") for m in mine] == [uids[16 * i : 16 * i + 16] for i in range(n)]
    assert [(m.offset, m.timestamp, m.key, m.value) for m in mine] == [
        (777 + i, T0 if timestamps is None else timestamps[i], None if keys is None else keys[i],
         values[i])
        for i in range(n)
    ]  # fmt: skip


def test_stream_bound_covers_the_encoded_size() -> None:
    rng = random.Random(3)
    for _ in range(30):
        n = rng.randint(1, 400)
        values = big_values(rng, n, rng.choice([10, 300, 70_000]))
        keys = [None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 40)) for _ in range(n)]
        ts = None if rng.random() < 0.5 else [rng.randint(0, 1 << 50) for _ in range(n)]
        uid = rng.random() < 0.5
        bound = stream_bound(values, keys, None, ts, uid, True)
        assert bound is not None
        batch = encode_batch(values, keys, None, ts, T0, uid_ms=T0 if uid else -1, index=True)
        assert batch.size <= bound[0]
        assert len(batch.key_hits) // 24 <= bound[1]
        if ts is None:
            assert batch.size == bound[0]
    assert stream_bound([b"x"], None, [[("h", b"v")]], None, False, False) is None
    assert stream_bound([bytearray(b"x")], None, None, None, False, False) is None


def store_with(path: Path, **config: object) -> mqcore.Store:
    store = mqcore.open(str(path), flush="os")
    store.create_topic("t", partitions=2, **config)
    return store


def big_batch(rng: random.Random, n: int = 300, size: int = 2000) -> list[bytes | None]:
    values = [rng.randbytes(size) for _ in range(n)]
    assert sum(map(len, values)) > STREAM_MIN_BYTES
    return values


def test_store_streams_large_batches_and_reads_them_back(tmp_path: Path) -> None:
    """Large plain batches take the streamed path (the writer thread exists), small ones do
    not; both read back identically, across rolls and a reopen, with valid key indexes."""
    rng = random.Random(7)
    expected: list[tuple[bytes | None, bytes | None]] = []
    with store_with(tmp_path / "s", segment_bytes=1 << 20) as store:
        for i in range(12):
            values = big_batch(rng) if i % 3 else [rng.randbytes(50) for _ in range(20)]
            keys = [b"k%d-%d" % (i, j) for j in range(len(values))]
            md = store.append_batch("t", values, keys=keys, partition=0)
            assert isinstance(md, mqcore.BatchMetadata)
            assert md.base_offset == len(expected)
            expected += list(zip(keys, values, strict=True))
        assert store._writers._idle, "no append was streamed"
        found = store.find_by_key("t", b"k7-123")
        assert [m.offset for m in found] == [
            next(i for i, e in enumerate(expected) if e[0] == b"k7-123")
        ]
    assert len([n for n in os.listdir(tmp_path / "s" / "t-0") if n.endswith(".log")]) > 1
    with mqcore.open(str(tmp_path / "s"), read_only=True) as ro:
        got = ro.read("t", 0, 0, len(expected) + 10)
        assert [(m.key, m.value) for m in got] == expected
        assert ro.recovery[("t", 0)].truncated_bytes == 0


def test_bad_timestamp_mid_stream_leaves_the_log_as_it_was(tmp_path: Path) -> None:
    """A timestamp the encoder refuses at record 250 of 300: chunks before it were already
    written past the end; the append raises and the file is cut back exactly."""
    rng = random.Random(11)
    with store_with(tmp_path / "s") as store:
        store.append_batch("t", [b"before"] * 3, partition=0)
        log = tmp_path / "s" / "t-0" / f"{0:020d}.log"
        before = log.read_bytes()
        values = big_batch(rng)
        timestamps = [T0] * len(values)
        timestamps[250] = -5
        with pytest.raises(InvalidRecordError, match="timestamps must be >= 0"):
            store.append_batch("t", values, partition=0, timestamps=timestamps)
        assert log.read_bytes() == before
        md = store.append_batch("t", values, partition=0)
        assert isinstance(md, mqcore.BatchMetadata) and md.base_offset == 3
        assert [m.value for m in store.read("t", 0, 3, 1000)] == values


FULL_DISK = r"""
import os, resource, signal, sys
import mqcore
from mqcore.errors import MQCoreError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
store = mqcore.open(sys.argv[1], flush="os")
limit = int(sys.argv[2])
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
try:
    store.append_batch("t", [b"v" * 2000] * 300, partition=0)
except OSError as e:
    print("refused", e.errno, flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
store.append_batch("t", [b"after"], partition=0)
store.close()
"""


def test_file_size_limit_mid_stream_is_a_clean_error(tmp_path: Path) -> None:
    """A write refused part way (RLIMIT_FSIZE, as a full disk would) raises OSError; the
    partial batch is cut, and the store appends and reopens normally afterwards."""
    path = tmp_path / "s"
    with store_with(path) as store:
        store.append_batch("t", [b"x" * 100] * 10, partition=0)
        kept = store.read("t", 0, 0, 100)
    log = path / "t-0" / f"{0:020d}.log"
    limit = log.stat().st_size + 200_000  # room for some chunks, not the whole batch
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(path), str(limit)],
        capture_output=True, text=True, env=child_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:1] == ["refused"]
    with mqcore.open(str(path), read_only=True) as ro:
        assert ro.recovery[("t", 0)].truncated_bytes == 0
        msgs = ro.read("t", 0, 0, 1000)
        assert msgs[:10] == kept and [m.value for m in msgs[10:]] == [b"after"]


def test_crash_between_records_and_header_is_a_torn_tail(tmp_path: Path) -> None:
    """What a process killed inside a streamed append leaves: the records of the batch on
    disk but zeros where its header goes. Recovery cuts it and appending goes on."""
    rng = random.Random(5)
    path = tmp_path / "s"
    with store_with(path) as store:
        store.append_batch("t", big_batch(rng), partition=0)
        kept = store.read("t", 0, 0, 1000)
    log = path / "t-0" / f"{0:020d}.log"
    torn = reference(300, big_batch(rng), None, None, None, T0)
    with open(log, "ab") as f:
        f.write(bytes(HEADER) + torn[HEADER:])
    os.remove(path / "mqcore-clean-shutdown")  # the writer was killed, not closed
    with mqcore.open(str(path), flush="os") as store:
        report = store.recovery[("t", 0)]
        assert report.truncated_bytes == len(torn)
        assert store.read("t", 0, 0, 1000) == kept
        assert store.append("t", b"next", partition=0).offset == 300


STREAMER = r"""
import random, sys
import mqcore
store = mqcore.open(sys.argv[1], flush="always")
store.create_topic("t", partitions=1, segment_bytes=2_000_000)
rng = random.Random(int(sys.argv[2]))
while True:
    n = rng.randint(150, 400)
    md = store.append_batch("t", [rng.randbytes(2000) for _ in range(n)], partition=0)
    print(md.base_offset, n, flush=True)
"""


def test_sigkill_during_streamed_appends_keeps_acknowledged_batches(tmp_path: Path) -> None:
    """SIGKILL a writer of large streamed batches (flush="always") at random moments: every
    acknowledged batch is there after reopen and nothing else is returned."""
    path = str(tmp_path / "s")
    rng = random.Random(99)
    acked_end = 0
    for it in range(6):
        with subprocess.Popen(
            [sys.executable, "-c", STREAMER, path, str(it)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        ) as proc:  # fmt: skip
            assert proc.stdout is not None and proc.stderr is not None
            for _ in range(rng.randint(1, 6)):
                line = proc.stdout.readline()
                if not line:
                    break
                base, n = map(int, line.split())
                assert base == acked_end
                acked_end = base + n
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            err = proc.stderr.read()
        assert proc.returncode == -signal.SIGKILL, err
        with mqcore.open(path, flush="os") as store:
            end = store.end_offset("t", 0)
            assert end >= acked_end
            offset = 0
            while offset < end:
                got = store.read("t", 0, offset, 5000)
                assert got and [m.offset for m in got] == list(range(offset, offset + len(got)))
                offset += len(got)
            acked_end = end  # batches written but unacknowledged may survive: they are whole


def test_writer_thread_restarts_in_a_forked_child(tmp_path: Path) -> None:
    """A writer used before fork works in the child (its thread did not survive the fork)."""
    writer = BackgroundWriter()
    values = [b"%06d" % i * 100 for i in range(1000)]
    path = tmp_path / "f.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    encode_batch(values, writer=writer, fd=fd, position=0, base_offset=0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            child = tmp_path / "child.log"
            cfd = os.open(child, os.O_RDWR | os.O_CREAT, 0o644)
            encode_batch(values, writer=writer, fd=cfd, position=0, base_offset=0)
            code = 0 if child.read_bytes() == path.read_bytes() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert path.read_bytes() == reference(0, values)


def test_concurrent_streamed_appends(tmp_path: Path) -> None:
    """Threads streaming into the same and different partitions: offsets dense per
    partition, every batch whole and where its metadata says."""
    with store_with(tmp_path / "s") as store:
        results: list[tuple[int, int, list[bytes]]] = []
        lock = threading.Lock()

        def work(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(4):
                values = big_batch(rng, n=150)
                md = store.append_batch("t", values, partition=seed % 2)
                assert isinstance(md, mqcore.BatchMetadata)
                with lock:
                    results.append((md.partition, md.base_offset, values))

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 16
        for p in (0, 1):
            mine = sorted((b, v) for q, b, v in results if q == p)
            offset = 0
            for base, values in mine:
                assert base == offset
                assert [m.value for m in store.read("t", p, base, len(values))] == values
                offset += len(values)
            assert store.end_offset("t", p) == offset
