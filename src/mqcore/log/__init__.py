"""The log layer: what a broker embeds (docs/embedding.md). `ReplicaLog` drives one partition's
log as Kafka's UnifiedLog does: leader and follower appends of record batches as bytes, raw
reads to sendfile(), the high watermark, the leader-epoch cache, truncation, DeleteRecords."""

from mqcore.log.epochs import EpochEntry, LeaderEpochCache
from mqcore.log.replica import AppendInfo, FetchResult, FileRegion, ReplicaLog

__all__ = [
    "AppendInfo",
    "EpochEntry",
    "FetchResult",
    "FileRegion",
    "LeaderEpochCache",
    "ReplicaLog",
]
