"""mqcore's extra columns of a Spark read (option includeExtras): `msg_id` and `tag`.

Both are computed from an Arrow batch the Cython decoder built, with array operations only
(numpy and pyarrow.compute), no Python object per record:
  msg_id  the store ID (query/ids.py): "m1-" + base64url, unpadded, of varint partition |
          varint offset | UTF-8 topic. The partition and topic bytes are the same for every
          row; the offset's varint is laid out per row in a byte matrix, one matrix per varint
          length, and base64 is done on the matrix.
  tag     the value of the record's first `tag` header as a string (append(tag=...)), null
          when it has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mqcore._ext.varint import encode_varint
from mqcore.query.ids import STORE_ID_PREFIX

if TYPE_CHECKING:
    import pyarrow as pa

EXTRA_COLUMNS = ("msg_id", "tag")
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_MAX_VARINT = 10  # bytes of a 64-bit varint


def msg_id_array(topic: str, partition: int, offsets: pa.Array) -> pa.Array:
    """The store IDs of the records at `offsets` (int64, no nulls, each >= 0) as a string
    array, equal to query.ids.encode_msg_id for every row."""
    import numpy as np
    import pyarrow as pa

    n = len(offsets)
    zigzag = offsets.to_numpy(zero_copy_only=False).astype(np.uint64) << np.uint64(1)
    lengths = np.ones(n, dtype=np.int64)
    for k in range(1, _MAX_VARINT):
        lengths += zigzag >= np.uint64(1 << (7 * k))
    head = np.frombuffer(encode_varint(partition), dtype=np.uint8)
    tail = np.frombuffer(topic.encode("utf-8"), dtype=np.uint8)
    prefix = np.frombuffer(STORE_ID_PREFIX.encode("ascii"), dtype=np.uint8)
    raw_width = len(head) + lengths + len(tail)
    text_width = len(prefix) + (4 * raw_width + 2) // 3
    ends = np.cumsum(text_width)
    starts = ends - text_width
    data = np.empty(int(ends[-1]) if n else 0, dtype=np.uint8)
    alphabet = np.frombuffer(_ALPHABET, dtype=np.uint8)
    for k in np.unique(lengths):
        rows = np.nonzero(lengths == k)[0]
        width = len(head) + int(k) + len(tail)
        padded = -(-width // 3) * 3
        raw = np.zeros((len(rows), padded), dtype=np.uint8)
        raw[:, : len(head)] = head
        z = zigzag[rows]
        for j in range(int(k)):
            byte = (z >> np.uint64(7 * j)) & np.uint64(0x7F)
            if j < k - 1:
                byte |= np.uint64(0x80)
            raw[:, len(head) + j] = byte.astype(np.uint8)
        raw[:, len(head) + int(k) : width] = tail
        text = np.empty((len(rows), len(prefix) + padded // 3 * 4), dtype=np.uint8)
        text[:, : len(prefix)] = prefix
        text[:, len(prefix) :] = _base64(raw, alphabet)
        chars = len(prefix) + (4 * width + 2) // 3
        data[starts[rows, None] + np.arange(chars)] = text[:, :chars]
    value_offsets = np.concatenate([[0], ends]).astype(np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(value_offsets), pa.py_buffer(data)]
    )


def _base64(raw: Any, alphabet: Any) -> Any:
    """Rows of bytes (a multiple of 3 wide) as rows of base64 characters, no padding marks:
    the last group of a row shorter than 3 bytes is zero-filled, as base64 does."""
    import numpy as np

    groups = raw.reshape(raw.shape[0], -1, 3).astype(np.uint32)
    bits = (groups[:, :, 0] << 16) | (groups[:, :, 1] << 8) | groups[:, :, 2]
    sextets = np.stack([(bits >> s) & 0x3F for s in (18, 12, 6, 0)], axis=2)
    return alphabet[sextets].reshape(raw.shape[0], -1)


def tag_array(headers: pa.Array) -> pa.Array:
    """Each row's first `tag` header value as a string (null when it has none), from the
    headers column (list<struct<key: string, value: binary>>)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(headers)
    items = headers.flatten()
    parents = pc.list_parent_indices(headers)
    is_tag = pc.fill_null(pc.equal(items.field("key"), "tag"), False)
    rows = parents.filter(is_tag).to_numpy(zero_copy_only=False)
    values = items.field("value").filter(is_tag)
    first_rows, first_at = np.unique(rows, return_index=True)
    index = np.full(n, -1, dtype=np.int64)
    index[first_rows] = first_at
    picked = values.take(pa.array(index, mask=index < 0))
    try:
        return picked.cast(pa.string())
    except pa.ArrowInvalid:
        # a tag header that is not UTF-8 (only a raw header can carry one): shown with
        # U+FFFD, as header keys are
        return pa.array(
            [None if v is None else v.decode("utf-8", "replace") for v in picked.to_pylist()],
            pa.string(),
        )


def extras_fields() -> list[pa.Field]:
    import pyarrow as pa

    return [pa.field("msg_id", pa.string()), pa.field("tag", pa.string())]


def add_extras(
    batch: pa.RecordBatch, topic: str, partition: int, keep_headers: bool
) -> pa.RecordBatch:
    """`batch` (read with headers) with the msg_id and tag columns appended; its headers
    column dropped unless `keep_headers`."""
    import pyarrow as pa

    headers = batch.column("headers")
    msg_ids = msg_id_array(topic, partition, batch.column("offset"))
    tags = tag_array(headers)
    kept = batch if keep_headers else batch.drop_columns(["headers"])
    schema = kept.schema
    for f in extras_fields():
        schema = schema.append(f)
    return pa.RecordBatch.from_arrays([*kept.columns, msg_ids, tags], schema=schema)
