"""`mqcore dump`: the batches, records and index entries of one segment's files.

Like Kafka's kafka-dump-log.sh, for segments mqcore or Kafka wrote. Every byte is read through
the kernels (read_batch_info, peek_batch_header and decode_messages of mqcore._ext.batch, the
index readers of mqcore.storage.index, the KeyTable of mqcore._ext.keyindex), which check every
length before using it. Damage (a bad CRC, a batch cut short, an index entry that points
nowhere) is listed where it is met, with its file position; the dump goes on where the framing
allows and the command then exits with status 1.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from mqcore import Message, compression
from mqcore._ext import index as index_kernel
from mqcore._ext.batch import BatchInfo, decode_messages, peek_batch_header, read_batch_info
from mqcore._ext.crc32c import crc32c
from mqcore._ext.keyindex import KeyTable
from mqcore.cli import render
from mqcore.cli.options import UsageError, add_json, add_progress, progress_enabled
from mqcore.errors import CorruptIndexError, MQCoreError, SegmentDamagedError
from mqcore.query import jsonform
from mqcore.storage.index import OffsetIndex, SparseIndex, TimeIndex

KINDS = (".log", ".index", ".timeindex", ".keyindex")
MAX_RELATIVE = 0x7FFFFFFF
CRC_START = 21  # the CRC covers a batch from its attributes field to its end
CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "dump",
        help="print a segment file's batches, records and index entries (kafka-dump-log)",
        description="Print one segment file of mqcore or Kafka. A .log: each batch (offsets, "
        "count, position, size, timestamp and its type, codec, CRC and whether it holds, "
        "producer id/epoch/sequence, transactional and control flags), with --records each "
        "record, with --index the entries of the sibling .index and .timeindex (checked "
        "against the log); the sibling .keyindex's summary when there is one. A .index, "
        ".timeindex or .keyindex argument dumps that file. Damage is reported with its "
        "position and the exit status is 1. Text shows bytes that are not UTF-8 as \\xNN.",
    )
    p.add_argument("file", metavar="FILE", help="a .log, .index, .timeindex or .keyindex file")
    p.add_argument(
        "--records",
        "--print-data-log",
        dest="records",
        action="store_true",
        help="also print every record: offset, timestamp, key, value, headers",
    )
    p.add_argument(
        "--index",
        action="store_true",
        help="also print the entries of the sibling .index and .timeindex",
    )
    add_json(p, "objects typed segment, batch, record, index_entry, timeindex_entry, ...")
    add_progress(p)
    p.set_defaults(run=cmd_dump)


@dataclass
class LogFacts:
    """What the index checks need from a .log: its batches by position and by last offset."""

    size: int = 0
    last_offset: int = -1
    at_position: dict[int, int] = field(default_factory=dict)  # position -> last offset
    first_at: dict[int, int] = field(default_factory=dict)  # position -> base offset
    max_ts_by_last: dict[int, int] = field(default_factory=dict)  # last offset -> maxTimestamp


def cmd_dump(args: argparse.Namespace, out: TextIO) -> int:
    path = args.file
    if os.path.isdir(path):
        raise UsageError(
            f"{path} is a directory: dump reads one segment file (.log, .index, .timeindex, "
            ".keyindex); to print a topic's messages use `mqcore consume STORE TOPIC`"
        )
    stem, suffix = os.path.splitext(path)
    if suffix not in KINDS:
        raise UsageError(f"{path}: dump reads {', '.join(KINDS)} files, not {suffix or 'this'}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist")
    d = Dumper(out, args.json, args.records, progress_enabled(args), _base_offset(stem))
    log_path = stem + ".log"
    if suffix == ".log":
        facts = d.log(path)
        if args.index:
            d.offset_index(stem + ".index", facts, sibling=True)
            d.time_index(stem + ".timeindex", facts, sibling=True)
        if os.path.exists(stem + ".keyindex"):
            d.keyindex(stem + ".keyindex", facts.size)
    else:
        known = log_facts(log_path) if os.path.isfile(log_path) else None
        if suffix == ".index":
            d.offset_index(path, known)
        elif suffix == ".timeindex":
            d.time_index(path, known)
        else:
            d.keyindex(path, None if known is None else known.size)
    if d.damage:
        where, position, reason = d.damage[0]
        more = f" ({len(d.damage)} problems, listed above)" if len(d.damage) > 1 else ""
        raise SegmentDamagedError(f"{where} is damaged at position {position}: {reason}{more}")
    return 0


def _base_offset(stem: str) -> int | None:
    """The base offset in a segment file's name (20 digits), or None for another name."""
    name = os.path.basename(stem)
    return int(name) if name.isdigit() else None


