"""The Arrow batches a Spark task hands Spark for one offset range, batch read or stream.

Store.iter_arrow builds them with the Cython decoder (no Python object per record), or with
query options the store's query engine finds the matches (spark/query.py); two things
are Spark's and done here with array operations: with includeHeaders, a record without headers
has `headers` null, as in Spark's Kafka source (the store's Arrow column, like Message.headers,
holds an empty list); with includeExtras, mqcore's msg_id and tag columns are appended.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mqcore.errors import NotAStoreError
from mqcore.handles import shared_store
from mqcore.spark.extras import add_extras
from mqcore.spark.options import ReadOptions
from mqcore.spark.query import query_batches

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore.spark.plan import OffsetRange
    from mqcore.store import Store


@contextlib.contextmanager
def task_store(path: str) -> Iterator[Store]:
    """This worker's read-only handle of the store a task reads (mqcore.handles), lent for
    the task. The driver planned the read from a store at `path`: when this machine does not
    see one there, the error says so and names the machine, since on a cluster that is a
    mount missing on one worker, not a wrong path (docs/spark.md "On a Spark cluster")."""
    with contextlib.ExitStack() as lent:
        try:
            store = lent.enter_context(shared_store(path))
        except NotAStoreError as e:
            raise NotAStoreError(
                f"{e} (on {socket.gethostname()}, in a Spark task: the driver planned this "
                "read from a store at that path; every worker must see the store at the same "
                'path, docs/spark.md "On a Spark cluster")'
            ) from e
        yield store


def range_batches(store: Store, rng: OffsetRange, opts: ReadOptions) -> Iterator[pa.RecordBatch]:
    """The records of `rng` as batches of at most maxRecordsPerBatch rows and
    maxBytesPerBatch bytes, in the read's Spark schema; with query options, only those that
    match them (spark/query.py)."""
    if opts.query is not None:
        batches = query_batches(store, rng, opts)
    else:
        batches = store.iter_arrow(
            rng.topic,
            rng.partition,
            rng.start,
            rng.end,
            include_headers=opts.include_headers or opts.include_extras,
            max_records=opts.max_records_per_batch,
            max_bytes=opts.max_bytes_per_batch,
            isolation_level=opts.isolation_level,
        )
    for batch in batches:
        if opts.include_headers:
            batch = null_empty_headers(batch)
        if opts.include_extras:
            batch = add_extras(batch, rng.topic, rng.partition, opts.include_headers)
        yield batch


def null_empty_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with the headers of each record that has none null instead of an empty list
    (Spark's Kafka source: `headers` is null when a record carries no header)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    at = batch.schema.get_field_index("headers")
    headers = batch.column(at)
    absent = pc.equal(pc.list_value_length(headers), 0)
    if not pc.any(absent).as_py():
        return batch
    nulled = pa.ListArray.from_arrays(
        headers.offsets, headers.values, type=headers.type, mask=absent
    )
    return batch.set_column(at, batch.schema.field(at), nulled)
