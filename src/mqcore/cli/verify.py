"""`mqcore verify`: check every segment of a store, and with --repair fix what can be fixed.

Checks per partition: each .log batch by batch (length, CRC-32C, offsets going forward, with
--deep every record decoded), segments in offset order without overlap, every .index and
.timeindex entry against the batches it names (monotonic, pointing at a batch start), every
.keyindex's header and chains and each of its entries against the batches of its log, and
files a segment swap left behind. The checks are the ones `mqcore dump` prints (cli/dump.py's
Dumper), run quietly over the whole store.

--repair never guesses. Derived files (indexes) found damaged are deleted and rebuilt by a full
recovery of the store (the same code an unclean open runs), which also cuts a torn tail; damage
with whole batches after it is left alone unless --truncate says to cut the log there, and every
offset dropped is listed. The store's writer lock is held throughout, so no writer runs beside.

Without --repair nothing is locked or written, so it runs beside a live writer (docs/operations.md
"Verifying beside a running writer"): then it checks every sealed segment and skips what the
writer is changing: each partition's active (last) segment, swap leftovers (the writer's
compaction in flight), and any segment whose files the writer replaced or deleted during the
check (compaction, retention). A store whose writer is still recovering it is refused.
"""

from __future__ import annotations

import argparse
import io
import os
from array import array
from dataclasses import dataclass, field
from typing import Any, TextIO

from mqcore._ext.batch import peek_batch_header
from mqcore.cli import render
from mqcore.cli.dump import Dumper, LogFacts, mapped
from mqcore.cli.options import add_json, add_progress, progress_enabled
from mqcore.errors import (
    CorruptIndexError,
    CorruptRecordError,
    MQCoreError,
    StoreError,
    StoreLockedError,
)
from mqcore.storage.logdir import (
    LogDirectory,
)

LEFTOVER_SUFFIXES = (".cleaned", ".swap", ".deleted", ".tmp")
DERIVED = {".index": "index", ".timeindex": "timeindex", ".keyindex": "keyindex"}


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check every segment of a store (CRC, offsets, indexes); --repair fixes",
        description="Check every segment of a store: batch lengths and CRCs, offsets in order "
        "within and across segments, .index/.timeindex entries against their batches, "
        ".keyindex headers, chains and entries, leftovers of an interrupted segment swap. "
        "Problems are listed per file and the exit status is 1. --repair deletes damaged "
        "index files and runs a full recovery (indexes rebuilt, a torn tail cut); damage "
        "followed by good batches is only cut with --truncate, which lists what it drops. "
        "Without --repair it writes nothing and runs beside a live writer (checking the sealed "
        "segments, not the active ones it is appending to); --repair takes the writer lock.",
    )
    p.add_argument("store", metavar="STORE", help="store directory (or Kafka log directory)")
    p.add_argument("topics", metavar="TOPIC", nargs="*", help="only these topics")
    p.add_argument("--deep", action="store_true", help="also decode every record of every batch")
    p.add_argument(
        "--repair",
        action="store_true",
        help="rebuild derived files; cut a torn tail or a power-loss hole past the last flush",
    )
    p.add_argument(
        "--truncate",
        action="store_true",
        help="with --repair: cut a partition at damage that has good batches after it "
        "(drops every offset from there on, and says which)",
    )
    add_json(p, "objects typed problem, repair, partition and summary")
    add_progress(p)
    p.set_defaults(run=cmd_verify)


@dataclass
class Problem:
    path: str
    position: int
    kind: str  # log, segments, index, timeindex, keyindex, leftover
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "problem", "path": self.path, "position": self.position,
                "kind": self.kind, "reason": self.reason}  # fmt: skip


@dataclass
class PartitionCheck:
    topic: str
    partition: int
    directory: str
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    first_offset: int = -1
    end_offset: int = 0
    problems: list[Problem] = field(default_factory=list)
    log_damage: bool = False
    claimed_end: int = 0  # 1 + the last offset any batch header claims, damaged ones too
    skipped: int = 0  # segments a live writer was changing (not checked)


