"""Background writer threads lent to streamed appends (batch.pyx "Streaming").

A streamed append encodes a batch on the caller's thread while a BackgroundWriter thread writes
the chunks already encoded. Each append in flight borrows one writer and returns it, so a store
runs as many writer threads as it has concurrent large appends, not one per partition.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mqcore._ext.batch import stream_bound
from mqcore._ext.writer import BackgroundWriter
from mqcore.storage.segment import BatchShape

# Smaller batches are encoded first and written with one call: below this size the hand-off to
# the writer thread costs more than the overlap saves (bench/README.md "Streamed appends").
STREAM_MIN_BYTES = 256 << 10


class WriterPool:
    """The store's idle writers; `lend()` one per streamed append."""

    def __init__(self) -> None:
        self._idle: list[BackgroundWriter] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def lend(self) -> Iterator[BackgroundWriter]:
        with self._lock:
            writer = self._idle.pop() if self._idle else BackgroundWriter()
        try:
            yield writer
        finally:
            with self._lock:
                if self._closed:
                    writer.close()
                else:
                    self._idle.append(writer)

    def close(self) -> None:
        """Stop the idle threads (a writer still lent stops when it comes back)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for writer in idle:
            writer.close()


def stream_shape(
    values: list[Any],
    keys: Sequence[Any] | None,
    headers: Sequence[Any] | None,
    timestamps: Sequence[int] | None,
    now: int,
    log_append_time: int,
    unique_ids: bool,
    key_index: bool,
    max_message_bytes: int,
) -> BatchShape | None:
    """The bounds a streamed append checks before writing, or None when the batch should be
    encoded first instead: a record whose size is not known up front (headers, non-bytes),
    a batch too small to gain, or one that may exceed max_message_bytes (the encoded path
    splits or refuses it)."""
    bound = stream_bound(values, keys, headers, timestamps, unique_ids, key_index)
    if bound is None:
        return None
    size, key_entries = bound
    if size < STREAM_MIN_BYTES or size > max_message_bytes:
        return None
    if log_append_time >= 0 or timestamps is None:
        max_ts = log_append_time if log_append_time >= 0 else now
    else:
        try:
            max_ts = max(timestamps)
        except (TypeError, ValueError):
            return None  # the encoder names the bad timestamp
        if not isinstance(max_ts, int):
            return None
    return BatchShape(size, len(values), max_ts, key_entries, 0)
