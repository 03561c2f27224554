"""`mqcore produce` on real input (issue 17): the bad-line rules of files and streams, topic
settings (`--config`, `mqcore config`, Store.alter_topic_config), and timestamps, keys, tags,
properties and headers taken from each line, checked against an independent parse."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import child_env, file_bytes, run_cli

import mqcore
from mqcore.errors import InternalTopicError, InvalidConfigError, RecordTooLargeError

BIG = 5_000_000  # a line over the default max_message_bytes (1,048,588)
DEFAULT_LIMIT = "max_message_bytes=1,048,588"
UTC = timezone.utc


def lines_of(n: int, prefix: str = "line") -> list[bytes]:
    return [f"{prefix} {i}".encode() for i in range(n)]


def write_lines(path: Path, lines: list[bytes]) -> str:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def stored(store_path: str, topic: str) -> dict[int, list[mqcore.Message]]:
    """Every message of `topic`, per partition, in offset order (read-only open)."""
    out: dict[int, list[mqcore.Message]] = {}
    if not os.path.isdir(store_path):  # a run that wrote nothing removes the store it made
        return out
    with mqcore.open(store_path, read_only=True) as s:
        if topic not in s.topics():
            return {}
        for p in range(s.partitions(topic)):
            msgs: list[mqcore.Message] = []
            while True:
                batch = s.read(topic, p, len(msgs), 10_000)
                if not batch:
                    break
                msgs += batch
            out[p] = msgs
    return out


def all_values(store_path: str, topic: str) -> list[bytes]:
    return [m.value or b"" for ms in stored(store_path, topic).values() for m in ms]


# -- item 1: a line over max_message_bytes -------------------------------------------------------


@pytest.mark.parametrize("big_at", [1500, 500])
def test_file_with_an_oversized_line_writes_nothing_and_names_it(
    tmp_path: Path, store_path: str, big_at: int
) -> None:
    """The issue's mixed.txt (1,500 short lines, one 5 MB line, 10 more) and the same with the
    big line among the first 1,000: nothing is written, the line is named with its size, the
    limit and the fix; the old code wrote the first 1,000 lines (or dropped valid ones)."""
    lines = lines_of(1510)
    lines.insert(big_at, b"x" * BIG)
    path = write_lines(tmp_path / "mixed.txt", lines)
    rc, out, err = run_cli("produce", store_path, "t", "--create", "--file", path)
    assert rc == 1
    assert out == ""
    assert f"line {big_at + 1} is 5,000,000 bytes (" in err
    assert DEFAULT_LIMIT in err
    assert "1 of 1,511 lines is bad" in err and "nothing was written" in err
    assert "--config max_message_bytes=" in err
    assert stored(store_path, "t") == {}  # not even the topic was created
    # the fix the error names works, and every line arrives, in order
    size = int(re.search(r"--config max_message_bytes=(\d+)", err).group(1))
    assert size > BIG
    rc, out, err = run_cli(
        "produce", store_path, "t", "--file", path, "--config", f"max_message_bytes={size}"
    )
    assert rc == 0, err
    assert len(out.splitlines()) == len(lines)
    assert all_values(store_path, "t") == lines


def test_file_counts_every_bad_line_and_suggests_the_largest(
    tmp_path: Path, store_path: str
) -> None:
    lines = lines_of(100)
    lines[10] = b"y" * 3000
    lines[50] = b"z" * 5000
    path = write_lines(tmp_path / "in.txt", lines)
    rc, _, _ = run_cli("produce", store_path, "t", "--create", "--value", "x")
    assert rc == 0
    rc, out, err = run_cli("config", store_path, "t", "max_message_bytes=2000")
    assert rc == 0, err
    rc, out, err = run_cli("produce", store_path, "t", "--file", path)
    assert rc == 1 and out == ""
    assert "line 11 is 3,000 bytes" in err and "2 of 100 lines are bad" in err
    fix = re.search(rf"`mqcore config {re.escape(store_path)} t max_message_bytes=(\d+)`", err)
    assert fix is not None and int(fix.group(1)) > 5000
    assert all_values(store_path, "t") == [b"x"]
    rc, _, err = run_cli("config", store_path, "t", f"max_message_bytes={fix.group(1)}")
    assert rc == 0, err
    rc, out, err = run_cli("produce", store_path, "t", "--file", path)
    assert rc == 0, err
    assert all_values(store_path, "t") == [b"x", *lines]


@pytest.mark.parametrize("big_at", [499, 1500])
def test_stream_writes_up_to_the_bad_line_and_says_what(store_path: str, big_at: int) -> None:
    """From stdin: every line before the bad one is written (none dropped from its batch),
    nothing from it on, and the error names the lines and offsets written."""
    lines = lines_of(1510)
    lines.insert(big_at, b"x" * BIG)
    stdin = b"".join(line + b"\n" for line in lines)
    rc, out, err = run_cli("produce", store_path, "t", "--create", stdin=stdin)
    assert rc == 1
    assert len(out.splitlines()) == big_at
    assert all_values(store_path, "t") == lines[:big_at]
    assert (
        f"wrote lines 1-{big_at} (partition 0 offsets 0-{big_at - 1}), line {big_at + 1} is "
        "5,000,000 bytes (" in err
    )
    assert DEFAULT_LIMIT in err and "nothing after it was written" in err
    assert f"`mqcore config {store_path} t max_message_bytes=" in err


def test_stream_names_the_offsets_of_every_partition(store_path: str) -> None:
    lines = [b"k%d value %d" % (i % 7, i) for i in range(300)]
    lines.insert(200, b"k1 " + b"x" * BIG)
    stdin = b"".join(line + b"\n" for line in lines)
    rc, out, err = run_cli(
        "produce", store_path, "t", "--create", "--partitions", "3", "-K", " ", stdin=stdin
    )
    assert rc == 1
    parts = stored(store_path, "t")
    written = sorted(m.key + b" " + (m.value or b"") for ms in parts.values() for m in ms)
    assert written == sorted(lines[:200])
    spans = ", ".join(
        f"partition {p} offsets 0-{len(ms) - 1}" for p, ms in sorted(parts.items()) if ms
    )
    assert f"wrote lines 1-200 ({spans}), line 201 is " in err


def test_stream_bad_first_line_writes_nothing(store_path: str) -> None:
    rc, out, err = run_cli("produce", store_path, "t", "--create", stdin=b"x" * BIG + b"\nok\n")
    assert rc == 1 and out == ""
    assert "wrote nothing, line 1 is 5,000,000 bytes" in err
    assert all_values(store_path, "t") == []


def test_a_batch_of_lines_over_the_limit_together_is_split_not_refused(
    tmp_path: Path, store_path: str
) -> None:
    lines = [b"%04d" % i + b"v" * 900 for i in range(50)]  # 45 KB together, 2 KB limit
    path = write_lines(tmp_path / "in.txt", lines)
    rc, out, err = run_cli(
        "produce", store_path, "t", "--file", path, "--config", "max_message_bytes=2000"
    )
    assert rc == 0, err
    assert all_values(store_path, "t") == lines


def test_values_are_checked_whole(store_path: str) -> None:
    rc, out, err = run_cli(
        "produce", store_path, "t", "--create", "--config", "max_message_bytes=200",
        "--value", "a", "--value", "b" * 300, "--value", "c",
    )  # fmt: skip
    assert rc == 1 and out == ""
    assert "value 2 is 300 bytes" in err and "nothing was written" in err
    assert all_values(store_path, "t") == []


# -- item 2: topic settings ---------------------------------------------------------------------


def test_create_with_config_sets_every_kind_of_setting(store_path: str) -> None:
    rc, _, err = run_cli(
        "produce", store_path, "t", "--value", "v", "--key", "k",
        "--config", "max_message_bytes=8388608", "--config", "unique_ids=false",
        "--config", "min_cleanable_dirty_ratio=0.25", "--config", "cleanup_policy=compact",
    )  # fmt: skip
    assert rc == 0, err
    with mqcore.open(store_path, read_only=True) as s:
        cfg = s.topic_config("t")
    assert (cfg.max_message_bytes, cfg.unique_ids) == (8388608, False)
    assert (cfg.min_cleanable_dirty_ratio, cfg.cleanup_policy) == (0.25, "compact")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("nope=1", "unknown topic setting 'nope'"),
        ("max_message_bytes=lots", "max_message_bytes='lots' is not an integer"),
        ("max_message_bytes=10", "max_message_bytes=10 is outside"),
        ("unique_ids=maybe", "unique_ids='maybe' is not true or false"),
        ("compression=brotli", "compression='brotli'"),
        ("max_message_bytes", "is not NAME=VALUE"),
    ],
)
def test_bad_settings_are_refused_by_name(store_path: str, setting: str, message: str) -> None:
    rc, _, err = run_cli("produce", store_path, "t", "--value", "v", "--config", setting)
    assert rc == 1 and message in err, err
    assert not os.path.exists(store_path)
    rc, _, _ = run_cli("produce", store_path, "t", "--create", "--value", "v")
    assert rc == 0
    rc, _, err = run_cli("config", store_path, "t", setting)
    assert rc == 1 and message in err, err


def test_config_on_an_existing_topic_must_match(store_path: str) -> None:
    assert run_cli("produce", store_path, "t", "--create", "--value", "v")[0] == 0
    rc, _, err = run_cli(
        "produce", store_path, "t", "--value", "w", "--config", "max_message_bytes=5000"
    )
    assert rc == 1
    assert "exists with max_message_bytes=1048588" in err
    assert f"mqcore config {store_path} t max_message_bytes=5000" in err
    assert all_values(store_path, "t") == [b"v"]


def test_config_prints_and_changes_settings(store_path: str) -> None:
    assert run_cli("produce", store_path, "t", "--create", "--value", "v")[0] == 0
    rc, out, err = run_cli("config", store_path, "t")
    assert rc == 0, err
    shown = dict(line.split("=", 1) for line in out.splitlines())
    assert shown["max_message_bytes"] == "1048588" and shown["unique_ids"] == "true"
    rc, out, err = run_cli(
        "config", store_path, "t", "retention_ms=-1", "message_timestamp_before_max_ms=0",
        "--json",
    )  # fmt: skip
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["config"]["retention_ms"] == -1
    with mqcore.open(store_path, read_only=True) as s:
        cfg = s.topic_config("t")
    assert (cfg.retention_ms, cfg.message_timestamp_before_max_ms) == (-1, 0)
    assert doc["config"] == cfg.to_json()


@pytest.mark.parametrize(
    "setting", ["partitions=2", "segment_bytes=100000", "key_index=false", "key_index_entries=64"]
)
def test_config_refuses_settings_fixed_at_creation(store_path: str, setting: str) -> None:
    assert run_cli("produce", store_path, "t", "--create", "--value", "v")[0] == 0
    rc, _, err = run_cli("config", store_path, "t", setting)
    assert rc == 1
    assert f"{setting.split('=')[0]} cannot change on an existing topic" in err


def test_config_reads_beside_a_writer_and_changes_need_the_lock(store_path: str) -> None:
    with mqcore.open(store_path) as s:
        s.create_topic("t", max_message_bytes=5000)
        rc, out, err = run_cli("config", store_path, "t")
        assert rc == 0, err
        assert "max_message_bytes=5000\n" in out
        rc, _, err = run_cli("config", store_path, "t", "max_message_bytes=6000")
        assert rc == 1
        assert "open for writing by another process" in err
        assert "Store.alter_topic_config" in err
        assert s.topic_config("t").max_message_bytes == 5000


def test_alter_topic_config_applies_to_the_open_store_and_persists(store_path: str) -> None:
    with mqcore.open(store_path) as s:
        s.create_topic("t", max_message_bytes=1000)
        with pytest.raises(RecordTooLargeError):
            s.append("t", b"x" * 2000)
        new = s.alter_topic_config("t", max_message_bytes=4000, retention_ms=-1)
        assert new.max_message_bytes == 4000 and s.topic_config("t") == new
        s.append("t", b"x" * 2000)
        with pytest.raises(InvalidConfigError, match="partitions cannot change"):
            s.alter_topic_config("t", partitions=3)
        with pytest.raises(InvalidConfigError, match="unknown topic config: nope"):
            s.alter_topic_config("t", nope=1)
        with pytest.raises(InvalidConfigError, match="max_message_bytes=1 is outside"):
            s.alter_topic_config("t", max_message_bytes=1)
        with pytest.raises(InternalTopicError):
            s.alter_topic_config("__consumer_offsets", retention_ms=1)
    with mqcore.open(store_path, read_only=True) as s:
        cfg = s.topic_config("t")
        assert (cfg.max_message_bytes, cfg.retention_ms) == (4000, -1)
        assert [len(m.value or b"") for m in s.read("t")] == [2000]


# -- item 3: timestamps, keys, tags, properties, headers from each line -------------------------

NGINX_FORMAT = "%d/%b/%Y:%H:%M:%S %z"
MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
DAY = datetime(2024, 5, 1, tzinfo=UTC)
T10 = DAY.replace(hour=10)


def nginx_lines(n: int, seed: int) -> list[tuple[bytes, int]]:
    """(an nginx combined-log line, its time in ms), times spread over 09:40-10:20 UTC and
    written in several zones."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ms = int((T10 - timedelta(minutes=20)).timestamp() * 1000) + rng.randrange(2400) * 1000
        zone = timezone(timedelta(minutes=rng.choice([-420, 0, 120, 330])))
        local = datetime.fromtimestamp(ms / 1000, zone)
        off = local.utcoffset() or timedelta()
        sign = "-" if off < timedelta() else "+"
        minutes = abs(off) // timedelta(minutes=1)
        hhmm = f"{minutes // 60:02d}{minutes % 60:02d}"
        stamp = (
            f"{local.day:02d}/{MONTHS[local.month - 1]}/{local.year}:"
            f"{local.hour:02d}:{local.minute:02d}:{local.second:02d} {sign}{hhmm}"
        )
        line = (
            f'10.0.{i % 7}.{i % 250} - - [{stamp}] "GET /item/{i} HTTP/1.1" '
            f'{rng.choice([200, 404, 500])} {rng.randrange(9999)} "-" "curl/8.0"'
        )
        out.append((line.encode(), ms))
    return out


