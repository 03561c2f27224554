"""Transactional (half) messages, RocketMQ-style: parked in `__txn_half`, re-appended on commit.

Messages sent in a transaction go to the internal topic `__txn_half` with headers naming the
transaction and the real topic and partition (fixed at send time); no reader of the real topic
sees them. `commit()` writes a PREPARE op (the decision, with each target partition's end
offset), re-appends the half messages to their real partitions (one batch per partition, unique
IDs kept) and writes a COMMIT op; `rollback()` writes a ROLLBACK op. Ops live in `__txn_op`
(key = transaction id, value = JSON). A transaction with half messages and no COMMIT/ROLLBACK op
is unresolved: one with a PREPARE op is rolled forward (its real appends are skipped for unique
IDs already in the target partition), any other older than transaction_timeout_ms is checked
back with the registered checker (docs/consume.md).

Whatever the flush policy, the half messages and the PREPARE are fdatasync'd before the first
real append and the real appends before the COMMIT, so a power loss never commits twice, in
part, or loses a commit that returned. `trim()` deletes the prefix of both topics that no load
needs (trim.py); records that do not parse are skipped and reported (internal.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqcore.crashpoints import crash_point
from mqcore.errors import InvalidConfigError, InvalidRecordError, TransactionStateError
from mqcore.log.trace import TraceEvent
from mqcore.produce.delay import (
    H_PARTITION,
    H_TIMESTAMP,
    H_TOPIC,
    H_TXN,
    KEPT_UNTIL_RESOLVED,
    PendingMetadata,
    TxnDelayOptions,
    append_parked,
    background,
    check_rows,
    check_timestamp,
    durable_end,
    get_parked,
    int_header,
    is_offset,
    json_record,
    parked_headers,
    read_parked,
    read_target,
    repark_copies,
    report_skipped,
    state_record,
    trace_parked,
)
from mqcore.produce.relay import relay, scan
from mqcore.produce.sender import Outgoing, Sender, no_sequence
from mqcore.produce.trim import delete_below, segment_bases, trim_point
from mqcore.storage.retention import RetentionReport

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.log.append import BatchMetadata
    from mqcore.log.manager import Log
    from mqcore.log.trace import Tracer

_log = logging.getLogger("mqcore")

HALF_TOPIC = "__txn_half"
OP_TOPIC = "__txn_op"
HALF_HEADERS = (H_TXN, H_TOPIC, H_PARTITION, H_TIMESTAMP)
ANSWERS = ("commit", "rollback", "unknown")
OPS = ("prepare", "commit", "rollback", "unknown")


@dataclass(frozen=True)
class TransactionInfo:
    """What the check-back callback is asked about: an unresolved transaction."""

    transaction_id: str
    started: int  # ms timestamp of its first half message
    message_count: int
    targets: tuple[tuple[str, int], ...]  # (topic, partition) its messages go to
    unique_ids: tuple[str | None, ...]
    checks: int  # how many times it was answered "unknown" before


@dataclass
class _Txn:
    """Bookkeeping of one unresolved transaction (live in this process or found at open)."""

    tid: str
    offsets: list[int] = field(default_factory=list)  # where its half messages are now
    origins: list[int] = field(default_factory=list)  # where each was first parked (send order)
    uids: list[str | None] = field(default_factory=list)
    targets: dict[tuple[str, int], None] = field(default_factory=dict)  # ordered set
    started: int = -1
    checks: int = 0
    prepared: list[list[Any]] | None = None  # [[topic, partition, end offset]] of its PREPARE
    handle: Transaction | None = None
    op_offset: int = -1  # its newest op in __txn_op (-1: none yet)
    slots: dict[int, int] = field(default_factory=dict)  # origin -> index in the lists
    _first: int | None = None  # min(offsets), cached

    def note(self, offset: int, origin: int, uid: str | None, target: tuple[str, int],
             ts: int) -> None:  # fmt: skip
        """A half message at `offset`; a re-parked copy (same origin) replaces the earlier."""
        i = self.slots.get(origin)
        if i is None:
            self.slots[origin] = len(self.offsets)
            self.offsets.append(offset)
            self.origins.append(origin)
            self.uids.append(uid)
            if self._first is not None:
                self._first = min(self._first, offset)
        else:
            self.offsets[i] = offset
            self._first = None
        self.targets[target] = None
        if ts >= 0:
            self.started = ts if self.started < 0 else min(self.started, ts)

    def first(self) -> int:
        """The lowest offset of its half messages (call only when it has some)."""
        if self._first is None:
            self._first = min(self.offsets)
        return self._first

    def in_order(self) -> list[int]:
        """Offsets of its half messages in send order (the order the commit appends them)."""
        return [off for _origin, off in sorted(zip(self.origins, self.offsets, strict=True))]


@dataclass
class _Done:
    """A resolved transaction, kept while `__txn_op` holds its decision."""

    op_offset: int  # its commit or rollback op (-1: an empty transaction, no op)
    last_half: int  # its newest half message (-1: none seen)


def _read_op(m: Message) -> tuple[str, dict[str, Any]]:
    """(transaction id, fields) of a `__txn_op` record; ValueError says why it is not one."""
    d = json_record(m)
    try:
        tid = (m.key or b"").decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"the transaction id (key) is not UTF-8: {e}") from None
    if not tid:
        raise ValueError("no transaction id (key)")
    op = d.get("op")
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}")
    if not is_offset(d.get("low")):
        raise ValueError("no valid low")
    if op == "prepare":
        check_rows(d.get("targets"), (str, int, int), "targets")
    if op == "unknown" and not is_offset(d.get("checks")):
        raise ValueError("no valid checks")
    return tid, d


def _check_tid(tid: object) -> str:
    if tid is None:
        return uuid.uuid4().hex
    if not isinstance(tid, str) or not 0 < len(tid) <= 249 or not tid.isprintable():
        raise InvalidConfigError(
            f"transaction_id must be a printable str of 1..249 characters, not {tid!r}"
        )
    return tid


class Transaction(Sender[PendingMetadata, list[PendingMetadata], list[PendingMetadata]]):
    """Messages sent together and made visible together (or never). Use `store.begin()`;
    as a context manager it commits on a clean exit and rolls back on an exception.

    `append` and `append_batch` take the Store's arguments (sender.py) and send half messages,
    visible at commit: a PendingMetadata per message. Not delayed, no resend sequence; a
    batch's `compression` is its topic's at commit."""

    _action = "send transactional messages to"

    def __init__(self, manager: TransactionManager, tid: str):
        self._manager = manager
        self.log = manager.log
        self.transaction_id = tid
        self.state = "open"  # "committed" or "rolled_back" once resolved

    def _send_one(self, out: Outgoing) -> PendingMetadata:
        return self._send_batch(out)[0]

    def _send_batch(self, out: Outgoing) -> list[PendingMetadata]:
        return self._send_routed(out, {out.partition: list(range(len(out.values)))})

    def _send_routed(self, out: Outgoing, groups: dict[int, list[int]]) -> list[PendingMetadata]:
        """One half batch for all partitions, a PendingMetadata per message in send order."""
        no_sequence(self, out.sequence if out.sequences is None else min(out.sequences.values()))
        if out.compression is not None:
            raise InvalidRecordError(
                f"compression={out.compression!r}: a transaction's messages take their topic's "
                "compression when they are appended at commit"
            )
        parts = [0] * len(out.values)
        for p, idx in groups.items():
            for i in idx:
                parts[i] = p
        return self._manager.park(self, out, parts)

    def commit(self) -> list[BatchMetadata]:
        """Make every message visible; returns one BatchMetadata per target partition."""
        return self._manager.commit(self)

    def rollback(self) -> None:
        """Drop every message of the transaction (they never become visible)."""
        self._manager.rollback(self)

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state != "open":
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()


class TransactionManager:
    """Bookkeeping of a store's transactions: the ids resolved in `__txn_op` (replayed at
    first use) and the unresolved ones with the offsets of their half messages."""

    def __init__(self, log: Log, tracer: Tracer | None, options: TxnDelayOptions):
        self.log = log
        self.tracer = tracer
        self.options = options
        self.checker: Callable[[TransactionInfo], str] | None = None
        self._lock = threading.RLock()
        self._loaded = False
        self._open: dict[str, _Txn] = {}
        self._resolved: dict[str, _Done] = {}
        self._low_written = 0  # the `low` of the newest op: where a load reads __txn_half from
        self._last_op = -1  # offset of the newest op
        self._warned_no_checker = False

    # -- loading

    def _load(self) -> None:
        """Replay `__txn_op`, then read `__txn_half` from the last op's `low` watermark.
        Records that do not parse are skipped and reported (log/internal.py)."""
        if self._loaded:
            return
        log = self.log
        prepared: dict[str, list[list[Any]]] = {}
        checks: dict[str, int] = {}
        newest: dict[str, int] = {}  # tid -> offset of its newest op, while unresolved
        if log.has_topic(OP_TOPIC):
            for m in scan(log, OP_TOPIC, 0, 0):
                try:
                    tid, d = _read_op(m)
                except ValueError as e:
                    report_skipped(log, m, e)
                    continue
                self._low_written, self._last_op = d["low"], m.offset
                if d["op"] in ("commit", "rollback"):
                    self._resolved[tid] = _Done(m.offset, -1)
                    for pending in (prepared, checks, newest):
                        pending.pop(tid, None)
                    continue
                self._resolved.pop(tid, None)  # an id reused after its old decision was trimmed
                newest[tid] = m.offset
                if d["op"] == "prepare":
                    prepared[tid] = d["targets"]
                else:
                    checks[tid] = d["checks"]
        if log.has_topic(HALF_TOPIC):
            for m in scan(log, HALF_TOPIC, 0, self._low_written):
                try:
                    parked = read_target(log, m, HALF_HEADERS)
                except InvalidRecordError as e:
                    report_skipped(log, m, e)
                    continue
                assert parked.txn is not None
                done = self._resolved.get(parked.txn)
                if done is not None:
                    done.last_half = m.offset
                    continue
                rec = self._open.get(parked.txn)
                if rec is None:
                    rec = self._open[parked.txn] = _Txn(parked.txn)
                    rec.prepared = prepared.get(parked.txn)
                    rec.checks = checks.get(parked.txn, 0)
                    rec.op_offset = newest.get(parked.txn, -1)
                target = (parked.topic, parked.partition)
                rec.note(m.offset, parked.origin, m.unique_id, target, m.timestamp)
        self._loaded = True

    def _low(self) -> int:
        """Every half message below this offset belongs to a resolved transaction."""
        firsts = [r.first() for r in self._open.values() if r.offsets]
        if firsts:
            return min(firsts)
        log = self.log
        return log.partition(HALF_TOPIC, 0).end_offset if log.has_topic(HALF_TOPIC) else 0

    def _op(self, tid: str, op: str, **fields: Any) -> int:
        """Append an op; returns its offset. Its `low` never passes the durable end of
        `__txn_half`: were the op to reach the disk and the half messages below its low not,
        the next ones would get offsets below it and a load would never read them."""
        log = self.log
        topic = log.internal_topic(
            OP_TOPIC, unique_ids=False, key_index=True, **KEPT_UNTIL_RESOLVED
        )
        low = self._low()
        if log.has_topic(HALF_TOPIC):
            low = min(low, durable_end(log, HALF_TOPIC))
        md = log.append_records(topic, 0, [state_record(op=op, low=low, **fields)], [tid.encode()])
        self._low_written, self._last_op = low, md.base_offset
        return md.base_offset

    # -- the producer's side

    def begin(self, transaction_id: str | None) -> Transaction:
        self.log.check_writable()
        tid = _check_tid(transaction_id)
        with self._lock:
            self._load()
            if tid in self._resolved or tid in self._open:
                raise TransactionStateError(f"transaction {tid!r} was already used")
            txn = Transaction(self, tid)
            self._open[tid] = _Txn(tid, handle=txn)
            return txn

    def _live(self, txn: Transaction, action: str) -> _Txn:
        if txn.state != "open":
            raise TransactionStateError(
                f"cannot {action} transaction {txn.transaction_id!r}: it is {txn.state}"
            )
        rec = self._open.get(txn.transaction_id)
        if rec is None or rec.handle is not txn:
            raise TransactionStateError(f"transaction {txn.transaction_id!r} is not open here")
        return rec

    def park(self, txn: Transaction, out: Outgoing, parts: Sequence[int]) -> list[PendingMetadata]:
        """Park half messages of `txn` in `__txn_half`; `parts` is the partition each goes to
        (routed by the sender: fixed now)."""
        log = self.log
        topic, values, headers, timestamps = out.topic, out.values, out.headers, out.timestamps
        if not values:
            return []
        with self._lock:
            rec = self._live(txn, "send in")
            if rec.prepared is not None:
                raise TransactionStateError(f"transaction {rec.tid!r} is being committed")
            rows = []
            for i, p in enumerate(parts):
                ts = None if timestamps is None else timestamps[i]
                check_timestamp(ts)
                internal = [
                    (H_TXN, rec.tid.encode()),
                    (H_TOPIC, topic.encode()),
                    (H_PARTITION, int_header(p, 4)),
                    (H_TIMESTAMP, None if ts is None else int_header(ts, 8)),
                ]
                rows.append(parked_headers(internal, None if headers is None else headers[i]))
            half = log.internal_topic(
                HALF_TOPIC, unique_ids=True, key_index=False, **KEPT_UNTIL_RESOLVED
            )
            md = log.append_records(half, 0, values, out.keys, rows)
            now = log.clock()
            sent = []
            for i, p in enumerate(parts):
                uid = md.unique_id(i)
                off = md.base_offset + i
                rec.note(off, off, uid, (topic, p), now)
                sent.append(PendingMetadata(topic, p, now, uid, "half", off))
        trace_parked(self.tracer, sent, "half_appended", HALF_TOPIC, transaction_id=rec.tid)
        return sent

    def commit(self, txn: Transaction) -> list[BatchMetadata]:
        self.log.check_writable()
        with self._lock:
            rec = self._live(txn, "commit")
            if not rec.offsets:
                del self._open[rec.tid]
                self._resolved[rec.tid] = _Done(-1, -1)
                txn.state = "committed"
                return []
            return self._apply_commit(rec)

    def rollback(self, txn: Transaction) -> None:
        self.log.check_writable()
        with self._lock:
            rec = self._live(txn, "roll back")
            if rec.prepared is not None:
                raise TransactionStateError(
                    f"transaction {rec.tid!r} is committing (its commit failed part way); "
                    "call commit() again"
                )
            self._rollback(rec, "producer")

    # -- resolving (also for check-back and roll-forward)

    def _apply_commit(self, rec: _Txn) -> list[BatchMetadata]:
        """The two-phase relay (relay.py): PREPARE (unless an earlier attempt wrote it), the
        real appends, COMMIT. After a PREPARE from an earlier attempt, a message whose unique
        ID is in its target partition is skipped.

        Durable order, whatever the flush policy (docs/consume.md "Durability"): the half
        messages, then the PREPARE, before the first real append (so a crash or a power loss
        from there on rolls forward, skipping what is there, never commits twice or in part);
        the real appends before the COMMIT (which never outlives them). So once commit()
        returns, the transaction survives a power loss."""
        log = self.log
        groups: dict[tuple[str, int], list[Message]] = {}
        for off in rec.in_order():
            m = get_parked(log, HALF_TOPIC, off)
            if m is None:
                raise TransactionStateError(
                    f"half message {off} of transaction {rec.tid!r} is gone from {HALF_TOPIC}"
                )
            parked = read_parked(m, HALF_HEADERS)  # read at send or load: known good
            groups.setdefault((parked.topic, parked.partition), []).append(m)
        ends = None if rec.prepared is None else {(t, p): int(e) for t, p, e in rec.prepared}
        results: list[BatchMetadata] = []
        now = log.clock()

        def prepare() -> str | None:
            if rec.prepared is not None:
                return None
            targets = [[t, p, log.partition(t, p).end_offset] for t, p in sorted(groups)]
            rec.op_offset = self._op(rec.tid, "prepare", targets=targets)
            rec.prepared = targets
            return OP_TOPIC

        def finish() -> None:
            del self._open[rec.tid]
            self._resolved[rec.tid] = _Done(self._op(rec.tid, "commit"), max(rec.offsets))
            if rec.handle is not None:
                rec.handle.state = "committed"

        relay(
            log,
            "txn",
            HALF_TOPIC,
            groups,
            prepare,
            lambda t, p, _m: None if ends is None else ends[(t, p)],
            lambda m: m.unique_id,
            lambda t, p, rows: results.append(append_parked(log, t, p, rows, HALF_HEADERS)),
            finish,
        )
        if self.tracer is not None:
            # read the clock after the real appends: their "appended" events (stamped by
            # the append) never sort after the commit, even across a millisecond boundary
            at = max(now, log.clock())
            self.tracer.record(
                TraceEvent(uid, "txn_committed", at, md.topic, md.partition,
                           md.base_offset + j, None, {"transaction_id": rec.tid})
                for md in results for j, uid in enumerate(md.unique_ids) if uid is not None
            )  # fmt: skip
        return results

    def _rollback(self, rec: _Txn, reason: str) -> None:
        del self._open[rec.tid]
        op = self._op(rec.tid, "rollback", reason=reason) if rec.offsets else -1
        self._resolved[rec.tid] = _Done(op, max(rec.offsets, default=-1))
        if rec.handle is not None:
            rec.handle.state = "rolled_back"
        if self.tracer is not None:
            now = self.log.clock()
            self.tracer.record(
                TraceEvent(uid, "txn_rolled_back", now, HALF_TOPIC, 0, off, None,
                           {"transaction_id": rec.tid, "reason": reason})
                for off, uid in zip(rec.offsets, rec.uids, strict=True) if uid is not None
            )  # fmt: skip

    # -- check-back

    def check(self, now: int | None = None) -> dict[str, str]:
        """Roll forward every transaction with a PREPARE op, then ask the checker about each
        unresolved one older than transaction_timeout_ms. Returns {transaction id: outcome}
        with outcomes "committed", "rolled_back" or "unknown"."""
        self.log.check_writable()
        now = self.log.clock() if now is None else now
        outcomes: dict[str, str] = {}
        with self._lock:
            self._load()
            for rec in [r for r in self._open.values() if r.prepared is not None]:
                self._apply_commit(rec)
                outcomes[rec.tid] = "committed"
            due = [
                r
                for r in self._open.values()
                if r.offsets and r.started + self.options.transaction_timeout_ms <= now
            ]
            checker = self.checker
        if not due:
            return outcomes
        if checker is None:
            if not self._warned_no_checker:
                self._warned_no_checker = True
                _log.warning(
                    "%d unresolved transaction(s) and no checker (store.set_transaction_checker)",
                    len(due),
                )
            return outcomes
        for rec in due:
            info = TransactionInfo(
                rec.tid,
                rec.started,
                len(rec.offsets),
                tuple(rec.targets),
                tuple(rec.uids[i] for i in sorted(range(len(rec.uids)),
                                                  key=rec.origins.__getitem__)),
                rec.checks,
            )  # fmt: skip
            try:
                answer = checker(info)
            except Exception as e:  # a failing checker is an "unknown"; asked again later
                _log.warning("transaction checker failed on %r: %r", rec.tid, e)
                answer = "unknown"
            if answer not in ANSWERS:
                _log.warning("transaction checker answered %r for %r; taken as unknown",
                             answer, rec.tid)  # fmt: skip
                answer = "unknown"
            with self._lock:
                if self._open.get(rec.tid) is not rec or rec.prepared is not None:
                    continue  # resolved meanwhile (or committing: rolled forward next time)
                if answer == "commit":
                    self._apply_commit(rec)
                    outcomes[rec.tid] = "committed"
                elif answer == "rollback":
                    self._rollback(rec, "checker")
                    outcomes[rec.tid] = "rolled_back"
                else:
                    rec.checks += 1
                    if rec.checks >= self.options.transaction_check_max:
                        _log.warning(
                            "transaction %r still unknown after %d checks: rolled back",
                            rec.tid,
                            rec.checks,
                        )
                        self._rollback(rec, "max_checks")
                        outcomes[rec.tid] = "rolled_back"
                    else:
                        rec.op_offset = self._op(rec.tid, "unknown", checks=rec.checks)
                        outcomes[rec.tid] = "unknown"
        return outcomes

    def unresolved(self) -> list[str]:
        """Ids of the transactions with half messages and no decision yet."""
        with self._lock:
            self._load()
            return sorted(r.tid for r in self._open.values() if r.offsets)

    # -- trimming (consume/trim.py)

    def trim(self) -> RetentionReport:
        """Delete the prefix of `__txn_half` whose messages all belong to resolved
        transactions (re-parking the open ones' first when that frees at least twice what it
        copies), and the prefix of `__txn_op` that no load needs any more: the ops of
        transactions whose half messages all lie below where a load starts reading. Every
        record the deletion relies on is made durable first."""
        log = self.log
        report = RetentionReport()
        with self._lock:
            self._load()
            if not log.has_topic(HALF_TOPIC) or not log.has_topic(OP_TOPIC):
                return report
            bases = segment_bases(log.partition(HALF_TOPIC, 0))
            committing = [r.first() for r in self._open.values() if r.prepared and r.offsets]
            movable = [r for r in self._open.values() if r.offsets and r.prepared is None]
            live = sorted(off for r in movable for off in r.offsets)
            boundary = trim_point(bases, live, min(committing, default=bases[-1]))
            movers = [r for r in movable if r.first() < boundary]
            if movers:
                self._repark(movers, boundary)
            log.sync_partitions([(HALF_TOPIC, 0), (OP_TOPIC, 0)])
            half = log.partition(HALF_TOPIC, 0)
            report.merge(delete_below(half, min(boundary, self._low())))
            # a load reads __txn_half from the newest op's low (or its start): the decisions
            # of the transactions with a half message there, and the newest op of each open
            # one, must stay; everything below the oldest of those may go
            reads_from = max(self._low_written, half.start_offset)
            needed = [d.op_offset for d in self._resolved.values() if d.last_half >= reads_from]
            needed += [r.op_offset for r in self._open.values() if r.op_offset >= 0]
            if self._last_op >= 0:
                needed.append(self._last_op)
                ops = log.partition(OP_TOPIC, 0)
                report.merge(delete_below(ops, min(needed)))
                first_op = ops.start_offset
                for tid in [t for t, d in self._resolved.items() if d.op_offset < first_op]:
                    del self._resolved[tid]  # its decision is gone: the id may be used again
        return report

    def _repark(self, recs: list[_Txn], boundary: int) -> None:
        """Copy the half messages below `boundary` of these open transactions to the end of
        `__txn_half` (H_MOVED names where each was first parked; a load keeps the copy and
        the send order); the originals go with the trimmed prefix."""
        log = self.log
        moves: list[tuple[_Txn, Message]] = []
        for rec in recs:
            for off in rec.offsets:
                if off < boundary:
                    m = get_parked(log, HALF_TOPIC, off)
                    if m is None:
                        raise TransactionStateError(
                            f"half message {off} of transaction {rec.tid!r} is gone"
                        )
                    moves.append((rec, m))
        md = repark_copies(log, HALF_TOPIC, [m for _r, m in moves])
        crash_point("txn.after_repark")
        for i, (rec, m) in enumerate(moves):
            parked = read_parked(m, HALF_HEADERS)
            target = (parked.topic, parked.partition)
            rec.note(md.base_offset + i, parked.origin, m.unique_id, target, m.timestamp)

    def register(self) -> None:
        if self.options.transaction_check_interval_ms > 0:
            self.log.tasks.add(
                "transactions", self.options.transaction_check_interval_ms, background(self.check)
            )
