"""Seed the fuzz corpora from real files: `python fuzz/make_corpus.py [OUT_DIR]`.

Writes a small store (every codec, keys, null keys and values, headers, tags, properties, unique
IDs, several segments) in a temporary directory and copies its bytes into OUT_DIR/<harness>/
(default fuzz/corpus, which is generated and not committed): whole small segments and single
batches for the decoders, compressed record areas for the codec harness, index and key index
files, the store's IDs, selectors, the metadata files, and recovery inputs. Run from the repo
root with the package importable (PYTHONPATH=src).
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import io
import os
import struct
import sys
import tempfile
import types
import uuid
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from typing import Any, Union, get_args, get_origin

import mqcore
from mqcore._ext.batch import read_batch_info

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
LOG_OVERHEAD = 12
RECORDS_AT = 61  # a v2 batch's records area starts after its 61-byte header

SELECTORS = [
    "color = 'red'",
    "size > 3 AND size <= 10.5",
    "name LIKE 'a%' ESCAPE '!' OR name NOT LIKE '_b'",
    "kind IN ('x', 'y') AND NOT (level BETWEEN 1 AND 5)",
    "flag IS NULL OR flag = TRUE",
    "a <> b AND c >= -1e3",
]
PROPS = b"color=red\nsize=7\nname=abc\nkind=x\nlevel=3\nflag=true\na=1\nb=2\nc=0"


def build_store(path: str) -> tuple[list[str], list[str]]:
    """A store with one topic of several segments; returns (store IDs, unique IDs)."""
    msg_ids: list[str] = []
    uids: list[str] = []
    with mqcore.open(path) as store:
        store.create_topic("t", partitions=1, segment_bytes=4096, key_index_entries=256)
        for round_ in range(2):
            for codec in CODECS:
                n = 5 + round_ * 7
                meta = store.append_batch(
                    "t",
                    [
                        f"value {codec} {i}".encode() * (1 + i % 3) if i % 4 else None
                        for i in range(n)
                    ],
                    keys=[f"key-{i % 3}".encode() if i % 2 else None for i in range(n)],
                    headers=[[("h", b"v"), ("empty", None)] for _ in range(n)],
                    timestamps=[1_700_000_000_000 + round_ * 1000 + i for i in range(n)],
                    compression=codec,
                    tags=[f"tag{i % 2}" for i in range(n)],
                    properties=[{"color": "red", "size": i} for i in range(n)],
                )
                del meta
        for i in range(3):
            rec = store.append(
                "t",
                b"single %d" % i,
                key=b"solo",
                tag="solo",
                properties={"kind": "x"},
                keys="extra words",
            )
            msg_ids.append(rec.msg_id)
            if rec.unique_id:
                uids.append(rec.unique_id)
    return msg_ids, uids


def split_batches(log: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos < len(log):
        info = read_batch_info(log, pos, False)
        if info is None:
            break
        out.append(log[pos : pos + info.size])
        pos += info.size
    return out


def main(out_dir: str) -> None:
    def put(harness: str, name: str, data: bytes) -> None:
        d = os.path.join(out_dir, harness)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)

    first_batch = b""
    with tempfile.TemporaryDirectory(prefix="mqcore-corpus-") as tmp:
        store_dir = os.path.join(tmp, "store")
        msg_ids, uids = build_store(store_dir)
        part = os.path.join(store_dir, "t-0")
        for log_path in sorted(glob.glob(os.path.join(part, "*.log"))):
            base = os.path.basename(log_path)[:-4]
            with open(log_path, "rb") as f:
                log = f.read()
            for harness in ("batch", "scan", "keyindex"):
                put(harness, f"{base}.log", log)
            for i, b in enumerate(split_batches(log)):
                first_batch = first_batch or b
                put("batch", f"{base}-{i}", b)
                put("scan", f"{base}-{i}", b)
                put("keyindex", f"{base}-batch-{i}", b)
                info = read_batch_info(b, 0, False)
                if info.codec:
                    count = min(info.records_count, 64)
                    head = bytes([(info.codec - 1) | ((count - 1) << 2)])
                    put("compression", f"{base}-{i}", head + b[RECORDS_AT:])
            for suffix in (".index", ".timeindex", ".keyindex"):
                path = os.path.join(part, base + suffix)
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        data = f.read()
                    put("keyindex" if suffix == ".keyindex" else "index", base + suffix, data)
            idx = b""
            if os.path.exists(os.path.join(part, base + ".index")):
                with open(os.path.join(part, base + ".index"), "rb") as f:
                    idx = f.read()
            for flags in (0, 1, 2):
                put(
                    "recovery",
                    f"{base}-{flags}",
                    bytes([flags]) + struct.pack(">I", len(log)) + log + idx,
                )
        for name in ("mqcore-topics.json", "mqcore-recovery-point-checkpoint"):
            with open(os.path.join(store_dir, name), "rb") as f:
                put("logdir", name, f.read())
    for i, text in enumerate(msg_ids + uids + [u.replace("-", "") for u in uids]):
        put("ids", f"id-{i}", text.encode())
    for i, text in enumerate(SELECTORS):
        put("selector", f"sel-{i}", text.encode() + b"\0" + PROPS)
    for name, frame in server_requests(first_batch):
        put("server_request", name, frame)
    for name, frame in null_seeds():
        put("server_request", name, frame)
    print(f"corpora written under {out_dir}")


def server_requests(batch: bytes) -> list[tuple[str, bytes]]:
    """Request payloads as Kafka clients send them (header and body, without the size), built
    with kio: one per API the server answers, at its lowest and highest version where the
    fields allow, Produce carrying `batch`. None without kio (Python 3.10)."""
    try:
        from kio.index import load_payload_module
        from kio.serial import entity_writer
        from kio.static.constants import EntityType
    except ImportError:
        return []
    import datetime
    import io

    def payload(key: int, version: int, **fields: object) -> bytes:
        mod = load_payload_module(key, version, EntityType.request)
        cls = next(v for v in vars(mod).values()
                   if getattr(v, "__type__", None) is EntityType.request)  # fmt: skip
        out = io.BytesIO()
        header = cls.__header_schema__
        entity_writer(header)(out, header(request_api_key=key, request_api_version=version,
                                          correlation_id=7, client_id="corpus"))  # fmt: skip
        entity_writer(cls)(out, cls(**fields))
        return out.getvalue()

    second = datetime.timedelta(seconds=1)
    out = [("api_versions-0", payload(18, 0)),
           ("api_versions-3", payload(18, 3, client_software_name="c",
                                      client_software_version="1"))]  # fmt: skip
    for v in (0, 12):
        mod = load_payload_module(3, v, EntityType.request)
        topic = mod.MetadataRequestTopic(
            **({"name": "t", "topic_id": None} if v >= 10 else {"name": "t"})
        )
        fields: dict[str, object] = {"topics": (topic,)}
        if v >= 4:
            fields["allow_auto_topic_creation"] = True
        if v >= 8:
            fields["include_topic_authorized_operations"] = False
        out.append((f"metadata-{v}", payload(3, v, **fields)))
    for v in (3, 11):
        mod = load_payload_module(0, v, EntityType.request)
        data = mod.TopicProduceData(name="t", partition_data=(
            mod.PartitionProduceData(index=0, records=batch),))  # fmt: skip
        out.append((f"produce-{v}", payload(0, v, transactional_id=None, acks=-1,
                                            timeout=second, topic_data=(data,))))  # fmt: skip
    mod = load_payload_module(1, 12, EntityType.request)
    fetch = mod.FetchTopic(topic="t", partitions=(mod.FetchPartition(
        partition=0, fetch_offset=0, partition_max_bytes=1 << 20),))  # fmt: skip
    out.append(("fetch-12", payload(1, 12, max_wait=second, min_bytes=1, topics=(fetch,),
                                   forgotten_topics_data=())))  # fmt: skip
    mod = load_payload_module(2, 7, EntityType.request)
    lo = mod.ListOffsetsTopic(name="t", partitions=(
        mod.ListOffsetsPartition(partition_index=0, timestamp=-1),))  # fmt: skip
    out.append(("list_offsets-7", payload(2, 7, replica_id=-1, isolation_level=0, topics=(lo,))))
    out.append(("init_producer_id-4", payload(22, 4, transactional_id=None,
                                             transaction_timeout=second)))  # fmt: skip
    return out


def null_seeds() -> list[tuple[str, bytes]]:
    """The null_requests of each API's highest version (none without kio)."""
    try:
        from mqcore.server.protocol import APIS
    except ImportError:
        return []
    return [
        (f"null-{key}-{version}-{place}", payload)
        for key, version, place, _, payload in null_requests()
        if version == APIS[key][2]
    ]


