"""`mqcore trace STORE UNIQUE_ID`: a message's recorded events as a table or JSON lines."""

from __future__ import annotations

import json

from conftest import run_cli

import mqcore
from mqcore.clock import now_ms

QUIET = {"flush": "os", "transaction_check_interval_ms": 0, "delay_tick_ms": 0}


def make_store(path: str) -> tuple[str, str]:
    """A traced store with a committed transactional message and a delivered delayed one."""
    with mqcore.open(path, trace=True, **QUIET) as store:
        store.create_topic("t")
        with store.begin("tx-1") as txn:
            half = txn.append("t", b"v")
        at = now_ms() + 60_000
        delayed = store.append("t", b"w", deliver_at=at)
        store.deliver_due(now=at)
    assert half.unique_id is not None and delayed.unique_id is not None
    return half.unique_id, delayed.unique_id


def test_table_lists_events_oldest_first(store_path):
    half, delayed = make_store(store_path)
    code, out, err = run_cli("trace", store_path, half)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["TIME", "EVENT", "TOPIC", "PARTITION", "OFFSET", "GROUP",
                                "DETAIL"]  # fmt: skip
    assert [line.split()[1] for line in lines[1:]] == ["half_appended", "appended",
                                                       "txn_committed"]  # fmt: skip
    assert '"transaction_id":"tx-1"' in lines[1]
    code, out, _ = run_cli("trace", store_path, delayed.replace("-", "").upper())
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()[1:]] == [
        "delayed", "appended", "delay_delivered"]  # fmt: skip


def test_json_lines(store_path):
    _half, delayed = make_store(store_path)
    code, out, _ = run_cli("trace", store_path, delayed, "--json")
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["event"] for e in events] == ["delayed", "appended", "delay_delivered"]
    assert events[0]["topic"] == "__delay" and events[-1]["topic"] == "t"
    assert all(e["unique_id"] == delayed for e in events)
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)


def test_nothing_recorded_exits_1(store_path):
    make_store(store_path)
    code, out, err = run_cli("trace", store_path, "0190e3a0-0000-7000-8000-000000000000")
    assert (code, out) == (1, "")
    assert "no trace events" in err
    with mqcore.open(store_path + "2", **QUIET) as store:  # tracing off: nothing is recorded
        store.create_topic("t")
        uid = store.append("t", b"v").unique_id
    assert uid is not None
    assert run_cli("trace", store_path + "2", uid)[0] == 1


def test_bad_arguments(store_path):
    make_store(store_path)
    code, _out, err = run_cli("trace", store_path, "m1-AAB0")
    assert code == 1 and "store ID" in err
    code, _out, err = run_cli("trace", store_path)
    assert code == 2 and "unique_id" in err
    uid = "0190e3a0-0000-7000-8000-000000000000"
    code, _out, err = run_cli("trace", store_path + "-missing", uid)
    assert code == 1 and "mqcore: error:" in err
