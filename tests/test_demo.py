"""`python -m mqcore.demo`: it runs, says what it found, and leaves a store that matches."""

from __future__ import annotations

import os
import random
import re
from collections import Counter

import pytest

import mqcore
from mqcore import demo
from mqcore._ext.hashing import kafka_partition

MESSAGES = 400
SEED = 7


def _logs(path: str) -> dict[str, bytes]:
    """Every .log file of a store with its bytes."""
    out = {}
    for root, _dirs, names in os.walk(path):
        for name in names:
            if name.endswith(".log"):
                with open(os.path.join(root, name), "rb") as f:
                    out[os.path.relpath(os.path.join(root, name), path)] = f.read()
    return out


@pytest.fixture
def ran(tmp_path: os.PathLike[str], capfd: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """Run the demo once into tmp_path/demo; returns (store path, what it printed)."""
    path = os.path.join(tmp_path, "demo")
    assert demo.main(["--path", path, "--messages", str(MESSAGES), "--seed", str(SEED)]) == 0
    out, err = capfd.readouterr()
    assert "Exception ignored" not in err, err
    return path, out


def test_output_reports_every_step(ran: tuple[str, str]) -> None:
    _path, out = ran
    n_access = MESSAGES * 3 // 5
    for needle in (
        f"{n_access:,} nginx access lines + {MESSAGES - n_access:,} JSON app events",
        "append_batch",
        "read  access-logs",
        "read  app-events",
        "random offsets",
        "offset_for_time()",
        "read_arrow access-logs",
        "5xx responses",
        "segments scanned by recovery: 0",
        "cut 40 bytes from access-logs-0",
        "mqcore topics",
    ):
        assert needle in out, needle
    assert re.search(rf"read  access-logs +{n_access:,} msgs", out)
    assert re.search(rf"read  app-events +{MESSAGES - n_access:,} msgs", out)
    assert "-> None: nothing at or after it" in out  # 13:15, after the simulated hour


def test_store_holds_exactly_the_generated_messages(ran: tuple[str, str]) -> None:
    path, out = ran
    rng = random.Random(SEED)
    n_access = MESSAGES * 3 // 5
    access = demo.access_logs(rng, n_access)
    events = demo.app_events(rng, MESSAGES - n_access)
    with mqcore.open(path, read_only=True) as store:
        assert store.topics() == [demo.ACCESS, demo.EVENTS]
        assert store.partitions(demo.ACCESS) == 3
        assert store.partitions(demo.EVENTS) == 2
        for topic, stream in ((demo.ACCESS, access), (demo.EVENTS, events)):
            stored = Counter()
            for part in range(store.partitions(topic)):
                msgs = store.read(topic, part, 0, max_records=MESSAGES)
                assert len(msgs) == store.end_offset(topic, part)
                stored.update((m.key, m.value, m.timestamp, m.headers) for m in msgs)
            headers = stream.headers or [[] for _ in stream.values]
            wanted = Counter(
                zip(
                    stream.keys,
                    stream.values,
                    stream.timestamps,
                    [tuple(h) for h in headers],
                    strict=True,
                )
            )
            assert stored == wanted
        levels = Counter(
            m.header("level").decode()
            for p in range(2)
            for m in store.read(demo.EVENTS, p, 0, MESSAGES)
        )
    printed = re.search(r"app-events by 'level' header: (.*)", out)
    assert printed is not None
    assert printed.group(1) == ", ".join(
        f"{lvl} {levels[lvl]:,}" for lvl, _ in demo.LEVELS if levels[lvl]
    )


def test_time_lookups_it_printed_are_right(ran: tuple[str, str]) -> None:
    path, out = ran
    with mqcore.open(path, read_only=True) as store:
        msgs = store.read(demo.ACCESS, 0, 0, max_records=MESSAGES)
        for minutes in (0, 15, 30, 45):
            ts = demo.BASE_TS + minutes * 60_000
            expected = next(m.offset for m in msgs if m.timestamp >= ts)
            label = demo.iso_time(ts)[11:19]
            assert re.search(rf"{label}  -> offset +{expected:,} ", out), label


def test_crash_step_cut_only_the_torn_bytes(ran: tuple[str, str]) -> None:
    path, _out = ran
    with mqcore.open(path) as store:
        assert all(not r.recovered_segments for r in store.recovery.values())  # clean again
        rng = random.Random(SEED)
        keys = demo.access_logs(rng, MESSAGES * 3 // 5).keys
        on_p0 = sum(1 for k in keys if kafka_partition(k, 3) == 0)
        assert store.end_offset(demo.ACCESS, 0) == on_p0
        assert len(store.read(demo.ACCESS, 0, 0, MESSAGES)) == on_p0


def test_same_seed_same_bytes(
    ran: tuple[str, str], tmp_path: os.PathLike[str], capfd: pytest.CaptureFixture[str]
) -> None:
    path, _ = ran
    again = os.path.join(tmp_path, "again")
    demo.main(["--path", again, "--messages", str(MESSAGES), "--seed", str(SEED)])
    capfd.readouterr()
    assert _logs(again) == _logs(path)
    other = os.path.join(tmp_path, "other")
    demo.main(["--path", other, "--messages", str(MESSAGES), "--seed", str(SEED + 1)])
    capfd.readouterr()
    assert _logs(other) != _logs(path)


def test_rerun_wipes_its_own_store(ran: tuple[str, str], capfd: pytest.CaptureFixture[str]) -> None:
    path, _ = ran
    assert demo.main(["--path", path, "--messages", "50", "--seed", "1"]) == 0
    capfd.readouterr()
    with mqcore.open(path, read_only=True) as store:
        assert sum(store.end_offset(demo.ACCESS, p) for p in range(3)) == 30
        assert sum(store.end_offset(demo.EVENTS, p) for p in range(2)) == 20


def test_refuses_to_wipe_a_directory_it_did_not_make(tmp_path: os.PathLike[str]) -> None:
    precious = os.path.join(tmp_path, "precious")
    os.makedirs(precious)
    with open(os.path.join(precious, "thesis.txt"), "w") as f:
        f.write("do not delete")
    with pytest.raises(SystemExit, match="not an mqcore store"):
        demo.main(["--path", precious, "--messages", "50"])
    assert os.listdir(precious) == ["thesis.txt"]


def test_too_few_messages_is_a_usage_error(
    tmp_path: os.PathLike[str], capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        demo.main(["--path", os.path.join(tmp_path, "d"), "--messages", "3"])
    assert exc.value.code == 2
    assert "at least" in capfd.readouterr().err