# -- requests with a null in every place one can go (guard.py refuses those the schema has not) --
# kio and mqcore.server are imported by the functions below only: without kio (Python 3.10)
# the corpus has no server requests

_DEFAULTS = {
    "bool": False, "int8": 0, "int16": 0, "uint16": 0, "int32": 0, "uint32": 0, "int64": 0,
    "float64": 0.0, "string": "", "bytes": b"", "records": b"", "uuid": uuid.UUID(int=0),
    "timedelta_i32": datetime.timedelta(0), "timedelta_i64": datetime.timedelta(0),
    "error_code": 0,
}  # fmt: skip


def smallest(cls: type) -> Any:
    """An instance of a kio entity with every field at its smallest non-null value."""
    return cls(**{f.name: value_of(f.type, f.metadata) for f in fields(cls)})


def value_of(tp: Any, metadata: Any) -> Any:
    if get_origin(tp) in (types.UnionType, Union):
        tp = next(a for a in get_args(tp) if a is not type(None))
    if get_origin(tp) is tuple:
        return (value_of(get_args(tp)[0], metadata),)
    if is_dataclass(tp):
        return smallest(tp)  # type: ignore[arg-type]
    return _DEFAULTS[metadata["kafka_type"]]


def nullables(cls: type) -> list[bool]:
    """Whether Kafka's schema allows a null at each string, bytes and array of the smallest
    request of entity `cls` (one element in each array), in the order they come on the wire:
    read from kio's type of each field (`X | None` where Kafka's nullableVersions say so),
    independently of the server's guard."""
    out: list[bool] = []
    for f in fields(cls):
        if "tag" in f.metadata:
            continue
        tp, nullable = f.type, False
        if get_origin(tp) in (types.UnionType, Union):
            nullable, tp = True, next(a for a in get_args(tp) if a is not type(None))
        if get_origin(tp) is tuple:
            out.append(nullable)
            element = get_args(tp)[0]
            if is_dataclass(element):
                out += nullables(element)  # type: ignore[arg-type]
            elif f.metadata.get("kafka_type") in ("string", "bytes", "records"):
                out.append(False)  # an array's element: never null
        elif is_dataclass(tp):
            out += nullables(tp)  # type: ignore[arg-type]
        elif f.metadata.get("kafka_type") in ("string", "bytes", "records"):
            out.append(nullable)
    return out


