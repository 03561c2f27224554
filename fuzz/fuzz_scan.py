"""Fuzz the segment kernels of _ext.scan: read_record, first_offset_at_or_after, find_batch and
SegmentScanner (recovery's scan), over a segment's bytes."""

from __future__ import annotations

import fuzzcommon
from fuzzcommon import EXPECTED, MAX_DECOMPRESSED, touch_message

scan = fuzzcommon.scan


def test_one_input(data: bytes) -> None:
    n = len(data)
    # targets from the data itself, so seeds from real logs hit real offsets and timestamps
    target = data[-1] if data else 0
    for verify in (False, True):
        try:
            pos, base, last = scan.find_batch(data, 0, target, -1, verify, "fuzz.log", 0)
            assert 0 <= pos <= n
        except EXPECTED:
            pass
        verified: dict[int, bytes] = {}
        for offset in (0, target, target + 1):
            for _ in range(2):  # the second get reuses the sampled positions in `verified`
                try:
                    m = scan.read_record(
                        data, 0, offset, "t", 0, verify, verified, "fuzz.log", MAX_DECOMPRESSED
                    )
                except EXPECTED:
                    break
                if m is not None:
                    touch_message(m)
        # without memos, then twice with one dict: the first visit makes them, the second
        # walks through them (group maxima, timestamp deltas only)
        time_memos: dict[int, bytes] = {}
        for memo in (None, time_memos, time_memos):
            for ts in (-1, 0, target << 8):
                try:
                    found = scan.first_offset_at_or_after(
                        data, 0, ts, verify, "fuzz.log", MAX_DECOMPRESSED, memo
                    )
                    assert found >= -1
                except EXPECTED:
                    pass
        scanner = scan.SegmentScanner(0, 64, verify)
        # fed in two chunks, as recovery reads a file piecewise
        cut = n // 2
        try:
            used = scanner.feed(data[:cut], 0)
            assert 0 <= used <= cut
            scanner.feed(data[used:], used)
            scanner.finish()
            _ = (scanner.error, scanner.offset_entries, scanner.time_entries, scanner.policy())
        except EXPECTED:
            pass


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
