"""`mqcore produce` when a load goes wrong or is stopped (issue 32.3): Ctrl-C says what was
written and how to go on (a real process and a real SIGINT), `--skip` goes on, a run that
writes nothing leaves no store behind, a directory or compressed file given as input is named,
`\\r\\n` endings lose their `\\r`, and history loaded into a topic produce creates is not
deleted by the next retention pass."""

from __future__ import annotations

import gzip
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import interruptible, run_cli

import mqcore

WAIT = 60.0  # seconds a bounded wait gives a loaded machine


def values(store: str, topic: str = "t") -> list[bytes]:
    with mqcore.open(store, read_only=True) as s:
        return [
            m.value or b""
            for p in range(s.partitions(topic))
            for m in s.read(topic, p, s.start_offset(topic, p), 1_000_000)
        ]


def produce_process(store: str, *args: str) -> subprocess.Popen[bytes]:
    """`mqcore produce` in a process of its own, stdin a pipe the test writes."""
    return interruptible(
        [sys.executable, "-m", "mqcore.cli", "produce", store, "t", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def read_lines(proc: subprocess.Popen[bytes], n: int) -> list[bytes]:
    """The first `n` lines of a child's stdout, waiting at most WAIT seconds for them."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + WAIT
    while data.count(b"\n") < n:
        left = deadline - time.monotonic()
        assert left > 0, f"{len(data.splitlines())} of {n} lines in {WAIT} s"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the child closed its stdout"
            data += chunk
    return data.split(b"\n")[:n]


def test_ctrl_c_says_what_was_written_and_skip_goes_on(tmp_path: Path) -> None:
    """2,000 lines written (two chunks, metadata printed), 500 more waiting in a chunk, then
    SIGINT while produce waits for more input: exit 130, the written lines named as on disk,
    `--skip 2000` to go on; running that on the whole input stores each line once, in order."""
    store = str(tmp_path / "store")
    lines = [b"line %d" % i for i in range(3000)]
    with produce_process(store, "--create") as proc:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(b"".join(line + b"\n" for line in lines[:2500]))
        proc.stdin.flush()
        printed = read_lines(proc, 2000)  # the first two chunks are written
        assert printed[-1].startswith(b"0\t1999\t")
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(WAIT)
        err = proc.stderr.read().decode()
    assert rc == 130
    assert err.strip().splitlines()[-1] == (
        "mqcore: produce interrupted: wrote lines 1-2000 (partition 0 offsets 0-1999), on disk "
        "(flushed); nothing after line 2000 was written. To go on, run the same command on the "
        "same input with --skip 2000"
    )
    assert "Traceback" not in err
    assert values(store) == lines[:2000]
    rc, out, err = run_cli("produce", store, "t", "--skip", "2000",
                           stdin=b"".join(line + b"\n" for line in lines))  # fmt: skip
    assert rc == 0, err
    assert out.splitlines()[0].startswith("0\t2000\t") and len(out.splitlines()) == 1000
    assert values(store) == lines


def test_ctrl_c_before_anything_is_written_leaves_no_store(tmp_path: Path) -> None:
    store = tmp_path / "new" / "store"
    with produce_process(str(store), "--create") as proc:
        assert proc.stderr is not None
        deadline = time.monotonic() + WAIT
        while not (store / "mqcore-topics.json").exists():  # the store is open: it reads stdin
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT) == 130
        err = proc.stderr.read().decode()
    assert err.strip().splitlines()[-1] == "mqcore: produce interrupted: wrote nothing"
    assert not (tmp_path / "new").exists()  # with the parent it made


def test_a_failed_run_that_wrote_nothing_leaves_no_store(tmp_path: Path) -> None:
    """A bad first line from stdin: the store directory (and its parent) produce made is
    removed; an existing store is kept, and the topic the run would have made is not made."""
    store = tmp_path / "a" / "b"
    rc, out, err = run_cli("produce", str(store), "t", "--create", "--config",
                           "max_message_bytes=100", stdin=b"x" * 500 + b"\n")  # fmt: skip
    assert rc == 1 and "wrote nothing, line 1 is 500 bytes" in err
    assert not (tmp_path / "a").exists()
    with mqcore.open(str(store)) as s:
        s.create_topic("other")
    rc, out, err = run_cli("produce", str(store), "t", "--create", "--config",
                           "max_message_bytes=100", stdin=b"x" * 500 + b"\n")  # fmt: skip
    assert rc == 1
    with mqcore.open(str(store), read_only=True) as s:
        assert s.topics() == ["other"]
    # an empty input still creates the topic asked for
    rc, out, err = run_cli("produce", str(store), "t", "--create", stdin=b"")
    assert rc == 0 and out == "" and err == ""
    with mqcore.open(str(store), read_only=True) as s:
        assert s.topics() == ["other", "t"]


def test_a_directory_as_file_is_one_clear_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rc, out, err = run_cli("produce", str(store), "t", "--create", "--file", str(tmp_path))
    assert rc == 1 and out == ""
    assert err == (
        f"mqcore: error: --file {tmp_path} is a directory; give one file (several: cat "
        f"{tmp_path}/*.log | mqcore produce ...)\n"
    )
    rc, _, err = run_cli("produce", str(store), "t", "--create", "--file", str(tmp_path / "no"))
    assert rc == 1
    assert err == f"mqcore: error: --file {tmp_path / 'no'}: No such file or directory\n"
    assert not store.exists()


def test_compressed_and_binary_input_is_warned_about_once(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    gz = tmp_path / "access.log.2.gz"
    gz.write_bytes(gzip.compress(b"".join(b"GET /%d\n" % i for i in range(5000))))
    rc, out, err = run_cli("produce", store, "t", "--create", "--file", str(gz))
    assert rc == 0
    assert err == (
        f"mqcore: warning: {gz} starts like a gzip file: its bytes would be stored as they "
        f"are, compressed; decompress it first: zcat {gz} | mqcore produce ...\n"
    )  # once, though a regular file is read twice (checked, then written)
    rc, out, err = run_cli("produce", store, "t", stdin=b"\x28\xb5\x2f\xfd\x00\x01\n")
    assert rc == 0 and "stdin starts like a zstd file" in err and "zstdcat FILE |" in err
    rc, out, err = run_cli("produce", store, "t", stdin=b"text\nbin\x00ary\nmore\x00\n")
    assert rc == 0 and err.count("\n") == 1
    assert "line 2 of stdin holds NUL bytes: binary input?" in err


def test_crlf_endings_lose_their_cr(tmp_path: Path) -> None:
    """Windows line endings: the `\\r` is not kept in values; a `\\r` inside a line is."""
    store = str(tmp_path / "store")
    data = b"k1|one\r\ntwo\r\nthree\rinside\r\nlast without newline\r"
    src = tmp_path / "win.txt"
    src.write_bytes(data)
    for args, stdin in (
        (["--file", str(src)], None),
        ([], data),
    ):
        rc, _, err = run_cli("produce", store, "t", "--create", "-K", "|", *args, stdin=stdin)
        assert rc == 0, err
    expected = [b"one", b"two", b"three\rinside", b"last without newline\r"]
    assert values(store) == expected * 2


def test_lines_across_read_blocks_keep_their_bytes(tmp_path: Path) -> None:
    """Input is read 64 KiB at a time: a `\r\n` split between two blocks, lines longer than
    a block, a NUL past the first block and a last line without `\n`, from a file and from
    stdin, are stored as the lines are."""
    block = 1 << 16
    lines = [
        b"a" * (block - 1),  # its \r ends the first block, its \n starts the second
        b"b" * (3 * block + 7),
        b"",
        b"c\rd",
        b"x" * 100 + b"\0" + b"y",
        b"tail" * block,
    ]
    data = b"".join(line + b"\r\n" for line in lines[:-1]) + lines[-1]
    assert data[block - 1 : block + 1] == b"\r\n"
    src = tmp_path / "in.txt"
    src.write_bytes(data)
    for n, (args, stdin) in enumerate([(["--file", str(src)], None), ([], data)]):
        store = str(tmp_path / f"s{n}")
        rc, _, err = run_cli("produce", store, "t", "--create", "--config",
                             "max_message_bytes=8388608", *args, stdin=stdin)  # fmt: skip
        assert rc == 0, err
        assert values(store) == lines
        assert "line 5 of " in err and "holds NUL bytes" in err


def test_skip_counts_input_lines_and_warns_past_the_end(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    src = tmp_path / "in.txt"
    src.write_bytes(b"a\nb\nc\n")
    rc, _, err = run_cli("produce", store, "t", "--create", "--file", str(src), "--skip", "1")
    assert rc == 0 and values(store) == [b"b", b"c"]
    rc, _, err = run_cli("produce", store, "t", "--file", str(src), "--skip", "5")
    assert rc == 0
    assert err == (
        f"mqcore: warning: --skip 5 passed over every line of {src} (it has 3): nothing to write\n"
    )
    rc, _, err = run_cli("produce", store, "t", "--value", "x", "--skip", "1")
    assert rc == 2 and "--skip and --record-start read input lines" in err


def test_history_loaded_into_a_created_topic_is_kept(tmp_path: Path) -> None:
    """The issue's load: a year-old log in small segments, then a retention pass (what the
    writer's background task runs): every line is still there. The topic was created with
    retention_ms=-1; a retention given at creation is the user's choice, warned about."""
    store = str(tmp_path / "store")
    src = tmp_path / "old.log"
    lines = [b"2024-01-01T10:%02d:%02dZ event %d" % (i // 60 % 60, i % 60, i) for i in range(3000)]
    src.write_bytes(b"".join(line + b"\n" for line in lines))
    rc, _, err = run_cli("produce", store, "t", "--create", "--file", str(src),
                         "--timestamp-format", "iso", "--batch-size", "50",
                         "--config", "segment_bytes=16384")  # fmt: skip
    assert rc == 0, err
    loaded = err
    rc, out, err = run_cli("retention", store, "t")
    assert rc == 0, err
    assert values(store) == lines
    assert loaded == ""  # nothing to warn about
    rc, out, _ = run_cli("config", store, "t")
    assert "retention_ms=-1\n" in out
    # asked for: a week's retention, and one warning that the load is older than that
    rc, _, err = run_cli("produce", str(tmp_path / "s2"), "t", "--create", "--file", str(src),
                         "--timestamp-format", "iso", "--config",
                         "retention_ms=604800000")  # fmt: skip
    assert rc == 0 and err.count("warning") == 1
    assert "line 1 is older than retention_ms=604800000" in err


def test_help_says_what_create_keeps() -> None:
    rc, out, _ = run_cli("produce", "--help")
    assert rc == 0
    text = " ".join(out.split())
    assert "a topic it creates keeps every message, however old (retention_ms=-1)" in text
    assert "--skip N pass over the first N input lines" in text
