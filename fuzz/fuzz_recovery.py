"""Fuzz the segment recovery path: the input becomes a partition's `.log` (and optionally its
`.index` and a clean-shutdown marker) in a fresh store directory; opening the store must recover
(truncating what is not valid) or raise an mqcore error, and every message it then serves must
decode.

Input layout: byte 0 flags (bit 0: clean-shutdown marker, so the index is trusted; bit 1: open
read-only), bytes 1-4 the .log length L (big-endian, clamped), then L bytes of .log, then the
.index bytes.
"""

from __future__ import annotations

import json
import os
import shutil

import fuzzcommon
from fuzzcommon import EXPECTED, touch_message

mqcore = fuzzcommon.mqcore
logdir = mqcore.storage.logdir

_ROOT = fuzzcommon.scratch_dir("mqcore-fuzz-recovery-")
_STORE = os.path.join(_ROOT, "store")
_BASE = "00000000000000000000"
# small derived files, so each run is quick (the defaults preallocate megabytes per segment)
_TOPICS = json.dumps(
    {
        "version": 1,
        "topics": {"t": {"partitions": 1, "key_index_entries": 64, "segment_index_bytes": 4096}},
    }
).encode()


def test_one_input(data: bytes) -> None:
    if len(data) < 5:
        return
    flags = data[0]
    length = min(int.from_bytes(data[1:5], "big"), len(data) - 5)
    log, idx = data[5 : 5 + length], data[5 + length :]
    shutil.rmtree(_STORE, ignore_errors=True)
    part = os.path.join(_STORE, "t-0")
    os.makedirs(part)
    with open(os.path.join(_STORE, logdir.TOPICS_FILE), "wb") as f:
        f.write(_TOPICS)
    with open(os.path.join(part, _BASE + ".log"), "wb") as f:
        f.write(log)
    if idx:
        with open(os.path.join(part, _BASE + ".index"), "wb") as f:
            f.write(idx)
    if flags & 1:
        open(os.path.join(_STORE, logdir.CLEAN_SHUTDOWN), "wb").close()
    try:
        store = mqcore.open(_STORE, read_only=bool(flags & 2), flush="os")
    except EXPECTED:
        return
    try:
        start, end = store.start_offset("t", 0), store.end_offset("t", 0)
        assert 0 <= start <= end
        offset = start
        while offset < end:
            msgs = store.read("t", 0, offset, 200)
            if not msgs:
                break
            for m in msgs:
                assert m.offset >= offset
                touch_message(m)
            offset = msgs[-1].offset + 1
        for probe in (start, end - 1, (start + end) // 2):
            m = store.get("t", 0, probe)
            if m is not None:
                touch_message(m)
        store.offset_for_time("t", 0, 0)
    except EXPECTED:
        pass
    finally:
        store.close()


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
