"""Loading a partition directory: its segments as the swap protocol names them, and the
completion of what a crash interrupted (a committed compaction swap, a retention deletion).

The partition (storage/partition.py) opens what segment_layout() lists; the cleaner
(storage/cleaner.py) commits a swap and calls finish_swap(); a writable open calls
tidy_directory() first, then recovers the segments from its recovery point on with
first_to_recover() and recover_segment() (docs/operations.md "Recovery"). The `.cleanmark`
reader lives here because a committed swap's `.cleanmark` names the segments it replaced
(docs/format.md, docs/consume.md "Swap protocol").
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import struct
from dataclasses import dataclass, field

from mqcore._ext.crc32c import crc32c
from mqcore.crashpoints import crash_point
from mqcore.errors import CorruptRecordError
from mqcore.storage import durable
from mqcore.storage.keyindex import KEYINDEX_SUFFIX
from mqcore.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    LogSegment,
    segment_name,
)
from mqcore.storage.txnindex import TXNINDEX_SUFFIX

# the cleaner builds a new segment here before moving its files in as `.cleaned`
SCRATCH_DIR = "cleaner.tmp"
# a segment file renamed for compaction's swap: the commit of the new segment
SWAP_SUFFIX = ".swap"
# `<base>.cleanmark`: when the cleaner first cleaned the segment (storage/cleaner.py)
CLEANMARK_SUFFIX = ".cleanmark"
# every file of one segment, in the order a swap renames them: the .log last (the commit)
SEGMENT_FILE_SUFFIXES = (
    INDEX_SUFFIX,
    TIMEINDEX_SUFFIX,
    KEYINDEX_SUFFIX,
    TXNINDEX_SUFFIX,
    CLEANMARK_SUFFIX,
    LOG_SUFFIX,
)

# `<base>.cleanmark`: magic, version, 3 pad bytes, first_cleaned_ms, end offset, then a CRC32C
CLEANMARK = struct.Struct(">4sB3xqq")
CLEANMARK_MAGIC = b"MQCM"
CLEANMARK_BYTES = CLEANMARK.size + 4


@dataclass
class RecoveryReport:
    """What opening a partition found and did (logged by the store, asserted by tests)."""

    segments: int = 0
    recovered_segments: list[str] = field(default_factory=list)
    truncated_bytes: int = 0
    rebuilt_indexes: list[str] = field(default_factory=list)
    deleted_segments: list[str] = field(default_factory=list)
    # "file@position" of zero holes a power loss left before later data; cut there
    unflushed_holes: list[str] = field(default_factory=list)


def read_cleanmark_fields(path: str) -> tuple[int, int] | None:
    """(first_cleaned_ms, end_offset) from a `.cleanmark`, or None (missing or not valid)."""
    try:
        with open(path, "rb") as f:
            data = f.read(CLEANMARK_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) != CLEANMARK_BYTES:
        return None
    head = data[: CLEANMARK.size]
    if int.from_bytes(data[CLEANMARK.size :], "big") != crc32c(head):
        return None
    magic, version, ms, end = CLEANMARK.unpack(head)
    if magic != CLEANMARK_MAGIC or version != 1 or ms < 0 or end < 0:
        return None
    return int(ms), int(end)


def has_segments(directory: str) -> bool:
    """Whether a partition directory exists and holds at least one segment."""
    try:
        return bool(segment_layout(directory))
    except FileNotFoundError:
        return False


def _segment_files(names: list[str]) -> dict[int, set[str]]:
    """base offset -> the suffixes present (".log", ".index.swap", ...) of segment files."""
    out: dict[int, set[str]] = {}
    for name in names:
        stem, dot, rest = name.partition(".")
        if not dot or len(stem) != 20 or not stem.isdigit():
            continue
        suffix = "." + rest
        if suffix.removesuffix(SWAP_SUFFIX) in SEGMENT_FILE_SUFFIXES:
            out.setdefault(int(stem), set()).add(suffix)
    return out


def segment_layout(directory: str) -> list[tuple[int, dict[str, str]]]:
    """(base offset, suffix -> path) of each segment of a partition directory, ascending, as
    the directory stands at this moment, in compaction's swap protocol (docs/consume.md
    "Swap protocol"): a `<base>.log.swap` means a swap committed and not yet finished, so that
    segment is its new files (the `.swap` one of each kind where it is still there, else the
    final name, already replaced) and the later segments its new `.cleanmark` covers are gone;
    `.swap` files without a `.log.swap` were never committed. At every step of a swap this
    names one whole, consistent set of files, so a reader beside the writer never sees a hole."""
    files = _segment_files(os.listdir(directory))
    layout: dict[int, dict[str, str]] = {}
    superseded: list[tuple[int, int]] = []
    for base, present in files.items():
        stem = os.path.join(directory, segment_name(base))
        if LOG_SUFFIX + SWAP_SUFFIX in present:
            paths = {}
            for suffix in SEGMENT_FILE_SUFFIXES:
                if suffix + SWAP_SUFFIX in present:
                    paths[suffix] = stem + suffix + SWAP_SUFFIX
                elif suffix in present:
                    paths[suffix] = stem + suffix
            layout[base] = paths
            end = _covered_end(paths.get(CLEANMARK_SUFFIX))
            if end is not None:
                superseded.append((base, end))
        elif LOG_SUFFIX in present:
            layout[base] = {s: stem + s for s in SEGMENT_FILE_SUFFIXES if s in present}
    for base, end in superseded:
        for other in [b for b in layout if base < b < end]:
            del layout[other]
    return sorted(layout.items())


def _covered_end(cleanmark: str | None) -> int | None:
    """The end offset a swap's new `.cleanmark` says its segment covers (merged segments)."""
    if cleanmark is None:
        return None
    fields = read_cleanmark_fields(cleanmark)
    return None if fields is None else fields[1]


