"""Plain-text system logs through `mqcore produce` (issue 32.3): `--parse` (named groups to key,
tag, timestamp and properties) over dpkg.log, `--record-start` for apt's multi-line
history.log, each checked against an independent reading of the same text, then asked the
questions a user asks (`mqcore query --key`, `--tag`, `--where`, a time window). The fixtures
are written like the real files; the real ones are loaded too when this machine has them."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import run_cli

import mqcore

DPKG = """\
2024-05-01 10:00:01 startup archives unpack
2024-05-01 10:00:01 install curl:amd64 <none> 7.88.1-10+deb12u5
2024-05-01 10:00:01 status half-installed curl:amd64 7.88.1-10+deb12u5
2024-05-01 10:00:02 status unpacked curl:amd64 7.88.1-10+deb12u5
2024-05-01 10:00:02 upgrade libcurl4:amd64 7.88.1-10+deb12u4 7.88.1-10+deb12u5
2024-05-01 10:00:03 startup packages configure
2024-05-01 10:00:03 configure libcurl4:amd64 7.88.1-10+deb12u5 <none>
2024-05-01 10:00:03 status installed libcurl4:amd64 7.88.1-10+deb12u5
2024-05-01 10:00:04 trigproc libc-bin:amd64 2.36-9+deb12u4 <none>
2024-05-01 10:00:04 status installed libc-bin:amd64 2.36-9+deb12u4
2024-05-01 10:05:00 remove python3-crcmod:amd64 1.7+dfsg-3 <none>
2024-05-01 10:05:00 status config-files python3-crcmod:amd64 1.7+dfsg-3
2024-05-01 10:05:01 conffile /etc/ssh/ssh_config keep
"""
# the time, the action as tag, a status line's state, package (key) and architecture
DPKG_PARSE = (
    r"^(?P<timestamp>\S+ \S+) (?P<tag>\S+)(?: (?P<state>[a-z-]+(?= \S+:)))?"
    r"(?: (?P<key>[^\s:]+):(?P<arch>\S+))?"
)

HISTORY = """\

Start-Date: 2024-05-01  10:00:00
Commandline: apt-get install -y curl
Requested-By: admin (1000)
Install: curl:amd64 (7.88.1-10+deb12u5)
Upgrade: libcurl4:amd64 (7.88.1-10+deb12u4, 7.88.1-10+deb12u5)
End-Date: 2024-05-01  10:00:04

Start-Date: 2024-05-01  10:05:00
Commandline: apt-get purge -y python3-crcmod
Requested-By: admin (1000)
Purge: python3-crcmod:amd64 (1.7+dfsg-3)
End-Date: 2024-05-01  10:05:01

Start-Date: 2024-05-02  06:25:11
Commandline: /usr/bin/unattended-upgrade
Upgrade: libssl3:amd64 (3.0.11-1~deb12u2, 3.0.13-1~deb12u1), openssl:amd64 (3.0.11-1~deb12u2, 3.0.13-1~deb12u1)
End-Date: 2024-05-02  06:25:14

