"""Child process of tests/test_crash_walk.py: a workload that passes every crash point.

Prints one line per acknowledged step, flushed at once, so the parent knows exactly what was
acknowledged when MQCORE_CRASH_AT killed the process:
  A <topic> <partition> <offset> <value> [<key>]   an append returned
  C <topic> <partition> <offset>                   a consumer commit returned
  H <offset> ...                                   a share commit returned, these accepted
  S <topic> <base>                                 retention is about to run; the active
                                                   segment starts at <base>
  R                                                retention returned
  K                                                compaction is about to run
  DONE                                             the workload ran to its end
"""

from __future__ import annotations

import sys

import mqcore

FAR_FUTURE = 1 << 50  # a `now` that expires every sealed segment of a short-retention topic


def say(*fields: object) -> None:
    sys.stdout.write(" ".join(str(f) for f in fields) + "\n")
    sys.stdout.flush()


def main(path: str) -> None:
    with mqcore.open(path, flush="always") as s:
        s.create_topic("t", partitions=1, segment_bytes=600)
        s.create_topic("r", partitions=1, segment_bytes=600, retention_ms=1000)
        s.create_topic("c", partitions=1, segment_bytes=600, cleanup_policy="compact")
        for i in range(30):
            value = f"t-{i:04d}-" + "x" * 60
            md = s.append("t", value.encode(), partition=0)
            say("A", "t", 0, md.offset, value)
        consumer = s.consumer("g", ["t"])
        got = consumer.poll(max_records=12)
        consumer.commit()
        say("C", "t", 0, got[-1].offset + 1)
        share = s.share_consumer("sg", "t", explicit_ack=True)
        for _ in range(3):
            msgs = share.poll(max_records=4)
            for m in msgs:
                share.acknowledge(m)
            share.commit()
            say("H", *(m.offset for m in msgs))
        share.close()
        s.flush()
        for i in range(20):
            value = f"r-{i:04d}-" + "y" * 60
            md = s.append("r", value.encode(), partition=0, timestamp=1000 + i)
            say("A", "r", 0, md.offset, value)
        say("S", "r", s.segment_offsets("r")[-1])
        s.apply_retention("r", now=FAR_FUTURE)
        say("R")
        for i in range(30):
            key = f"k{i % 4}"
            value = f"c-{i:04d}-" + "z" * 60
            md = s.append("c", value.encode(), key=key.encode(), partition=0)
            say("A", "c", 0, md.offset, value, key)
        say("K")
        s.compact("c")
        consumer.close()
        # a key table that outgrows its first size (1,024 entries: a key per record and one
        # run entry per batch for its generated IDs) and is replaced by a larger one:
        # keyindex.after_grow_*
        s.create_topic("k", partitions=1)
        for b in range(11):
            values = [f"k-{b:02d}{j:03d}".encode() for j in range(100)]
            keys = [b"key-%d" % (b * 100 + j) for j in range(100)]
            base = s.append_batch("k", values, keys=keys, partition=0).base_offset
            for j in range(100):
                say("A", "k", 0, base + j, values[j].decode(), keys[j].decode())
    say("DONE")


if __name__ == "__main__":
    main(sys.argv[1])
