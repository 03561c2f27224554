"""ReplicaLog: one partition's log as a broker drives it (Kafka's UnifiedLog, docs/embedding.md).

Leader and follower appends of record batches as bytes, raw reads as a file region to
sendfile(), the high watermark, the leader-epoch cache, truncation and DeleteRecords, over one
storage Partition. Every change to the segment list goes through the Partition's own methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from mqcore._ext.batch import peek_batch_header
from mqcore.clock import Clock, now_ms
from mqcore.config import FlushPolicy, TopicConfig
from mqcore.errors import (
    InvalidConfigError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    ProducerFencedError,
    RecordTooLargeError,
)
from mqcore.log.append import refuse_keyless
from mqcore.log.epochs import EpochEntry, LeaderEpochCache
from mqcore.log.internal import refuse_internal
from mqcore.storage import durable, retention
from mqcore.storage.partition import NOT_LEADING, Partition, check_timestamps
from mqcore.storage.producer_state import ProducerStateManager, check_producer_fields
from mqcore.storage.rawbatch import RawBatch, fetch_span, split_batches
from mqcore.storage.segment import LogSegment
from mqcore.storage.txnindex import (
    ABORT,
    COMMIT,
    AbortedTxn,
    batch_headers,
    encode_marker,
    marker_type,
)

Isolation = Literal["log_end", "high_watermark", "committed", "log_stable"]
ISOLATIONS = ("log_end", "high_watermark", "committed", "log_stable")


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append wrote: offsets [first_offset, last_offset] in `batches` batches of
    `records` records; `log_append_time` is the log's clock stamped on them under
    LogAppendTime, else -1; `duplicate`: an idempotent producer's resend, nothing written,
    the offsets are the original's."""

    first_offset: int
    last_offset: int
    records: int
    batches: int
    log_append_time: int
    log_start_offset: int
    duplicate: bool = False


class FileRegion:
    """Bytes [position, position + length) of a segment's `.log`, held open by `fd` (a
    descriptor of its own, so retention or compaction may rename the file meanwhile): what a
    server hands to os.sendfile(). Close it (or use `with`) when sent."""

    def __init__(self, fd: int, path: str, position: int, length: int):
        self.fd = fd
        self.path = path
        self.position = position
        self.length = length

    def sendfile(self, out_fd: int) -> int:
        """Send the whole region to `out_fd` (a socket or file) with os.sendfile; returns the
        bytes sent. A non-blocking `out_fd` raises BlockingIOError when full, as sendfile does."""
        sent = 0
        while sent < self.length:
            n = os.sendfile(out_fd, self.fd, self.position + sent, self.length - sent)
            if n == 0:
                break
            sent += n
        return sent

    def read(self) -> bytes:
        return os.pread(self.fd, self.length, self.position)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FileRegion:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