"""  # noqa: E501 - apt writes an upgrade's packages on one line
HISTORY_ARGS = [
    "--record-start", "^Start-Date:",
    "--parse", r"^Start-Date: (?P<timestamp>.+)",
    "--timestamp-format", "%Y-%m-%d  %H:%M:%S",
    "--parse", r"(?m)^Commandline: (?P<commandline>.*)$",
    "--parse", r"(?m)^(?P<tag>Install|Upgrade|Remove|Purge):",
    # optional: an unattended upgrade has no Requested-By line
    "--parse", r"(?ms)\A(?:.*?^Requested-By: (?P<requested_by>\S+))?",
]  # fmt: skip
UTC = timezone.utc


def messages(store: str, topic: str) -> list[mqcore.Message]:
    with mqcore.open(store, read_only=True) as s:
        return [m for p in range(s.partitions(topic)) for m in s.read(topic, p, 0, 100_000)]


def ms(text: str, fmt: str = "%Y-%m-%d %H:%M:%S") -> int:
    return int(datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp() * 1000)


def dpkg_fields(line: str) -> tuple[str | None, str, int, dict[str, str]]:
    """(key, tag, time, properties) of a dpkg.log line, read with split() instead of RE."""
    words = line.split()
    tag, rest = words[2], words[3:]
    props: dict[str, str] = {}
    if tag == "status":
        props["state"], rest = rest[0], rest[1:]
    key = None
    if rest and ":" in rest[0]:
        key, props["arch"] = rest[0].split(":", 1)
    return key, tag, ms(f"{words[0]} {words[1]}"), props


def query_values(store: str, *args: str) -> list[str]:
    rc, out, err = run_cli("query", store, *args, "--json")
    assert rc == 0, err
    found = [json.loads(line) for line in out.splitlines()]
    return [m["value"] for m in found if m["type"] == "message"]


def test_dpkg_log_lines_get_key_tag_time_and_properties(tmp_path: Path, store_path: str) -> None:
    src = tmp_path / "dpkg.log"
    src.write_text(DPKG)
    rc, out, err = run_cli("produce", store_path, "dpkg", "--create", "--file", str(src),
                           "--parse", DPKG_PARSE)  # fmt: skip
    assert rc == 0 and err == "", err
    got = messages(store_path, "dpkg")
    assert [m.value for m in got] == [line.encode() for line in DPKG.splitlines()]
    for m, line in zip(got, DPKG.splitlines(), strict=True):
        key, tag, when, props = dpkg_fields(line)
        assert (m.key, m.tag, m.timestamp, m.properties) == (
            None if key is None else key.encode(),
            tag,
            when,
            {"tag": tag, **props},
        ), line  # the tag is a property too (docs/query.md)
    # the questions: one package, one action, one state, a time window
    assert len(query_values(store_path, "dpkg", "--key", "libcurl4")) == 3
    assert query_values(store_path, "dpkg", "--tag", "remove") == [DPKG.splitlines()[10]]
    installed = query_values(store_path, "dpkg", "--where", "state = 'installed'")
    assert installed == [DPKG.splitlines()[7], DPKG.splitlines()[9]]
    window = query_values(store_path, "dpkg", "--from", "2024-05-01T10:05:00Z")
    assert window == DPKG.splitlines()[10:]


def test_apt_history_blocks_are_one_record_each(tmp_path: Path, store_path: str) -> None:
    """The real file's shape: a blank line first and between blocks, `\\r\\n` endings too (a
    copy made on Windows); from --file and from stdin alike."""
    blocks = [b.strip("\n") for b in HISTORY.split("\n\n") if b.strip()]
    for n, (data, how) in enumerate(
        [(HISTORY, "file"), (HISTORY, "stdin"), (HISTORY.replace("\n", "\r\n"), "file")]
    ):
        store = f"{store_path}{n}"
        src = tmp_path / f"history{n}.log"
        src.write_bytes(data.encode())
        source = ["--file", str(src)] if how == "file" else []
        stdin = data.encode() if how == "stdin" else None
        rc, out, err = run_cli("produce", store, "apt", "--create", *source, *HISTORY_ARGS,
                               stdin=stdin)  # fmt: skip
        assert rc == 0 and err == "", err
        got = messages(store, "apt")
        assert [m.value for m in got] == [b.encode() for b in blocks]
        assert [m.timestamp for m in got] == [
            ms("2024-05-01 10:00:00"),
            ms("2024-05-01 10:05:00"),
            ms("2024-05-02 06:25:11"),
        ]
        assert [m.tag for m in got] == ["Install", "Purge", "Upgrade"]
        assert [m.properties for m in got] == [
            {"tag": "Install", "commandline": "apt-get install -y curl", "requested_by": "admin"},
            {"tag": "Purge", "commandline": "apt-get purge -y python3-crcmod",
             "requested_by": "admin"},
            {"tag": "Upgrade", "commandline": "/usr/bin/unattended-upgrade"},
        ]  # fmt: skip
    by_admin = query_values(store_path + "0", "apt", "--where", "requested_by = 'admin'")
    assert by_admin == blocks[:2]


def test_a_line_parse_does_not_match_is_bad(tmp_path: Path, store_path: str) -> None:
    src = tmp_path / "dpkg.log"
    src.write_text(DPKG + "garbage\n")
    rc, out, err = run_cli("produce", store_path, "dpkg", "--create", "--file", str(src),
                           "--parse", r"^(?P<timestamp>\S+ \S+) (?P<tag>\S+)")  # fmt: skip
    assert rc == 1 and out == ""
    assert "line 14 does not match --parse '^(?P<timestamp>\\S+ \\S+) (?P<tag>\\S+)'" in err
    assert "1 of 14 lines is bad" in err and "nothing was written" in err
    assert not os.path.exists(store_path)  # the store it would have made is not left behind
    # a record that does not match names its lines
    src.write_text("Start-Date: 2024-05-01  10:00:00\nCommandline: x\n\nStart-Date: junk\n")
    rc, out, err = run_cli("produce", store_path, "apt", "--create", "--file", str(src),
                           *HISTORY_ARGS[:6])  # fmt: skip
    assert rc == 1 and "the record at line 4 timestamp: 'junk' does not match" in err, err
    assert "1 of 2 records is bad (every record is checked first)" in err


@pytest.mark.parametrize(
    ("flags", "clash"),
    [
        (["-K", "|", "--parse", "(?P<key>\\w+)"], "--key-separator"),
        (["--tag", "t", "--parse", "(?P<tag>\\w+)"], "--tag"),
        (["--timestamp", "2024-01-01", "--parse", "(?P<timestamp>\\S+)"], "--timestamp"),
    ],
)
def test_a_group_and_an_option_giving_the_same_are_refused(
    store_path: str, flags: list[str], clash: str
) -> None:
    rc, out, err = run_cli("produce", store_path, "t", "--create", "--value", "x", *flags)
    assert rc == 2 and clash in err.splitlines()[-1]
    assert not os.path.exists(store_path)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [("(?P<x", "is not a regular expression"), ("\\d+", "has no named group")],
)
def test_bad_parse_patterns_are_named(store_path: str, pattern: str, message: str) -> None:
    rc, _, err = run_cli("produce", store_path, "t", "--create", "--value", "1", "--parse", pattern)
    assert rc == 1 and message in err and not os.path.exists(store_path)
    rc, _, err = run_cli("produce", store_path, "t", "--create", "--value", "1",
                         "--record-start", "(")  # fmt: skip
    assert rc == 1 and "--record-start '(' is not a regular expression" in err


def test_a_record_start_that_never_matches_stops_at_the_size_limit(
    tmp_path: Path, store_path: str
) -> None:
    """A typo in --record-start makes the whole input one record: it is refused once past
    max_message_bytes, with the question to ask, instead of gathered whole in memory."""
    src = tmp_path / "history.log"
    src.write_text(HISTORY * 200)
    rc, out, err = run_cli("produce", store_path, "apt", "--create", "--file", str(src),
                           "--record-start", "^Start-date:",
                           "--config", "max_message_bytes=4096")  # fmt: skip
    assert rc == 1 and out == ""
    assert "the record at lines 1-" in err and "over max_message_bytes=4,096" in err
    assert "does --record-start '^Start-date:' match the first line of every record?" in err


def test_the_real_logs_of_this_machine_load_line_for_line(tmp_path: Path, store_path: str) -> None:
    """/var/log/dpkg.log and /var/log/apt/history.log as they are here (copied first: apt may
    be writing them): every line of dpkg.log a message with its package, every apt run one
    record."""
    dpkg, history = "/var/log/dpkg.log", "/var/log/apt/history.log"
    if not (os.access(dpkg, os.R_OK) and os.access(history, os.R_OK)):
        pytest.skip("no readable /var/log/dpkg.log and /var/log/apt/history.log here")
    shutil.copy(dpkg, tmp_path / "dpkg.log")
    shutil.copy(history, tmp_path / "history.log")
    rc, _, err = run_cli("produce", store_path, "dpkg", "--create", "--file",
                         str(tmp_path / "dpkg.log"), "--parse", DPKG_PARSE)  # fmt: skip
    assert rc == 0, err
    lines = (tmp_path / "dpkg.log").read_text().splitlines()
    got = messages(store_path, "dpkg")
    assert [m.value for m in got] == [line.encode() for line in lines]
    assert [m.key for m in got] == [
        None if dpkg_fields(line)[0] is None else dpkg_fields(line)[0].encode() for line in lines
    ]
    rc, _, err = run_cli("produce", store_path, "apt", "--create", "--file",
                         str(tmp_path / "history.log"), *HISTORY_ARGS[:6])  # fmt: skip
    assert rc == 0, err
    text = (tmp_path / "history.log").read_text()
    got = messages(store_path, "apt")
    assert len(got) == text.count("Start-Date:")
    assert all(m.value.startswith(b"Start-Date:") for m in got)
