"""What a new user hits first with `mqcore query` and `consume` (issue 17), through the real
command in a subprocess: reversed and implausible time bounds, an unquoted selector value, ISO
times wherever ms are taken, and Ctrl-C during a long scan."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys

import pytest
from conftest import interruptible, run_cli, shown_time

import mqcore

T0 = 1_718_013_600_000  # 2024-06-10T10:00:00Z
TOPIC = "orders"


@pytest.fixture(scope="module")
def orders(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two partitions, one message a second from T0, `service` on every message."""
    path = str(tmp_path_factory.mktemp("cli_first_hour") / "store")
    with mqcore.open(path) as s:
        s.create_topic(TOPIC, partitions=2)
        for i in range(40):
            service = "payments" if i % 4 else "billing"
            s.append(TOPIC, b"order %d" % i, key=b"k%d" % (i % 3), partition=i % 2,
                     timestamp=T0 + i * 1000, properties={"service": service})  # fmt: skip
    return path


def lines(text: str) -> list[str]:
    return text.splitlines()


@pytest.mark.parametrize("extra", [[], ["--key", "k1"], ["--tag", "x"]])
def test_reversed_from_to_is_refused(orders: str, extra: list[str]) -> None:
    rc, out, err = run_cli(
        "query", orders, TOPIC, "--from", str(T0 + 5000), "--to", "2024-06-10T10:00:00Z", *extra
    )
    assert rc == 1 and out == ""
    assert lines(err) == [
        f"mqcore: error: start {T0 + 5000} (2024-06-10T10:00:05.000Z) is after end {T0} "
        "(2024-06-10T10:00:00.000Z): a reversed time range holds nothing (start is inclusive, "
        "end exclusive)"
    ]


def test_equal_from_to_warns_that_the_range_is_empty(orders: str) -> None:
    rc, out, err = run_cli("query", orders, TOPIC, "--from", str(T0), "--to", str(T0))
    assert rc == 0 and out == ""
    assert lines(err) == [
        f"mqcore: warning: --from equals --to ({shown_time(T0)}): the range holds nothing "
        "(--to is exclusive)",
        "mqcore: query exhausted: 0 messages, read 0 records",
    ]


