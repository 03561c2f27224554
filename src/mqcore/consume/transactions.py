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
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqcore.consume.delay import (
    H_PARTITION,
    H_TIMESTAMP,
    H_TOPIC,
    H_TXN,
    PendingMetadata,
    PresenceCheck,
    TxnDelayOptions,
    background,
    crash_point,
    int_header,
    now_ms,
    parked_headers,
    scan,
    split_parked,
    state_record,
    stored_timestamp,
)
from mqcore.consume.trace import TraceEvent
from mqcore.errors import InvalidConfigError, InvalidRecordError, TransactionStateError

if TYPE_CHECKING:
    from mqcore._ext.batch import Message
    from mqcore.store import BatchMetadata, HeadersArg, Store

_log = logging.getLogger("mqcore")

HALF_TOPIC = "__txn_half"
OP_TOPIC = "__txn_op"
HALF_HEADERS = (H_TXN, H_TOPIC, H_PARTITION, H_TIMESTAMP)
ANSWERS = ("commit", "rollback", "unknown")


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
    offsets: list[int] = field(default_factory=list)  # its half messages in __txn_half
    uids: list[str | None] = field(default_factory=list)
    targets: dict[tuple[str, int], None] = field(default_factory=dict)  # ordered set
    started: int = -1
    checks: int = 0
    prepared: list[list[Any]] | None = None  # [[topic, partition, end offset]] of its PREPARE
    handle: Transaction | None = None


def _check_tid(tid: object) -> str:
    if tid is None:
        return uuid.uuid4().hex
    if not isinstance(tid, str) or not 0 < len(tid) <= 249 or not tid.isprintable():
        raise InvalidConfigError(
            f"transaction_id must be a printable str of 1..249 characters, not {tid!r}"
        )
    return tid


