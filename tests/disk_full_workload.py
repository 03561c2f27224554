"""Child process of tests/test_disk_full.py: append under a file size limit until a write fails.

RLIMIT_FSIZE with SIGXFSZ ignored makes a write past the limit fail with EFBIG, as a full disk
fails with ENOSPC. Prints each acknowledged append (`A <offset> <value>`), the error
(`E <type> <errno>`), then lifts the limit and appends again (`A ...`, then `DONE`).
"""

from __future__ import annotations

import resource
import signal
import sys

import mqcore


def say(*fields: object) -> None:
    sys.stdout.write(" ".join(str(f) for f in fields) + "\n")
    sys.stdout.flush()


def main(path: str, limit: int, segment_bytes: int, small_indexes: bool) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    with mqcore.open(path, flush="always") as s:
        small = {"segment_index_bytes": 4096, "key_index": False} if small_indexes else {}
        s.create_topic("t", partitions=1, segment_bytes=segment_bytes, **small)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        i = 0
        while True:
            value = f"v-{i:06d}-" + "x" * 200
            try:
                md = s.append("t", value.encode(), partition=0)
            except OSError as e:
                say("E", type(e).__name__, e.errno)
                break
            except mqcore.errors.MQCoreError as e:
                say("E", type(e).__name__, -1)
                break
            say("A", md.offset, value)
            i += 1
        for _ in range(3):  # still refused while the limit holds, never a partial batch
            try:
                s.append("t", b"r" * 300, partition=0)
                say("UNEXPECTED")
            except (OSError, mqcore.errors.MQCoreError):
                pass
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        for j in range(5):
            value = f"after-{j}"
            md = s.append("t", value.encode(), partition=0)
            say("A", md.offset, value)
    say("DONE")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "small")