@dataclass(slots=True)
class FetchResult:
    """A read: whole batches as a file region (`region`) or as bytes (`data`, when asked for
    bytes, when nothing is there, or when the file was replaced between the walk and the open),
    and the partition's offsets at the time. `first_offset` is the base offset of the first
    batch (a fetch from inside a batch returns all of it, as Kafka's); -1 when empty."""

    region: FileRegion | None
    data: bytes
    first_offset: int
    last_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    log_end_offset: int
    # a "committed" read's aborted transactions overlapping it (txnindex.AbortedTxn), which a
    # Fetch answers in AbortedTransactions for the consumer to skip
    aborted: list[AbortedTxn] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.region.length if self.region is not None else len(self.data)

    def send(self, out_fd: int) -> int:
        """Write the records to `out_fd`: sendfile() for a region, write() for bytes."""
        if self.region is not None:
            return self.region.sendfile(out_fd)
        durable.write_all(out_fd, self.data)
        return len(self.data)

    def tobytes(self) -> bytes:
        return self.region.read() if self.region is not None else self.data

    def close(self) -> None:
        if self.region is not None:
            self.region.close()

    def __enter__(self) -> FetchResult:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ReplicaLog:
    """One partition's log for an embedding broker. Make one per open partition and keep it
    (it holds the partition's leader-epoch cache and high watermark): `ReplicaLog(partition)`,
    `high_watermark=None` starting at the log end offset (a single-replica log: all of it is
    committed); a replicating broker passes the value it checkpointed."""

    def __init__(
        self,
        partition: Partition,
        high_watermark: int | None = None,
        *,
        clock: Clock = now_ms,
        on_append: Callable[[int, int, int], None] | None = None,
    ):
        self.partition = partition
        self.clock = clock
        # on_append(base_offset, records, now) after each append that wrote: Log.replica wires
        # it to the log's append listeners (waiting consumers) and the flusher
        self._on_append = on_append
        self.leader_epochs = LeaderEpochCache(
            partition.directory, derive=lambda: epochs_in_log(partition),
            writable=partition.writable,
        )  # fmt: skip
        if partition.writable:
            # Kafka's load: an epoch past the log end (truncation cut the log and a crash came
            # before the cache followed) or before the log start is dropped
            self.leader_epochs.truncate_from_end(partition.end_offset)
            self.leader_epochs.truncate_from_start(partition.start_offset)
        self._owns_partition = False
        self._hw = partition.end_offset
        if high_watermark is not None:
            self.update_high_watermark(high_watermark)

    @classmethod
    def open(
        cls,
        directory: str,
        topic: str,
        partition: int = 0,
        config: TopicConfig | None = None,
        flush: FlushPolicy | None = None,
    ) -> ReplicaLog:
        """Open (or create) one partition directory on its own, writable, recovering it as a
        store's open would after an unclean stop; close() closes it. A store's partitions
        come from the store's log manager instead. No lock is taken: one process at a time."""
        part = Partition(
            topic, partition, directory, config or TopicConfig(), flush or FlushPolicy(), True
        )
        part.open(None, False)
        log = cls(part)
        log._owns_partition = True
        return log

    def close(self) -> None:
        """Close the partition if open() opened it (a store's partitions close with it)."""
        if self._owns_partition:
            self.partition.close()

    def __enter__(self) -> ReplicaLog:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- offsets --------------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self.partition.topic

    @property
    def config(self) -> TopicConfig:
        return self.partition.config

    @property
    def log_start_offset(self) -> int:
        return self.partition.start_offset

    @property
    def log_end_offset(self) -> int:
        return self.partition.end_offset

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def last_stable_offset(self) -> int:
        """Where a read_committed reader stops: the first offset of the oldest open
        transaction (storage/txnindex.py), at most the high watermark."""
        return min(self._hw, self.partition.last_stable_offset)

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark (the embedder's replication decides it), kept within
        [log start, log end]; returns the value set. Held in memory only."""
        _check_offset_type(offset)
        self._hw = max(self.log_start_offset, min(offset, self.log_end_offset))
        return self._hw

    @property
    def producer_state(self) -> ProducerStateManager | None:
        """The partition's idempotent-producer state (storage/producer_state.py), None when
        the store is read-only: sequence checks, known epochs, snapshots."""
        return self.partition.producer_state

    # -- appending ------------------------------------------------------------------------------

    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        *,
        transactional: bool = False,
    ) -> AppendInfo:
        """Validate one client-built v2 record batch and append it with offsets assigned.

        The bytes are checked whole (length against the buffer, magic, CRC-32C, every
        record's framing), then: at least one record with offset deltas 0..n-1 (as producers
        build them), no control batch, no transactional batch unless `transactional` (the
        caller's transaction coordinator verified that the producer's open transaction holds
        this partition: KIP-890), max_message_bytes, timestamps under
        the topic's timestamp_type (CreateTime: the configured bounds, and maxTimestamp set to
        the records' largest; LogAppendTime: stamped with the log's clock), a key on every
        record of a compacted topic (MissingKeyError naming them, decoded for those topics
        only), the producer's epoch and sequence (a resend answers the original offsets and
        writes nothing). Then, in place, without re-encoding: baseOffset and
        partitionLeaderEpoch (outside the CRC); the CRC only when a timestamp changed. A
        writable buffer (bytearray) is stamped where it is, other bytes are copied once.
        Durable as the flush policy says."""
        _check_epoch(leader_epoch)
        refuse_internal(self.topic, "produce to")  # a client-built batch: only mqcore writes these
        buf = _writable(records)
        batches = split_batches(buf, keep_offsets=False)
        if len(batches) != 1:
            raise InvalidRecordError(
                f"a leader append takes exactly one record batch, got {len(batches)} (as Kafka's "
                "produce requests of magic 2)"
            )
        batch = batches[0]
        self._check_client_batch(batch, transactional)
        batch.leader_epoch = leader_epoch
        now = self.clock()
        append_time = now if self.config.timestamp_type == "LogAppendTime" else -1
        if append_time < 0:
            check_timestamps(self.config, self.topic, batch.min_timestamp, batch.max_timestamp, now)
        batch.stamp_time(append_time)
        part = self.partition
        info = batch.info
        with part.locked():
            state = part.producer_state
            if info.producer_id >= 0 and state is not None:
                dup = state.check(
                    info.producer_id, info.producer_epoch, info.base_sequence, batch.count
                )
                if dup is not None:
                    return AppendInfo(
                        dup.base_offset, dup.last_offset, batch.count, 1, append_time,
                        self.log_start_offset, duplicate=True,
                    )  # fmt: skip
            self.leader_epochs.assign(leader_epoch, part.end_offset)
            base = part.append(batch, check_timestamps=False)
            if info.producer_id >= 0 and state is not None:
                state.record(info.producer_id, info.producer_epoch, info.base_sequence, batch)
        if self._on_append is not None:
            self._on_append(base, batch.count, now)
        return AppendInfo(
            base, batch.last_offset, batch.count, 1, append_time, self.log_start_offset
        )

    def _check_client_batch(self, batch: RawBatch, transactional: bool = False) -> None:
        info = batch.info
        if info.is_control:
            raise InvalidRecordError("clients may not append control batches")
        if info.is_transactional and not transactional:
            raise InvalidRecordError(
                "a transactional batch is appended only once a transaction coordinator "
                "verified the producer's transaction (append_as_leader(transactional=True))"
            )
        if transactional and (not info.is_transactional or info.producer_id < 0):
            raise InvalidRecordError("a transactional append takes a transactional batch")
        if batch.count == 0 or not batch.dense:
            raise InvalidRecordError(
                f"a client batch must hold records with offset deltas 0..n-1 and lastOffsetDelta "
                f"n-1 (got {batch.count} records, lastOffsetDelta {info.last_offset_delta})"
            )
        limit = self.config.max_message_bytes
        if batch.size > limit:
            raise RecordTooLargeError(
                f"record batch of {batch.size} bytes exceeds max_message_bytes={limit} of topic "
                f"{self.topic!r}; nothing was written",
                batch.size,
                limit,
            )
        if info.producer_id >= 0:
            check_producer_fields(info.producer_id, info.producer_epoch, info.base_sequence)
        if self.config.compacted:
            refuse_keyless(self.config, self.topic, batch.keys(), batch.count)

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int = 0,
        leader_epoch: int = -1,
    ) -> int:
        """End the producer's transaction in this partition with a COMMIT or ABORT control
        batch (what a transaction coordinator writes: storage/txnindex.py); returns its offset.
        An epoch older than the producer's known one is fenced (ProducerFencedError)."""
        check_producer_fields(producer_id, producer_epoch)
        if leader_epoch != -1:  # -1: none (a log no leader election ever stamped)
            _check_epoch(leader_epoch)
        kind = COMMIT if commit else ABORT
        buf = bytearray(encode_marker(producer_id, producer_epoch, kind, coordinator_epoch,
                                      self.clock()))  # fmt: skip
        batch = split_batches(memoryview(buf), keep_offsets=False)[0]
        batch.leader_epoch = leader_epoch
        part = self.partition
        with part.locked():
            state = part.producer_state
            known = None if state is None else state.known_epoch(producer_id)
            if known is not None and producer_epoch < known:
                raise ProducerFencedError(
                    f"producer {producer_id} epoch {producer_epoch} is fenced on "
                    f"{self.topic}-{part.partition}: the log has epoch {known}"
                )
            if leader_epoch >= 0:
                self.leader_epochs.assign(leader_epoch, part.end_offset)
            base = part.append(batch, check_timestamps=False)
            if state is not None:  # the header as stamped: its base offset the log's
                info = peek_batch_header(batch.buf, batch.pos)
                assert info is not None
                state.apply_batch(info, kind)
        if self._on_append is not None:
            self._on_append(base, 1, self.clock())
        return base

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches that carry their offsets (a replica copying its leader): each
        CRC-checked and framed whole, the first starting at the log end offset and each at the
        one after the previous one's last offset (a gap or overlap is refused: nothing is
        written). The leader-epoch cache takes each batch's partitionLeaderEpoch, the producer
        state each producer's batch. Durable as the flush policy says."""
        buf = memoryview(records).cast("B")
        batches = split_batches(buf, keep_offsets=True)
        expected = batches[0].base_offset
        for b in batches:
            if b.base_offset != expected:
                raise InvalidRecordError(
                    f"batch at byte {b.pos} starts at offset {b.base_offset}, expected {expected} "
                    "(the batches must follow each other without a gap); nothing was written"
                )
            expected = b.last_offset + 1
        part = self.partition
        with part.locked():
            if batches[0].base_offset != part.end_offset:
                raise InvalidRecordError(
                    f"the first batch starts at offset {batches[0].base_offset} but the log of "
                    f"{self.topic}-{part.partition} ends at {part.end_offset} (a gap or an "
                    "overlap); nothing was written"
                )
            state = part.producer_state
            for b in batches:
                if b.info.leader_epoch >= 0:
                    self.leader_epochs.assign(b.info.leader_epoch, b.base_offset)
                part.append(b, check_timestamps=False)
                if state is not None:
                    marker = marker_type(b.buf, b.pos) if b.info.is_control else None
                    state.apply_batch(b.info, marker)
        if self._on_append is not None:
            self._on_append(batches[0].base_offset, sum(b.count for b in batches), self.clock())
        return AppendInfo(
            batches[0].base_offset,
            batches[-1].last_offset,
            sum(b.count for b in batches),
            len(batches),
            -1,
            self.log_start_offset,
        )

    def flush(self) -> int:
        """fdatasync what is not yet durable; returns the offset now durable."""
        return self.partition.flush()

    # -- reading --------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        isolation: Isolation = "high_watermark",
        *,
        min_one: bool = True,
    ) -> FetchResult:
        """Whole batches from the one holding `offset`, up to `max_bytes` but at least one
        batch unless `min_one` is False (Kafka's fetch: KIP-74 lets the first partition's first
        batch past the budget, no other), from one segment, as a FileRegion to sendfile().
        `isolation`: "high_watermark" (consumers), "committed" (up to the last stable offset)
        or "log_end" (followers); "log_stable" is "committed" on a log whose every record is
        committed when appended (a node of one: up to the log's own last stable offset, the
        high watermark disregarded). OffsetOutOfRangeError below the log start or past the log
        end."""
        return self._read(offset, max_bytes, isolation, as_file=True, min_one=min_one)

    def read_bytes(
        self, offset: int, max_bytes: int, isolation: Isolation = "high_watermark"
    ) -> FetchResult:
        """read() with the batches copied into `data` (no descriptor to close)."""
        return self._read(offset, max_bytes, isolation, as_file=False)

    def _read(
        self, offset: int, max_bytes: int, isolation: str, as_file: bool, min_one: bool = True
    ) -> FetchResult:
        if isolation not in ISOLATIONS:
            raise InvalidConfigError(f"isolation must be one of {ISOLATIONS}, not {isolation!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise InvalidConfigError(f"max_bytes must be an int >= 0, not {max_bytes!r}")
        part = self.partition
        part.check_offset(offset)
        if isolation == "log_end":
            cap = part.end_offset
        elif isolation == "committed":
            cap = self.last_stable_offset
        elif isolation == "log_stable":
            cap = part.last_stable_offset
        else:
            cap = self._hw
        got: list[tuple[int, int, FileRegion | bytes]] = []  # (first, last offset, records)

        def decode(view: memoryview, file_pos: int, seg: LogSegment) -> tuple[int, bool]:
            start, end, last = fetch_span(view, offset, cap, max_bytes, min_one)
            if start == end:
                return len(view), end < len(view)  # nothing here: the next segment, or stop
            first = int.from_bytes(view[start : start + 8], "big", signed=True)
            region = _open_region(seg, file_pos + start, end - start) if as_file else None
            got.append((first, last, region if region is not None else bytes(view[start:end])))
            return len(view), True

        if offset < cap:
            part.scan(offset, decode)
        result = FetchResult(
            None, b"", -1, -1, self._hw, self.last_stable_offset, part.start_offset,
            part.end_offset,
        )  # fmt: skip
        if got:
            result.first_offset, result.last_offset, records = got[0]
            if isolation in ("committed", "log_stable"):  # what the reader skips (Kafka's
                # AbortedTransactions)
                result.aborted = part.aborted_transactions(offset, result.last_offset + 1)
            if isinstance(records, FileRegion):
                result.region = records
            else:
                result.data = records
        return result

    # -- leader epochs --------------------------------------------------------------------------

    def assign_epoch(self, epoch: int, start_offset: int | None = None) -> None:
        """Leader epoch `epoch` starts at `start_offset` (default: the log end offset, what a
        broker records when it becomes leader). Written to leader-epoch-checkpoint at once."""
        _check_epoch(epoch)
        with self.partition.locked():
            at = self.log_end_offset if start_offset is None else start_offset
            self.leader_epochs.assign(epoch, at)

    def lead(self, epoch: int) -> None:
        """This broker leads the partition from now on at `epoch`: the epoch starts at the log
        end (assign_epoch), and batches the store appends itself (through Log, not
        append_as_leader: a group coordinator's offset commits) carry it from now on."""
        with self.partition.locked():  # no store append between the epoch and the stamp
            self.assign_epoch(epoch)
            self.partition.leader_epoch = epoch

    def resign(self) -> None:
        """This broker no longer leads the partition: the store's own appends carry no
        epoch again."""
        with self.partition.locked():
            self.partition.leader_epoch = -1

    def follow(self) -> None:
        """Another broker leads the partition (or none does now): the store's own appends
        to it are refused with NotLeaderOrFollowerError until lead(), so nothing but what
        append_as_follower copies from the leader enters this replica. Taken under the
        partition's lock: a store append already past its check ends before this returns."""
        with self.partition.locked():
            self.partition.leader_epoch = NOT_LEADING

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) by Kafka's OffsetsForLeaderEpoch rules (LeaderEpochCache)."""
        with self.partition.locked():
            return self.leader_epochs.end_offset_for(epoch, self.log_end_offset)

    @property
    def latest_epoch(self) -> int | None:
        return self.leader_epochs.latest_epoch

    @property
    def epoch_entries(self) -> list[EpochEntry]:
        return self.leader_epochs.entries

    # -- truncation and the log start -----------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop every batch holding an offset at or above `offset` (the whole batch holding it),
        the indexes, producer state and epoch cache following; below the first segment's base
        it truncates fully and starts at `offset`. Returns the log end offset. Durable."""
        _check_offset_type(offset)
        with self.partition.locked():
            end = self.partition.truncate(offset)
            self.leader_epochs.truncate_from_end(end)
            self._hw = min(self._hw, end)
            return end

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and start it empty at `offset` (the log start offset too), the
        epoch cache cleared and the producer state emptied. Durable."""
        _check_offset_type(offset)
        with self.partition.locked():
            self.partition.truncate(offset, start_at=True)
            self.leader_epochs.clear()
            self._hw = offset

    def delete_records_before(self, offset: int) -> int:
        """Kafka's DeleteRecords: move the log start offset to `offset` (at most the high
        watermark), durably (the partition's log-start-offset file); reads below it are
        refused, whole segments below it are deleted by retention's steps and the epoch cache
        forgets what lies below. Returns the log start offset (Kafka's low watermark).
        InternalTopicError on an internal topic, as Kafka refuses (mqcore's state lives there)."""
        _check_offset_type(offset)
        refuse_internal(self.topic, "delete records of")
        if offset > self._hw:
            raise OffsetOutOfRangeError(
                f"cannot move the log start of {self.topic}-{self.partition.partition} to "
                f"{offset}: past the high watermark {self._hw}"
            )
        start = self.partition.advance_log_start(offset)
        self.leader_epochs.truncate_from_start(start)
        retention.delete_below(self.partition, start)
        return self.partition.start_offset