def _quiet() -> TextIO:
    """Where the Dumper's lines go when verify only wants its findings."""
    return open(os.devnull, "w")  # noqa: SIM115 - closed by the caller's with


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    if args.truncate and not args.repair:
        from mqcore.cli.options import UsageError

        raise UsageError("--truncate only goes with --repair")
    if not args.repair:
        directory = LogDirectory(args.store, writable=False)  # no lock, nothing written
        state = directory.writer_state()
        if state == "opening":
            raise StoreError(
                f"{directory.path} is being recovered by its writer "
                f"({directory.lock_holder()}); verify it once that open finished"
            )
        checks = _verify_store(directory, args, out, live=state == "open")
        return 1 if any(c.problems for c in checks) else 0
    try:
        directory = LogDirectory(args.store, writable=True, create=False)
    except StoreLockedError as e:
        raise StoreLockedError(
            f"verify --repair needs the writer lock of {e.path}, which another process holds "
            f"({e.holder}): stop that writer first (verify without --repair checks the store "
            "beside it)",
            e.path,
            e.holder,
        ) from None
    try:
        checks = _verify_store(directory, args, out, live=False)
        if any(c.problems for c in checks):
            _repair(directory, checks, args, out)
            checks = _verify_store(directory, args, io.StringIO(), live=False)
            _summary(out, args.json, checks, "after repair")
        return 1 if any(c.problems for c in checks) else 0
    finally:
        directory.release()


def _partition_dirs(directory: LogDirectory, topics: list[str]) -> list[tuple[str, int, str]]:
    try:
        configs = directory.load_topics()
    except (MQCoreError, ValueError) as e:
        raise StoreError(f"cannot list the topics of {directory.path}: {e}") from None
    wanted = set(topics) if topics else set(configs)
    missing = wanted - set(configs)
    if missing:
        raise StoreError(f"no topic {', '.join(sorted(missing))} in {directory.path}")
    return [
        (t, p, directory.partition_dir(t, p))
        for t in sorted(wanted)
        for p in range(configs[t].partitions)
        if os.path.isdir(directory.partition_dir(t, p))
    ]


def _verify_store(
    directory: LogDirectory, args: argparse.Namespace, out: TextIO, live: bool
) -> list[Any]:
    parts = _partition_dirs(directory, args.topics)
    total = sum(_log_bytes(d) for _, _, d in parts)
    bar = render.Progress("verify", total, progress_enabled(args))
    checks, done = [], 0
    try:
        for topic, p, d in parts:
            check = _verify_partition(topic, p, d, args.deep, bar, done, live)
            done += check.bytes
            checks.append(check)
            for problem in check.problems:
                _emit(out, args.json, problem.to_json(),
                      f"PROBLEM {problem.kind} {problem.path}@{problem.position}: "
                      f"{problem.reason}")  # fmt: skip
    finally:
        bar.close(complete=True)
    _summary(out, args.json, checks, "", live)
    return checks


def _log_bytes(d: str) -> int:
    total = 0
    for n in os.listdir(d) if os.path.isdir(d) else ():
        if n.endswith(".log"):
            try:
                total += os.path.getsize(os.path.join(d, n))
            except FileNotFoundError:
                pass  # deleted by a live writer's retention meanwhile
    return total


def _segment_stems(d: str) -> list[str]:
    stems = [n[:-4] for n in os.listdir(d) if n.endswith(".log") and n[:-4].isdigit()]
    return [os.path.join(d, s) for s in sorted(stems, key=int)]