def with_null(body: bytes, pos: int, kind: str, compact: bool) -> bytes:
    """`body` with the empty string, bytes or one-element array at `pos` made null: the same
    number of bytes (int16/int32 -1, or the compact form's 0)."""
    if compact:
        assert body[pos] in (1, 2)  # "" / b"" (length + 1) or one element (count + 1)
        return body[:pos] + b"\0" + body[pos + 1 :] if body[pos] == 1 else b""
    size = 2 if kind == "string" else 4
    if int.from_bytes(body[pos : pos + size], "big") != (1 if kind == "array" else 0):
        return b""
    return body[:pos] + b"\xff" * size + body[pos + size :]


def null_requests() -> Iterator[tuple[int, int, int, bool, bytes]]:
    """(api key, version, place, nullable, request payload) for every null a request can
    carry: the smallest request of each served API and version (one element in each array,
    zeros and empty strings elsewhere), with a null patched in at each string, bytes and
    array in turn, and whether Kafka's schema allows that null there. tests/test_server_nulls.py
    sends each to a server; the server_request harness's corpus starts from them."""
    from kio.serial import entity_writer

    from mqcore.server import guard
    from mqcore.server.protocol import APIS, api, build, kio_floor

    for key, (_, _low, high) in sorted(APIS.items()):
        for version in range(kio_floor(key), high + 1):  # older ones: server/legacy.py's
            found = api(key, version)
            assert found is not None
            out = io.BytesIO()
            request = smallest(found.request)
            if key == 0:  # acks=0 is answered by no response at all
                request = dataclasses.replace(request, acks=-1)
            entity_writer(found.request)(out, request)
            body = out.getvalue()
            head = io.BytesIO()
            header = found.request.__header_schema__
            entity_writer(header)(head, build(header, request_api_key=key,
                                              request_api_version=version,
                                              correlation_id=key * 100 + version,
                                              client_id="nulls"))  # fmt: skip
            places = guard.length_fields(found.request, body)
            allowed = nullables(found.request)
            assert len(places) == len(allowed), (key, version)
            for i, ((pos, kind, compact), nullable) in enumerate(zip(places, allowed, strict=True)):
                patched = with_null(body, pos, kind, compact)
                if patched:
                    payload = head.getvalue() + patched
                    yield key, version, i, nullable, payload


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus"))