@contextmanager
def mapped(path: str) -> Iterator[memoryview]:
    """The file's bytes as a read-only view (empty for an empty file), unmapped afterwards."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                yield view
            finally:
                view.release()


def log_facts(path: str) -> LogFacts:
    """Batch positions and offsets of a .log from its headers alone (for index checks)."""
    facts = LogFacts()
    with mapped(path) as view:
        facts.size = size = len(view)
        pos = 0
        while pos < size:
            info = peek_batch_header(view, pos)
            if info is None or pos + info.size > size:
                break
            _note(facts, pos, info)
            pos += info.size
    return facts


def _note(facts: LogFacts, pos: int, info: BatchInfo) -> None:
    facts.at_position[pos] = info.last_offset
    facts.first_at[pos] = info.base_offset
    facts.max_ts_by_last.setdefault(info.last_offset, info.max_timestamp)
    facts.last_offset = max(facts.last_offset, info.last_offset)


def _flag(b: bool) -> str:
    return "true" if b else "false"


class Dumper:
    """Writes what it reads, as text or JSON lines, and collects the damage it meets."""

    def __init__(self, out: TextIO, as_json: bool, records: bool, progress: bool, base: int | None):
        self.out = out
        self.json = as_json
        self.records = records
        self.progress = progress
        self.base = base
        self.damage: list[tuple[str, int, str]] = []

    def _emit(self, obj: dict[str, Any], line: str) -> None:
        if self.json:
            render.emit(self.out, obj)
        else:
            self.out.write(line + "\n")

    def _damaged(self, path: str, position: int, reason: str) -> None:
        self.damage.append((path, position, reason))
        self._emit(
            {"type": "damage", "path": path, "position": position, "reason": reason},
            f"DAMAGE at position {position} of {os.path.basename(path)}: {reason}",
        )

    # -- .log -------------------------------------------------------------------------------------

    def log(self, path: str) -> LogFacts:
        facts = LogFacts()
        batches = records = 0
        with mapped(path) as view:
            size = facts.size = len(view)
            self._emit(
                {"type": "segment", "path": path, "size": size, "base_offset": self.base},
                f"Dumping {path}\nbase offset: {_text_or_dash(self.base)}  size: {size} bytes",
            )
            bar = render.Progress(os.path.basename(path), size, self.progress)
            pos = 0
            prev_last = None
            try:
                while pos < size:
                    info = self._batch_at(path, view, pos)
                    if info is None:
                        break
                    batches += 1
                    records += info.records_count
                    _note(facts, pos, info)
                    if prev_last is not None and info.base_offset <= prev_last:
                        self._damaged(
                            path,
                            pos,
                            f"batch offsets go backwards: base offset {info.base_offset} after "
                            f"last offset {prev_last}",
                        )
                    prev_last = info.last_offset
                    if self.records:
                        self._records(path, view, pos, info)
                    pos += info.size
                    bar.update(pos, records)
            finally:
                bar.close(complete=pos >= size)
        self._emit(
            {
                "type": "summary",
                "path": path,
                "batches": batches,
                "records": records,
                "walked_bytes": pos,
                "size": size,
                "damaged": len(self.damage),
            },
            f"{render.plural(batches, 'batch')}, {render.plural(records, 'record')}, {pos} of "
            f"{size} bytes walked" + (f", {len(self.damage)} damaged" if self.damage else ""),
        )
        return facts

    def _batch_at(self, path: str, view: memoryview, pos: int) -> BatchInfo | None:
        """Print the batch at `pos` (its damage too); None when the walk cannot go on."""
        size = len(view)
        try:
            info = read_batch_info(view, pos, False)
        except MQCoreError as e:
            head = peek_batch_header(view, pos)
            self._damaged(path, pos, str(e))
            if head is None or pos + head.size > size:
                return None  # the framing is gone: nothing after this can be found
            self._print_batch(path, pos, head, crc_valid=_crc_holds(view, pos, head))
            return head
        if info is None:
            head = peek_batch_header(view, pos)
            declared = f"it declares {head.size} bytes, " if head is not None else ""
            self._damaged(
                path,
                pos,
                f"batch ends past the end of the file ({declared}{size - pos} are left)",
            )
            return None
        self._print_batch(path, pos, info, crc_valid=_crc_holds(view, pos, info))
        return info

    def _print_batch(self, path: str, pos: int, b: BatchInfo, crc_valid: bool) -> None:
        ts_type = jsonform.timestamp_type(b.timestamp_type)
        codec = (
            compression.CODEC_NAMES[b.codec] if b.codec < len(compression.CODEC_NAMES) else b.codec
        )
        last_seq = b.base_sequence + b.last_offset_delta if b.base_sequence >= 0 else -1
        self._emit(
            {
                "type": "batch",
                "base_offset": b.base_offset,
                "last_offset": b.last_offset,
                "count": b.records_count,
                "position": pos,
                "size": b.size,
                "magic": b.magic,
                "timestamp_type": ts_type,
                "base_timestamp": b.base_timestamp,
                "max_timestamp": b.max_timestamp,
                "compression": codec,
                "crc": b.crc,
                "crc_valid": crc_valid,
                "producer_id": b.producer_id,
                "producer_epoch": b.producer_epoch,
                "base_sequence": b.base_sequence,
                "last_sequence": last_seq,
                "leader_epoch": b.leader_epoch,
                "is_transactional": b.is_transactional,
                "is_control": b.is_control,
            },
            f"baseOffset: {b.base_offset} lastOffset: {b.last_offset} count: {b.records_count} "
            f"position: {pos} size: {b.size} {ts_type}: {b.max_timestamp} "
            f"compresscodec: {codec} crc: {b.crc} isValid: {_flag(crc_valid)} "
            f"producerId: {b.producer_id} producerEpoch: {b.producer_epoch} "
            f"baseSequence: {b.base_sequence} lastSequence: {last_seq} "
            f"partitionLeaderEpoch: {b.leader_epoch} "
            f"isTransactional: {_flag(b.is_transactional)} isControl: {_flag(b.is_control)}",
        )
        if not crc_valid:
            self._damaged(path, pos, f"CRC-32C mismatch (the batch header stores {b.crc})")

    def _records(self, path: str, view: memoryview, pos: int, b: BatchInfo) -> None:
        msgs: list[Message] = []
        with view[pos : pos + b.size] as piece:
            try:
                decode_messages(
                    piece, 0, "", 0, 0, 1 << 30, msgs, verify_crc=False, include_control=True
                )
            except (MQCoreError, ValueError) as e:
                self._damaged(path, pos, f"records of the batch: {e}")
        for m in msgs:
            self._print_record(m, b.is_control)

    def _print_record(self, m: Message, control: bool) -> None:
        obj: dict[str, Any] = {
            "type": "record",
            "offset": m.offset,
            "timestamp": m.timestamp,
            "timestamp_type": jsonform.timestamp_type(m.timestamp_type),
            "key": jsonform.json_bytes(m.key),
            "value": jsonform.json_bytes(m.value),
            "headers": jsonform.json_headers(m.headers),
        }
        marker = _control_marker(m) if control else None
        if marker is not None:
            obj["control"], obj["coordinator_epoch"] = marker
            shown = f"endTxnMarker: {marker[0]} coordinatorEpoch: {marker[1]}"
        else:
            headers = ", ".join(
                f"{render.text(jsonform.header_name(k))}={render.header_text(k, v)}"
                for k, v in m.headers
            )
            shown = (
                f"keySize: {_size(m.key)} valueSize: {_size(m.value)} headers: [{headers}] "
                f"key: {render.text(m.key)} payload: {render.text(m.value)}"
            )
        ts_type = jsonform.timestamp_type(m.timestamp_type)
        self._emit(obj, f"| offset: {m.offset} {ts_type}: {m.timestamp} {shown}")

    # -- .index and .timeindex --------------------------------------------------------------------

    def offset_index(self, path: str, facts: LogFacts | None, sibling: bool = False) -> None:
        idx = OffsetIndex(path, 0, writable=False)
        try:
            if not self._index_head(idx, path, "offset index", sibling):
                return
            max_rel, max_pos = self._limits(facts)
            idx.load(max_rel, max_pos)
            raw = idx.raw_buffer()
            for i in range(idx.entries):
                rel, position = index_kernel.offset_entry(raw, i)
                offset = rel if self.base is None else self.base + rel
                self._emit(
                    {"type": "index_entry", "offset": offset, "position": position},
                    f"offset: {offset} position: {position}",
                )
                if facts is not None and self.base is not None:
                    last = facts.at_position.get(position)
                    if last is None:
                        self._damaged(
                            path, i * idx.entry_size,
                            f"entry {i} (offset {offset}) points at position {position}, where "
                            "no batch starts",
                        )  # fmt: skip
                    elif last != offset:
                        self._damaged(
                            path, i * idx.entry_size,
                            f"entry {i} says offset {offset} but the batch at position "
                            f"{position} ends at offset {last}",
                        )  # fmt: skip
            self._index_tail(idx, path)
        finally:
            idx.close(trim=False)

    def time_index(self, path: str, facts: LogFacts | None, sibling: bool = False) -> None:
        idx = TimeIndex(path, 0, writable=False)
        try:
            if not self._index_head(idx, path, "time index", sibling):
                return
            idx.load(self._limits(facts)[0])
            raw = idx.raw_buffer()
            for i in range(idx.entries):
                ts, rel = index_kernel.time_entry(raw, i)
                offset = rel if self.base is None else self.base + rel
                self._emit(
                    {"type": "timeindex_entry", "timestamp": ts, "offset": offset},
                    f"timestamp: {ts} offset: {offset}",
                )
                if facts is not None and self.base is not None:
                    batch_ts = facts.max_ts_by_last.get(offset)
                    if batch_ts is None:
                        self._damaged(
                            path, i * idx.entry_size,
                            f"entry {i} (timestamp {ts}) names offset {offset}, where no batch "
                            "ends",
                        )  # fmt: skip
                    elif batch_ts != ts:
                        self._damaged(
                            path, i * idx.entry_size,
                            f"entry {i} says timestamp {ts} but the batch ending at offset "
                            f"{offset} has max timestamp {batch_ts}",
                        )  # fmt: skip
            self._index_tail(idx, path)
        finally:
            idx.close(trim=False)

    def _limits(self, facts: LogFacts | None) -> tuple[int, int]:
        """Largest relative offset and position a valid entry may hold."""
        if facts is None or self.base is None:
            return MAX_RELATIVE, MAX_RELATIVE
        return max(0, facts.last_offset - self.base), max(1, facts.size)

    def _index_head(self, idx: SparseIndex, path: str, what: str, sibling: bool) -> bool:
        if not idx.exists:
            if not sibling:
                raise FileNotFoundError(f"{path} does not exist")
            self._emit({"type": "index", "path": path, "exists": False}, f"no {what} {path}")
            return False
        size = idx.disk_bytes
        self._emit(
            {"type": "index", "path": path, "exists": True, "size": size},
            f"Dumping {path}  ({size} bytes: {render.plural(size // idx.entry_size, 'entry')}"
            f" of {idx.entry_size} bytes)",
        )
        return True

    def _index_tail(self, idx: SparseIndex, path: str) -> None:
        """After the valid entries: zeros (preallocated, fine), anything else is damage."""
        raw = idx.raw_buffer()
        whole = len(raw) // idx.entry_size
        rest = raw[idx.entries * idx.entry_size : whole * idx.entry_size]
        try:
            zero = bytes(rest).count(0) == len(rest)
        finally:
            rest.release()
        after = whole - idx.entries
        if after and zero:
            self._emit(
                {"type": "index_tail", "path": path, "zero_entries": after},
                f"{after} zero entries after the valid ones (preallocated space of an active "
                "segment)",
            )
        elif after:
            i = idx.entries
            self._damaged(
                path,
                i * idx.entry_size,
                f"entry {i} breaks the index's order or points past the log "
                f"({after} entries from here are not used)",
            )
        if idx.disk_bytes % idx.entry_size:
            self._damaged(
                path,
                whole * idx.entry_size,
                f"{idx.disk_bytes % idx.entry_size} bytes after the last whole entry",
            )

    # -- .keyindex --------------------------------------------------------------------------------

    def keyindex(self, path: str, log_size: int | None) -> None:
        st = os.stat(path)
        with mapped(path) as view:
            try:
                table = KeyTable(view, False)
            except CorruptIndexError as e:
                self._damaged(path, 0, str(e))
                return
            try:
                chains = table.chains_valid()
                doc = {
                    "type": "keyindex",
                    "path": path,
                    "size": st.st_size,
                    "disk_bytes": getattr(st, "st_blocks", 0) * 512,
                    "slots": table.slot_count,
                    "key_entries": table.key_count,
                    "key_capacity": table.key_capacity,
                    "tag_entries": table.tag_count,
                    "tag_capacity": table.tag_capacity,
                    "complete": bool(table.complete),
                    "covered_position": table.covered_position,
                    "current": None if log_size is None else table.covered_position == log_size,
                    "min_timestamp": table.min_timestamp,
                    "max_timestamp": table.max_timestamp,
                    "chains_valid": chains,
                    "content_valid": table.content_valid(),
                }
            finally:
                table.release()
        current = doc["current"]
        if current is None:
            state = "log not found"
        elif current:
            state = "covers the whole log"
        else:  # a live writer's active segment, or a crash: an open rebuilds or completes it
            state = f"stale: the log has {log_size} bytes"
        self._emit(
            doc,
            f"key index {path}: {doc['key_entries']} key entries of {doc['key_capacity']}, "
            f"{doc['slots']} slots, {doc['tag_entries']} tag entries of {doc['tag_capacity']}; "
            f"covers {doc['covered_position']} log bytes ({state}); timestamps "
            f"{doc['min_timestamp']}..{doc['max_timestamp']}",
        )
        if current and not chains:  # a stale header's counts lag the entries: no verdict
            self._damaged(path, 0, "a hash chain links forward or past the entries")
        elif current and doc["complete"] and not doc["content_valid"]:
            self._damaged(
                path, 0, "not what was sealed: its content CRC or a chain's head does not match"
            )


def _crc_holds(view: memoryview, pos: int, info: BatchInfo) -> bool:
    """Whether the batch's stored CRC-32C matches its bytes (attributes to the end)."""
    if pos + info.size > len(view):
        return False
    with view[pos + CRC_START : pos + info.size] as covered:
        return crc32c(covered) == info.crc


def _control_marker(m: Message) -> tuple[str, int] | None:
    """(ABORT|COMMIT, coordinator epoch) of a transaction marker record, else None."""
    if m.key is None or len(m.key) < 4 or m.value is None or len(m.value) < 6:
        return None
    _version, kind = struct.unpack_from(">hh", m.key)
    _vversion, epoch = struct.unpack_from(">hi", m.value)
    return CONTROL_TYPES.get(kind, f"type{kind}"), epoch


def _size(b: bytes | None) -> int:
    return -1 if b is None else len(b)


def _text_or_dash(n: int | None) -> str:
    return "-" if n is None else str(n)
