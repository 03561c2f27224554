"""Produce requests read and their responses written by hand.

Read: each partition's records stay a view into the connection's receive buffer, where the
leader append stamps the offsets and from where it writes them to the segment, with no copy
on the way (kio's reader returns every record set as new bytes, and the append then copied
those again to stamp them: with the frame's own copy, three copies of each batch took a fifth
of the server's produce time, bench/README.md "mqcore serve").

Written: a response in 8 µs where building and encoding kio's entities took
53 (a tenth of an acks=all produce's server time). Every other request and response is
kio's. tests/test_server_producewire.py checks both against kio's reader and writer at every
version served, and fuzz/fuzz_server_request.py feeds the reader arbitrary bytes.

Wire schema of the ProduceRequest v0-v11 body (Kafka's ProduceRequest.json), big-endian, after
the request header (server/protocol.py):

    body           transactional_id nullable string (v3+) | acks int16 | timeout_ms int32
                   | topic_data [topic] | tagged fields (v9+)
    topic          name string | partition_data [partition] | tagged fields (v9+)
    partition      index int32 | records nullable bytes | tagged fields (v9+)

Up to v2 the records are a message set of magic 0 or 1 (mqcore.log.legacy turns it into a v2
batch before the append); from v3, one v2 record batch.
Up to v8 a string is int16 length + bytes (-1: null), an array int32 count, bytes int32
length (-1: null). v9+ is "flexible": compact forms (unsigned varint of length + 1, 0 for
null) and, after each struct, an unsigned varint count of tagged fields, each a varint tag,
a varint size and that many bytes (none is defined for Produce: they are skipped).

Every length and count is checked against the bytes left before it is used, so any input
is read in time linear in its size, and a bad one raises ProtocolError.

Wire schema of the ProduceResponse v0-v11, after the response header (v0 up to v8: the
correlation_id int32; v1 from v9: it and tagged fields):

    body           responses [topic] | throttle_time_ms int32 (v1+) | tagged fields (v9+)
    topic          name string | partition_responses [partition] | tagged fields (v9+)
    partition      index int32 | error_code int16 | base_offset int64
                   | log_append_time_ms int64 (-1: CreateTime)               (v2+)
                   | log_start_offset int64                                     (v5+)
                   | record_errors [batch_index int32, message nullable string] (v8+)
                   | error_message nullable string                              (v8+)
                   | tagged fields (v9+)

    record error   batch_index int32 | batch_index_error_message nullable string
                   | tagged fields (v9+)

The tagged fields are always empty here: v10's current_leader (a partition's) and
node_endpoints (the body's) are written only on NOT_LEADER_OR_FOLLOWER, which a single node
never answers. A batch is refused whole; record_errors names the records that made it so
where Kafka names them (the keyless records of a compacted topic), and is empty otherwise.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from mqcore.errors import ProtocolError
from mqcore.server.wireformat import I32, I64, count, string

FLEXIBLE_FROM = 9
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_PART = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time_ms
_PART_V0 = struct.Struct(">ihq")  # v0-v1: index, error_code, base_offset


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicProduceData:
    name: str
    partition_data: tuple[PartitionProduceData, ...]


@dataclass(slots=True)
class ProduceRequest:
    """The fields the broker reads, under kio's names (server/broker.py takes either)."""

    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[TopicProduceData, ...]
    message_sets: bool = False  # v0-v2: the records are message sets of magic 0 or 1


