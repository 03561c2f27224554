"""mqcore: an embeddable, durable message log with Kafka-compatible segments.

import mqcore
with mqcore.open("data/") as store:
    store.create_topic("orders", partitions=4)
    md = store.append("orders", b"value", key=b"k")
    msgs = store.read("orders", md.partition, md.offset)
"""

from mqcore import errors
from mqcore._ext.batch import Message
from mqcore._version import __version__
from mqcore.config import FlushPolicy, TopicConfig
from mqcore.store import BatchMetadata, RecordMetadata, Store, open

__all__ = [
    "BatchMetadata",
    "FlushPolicy",
    "Message",
    "RecordMetadata",
    "Store",
    "TopicConfig",
    "__version__",
    "errors",
    "open",
]
