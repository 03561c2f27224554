"""Child process of tests/test_power_loss.py: appends under a sync ledger until it is killed.

    python powerloss_workload.py <store> <ledger> <flush policy> <seed>

Writes to topic "t" (2 partitions, small segments, key index on) single appends and batches of
values "<seed>:<partition>:<n>" (n counts per partition from 0), key b"k<n % 7>". Each line is
printed with one os.write after the call returned, so a kill never splits one:
  A <partition> <base offset> <count> <monotonic ns when it returned>
  F <monotonic ns when flush() returned>                (flush="os" only, every 25 appends)
"""

from __future__ import annotations

import os
import random
import sys
import time

import powerloss


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(path: str, ledger: str, policy: str, seed: int) -> None:
    powerloss.install(path, ledger)  # before mqcore is imported: it sees every sync
    import mqcore

    rng = random.Random(seed)
    store = mqcore.open(path, flush=policy, flush_interval_ms=40)
    store.create_topic("t", partitions=2, segment_bytes=24 << 10, key_index_entries=512)
    counts = [store.end_offset("t", p) for p in (0, 1)]  # values go on from a previous run
    appends = 0
    while True:
        p = rng.randrange(2)
        n = rng.choice([1, 1, 1, 3, 17])
        values = [f"{seed}:{p}:{counts[p] + i}".encode() * 3 for i in range(n)]
        keys = [b"k%d" % ((counts[p] + i) % 7) for i in range(n)]
        if n == 1:
            md = store.append("t", values[0], key=keys[0], partition=p)
            base = md.offset
        else:
            base = store.append_batch("t", values, keys, partition=p).base_offset
        say(f"A {p} {base} {n} {time.monotonic_ns()}")
        counts[p] += n
        appends += 1
        if policy == "os" and appends % 25 == 0:
            store.flush()
            say(f"F {time.monotonic_ns()}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
