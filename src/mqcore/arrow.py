"""Arrow record batches in Spark's Kafka-source schema, from buffers the Cython decoder filled.

Column order and types are Spark's Kafka source (docs/format.md "Arrow columns"):
key binary, value binary, topic string, partition int32, offset int64,
timestamp timestamp[us, UTC], timestampType int32, then headers list<struct<key, value>> when
asked for. Non-large binary/string with int32 offsets, as Spark's Arrow path expects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqcore._ext.arrowcols import ArrowColumns, repeated_int32, repeated_string

if TYPE_CHECKING:
    import pyarrow as pa

    from mqcore._ext.batch import Message


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("read_arrow needs pyarrow: pip install 'mqcore[arrow]'") from e
    return pyarrow


def kafka_schema(include_headers: bool = False) -> pa.Schema:
    """The Arrow schema Spark derives from its Kafka source schema."""
    pa = _pa()
    fields = [
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=True),
        pa.field("topic", pa.string(), nullable=True),
        pa.field("partition", pa.int32(), nullable=True),
        pa.field("offset", pa.int64(), nullable=True),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=True),
        pa.field("timestampType", pa.int32(), nullable=True),
    ]
    if include_headers:
        header = pa.struct(
            [
                pa.field("key", pa.string(), nullable=True),
                pa.field("value", pa.binary(), nullable=True),
            ]
        )
        fields.append(pa.field("headers", pa.list_(pa.field("element", header)), nullable=True))
    return pa.schema(fields)


def new_columns(include_headers: bool = False) -> ArrowColumns:
    return ArrowColumns(include_headers)


def to_record_batch(cols: ArrowColumns, topic: str, partition: int) -> pa.RecordBatch:
    """Wrap the builder's buffers (moved out of it, not copied) as a RecordBatch."""
    pa = _pa()
    include_headers = cols.include_headers
    b = cols.finish()
    n = b["num_rows"]
    py = pa.py_buffer
    key = pa.Array.from_buffers(
        pa.binary(),
        n,
        [
            py(b["key_validity"]) if b["key_nulls"] else None,
            py(b["key_offsets"]),
            py(b["key_data"]),
        ],
        null_count=b["key_nulls"],
    )
    value = pa.Array.from_buffers(
        pa.binary(),
        n,
        [
            py(b["value_validity"]) if b["value_nulls"] else None,
            py(b["value_offsets"]),
            py(b["value_data"]),
        ],
        null_count=b["value_nulls"],
    )
    topic_offsets, topic_data = repeated_string(topic.encode("utf-8"), n)
    arrays = [
        key,
        value,
        pa.Array.from_buffers(pa.string(), n, [None, py(topic_offsets), py(topic_data)]),
        pa.Array.from_buffers(pa.int32(), n, [None, py(repeated_int32(partition, n))]),
        pa.Array.from_buffers(pa.int64(), n, [None, py(b["offset"])]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, py(b["timestamp"])]),
        pa.Array.from_buffers(pa.int32(), n, [None, py(b["timestamp_type"])]),
    ]
    if include_headers:
        arrays.append(_headers_array(pa, b, n))
    return pa.RecordBatch.from_arrays(arrays, schema=kafka_schema(include_headers))


def _headers_array(pa: Any, b: dict[str, Any], n: int) -> pa.Array:
    py = pa.py_buffer
    h = b["num_headers"]
    keys = pa.Array.from_buffers(
        pa.string(), h, [None, py(b["header_key_offsets"]), py(b["header_key_data"])]
    )
    values = pa.Array.from_buffers(
        pa.binary(),
        h,
        [
            py(b["header_value_validity"]) if b["header_value_nulls"] else None,
            py(b["header_value_offsets"]),
            py(b["header_value_data"]),
        ],
        null_count=b["header_value_nulls"],
    )
    struct_type = kafka_schema(True).field("headers").type.value_type
    structs = pa.StructArray.from_arrays([keys, values], fields=list(struct_type))
    return pa.Array.from_buffers(
        kafka_schema(True).field("headers").type,
        n,
        [None, py(b["header_lists"])],
        children=[structs],
    )


_I64, _U64 = 1 << 63, (1 << 64) - 1


def messages_batch(msgs: list[Message], include_headers: bool) -> pa.RecordBatch:
    """`msgs` as one RecordBatch of arrow.kafka_schema (timestamps in microseconds); the
    headers as one flat key array and one value array cut by list offsets, not a Python
    object per header."""
    pa = _pa()
    schema = kafka_schema(include_headers)
    # microseconds wrapped to int64 as the kernel's columns have them (wrap_mul)
    micros = [((m.timestamp * 1000 + _I64) & _U64) - _I64 for m in msgs]
    arrays = [
        pa.array([m.key for m in msgs], pa.binary()),
        pa.array([m.value for m in msgs], pa.binary()),
        pa.array([m.topic for m in msgs], pa.string()),
        pa.array([m.partition for m in msgs], pa.int32()),
        pa.array([m.offset for m in msgs], pa.int64()),
        pa.array(micros, pa.int64()).cast(schema.field(5).type),
        pa.array([m.timestamp_type for m in msgs], pa.int32()),
    ]
    if include_headers:
        names: list[str] = []
        values: list[bytes | None] = []
        ends = [0]
        for m in msgs:
            for k, v in m.headers:
                names.append(k)
                values.append(v)
            ends.append(len(names))
        try:
            keys = pa.array(names, pa.string())
        except UnicodeEncodeError:  # a key that is not UTF-8 (surrogate escapes): U+FFFD
            keys = pa.array([utf8_text(k) for k in names], pa.string())  # as the kernel's
        field = schema.field(7).type.value_type
        pairs = pa.StructArray.from_arrays(
            [keys, pa.array(values, pa.binary())],
            fields=list(field),
        )
        arrays.append(pa.ListArray.from_arrays(pa.array(ends, pa.int32()), pairs,
                                               type=schema.field(7).type))  # fmt: skip
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def utf8_text(text: str) -> str:
    """`text` (a header key, its bad UTF-8 as surrogate escapes) with each bad sequence as
    U+FFFD, as the kernel's columns and Java's String decoding show it."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
