"""The log layer: the core a broker embeds (docs/embedding.md).

`Log` (manager.py) owns a log directory: topics, partitions, recovery, flushing and the
background tasks. `append.py` builds what an append writes; `internal.py` holds the rule of
internal topics. The consumption model (consume/, produce/) and the `Store` facade sit above.
"""

from mqcore.log.manager import Log

__all__ = ["Log"]
