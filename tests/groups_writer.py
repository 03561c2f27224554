"""Child process of tests/test_cli_groups.py: a writer with two consumer groups that committed
offsets, nacked to retry and dead-letter topics, then fell behind; it stays open until its
stdin closes.

    python groups_writer.py <store>

Prints one JSON line: per group, the members' own lag() and committed() of every partition
they own (what `mqcore groups`, run from another process beside it, must agree with).
"""

from __future__ import annotations

import json
import sys

import mqcore


def main(path: str) -> None:
    store = mqcore.open(path, flush="os", retention_check_interval_ms=1 << 40,
                        compaction_check_interval_ms=1 << 40)  # fmt: skip
    store.create_topic("orders", partitions=3)
    store.create_topic("audit")
    for i in range(30):
        store.append("orders", b"order %d" % i, key=b"c%d" % (i % 7))
    for i in range(5):
        store.append("audit", b"entry %d" % i)
    billing = [store.consumer("billing", "orders", retry_backoff_ms=[3_600_000] * 4)
               for _ in range(2)]  # fmt: skip
    for n, c in enumerate(billing):
        got = c.poll(max_records=7 + 3 * n)
        for m in got[:2]:
            c.nack(m)
    for c in billing:
        c.poll(max_records=1)  # the rebalance that hands out the new retry levels
        c.commit()
    auditor = store.consumer("auditor", ["orders", "audit"], max_reconsume_times=0)
    got = auditor.poll(max_records=1000)
    auditor.nack(got[0])  # max_reconsume_times=0: straight to __dlq.auditor
    auditor.commit()
    for i in range(4):
        store.append("orders", b"late %d" % i, key=b"late")
    report = {}
    for group, members in (("billing", billing), ("auditor", [auditor])):
        lags, committed = {}, {}
        for c in members:
            for (t, p), lag in c.lag().items():
                lags[f"{t}-{p}"] = lag
                committed[f"{t}-{p}"] = c.committed(t, p)
        report[group] = {"lag": lags, "committed": committed}
    print(json.dumps(report), flush=True)
    sys.stdin.read()
    for c in [*billing, auditor]:
        c.close()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1])
