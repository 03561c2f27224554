"""The log layer: the core a broker embeds (docs/embedding.md).

`Log` (manager.py) owns a log directory: topics, partitions, recovery, flushing and the
background tasks. `ReplicaLog` (replica.py) drives one partition as Kafka's UnifiedLog does:
leader and follower appends of record batches as bytes, raw reads to sendfile(), the high
watermark, the leader-epoch cache (epochs.py), truncation, DeleteRecords. `append.py` builds
what a Python append writes; `internal.py` holds the rule of internal topics. The consumption
model (consume/, produce/) and the `Store` facade sit above.
"""

from mqcore.log.epochs import EpochEntry, LeaderEpochCache
from mqcore.log.manager import Log
from mqcore.log.replica import AppendInfo, FetchResult, FileRegion, ReplicaLog

__all__ = [
    "AppendInfo",
    "EpochEntry",
    "FetchResult",
    "FileRegion",
    "LeaderEpochCache",
    "Log",
    "ReplicaLog",
]
