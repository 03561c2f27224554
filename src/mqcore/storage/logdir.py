"""The store directory: writer lock, topic metadata, checkpoints and partition discovery.

Everything mqcore keeps besides segments is a plain file at the top of the directory, named so
that Kafka ignores it (Kafka treats every sub-directory as a partition, so we add none):

    .mqcore.lock                        "<pid> opening" or "<pid> open", then who the writer is
                                        if it said (describe_holder: "mqcore serve on
                                        127.0.0.1:9092"): the writer and whether it finished
                                        recovery (the lock is a flock() on the directory itself)
    mqcore-topics.json                  topic -> partitions and config
    mqcore-recovery-point-checkpoint    Kafka's checkpoint text format: offsets known flushed
    mqcore-clean-shutdown               present only while no writer has the store open
    mqcore-producer-ids                 the next producer id store.producer() hands out
    <topic>-<n>.<hex>-delete/           a deleted topic's partition, removed at once (or at the
                                        next writable open after a crash), as Kafka names them

docs/format.md "Store directory" describes each file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import time
import uuid

from mqcore.config import MAX_PARTITIONS, TopicConfig, validate_name
from mqcore.errors import CorruptIndexError, NotAStoreError, StoreError, StoreLockedError
from mqcore.storage import durable

LOCK_FILE = ".mqcore.lock"
TOPICS_FILE = "mqcore-topics.json"
RECOVERY_CHECKPOINT = "mqcore-recovery-point-checkpoint"
KAFKA_RECOVERY_CHECKPOINT = "recovery-point-offset-checkpoint"
CLEAN_SHUTDOWN = "mqcore-clean-shutdown"
PRODUCER_IDS = "mqcore-producer-ids"
KAFKA_CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
# files a Kafka broker keeps at the top of a log directory (any one marks it as one)
KAFKA_FILES = (
    KAFKA_RECOVERY_CHECKPOINT,
    KAFKA_CLEAN_SHUTDOWN,
    "meta.properties",
    "log-start-offset-checkpoint",
    "replication-offset-checkpoint",
    "cleaner-offset-checkpoint",
)

_PARTITION_DIR = re.compile(r"(.+)-(\d+)")
DELETE_SUFFIX = "-delete"  # Kafka's name for a partition directory of a deleted topic
_DELETED_DIR = re.compile(r"(.+)-(\d+)\.([0-9a-f]{32})" + DELETE_SUFFIX)
LOCK_PATIENCE = 0.25  # seconds a writable open waits out readers' lock probes
HOLDER_CHARS = 200  # the most of a holder's description .mqcore.lock keeps


class LogDirectory:
    """File-level services of one store directory; holds no message data itself."""

    def __init__(self, path: str, writable: bool, create: bool = True):
        """A writable one with `create` makes the directory when it is missing; any other
        raises NotAStoreError, before touching anything, for a path that is not a store."""
        self.path = os.path.abspath(path)
        self.writable = writable
        self._topics_text = TopicsText()
        self._lock_fd = -1
        if not (writable and create):
            why = not_a_store(self.path)
            if why is not None:
                raise NotAStoreError(f"{self.path} is not an mqcore store or Kafka log directory: "
                                     f"{why}")  # fmt: skip
        # a writable open of a directory that holds nothing (made now, or empty): a new store,
        # whose first files need no fsync (Log._load)
        self.fresh = False
        if writable:
            made = not os.path.lexists(self.path)
            os.makedirs(self.path, exist_ok=True)
            # a directory made just now has no .mqcore.lock: readers take that as "opening"
            # already (writer_state), so the first state written is "open" (mark_open)
            self.acquire_lock(announce=not made)
            self.fresh = all(n.startswith(LOCK_FILE) for n in os.listdir(self.path))

    # -- what a store is ----------------------------------------------------------------------

    # -- the writer lock ----------------------------------------------------------------------

    def acquire_lock(self, announce: bool = True) -> None:
        """Take the writer lock: at open, and again after release() (`mqcore verify --repair`
        lets a store open recover the directory in between). flock() the store directory
        itself, exclusively: unlike a lock file, it cannot be deleted or replaced while held,
        so no second writer ever gets in. `.mqcore.lock` only tells who holds it (never
        followed if it is a symbolic link); `announce=False` leaves it alone (there is none)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            deadline = time.monotonic() + LOCK_PATIENCE
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    # a reader's probe (writer_is_live) holds a shared lock for microseconds
                    if time.monotonic() >= deadline:
                        holder = self.lock_holder()
                        raise StoreLockedError(
                            f"{self.path} is open for writing by another process ({holder}); "
                            "one process writes a store at a time: read beside it with "
                            "read_only=True, or write from that process",
                            self.path,
                            holder,
                        ) from None
                    time.sleep(0.005)
            if announce:
                self._write_state("opening")
        except BaseException:
            os.close(fd)
            raise
        self._lock_fd = fd

    def mark_open(self) -> None:
        """The writer finished loading and recovery: readers may take the log as whole."""
        self._write_state("open")

    def _write_state(self, state: str) -> None:
        """`<pid> <state>` in .mqcore.lock, replaced in one rename (readers never see half)."""
        # a symbolic link left there is replaced by the rename, never written through
        path = os.path.join(self.path, LOCK_FILE)
        durable.write_atomic(path, f"{os.getpid()} {state}\n".encode(), sync=False)

    def _lock_text(self) -> list[str]:
        return _lock_words(self.path)

    def lock_holder(self) -> str:
        """Who holds the writer lock, from `.mqcore.lock` (for messages): "pid 123", or with
        what the holder said of itself, "mqcore serve on 127.0.0.1:9092, pid 123"."""
        words = self._lock_text()
        pid = f"pid {words[0]}" if words and words[0].isdigit() else "pid unknown"
        said = " ".join(words[2:])
        return f"{said}, {pid}" if said else pid

    def writer_state(self) -> str | None:
        """None when no writer holds the store, else "opening" (still loading and recovering:
        files may be cut or removed) or "open" (a shared flock probe, released at once)."""
        if not _writer_holds(self.path):
            return None
        words = self._lock_text()
        return "open" if words[1:2] == ["open"] else "opening"

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
        """Deleted when a writer opens, so a crash while loading counts as unclean; the
        deletion made durable (unless the store is new: it never had a marker). When no marker
        is found the directory is synced all the same: a writer killed between its unlink and
        its fsync may have left the deletion in the page cache only."""
        for name in (CLEAN_SHUTDOWN, KAFKA_CLEAN_SHUTDOWN):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        if not self.fresh:
            self.fsync_dir()

    def write_clean_marker(self) -> None:
        """Written last at close; its directory fsync also makes durable the names of the
        files written before it without one (the checkpoint's, close's). The marker is read by
        its name alone and holds no byte, so it is created in place (no half-written file to
        rename over) and only its name is synced: an fsync of the empty file would add its
        inode's times and nothing a reader looks at."""
        fd = durable.open_store_file(
            os.path.join(self.path, CLEAN_SHUTDOWN), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        )
        os.close(fd)
        self.fsync_dir()

    # -- topics metadata ------------------------------------------------------------------------

    def load_topics(self) -> dict[str, TopicConfig]:
        """The topics of the store.

        An mqcore store declares them in mqcore-topics.json, and only those partitions are
        opened: a `<topic>-<n>` directory it does not declare is stray, listed in
        `self.stray` and never opened or acted on (one named `t-999999` must not make an open
        create a million partitions). A directory without that file is a Kafka log directory:
        its topics are the `<topic>-<n>` directories holding `.log` files (numbers up to
        MAX_PARTITIONS; others are stray too). `self.deleting`: topic -> partition count of
        the deletions a crash interrupted (finish_deletions completes them).
        """
        self.stray: list[str] = []
        meta = os.path.join(self.path, TOPICS_FILE)
        self.deleting: dict[str, int] = {}
        if not os.path.exists(meta):
            return {t: TopicConfig(partitions=max(ps) + 1) for t, ps in self._discover().items()}
        topics: dict[str, TopicConfig] = {}
        deleting = self.deleting
        try:
            with open(meta, encoding="utf-8") as f:
                data = json.load(f)
            for name, cfg in data.get("topics", {}).items():
                topics[validate_name(name)] = TopicConfig.from_json(cfg)
            for name, count in data.get("deleting", {}).items():
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    raise ValueError(f"deleting {name!r}: {count!r} is not a partition count")
                if name not in data.get("topics", {}):  # created again: the new one stays
                    deleting[validate_name(name)] = count
        except (ValueError, TypeError, AttributeError) as e:
            raise StoreError(f"{meta} is not valid mqcore topic metadata: {e}") from e
        for name, parts in self._discover().items():
            # a topic being deleted is no stray: finish_deletions removes its directories
            declared = topics[name].partitions if name in topics else deleting.get(name, 0)
            self.stray += [self.partition_dir(name, p) for p in sorted(parts) if p >= declared]
        self.stray.sort()
        return topics

    def _discover(self) -> dict[str, set[int]]:
        """topic -> partition numbers of the `<topic>-<n>` directories holding `.log` files;
        a number past MAX_PARTITIONS, or a leading zero, is stray (no partition is named so)."""
        found: dict[str, set[int]] = {}
        for entry in os.scandir(self.path):
            m = _PARTITION_DIR.fullmatch(entry.name)
            if not m or not entry.is_dir(follow_symlinks=False):
                continue
            topic, number = m.group(1), m.group(2)
            try:
                validate_name(topic)
            except ValueError:
                continue
            if not any(n.endswith(".log") for n in os.listdir(entry.path)):
                continue
            if int(number) >= MAX_PARTITIONS or number != str(int(number)):
                self.stray.append(entry.path)
                continue
            found.setdefault(topic, set()).add(int(number))
        return found

    def save_topics(
        self,
        topics: dict[str, TopicConfig],
        deleting: dict[str, int] | None = None,
        sync: bool = True,
    ) -> None:
        """Write the topic list durably; `deleting` (topic -> partition count) names topics
        whose partition directories are still to be retired: an open after a crash finishes
        those deletions (load_topics), so a deleted topic never comes back half."""
        self._write_atomic(
            TOPICS_FILE, self._topics_text.text(topics, deleting).encode(), sync=sync
        )

    def finish_deletions(self) -> None:
        """At a writable open: finish the deletions a crash interrupted (the topics that
        load_topics found still `deleting`), then remove every `-delete` directory. The caller
        saves the topic list afterwards, which drops the `deleting` entries."""
        for name, count in self.deleting.items():
            self.retire_partitions(name, count)
        self.remove_deleted()

    def retire_partitions(self, topic: str, count: int) -> list[str]:
        """Rename the directories `<topic>-<n>` (n < count) that exist to Kafka's
        `<topic>-<n>.<hex>-delete`, durably: from then on no open sees them as partitions.
        Returns the new paths (remove_trees takes them)."""
        renamed = []
        for p in range(count):
            src = self.partition_dir(topic, p)
            if os.path.isdir(src) and not os.path.islink(src):
                renamed.append(f"{src}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
                os.rename(src, renamed[-1])
        if renamed:
            self.fsync_dir()
        return renamed

    def remove_trees(self, paths: list[str]) -> None:
        """Remove these directories (one deletion's `-delete` ones, or a failed creation's
        new ones) and what they hold, then fsync the store directory once. Only the caller's
        own: another deletion may be removing its directories at the same time."""
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        if paths:
            self.fsync_dir()

    def remove_deleted(self) -> None:
        """Remove every `<topic>-<n>.<hex>-delete` directory (a deleted topic's partitions;
        Kafka's too: it removes them the same way after a restart)."""
        removed = False
        for entry in os.scandir(self.path):
            if _DELETED_DIR.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
                removed = True
        if removed:
            self.fsync_dir()

    def partition_numbers(self) -> dict[str, set[int]]:
        """topic -> the numbers of its `<topic>-<n>` directories at the top of the store (a
        link to one included: opening it is refused, Partition.open)."""
        found: dict[str, set[int]] = {}
        for entry in os.scandir(self.path):
            m = _PARTITION_DIR.fullmatch(entry.name)
            if m and entry.is_dir() and m.group(2) == str(int(m.group(2))):
                found.setdefault(m.group(1), set()).add(int(m.group(2)))
        return found

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

    def save_recovery_points(
        self, points: dict[tuple[str, int], int], sync: bool = True, sync_dir_now: bool = True
    ) -> None:
        lines = ["0", str(len(points))]
        lines += [f"{t} {p} {o}" for (t, p), o in sorted(points.items())]
        data = ("\n".join(lines) + "\n").encode()
        self._write_atomic(RECOVERY_CHECKPOINT, data, sync=sync, sync_dir_now=sync_dir_now)

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

    def _write_atomic(
        self, name: str, data: bytes, sync: bool = True, sync_dir_now: bool = True
    ) -> None:
        """Replace a top-level file durably (storage/durable.py write_atomic)."""
        path = os.path.join(self.path, name)
        durable.write_atomic(path, data, sync=sync, sync_dir_now=sync_dir_now)

    def fsync_dir(self) -> None:
        durable.sync_dir(self.path)


class TopicsText:
    """mqcore-topics.json's text (docs/format.md), exactly what json.dumps(doc, indent=1)
    writes, with each topic's entry encoded once and kept while its settings object stays the
    same: encoding the whole list at every creation made creating N topics cost N**2 / 2
    encodings (1,000 topics: a minute and a half)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[TopicConfig, str]] = {}

    def text(self, topics: dict[str, TopicConfig], deleting: dict[str, int] | None) -> str:
        doc: dict[str, object] = {"version": 1, "topics": {}}
        if deleting:
            doc["deleting"] = dict(sorted(deleting.items()))
        text = json.dumps(doc, indent=1)
        if not topics:
            return text
        entries = ",\n".join(self._entry(name, topics[name]) for name in sorted(topics))
        if len(self._entries) > 2 * len(topics):  # deleted topics' entries
            self._entries = {n: e for n, e in self._entries.items() if n in topics}
        head, tail = text.split('"topics": {}', 1)
        return f'{head}"topics": {{\n{entries}\n }}{tail}'

    def _entry(self, name: str, cfg: TopicConfig) -> str:
        kept = self._entries.get(name)
        if kept is not None and kept[0] is cfg:
            return kept[1]
        body = json.dumps(cfg.to_json(), indent=1).replace("\n", "\n  ")
        entry = f"  {json.dumps(name)}: {body}"
        self._entries[name] = (cfg, entry)
        return entry


def not_a_store(path: str) -> str | None:
    """Why `path` is not a store, or None when it is one (docs/operations.md "What a store
    is"): a directory holding mqcore-topics.json (every writable open writes it), a Kafka log
    directory (one of Kafka's top-level files, or a `<topic>-<n>` directory holding a `.log`),
    or a directory a live writer holds (one creating a store has not written its metadata
    yet). Looks only; opens nothing for writing."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return "it does not exist"
    except NotADirectoryError:
        return "it is a file, not a directory"
    except OSError as e:
        return f"it cannot be listed ({e.strerror})"
    if TOPICS_FILE in names or any(n in names for n in KAFKA_FILES):
        return None
    for name in names:
        full = os.path.join(path, name)
        if _PARTITION_DIR.fullmatch(name) and os.path.isdir(full) and not os.path.islink(full):
            try:
                if any(n.endswith(".log") for n in os.listdir(full)):
                    return None
            except OSError:
                continue
    if _writer_holds(path):
        return None
    what = "it is empty" if not names else f"it holds {len(names)} other entries"
    return (f"{what}: no {TOPICS_FILE}, no Kafka checkpoint file and no <topic>-<n> "
            "directory holding .log segments")  # fmt: skip


def describe_holder(path: str, text: str) -> bool:
    """Say who holds the writer lock of the store at `path` ("mqcore serve on
    127.0.0.1:9092"), for the StoreLockedError another process gets. Only the holder may:
    this process, once its open finished (the lock is held and `.mqcore.lock` reads "<our
    pid> open"); else nothing is written and False returned. One line, cut to HOLDER_CHARS
    characters; the next writer's open replaces it."""
    path = os.path.abspath(path)
    words = _lock_words(path)
    if words[:2] != [str(os.getpid()), "open"] or not _writer_holds(path):
        return False
    said = " ".join(text.split())[:HOLDER_CHARS]
    durable.write_atomic(
        os.path.join(path, LOCK_FILE), f"{os.getpid()} open {said}\n".encode(), sync=False
    )
    return True


def _lock_words(path: str) -> list[str]:
    """The words of `path`'s .mqcore.lock (ASCII; [] when there is none)."""
    try:
        fd = durable.open_file(os.path.join(path, LOCK_FILE), os.O_RDONLY)
    except OSError:
        return []
    try:
        return os.read(fd, 64 + HOLDER_CHARS * 4).decode("ascii", "replace").split()
    finally:
        os.close(fd)


def _writer_holds(path: str) -> bool:
    """A writer holds `path`'s lock (a shared flock probe, released at once)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


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
