"""A partition's log start offset when it lies inside its first segment (Kafka's DeleteRecords).

The log starts at its first segment's base offset unless a `log-start-offset` file in the
partition directory says later (docs/format.md "Log start offset"). Kafka's checkpoint text
format, with one entry, the offset itself:

    0          version
    1          entry count
    <offset>   the log start offset
"""

from __future__ import annotations

import os

from mqcore.storage import durable

LOG_START_FILE = "log-start-offset"


def read_log_start(directory: str) -> int:
    """The offset the file holds, or -1 when there is none (a damaged file counts as none:
    the log then starts at its first segment, which only shows records DeleteRecords hid)."""
    try:
        with open(os.path.join(directory, LOG_START_FILE), "rb") as f:
            lines = f.read().decode("ascii").split("\n")
    except FileNotFoundError:
        return -1
    except (OSError, UnicodeDecodeError):
        return -1
    if len(lines) < 3 or lines[0] != "0" or lines[1] != "1" or not lines[2].isdigit():
        return -1
    return int(lines[2])


def write_log_start(directory: str, offset: int, sync: bool) -> None:
    """Replace the file atomically (durable.write_atomic; fsync'd with the directory if sync)."""
    durable.write_atomic(
        os.path.join(directory, LOG_START_FILE), f"0\n1\n{offset}\n".encode(), sync=sync
    )


__all__ = ["LOG_START_FILE", "read_log_start", "write_log_start"]
