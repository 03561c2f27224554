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
