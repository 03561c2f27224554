"""Fuzz every decompression path: mqcore.compression.decompress on raw input for each codec
(gzip, xerial/raw snappy, lz4 frame, zstd), and the same bytes as the records area of a batch
with the codec bits set and a valid CRC, so the batch decoder's bounded decompression and the
record walk over its output run too."""

from __future__ import annotations

import struct

import fuzzcommon
from fuzzcommon import EXPECTED, MAX_DECOMPRESSED, touch_message

batch = fuzzcommon.batch
compression = fuzzcommon.mqcore.compression
crc32c = fuzzcommon.crc32c.crc32c

# attributes .. records_count after the CRC field: attributes(2) lastOffsetDelta(4) baseTs(8)
# maxTs(8) producerId(8) producerEpoch(2) baseSequence(4) recordsCount(4)
_AFTER_CRC = struct.Struct(">hiqqqhii")


def make_batch(codec: int, records_area: bytes, count: int) -> bytes:
    """A v2 batch around `records_area` with a correct CRC (so decoding gets past the header)."""
    body = _AFTER_CRC.pack(codec, max(count - 1, 0), 1000, 1000, -1, -1, -1, count) + records_area
    crc = crc32c(body)
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(body), 0, 2, crc)
    return head + body


def test_one_input(data: bytes) -> None:
    if not data:
        return
    # first byte: codec (1..4) and record count; the rest is the compressed stream, so corpus
    # seeds are the codec byte followed by a real compressed records area
    codec = 1 + (data[0] & 3)
    count = 1 + (data[0] >> 2)
    stream = data[1:]
    for limit in (MAX_DECOMPRESSED, 64):
        try:
            out = compression.decompress(codec, stream, limit)
            assert len(out) <= limit
        except EXPECTED:
            pass
    raw = make_batch(codec, stream, count)
    # the CRC is right by construction, so checking it (the reader's default) loses nothing
    out_msgs: list[batch.Message] = []
    try:
        batch.decode_messages(
            raw, 0, "t", 0, 0, 1000, out_msgs, True, MAX_DECOMPRESSED, "fuzz.log", 0
        )
    except EXPECTED:
        return
    for m in out_msgs:
        touch_message(m)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
