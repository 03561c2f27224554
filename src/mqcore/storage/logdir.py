"""The store directory: writer lock, topic metadata, checkpoints and partition discovery.

Everything mqcore keeps besides segments is a plain file at the top of the directory, named so
that Kafka ignores it (Kafka treats every sub-directory as a partition, so we add none):

    .mqcore.lock                        flock()ed by the one writer process
    mqcore-topics.json                  topic -> partitions and config
    mqcore-recovery-point-checkpoint    Kafka's checkpoint text format: offsets known flushed
    mqcore-clean-shutdown               present only while no writer has the store open
    mqcore-producer-ids                 the next producer id store.producer() hands out

docs/format.md "Store directory" describes each file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re

from mqcore.config import TopicConfig, validate_name
from mqcore.errors import CorruptIndexError, StoreError, StoreLockedError
from mqcore.storage import durable

LOCK_FILE = ".mqcore.lock"
TOPICS_FILE = "mqcore-topics.json"
RECOVERY_CHECKPOINT = "mqcore-recovery-point-checkpoint"
KAFKA_RECOVERY_CHECKPOINT = "recovery-point-offset-checkpoint"
CLEAN_SHUTDOWN = "mqcore-clean-shutdown"
PRODUCER_IDS = "mqcore-producer-ids"
KAFKA_CLEAN_SHUTDOWN = ".kafka_cleanshutdown"

_PARTITION_DIR = re.compile(r"(.+)-(\d+)")


class LogDirectory:
    """File-level services of one store directory; holds no message data itself."""

    def __init__(self, path: str, writable: bool):
        self.path = os.path.abspath(path)
        self.writable = writable
        self._lock_fd = -1
        if writable:
            os.makedirs(self.path, exist_ok=True)
            self._acquire_lock()
        elif not os.path.isdir(self.path):
            raise StoreError(f"store directory {self.path} does not exist")

    # -- the writer lock ----------------------------------------------------------------------

    def _acquire_lock(self) -> None:
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLockedError(
                    f"{self.path} is open for writing elsewhere (lock {LOCK_FILE} is held); "
                    f"open it with read_only=True to read alongside the writer"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def release(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- clean-shutdown marker ------------------------------------------------------------------

    def was_clean(self) -> bool:
        """True when the last writer closed cleanly (ours or Kafka's marker is present)."""
        return any(
            os.path.exists(os.path.join(self.path, n))
            for n in (CLEAN_SHUTDOWN, KAFKA_CLEAN_SHUTDOWN)
        )

    def clear_clean_marker(self) -> None:
        """Deleted when a writer opens, so a crash while loading counts as unclean."""
        for name in (CLEAN_SHUTDOWN, KAFKA_CLEAN_SHUTDOWN):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        self.fsync_dir()

    def write_clean_marker(self) -> None:
        self._write_atomic(CLEAN_SHUTDOWN, b"")

    # -- topics metadata ------------------------------------------------------------------------

    def load_topics(self) -> dict[str, TopicConfig]:
        """Topics from mqcore-topics.json, plus partition directories it does not list (a Kafka
        log directory, or partitions created outside mqcore)."""
        topics: dict[str, TopicConfig] = {}
        meta = os.path.join(self.path, TOPICS_FILE)
        if os.path.exists(meta):
            try:
                with open(meta, encoding="utf-8") as f:
                    data = json.load(f)
                for name, cfg in data.get("topics", {}).items():
                    topics[validate_name(name)] = TopicConfig.from_json(cfg)
            except (ValueError, TypeError, AttributeError) as e:
                raise StoreError(f"{meta} is not valid mqcore topic metadata: {e}") from e
        for name, count in self.discover_partitions().items():
            if name not in topics:
                topics[name] = TopicConfig(partitions=count)
            elif topics[name].partitions < count:
                topics[name] = topics[name].with_changes(partitions=count)
        return topics

    def discover_partitions(self) -> dict[str, int]:
        """topic -> partition count from `<topic>-<n>` directories holding `.log` files."""
        found: dict[str, set[int]] = {}
        for entry in os.scandir(self.path):
            m = _PARTITION_DIR.fullmatch(entry.name)
            if not m or not entry.is_dir():
                continue
            topic, part = m.group(1), int(m.group(2))
            try:
                validate_name(topic)
            except ValueError:
                continue
            if any(n.endswith(".log") for n in os.listdir(entry.path)):
                found.setdefault(topic, set()).add(part)
        return {t: max(parts) + 1 for t, parts in found.items()}

    def save_topics(self, topics: dict[str, TopicConfig]) -> None:
        doc = {"version": 1, "topics": {n: c.to_json() for n, c in sorted(topics.items())}}
        self._write_atomic(TOPICS_FILE, json.dumps(doc, indent=1).encode())

    def partition_dir(self, topic: str, partition: int) -> str:
        return os.path.join(self.path, f"{validate_name(topic)}-{int(partition)}")

    # -- recovery-point checkpoint (Kafka's OffsetCheckpointFile text format) -------------------

    def load_recovery_points(self) -> dict[tuple[str, int], int]:
        """topic/partition -> offset below which data is known flushed."""
        for name in (RECOVERY_CHECKPOINT, KAFKA_RECOVERY_CHECKPOINT):
            path = os.path.join(self.path, name)
            if os.path.exists(path):
                return _read_checkpoint(path)
        return {}

    def save_recovery_points(self, points: dict[tuple[str, int], int]) -> None:
        lines = ["0", str(len(points))]
        lines += [f"{t} {p} {o}" for (t, p), o in sorted(points.items())]
        self._write_atomic(RECOVERY_CHECKPOINT, ("\n".join(lines) + "\n").encode())

    # -- producer ids -------------------------------------------------------------------------

    def load_next_producer_id(self) -> int:
        """The next producer id to allocate (0 when none was ever allocated)."""
        path = os.path.join(self.path, PRODUCER_IDS)
        try:
            with open(path, encoding="ascii") as f:
                text = f.read()
        except FileNotFoundError:
            return 0
        if not text.endswith("\n") or not text[:-1].isdigit():
            raise StoreError(f"{path} does not hold a producer id counter: {text[:40]!r}")
        return int(text)

    def save_next_producer_id(self, next_id: int) -> None:
        """Persist the counter (atomic, fsync'd) before the ids below it are handed out."""
        self._write_atomic(PRODUCER_IDS, f"{next_id}\n".encode())

    # -- helpers --------------------------------------------------------------------------------

    def _write_atomic(self, name: str, data: bytes) -> None:
        """Replace a top-level file durably (storage/durable.py write_atomic)."""
        durable.write_atomic(os.path.join(self.path, name), data)

    def fsync_dir(self) -> None:
        durable.sync_dir(self.path)


def _read_checkpoint(path: str) -> dict[tuple[str, int], int]:
    """Parse Kafka's checkpoint format: version line 0, entry count, `topic partition offset`."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        lines = raw.decode("utf-8").splitlines()
        if lines[0].strip() != "0":
            raise ValueError(f"unknown checkpoint version {lines[0]!r}")
        count = int(lines[1])
        out: dict[tuple[str, int], int] = {}
        for line in lines[2 : 2 + count]:
            topic, part, off = line.split()
            out[(topic, int(part))] = int(off)
        if len(out) != count:
            raise ValueError(f"{count} entries announced, {len(out)} found")
        return out
    except (IndexError, ValueError) as e:
        # a damaged checkpoint only costs a longer recovery: scan everything
        raise CorruptIndexError(f"{path}: {e}") from e
