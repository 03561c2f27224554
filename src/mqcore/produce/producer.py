"""Idempotent producer (Kafka's enable.idempotence): `store.producer(producer_id, epoch)`.

Every batch it appends carries (producer id, epoch, base sequence) in its v2 header, one
sequence number per record, counted per topic-partition. The partition's producer state
(storage/producer_state.py) refuses gaps and older epochs and answers a resend of one of the
last 5 batches with the original offsets instead of writing it again, so retrying after a
timeout, in this process or a new one, never writes twice (docs/consume.md).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from mqcore.errors import ProducerClosedError
from mqcore.log.append import BatchMetadata, RecordMetadata
from mqcore.produce.sender import Outgoing, Sender, append_plain, write_one
from mqcore.storage.producer_state import check_producer_fields, next_sequence

if TYPE_CHECKING:
    from mqcore.log.manager import Log


class Producer(Sender[RecordMetadata, BatchMetadata, list[BatchMetadata]]):
    """Stamps producer id, epoch and the next sequence of each topic-partition on appends.

    `append` and `append_batch` take the Store's arguments (sender.py), not delayed; a resend
    passes the sequence the first attempt used (`sequence=` / `base_sequence=`: an int for one
    partition, {partition: sequence} when routed), so it encodes the same sequence and is
    recognised: a duplicate returns the original's metadata with `duplicate=True`. The pieces
    of a batch split by max_message_bytes get consecutive sequences. The sequence of a
    partition starts where the log's state for this id and epoch ends (0 for a new id or a new
    epoch) and advances only when a write succeeded. Thread-safe: appends of one producer are
    serialised, so its sequences reach each partition in order.
    """

    def __init__(self, log: Log, producer_id: int, epoch: int):
        self.log = log
        self.producer_id = producer_id
        self.epoch = epoch
        self._next: dict[tuple[str, int], int] = {}
        self._lock = threading.RLock()
        self.closed = False

    def __repr__(self) -> str:
        return f"Producer(producer_id={self.producer_id}, epoch={self.epoch})"

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop using this producer (its state in the log stays: a new one may go on)."""
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise ProducerClosedError(f"producer {self.producer_id} is closed")

    def sequence(self, topic: str, partition: int = 0) -> int:
        """The sequence the next new batch to `topic`-`partition` will start at."""
        with self._lock:
            self._check_open()
            return self._sequence(topic, partition)

    def _sequence(self, topic: str, partition: int) -> int:
        key = (topic, partition)
        seq = self._next.get(key)
        if seq is None:
            part = self.log.partition(topic, partition)
            state = part.producer_state
            with part.locked():
                seq = 0 if state is None else state.next_sequence_for(self.producer_id, self.epoch)
            self._next[key] = seq
        return seq

    def _stamp(self, topic: str, partition: int, sequence: int | None) -> tuple[int, int, int]:
        if sequence is None:
            return (self.producer_id, self.epoch, self._sequence(topic, partition))
        check_producer_fields(self.producer_id, self.epoch, sequence)
        return (self.producer_id, self.epoch, sequence)

    def _advance(self, topic: str, partition: int, seq: int, count: int, duplicate: bool) -> None:
        if not duplicate:
            self._next[(topic, partition)] = next_sequence(seq, count)

    # -- the send hooks (sender.py): each stamps and writes under the producer's lock

    def _send_one(self, out: Outgoing) -> RecordMetadata:
        with self._lock:
            self._check_open()
            self.log.partition(out.topic, out.partition, create=True)
            stamp = self._stamp(out.topic, out.partition, out.sequence)
            md = write_one(self.log, out, stamp)
            self._advance(out.topic, out.partition, stamp[2], 1, md.duplicate)
            return md

    def _send_batch(self, out: Outgoing) -> BatchMetadata:
        with self._lock:
            self._check_open()
            stamp = self._stamp(out.topic, out.partition, out.sequence)
            md = append_plain(self.log, out, stamp)
            self._advance(out.topic, out.partition, stamp[2], len(out.values), md.duplicate)
            return md

    def _send_routed(self, out: Outgoing, groups: dict[int, list[int]]) -> list[BatchMetadata]:
        with self._lock:  # the partitions' parts in order, with no other append between
            self._check_open()
            return super()._send_routed(out, groups)


__all__ = ["Producer"]