class Transaction:
    """Messages sent together and made visible together (or never). Use `store.begin()`;
    as a context manager it commits on a clean exit and rolls back on an exception."""

    def __init__(self, manager: TransactionManager, tid: str):
        self._manager = manager
        self.transaction_id = tid
        self.state = "open"  # "committed" or "rolled_back" once resolved

    def append(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        tag: str | None = None,
        properties: Mapping[str, object] | None = None,
        keys: str | bytes | Sequence[str | bytes] | None = None,
        unique_id: str | None = None,
    ) -> PendingMetadata:
        """Send one half message (arguments as Store.append); visible at commit."""
        from mqcore.store import message_headers

        hdrs = message_headers(headers, tag, properties, keys, unique_id)
        return self._manager.park(self, topic, [value], [key], [hdrs], partition, [timestamp])[0]

    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int | None = 0,
        timestamps: Sequence[int] | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
    ) -> list[PendingMetadata]:
        """Send half messages (arguments as Store.append_batch; `partition=None` routes each
        by its key or round robin)."""
        values = list(values)
        if keys is not None and len(keys) != len(values):
            raise InvalidRecordError(f"{len(keys)} keys for {len(values)} values")
        if timestamps is not None and len(timestamps) != len(values):
            raise InvalidRecordError(f"{len(timestamps)} timestamps for {len(values)} values")
        if tags is not None or properties is not None or unique_ids is not None:
            headers = self._manager.store._merged_headers(
                len(values), headers, tags, properties, unique_ids
            )
        elif headers is not None and len(headers) != len(values):
            raise InvalidRecordError(f"{len(headers)} headers for {len(values)} values")
        return self._manager.park(self, topic, values, keys, headers, partition, timestamps)

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

    def __init__(self, store: Store, options: TxnDelayOptions):
        self.store = store
        self.options = options
        self.checker: Callable[[TransactionInfo], str] | None = None
        self._lock = threading.RLock()
        self._loaded = False
        self._open: dict[str, _Txn] = {}
        self._resolved: set[str] = set()
        self._warned_no_checker = False

    # -- loading

    def _load(self) -> None:
        """Replay `__txn_op`, then read `__txn_half` from the last op's `low` watermark."""
        if self._loaded:
            return
        store = self.store
        low = 0
        prepared: dict[str, list[list[Any]]] = {}
        checks: dict[str, int] = {}
        if OP_TOPIC in store._partitions:
            for m in scan(store, OP_TOPIC, 0, 0):
                d = json.loads(m.value or b"{}")
                tid = (m.key or b"").decode()
                low = int(d["low"])
                if d["op"] in ("commit", "rollback"):
                    self._resolved.add(tid)
                    prepared.pop(tid, None)
                    checks.pop(tid, None)
                elif d["op"] == "prepare":
                    prepared[tid] = d["targets"]
                elif d["op"] == "unknown":
                    checks[tid] = int(d["checks"])
        if HALF_TOPIC in store._partitions:
            for m in scan(store, HALF_TOPIC, 0, low):
                fields, _ = split_parked(m, HALF_HEADERS)
                tid = (fields[H_TXN] or b"").decode()
                if tid in self._resolved:
                    continue
                rec = self._open.get(tid)
                if rec is None:
                    rec = self._open[tid] = _Txn(tid, started=m.timestamp)
                    rec.prepared = prepared.get(tid)
                    rec.checks = checks.get(tid, 0)
                self._note(rec, m.offset, m.unique_id, fields, m.timestamp)
        self._loaded = True

    @staticmethod
    def _note(
        rec: _Txn, offset: int, uid: str | None, fields: dict[str, bytes | None], ts: int
    ) -> None:
        target = (
            (fields[H_TOPIC] or b"").decode(),
            int.from_bytes(fields[H_PARTITION] or b"", "big", signed=True),
        )
        rec.offsets.append(offset)
        rec.uids.append(uid)
        rec.targets[target] = None
        if rec.started < 0:
            rec.started = ts

    def _low(self) -> int:
        """Every half message below this offset belongs to a resolved transaction."""
        firsts = [r.offsets[0] for r in self._open.values() if r.offsets]
        if firsts:
            return min(firsts)
        return self.store.end_offset(HALF_TOPIC, 0) if HALF_TOPIC in self.store._partitions else 0

    def _op(self, tid: str, op: str, **fields: Any) -> None:
        topic = self.store._internal_topic(
            OP_TOPIC, unique_ids=False, key_index=True, retention_ms=-1
        )
        self.store.append(topic, state_record(op=op, low=self._low(), **fields), key=tid.encode())

    # -- the producer's side

    def begin(self, transaction_id: str | None) -> Transaction:
        self.store._check_writable()
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

    def park(
        self,
        txn: Transaction,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Any] | None,
        partition: int | None,
        timestamps: Sequence[int | None] | None,
    ) -> list[PendingMetadata]:
        store = self.store
        store._check_writable()
        if topic.startswith("__txn_") or topic.startswith("__delay"):
            raise InvalidRecordError(f"cannot send transactional messages to {topic!r}")
        if not values:
            return []
        with self._lock:
            rec = self._live(txn, "send in")
            if rec.prepared is not None:
                raise TransactionStateError(f"transaction {rec.tid!r} is being committed")
            store._parts(topic, create=True)
            count = store._configs[topic].partitions
            rows, parts = [], []
            for i in range(len(values)):
                key = None if keys is None else keys[i]
                p = store._choose_partition(topic, key, count) if partition is None else partition
                p = store._partition(topic, p).partition
                ts = None if timestamps is None else timestamps[i]
                if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
                    raise InvalidRecordError(f"timestamps must be ints >= 0, not {ts!r}")
                internal = [
                    (H_TXN, rec.tid.encode()),
                    (H_TOPIC, topic.encode()),
                    (H_PARTITION, int_header(p, 4)),
                    (H_TIMESTAMP, None if ts is None else int_header(ts, 8)),
                ]
                rows.append(parked_headers(internal, None if headers is None else headers[i]))
                parts.append(p)
            half = store._internal_topic(
                HALF_TOPIC, unique_ids=True, key_index=False, retention_ms=-1
            )
            md = store.append_batch(half, list(values), keys, rows, partition=0)
            now = now_ms()
            out = []
            for i, p in enumerate(parts):
                uid = md.unique_id(i)
                off = md.base_offset + i
                rec.offsets.append(off)
                rec.uids.append(uid)
                rec.targets[(topic, p)] = None
                if rec.started < 0:
                    rec.started = now
                out.append(PendingMetadata(topic, p, now, uid, "half", off))
        if store._tracer is not None:
            store._tracer.record(
                TraceEvent(
                    m.unique_id,
                    "half_appended",
                    now,
                    HALF_TOPIC,
                    0,
                    m.internal_offset,
                    None,
                    {"transaction_id": rec.tid, "topic": m.topic, "partition": m.partition},
                )
                for m in out
                if m.unique_id is not None
            )
        return out

    def commit(self, txn: Transaction) -> list[BatchMetadata]:
        self.store._check_writable()
        with self._lock:
            rec = self._live(txn, "commit")
            if not rec.offsets:
                del self._open[rec.tid]
                self._resolved.add(rec.tid)
                txn.state = "committed"
                return []
            return self._apply_commit(rec)

    def rollback(self, txn: Transaction) -> None:
        self.store._check_writable()
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
        """PREPARE (unless already written), the real appends, COMMIT. After a PREPARE from
        an earlier attempt, a message whose unique ID is in its target partition is skipped."""
        store = self.store
        groups: dict[tuple[str, int], list[Message]] = {}
        for off in rec.offsets:
            m = store.get(HALF_TOPIC, 0, off)
            if m is None:
                raise TransactionStateError(
                    f"half message {off} of transaction {rec.tid!r} is gone from {HALF_TOPIC}"
                )
            fields, _ = split_parked(m, HALF_HEADERS)
            target = (
                (fields[H_TOPIC] or b"").decode(),
                int.from_bytes(fields[H_PARTITION] or b"", "big", signed=True),
            )
            groups.setdefault(target, []).append(m)
        retry = rec.prepared is not None
        if rec.prepared is None:
            targets: list[list[Any]] = [[t, p, store.end_offset(t, p)] for t, p in sorted(groups)]
            self._op(rec.tid, "prepare", targets=targets)
            rec.prepared = targets
            crash_point("txn:after_prepare")
        ends = {(t, p): int(e) for t, p, e in rec.prepared}
        check = PresenceCheck(store)
        results: list[BatchMetadata] = []
        committed: list[tuple[str, str, int, int]] = []  # (uid, topic, partition, offset)
        now = now_ms()
        for i, (t, p) in enumerate(sorted(groups)):
            rows = [
                m
                for m in groups[(t, p)]
                if not (retry and check.present(t, p, ends[(t, p)], m.unique_id))
            ]
            if rows:
                md = self._append_real(t, p, rows, now)
                results.append(md)
                committed.extend(
                    (uid, t, p, md.base_offset + j)
                    for j, uid in enumerate(md.unique_ids)
                    if uid is not None
                )
            crash_point(f"txn:after_append:{i + 1}")
        if store.flush_policy.mode == "interval":
            for t, p in groups:
                store._partition(t, p).flush()
        del self._open[rec.tid]
        self._resolved.add(rec.tid)
        self._op(rec.tid, "commit")
        if rec.handle is not None:
            rec.handle.state = "committed"
        if store._tracer is not None and committed:
            # read the clock after the real appends: their "appended" events (stamped by
            # append_batch) never sort after the commit, even across a millisecond boundary
            at = max(now, now_ms())
            store._tracer.record(
                TraceEvent(uid, "txn_committed", at, t, p, off, None, {"transaction_id": rec.tid})
                for uid, t, p, off in committed
            )
        return results

    def _append_real(
        self, topic: str, partition: int, rows: list[Message], now: int
    ) -> BatchMetadata:
        values, keys, headers, stamps = [], [], [], []
        for m in rows:
            fields, user = split_parked(m, HALF_HEADERS)
            values.append(m.value)
            keys.append(m.key)
            headers.append(user)
            ts = stored_timestamp(fields[H_TIMESTAMP])
            stamps.append(now if ts is None else ts)
        return self.store.append_batch(
            topic, values, keys, headers, partition=partition, timestamps=stamps
        )

    def _rollback(self, rec: _Txn, reason: str) -> None:
        del self._open[rec.tid]
        self._resolved.add(rec.tid)
        if rec.offsets:
            self._op(rec.tid, "rollback", reason=reason)
        if rec.handle is not None:
            rec.handle.state = "rolled_back"
        store = self.store
        if store._tracer is not None:
            now = now_ms()
            store._tracer.record(
                TraceEvent(uid, "txn_rolled_back", now, HALF_TOPIC, 0, off, None,
                           {"transaction_id": rec.tid, "reason": reason})
                for off, uid in zip(rec.offsets, rec.uids, strict=True) if uid is not None
            )  # fmt: skip

    # -- check-back

    def check(self, now: int | None = None) -> dict[str, str]:
        """Roll forward every transaction with a PREPARE op, then ask the checker about each
        unresolved one older than transaction_timeout_ms. Returns {transaction id: outcome}
        with outcomes "committed", "rolled_back" or "unknown"."""
        store = self.store
        store._check_writable()
        now = now_ms() if now is None else now
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
                tuple(rec.uids),
                rec.checks,
            )
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
                        self._op(rec.tid, "unknown", checks=rec.checks)
                        outcomes[rec.tid] = "unknown"
        return outcomes

    def unresolved(self) -> list[str]:
        """Ids of the transactions with half messages and no decision yet."""
        with self._lock:
            self._load()
            return sorted(r.tid for r in self._open.values() if r.offsets)

    def register(self) -> None:
        if self.options.transaction_check_interval_ms > 0:
            self.store._tasks.add(
                "transactions", self.options.transaction_check_interval_ms, background(self.check)
            )
