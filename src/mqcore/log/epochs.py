"""The leader-epoch cache of one partition and its `leader-epoch-checkpoint` file (Kafka's
LeaderEpochFileCache): which leader epoch began at which offset, so a replica that changes
leader can ask where an epoch ended and truncate to it.

File `<partition dir>/leader-epoch-checkpoint`, Kafka's checkpoint text format (docs/format.md
"Leader-epoch checkpoint"), one entry a line, start offsets and epochs ascending:

    0                       version
    <count>                 entries
    <epoch> <start_offset>  per entry, one space between
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from mqcore.errors import InvalidConfigError, StoreError
from mqcore.storage import durable

_log = logging.getLogger("mqcore")

CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Leader epoch `epoch` wrote its first batch at `start_offset`."""

    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The (epoch, start offset) entries of one partition, kept in memory and in its
    checkpoint file (rewritten atomically on every change)."""

    def __init__(
        self,
        directory: str,
        sync: bool = True,
        derive: Callable[[], list[EpochEntry]] | None = None,
        writable: bool = True,
    ):
        self.path = os.path.join(directory, CHECKPOINT_FILE)
        # fsync the file and its directory at every change, whatever the flush policy: it
        # changes only with the leader epoch, and a power loss must not leave it torn
        self._sync = sync
        self._lock = threading.Lock()
        try:
            self._entries: list[EpochEntry] = read_checkpoint(self.path)
        except StoreError:
            if derive is None:
                raise
            # torn by a power loss (a store written before the file was always synced): the
            # batches' partitionLeaderEpoch say the same, so the cache is made from them again
            _log.warning("%s is damaged: the leader epochs are read from the log again",
                         self.path)  # fmt: skip
            self._entries = derive()
            if writable:  # a read-only opener changes nothing on disk
                self._write()

    @property
    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        with self._lock:
            return self._entries[-1].epoch if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset` (Kafka's assign): nothing when it is
        the latest epoch already starting there or earlier; else entries for this or a later
        epoch, or starting at or after this offset, go first (the log was truncated under
        them), and the entry is added. Returns whether the file changed."""
        if epoch < 0 or start_offset < 0:
            raise InvalidConfigError(
                f"leader epoch {epoch} and start offset {start_offset} must be >= 0"
            )
        with self._lock:
            last = self._entries[-1] if self._entries else None
            if last is not None and last.epoch == epoch and last.start_offset <= start_offset:
                return False
            while self._entries and (
                self._entries[-1].epoch >= epoch or self._entries[-1].start_offset >= start_offset
            ):
                self._entries.pop()
            self._entries.append(EpochEntry(epoch, start_offset))
            self._write()
            return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for a requested epoch, by Kafka's rules (OffsetsForLeaderEpoch):
        the latest epoch ends at the log end; an older known epoch ends where the next higher
        epoch starts, answered with the largest known epoch at or below it; an epoch below
        every known one ends where the first starts; an unknown later epoch, or no entries,
        gives (-1, -1)."""
        with self._lock:
            if epoch == UNDEFINED_EPOCH or not self._entries:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if self._entries[-1].epoch == epoch:
                return epoch, log_end_offset
            epochs = [e.epoch for e in self._entries]
            higher = bisect.bisect_right(epochs, epoch)
            if higher == len(epochs):
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if higher == 0:
                return epoch, self._entries[0].start_offset
            return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """The log was truncated to end at `end_offset`: entries starting at or after it go."""
        with self._lock:
            if not self._entries or self._entries[-1].start_offset < end_offset:
                return
            self._entries = [e for e in self._entries if e.start_offset < end_offset]
            self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved to `start_offset`: entries starting at or below it go, and the
        last of them comes back starting at `start_offset` (its epoch still holds it)."""
        with self._lock:
            gone = [e for e in self._entries if e.start_offset <= start_offset]
            if not gone or (len(gone) == 1 and gone[0].start_offset == start_offset):
                return
            keep = [e for e in self._entries if e.start_offset > start_offset]
            self._entries = [EpochEntry(gone[-1].epoch, start_offset), *keep]
            self._write()

    def clear(self) -> None:
        with self._lock:
            if self._entries or os.path.exists(self.path):
                self._entries = []
                self._write()

    def _write(self) -> None:
        durable.write_atomic(self.path, encode_checkpoint(self._entries), sync=self._sync)


def encode_checkpoint(entries: list[EpochEntry]) -> bytes:
    lines = ["0", str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


def read_checkpoint(path: str) -> list[EpochEntry]:
    """The entries of a checkpoint file ([] when there is none); StoreError naming the file
    and the line when it is not Kafka's version-0 format with ascending entries."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("ascii")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise StoreError(f"{path}: not a leader-epoch checkpoint ({e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or lines[0] != "0" or not lines[1].isdigit():
        raise StoreError(f"{path}: not a version-0 leader-epoch checkpoint")
    count = int(lines[1])
    if len(lines) != 2 + count:
        raise StoreError(f"{path}: says {count} entries, holds {len(lines) - 2}")
    out: list[EpochEntry] = []
    for n, line in enumerate(lines[2:], start=3):
        parts = line.split(" ")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise StoreError(f"{path} line {n}: {line!r} is not '<epoch> <start_offset>'")
        entry = EpochEntry(int(parts[0]), int(parts[1]))
        if out and (entry.epoch <= out[-1].epoch or entry.start_offset < out[-1].start_offset):
            raise StoreError(f"{path} line {n}: entries must ascend")
        out.append(entry)
    return out


__all__ = [
    "CHECKPOINT_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
    "encode_checkpoint",
    "read_checkpoint",
]
