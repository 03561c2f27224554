"""Named crash points for crash-safety tests: kill the process at an exact step.

Nothing happens unless the environment variable MQCORE_CRASH_AT is set when this module is
imported, as "name" (crash the first time the point is reached) or "name:N" (the N-th time),
or after `arm(spec)` (a test child that sets up first and then picks its point).
The process then dies by SIGKILL, as a power cut or `kill -9` would stop it: no finally blocks,
no atexit, no flush. Every point is listed in CRASH_POINTS.
"""

from __future__ import annotations

import os
import signal

from mqcore.errors import InvalidConfigError

CRASH_POINTS = (
    # append (storage/segment.py): around the log write and the index entries
    "append.before_write",
    "append.after_write",
    "append.after_index",
    # roll (storage/partition.py)
    "roll.after_seal",
    "roll.after_new_segment",
    "roll.before_dir_fsync",
    # an index file cut to its valid entries (storage/index.py, at seal)
    "index.after_trim",
    # atomic checkpoint writes (storage/logdir.py): recovery points, topics, clean marker
    "checkpoint.after_tmp_write",
    "checkpoint.after_fsync",
    "checkpoint.after_rename",
    # consumer offset commits (consume/offsets.py)
    "offsets.after_append",
    "offsets.after_fdatasync",
    "share_state.after_append",
    "share_state.after_fdatasync",
    # producer state snapshot (storage/producer_state.py)
    "producer_snapshot.after_write",
    # truncation (storage/partition.py Partition.truncate, mqcore.log's truncate_to)
    "truncate.after_copy",
    "truncate.after_replace",
    "truncate.after_drop",
    # compaction's segment swap (storage/cleaner.py), in the order the steps happen
    "compact.after_cleaned",
    "compact.after_swap",
    "compact.after_deleted",
    "compact.after_final",
    "compact.before_unlink",
    # an active key index grown by doubling (storage/keyindex.py): the new file in place,
    # then its entries copied
    "keyindex.after_grow_file",
    "keyindex.after_grow_copy",
    # retention (storage/retention.py)
    "retention.after_deleted",
    "retention.before_unlink",
    # topic deletion (mqcore.log Log.delete_topic): the topic list saved without it (naming
    # it `deleting`), then its partition directories renamed to `-delete`
    "delete_topic.after_save",
    "delete_topic.after_rename",
    # new partitions' directories made, before the topic list declares them (Log.add_partitions)
    "add_partitions.after_dirs",
    # the two-phase relay of a transaction commit and of a delayed delivery (produce/relay.py):
    # the PREPARE record durable; the N-th target partition's re-append done (visit N)
    "txn.after_prepare",
    "txn.after_append",
    "delay.after_prepare",
    "delay.after_append",
    # live parked messages copied to the end of their log before a trim (produce/*.py)
    "txn.after_repark",
    # Kafka's transaction coordinator (server/transactions.py): the decision written, then
    # each marker
    "kafka_txn.after_prepare",
    "kafka_txn.after_marker",
    "delay.after_repark",
)
# points walked by their own tests (tests/test_transactions.py, test_delay.py, test_trim.py,
# test_topics.py, test_server_transactions.py; the embedding API's truncation by
# tests/test_embedding.py, which kills a ReplicaLog at each), not
# by tests/test_crash_walk.py's Store workload
WALKED_ELSEWHERE = frozenset(
    p
    for p in CRASH_POINTS
    if p.startswith(
        ("txn.", "kafka_txn.", "delay.", "truncate.", "delete_topic.", "add_partitions.")
    )
)


def _parse(spec: str | None) -> tuple[str | None, int]:
    if not spec:
        return None, 0
    name, _, count = spec.partition(":")
    if name not in CRASH_POINTS:
        raise InvalidConfigError(
            f"MQCORE_CRASH_AT={spec!r}: unknown crash point {name!r}; known: {CRASH_POINTS}"
        )
    if not count:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        raise InvalidConfigError(f"MQCORE_CRASH_AT={spec!r}: the count must be an int >= 1")
    return name, int(count)


_TARGET, _REMAINING = _parse(os.environ.get("MQCORE_CRASH_AT"))


def arm(spec: str | None) -> None:
    """Crash at `spec` ("name" or "name:N", as MQCORE_CRASH_AT says it; visits count from
    now) from now on; None disarms."""
    global _TARGET, _REMAINING
    _TARGET, _REMAINING = _parse(spec)


def crash_point(name: str) -> None:
    """Die here if MQCORE_CRASH_AT names this point and this is the chosen visit."""
    global _REMAINING
    if _TARGET is None or name != _TARGET:
        return
    _REMAINING -= 1
    if _REMAINING == 0:
        try:
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(137)  # where SIGKILL cannot be sent to ourselves


__all__ = ["CRASH_POINTS", "WALKED_ELSEWHERE", "arm", "crash_point"]