def _verify_partition(
    topic: str, p: int, d: str, deep: bool, bar: Any, done: int, live: bool
) -> Any:
    """Every segment of one partition; beside a `live` writer, only its sealed segments whose
    files stayed the same from before their check to after it."""
    check = PartitionCheck(topic, p, d)
    for name in [] if live else sorted(os.listdir(d)):
        if name.endswith(LEFTOVER_SUFFIXES):
            check.problems.append(Problem(os.path.join(d, name), 0, "leftover",
                                          "left by an interrupted segment swap or index "
                                          "write; the next open finishes or drops it"))  # fmt: skip
    stems = _segment_stems(d)
    if live and stems:
        stems.pop()  # the active segment: the writer is appending to it
        check.skipped += 1
    prev_last = -1
    for i, stem in enumerate(stems):
        before = _fingerprint(stem) if live else None
        try:
            seg = PartitionCheck(topic, p, d)
            facts = _verify_segment(seg, stem, deep, prev_last, last=i == len(stems) - 1)
        except (OSError, MQCoreError, ValueError):
            if not live:
                raise
            facts = None
        if live and (facts is None or _fingerprint(stem) != before or _swapping(d)):
            # replaced or deleted by the writer while we read it, or a compaction's swap was
            # under way (it renames the indexes in before the .log: they would not match)
            check.skipped += 1
            continue
        assert facts is not None
        check.segments += 1
        check.bytes += facts.size
        check.batches += len(facts.at_position)
        bar.update(done + check.bytes, check.batches)
        check.log_damage = check.log_damage or seg.log_damage
        check.claimed_end = max(check.claimed_end, seg.claimed_end)
        check.problems += seg.problems
        if facts.at_position:
            prev_last = max(prev_last, facts.last_offset)
            if check.first_offset < 0:
                check.first_offset = min(facts.first_at.values())
    check.end_offset = prev_last + 1 if prev_last >= 0 else 0
    check.claimed_end = max(check.claimed_end, check.end_offset)
    return check


def _verify_segment(
    check: PartitionCheck, stem: str, deep: bool, prev_last: int, last: bool
) -> LogFacts:
    """One segment's log, its place among the others and its derived files; problems go to
    `check`."""
    base = int(os.path.basename(stem))
    with _quiet() as sink:
        dumper = Dumper(sink, False, deep, False, base)
        facts = dumper.log(stem + ".log")
    _segment_order(check, stem, base, facts, prev_last, last)
    check.log_damage = bool(dumper.damage)
    check.claimed_end = _claimed_end(stem + ".log", dumper.damage)
    check.problems += [Problem(path, pos, "log", why) for path, pos, why in dumper.damage]
    _derived(check, stem, base, facts)
    return facts


def _swapping(d: str) -> bool:
    """Whether a segment swap is under way in partition directory `d` (its files are there)."""
    try:
        return any(n.endswith(LEFTOVER_SUFFIXES) for n in os.listdir(d))
    except FileNotFoundError:
        return True


def _fingerprint(stem: str) -> list[tuple[int, int, int] | None]:
    """Identity, size and mtime of a segment's files: a live writer's compaction replaces them,
    its retention deletes them."""
    out: list[tuple[int, int, int] | None] = []
    for suffix in (".log", ".index", ".timeindex", ".keyindex"):
        try:
            st = os.stat(stem + suffix)
        except FileNotFoundError:
            out.append(None)
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return out


def _claimed_end(log: str, damage: list[tuple[str, int, str]]) -> int:
    """1 + the last offset the headers of damaged batches claim (what a cut there drops)."""
    end = 0
    with mapped(log) as view:
        for _, position, _ in damage:
            head = peek_batch_header(view, position)
            if head is not None:
                end = max(end, head.last_offset + 1)
    return end


def _segment_order(check: PartitionCheck, stem: str, base: int, facts: LogFacts,
                   prev_last: int, last: bool) -> None:  # fmt: skip
    path = stem + ".log"
    if facts.first_at:
        first = min(facts.first_at.values())
        if first < base:
            check.problems.append(Problem(path, 0, "segments",
                                          f"first batch starts at offset {first}, below the "
                                          f"segment's base offset {base}"))  # fmt: skip
        if base <= prev_last:
            check.problems.append(Problem(path, 0, "segments",
                                          f"base offset {base} overlaps the previous segment, "
                                          f"which ends at offset {prev_last}"))  # fmt: skip
    elif not last and facts.size == 0:
        check.problems.append(Problem(path, 0, "segments", "an empty segment before the last"))