def tidy_directory(directory: str) -> None:
    """What a writable open does first: drop the cleaner's scratch directory and every
    `.cleaned`, `.deleted` and `.tmp` file, finish a committed swap (finish_swap), drop
    uncommitted `.swap` files, and remove the files of a base that has no `.log` (what a
    retention deletion leaves when it stops after renaming the `.log`)."""
    scratch = os.path.join(directory, SCRATCH_DIR)
    if os.path.isdir(scratch):
        shutil.rmtree(scratch)
    changed = False
    for name in os.listdir(directory):
        if name.endswith((".cleaned", ".deleted", ".tmp")):
            os.unlink(os.path.join(directory, name))
            changed = True
    for base, paths in segment_layout(directory):
        if paths[LOG_SUFFIX].endswith(SWAP_SUFFIX):
            finish_swap(directory, base, paths)
            changed = True
    layout = dict(segment_layout(directory))
    for base, present in sorted(_segment_files(os.listdir(directory)).items()):
        stem = os.path.join(directory, segment_name(base))
        for suffix in present:
            if base not in layout or suffix.endswith(SWAP_SUFFIX):
                os.unlink(stem + suffix)
                changed = True
    if changed:
        durable.sync_dir(directory)


def finish_swap(directory: str, base: int, new: dict[str, str]) -> None:
    """The steps of a committed swap after its commit (cleaner.swap_in, and recovery when a
    crash stopped it): every new file but the `.log` takes its final name (an old file of a kind
    the new segment lacks goes), the segments merged into it go (the range its new `.cleanmark`
    covers), and the new `.log` replaces the old one last. Each step is one atomic rename or
    unlink, so a reader's listing always names one consistent set of files (segment_layout)."""
    stem = os.path.join(directory, segment_name(base))
    for suffix in SEGMENT_FILE_SUFFIXES[:-1]:  # all but the .log
        path = new.get(suffix)
        if path is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stem + suffix)
        elif path.endswith(SWAP_SUFFIX):
            os.replace(path, stem + suffix)
    end = _covered_end(stem + CLEANMARK_SUFFIX)
    if end is not None:
        for other, present in _segment_files(os.listdir(directory)).items():
            if base < other < end:
                other_stem = os.path.join(directory, segment_name(other))
                for suffix in sorted(present, key=lambda x: not x.startswith(LOG_SUFFIX)):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(other_stem + suffix)  # the .log first: gone from listings
    durable.sync_dir(directory)
    crash_point("compact.after_deleted")
    os.replace(stem + LOG_SUFFIX + SWAP_SUFFIX, stem + LOG_SUFFIX)
    durable.sync_dir(directory)


def first_to_recover(bases: list[int], recovery_point: int | None, clean: bool) -> int:
    """Index of the first segment to scan: the one holding the recovery point."""
    if clean:
        return len(bases)
    if recovery_point is None:
        return 0
    return max(0, bisect.bisect_right(bases, recovery_point) - 1)


def recover_segment(
    segments: list[LogSegment], i: int, report: RecoveryReport, recovery_point: int, writable: bool
) -> None:
    """Scan segments[i]; cut a torn tail, refuse damage that has good data after it. The
    segments after a cut leave `segments` (deleted when `writable`).

    Good data after bad bytes is damage, never a tail, unless (a) the bad batch lies at or
    past the recovery point (offsets below it were flushed, so damage there is always
    refused) and (b) the bad bytes hold a zero hole, a whole 4 KiB page of zeros: the mark of
    a power loss that kept some pages written after the last flush and lost earlier ones.
    Every acknowledged append under flush="always" was fdatasync'd with all the pages before
    it, so such a hole lies after the last acknowledged message and cutting there loses
    nothing that was acknowledged (docs/operations.md "Recovery").
    """
    seg = segments[i]
    outcome = seg.recover()
    name = os.path.basename(seg.log_path)
    report.recovered_segments.append(name)
    report.rebuilt_indexes.append(name)
    if outcome.valid_bytes == outcome.file_bytes and outcome.error is None:
        return
    bad = outcome.valid_bytes
    later = [s for s in segments[i + 1 :] if s.size > 0]
    good_after = seg.first_valid_batch_after(bad, seg.next_offset)
    if good_after is None and seg.has_valid_batch_at(bad):
        good_after = bad
    if later or good_after is not None:
        end = good_after if good_after is not None else outcome.file_bytes
        if good_after == bad or seg.next_offset < recovery_point or not seg.has_zero_hole(bad, end):
            raise CorruptRecordError(
                (outcome.error or "batch cut short") + " (valid batches follow, so this is "
                "not a torn tail; mqcore will not drop them silently)",
                path=seg.log_path,
                position=bad,
            )
        report.unflushed_holes.append(f"{name}@{bad}")
    for extra in segments[i + 1 :]:
        report.deleted_segments.append(os.path.basename(extra.log_path))
        report.truncated_bytes += extra.size
        extra.delete() if writable else extra.close()  # read-only: just stop there
    del segments[i + 1 :]
    if writable:
        seg.truncate_to(bad)
    report.truncated_bytes += outcome.file_bytes - bad


__all__ = [
    "CLEANMARK_SUFFIX",
    "RecoveryReport",
    "SCRATCH_DIR",
    "SEGMENT_FILE_SUFFIXES",
    "SWAP_SUFFIX",
    "finish_swap",
    "first_to_recover",
    "has_segments",
    "read_cleanmark_fields",
    "recover_segment",
    "segment_layout",
    "tidy_directory",
]
