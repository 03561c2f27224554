"""`python -m mqcore.demo`: it runs, says what it found, and leaves a store that matches."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from conftest import child_env

import mqcore
from mqcore import demo
from mqcore._ext.batch import decode_messages, read_batch_info
from mqcore._ext.hashing import kafka_partition

MESSAGES = 400
SEED = 7


def _without_uid(headers: tuple[tuple[str, bytes | None], ...]) -> tuple[Any, ...]:
    """A stored message's headers minus the ("uid", 16 bytes) header the store appends last."""
    assert headers, "no generated uid header"
    name, uid = headers[-1]
    assert name == "uid" and uid is not None and len(uid) == 16
    return headers[:-1]


def _contents(path: str) -> tuple[dict[str, Any], list[bytes]]:
    """A store's files, all but the unique IDs: (what must be the same for the same seed, the
    uid of every message in file order).

    Each .log becomes its batches (header fields but the CRC, and the records with the uid
    header dropped); .keyindex files (they hold the uids), .index files (byte positions: a
    compressed batch's size follows its random uids) and the lock file (the writer's pid) appear
    by name only; other files by bytes.
    """
    same: dict[str, Any] = {}
    uids: list[bytes] = []
    for root, _dirs, names in os.walk(path):
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            if name.endswith((".keyindex", ".index")) or name == ".mqcore.lock":
                same[rel] = None
                continue
            with open(full, "rb") as f:
                data = f.read()
            if not name.endswith(".log"):
                same[rel] = data
                continue
            topic, part = os.path.basename(root).rsplit("-", 1)
            batches, pos = [], 0
            while pos < len(data):
                info = read_batch_info(data, pos)
                assert info is not None, (rel, pos)
                msgs: list[mqcore.Message] = []
                decode_messages(data, pos, topic, int(part), 0, info.records_count, msgs)
                uids += [m.headers[-1][1] or b"" for m in msgs]
                records = [
                    (m.offset, m.timestamp, m.key, m.value, _without_uid(m.headers)) for m in msgs
                ]
                fields = (info.base_offset, info.attributes, info.last_offset_delta)
                times = (info.base_timestamp, info.max_timestamp, info.records_count)
                batches.append((fields, times, records))
                pos += info.size
            same[rel] = batches
    return same, uids


@pytest.fixture
def ran(tmp_path: os.PathLike[str], capfd: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """Run the demo once into tmp_path/demo; returns (store path, what it printed)."""
    path = os.path.join(tmp_path, "demo")
    assert (
        demo.main(["--no-spark", "--path", path, "--messages", str(MESSAGES), "--seed", str(SEED)])
        == 0
    )
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
                stored.update((m.key, m.value, m.timestamp, _without_uid(m.headers)) for m in msgs)
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
    """The seed fixes the data, its routing and its batching, so every file but the unique IDs.

    The store gives each message a fresh random UUIDv7 `uid` header (the demo's topics keep
    unique_ids on), so the .log bytes (uid, CRC, zstd output) and the .keyindex differ from run
    to run: everything else is compared, and the uids are checked to be new."""
    path, _ = ran
    again = os.path.join(tmp_path, "again")
    demo.main(["--no-spark", "--path", again, "--messages", str(MESSAGES), "--seed", str(SEED)])
    capfd.readouterr()
    first, first_uids = _contents(path)
    second, second_uids = _contents(again)
    assert second == first
    assert len(set(first_uids) | set(second_uids)) == 2 * MESSAGES
    other = os.path.join(tmp_path, "other")
    demo.main(["--no-spark", "--path", other, "--messages", str(MESSAGES), "--seed", str(SEED + 1)])
    capfd.readouterr()
    assert _contents(other)[0] != first


def test_rerun_wipes_its_own_store(ran: tuple[str, str], capfd: pytest.CaptureFixture[str]) -> None:
    path, _ = ran
    assert demo.main(["--no-spark", "--path", path, "--messages", "50", "--seed", "1"]) == 0
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
        demo.main(["--no-spark", "--path", precious, "--messages", "50"])
    assert os.listdir(precious) == ["thesis.txt"]


def test_too_few_messages_is_a_usage_error(
    tmp_path: os.PathLike[str], capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        demo.main(["--no-spark", "--path", os.path.join(tmp_path, "d"), "--messages", "3"])
    assert exc.value.code == 2
    assert "at least" in capfd.readouterr().err


def test_the_commands_it_suggests_run_without_an_activated_venv(tmp_path: os.PathLike[str]) -> None:
    """`make demo` runs the venv's python without activating the venv: the closing "look
    around" commands must work from the same shell as printed (they said `mqcore topics ...`,
    which was `command not found`)."""
    env = child_env()
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = (
        os.pathsep.join(
            p for p in env.get("PATH", "").split(os.pathsep) if os.path.realpath(p) != venv_bin
        )
        or "/usr/bin:/bin"
    )
    path = os.path.join(tmp_path, "d")
    demo_run = subprocess.run(
        [sys.executable, "-m", "mqcore.demo", "--no-spark", "--path", path, "--messages", "50"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo_run.returncode == 0, demo_run.stderr
    tail = demo_run.stdout.split("Look around with the CLI:")[1]
    commands = [line.strip() for line in tail.splitlines() if " topics " in line]
    assert commands
    listed = subprocess.run(
        commands[0], shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, (commands[0], listed.stderr)
    assert demo.ACCESS in listed.stdout and demo.EVENTS in listed.stdout


def test_it_ends_with_the_console_command_which_serves_the_demo_store(
    ran: tuple[str, str],
) -> None:
    """The last lines name `mqcore console <store>` and its URL (printed, not started: the
    demo does not block); that command, on a free port, serves the demo's topics."""
    pytest.importorskip("jinja2", reason="the server extra (jinja2) is missing")
    import signal
    import urllib.request

    path, out = ran
    tail = out.rstrip().splitlines()[-2:]
    assert tail[0].startswith("Browse it: ") and tail[0].endswith(f" console {path}")
    assert demo.CONSOLE_URL in tail[1]
    command = tail[0].removeprefix("Browse it: ") + " --http 127.0.0.1:0"
    proc = subprocess.Popen(
        command, shell=True, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/ui/)", line)
        assert found, line
        with urllib.request.urlopen(found[1], timeout=30) as r:
            page = r.read().decode()
        assert f'data-topic="{demo.ACCESS}"' in page and f'data-topic="{demo.EVENTS}"' in page
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM)