def window(msgs: list[mqcore.Message], lo: int, hi: int) -> list[bytes]:
    return sorted(m.value or b"" for m in msgs if lo <= m.timestamp < hi)


def test_nginx_lines_keep_their_time_and_answer_a_time_range(
    tmp_path: Path, store_path: str
) -> None:
    generated = nginx_lines(400, seed=17)
    path = write_lines(tmp_path / "access.log", [line for line, _ in generated])
    rc, out, err = run_cli(
        "produce", store_path, "nginx", "--create", "--partitions", "2", "--file", path,
        "--timestamp-format", NGINX_FORMAT,
    )  # fmt: skip
    assert rc == 0, err
    msgs = [m for ms in stored(store_path, "nginx").values() for m in ms]
    truth = dict(generated)
    assert sorted(m.value or b"" for m in msgs) == sorted(truth)
    for m in msgs:
        assert m.timestamp == truth[m.value or b""]
        # and an independent parse of the line's bracketed time agrees
        text = re.search(r"\[([^]]+)\]", (m.value or b"").decode()).group(1)
        assert m.timestamp == int(datetime.strptime(text, NGINX_FORMAT).timestamp() * 1000)
    lo = int(T10.timestamp() * 1000)
    hi = int((T10 + timedelta(minutes=5)).timestamp() * 1000)
    brute = sorted(line for line, ms in generated if lo <= ms < hi)
    assert brute  # the window is not empty
    with mqcore.open(store_path, read_only=True) as s:
        found = s.range("nginx", lo, hi, limit=10_000)
        assert found.complete
        assert sorted(m.value or b"" for m in found) == brute
        found = s.search("nginx", contains=" 500 ", start=lo, end=hi, limit=10_000)
        assert sorted(m.value or b"" for m in found) == [v for v in brute if b'" 500 ' in v]


