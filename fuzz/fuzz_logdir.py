"""Fuzz the store directory's metadata loaders (mqcore.storage.logdir): mqcore-topics.json and
the recovery-point checkpoint (Kafka's text format), each holding the input."""

from __future__ import annotations

import os

import fuzzcommon
from fuzzcommon import EXPECTED

logdir = fuzzcommon.mqcore.storage.logdir

_DIR = fuzzcommon.scratch_dir("mqcore-fuzz-logdir-")
fuzzcommon.mqcore.open(_DIR).close()  # an empty store: a read-only LogDirectory refuses a non-store
_DIRECTORY = logdir.LogDirectory(_DIR, writable=False)


def test_one_input(data: bytes) -> None:
    for name in (logdir.TOPICS_FILE, logdir.RECOVERY_CHECKPOINT):
        path = os.path.join(_DIR, name)
        with open(path, "wb") as f:
            f.write(data)
        try:
            if name == logdir.TOPICS_FILE:
                for topic, config in _DIRECTORY.load_topics().items():
                    assert isinstance(topic, str) and config.partitions >= 1
            else:
                for (topic, partition), offset in _DIRECTORY.load_recovery_points().items():
                    assert isinstance(topic, str) and isinstance(partition, int)
                    assert isinstance(offset, int)
        except EXPECTED:
            pass
        finally:
            os.unlink(path)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