def _derived(check: PartitionCheck, stem: str, base: int, facts: LogFacts) -> None:
    """Index files against the log's batches; a missing one is a problem (--repair rebuilds)."""
    with _quiet() as sink:
        dumper = Dumper(sink, False, False, False, base)
        for suffix, read in ((".index", dumper.offset_index), (".timeindex", dumper.time_index)):
            if not os.path.exists(stem + suffix):
                check.problems.append(Problem(stem + suffix, 0, DERIVED[suffix], "missing"))
                continue
            try:
                read(stem + suffix, facts, sibling=True)
            except (MQCoreError, ValueError) as e:
                check.problems.append(Problem(stem + suffix, 0, DERIVED[suffix], str(e)))
    for path, pos, why in dumper.damage:
        check.problems.append(Problem(path, pos, DERIVED[os.path.splitext(path)[1]], why))
    if os.path.exists(stem + ".keyindex"):
        _keyindex(check, stem + ".keyindex", base, facts)


def _keyindex(check: PartitionCheck, path: str, base: int, facts: LogFacts) -> None:
    """Header, content CRC, every chain, and (when it covers the whole log) every entry
    against the batches."""
    from mqcore._ext.keyindex import KeyTable

    def problem(why: str) -> None:
        check.problems.append(Problem(path, 0, "keyindex", why))

    with mapped(path) as view:
        try:
            table = KeyTable(view, False)
        except CorruptIndexError as e:
            problem(str(e))
            return
        try:
            if table.covered_position != facts.size:
                problem(f"stale: covers {table.covered_position} of the log's {facts.size} bytes")
                return
            if not table.complete:
                problem("not sealed: its writer did not close it (an open rebuilds it)")
            elif not table.content_valid():
                problem("not what was sealed: its content CRC or a chain's head does not match")
            chains = table.chain_problem()
            if chains is not None:
                problem(f"hash chains: {chains}")
                return
            order = sorted(facts.at_position)
            starts = array("q", order)
            first = array("q", [facts.first_at[s] - base for s in order])
            last = array("q", [facts.at_position[s] - base for s in order])
            bad = table.first_unresolved(starts, first, last)
        finally:
            table.release()
    if bad is not None:
        kind, i, rel, pos = bad
        check.problems.append(Problem(path, 0, "keyindex",
                                      f"{kind} entry {i} (offset {base + rel}, position {pos}) "
                                      "does not point into a batch of the log"))  # fmt: skip


def _summary(
    out: TextIO, as_json: bool, checks: list[PartitionCheck], when: str, live: bool = False
) -> None:
    problems = sum(len(c.problems) for c in checks)
    skipped = sum(c.skipped for c in checks)
    files = len({p.path for c in checks for p in c.problems})
    doc: dict[str, Any] = {
        "type": "summary",
        "when": when or "check",
        "partitions": len(checks),
        "segments": sum(c.segments for c in checks),
        "batches": sum(c.batches for c in checks),
        "bytes": sum(c.bytes for c in checks),
        "problems": problems,
        "files_with_problems": files,
        "live_writer": live,
        "skipped_segments": skipped,
    }
    head = f"{when}: " if when else ""
    if live:
        head += (f"beside a live writer, {render.plural(skipped, 'active or changing segment')} "
                 "skipped; ")  # fmt: skip
    _emit(out, as_json, doc,
          f"{head}{render.plural(doc['partitions'], 'partition')}, "
          f"{render.plural(doc['segments'], 'segment')}, {render.plural(doc['batches'], 'batch')}"
          f", {render.human_bytes(doc['bytes'])} checked: "
          + (f"{render.plural(problems, 'problem')} in {render.plural(files, 'file')}"
             if problems else "no problems"))  # fmt: skip


