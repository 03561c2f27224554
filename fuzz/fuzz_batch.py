"""Fuzz the batch and record decoder: read_batch_info, peek_batch_header, decode_messages.

The input is a segment's bytes (seeds are real .log files). Each input is walked with and
without CRC checks: with them the header checks run, without them mutated records reach the
record, varint and header decoders.
"""

from __future__ import annotations

import fuzzcommon
from fuzzcommon import EXPECTED, MAX_DECOMPRESSED, touch_message

batch = fuzzcommon.batch


def walk_headers(data: bytes, verify: bool) -> None:
    pos = 0
    while pos < len(data):
        try:
            batch.peek_batch_header(data, pos)
            info = batch.read_batch_info(data, pos, verify, "fuzz.log", 0)
        except EXPECTED:
            return
        if info is None:
            return
        _ = (info.last_offset, info.codec, info.is_control, info.timestamp_type)
        assert info.size > 0
        pos += info.size


def decode_all(data: bytes, verify: bool) -> None:
    pos = 0
    while pos < len(data):
        out: list[batch.Message] = []
        try:
            next_pos, _ = batch.decode_messages(
                data,
                pos,
                "t",
                0,
                0,
                500,
                out,
                verify,
                MAX_DECOMPRESSED,
                "fuzz.log",
                0,
                include_control=True,
            )
        except EXPECTED:
            return
        for m in out:
            touch_message(m)
        if next_pos <= pos:
            return
        pos = next_pos


def test_one_input(data: bytes) -> None:
    for verify in (False, True):
        walk_headers(data, verify)
        decode_all(data, verify)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
