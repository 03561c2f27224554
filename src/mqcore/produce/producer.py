"""Idempotent producer (Kafka's enable.idempotence): `store.producer(producer_id, epoch)`.

Every batch it appends carries (producer id, epoch, base sequence) in its v2 header, one
sequence number per record, counted per topic-partition. The partition's producer state
(storage/producer_state.py) refuses gaps and older epochs and answers a resend of one of the
last 5 batches with the original offsets instead of writing it again, so retrying after a
timeout, in this process or a new one, never writes twice (docs/consume.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from mqcore.errors import InvalidRecordError, ProducerClosedError
from mqcore.storage.producer_state import check_producer_fields, next_sequence

if TYPE_CHECKING:
    from mqcore.store import BatchMetadata, HeadersArg, RecordMetadata, Store


class Producer:
    """Stamps producer id, epoch and the next sequence of each topic-partition on appends.

    The sequence of a partition starts where the log's state for this id and epoch ends (0 for
    a new id or a new epoch) and advances only when a write succeeded. A resend passes the
    sequence the first attempt used (`sequence=` / `base_sequence=`), so it encodes the same
    sequence and is recognised. Thread-safe: appends of one producer are serialised, so its
    sequences reach each partition in order.
    """

    def __init__(self, store: Store, producer_id: int, epoch: int):
        self._store = store
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
            part = self._store._partition(topic, partition)
            state = part.producer_state
            with part._lock:
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
        sequence: int | None = None,
    ) -> RecordMetadata:
        """Store.append with the producer's stamp; `sequence` resends an earlier message.
        A duplicate returns the original's metadata with `duplicate=True`."""
        store = self._store
        with self._lock:
            self._check_open()
            store._parts(topic, create=True)
            if partition is None:
                partition = store._choose_partition(topic, key, store._configs[topic].partitions)
            stamp = self._stamp(topic, partition, sequence)
            md = store.append(
                topic,
                value,
                key,
                headers,
                partition,
                timestamp,
                tag=tag,
                properties=properties,
                keys=keys,
                unique_id=unique_id,
                _producer=stamp,
            )
            self._advance(topic, partition, stamp[2], 1, md.duplicate)
            return md

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int = 0,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        base_sequence: int | None = None,
    ) -> BatchMetadata: ...

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: None = None,
        headers: Sequence[HeadersArg] | None = None,
        *,
        partition: None,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        base_sequence: int | None = None,
    ) -> BatchMetadata: ...

    @overload
    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        headers: Sequence[HeadersArg] | None = None,
        *,
        partition: None,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        base_sequence: int | Mapping[int, int] | None = None,
    ) -> list[BatchMetadata]: ...

    def append_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeadersArg] | None = None,
        partition: int | None = 0,
        timestamps: Sequence[int] | None = None,
        compression: str | None = None,
        *,
        tags: Sequence[str | None] | None = None,
        properties: Sequence[Mapping[str, object] | None] | None = None,
        unique_ids: Sequence[str | None] | None = None,
        base_sequence: int | Mapping[int, int] | None = None,
    ) -> BatchMetadata | list[BatchMetadata]:
        """Store.append_batch with the producer's stamp (the pieces of a batch split by
        max_message_bytes get consecutive sequences). `partition=None` with keys routes like
        Store.append_batch and stamps each partition's part with that partition's sequence.
        `base_sequence` resends: an int for one partition, {partition: sequence} when routed."""
        store = self._store
        values = values if type(values) is list else list(values)
        with self._lock:
            self._check_open()
            store._parts(topic, create=True)
            count = store._configs[topic].partitions
            columns: dict[str, Any] = {
                "keys": keys,
                "headers": headers,
                "timestamps": timestamps,
                "tags": tags,
                "properties": properties,
                "unique_ids": unique_ids,
            }
            for name, col in columns.items():
                if col is not None and len(col) != len(values):
                    raise InvalidRecordError(f"{len(col)} {name} for {len(values)} values")
            if partition is None and keys is not None:
                groups: dict[int, list[int]] = {}
                for i, k in enumerate(keys):
                    groups.setdefault(store._choose_partition(topic, k, count), []).append(i)
                if base_sequence is not None and not isinstance(base_sequence, Mapping):
                    raise InvalidRecordError(
                        "a keyed batch routed over partitions takes base_sequence as "
                        "{partition: sequence}, not one int"
                    )
                out = []
                for p in sorted(groups):
                    idx = groups[p]
                    picked = {
                        n: None if c is None else [c[i] for i in idx] for n, c in columns.items()
                    }
                    seq = None if base_sequence is None else base_sequence.get(p)
                    md = self._append_one(
                        topic, [values[i] for i in idx], p, compression, seq, picked
                    )
                    out.append(md)
                return out
            if isinstance(base_sequence, Mapping):
                raise InvalidRecordError("base_sequence is a mapping only for a routed batch")
            if partition is None:
                partition = store._choose_partition(topic, None, count)
            return self._append_one(topic, values, partition, compression, base_sequence, columns)

    def _append_one(
        self,
        topic: str,
        values: list[bytes | None],
        partition: int,
        compression: str | None,
        sequence: int | None,
        columns: dict[str, Any],
    ) -> BatchMetadata:
        stamp = self._stamp(topic, partition, sequence)
        md = self._store.append_batch(
            topic,
            values,
            columns["keys"],
            columns["headers"],
            partition,
            columns["timestamps"],
            compression,
            tags=columns["tags"],
            properties=columns["properties"],
            unique_ids=columns["unique_ids"],
            _producer=stamp,
        )
        self._advance(topic, partition, stamp[2], len(values), md.duplicate)
        return md


__all__ = ["Producer"]