def test_json_lines_fields_become_time_key_tag_and_properties(
    tmp_path: Path, store_path: str
) -> None:
    rng = random.Random(5)
    docs = []
    for i in range(300):
        ms = int(T10.timestamp() * 1000) + rng.randrange(-600_000, 600_000)
        form = i % 3
        if form == 0:
            ts: object = ms
        elif form == 1:
            ts = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
        else:
            zone = timezone(timedelta(hours=rng.choice([-5, 9])))
            ts = datetime.fromtimestamp(ms / 1000, zone).isoformat(timespec="milliseconds")
        doc = {
            "ts": ts,
            "user": f"u{rng.randrange(20)}",
            "level": rng.choice(["INFO", "WARN", "ERROR"]),
            "http": {"status": rng.choice([200, 503])},
            "n": i,
        }
        if i % 10 == 0:
            del doc["level"]  # a missing field: no property
        docs.append((json.dumps(doc).encode(), ms))
    path = write_lines(tmp_path / "app.jsonl", [line for line, _ in docs])
    rc, out, err = run_cli(
        "produce", store_path, "app", "--create", "--partitions", "3", "--file", path,
        "--timestamp-field", "ts", "--key-field", "user", "--tag-field", "level",
        "--property-field", "level", "--property-field", "status=http.status",
        "--property", "source=loader",
    )  # fmt: skip
    assert rc == 0, err
    msgs = [m for ms in stored(store_path, "app").values() for m in ms]
    assert len(msgs) == len(docs)
    truth = dict(docs)
    for m in msgs:
        doc = json.loads(m.value or b"")
        assert m.timestamp == truth[m.value or b""]
        assert m.key == doc["user"].encode()
        assert m.tag == doc.get("level")
        want = {"source": "loader", "status": str(doc["http"]["status"])}
        if "level" in doc:
            want["level"] = doc["level"]
        assert {k: v for k, v in m.properties.items() if k != "tag"} == want
    lo = int(T10.timestamp() * 1000)
    hi = int((T10 + timedelta(minutes=5)).timestamp() * 1000)
    with mqcore.open(store_path, read_only=True) as s:
        found = s.search("app", where="level = 'ERROR'", start=lo, end=hi, limit=10_000)
    brute = [
        line for line, ms in docs if lo <= ms < hi and json.loads(line).get("level") == "ERROR"
    ]
    assert brute and sorted(m.value or b"" for m in found) == sorted(brute)


