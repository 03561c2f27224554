"""The `mqcore` command: topics, consume (text and kcat JSON), offsets, errors, read-only safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import child_env, file_bytes, shown_time

import mqcore
from mqcore.cli import main

T0 = 1_700_000_000_000

# (key, value, headers, timestamp) of topic "orders", all written to partition 0
ORDERS = [
    (b"k0", b"first", [("source", b"web")], T0),
    (None, b"no key", [], T0 + 10),
    (b"k2", None, [("deleted", None)], T0 + 20),  # a tombstone with a null header value
    (b"k3", b"", [], T0 + 30),  # empty, not null
    (b"k4", b"tab\there\nnewline", [("a", b"1"), ("a", b"2")], T0 + 40),
    (b"\xff\xfe", b"caf\xc3\xa9 \x00\xff", [], T0 + 50),  # non-UTF-8 key, mixed value
]


@pytest.fixture
def populated(store_path: str) -> str:
    """A closed store: orders (2 partitions), clicks (LogAppendTime), empty (no messages)."""
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("orders", partitions=2)
        for key, value, headers, ts in ORDERS:
            s.append("orders", value, key=key, headers=headers, partition=0, timestamp=ts)
        s.append_batch(
            "orders",
            [b"p1-%d" % i for i in range(5)],
            partition=1,
            timestamps=[T0 + 100 + i for i in range(5)],
        )
        s.create_topic("clicks", timestamp_type="LogAppendTime")
        s.append("clicks", b"c", timestamp=T0)
        s.create_topic("empty")
    return store_path


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capfd.readouterr()
    assert "Exception ignored" not in err, err  # the autouse guard would not see it any more
    return rc, out, err


def test_version_in_process(capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capfd, "--version")
    assert rc == 0
    assert out == f"mqcore {mqcore.__version__}\n"


def test_version_as_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqcore.cli", "--version"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"mqcore {mqcore.__version__}\n"


def test_no_command_is_a_usage_error(capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capfd)
    assert rc == 2
    assert "usage: mqcore" in err


def test_topics_table(populated: str, capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capfd, "topics", populated)
    assert rc == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["TOPIC", "PARTITION", "START", "END", "MESSAGES"]
    assert rows[1:] == [
        ["clicks", "0", "0", "1", "1"],
        ["empty", "0", "0", "0", "0"],
        ["orders", "0", "0", str(len(ORDERS)), str(len(ORDERS))],
        ["orders", "1", "0", "5", "5"],
    ]


def test_topics_json_matches_the_store(populated: str, capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capfd, "topics", populated, "--json")
    assert rc == 0
    doc = json.loads(out)["topics"]
    with mqcore.open(populated, read_only=True) as s:
        assert sorted(doc) == s.topics()
        for topic, parts in doc.items():
            assert [p["partition"] for p in parts] == list(range(s.partitions(topic)))
            for p in parts:
                assert p["start_offset"] == s.start_offset(topic, p["partition"])
                assert p["end_offset"] == s.end_offset(topic, p["partition"])


def test_topics_hides_internal_topics_unless_all(
    populated: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 17.4: one consumer group put __consumer_offsets and 16 __retry.<group> partitions
    into every listing. Internal topics are listed with --all only."""
    with mqcore.open(populated, flush="os") as s:
        c = s.consumer("billing", "orders")
        c.nack(c.poll()[0])
        c.commit()
        c.close()
        internal = [t for t in s.topics() if t.startswith("__")]
    assert internal == ["__consumer_offsets", "__retry.billing"]
    rc, out, err = run(capfd, "topics", populated)
    assert rc == 0
    assert {line.split()[0] for line in out.splitlines()[1:]} == {"clicks", "empty", "orders"}
    assert err == "mqcore: 2 internal topics not shown (--all lists them)\n"
    rc, out, _ = run(capfd, "topics", populated, "--json")
    assert sorted(json.loads(out)["topics"]) == ["clicks", "empty", "orders"]
    rc, out, err = run(capfd, "topics", populated, "--all", "--json")
    with mqcore.open(populated, read_only=True) as r:
        assert sorted(json.loads(out)["topics"]) == r.topics()
    rc, out, err = run(capfd, "topics", populated, "--all")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert sum(row[0] == "__retry.billing" for row in rows) == 16 and err == ""


def test_consume_text_lines(populated: str, capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capfd, "consume", populated, "orders", "-p", "0")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == len(ORDERS)
    fields = [line.split("\t") for line in lines]
    assert all(len(f) == 5 for f in fields)  # tabs and newlines inside values are escaped
    assert [f[0] for f in fields] == ["0"] * len(ORDERS)
    assert [int(f[1]) for f in fields] == list(range(len(ORDERS)))
    assert [f[2] for f in fields] == [shown_time(ts) for *_, ts in ORDERS]
    assert fields[0][3:] == ["k0", "first"]
    assert fields[1][3] == "(null)"
    assert fields[2][4] == "(null)"
    assert fields[3][4] == ""
    assert fields[4][4] == "tab\\there\\nnewline"
    assert fields[5][3] == "\\xff\\xfe"


