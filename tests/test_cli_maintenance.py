"""`mqcore compact` and `mqcore retention`: summaries on stdout, --json, the progress bar on
stderr, and errors as one line."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_cli

import mqcore
from mqcore.cli import main

T0 = 1_700_000_000_000
DAY = 86_400_000


@pytest.fixture
def populated(store_path: str) -> str:
    with mqcore.open(store_path, flush="os") as s:
        s.create_topic(
            "table", segment_bytes=400, key_index_entries=64, cleanup_policy="compact,delete"
        )
        s.create_topic("events", segment_bytes=400, key_index_entries=64, retention_ms=DAY)
        for i in range(50):
            s.append("table", b"v%d" % i, key=b"k%d" % (i % 4), timestamp=T0 + i)
            s.append("events", b"e%d" % i, timestamp=T0 + i)
    return store_path


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capfd.readouterr()
    return rc, out, err


def test_compact_text_summary(populated: str, capfd: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capfd, "compact", populated, "table", "--no-progress")
    assert rc == 0, err
    assert out.startswith("compacted table: ")
    assert "sealed segments rewritten" in out and "records removed" in out
    assert err == ""
    with mqcore.open(populated, read_only=True) as s:
        keys = [m.key for m in s.read("table", 0, 0, 1000)]
    assert len(keys) < 50


def test_compact_json(populated: str) -> None:
    rc, out, err = run_cli("compact", populated, "table", "--json", "--now", str(T0 + 10))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["type"] == "compaction" and doc["topic"] == "table"
    assert doc["records_removed"] > 0
    assert doc["cleaned_segments"][0] == "table-0/00000000000000000000.log"
    assert doc["bytes_after"] < doc["bytes_before"]


def test_compact_progress_bar_on_stderr(populated: str) -> None:
    rc, out, err = run_cli("compact", populated, "table", "--progress")
    assert rc == 0, err
    assert "compact table [" in err and "segments" in err
    assert "compact table [" not in out


def test_compact_refuses_a_delete_topic(populated: str) -> None:
    rc, out, err = run_cli("compact", populated, "events")
    assert rc == 1 and out == ""
    assert err.startswith("mqcore: error: topic 'events' has cleanup_policy='delete'")


def test_compact_unknown_topic(populated: str) -> None:
    rc, _, err = run_cli("compact", populated, "nope")
    assert rc == 1 and "does not exist" in err


def test_retention_text_and_start_offsets(
    populated: str, capfd: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = run(capfd, "retention", populated, "--now", str(T0 + DAY + 20))
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("deleted ") and "segment" in lines[0]
    assert any(line.strip().startswith("events-0/") for line in lines)
    start = [line for line in lines if line.startswith("events-0: log start offset ")]
    with mqcore.open(populated, read_only=True) as s:
        assert start == [f"events-0: log start offset {s.start_offset('events')}"]
        assert s.start_offset("events") > 0
        assert s.start_offset("table") == 0  # retention_ms of a week: nothing expired there


def test_retention_json_one_topic(populated: str) -> None:
    rc, out, err = run_cli("retention", populated, "events", "--json", "--now", "2100-01-01")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["type"] == "retention"
    assert doc["start_offsets"] == [{"topic": "events", "partition": 0, "start_offset": 50}]
    assert doc["deleted_bytes"] > 0
    names = os.listdir(os.path.join(populated, "events-0"))
    assert sorted(n for n in names if n.endswith(".log")) == [f"{50:020d}.log"]


def test_retention_progress_bar(populated: str) -> None:
    rc, out, err = run_cli("retention", populated, "--progress", "--now", str(T0))
    assert rc == 0, err
    assert "retention [" in err and "segments" in err
    assert out.startswith("deleted 0 segments")


def test_retention_bad_time_is_one_line(populated: str) -> None:
    rc, _, err = run_cli("retention", populated, "--now", "yesterday-ish")
    assert rc == 1
    assert err.startswith("mqcore: error: --now 'yesterday-ish'") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "method"),
    [(["compact", "{}", "table"], "store.compact(topic)"),
     (["retention", "{}"], "store.apply_retention()")],
)  # fmt: skip
def test_maintenance_beside_a_writer_says_what_to_do_instead(
    populated: str, argv: list[str], method: str
) -> None:
    """Issue 17.2: the refusal said to open with read_only=True, which cannot compact or delete
    anything (ReadOnlyStoreError). It now says to stop the writer or call the method in it."""
    with mqcore.open(populated, flush="os") as writer:
        rc, out, err = run_cli(*[populated if a == "{}" else a for a in argv])
        assert rc == 1 and out == "" and err.count("\n") == 1
        assert err.startswith(f"mqcore: error: {argv[0]} needs the writer lock")
        assert "stop that writer first" in err and method in err and "read_only" not in err
        assert writer.end_offset("events", 0) == 50  # the writer was not disturbed
