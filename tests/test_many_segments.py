"""A store of 20,000 segments over 200 partitions under `ulimit -n 256` (issue 16, item 6):
the descriptors and maps a store holds are bounded by max_open_segments, not by its segment
count. Every segment used to hold open files for the store's life, so such a store could
not even be reopened (EMFILE near 200 segments at a limit of 1,024)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import child_env

import mqcore

PARTITIONS = 200
SEGMENTS = 100  # per partition: one batch each
LIMIT = 256

CHILD = textwrap.dedent(
    """
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[2])))
    import mqcore
    path, partitions, segments, mode = sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    def check(s, extra):
        for p in range(partitions):
            got = s.read("t", p, 0, 1 << 30)
            assert [m.value for m in got[:segments]] == [b"v%05d" % i + b"." * 40
                                                      for i in range(segments)], p
            assert len(got) == segments + extra, (p, len(got))
        for p in (0, partitions // 2, partitions - 1):
            want = [m.offset for m in s.read("t", p, 0, 1 << 30) if m.key == b"k3"]
            assert [m.offset for m in s.find_by_key("t", b"k3", partition=p, limit=1000)] == want
        n = len(os.listdir("/proc/self/fd"))
        assert n < int(sys.argv[2]) - 8, n
        segs = sum(len(s.segment_offsets("t", p)) for p in range(partitions))
        print("fds", n, "segments", segs)
    if mode == "write":
        # no check before the appends: the one after them makes the same reads of every
        # segment with more descriptors held (each partition's new active segment)
        with mqcore.open(path, max_open_segments=100) as s:
            for p in range(partitions):
                s.append("t", b"more", key=b"k3", partition=p)
            check(s, 1)
    else:
        with mqcore.open(path, read_only=True, max_open_segments=100) as s:
            check(s, 1)
    """
)


def build(path: str) -> None:
    """One partition of SEGMENTS one-batch segments, copied to every other partition."""
    with mqcore.open(path, flush="os") as s:
        s.create_topic("t", partitions=PARTITIONS, segment_bytes=100, key_index_entries=64)
        for i in range(SEGMENTS):
            s.append("t", b"v%05d" % i + b"." * 40, key=b"k%d" % (i % 7), partition=0)
    first = os.path.join(path, "t-0")
    for p in range(1, PARTITIONS):
        shutil.rmtree(os.path.join(path, f"t-{p}"))
        shutil.copytree(first, os.path.join(path, f"t-{p}"))
    # every partition now ends where t-0 does: the checkpoint must say so for all of them
    os.unlink(os.path.join(path, "mqcore-recovery-point-checkpoint"))


@pytest.mark.slow
def test_twenty_thousand_segments_under_256_descriptors(fast_path: str) -> None:
    path = fast_path
    build(path)
    with mqcore.open(path, flush="os") as s:  # writes the checkpoint of the copied partitions
        assert sum(len(s.segment_offsets("t", p)) for p in range(PARTITIONS)) == 20_000
    for mode in ("write", "read"):
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, path, str(LIMIT), str(PARTITIONS), str(SEGMENTS),
             mode],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        fds, segments = (int(w) for w in proc.stdout.splitlines()[-1].split()[1::2])
        # a writer holds one descriptor per partition (its active segment), a reader none
        assert segments >= 20_000 and fds < (PARTITIONS if mode == "write" else 0) + 16, proc.stdout