def test_consume_json_envelopes(populated: str, capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capfd, "consume", populated, "orders", "-p", "0", "--json")
    assert rc == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == len(ORDERS)
    with mqcore.open(populated, read_only=True) as s:
        uids = [m.header("uid") for m in s.read("orders", 0, 0)]
    for offset, (doc, (key, value, headers, ts)) in enumerate(zip(docs, ORDERS, strict=True)):
        assert set(doc) == {
            "topic",
            "partition",
            "offset",
            "tstype",
            "ts",
            "headers",
            "key",
            "payload",
        }
        assert (doc["topic"], doc["partition"], doc["offset"]) == ("orders", 0, offset)
        assert (doc["tstype"], doc["ts"]) == ("create", ts)
        flat = [x for k, v in headers for x in (k, None if v is None else v.decode())]
        # then the store's generated unique ID header: 16 random bytes, non-UTF-8 ones as \xNN
        uid = uids[offset]
        assert uid is not None and len(uid) == 16
        assert doc["headers"] == [*flat, "uid", uid.decode("utf-8", "backslashreplace")]
        if offset < 5:  # the last record holds bytes that are not UTF-8
            assert doc["key"] == (None if key is None else key.decode())
            assert doc["payload"] == (None if value is None else value.decode())
    assert docs[5]["key"] == "\\xff\\xfe"
    assert docs[5]["payload"] == "café \x00\\xff"


def test_consume_log_append_time(populated: str, capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capfd, "consume", populated, "clicks", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["tstype"] == "logappend"
    assert doc["ts"] != T0  # the log's clock, not the producer's timestamp


def test_consume_every_partition_in_order(
    populated: str, capfd: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capfd, "consume", populated, "orders")
    assert rc == 0
    got = [tuple(map(int, line.split("\t")[:2])) for line in out.splitlines()]
    assert got == [(0, o) for o in range(len(ORDERS))] + [(1, o) for o in range(5)]


@pytest.mark.parametrize(
    ("spec", "count", "expected"),
    [
        ("beginning", None, [0, 1, 2, 3, 4]),
        ("2", None, [2, 3, 4]),
        ("5", None, []),
        ("-2", None, [3, 4]),
        ("-99", None, [0, 1, 2, 3, 4]),
        ("end", None, []),
        (f"s@{T0 + 102}", None, [2, 3, 4]),
        (f"s@{T0 + 999}", None, []),
        ("1", 2, [1, 2]),
        ("0", 0, []),
    ],
)
def test_consume_offsets_and_count(
    populated: str,
    capfd: pytest.CaptureFixture[str],
    spec: str,
    count: int | None,
    expected: list[int],
) -> None:
    argv = ["consume", populated, "orders", "-p", "1", "-o", spec]
    if count is not None:
        argv += ["-n", str(count)]
    rc, out, err = run(capfd, *argv)
    assert rc == 0, err
    assert [int(line.split("\t")[1]) for line in out.splitlines()] == expected


def test_consume_count_is_a_total_across_partitions(
    populated: str, capfd: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capfd, "consume", populated, "orders", "-o", "-1", "-n", "2")
    assert rc == 0
    assert [tuple(map(int, line.split("\t")[:2])) for line in out.splitlines()] == [
        (0, len(ORDERS) - 1),
        (1, 4),
    ]


def test_consume_pages_through_long_partitions(
    store_path: str, capfd: pytest.CaptureFixture[str]
) -> None:
    n = 2500  # more than one read() page
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic("t")
        for i in range(0, n, 700):
            s.append_batch("t", [b"%d" % j for j in range(i, min(n, i + 700))])
    rc, out, _ = run(capfd, "consume", store_path, "t", "-o", "3")
    assert rc == 0
    assert [line.split("\t")[4] for line in out.splitlines()] == [str(j) for j in range(3, n)]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["topics", "{missing}"], "does not exist"),
        (["consume", "{store}", "nope"], "topic 'nope' does not exist"),
        (["consume", "{store}", "bad/name"], "characters outside"),
        (["consume", "{store}", "orders", "-p", "7"], "partition 7"),
        (["consume", "{store}", "orders", "-p", "1", "-o", "6"], "offset 6 is outside [0, 5]"),
        (["consume", "{store}", "orders", "-o", "soon"], "'soon' is not beginning, end"),
        (["consume", "{store}", "orders", "-o", "s@later"], "'s@later'"),
        (["consume", "{store}", "orders", "-n", "-1"], "--count must be >= 0"),
    ],
)
def test_errors_are_one_line_and_exit_1(
    populated: str,
    tmp_path: os.PathLike[str],
    capfd: pytest.CaptureFixture[str],
    argv: list[str],
    needle: str,
) -> None:
    args = [a.format(store=populated, missing=os.path.join(tmp_path, "missing")) for a in argv]
    rc, out, err = run(capfd, *args)
    assert rc == 1
    assert out == ""
    assert err.startswith("mqcore: error: ") and err.endswith("\n")
    assert err.count("\n") == 1
    assert needle in err


def test_reads_beside_a_live_writer_and_changes_nothing(
    store_path: str, capfd: pytest.CaptureFixture[str]
) -> None:
    writer = mqcore.open(store_path, flush="os")
    try:
        writer.create_topic("live", partitions=2)
        writer.append_batch("live", [b"a", b"b", b"c"], partition=1)
        before = file_bytes(store_path)
        rc, out, err = run(capfd, "consume", store_path, "live", "-p", "1")
        assert rc == 0, err
        assert [line.split("\t")[4] for line in out.splitlines()] == ["a", "b", "c"]
        rc, out, _ = run(capfd, "topics", store_path)
        assert rc == 0 and "live" in out
        assert file_bytes(store_path) == before
        # the writer kept its lock and goes on writing
        assert writer.append("live", b"d", partition=1).offset == 3
        with pytest.raises(mqcore.errors.StoreLockedError):
            mqcore.open(store_path)
    finally:
        writer.close()
    rc, out, _ = run(capfd, "consume", store_path, "live", "-p", "1", "-o", "-1")
    assert out.split("\t")[4] == "d\n"