def _open_region(seg: LogSegment, position: int, length: int) -> FileRegion | None:
    """A descriptor of the very `.log` the walk read (its identity checked), or None when the
    name now holds another file (a compaction swap between the walk and the open)."""
    try:
        fd = durable.open_store_file(seg.log_path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != seg.identity:
        os.close(fd)
        return None
    return FileRegion(fd, seg.log_path, position, length)


def _writable(records: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(records)
    if view.readonly or not view.c_contiguous:
        return memoryview(bytearray(view))  # the one copy: stamping needs writable bytes
    return view.cast("B")


def _check_offset_type(offset: object) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise OffsetOutOfRangeError(f"offset must be an int >= 0, not {offset!r}")


def epochs_in_log(part: Partition) -> list[EpochEntry]:
    """The (epoch, first offset) of each leader epoch the log's batches carry
    (partitionLeaderEpoch), from their headers: the leader-epoch cache a log implies."""
    out: list[EpochEntry] = []

    def walk(buf: memoryview, file_pos: int, seg: LogSegment) -> tuple[int, bool]:
        used = 0
        for at, info in batch_headers(buf, 0, len(buf)):
            latest = out[-1].epoch if out else -1
            if info.leader_epoch > latest:
                out.append(EpochEntry(info.leader_epoch, info.base_offset))
            used = at + info.size
        return used, False

    if part.end_offset > part.start_offset:
        part.scan(part.start_offset, walk)
    return out


def _check_epoch(epoch: object) -> None:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= 0x7FFFFFFF:
        raise InvalidConfigError(f"leader epoch must be an int in 0..2^31-1, not {epoch!r}")


__all__ = ["AppendInfo", "FetchResult", "FileRegion", "ReplicaLog"]
