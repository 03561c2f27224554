# The key lookup's front in the query layer: Store.find_by_key and the tracer call it. It checks
# the user's arguments with the engine's helpers (only when they are not the defaults), runs the
# kernel's lookup (_ext/lookup.pyx find_in_partitions, which returns plain values) and builds the
# QueryResult. Compiled, so a lookup of a few microseconds carries no Python frame of its own;
# by the layers (docs/architecture.md) it is query code: it imports query and what is below.
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport int64_t

from mqcore._ext.lookup cimport find_in_partitions, in_order

from mqcore.query.engine import (
    LIMIT,
    MAX_LIMIT,
    MAX_PROBE,
    NO_END,
    QueryResult,
    check_limit,
    decode_cursor,
    encode_cursor,
    query_bytes,
    time_bounds,
)
from mqcore.storage.segment import MAX_DECOMPRESSED

cdef Py_ssize_t _max_limit = MAX_LIMIT, _max_probe = MAX_PROBE
cdef Py_ssize_t _max_decompressed = MAX_DECOMPRESSED
cdef int64_t _no_end = NO_END
cdef object _result_type = QueryResult, _limit_reason = LIMIT
cdef tuple _no_args = ()


def find_indexed(parts, key, int kind, start, end, limit, cursor):
    """The messages of `parts` (partitions in number order, or a topic's dict of them by
    number) whose record carries `key` (bytes, or str as UTF-8) by their key index (`kind`:
    lookup.KEY_KIND; unique IDs go through engine.find_unique), with timestamps in
    [start, end) ms (None: unbounded), at most `limit` of them, resuming at `cursor`, as a
    QueryResult."""
    cdef int64_t lo = 0, hi = _no_end, resume_o = 0, stop_o = 0
    cdef Py_ssize_t resume_p = -1, n, scanned = 0, stop_p = -1
    cdef bytes raw
    if type(key) is bytes:
        raw = <bytes>key
    else:
        raw = query_bytes(key, "key")  # str as UTF-8; refuses what has no bytes
    if start is not None or end is not None:
        lo, hi = time_bounds(start, end)
    if type(limit) is int and 1 <= <object>limit <= _max_limit:
        n = limit
    else:
        n = check_limit("limit", limit, _max_limit)
    if cursor is not None:
        resume_p, resume_o = decode_cursor(cursor)
    messages = find_in_partitions(in_order(parts), raw, kind, lo, hi, n, resume_p, resume_o,
                                  _max_probe, _max_decompressed, &scanned, &stop_p, &stop_o)
    # made without __init__ (a lookup is a few microseconds): the fields not set here keep
    # their class-level defaults (reason EXHAUSTED, scanned_bytes 0, cursor None, ...)
    result = (<PyTypeObject*>_result_type).tp_new(<type>_result_type, <PyObject*>_no_args, NULL)
    result.messages = messages
    result.scanned_records = scanned
    if stop_p >= 0:
        result.reason = _limit_reason
        result.cursor = encode_cursor(stop_p, stop_o)
    return result