@pytest.mark.parametrize("progress", ["--no-progress", "--progress"])
def test_seconds_for_milliseconds_warn_in_one_line_each(orders: str, progress: str) -> None:
    """--from/--to in seconds: one warning line per bound (however many searches the progress
    bar's chunks make), no traceback, and the query still runs as asked."""
    rc, out, err = run_cli(
        "query", orders, TOPIC, "--from", str(T0 // 1000), "--to", str(T0 // 1000 + 30),
        progress, "--max-scan", "5",
    )  # fmt: skip
    assert rc == 0 and out == ""
    warned = [line for line in lines(err.replace("\r", "\n")) if "warning" in line]
    assert warned == [
        f"mqcore: warning: {name}={value} is 1970-01-20T21:13:{second}.{ms}Z as milliseconds "
        f"since the epoch, before 2001; it looks like seconds (as ms that would be "
        f"2024-06-10T10:00:{at}.000Z)"
        for name, value, second, ms, at in [
            ("start", T0 // 1000, "33", "600", "00"),
            ("end", T0 // 1000 + 30, "33", "630", "30"),
        ]
    ]


def test_unquoted_where_value_names_the_missing_property(orders: str) -> None:
    rc, out, err = run_cli("query", orders, TOPIC, "--where", "service = payments")
    assert rc == 0 and out == ""
    assert lines(err)[0].startswith("mqcore: query exhausted: 0 messages, read 40 records (")
    assert lines(err)[1:] == [
        "mqcore: note: no scanned message has property 'payments': quote string values, "
        "e.g. --where \"service = 'payments'\"; (properties seen: service)",
    ]
    rc, out, _ = run_cli("query", orders, TOPIC, "--where", "service = payments", "--json")
    assert json.loads(lines(out)[-1])["missing_properties"] == ["payments"]
    rc, out, err = run_cli("query", orders, TOPIC, "--where", "service = 'payments'")
    assert rc == 0 and len(lines(out)) == 30 and "note" not in err
    # the example quotes the user's own value; a name on the left gets the general example
    rc, out, err = run_cli("query", orders, TOPIC, "--where", "size > 2 OR service <> billing")
    assert rc == 0 and out == ""
    assert lines(err)[1:] == [
        "mqcore: note: no scanned message has property 'billing': quote string values, "
        "e.g. --where \"size > 2 OR service <> 'billing'\"; (properties seen: service)",
        "mqcore: note: no scanned message has property 'size': quote string values, "
        "e.g. --where \"service = 'payments'\"; (properties seen: service)",
    ]
    # a misspelt name: the property it may have meant, from the messages themselves
    rc, out, err = run_cli("query", orders, TOPIC, "--where", "servce = 'payments'")
    assert rc == 0 and out == ""
    assert lines(err)[-1].endswith("; did you mean 'service'? (properties seen: service)")


def test_iso_times_wherever_ms_are_taken(orders: str) -> None:
    """consume -o s@TIME and query --from/--to take ISO-8601 as well as ms, with the same
    result; text output shows each timestamp as ISO and ms."""
    at = T0 + 17_000
    by_ms = run_cli("consume", orders, TOPIC, "-o", f"s@{at}")
    by_iso = run_cli("consume", orders, TOPIC, "-o", "s@2024-06-10T10:00:17Z")
    by_zone = run_cli("consume", orders, TOPIC, "-o", "s@2024-06-10T12:00:17+02:00")
    assert by_ms == by_iso == by_zone and by_ms[0] == 0
    with mqcore.open(orders, read_only=True) as s:
        expected = [
            m for p in range(2) for m in s.read(TOPIC, p, 0, 100) if m.timestamp >= at
        ]  # each partition from its first message at or after `at`: timestamps increase
    assert lines(by_ms[1]) == [
        f"{m.partition}\t{m.offset}\t{shown_time(m.timestamp)}\t{(m.key or b'').decode()}\t"
        f"{(m.value or b'').decode()}"
        for m in expected
    ]
    q_ms = run_cli("query", orders, TOPIC, "--from", str(at), "--to", str(T0 + 25_000))
    q_iso = run_cli("query", orders, TOPIC, "--from", "2024-06-10T10:00:17",
                    "--to", "2024-06-10T10:00:25.000Z")  # fmt: skip
    assert q_ms == q_iso and len(lines(q_ms[1])) == 8


# -- Ctrl-C --------------------------------------------------------------------------------------

BIG = 400_000  # records: the scan runs for seconds, the interrupt lands well inside it
EVERY = 7  # one message in EVERY matches: a chunk's matches are more than a pipe holds


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("cli_interrupt") / "store")
    with mqcore.open(path, flush="os") as s:
        s.create_topic("big", partitions=2)
        step = 5000
        for i in range(0, BIG, step):
            s.append_batch(
                "big",
                [b"m%d" % j for j in range(i, i + step)],
                partition=(i // step) % 2,
                timestamps=[T0 + j for j in range(i, i + step)],
                properties=[{"hit": "yes" if j % EVERY == 0 else "no"} for j in range(i, i + step)],
            )
    return path


def offsets_of(text: str) -> list[tuple[int, int]]:
    return [(int(f[1]), int(f[2])) for f in (line.split("\t") for line in lines(text))]


def test_ctrl_c_prints_what_was_found_and_the_cursor_to_resume(big: str) -> None:
    """SIGINT while the scan runs: the matches so far, a completion line "interrupted ...
    resume with --cursor", exit 130; resuming with that cursor finds the rest, and both together
    are exactly what one full scan finds.

    No race: the first chunk's matches (about 7,000 lines) are more than the stdout pipe holds,
    so the query blocks printing them until this process reads; the signal is sent once matches
    are waiting in the pipe and before anything is read, so it always lands inside the scan."""
    argv = ["query", big, "big", "--where", "hit = 'yes'", "--progress", "--limit", str(BIG)]
    proc = interruptible(
        [sys.executable, "-m", "mqcore.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no match printed within 120 s"
        proc.send_signal(signal.SIGINT)
        out_b, err_b = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = out_b.decode(), err_b.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    done = re.search(
        r"mqcore: query interrupted: ([0-9,]+) messages?, read ([0-9,]+) records .*; "
        r"resume with --cursor (c1-[0-9]+-[0-9]+)\n",
        err,
    )
    assert done is not None, err
    first = offsets_of(out)
    assert len(first) == int(done[1].replace(",", ""))
    assert int(done[2].replace(",", "")) < BIG  # it did stop early

    rc, out, _ = run_cli(
        "query", big, "big", "--where", "hit = 'yes'", "--cursor", done[3], "--limit", str(BIG)
    )
    assert rc == 0
    rest = offsets_of(out)
    with mqcore.open(big, read_only=True) as s:
        expected = [
            (m.partition, m.offset)
            for p in range(2)
            for m in s.read("big", p, 0, BIG)
            if m.properties.get("hit") == "yes"
        ]
    assert first + rest == expected
