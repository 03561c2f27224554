"""Fetch responses written by hand, so the records go from the segment file to the socket with
sendfile() (or one copy under TLS) instead of through kio's encoder, which copies and
reallocates a buffer per record set (measured: 60% of a fetch's server time, bench/README.md
"mqcore serve"). Every other response is kio's. tests/test_server_fetchwire.py checks these
bytes against kio's encoding of the same response at every version served.

Wire schema of FetchResponse v0-v12 (Kafka's FetchResponse.json, Kafka 3.9's for v0-v3),
big-endian:

    header         v0 (v0-v11): correlation_id int32
                   v1 (v12):    correlation_id int32 | tagged fields
    body           throttle_time_ms int32                                   (v1+)
                   error_code int16, session_id int32                      (v7+)
                   responses [topic]
    topic          name string | partitions [partition] | tagged fields (v12)
    partition      partition_index int32 | error_code int16 | high_watermark int64
                   | last_stable_offset int64                               (v4+)
                   | log_start_offset int64                                 (v5+)
                   | aborted_transactions nullable [producer_id int64, first_offset int64
                     | tagged fields (v12)]  (v4+; null unless the request was read_committed:
                     the aborted transactions the records overlap, for the consumer to skip)
                   | preferred_read_replica int32                          (v11+)
                   | records nullable bytes | tagged fields (v12)

Up to v3 the records are a message set, of magic 0 for v0-v1 and magic 1 for v2-v3: the stored
v2 batches are converted (mqcore.log.legacy.down_convert: from the fetch offset, uncompressed,
whole messages within the partition's max bytes), so those go as bytes, not by sendfile().
Up to v11 a string is int16 length + bytes, an array int32 count, bytes int32 length (-1:
null). v12 is "flexible": compact forms (unsigned varint of length + 1, 0 for null) and an
unsigned-varint count of tagged fields after each struct, always 0 here (the partition's
tagged fields diverging_epoch, current_leader, snapshot_id are written only when set, and
they never are on a single node).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from mqcore.log import FileRegion
from mqcore.log.legacy import down_convert
from mqcore.server.wireformat import I16, I32, I64, bytes_length, count, string

_PART = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable
_PART_V0 = struct.Struct(">ihq")  # v0-v3: partition_index, error_code, high_watermark
FLEXIBLE_FROM = 12
MESSAGE_SETS_UNTIL = 4  # v0-v3 answer message sets (magic 0, then 1 from v2)


@dataclass(slots=True)
class FetchedPartition:
    """One partition's answer: its records as a file region, bytes, or nothing."""

    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # empty, never null, when there is nothing: librdkafka refuses a null record set
    records: FileRegion | bytes | None = b""
    fetch_offset: int = 0  # what the request asked: a down-conversion (v0-v3) starts there
    aborted: list[tuple[int, int]] | None = None  # (producer_id, first_offset); None: null
    max_bytes: int = 0x7FFFFFFF

    @property
    def size(self) -> int:
        r = self.records
        return 0 if r is None else r.length if isinstance(r, FileRegion) else len(r)


@dataclass(slots=True)
class FetchedTopic:
    name: str
    partitions: list[FetchedPartition] = field(default_factory=list)


@dataclass(slots=True)
class FetchAnswer:
    """What a fetch found, before it is framed: the handler's result for the Fetch API."""

    topics: list[FetchedTopic]
    size: int = 0  # record bytes in all

    def close(self) -> None:
        for t in self.topics:
            for p in t.partitions:
                if isinstance(p.records, FileRegion):
                    p.records.close()


@dataclass(slots=True)
class FetchFrame:
    """A whole response frame as pieces: bytes to write and file regions to send between
    them. Close it once sent (the regions hold descriptors)."""

    pieces: list[bytes | FileRegion]

    @property
    def size(self) -> int:
        return sum(p.length if isinstance(p, FileRegion) else len(p) for p in self.pieces)

    def close(self) -> None:
        for p in self.pieces:
            if isinstance(p, FileRegion):
                p.close()


def encode_fetch(
    version: int, correlation_id: int, topics: list[FetchedTopic], error_code: int = 0
) -> FetchFrame:
    """The frame of a FetchResponse of `version` (0-12) answering `topics`."""
    if version < MESSAGE_SETS_UNTIL:
        down_convert_records(topics, 0 if version < 2 else 1)
    flexible = version >= FLEXIBLE_FROM
    head = bytearray(b"\0\0\0\0")  # the size, filled in at the end
    head += I32.pack(correlation_id)
    if flexible:
        head += b"\0"  # the header's tagged fields
    if version >= 1:
        head += I32.pack(0)  # throttle_time_ms
    if version >= 7:
        head += I16.pack(error_code) + I32.pack(0)  # error_code, session_id (no session)
    pieces: list[bytes | FileRegion] = []
    buf = head
    buf += count(len(topics), flexible)
    for t in topics:
        buf += string(t.name, flexible)
        buf += count(len(t.partitions), flexible)
        for p in t.partitions:
            if version < MESSAGE_SETS_UNTIL:
                buf += _PART_V0.pack(p.index, p.error_code, p.high_watermark)
            else:
                buf += _PART.pack(p.index, p.error_code, p.high_watermark, p.last_stable_offset)
            if version >= 5:
                buf += I64.pack(p.log_start_offset)
            if version >= MESSAGE_SETS_UNTIL:
                if p.aborted is None:
                    buf += b"\0" if flexible else I32.pack(-1)  # aborted_transactions: null
                else:
                    buf += count(len(p.aborted), flexible)
                    for producer_id, first_offset in p.aborted:
                        buf += I64.pack(producer_id) + I64.pack(first_offset)
                        if flexible:
                            buf += b"\0"  # the entry's tagged fields
            if version >= 11:
                buf += I32.pack(-1)  # preferred_read_replica
            size = p.size
            buf += bytes_length(None if p.records is None else size, flexible)
            if p.records is not None and size:
                pieces.append(bytes(buf))
                buf = bytearray()
                pieces.append(p.records)
            if flexible:
                buf += b"\0"  # the partition's tagged fields
        if flexible:
            buf += b"\0"  # the topic's tagged fields
    if flexible:
        buf += b"\0"  # the body's tagged fields
    if buf:
        pieces.append(bytes(buf))
    frame = FetchFrame(pieces)
    first = bytearray(pieces[0])  # type: ignore[arg-type]
    I32.pack_into(first, 0, frame.size - 4)
    pieces[0] = bytes(first)
    return frame


def down_convert_records(topics: list[FetchedTopic], magic: int) -> None:
    """Each partition's v2 batches as a message set of `magic` (Fetch v0-v3), in place."""
    for t in topics:
        for p in t.partitions:
            records = p.records
            if isinstance(records, FileRegion):
                data = records.read()
                records.close()
            else:
                data = records or b""
            p.records = down_convert(data, magic, p.fetch_offset, p.max_bytes) if data else b""
