"""Typos on the `mqcore` command line (issue 32.3): an unknown option gets its command's usage
and a "did you mean" line, an abbreviation is refused rather than silently taken, a mistyped
command or topic gets a suggestion, and a selector property no message has can be answered
with the properties the topic's messages do carry."""

from __future__ import annotations

import re

import pytest
from conftest import run_cli

import mqcore
from mqcore.cli import main
from mqcore.cli.hints import did_you_mean, properties_seen, property_hint


@pytest.fixture
def orders(store_path: str) -> str:
    with mqcore.open(store_path) as s:
        s.create_topic("orders")
        s.create_topic("payments")
        s.append("orders", b"v", properties={"region": "eu", "amount": "12"})
        s.append("orders", b"w", properties={"region": "us"}, tag="paid")
    return store_path


def test_an_unknown_option_gets_the_commands_usage_and_a_suggestion(orders: str) -> None:
    rc, out, err = run_cli("query", orders, "orders", "--form", "2024-01-01")
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("usage: mqcore query ")
    assert lines[-2:] == [
        "mqcore query: error: unrecognized arguments: --form 2024-01-01",
        "mqcore query: --form: did you mean --from?",
    ]
    rc, _, err = run_cli("consume", orders, "orders", "--ofset=5")
    assert rc == 2 and err.startswith("usage: mqcore consume ")
    assert err.splitlines()[-1] == "mqcore consume: --ofset=5: did you mean --offset?"
    # nothing close: the usage and the error alone
    rc, _, err = run_cli("topics", orders, "--zzzzzz")
    assert rc == 2
    assert err.splitlines()[-1] == "mqcore topics: error: unrecognized arguments: --zzzzzz"


def test_an_abbreviation_is_not_taken_for_the_option(orders: str) -> None:
    """`--fro` ran as `--from` before; now it is an unknown option, with the suggestion."""
    rc, out, err = run_cli("query", orders, "orders", "--fro", "2024-01-01")
    assert rc == 2 and out == ""
    assert err.splitlines()[-1] == "mqcore query: --fro: did you mean --from?"
    rc, _, err = run_cli("produce", orders, "orders", "--val", "x")
    assert rc == 2 and "--val: did you mean --value?" in err


def test_no_command_takes_a_prefix_of_an_option(capfd: pytest.CaptureFixture[str]) -> None:
    """`--hel` of every command (and of mqcore itself) is refused, not taken for --help."""
    assert main(["no-such-command"]) == 2
    named = re.search(r"\(choose from (.*)\)", capfd.readouterr().err)
    assert named is not None
    commands = re.findall(r"'([^']+)'", named.group(1))
    assert len(commands) > 10
    for argv in [["--hel"], *([c, "--hel"] for c in commands)]:
        assert main(argv) == 2, argv
        out, err = capfd.readouterr()
        assert out == "" and "usage:" in err, argv


def test_a_mistyped_command_gets_a_suggestion() -> None:
    rc, out, err = run_cli("quer", "x")
    assert rc == 2 and out == ""
    assert err.splitlines()[-1] == "mqcore: did you mean 'query'?"


@pytest.mark.parametrize(
    "argv",
    [
        ["consume", "{}", "ordrs"],
        ["get", "{}", "ordrs", "0", "0"],
        ["query", "{}", "ordrs", "--key", "k"],
        ["produce", "{}", "ordrs", "--value", "x"],
        ["config", "{}", "ordrs"],
        ["stats", "{}", "ordrs"],
    ],
    ids=lambda a: a[0],
)
def test_an_unknown_topic_gets_a_suggestion(orders: str, argv: list[str]) -> None:
    rc, out, err = run_cli(*[orders if a == "{}" else a for a in argv])
    assert rc == 1 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "ordrs" in lines[0], err
    assert lines[0].endswith("; did you mean 'orders'?")


def test_did_you_mean() -> None:
    assert did_you_mean("ordrs", ["orders", "payments"]) == "did you mean 'orders'?"
    assert did_you_mean("--fro", ["--from", "--to"]) == "did you mean --from?"
    assert did_you_mean("--p", ["--partition", "--partitions", "--to"]) == (
        "did you mean --partition or --partitions?"
    )  # a prefix of several: all of them
    assert did_you_mean("zzz", ["orders"]) == ""
    assert did_you_mean("", ["orders"]) == ""


def test_properties_seen_answers_a_selector_name_no_message_has(orders: str) -> None:
    """What cli/query.py adds to its note on a selector property no scanned message had."""
    with mqcore.open(orders, read_only=True) as s:
        seen = properties_seen(s, ["orders"])
    assert seen == ["amount", "region", "tag"]
    assert property_hint("regoin", seen) == (
        "did you mean 'region'? (properties seen: amount, region, tag)"
    )
    assert property_hint("colour", seen) == "(properties seen: amount, region, tag)"
    assert property_hint("x", []) == "no message read has any property"