def test_epoch_seconds_with_a_fraction(store_path: str) -> None:
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--timestamp-field", "t",
        "--timestamp-format", "s", "--value", '{"t": 1714557600.1239}', "--value",
        '{"t": "1714557601"}',
    )  # fmt: skip
    assert rc == 0, err
    assert [m.timestamp for m in stored(store_path, "t")[0]] == [1714557600123, 1714557601000]


def test_a_fraction_of_a_millisecond_is_a_bad_line(store_path: str) -> None:
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--timestamp-field", "t",
        "--value", '{"t": 1714557600000}', "--value", '{"t": 1714557600.5}',
    )  # fmt: skip
    assert rc == 1
    assert "value 2 timestamp: '1714557600.5' has a fraction of a millisecond" in err
    assert "--timestamp-format s" in err


def test_timestamp_regex_and_iso_at_the_start(tmp_path: Path, store_path: str) -> None:
    lines = [
        b"2024-05-01 10:00:00,250 INFO started",
        b"2024-05-01T12:00:00+02:00 WARN disk",
        b"2024-05-01T10:00:01.5Z ERROR boom",
    ]
    path = write_lines(tmp_path / "app.log", lines)
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--file", path, "--timestamp-format", "iso"
    )
    assert rc == 0, err
    base = int(T10.timestamp() * 1000)
    assert [m.timestamp for m in stored(store_path, "t")[0]] == [base + 250, base, base + 1500]
    stdin = b"ts=1714557600123 a\nx ts=1714557600999 b\nno time\n"
    rc, out, err = run_cli(
        "produce", store_path, "u", "--create", "--timestamp-regex", r"ts=(\d+)",
        "--timestamp-format", "ms", stdin=stdin,
    )  # fmt: skip
    assert rc == 1
    assert "line 3 has no match of --timestamp-regex 'ts=(\\d+)'" in err
    assert [m.timestamp for m in stored(store_path, "u")[0]] == [1714557600123, 1714557600999]