class _Reader:
    """A cursor over a request frame; every read checks the bytes it needs are there."""

    __slots__ = ("buf", "pos", "flexible")

    def __init__(self, buf: memoryview, pos: int, flexible: bool):
        self.buf = buf
        self.pos = pos
        self.flexible = flexible

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > len(self.buf) - self.pos:
            raise ProtocolError(
                f"Produce request: {what} of {n} bytes at byte {self.pos}, "
                f"{len(self.buf) - self.pos} left"
            )
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def fixed(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        return st.unpack(self.take(st.size, what))

    def uvarint(self, what: str) -> int:
        value = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= len(buf) or shift > 28:
                raise ProtocolError(f"Produce request: a bad varint for {what} at byte {self.pos}")
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7

    def length(self, st: struct.Struct, what: str) -> int:
        """A length or count: -1 for null."""
        if self.flexible:
            return self.uvarint(what) - 1
        return self.fixed(st, what)[0]

    def count(self, what: str) -> int:
        """An array's element count, each element taking a byte at least."""
        n = self.length(_I32, what)
        if n < 0 or n > len(self.buf) - self.pos:
            raise ProtocolError(f"Produce request: {what} count {n} at byte {self.pos}")
        return n

    def string(self, what: str, nullable: bool) -> str | None:
        n = self.length(_I16, what)
        if n == -1 and nullable:
            return None
        try:
            return str(self.take(n, what), "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"Produce request: {what} is not UTF-8") from None

    def tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint("tagged fields")):
                self.uvarint("a tag")
                self.take(self.uvarint("a tagged field's size"), "a tagged field")


def read_produce(frame: memoryview, pos: int, version: int) -> ProduceRequest:
    """The ProduceRequest body of `version` at `pos` of `frame` (after the header), its
    records views into `frame`; bytes after the body are ignored, as for every request."""
    r = _Reader(frame, pos, version >= FLEXIBLE_FROM)
    transactional_id = r.string("transactional_id", nullable=True) if version >= 3 else None
    acks, timeout_ms = r.fixed(_ACKS_TIMEOUT, "acks and timeout")
    topics = []
    for _ in range(r.count("topic_data")):
        name = r.string("a topic name", nullable=False)
        assert name is not None
        parts = []
        for _ in range(r.count("partition_data")):
            (index,) = r.fixed(_I32, "a partition index")
            size = r.length(_I32, "records")
            records = None if size == -1 else r.take(size, "records")
            r.tagged_fields()
            parts.append(PartitionProduceData(index, records))
        r.tagged_fields()
        topics.append(TopicProduceData(name, tuple(parts)))
    r.tagged_fields()
    return ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics), version < 3)


@dataclass(slots=True)
class ProducedPartition:
    """One partition's answer to a produce."""

    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    # (index of the record in the batch, why it was refused): Kafka's record_errors (v8+)
    record_errors: tuple[tuple[int, str | None], ...] = ()


@dataclass(slots=True)
class ProducedTopic:
    name: str
    partitions: list[ProducedPartition]


@dataclass(slots=True)
class ProduceAnswer:
    """The Produce handler's result, before it is framed (encode_produce)."""

    topics: list[ProducedTopic]


def encode_produce(version: int, correlation_id: int, answer: ProduceAnswer) -> bytes:
    """The whole frame (size first) of the ProduceResponse of `version` (0-11)."""
    flexible = version >= FLEXIBLE_FROM
    out = bytearray(b"\0\0\0\0")  # the size, filled in at the end
    out += I32.pack(correlation_id)
    if flexible:
        out += b"\0"  # the header's tagged fields
    out += count(len(answer.topics), flexible)
    for t in answer.topics:
        out += string(t.name, flexible)
        out += count(len(t.partitions), flexible)
        for p in t.partitions:
            if version >= 2:
                out += _PART.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            else:
                out += _PART_V0.pack(p.index, p.error_code, p.base_offset)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            if version >= 8:
                out += _record_errors(p.record_errors, flexible)
                out += string(p.error_message, flexible)
            if flexible:
                out += b"\0"  # the partition's tagged fields
        if flexible:
            out += b"\0"  # the topic's tagged fields
    if version >= 1:
        out += I32.pack(0)  # throttle_time_ms
    if flexible:
        out += b"\0"  # the body's tagged fields
    I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _record_errors(errors: tuple[tuple[int, str | None], ...], flexible: bool) -> bytes:
    """A partition's record_errors array (v8+)."""
    out = bytearray(count(len(errors), flexible))
    for index, message in errors:
        out += I32.pack(index)
        out += string(message, flexible)
        if flexible:
            out += b"\0"  # the record error's tagged fields
    return bytes(out)


__all__ = [
    "PartitionProduceData",
    "ProduceAnswer",
    "ProduceRequest",
    "ProducedPartition",
    "ProducedTopic",
    "TopicProduceData",
    "encode_produce",
    "read_produce",
]