def _emit(out: TextIO, as_json: bool, obj: dict[str, Any], line: str) -> None:
    if as_json:
        render.emit(out, obj)
    else:
        out.write(line + "\n")


# -- repair -----------------------------------------------------------------------------------


def _repair(directory: LogDirectory, checks: list[PartitionCheck], args: argparse.Namespace,
            out: TextIO) -> None:  # fmt: skip
    """Delete damaged derived files, then a full recovery (every segment scanned, every missing
    index rebuilt, a torn tail cut); where recovery refuses damage that has good batches after
    it, --truncate cuts the log there and recovery runs again."""
    for check in checks:
        for problem in check.problems:
            if problem.kind in ("index", "timeindex", "keyindex") and os.path.exists(problem.path):
                os.unlink(problem.path)
                _said(out, args.json, problem.path, "deleted (rebuilt by recovery)")
    directory.release()
    try:
        for _ in range(1 + sum(1 for c in checks if c.log_damage) if args.truncate else 1):
            refused = _recover(directory.path, checks, out, args.json)
            if refused is None:
                return
            if not args.truncate:
                _said(out, args.json, refused.path or directory.path,
                      f"not repaired: {refused}; `--repair --truncate` cuts the partition at "
                      "this position, dropping every offset after it")  # fmt: skip
                return
            _cut(checks, refused, out, args.json)
    finally:
        directory.acquire_lock()


def _cut(checks: list[PartitionCheck], err: CorruptRecordError, out: TextIO, as_json: bool) -> None:
    """Cut the log at the damage recovery refused; later segments go too (all said)."""
    path, position = err.path or "", err.position or 0
    check = next(c for c in checks if os.path.dirname(path) == c.directory)
    with mapped(path) as view:
        head = peek_batch_header(view, position)
    first_lost = f"{head.base_offset}" if head is not None else "the damaged batch"
    with open(path, "r+b") as f:
        f.truncate(position)
    for stem in _segment_stems(check.directory):
        if int(os.path.basename(stem)) > int(os.path.basename(path)[:-4]):
            for suffix in (".log", ".index", ".timeindex", ".keyindex"):
                if os.path.exists(stem + suffix):
                    os.unlink(stem + suffix)
    _said(out, as_json, path,
          f"cut at position {position}: offsets {first_lost} to {check.claimed_end - 1} of "
          f"{check.topic}-{check.partition} dropped (--truncate)")  # fmt: skip


def _recover(path: str, checks: list[PartitionCheck], out: TextIO,
             as_json: bool) -> CorruptRecordError | None:  # fmt: skip
    """Open the store for writing (a full recovery) and say what it cut; the error when
    recovery refuses damage with good data after it."""
    import mqcore

    try:
        # every segment scanned; the recovery checkpoint stays, so only bytes past the last
        # flush may be read as a power-loss hole (deleting it let a zeroed page in flushed data
        # pass for one, and recovery cut every batch after it)
        store = mqcore.open(path, flush="os", create=False, full_recovery=True)
    except CorruptRecordError as e:
        return e
    with store:
        for (topic, p), report in sorted(store.recovery.items()):
            if report.truncated_bytes or report.deleted_segments:
                end = store.end_offset(topic, p)
                was = next((c.claimed_end for c in checks if (c.topic, c.partition) == (topic, p)),
                           end)  # fmt: skip
                dropped = f"offsets {end} to {was - 1}" if was > end else "a partial batch header"
                what = (
                    "an unflushed tail after a power-loss hole" if report.unflushed_holes
                    else "torn tail"
                )  # fmt: skip
                _said(out, as_json, f"{topic}-{p}",
                      f"recovery cut {report.truncated_bytes} bytes of {what} "
                      f"({dropped} dropped)")  # fmt: skip
    return None


def _said(out: TextIO, as_json: bool, path: str, what: str) -> None:
    _emit(out, as_json, {"type": "repair", "path": path, "action": what},
          f"REPAIR {path}: {what}")  # fmt: skip