def test_a_bad_timestamp_is_named_under_both_rules(tmp_path: Path, store_path: str) -> None:
    lines = [json.dumps({"ts": "2024-05-01T10:00:00Z", "i": i}).encode() for i in range(20)]
    lines[12] = b'{"ts": "yesterday", "i": 12}'
    path = write_lines(tmp_path / "in.jsonl", lines)
    rc, out, err = run_cli(
        "produce", store_path, "t", "--create", "--file", path, "--timestamp-field", "ts"
    )
    assert rc == 1 and out == ""
    assert "line 13 timestamp: 'yesterday' is neither ISO-8601 nor milliseconds" in err
    assert "1 of 20 lines is bad" in err
    assert all_values(store_path, "t") == []
    stdin = b"".join(line + b"\n" for line in lines)
    rc, out, err = run_cli(
        "produce", store_path, "t", "--create", "--timestamp-field", "ts", stdin=stdin
    )
    assert rc == 1
    assert "wrote lines 1-12 (partition 0 offsets 0-11), line 13 timestamp:" in err
    assert all_values(store_path, "t") == lines[:12]


def test_not_json_and_missing_field_are_bad_lines(store_path: str) -> None:
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--timestamp-field", "ts",
        "--value", '{"ts": 1}', "--value", "plain", "--value", '{"x": 1}', "--value", "[1]",
    )  # fmt: skip
    assert rc == 1
    assert "value 2 is not JSON" in err and "3 of 4 values are bad" in err


