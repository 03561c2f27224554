"""`mqcore query` as a new user met it with real logs (issue 32), through the real command: a
time window comes back in time order across partitions and resumes by its cursor, --key
combines with --where/--contains/--tag, and a double-quoted SQL92 string says how to quote."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_cli

import mqcore

T0 = 1_718_013_600_000  # 2024-06-10T10:00:00Z
TOPIC = "access"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three partitions of access-log lines, one clock (a line every 100 ms, spread over the
    partitions by client), several lines per timestamp."""
    path = str(tmp_path_factory.mktemp("cli_round_two") / "store")
    with mqcore.open(path) as s:
        s.create_topic(TOPIC, partitions=3)
        for i in range(600):
            client = b"10.0.0.%d" % (i % 7)
            status = "500" if i % 11 == 0 else "200"
            s.append(TOPIC, b'%s "GET /item/%d" %s' % (client, i, status.encode()),
                     key=client, partition=i % 7 % 3, timestamp=T0 + (i // 3) * 100,
                     properties={"status": status})  # fmt: skip
    return path


def everything(path: str) -> list[mqcore.Message]:
    with mqcore.open(path, read_only=True) as s:
        return [m for p in range(3) for m in s.read(TOPIC, p, 0, 1 << 20)]


def places(out: str) -> list[tuple[int, int]]:
    docs = [json.loads(line) for line in out.splitlines()]
    return [(d["partition"], d["offset"]) for d in docs if d.get("type") != "summary"]


def by_time(msgs: list[mqcore.Message]) -> list[tuple[int, int]]:
    return [(m.partition, m.offset)
            for m in sorted(msgs, key=lambda m: (m.timestamp, m.partition, m.offset))]  # fmt: skip


def test_a_time_window_prints_in_time_order_and_resumes_by_its_cursor(logs: str) -> None:
    """--from/--to: merged by timestamp across partitions (they came partition by partition);
    the completion line's cursor resumes the rest without --order; --order partition keeps
    the old order."""
    window = ["--from", "2024-06-10T10:00:02Z", "--to", "2024-06-10T10:00:07Z"]
    msgs = [m for m in everything(logs) if T0 + 2000 <= m.timestamp < T0 + 7000]
    rc, out, err = run_cli("query", logs, TOPIC, *window, "--limit", "40", "--json")
    assert rc == 0 and err == ""
    *_, summary = out.splitlines()
    cursor = json.loads(summary)["cursor"]
    assert places(out) == by_time(msgs)[:40] and cursor.startswith("t1-")
    rc, rest, err = run_cli("query", logs, TOPIC, *window, "--cursor", cursor, "--json")
    assert rc == 0 and places(out) + places(rest) == by_time(msgs)
    rc, text, err = run_cli("query", logs, TOPIC, *window, "--limit", "40")
    shown = [tuple(map(int, line.split("\t")[1:3])) for line in text.splitlines()]
    assert shown == by_time(msgs)[:40]
    assert re.search(r"resume with --cursor t1-\S+$", err.strip())
    rc, out, _ = run_cli("query", logs, TOPIC, *window, "--order", "partition", "--json")
    assert places(out) == sorted((m.partition, m.offset) for m in msgs)


def test_key_combines_with_where_contains_and_tag(logs: str) -> None:
    """--key with --where and --contains: the key's messages that pass both, equal to brute
    force, in partition order, and in time order with a window."""
    msgs = everything(logs)

    def wanted(m: mqcore.Message) -> bool:
        return m.key == b"10.0.0.4" and m.properties["status"] == "500" and b"GET" in m.value

    argv = ["--key", "10.0.0.4", "--where", "status = '500'", "--contains", "GET", "--json"]
    rc, out, err = run_cli("query", logs, TOPIC, *argv)
    assert rc == 0 and err == ""
    assert places(out) == [(m.partition, m.offset) for m in msgs if wanted(m)] != []
    rc, out, _ = run_cli("query", logs, TOPIC, *argv, "--from", str(T0 + 3000))
    assert places(out) == by_time([m for m in msgs if wanted(m) and m.timestamp >= T0 + 3000])


def test_a_double_quoted_selector_string_says_to_use_single_quotes(logs: str) -> None:
    rc, out, err = run_cli("query", logs, TOPIC, "--where", 'status = "500"')
    assert rc == 1 and out == ""
    assert err.splitlines() == [
        "mqcore: error: unexpected character '\"': SQL92 strings are single-quoted: write '500' "
        "at column 10 of selector 'status = \"500\"'"
    ]
