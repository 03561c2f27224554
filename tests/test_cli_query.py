"""The `mqcore` command as a subprocess: produce, get, consume and query against the Store API.

Every query kind runs through the CLI with --json and must list exactly the messages, and report
exactly the completion (reason, scanned counts, cursor), that the Store method returns.
"""

from __future__ import annotations

import base64
import json
import os
import random
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
from conftest import file_bytes, run_cli, shown_time

import mqcore
from mqcore.cli import main
from mqcore.cli.query import CHUNK

T0 = 1_700_000_000_000
TOPIC = "events"
KEYS = [b"user-%d" % i for i in range(25)]


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def where(m: dict[str, Any] | mqcore.Message) -> tuple[str, int, int]:
    if isinstance(m, dict):
        return (m["topic"], m["partition"], m["offset"])
    return (m.topic, m.partition, m.offset)


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three partitions of small segments: duplicate keys, tags, properties, shuffled
    timestamps, mixed codecs, a message with extra keys and one with a non-UTF-8 value."""
    path = str(tmp_path_factory.mktemp("cli") / "store")
    rng = random.Random(11)
    with mqcore.open(path, flush="os") as s:
        s.create_topic(
            TOPIC, partitions=3, segment_bytes=8 << 10, key_index_entries=512,
            index_interval_bytes=512,
        )  # fmt: skip
        for i in range(0, 1200, 40):
            n = 40
            s.append_batch(
                TOPIC,
                [
                    b"order %d %s" % (i + j, rng.choice([b"apple", b"pear", b"fig"]))
                    for j in range(n)
                ],
                keys=[rng.choice([*KEYS, None]) for _ in range(n)],
                partition=rng.randrange(3),
                timestamps=[T0 + rng.randrange(100_000) for _ in range(n)],
                tags=[rng.choice(["red", "blue", None]) for _ in range(n)],
                properties=[
                    {"amount": str(rng.randrange(100)), "region": rng.choice(["eu", "us"])}
                    for _ in range(n)
                ],
                compression=rng.choice(["none", "gzip", "zstd"]),
            )
        s.append(TOPIC, b"vip \xff\xfe", key=b"main", keys=["vip", "gold"], partition=2, tag="red")
    return path


def as_json(b: bytes | None) -> object:
    """What --json shows for bytes: UTF-8 text, else {"base64": ...}."""
    if b is None:
        return None
    try:
        return b.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode()}


def first_with(path: str, pick: Callable[[mqcore.Message], bool]) -> mqcore.Message:
    with mqcore.open(path, read_only=True) as s:
        for p in range(3):
            for m in s.read(TOPIC, p, 0, 1 << 20):
                if pick(m):
                    return m
    raise AssertionError("no such message")


# -- query: every kind against the Store API ----------------------------------------------------

W_LO, W_HI = T0 + 20_000, T0 + 70_000
QUERIES: dict[str, tuple[list[str], Callable[[mqcore.Store, mqcore.Message], Any]]] = {
    "key": (["--key", "user-3"], lambda s, m: s.find_by_key(TOPIC, b"user-3")),
    "key in a window": (
        ["--key", "user-3", "--from", iso(W_LO), "--to", str(W_HI)],
        lambda s, m: s.search(TOPIC, key=b"user-3", start=W_LO, end=W_HI, order="time"),
    ),
    "key in a window, partition order": (
        ["--key", "user-3", "--from", iso(W_LO), "--to", str(W_HI), "--order", "partition"],
        lambda s, m: s.find_by_key(TOPIC, b"user-3", start=W_LO, end=W_HI),
    ),
    "key with filters": (
        ["--key", "user-3", "--where", "amount >= 50", "--contains", "pear"],
        lambda s, m: s.search(TOPIC, key=b"user-3", where="amount >= 50", contains=b"pear"),
    ),  # fmt: skip
    "key of one partition, limited": (
        ["--key", "user-5", "-p", "1", "--limit", "2"],
        lambda s, m: s.find_by_key(TOPIC, b"user-5", partition=1, limit=2),
    ),
    "extra key": (["--key", "gold"], lambda s, m: s.find_by_key(TOPIC, b"gold")),
    "range": (
        ["--from", str(W_LO), "--to", iso(W_HI)],
        lambda s, m: s.range(TOPIC, W_LO, W_HI, order="time"),
    ),
    "range, partition order": (
        ["--from", str(W_LO), "--to", iso(W_HI), "--order", "partition"],
        lambda s, m: s.range(TOPIC, W_LO, W_HI),
    ),
    "tag": (["--tag", "red"], lambda s, m: s.search(TOPIC, tag="red")),
    "where": (
        ["--where", "amount >= 50 AND region = 'eu'"],
        lambda s, m: s.search(TOPIC, where="amount >= 50 AND region = 'eu'"),
    ),
    "contains": (["--contains", "apple"], lambda s, m: s.search(TOPIC, contains=b"apple")),
    "regex": (
        ["--regex", "order 1[0-9]+ f"],
        lambda s, m: s.search(TOPIC, regex="order 1[0-9]+ f"),
    ),
    "combined": (
        [
            "--tag",
            "blue",
            "--where",
            "amount < 70",
            "--contains",
            "pear",
            "--from",
            iso(W_LO),
            "--to",
            iso(W_HI),
            "-p",
            "0",
        ],
        lambda s, m: s.search(
            TOPIC,
            contains=b"pear",
            tag="blue",
            where="amount < 70",
            partition=0,
            start=W_LO,
            end=W_HI,
        ),
    ),  # fmt: skip
    "limit": (["--tag", "blue", "--limit", "7"], lambda s, m: s.search(TOPIC, tag="blue", limit=7)),
    "max scan": (
        ["--contains", "fig", "--max-scan", "100"],
        lambda s, m: s.search(TOPIC, contains=b"fig", max_scan=100),
    ),
}


@pytest.mark.parametrize("kind", sorted(QUERIES))
def test_query_kinds_equal_the_store_api(events: str, kind: str) -> None:
    argv, api = QUERIES[kind]
    rc, out, err = run_cli("query", events, TOPIC, *argv, "--json")
    assert rc == 0 and err == "", err
    *docs, summary = json_lines(out)
    with mqcore.open(events, read_only=True) as s:
        expected = api(s, mqcore.Message(TOPIC, 0, 0, 0))
    assert docs, "every query of this table finds something"
    assert [where(d) for d in docs] == [where(m) for m in expected]
    assert summary == {
        "type": "summary",
        "reason": expected.reason,
        "complete": expected.complete,
        "messages": len(expected),
        "scanned_records": expected.scanned_records,
        "scanned_bytes": expected.scanned_bytes,
        "cursor": expected.cursor,
        "missing_properties": list(expected.missing_properties or ()),
    }
    if kind in ("limit", "max scan"):
        assert summary["cursor"] is not None and not summary["complete"]
    elif kind != "key of one partition, limited":
        assert summary["complete"]


def test_query_by_ids_and_full_message_objects(events: str) -> None:
    msg = first_with(events, lambda m: m.key == b"main")
    assert msg.unique_id is not None
    rc, out, _ = run_cli("query", events, "--unique-id", msg.unique_id, "--json")
    assert rc == 0
    *docs, summary = json_lines(out)
    with mqcore.open(events, read_only=True) as s:
        expected = s.find_by_unique_id(msg.unique_id)
        assert s.get_by_id(msg.msg_id) == msg
    assert [where(d) for d in docs] == [where(m) for m in expected] == [where(msg)]
    assert summary["reason"] == expected.reason
    doc = docs[0]
    assert doc["msg_id"] == msg.msg_id and doc["unique_id"] == msg.unique_id
    assert doc["key"] == "main" and doc["tag"] == "red"
    assert doc["value"] == {"base64": base64.b64encode(b"vip \xff\xfe").decode()}
    assert doc["properties"] == msg.properties and doc["properties"]["keys"] == "vip gold"

    rc, out, _ = run_cli("query", events, "--id", msg.msg_id, "--json")
    assert rc == 0
    docs = json_lines(out)
    assert docs[0] == doc and docs[1]["messages"] == 1 and docs[1]["complete"]
    # with a TOPIC, only messages of that topic count; a topic that is not there is an error
    rc, out, _ = run_cli("query", events, TOPIC, "--id", msg.msg_id, "--json")
    assert rc == 0 and json_lines(out)[0] == doc
    rc, out, err = run_cli("query", events, "other", "--id", msg.msg_id, "--json")
    assert rc == 1 and out == "" and "topic 'other' does not exist" in err


def test_query_cursor_resumes_where_the_limit_stopped(events: str) -> None:
    rc, out, _ = run_cli("query", events, TOPIC, "--tag", "blue", "--limit", "30", "--json")
    *first, summary = json_lines(out)
    assert rc == 0 and summary["reason"] == "limit"
    rc, out, _ = run_cli("query", events, TOPIC, "--tag", "blue", "--cursor", summary["cursor"],
                         "--json")  # fmt: skip
    *rest, summary = json_lines(out)
    assert rc == 0 and summary["complete"]
    with mqcore.open(events, read_only=True) as s:
        everything = s.search(TOPIC, tag="blue")
    assert [where(d) for d in first + rest] == [where(m) for m in everything]


def test_query_text_lines_and_completion_line(events: str) -> None:
    rc, out, err = run_cli("query", events, TOPIC, "--key", "user-7")
    assert rc == 0
    with mqcore.open(events, read_only=True) as s:
        expected = s.find_by_key(TOPIC, b"user-7")
    rows = [line.split("\t") for line in out.splitlines()]
    assert rows == [
        [TOPIC, str(m.partition), str(m.offset), shown_time(m.timestamp), m.msg_id, "user-7",
         m.value.decode()]
        for m in expected
        if m.value is not None
    ]  # fmt: skip
    assert err == f"mqcore: query exhausted: {len(expected)} messages, read " \
        f"{expected.scanned_records:,} records\n"  # fmt: skip

    rc, out, err = run_cli("query", events, TOPIC, "--contains", "apple", "--limit", "3")
    assert rc == 0 and len(out.splitlines()) == 3
    assert err.startswith("mqcore: query limit: 3 messages, read ")
    assert err.count("\n") == 1 and "; resume with --cursor c1-" in err


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> str:
    """More records than one progress chunk scans, in several segments."""
    path = str(tmp_path_factory.mktemp("big") / "store")
    n = CHUNK * 2 + 5000
    with mqcore.open(path, flush="os") as s:
        s.create_topic("big", partitions=2, segment_bytes=1 << 20, unique_ids=False,
                       key_index=False)  # fmt: skip
        for i in range(0, n, 5000):
            values = [b"m%d%s" % (j, b" hit" if j % 997 == 0 else b"") for j in range(i, i + 5000)]
            s.append_batch("big", values, partition=(i // 5000) % 2)
    return path


def test_query_progress_bar_only_when_asked(big: str) -> None:
    argv = ("query", big, "big", "--contains", "hit", "--json")
    rc, plain, err = run_cli(*argv)
    assert rc == 0 and err == ""  # stderr is not a terminal: no bar
    rc, shown, err = run_cli(*argv, "--progress")
    assert rc == 0
    assert "\rquery big [" in err and "100.0%" in err and "records" in err
    with mqcore.open(big, read_only=True) as s:
        expected = s.search("big", contains=b"hit")
    for out in (plain, shown):
        *docs, summary = json_lines(out)
        assert [where(d) for d in docs] == [where(m) for m in expected]
        assert summary["reason"] == "exhausted" and summary["messages"] == len(expected)
    # the bar run scanned in several chunks, and saw every record
    assert json_lines(shown)[-1]["scanned_records"] >= expected.scanned_records > CHUNK
    rc, _, err = run_cli(*argv, "--no-progress")
    assert rc == 0 and err == ""


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--unique-id", "a", "--tag", "b"], "--unique-id does not take --tag"),
        (["--id", "m1-AA", "--limit", "3"], "--id does not take --limit"),
        (["--unique-id", "a", "--order", "time"], "--unique-id does not take --order"),
        (["--tag", "a", "--order", "timestamp"], "invalid choice: 'timestamp'"),
        (["--id", "m1-AA", "--key", "a"], "only one of"),
        ([], "give --id, --unique-id, --key or a scan filter"),
        (["--limit", "0", "--tag", "x"], "must be at least 1"),
    ],
)
def test_query_usage_errors_exit_2(
    events: str, capfd: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    assert main(["query", events, TOPIC, *argv]) == 2
    out, err = capfd.readouterr()
    assert out == "" and "usage: mqcore query" in err and needle in err


def test_query_scan_without_topic_is_a_usage_error(
    events: str, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", events, "--tag", "red"]) == 2
    assert "a scan needs a TOPIC" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--unique-id", "m1-AABvcmRlcnM"], "is a store ID, not a unique ID"),
        (["--id", "nonsense"], "is not a store ID"),
        (["--where", "amount >"], "at column"),
        (["--from", "yesterday", "--tag", "x"], "--from 'yesterday' is neither"),
        (["--regex", "(", "--tag", "x"], "bad regex"),
    ],
)
def test_query_bad_values_are_one_line_errors(
    events: str, capfd: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    topic = [] if argv[0] in ("--unique-id", "--id") else [TOPIC]
    assert main(["query", events, *topic, *argv]) == 1
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("mqcore: error: ") and err.count("\n") == 1
    assert needle in err


# -- produce, then get / consume / query ----------------------------------------------------------


def test_produce_round_trip(store_path: str) -> None:
    lines = [b"k1:hello", b"k2:world", b"no key here", b"k1:again", b"", b"k3:tab\there"]
    rc, out, err = run_cli(
        "produce", store_path, "orders", "-K", ":", "--create", "--partitions", "3",
        "--tag", "paid", "--property", "region=eu", "--property", "amount=12",
        "-H", "src=web", "-H", "flag", "--keys", "alias-a alias-b", "--json",
        stdin=b"\n".join(lines) + b"\n",
    )  # fmt: skip
    assert rc == 0 and err == "", err
    produced = json_lines(out)
    assert len(produced) == len(lines)
    with mqcore.open(store_path, read_only=True) as s:
        assert s.partitions("orders") == 3
        for doc, line in zip(produced, lines, strict=True):
            head, sep, tail = line.partition(b":")
            key, value = (head, tail) if sep else (None, line)
            m = s.get("orders", doc["partition"], doc["offset"])
            assert m is not None
            assert (m.key, m.value) == (key, value)
            assert doc["type"] == "produced" and doc["topic"] == "orders"
            assert (doc["msg_id"], doc["unique_id"]) == (m.msg_id, m.unique_id)
            assert m.tag == "paid"
            assert m.properties["region"] == "eu" and m.properties["amount"] == "12"
            assert ("flag", None) in m.headers and m.header("src") == b"web"
            assert m.header("keys") == b"alias-a alias-b"
            if key is not None:  # routed like Kafka's partitioner
                from mqcore._ext.hashing import kafka_partition

                assert doc["partition"] == kafka_partition(key, 3)
        messages = [m for p in range(3) for m in s.read("orders", p, 0, 100)]
        by_alias = s.find_by_key("orders", b"alias-b")
    assert sorted(where(m) for m in by_alias) == sorted(where(d) for d in produced)

    # consume prints what was produced, partition by partition
    rc, out, _ = run_cli("consume", store_path, "orders")
    assert rc == 0
    assert out.splitlines() == [
        "\t".join((str(m.partition), str(m.offset), shown_time(m.timestamp),
                   "(null)" if m.key is None else m.key.decode(),
                   (m.value or b"").decode().replace("\t", "\\t")))
        for m in messages
    ]  # fmt: skip

    # topics lists the partitions with their offsets, one JSON line
    rc, out, _ = run_cli("topics", store_path, "--json")
    assert rc == 0 and len(out.splitlines()) == 1
    assert json.loads(out)["topics"]["orders"] == [
        {
            "partition": p,
            "start_offset": 0,
            "end_offset": sum(d["partition"] == p for d in produced),
        }
        for p in range(3)
    ]

    # get shows one of them in full
    doc = produced[5]
    rc, out, _ = run_cli("get", store_path, "orders", str(doc["partition"]), str(doc["offset"]),
                         "--json")  # fmt: skip
    assert rc == 0
    got = json.loads(out)
    assert (got["key"], got["value"], got["tag"]) == ("k3", "tab\there", "paid")
    assert (got["msg_id"], got["unique_id"]) == (doc["msg_id"], doc["unique_id"])
    assert ["flag", None] in got["headers"] and ["src", "web"] in got["headers"]

    # and the unique ID printed at produce time finds it
    rc, out, _ = run_cli("query", store_path, "--unique-id", doc["unique_id"], "--json")
    assert rc == 0 and [where(d) for d in json_lines(out)[:-1]] == [where(got)]


def test_produce_values_to_a_partition_with_compression(store_path: str) -> None:
    with mqcore.open(store_path) as s:
        s.create_topic("t", partitions=2)
    rc, out, err = run_cli("produce", store_path, "t", "--value", "a", "--value", "b\xe9", "-p",
                           "1", "--compression", "gzip", "-k", "K")  # fmt: skip
    assert rc == 0 and err == ""
    rows = [line.split("\t") for line in out.splitlines()]
    with mqcore.open(store_path, read_only=True) as s:
        msgs = s.read("t", 1, 0, 10)
    assert rows == [["1", str(m.offset), m.msg_id, str(m.unique_id)] for m in msgs]
    assert [(m.key, m.value) for m in msgs] == [(b"K", b"a"), (b"K", "b\xe9".encode())]
    log = os.path.join(store_path, "t-1", "00000000000000000000.log")
    from mqcore._ext.batch import read_batch_info

    with open(log, "rb") as f:
        info = read_batch_info(f.read())
    assert info is not None and info.codec == 1 and info.records_count == 2  # one gzip batch


def test_produce_file_keeps_bytes_exactly(store_path: str, tmp_path: os.PathLike[str]) -> None:
    data = [b"\xff\x00binary", b"caf\xc3\xa9", b"last line without newline"]
    src = os.path.join(tmp_path, "in.txt")
    with open(src, "wb") as f:
        f.write(b"\n".join(data))
    rc, out, _ = run_cli("produce", store_path, "raw", "--create", "--file", src, "-k", "k")
    assert rc == 0 and len(out.splitlines()) == 3
    with mqcore.open(store_path, read_only=True) as s:
        assert [m.value for m in s.read("raw", 0, 0, 10)] == data


def test_produce_into_a_locked_store_fails_cleanly(store_path: str) -> None:
    writer = mqcore.open(store_path, flush="os")
    try:
        writer.create_topic("live")
        writer.append("live", b"x")
        writer.flush()
        before = file_bytes(store_path)
        rc, out, err = run_cli("produce", store_path, "live", "--value", "y")
        assert rc == 1 and out == ""
        assert err.startswith("mqcore: error: ") and err.count("\n") == 1
        assert "is open for writing by another process" in err
        assert file_bytes(store_path) == before
        assert writer.append("live", b"z").offset == 1  # the writer goes on
    finally:
        writer.close()


def test_produce_creates_nothing_unless_asked(
    store_path: str, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", store_path, "t", "--value", "v"]) == 1
    assert "(pass --create to make it)" in capfd.readouterr().err
    assert not os.path.exists(store_path)
    with mqcore.open(store_path) as s:
        s.create_topic("other")
    before = file_bytes(store_path)
    assert main(["produce", store_path, "t", "--value", "v"]) == 1
    err = capfd.readouterr().err
    assert "topic 't' does not exist" in err and "--create" in err
    assert file_bytes(store_path) == before
    os.mkdir(os.path.join(store_path, "..", "plain"))
    assert main(["produce", os.path.join(store_path, "..", "plain"), "t", "--value", "v"]) == 1
    assert os.listdir(os.path.join(store_path, "..", "plain")) == []  # not made into a store
    assert main(["produce", store_path, "other", "--partitions", "2", "--value", "v"]) == 1
    assert "exists with 1 partitions, not 2" in capfd.readouterr().err
    assert main(["produce", store_path, "other", "-p", "5", "--value", "v"]) == 1
    assert "--partition 5 is outside 0..0 of topic 'other'" in capfd.readouterr().err
    assert main(["produce", store_path, "other", "-K", "", "--value", "v"]) == 2
    assert "--key-separator must not be empty" in capfd.readouterr().err
    with mqcore.open(store_path, read_only=True) as s:
        assert s.topics() == ["other"] and s.end_offset("other") == 0  # nothing was written


# -- get ------------------------------------------------------------------------------------------


def test_get_prints_one_message_in_full(events: str) -> None:
    msg = first_with(events, lambda m: m.key == b"main")
    args = ("get", events, TOPIC, str(msg.partition), str(msg.offset))
    rc, out, err = run_cli(*args)
    assert rc == 0 and err == ""
    fields = dict(line.split(":", 1) for line in out.splitlines() if not line.startswith("  "))
    fields = {k: v.strip() for k, v in fields.items()}
    assert fields["offset"] == str(msg.offset)
    assert fields["timestamp"] == f"{shown_time(msg.timestamp)} CreateTime"
    assert (fields["msg_id"], fields["unique_id"]) == (msg.msg_id, msg.unique_id)
    assert (fields["tag"], fields["key"], fields["value"]) == ("red", "main", "vip \\xff\\xfe")
    assert f"  uid: {msg.unique_id}" in out.splitlines()  # the binary uid header as its UUID
    assert "  keys: vip gold" in out.splitlines()

    rc, out, _ = run_cli(*args, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["type"] == "message" and doc["timestamp_type"] == "CreateTime"
    assert doc["headers"] == [[k, as_json(v)] for k, v in msg.headers]


def test_get_of_a_missing_offset_exits_1(events: str) -> None:
    with mqcore.open(events, read_only=True) as s:
        end = s.end_offset(TOPIC, 1)
    rc, out, err = run_cli("get", events, TOPIC, "1", str(end))
    assert rc == 1 and out == ""
    assert err == f"mqcore: error: no message at offset {end} of {TOPIC}-1 (its offsets are " \
        f"0..{end - 1})\n"  # fmt: skip
