"""Kafka's transactions in a partition's log: control markers, aborted-transaction indexes
(`.txnindex`) and which batches a `read_committed` reader skips (issue 34; docs/format.md
"Transactions").

A transactional producer's batches carry the transactional attribute bit (4) with its producer
ID and epoch; its transaction ends with a control batch (attribute bits 4 and 5) holding one
record whose key says how:

    key   int16 version (0), int16 type (0 ABORT, 1 COMMIT)
    value int16 version (0), int32 coordinator epoch

The records of an aborted transaction stay in the log. Each ABORT marker adds an entry to the
`.txnindex` of the segment the marker went to, so a reader finds the aborted ranges without
reading the log. Kafka's byte layout (TransactionIndex.java), 34 big-endian bytes per entry,
in marker order, no header:

    int16 version (0)
    int64 producer_id
    int64 first_offset        the transaction's first batch
    int64 last_offset         its ABORT marker
    int64 last_stable_offset  the partition's last stable offset once it ended

A reader of [lo, hi) takes, from the segment holding lo onward, the entries with last_offset
>= lo and first_offset < hi, and stops at the first entry whose last_stable_offset is >= hi:
every transaction that could overlap the range had ended by then (Kafka's
collectAbortedTransactions). A `read_committed` reader never reads at or past the last stable
offset (the first offset of the oldest transaction still open) and skips the transactional
batches of a producer between an aborted transaction's first offset and its marker.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from mqcore._ext.batch import BatchInfo, peek_batch_header
from mqcore._ext.crc32c import crc32c
from mqcore.errors import InvalidConfigError
from mqcore.storage import durable

TXNINDEX_SUFFIX = ".txnindex"
READ_UNCOMMITTED, READ_COMMITTED = "read_uncommitted", "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
ENTRY = struct.Struct(">hqqqq")
ENTRY_VERSION = 0
ABORT, COMMIT = 0, 1
MARKER_KEY = struct.Struct(">hh")
ATTR_TRANSACTIONAL, ATTR_CONTROL = 0x10, 0x20


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction: its producer, first offset and ABORT marker's offset, and the
    last stable offset once it ended."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return ENTRY.pack(ENTRY_VERSION, self.producer_id, self.first_offset, self.last_offset,
                          self.last_stable_offset)  # fmt: skip


def check_isolation(level: object) -> bool:
    """Whether `level` is read_committed (InvalidConfigError for a name that is neither)."""
    if level not in ISOLATION_LEVELS:
        raise InvalidConfigError(
            f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)}, not {level!r}"
        )
    return level == READ_COMMITTED


def txnindex_path(log_path: str) -> str:
    """The `.txnindex` beside a segment's `.log`."""
    return log_path[: -len(".log")] + TXNINDEX_SUFFIX


def read_entries(path: str) -> list[AbortedTxn]:
    """The entries of a `.txnindex` ([] when there is none). A torn last entry (a write a crash
    cut) is left out; an entry of another version ends the file's answer, as an index that is
    not Kafka's version 0 cannot be trusted past it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for pos in range(0, len(data) - ENTRY.size + 1, ENTRY.size):
        version, pid, first, last, lso = ENTRY.unpack_from(data, pos)
        if version != ENTRY_VERSION or not 0 <= first <= last:
            break
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def write_entries(path: str, entries: Sequence[AbortedTxn], *, sync: bool) -> None:
    """Replace the `.txnindex` at `path` with `entries` (none: the file is removed)."""
    if not entries:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    durable.write_atomic(path, b"".join(e.encode() for e in entries), sync=sync)


def append_entry(path: str, entry: AbortedTxn, *, sync: bool) -> None:
    """Add one entry at the end of the `.txnindex` at `path` (made if missing)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        durable.write_all(fd, entry.encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def collect(indexes: Iterable[Sequence[AbortedTxn]], lo: int, hi: int) -> list[AbortedTxn]:
    """The aborted transactions overlapping [lo, hi), from the entries of the segments from
    the one holding `lo` onward, in order (module doc)."""
    out = []
    for entries in indexes:
        for e in entries:
            if e.last_offset >= lo and e.first_offset < hi:
                out.append(e)
            if e.last_stable_offset >= hi:
                return out
    return out


_MARKER_HEAD = struct.Struct(">qiibIhiqqqhii")  # a v2 batch header, 61 bytes
# the marker's one record: length 16 (zig-zag 32), attributes 0, timestamp and offset deltas 0,
# key length 4 (zig-zag 8), then the key; value length 6 (zig-zag 12), the value; no headers
_MARKER_RECORD = struct.Struct(">BBBBBhhBhiB")


def encode_marker(producer_id: int, epoch: int, kind: int, coordinator_epoch: int,
                  timestamp: int) -> bytes:  # fmt: skip
    """A control batch ending a transaction (ABORT or COMMIT), as Kafka's coordinator writes
    it: uncompressed, one record, base offset 0 and leader epoch -1 (the append stamps both)."""
    record = _MARKER_RECORD.pack(32, 0, 0, 0, 8, 0, kind, 12, 0, coordinator_epoch, 0)
    attributes = ATTR_TRANSACTIONAL | ATTR_CONTROL
    size = _MARKER_HEAD.size + len(record)
    head = bytearray(_MARKER_HEAD.pack(0, size - 12, -1, 2, 0, attributes, 0, timestamp,
                                       timestamp, producer_id, epoch, -1, 1))  # fmt: skip
    body = bytes(head[21:]) + record
    struct.pack_into(">I", head, 17, crc32c(body))
    return bytes(head) + record


def marker_type(view: memoryview, pos: int) -> int | None:
    """ABORT or COMMIT for the control batch at view[pos:] (uncompressed, as Kafka writes
    them), None when its one record's key is not a marker's. The record follows the 61-byte
    header: varint length, int8 attributes, varlong timestamp delta, varint offset delta,
    varint key length, key."""
    at = pos + 61
    for _ in range(4):  # length, attributes (1 byte, read as a varint: < 0x80), two deltas
        _, at = _varint(view, at)
    size, at = _varint(view, at)
    if size != MARKER_KEY.size or at + size > len(view):
        return None
    version, kind = MARKER_KEY.unpack_from(view, at)
    return kind if version == 0 and kind in (ABORT, COMMIT) else None


def _varint(view: memoryview, at: int) -> tuple[int, int]:
    """A zig-zag varint at view[at:] and the position after it (0 past the end)."""
    shift = value = 0
    while at < len(view) and shift < 64:
        b = view[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7
    return 0, len(view)


def batch_headers(view: memoryview, pos: int, end: int) -> Iterator[tuple[int, BatchInfo]]:
    """(position, BatchInfo) of each whole batch header in view[pos:end]."""
    while pos < end:
        info = peek_batch_header(view, pos)
        if info is None or info.size <= 0 or pos + info.size > end:
            return
        yield pos, info
        pos += info.size
