"""The `mqcore` command: write, read, query and inspect a store from the shell.

    mqcore --version
    mqcore produce STORE TOPIC [--value V ... | --file PATH] [-k KEY | -K SEP | --key-field F]
                   [-p N] [--tag T | --tag-field F] [--property K=V ...] [--property-field
                   NAME[=F] ...] [-H K[=V] ...] [--headers-delimiter SEP] [--keys "W1 W2"]
                   [--timestamp TIME | --timestamp-field F | --timestamp-regex RE]
                   [--timestamp-format iso|ms|s|STRPTIME] [--create] [--partitions N]
                   [--config KEY=VALUE ...] [--compression CODEC] [--batch-size N] [--json]
    mqcore config STORE TOPIC [KEY=VALUE ...] [--json]
    mqcore consume STORE TOPIC [-p N] [-o beginning|end|N|-N|s@TIME] [-n COUNT] [--json]
    mqcore get STORE TOPIC PARTITION OFFSET [--json]
    mqcore query STORE [TOPIC] (--id MSG_ID | --unique-id UID | --key KEY | scan filters)
                 [--from TIME] [--to TIME] [-p N] [--limit N] [--max-scan N]
                 [--timeout S] [--cursor C] [--json] [--progress | --no-progress]
                 scan filters: --tag T, --where SQL92, --contains TEXT, --regex RE, --from, --to
    mqcore topics STORE [--all] [--json]
    mqcore groups STORE [GROUP] [--json]
    mqcore stats STORE [TOPIC] [--json] [--progress | --no-progress]
    mqcore dump FILE.log|.index|.timeindex|.keyindex [--records] [--index] [--json]
    mqcore verify STORE [TOPIC ...] [--deep] [--repair [--truncate]] [--json] [--progress]
    mqcore trace STORE UNIQUE_ID [--json]
    mqcore compact STORE TOPIC [--now TIME] [--json] [--progress | --no-progress]
    mqcore retention STORE [TOPIC] [--now TIME] [--json] [--progress | --no-progress]
    mqcore serve STORE [--listen HOST:PORT] [--http HOST:PORT] [--advertised-host HOST]
                 [--flush POLICY] [--partitions N] [--no-auto-create] [--tls-cert PEM
                 --tls-key PEM [--tls-ca PEM]] [--sasl-credentials FILE [--acl FILE]]
    mqcore console STORE [--http HOST:PORT] [--allow-write] [--auth-credentials FILE
                   [--acl FILE]] [--tls-cert PEM --tls-key PEM]
    mqcore server-user add FILE USER [--password-stdin] [--iterations N]
    mqcore server-user remove FILE USER
    mqcore cluster status --coordinator zk://HOST:PORT/PATH [--under-replicated] [--json]
    mqcore cluster elect-leaders --coordinator zk://HOST:PORT/PATH [--topic T [--partition P]]
    mqcore cluster create-topic --coordinator zk://HOST:PORT/PATH TOPIC --partitions N
                                --replication-factor R [--config NAME=VALUE ...]

The commands that read (consume, get, query, topics, groups, stats, trace, console without
--allow-write, and verify without --repair) open the store read-only: no lock is taken and
nothing is written, so they are safe beside a running writer. Those that change files
(produce, verify --repair, compact, retention) take the writer lock and fail with
StoreLockedError while another process holds it, saying what to do instead (docs/operations.md
"What each command needs"); `serve` holds it while it runs. A path that is not a store is
refused with NotAStoreError and nothing is created (only produce makes a store).

`--json` prints one JSON object per line; bytes that are not UTF-8 appear as {"base64": "..."}
there (kcat's \\xNN escapes in `consume --json`, which writes kcat -J
envelopes) and as \\xNN in text. Errors print one line, `mqcore: error: ...`, to stderr and
exit with status 1 (any other exception too: a bug is reported as `unexpected <type>: ...`, never
as a traceback); usage errors print the usage and one error line, and exit with status 2.
`config` reads like the others; changing a setting takes the writer lock, like `produce`.
Warnings (a time bound that looks like seconds, say) print one line, `mqcore: warning: ...`,
and the command goes on.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import mqcore
from mqcore.cli import (
    cluster,
    config,
    console,
    dump,
    groups,
    hints,
    maintenance,
    produce,
    query,
    reading,
    serve,
    stats,
    trace,
    users,
    verify,
)
from mqcore.cli.options import Parser, UsageError, warnings_as_lines
from mqcore.errors import MQCoreError, UnknownTopicError

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
    except SystemExit as e:  # --help, --version and usage errors: keep main() callable in-process
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    if extras:
        return _unrecognized(args.parser, extras)
    try:
        with warnings_as_lines():
            return int(args.run(args, sys.stdout))
    except UsageError as e:
        args.parser.print_usage(sys.stderr)
        print(f"{args.parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `mqcore consume ... | head`: the reader went away; stop quietly like other Unix tools
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except UnknownTopicError as e:
        hint = hints.topic_hint(args)
        print(f"mqcore: error: {_one_line(str(e))}{'; ' + hint if hint else ''}", file=sys.stderr)
        return 1
    except (MQCoreError, OSError) as e:
        print(f"mqcore: error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a bug must still end in one line, not a traceback
        print(f"mqcore: error: unexpected {type(e).__name__}: {_one_line(str(e))}", file=sys.stderr)
        return 1


def _unrecognized(command: argparse.ArgumentParser, extras: list[str]) -> int:
    """Options the command does not have: its own usage (not mqcore's), the error, and a
    "did you mean" line when one of them is close to one it has; exit status 2."""
    command.print_usage(sys.stderr)
    print(f"{command.prog}: error: unrecognized arguments: {' '.join(extras)}", file=sys.stderr)
    hint = hints.option_hint(command, extras)
    if hint:
        print(f"{command.prog}: {hint}", file=sys.stderr)
    return 2


def _one_line(text: str) -> str:
    """An error message on one line: line breaks inside it become spaces."""
    return " ".join(text.splitlines())


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mqcore",
        description="Write, read, query and inspect an mqcore store (or a Kafka log "
        "directory). Reading commands are safe beside a running writer; `produce`, "
        "`verify --repair`, `compact` and `retention` need the writer lock.",
    )
    parser.add_argument("--version", action="version", version=f"mqcore {mqcore.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    produce.add_parsers(sub)
    config.add_parsers(sub)
    reading.add_parsers(sub)
    query.add_parsers(sub)
    stats.add_parsers(sub)
    dump.add_parsers(sub)
    verify.add_parsers(sub)
    groups.add_parsers(sub)
    trace.add_parsers(sub)
    maintenance.add_parsers(sub)
    serve.add_parsers(sub)
    console.add_parsers(sub)
    users.add_parsers(sub)
    cluster.add_parsers(sub)
    for command in sub.choices.values():
        command.set_defaults(parser=command)  # for usage errors a command finds late
    return parser


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
