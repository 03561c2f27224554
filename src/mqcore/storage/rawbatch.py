"""Record batches handed to the log as bytes, built by a client or copied from a leader
(mqcore.log's embedding API): whole-batch checks, the in-place stamping of what the log
assigns, and the batch walk of a raw fetch. The bytes are never re-encoded; the format is
docs/format.md "Record batch" (_ext/batch.pyx's schema comment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqcore._ext.batch import BatchInfo, Message, decode_messages, peek_batch_header
from mqcore._ext.keyindex import batch_hits
from mqcore._ext.rawbatch import check_whole_batch, stamp_batch
from mqcore.errors import CorruptRecordError, InvalidRecordError
from mqcore.storage import durable
from mqcore.storage.segment import MAX_DECOMPRESSED

ATTR_LOG_APPEND_TIME = 0x08
_FIRST_OFFSET = -(1 << 63)  # a client's batch may carry any base offset: decode every record
SOURCE = "the appended records"  # what error messages call the caller's buffer


@dataclass(slots=True)
class RawBatch:
    """One whole, validated batch inside a caller's buffer, in the shape an append reads
    (storage.segment.AppendableBatch). `set_base_offset` stamps baseOffset (and the leader
    epoch) into the buffer (leader appends), or, with `keep_offsets`, only checks that the
    offset the log assigns is the batch's own (follower appends: a gap or overlap is refused
    under the partition lock, before anything is written)."""

    buf: memoryview
    pos: int
    size: int
    count: int
    info: BatchInfo
    min_timestamp: int
    max_timestamp: int
    dense: bool
    leader_epoch: int = -1
    keep_offsets: bool = False
    base_offset: int = -1
    attributes: int = 0
    _hits: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.attributes = self.info.attributes
        if self.keep_offsets:
            self.base_offset = self.info.base_offset

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.info.last_offset_delta

    @property
    def key_hits(self) -> bytes:
        """The records' key-index entries (keys, uid and tag headers), found on first use."""
        if self._hits is None:
            self._hits = batch_hits(self.buf, self.pos, MAX_DECOMPRESSED, SOURCE)[0]
        return self._hits

    def keys(self) -> list[bytes | None]:
        """Each record's key in batch order (None: no key), decoded on demand: for the checks
        only some topics need (a compacted topic's keys, Kafka's LogValidator)."""
        out: list[Message] = []
        whole = self.buf[self.pos : self.pos + self.size]
        decode_messages(whole, 0, "", 0, _FIRST_OFFSET, self.count, out, False,
                        MAX_DECOMPRESSED, SOURCE)  # fmt: skip
        return [m.key for m in out]

    def set_base_offset(self, base_offset: int) -> None:
        if self.keep_offsets:
            if base_offset != self.base_offset:
                raise InvalidRecordError(
                    f"a replica's batch starts at offset {self.base_offset} but the log ends at "
                    f"{base_offset}: a gap or an overlap; nothing was written"
                )
            return
        stamp_batch(self.buf, self.pos, base_offset, self.leader_epoch)
        self.base_offset = base_offset

    def stamp_time(self, log_append_time: int) -> None:
        """Set the timestamp type the topic wants, and maxTimestamp: `log_append_time` (>= 0,
        LogAppendTime) or the records' largest (CreateTime, as Kafka corrects it); the CRC is
        recomputed only when a byte under it changed."""
        if log_append_time >= 0:
            attrs, max_ts = self.attributes | ATTR_LOG_APPEND_TIME, log_append_time
            self.min_timestamp = log_append_time
        else:
            attrs, max_ts = self.attributes & ~ATTR_LOG_APPEND_TIME, self.max_timestamp
        if attrs != self.attributes or max_ts != self.info.max_timestamp:
            stamp_batch(self.buf, self.pos, 0, self.leader_epoch, attrs, max_ts)
        self.attributes, self.max_timestamp = attrs, max_ts

    def write_to(self, fd: int) -> int:
        durable.write_all(fd, self.buf[self.pos : self.pos + self.size])
        return self.size


def split_batches(buf: memoryview, keep_offsets: bool) -> list[RawBatch]:
    """Every batch of `buf`, each checked whole (length against the buffer, magic, codec,
    counts, CRC-32C, every record's framing): CorruptRecordError naming the byte position of
    the first bad one, InvalidRecordError for an empty buffer."""
    if len(buf) == 0:
        raise InvalidRecordError("no record batch in the appended records (0 bytes)")
    out = []
    pos = 0
    while pos < len(buf):
        size, count, lo, hi, dense = check_whole_batch(buf, pos, MAX_DECOMPRESSED, SOURCE)
        info = peek_batch_header(buf, pos)
        assert info is not None  # check_whole_batch read the same header
        out.append(RawBatch(buf, pos, size, count, info, lo, hi, dense, keep_offsets=keep_offsets))
        pos += size
    return out


def fetch_span(
    view: memoryview, offset: int, cap: int, max_bytes: int, min_one: bool = True
) -> tuple[int, int, int]:
    """The run of whole batches of `view` (a segment's bytes from a batch boundary to a size
    the log saw) a fetch from `offset` returns: from the batch holding `offset` (or the first
    after it) while their last offsets stay below `cap` and the run fits `max_bytes`, but for
    the first batch when `min_one` (KIP-74: a consumer is never stuck behind one large batch).
    Returns (start, end, last offset): start == end when none is there, with end == len(view)
    when the walk reached the end of the view (look in the next segment) and last offset -1."""
    pos, first, last = 0, -1, -1
    while pos < len(view):
        info = peek_batch_header(view, pos)
        if info is None or info.size <= 0 or pos + info.size > len(view):
            raise CorruptRecordError("batch runs past the end of the segment", position=pos)
        if info.last_offset >= offset:
            start = first if first >= 0 else pos
            too_big = pos + info.size - start > max_bytes and (first >= 0 or not min_one)
            if info.last_offset >= cap or too_big:
                break
            if first < 0:
                first = pos
            last = info.last_offset
        pos += info.size
    if first < 0:
        return pos, pos, -1
    return first, pos, last


__all__ = ["RawBatch", "fetch_span", "split_batches"]
