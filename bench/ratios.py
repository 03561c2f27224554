"""Turn pytest-benchmark JSON files into throughputs and the issue's target ratios.

    .venv/bin/python bench/ratios.py .benchmarks/bench.json [more runs.json ...] [--markdown]

Each benchmark's `extra_info` says what one round moves (`bytes`, `messages`, `ops`); dividing by
the round's median time gives MB/s, msgs/s and ops/s. A ratio compares the work per second of two
cases (work = ops, else messages), so a ratio above 1 means the first case is faster. Ratios use
each run's median round; with several runs (files) the ratio of every run is shown and the
verdict uses their median, since one run on a shared 2-core VM can be disturbed by other work.
Throughputs are the median over the runs of each run's median round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    label: str
    case: str
    baseline: str
    goal: float | None = None  # the ratio the issue asks for, if any
    strict: bool = False  # the ratio must exceed the goal ("faster than"), not just reach it

    def goal_text(self) -> str:
        if self.goal is None:
            return ""
        return f"{'>' if self.strict else '>='} {self.goal:.3g}"

    def met(self, ratio: float) -> bool:
        assert self.goal is not None
        return ratio > self.goal if self.strict else ratio >= self.goal


TARGETS = [
    Target(
        "append 1 KiB x1000, flush=os vs raw write()",
        "append/1KiB/mqcore-os",
        "append/1KiB/raw-write",
        0.8,
    ),
    Target(
        "append 1 KiB x1000, plain topic (no IDs, no key index), flush=os vs raw write()",
        "append/1KiB/mqcore-os-plain",
        "append/1KiB/raw-write-plain",
        0.8,
    ),
    Target(
        "append 1 KiB x1000, plain topic, flush=os vs raw write() into reserved space",
        "append/1KiB/mqcore-os-plain",
        "append/1KiB/raw-write-plain-reserved",
    ),
    Target(
        "append 100 B x1000, plain topic, flush=os vs raw write()",
        "append/100B/mqcore-os-plain",
        "append/100B/raw-write-plain",
        0.8,  # issue 20
    ),
    Target(
        "append 1 KiB x1000, flush=interval vs raw write()",
        "append/1KiB/mqcore-interval",
        "append/1KiB/raw-write",
    ),
    Target(
        "append 100 B x1000, flush=os vs raw write()",
        "append/100B/mqcore-os",
        "append/100B/raw-write",
        0.5,  # issue 20
    ),
    Target(
        "append 100 B x1000, flush=interval vs raw write()",
        "append/100B/mqcore-interval",
        "append/100B/raw-write",
    ),
    Target(
        "append 1 KiB x1000, flush=os vs SQLite tx",
        "append/1KiB/mqcore-os",
        "append/1KiB/sqlite-tx",
    ),
    Target(
        "append 100 B x1000, flush=os vs SQLite tx",
        "append/100B/mqcore-os",
        "append/100B/sqlite-tx",
    ),
    Target(
        "open new store + create_topic + close vs SQLite create + table + close",
        "lifecycle/create/mqcore",
        "lifecycle/create/sqlite",
        0.5,
    ),
    Target(
        "open new store + create_topic + one append + close vs SQLite, one INSERT",
        "lifecycle/append/mqcore",
        "lifecycle/append/sqlite",
        0.5,
    ),
    Target("encode 1000 x 100 B vs kafka-python", "encode/mqcore", "encode/kafka-python", 50),
    Target("decode 1000 x 100 B vs kafka-python", "decode/mqcore", "decode/kafka-python", 50),
    Target("decode to Arrow vs kafka-python decode", "decode/mqcore-arrow", "decode/kafka-python"),
    Target(
        "get, batches of 100, vs SQLite PK",
        "get/batch100/mqcore",
        "get/batch100/sqlite",
        1,
        strict=True,
    ),
    Target(
        "get, batches of 1000, vs SQLite PK",
        "get/batch1000/mqcore",
        "get/batch1000/sqlite",
        1,
        strict=True,
    ),
    Target(
        "offset_for_time, batches of 100, vs SQLite ts index",
        "time/batch100/mqcore",
        "time/batch100/sqlite-ts-index",
    ),
    Target(
        "offset_for_time, batches of 100, vs SQLite min(id)",
        "time/batch100/mqcore",
        "time/batch100/sqlite-min-id",
    ),
    Target(
        "offset_for_time, batches of 1000, vs SQLite ts index",
        "time/batch1000/mqcore",
        "time/batch1000/sqlite-ts-index",
    ),
    Target(
        "single append, flush=os vs SQLite autocommit sync=OFF",
        "single/os/mqcore",
        "single/os/sqlite",
    ),
    Target(
        "single append, flush=always vs SQLite autocommit sync=FULL",
        "single/always/mqcore",
        "single/always/sqlite",
    ),
    Target("find_by_key vs SQLite key index", "find-by-key/mqcore", "find-by-key/sqlite", 3),
    # cold: the first lookups in their batches after opening (fresh handle, fresh connection)
    Target(
        "first get in a batch after opening, batches of 100, vs SQLite (cold)",
        "get-cold/batch100/mqcore",
        "get-cold/batch100/sqlite",
        1.5,
    ),
    Target(
        "first get in a batch after opening, batches of 1000, vs SQLite (cold)",
        "get-cold/batch1000/mqcore",
        "get-cold/batch1000/sqlite",
        1.5,
    ),
    Target(
        "first find_by_key after opening vs SQLite key index (cold)",
        "find-by-key-cold/mqcore",
        "find-by-key-cold/sqlite",
        1.5,
    ),
    Target(
        "first get_by_id after opening vs SQLite PK (cold)",
        "get-by-id-cold/mqcore",
        "get-by-id-cold/sqlite",
        1.5,
    ),
    Target("get_by_id vs SQLite PK", "get-by-id/mqcore", "get-by-id/sqlite", 3),
    Target(
        "search contains, 200 B lines, vs Python loop over read()",
        "search/200B/mqcore",
        "search/200B/python-read",
        10,
    ),
    Target(
        "search contains, 1 KiB values, vs Python loop over read()",
        "search/1KiB/mqcore",
        "search/1KiB/python-read",
        10,
    ),
    Target(
        "search contains, 200 B lines, vs SQLite instr()",
        "search/200B/mqcore",
        "search/200B/sqlite-instr",
    ),
    Target(
        "search contains, 1 KiB values, vs SQLite instr()",
        "search/1KiB/mqcore",
        "search/1KiB/sqlite-instr",
    ),
    Target("consume: poll loop vs Store.read() loop", "consume/poll", "consume/read"),
    Target(
        "share group: 4 members on one partition vs one consumer-group member (commit per 100)",
        "share/4-members",
        "share/classic",
        0.5,
    ),
    Target(
        "share group: 4 members, an acknowledge() per record, vs one consumer-group member",
        "share/4-members-explicit",
        "share/classic",
    ),
    Target("share group: 1 member vs one consumer-group member", "share/1-member", "share/classic"),
    Target(
        "consume: poll with tag filter (25 %) vs Python tag check over read()",
        "consume/poll-tag",
        "consume/read-python-tag",
    ),
    Target(
        "consume: poll with tag filter (0.1 %) vs Python tag check over read()",
        "consume/poll-tag-sparse",
        "consume/read-python-tag",
    ),
    Target(
        "consume: poll with SQL92 filter (25 %) vs Python selector over read()",
        "consume/poll-sql",
        "consume/read-python-sql",
        10.0,
    ),
    Target("consume: poll with tag filter vs poll without", "consume/poll-tag", "consume/poll"),
    Target(
        "consume: poll with SQL92 filter vs poll without",
        "consume/poll-sql",
        "consume/poll",
        0.5,
    ),
    # issue 20: the selector kernel (scan_records runs the compiled program) against the Python
    # evaluator on the same messages: search() with `where` vs a read() loop testing each one
    Target(
        "selector kernel vs Python evaluator: search(where=) vs Python selector over read()",
        "consume/search-sql",
        "consume/read-python-sql",
    ),
    Target(
        "selector kernel vs Python evaluator, 3 predicates: poll vs Python over read()",
        "consume/poll-sql3",
        "consume/read-python-sql3",
    ),
    # Spark: "<= 1.5x Parquet's time" is a work/s ratio of at least 1 / 1.5
    Target(
        "Spark count, 2M msgs: mqcore vs Parquet (time <= 1.5x)",
        "spark/count/mqcore",
        "spark/count/parquet",
        1 / 1.5,
    ),
    Target(
        "Spark filter, 2M msgs: mqcore vs Parquet (time <= 1.5x)",
        "spark/filter/mqcore",
        "spark/filter/parquet",
        1 / 1.5,
    ),
    Target(
        "Spark filter + group-by, 600k msgs in 4 partitions: mqcore vs Parquet (time <= 1.5x)",
        "spark/filter-groupby-600k/mqcore",
        "spark/filter-groupby-600k/parquet",
        1 / 1.5,
    ),
    Target(
        "Spark count, 2M msgs: mqcore vs row-yielding Python source",
        "spark/count/mqcore",
        "spark/count/rows",
        5,
    ),
    Target(
        "Spark filter, 2M msgs: mqcore vs row-yielding Python source",
        "spark/filter/mqcore",
        "spark/filter/rows",
        5,
    ),
    Target(
        "Spark count: mqcore vs the Python source API floor (Arrow in memory) (time <= 1.3x)",
        "spark/count/mqcore",
        "spark/count/arrow-floor",
        1 / 1.3,
    ),
    Target(
        "Spark count: the Python source API floor vs Parquet",
        "spark/count/arrow-floor",
        "spark/count/parquet",
    ),
    Target(
        "Spark filter: mqcore vs the Python source API floor (Arrow in memory)",
        "spark/filter/mqcore",
        "spark/filter/arrow-floor",
    ),
    Target(
        "Spark filter: the Python source API floor vs Parquet (time <= 1.5x)",
        "spark/filter/arrow-floor",
        "spark/filter/parquet",
        1 / 1.5,
    ),
    Target(
        "Spark filter + group-by 600k: mqcore vs the Python source API floor",
        "spark/filter-groupby-600k/mqcore",
        "spark/filter-groupby-600k/arrow-floor",
    ),
    Target(
        "Spark filter + group-by 600k: the Python source API floor vs Parquet (time <= 1.5x)",
        "spark/filter-groupby-600k/arrow-floor",
        "spark/filter-groupby-600k/parquet",
        1 / 1.5,
    ),
    Target("Spark key = X: mqcore (key index) vs Parquet", "spark/key/mqcore", "spark/key/parquet"),
    Target(
        "cluster: acks=all produce 1 KiB, replication factor 3 vs 1 on the same three brokers",
        "cluster/produce/1KiB/rf3-acks-all",
        "cluster/produce/1KiB/rf1-acks-all",
        0.5,
    ),
    Target(
        "mqcore serve: wire produce 1 KiB vs in-process append_batch",
        "server/produce/1KiB/wire",
        "server/produce/1KiB/append_batch",
        0.5,
    ),
    Target(
        "mqcore serve: raw-protocol produce 1 KiB (a client costing next to nothing) vs "
        "in-process append_batch",
        "server/produce/1KiB/raw-protocol",
        "server/produce/1KiB/append_batch",
        0.5,
    ),
    Target(
        "mqcore serve: raw-protocol produce 1 KiB vs in-process append_batch without IDs",
        "server/produce/1KiB/raw-protocol",
        "server/produce/1KiB/append_batch-no-ids",
    ),
    Target(
        "mqcore serve: the confluent producer's produce() calls alone vs in-process append_batch",
        "server/produce/1KiB/confluent-calls-alone",
        "server/produce/1KiB/append_batch",
    ),
    Target(
        "mqcore serve: wire produce 1 KiB vs the same without the store",
        "server/produce/1KiB/wire",
        "server/produce/1KiB/wire-not-appended",
    ),
    Target(
        "mqcore serve: produce beside 1,000 idle connections and a slow consumer vs alone",
        "server/produce/1KiB/wire-beside-idle-and-slow",
        "server/produce/1KiB/wire",
        0.8,
    ),
    # issue 22's goals are absolute (key < 100 ms, first page < 1 s: bench/README.md "Console");
    # these say what the console adds to the Store's own answer
    Target(
        "console: key lookup page over HTTP vs Store.find_by_key in process",
        "console-key/lookup-page",
        "console-key/store",
    ),
    Target(
        "console: the browser's key search (one rows call) over HTTP vs Store.find_by_key",
        "console-key/rows",
        "console-key/store",
    ),
    Target(
        "console: content scan, first page over HTTP in chunks vs Store.search in process",
        "console-scan/first-page",
        "console-scan/store",
    ),
]


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    median: float
    minimum: float
    nbytes: int
    messages: int
    ops: int

    def work(self) -> int:
        return self.ops or self.messages or self.nbytes


def load(path: str) -> dict[str, Case]:
    with open(path, encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    cases = {}
    for b in doc["benchmarks"]:
        info = b.get("extra_info", {})
        if "case" not in info:
            continue
        cases[info["case"]] = Case(
            info["case"],
            b.get("group") or "",
            b["stats"]["median"],
            b["stats"]["min"],
            info.get("bytes", 0),
            info.get("messages", 0),
            info.get("ops", 0),
        )
    return cases


def ratio(a: Case, b: Case) -> float:
    """Work per second of `a` over that of `b`, from their median rounds."""
    return (a.work() / a.median) / (b.work() / b.median)


def fmt_rate(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    if value >= 1e3:
        return f"{value / 1e3:.1f} k"
    return f"{value:.1f}"


def combined(runs: list[dict[str, Case]]) -> dict[str, Case]:
    """One Case per name whose median round is the median over the runs that have it."""
    out = {}
    for name in sorted({n for run in runs for n in run}):
        seen = [run[name] for run in runs if name in run]
        first = seen[0]
        out[name] = Case(
            name,
            first.group,
            statistics.median(c.median for c in seen),
            min(c.minimum for c in seen),
            first.nbytes,
            first.messages,
            first.ops,
        )
    return out


def throughput_rows(cases: dict[str, Case]) -> list[list[str]]:
    rows = []
    for c in sorted(cases.values(), key=lambda c: (c.group, c.name)):
        per = c.median
        rows.append(
            [
                c.group,
                c.name,
                f"{per * 1e3:.3f}",
                f"{c.nbytes / per / 1e6:.0f}" if c.nbytes else "",
                fmt_rate(c.messages / per) if c.messages else "",
                fmt_rate(c.ops / per) if c.ops else "",
            ]
        )
    return rows


def target_rows(runs: list[dict[str, Case]]) -> list[list[str]]:
    rows = []
    for t in TARGETS:
        per_run = [
            ratio(run[t.case], run[t.baseline])
            for run in runs
            if t.case in run and t.baseline in run
        ]
        if not per_run:
            continue
        mid = statistics.median(per_run)
        verdict = "" if t.goal is None else ("met" if t.met(mid) else "MISSED")
        per = " / ".join(f"{r:.2f}" for r in per_run)
        rows.append([t.label, f"{mid:.2f}", per, t.goal_text(), verdict])
    return rows


def render(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="*", default=[".benchmarks/bench.json"])
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args(argv)
    runs = [load(path) for path in args.json]
    if not any(runs):
        print(f"no benchmarks with extra_info['case'] in {args.json}", file=sys.stderr)
        return 1
    headers = ["group", "case", "median ms/round", "MB/s", "msgs/s", "ops/s"]
    print(render(headers, throughput_rows(combined(runs)), args.markdown))
    print()
    headers = ["ratio (work/s, first / second)", "median", "per run", "target", "verdict"]
    print(render(headers, target_rows(runs), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