def test_timestamps_the_topic_refuses_name_the_setting(store_path: str) -> None:
    future = "2999-01-01T00:00:00Z"
    rc, _, err = run_cli("produce", store_path, "t", "--create", "--timestamp", future,
                         "--value", "v")  # fmt: skip
    assert rc == 1
    assert "message_timestamp_after_max_ms=3600000" in err
    assert "--config message_timestamp_after_max_ms=N" in err
    # old logs load by default (before_max_ms is unbounded); a topic that bounds it says so
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--timestamp", "2001-01-01", "--value", "old",
        "--config", "message_timestamp_before_max_ms=86400000",
    )  # fmt: skip
    assert rc == 1 and "message_timestamp_before_max_ms=86400000" in err
    rc, _, err = run_cli("produce", store_path, "t", "--create", "--timestamp", "2001-01-01",
                         "--value", "old", "--value", "older")  # fmt: skip
    assert rc == 0 and err == ""  # the topic produce created keeps them (retention_ms=-1)
    assert [m.timestamp for m in stored(store_path, "t")[0]] == [978307200000] * 2
    # a topic with time retention takes them with one warning: retention would delete them
    assert run_cli("config", store_path, "t", "retention_ms=604800000")[0] == 0
    rc, _, err = run_cli("produce", store_path, "t", "--timestamp", "2001-01-01",
                         "--value", "old", "--value", "older")  # fmt: skip
    assert rc == 0 and err.count("warning") == 1
    assert "value 1 is older than retention_ms=604800000" in err
    assert f"`mqcore config {store_path} t retention_ms=-1`" in err
    rc, _, err = run_cli("config", store_path, "t", "retention_ms=-1")
    assert rc == 0
    rc, _, err = run_cli("produce", store_path, "t", "--timestamp", "2001-01-01", "--value", "x")
    assert rc == 0 and err == ""


def test_log_append_time_topic_refuses_timestamps(store_path: str) -> None:
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--config", "timestamp_type=LogAppendTime",
        "--timestamp", "2024-05-01", "--value", "v",
    )  # fmt: skip
    assert rc == 1 and "timestamp_type=LogAppendTime" in err


