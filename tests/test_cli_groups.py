"""`mqcore groups` (issue 17.3): committed offsets and lag per partition, read from another
process beside the running writer, against the writer's own Consumer.lag() and committed()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import child_env, run_cli

import mqcore
from tests.test_cli_not_a_store import listing

WRITER = os.path.join(os.path.dirname(__file__), "groups_writer.py")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """A writer process holding the store open, and what its consumers reported."""
    path = str(tmp_path / "store")
    proc = subprocess.Popen(
        [sys.executable, WRITER, path], env=child_env(), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the writer died before reporting"
        yield path, json.loads(line)
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        rc = proc.wait(timeout=60)
        proc.stdout.close()
        assert rc == 0


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.splitlines()]


def test_groups_beside_a_writer_agree_with_its_consumers(
    live: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    path, report = live
    before = listing(tmp_path)
    for group, own in report.items():
        rc, out, err = run_cli("groups", path, group, "--json")
        assert rc == 0, err
        rows = _lines(out)
        parts = {f"{r['topic']}-{r['partition']}": r for r in rows if r["type"] == "partition"}
        assert {k: r["lag"] for k, r in parts.items()} == own["lag"]
        assert {k: r["committed"] for k, r in parts.items()} == own["committed"]
        (summary,) = [r for r in rows if r["type"] == "group"]
        assert summary["members"] is None
        assert summary["lag"] + summary["retry_lag"] == sum(own["lag"].values())
    assert any(k.startswith("__retry.billing-") for k in report["billing"]["lag"])
    assert sum(report["auditor"]["lag"].values()) > 0  # the late appends
    rc, out, err = run_cli("groups", path, "--json")
    assert rc == 0, err
    summaries = {r["group"]: r for r in _lines(out)}
    assert set(summaries) == {"billing", "auditor"}
    assert summaries["auditor"]["dead_letters"] == 1 and summaries["billing"]["dead_letters"] == 0
    assert summaries["auditor"]["topics"] == ["audit", "orders"]
    assert summaries["billing"]["retry_lag"] == sum(
        v for k, v in report["billing"]["lag"].items() if k.startswith("__retry.")
    )
    rc, out, err = run_cli("groups", path)
    assert rc == 0, err
    assert out.splitlines()[0].split() == [
        "GROUP", "TOPICS", "PARTITIONS", "LAG", "RETRY", "DLQ", "LAST", "COMMIT",
    ]  # fmt: skip
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["auditor", "billing"]
    rc, out, err = run_cli("groups", path, "billing")
    assert rc == 0, err
    body = [line.split() for line in out.splitlines()[1:]]
    assert {f"{c[0]}-{c[1]}": int(c[4]) for c in body} == report["billing"]["lag"]
    assert listing(tmp_path) == before  # reading changed nothing, the writer wrote nothing


def test_unknown_group_and_a_store_without_groups(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t")
        s.append("t", b"x")
        assert s.group_lag() == {}
    rc, out, err = run_cli("groups", path, "--json")
    assert (rc, out) == (0, "")
    rc, out, err = run_cli("groups", path, "nobody")
    assert rc == 1 and out == "" and "no consumer group 'nobody'" in err
    assert len(err.splitlines()) == 1


def test_group_lag_in_the_writer_follows_commits(tmp_path: Path) -> None:
    """In the writer's process group_lag() sees commits made after the open; a read-only
    store sees what was committed when it opened."""
    path = str(tmp_path / "s")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t", partitions=2)
        s.append_batch("t", [b"a", b"b", b"c"], partition=0)
        c = s.consumer("g", "t")
        c.poll(max_records=2)
        c.commit()
        with mqcore.open(path, read_only=True) as r:
            seen = {(x.topic, x.partition): x.lag for x in r.group_lag("g")["g"]}
        assert seen == {(t, p): lag for (t, p), lag in c.lag().items()}
        c.poll()
        c.commit()
        now = {(x.topic, x.partition): (x.committed, x.lag) for x in s.group_lag()["g"]}
        assert now == {("t", 0): (3, 0), ("t", 1): (0, 0)}
        c.close()


def test_share_groups_are_listed_from_their_state(tmp_path: Path) -> None:
    """A share group that accepted 4 of 10 records and held 3 more when its writer closed:
    start 4, end 7, the 3 held ones back to available with the 3 never delivered."""
    path = str(tmp_path / "s")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("jobs")
        s.append_batch("jobs", [b"j%d" % i for i in range(10)])
        sc = s.share_consumer("workers", "jobs", explicit_ack=True)
        for m in sc.poll(4):
            sc.acknowledge(m)
        sc.commit()
        assert len(sc.poll(3)) == 3  # held when the store closes: no lock outlives it
    rc, out, err = run_cli("groups", path, "--json")
    assert rc == 0, err
    assert _lines(out) == [
        {"type": "share_group", "group": "workers", "topics": ["jobs"], "partitions": 1,
         "available": 6, "in_flight": 0},
    ]  # fmt: skip
    rc, out, err = run_cli("groups", path, "workers", "--json")
    assert rc == 0, err
    (part, _summary) = _lines(out)
    assert (part["start"], part["end"], part["log_end"], part["available"]) == (4, 7, 10, 6)
    rc, out, err = run_cli("groups", path)
    assert rc == 0, err
    assert out.splitlines()[0].split()[:2] == ["SHARE", "GROUP"]
    assert out.splitlines()[1].split() == ["workers", "jobs", "1", "6", "0"]
    rc, out, err = run_cli("groups", path, "workers")
    assert rc == 0, err
    assert out.splitlines()[1].split() == ["workers", "jobs", "0", "4", "7", "10", "6", "0"]
