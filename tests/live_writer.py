"""Child process of tests/test_live_reader.py: a writer that appends, rolls, compacts and
deletes in a loop until its stdin closes.

    python live_writer.py <store>

Topic "plain" (1 partition, small segments, retention by size): record n has value b"p<n>" at
offset n, so a reader can tell a hole or a stranger at once. Topic "compacted" (compaction,
small segments): keys k0..k39, every key written before "READY" is printed, then rewritten
forever with values b"k<i>:<version>". Retention and compaction run every few dozen appends.
"""

from __future__ import annotations

import os
import select
import sys

import mqcore

KEYS = 40


def main(path: str) -> None:
    store = mqcore.open(path, flush="os", retention_check_interval_ms=1 << 40,
                       compaction_check_interval_ms=1 << 40)  # fmt: skip
    store.create_topic("plain", partitions=1, segment_bytes=4096, retention_bytes=40_000)
    store.create_topic("compacted", partitions=1, segment_bytes=2048, cleanup_policy="compact",
                       min_cleanable_dirty_ratio=0.01)  # fmt: skip
    n = store.end_offset("plain", 0)
    version = 0
    for i in range(KEYS):
        store.append("compacted", b"k%d:%d" % (i, version), key=b"k%d" % i)
    os.write(1, b"READY\n")
    rounds = 0
    while not select.select([sys.stdin], [], [], 0)[0]:
        batch = [b"p%d" % (n + j) + b"." * 40 for j in range(rounds % 5 + 1)]
        store.append_batch("plain", batch)
        n += len(batch)
        version += 1
        i = version % KEYS
        store.append("compacted", b"k%d:%d" % (i, version), key=b"k%d" % i)
        rounds += 1
        if rounds % 37 == 0:
            store.apply_retention("plain")
        if rounds % 53 == 0:
            store.compact("compacted")
    store.close()
    os.write(1, b"DONE %d\n" % rounds)


if __name__ == "__main__":
    main(sys.argv[1])