def test_headers_before_a_delimiter_with_key_and_run_options(store_path: str) -> None:
    stdin = b"trace:abc,flag\tk1\tvalue one\n\tk2\tvalue two\nsrc:a:b\tk3\tthree\n"
    rc, _, err = run_cli(
        "produce", store_path, "t", "--create", "--headers-delimiter", "\t", "-K", "\t",
        "--tag", "imp", "--property", "run=7", "-H", "raw=r", "--keys", "w1 w2", stdin=stdin,
    )  # fmt: skip
    assert rc == 0, err
    msgs = stored(store_path, "t")[0]
    assert [(m.key, m.value) for m in msgs] == [
        (b"k1", b"value one"), (b"k2", b"value two"), (b"k3", b"three"),
    ]  # fmt: skip
    assert msgs[0].headers[:3] == (("raw", b"r"), ("trace", b"abc"), ("flag", None))
    assert msgs[1].headers[0] == ("raw", b"r") and msgs[1].headers[1][0] == "tag"
    assert msgs[2].header("src") == b"a:b"
    assert all(m.tag == "imp" and m.properties.get("run") == "7" for m in msgs)
    assert all(m.header("keys") == b"w1 w2" for m in msgs)
    rc, _, err = run_cli(
        "produce", store_path, "t", "--headers-delimiter", "|", stdin=b"a:1|x\nno delimiter\n"
    )
    assert rc == 1 and "line 2 has no headers delimiter '|'" in err


def test_help_documents_the_rules() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mqcore.cli", "produce", "--help"],
        env=child_env(), capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    text = " ".join(proc.stdout.decode().split())
    assert "nothing is written if one is bad" in text
    assert "mqcore config STORE TOPIC max_message_bytes=N" in text
    assert "--timestamp-format" in text and "%d/%b/%Y:%H:%M:%S %z" in text


@pytest.mark.parametrize(
    "fmt",
    [
        NGINX_FORMAT,
        "%Y-%m-%d %H:%M:%S.%f",
        "%d %B %Y %I:%M:%S %p",
        "%b %d %H:%M:%S",  # syslog: no year, as strptime reads it (1900)
        "%y/%m/%d %H:%M %z",
        "%Y-%m-%dT%H:%M:%S%z",
        "%a %d %b %Y %H:%M:%S",  # a weekday name: read by strptime itself
    ],
)
def test_times_found_in_lines_agree_with_strptime(fmt: str) -> None:
    """The per-line time finder (its own reading of common directives, strptime for the rest)
    against datetime.strptime on the same text, over random times and zones."""
    from mqcore.cli.timestamps import line_finder

    find = line_finder(fmt)
    rng = random.Random(fmt)
    for _ in range(300):
        zone = timezone(timedelta(minutes=rng.randrange(-14 * 60, 14 * 60 + 1, 15)))
        dt = datetime(1971, 1, 1, tzinfo=UTC) + timedelta(
            seconds=rng.randrange(60 * 365 * 86400), microseconds=rng.randrange(10**6)
        )
        text = dt.astimezone(zone).strftime(fmt)
        try:
            want = datetime.strptime(text, fmt)
        except ValueError:  # Feb 29 without a year (1900): both refuse it
            with pytest.raises(ValueError):
                find(f"host x [{text}] GET /")
            continue
        if want.tzinfo is None:
            want = want.replace(tzinfo=UTC)
        delta = want - datetime(1970, 1, 1, tzinfo=UTC)
        ms = delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000
        if ms < 0:
            continue  # before 1970 (a syslog time in 1900): refused, checked below
        assert find(f"host x [{text}] GET /") == ms, text
    with pytest.raises(ValueError, match="before 1970"):
        line_finder("%b %d %H:%M:%S")("Oct 11 22:14:15 host sshd")


def test_config_of_a_missing_topic_writes_nothing(tmp_path: Path, store_path: str) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    rc, _, err = run_cli("config", str(plain), "t", "retention_ms=1")
    assert rc == 1 and "not an mqcore store" in err
    assert list(plain.iterdir()) == []
    assert run_cli("produce", store_path, "t", "--create", "--value", "v")[0] == 0
    before = file_bytes(store_path)
    rc, _, err = run_cli("config", store_path, "u", "retention_ms=1")
    assert rc == 1 and "topic 'u' does not exist" in err
    assert file_bytes(store_path) == before
