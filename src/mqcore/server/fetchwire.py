"""Fetch responses written by hand, so the records go from the segment file to the socket with
sendfile() (or one copy under TLS) instead of through kio's encoder, which copies and
reallocates a buffer per record set (measured: 60% of a fetch's server time, bench/README.md
"mqcore serve"). Every other response is kio's. tests/test_server_fetchwire.py checks these
bytes against kio's encoding of the same response at every version served.

Wire schema of FetchResponse v4-v12 (Kafka's FetchResponse.json), big-endian:

    header         v0 (v4-v11): correlation_id int32
                   v1 (v12):    correlation_id int32 | tagged fields
    body           throttle_time_ms int32
                   error_code int16, session_id int32                      (v7+)
                   responses [topic]
    topic          name string | partitions [partition] | tagged fields (v12)
    partition      partition_index int32 | error_code int16 | high_watermark int64
                   | last_stable_offset int64 | log_start_offset int64      (v5+)
                   | aborted_transactions nullable [producer_id int64, first_offset int64]
                     (null: no transaction is ever aborted in the log, see docs/server.md)
                   | preferred_read_replica int32                          (v11+)
                   | records nullable bytes | tagged fields (v12)

Up to v11 a string is int16 length + bytes, an array int32 count, bytes int32 length (-1:
null). v12 is "flexible": compact forms (unsigned varint of length + 1, 0 for null) and an
unsigned-varint count of tagged fields after each struct, always 0 here (the partition's
tagged fields diverging_epoch, current_leader, snapshot_id are written only when set, and
they never are on a single node).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from mqcore.log import FileRegion
from mqcore.server.wireformat import I16, I32, I64, bytes_length, count, string

_PART = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable
FLEXIBLE_FROM = 12


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
    """The frame of a FetchResponse of `version` (4-12) answering `topics`."""
    flexible = version >= FLEXIBLE_FROM
    head = bytearray(b"\0\0\0\0")  # the size, filled in at the end
    head += I32.pack(correlation_id)
    if flexible:
        head += b"\0"  # the header's tagged fields
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
            buf += _PART.pack(p.index, p.error_code, p.high_watermark, p.last_stable_offset)
            if version >= 5:
                buf += I64.pack(p.log_start_offset)
            buf += b"\0" if flexible else I32.pack(-1)  # aborted_transactions: null
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


def send_frame(sock: socket.socket, frame: FetchFrame) -> None:
    """Write the frame: its bytes with sendall(), each region with socket.sendfile() (the
    kernel's sendfile on a plain socket, read-and-send on a TLS one), within the socket's
    timeout."""
    for piece in frame.pieces:
        if isinstance(piece, FileRegion):
            with open(piece.fd, "rb", buffering=0, closefd=False) as f:
                sent = sock.sendfile(f, piece.position, piece.length)
            if sent != piece.length:
                raise OSError(f"sent {sent} of a {piece.length}-byte record set")
        else:
            sock.sendall(piece)
