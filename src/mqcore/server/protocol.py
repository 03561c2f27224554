"""Kafka's wire protocol: frames, request and response headers, and the table of the APIs and
versions `mqcore serve` answers. The message bodies are kio's (Aiven's Python types generated
from Kafka's own JSON schemas, clients/src/main/resources/common/message/*.json, with a native
reader), so every field, version and tagged field is Kafka's, not a transcription of ours.

Wire schema (all integers big-endian):

    frame     size int32 (the bytes after it) | payload
    request   header | body
      header v1  api_key int16 | api_version int16 | correlation_id int32
                 | client_id nullable string (int16 length, -1 null)
      header v2  header v1 | tagged fields (uvarint count, then tag/size/bytes each)
    response  header | body
      header v0  correlation_id int32
      header v1  correlation_id int32 | tagged fields

A request uses header v2 when its API version is "flexible" (compact strings and arrays, tagged
fields) and v1 otherwise; a response header v1 or v0 alike, except ApiVersions' response,
which is always header v0: a client reads it before it knows which versions the broker speaks.
The header version of each entity is kio's `__header_schema__`.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from mqcore.errors import ProtocolError, UnsupportedVersionError
from mqcore.server.guard import check_body, check_header
from mqcore.server.legacy import LEGACY, LegacyVersion, read_request
from mqcore.server.producewire import read_produce

Frame = bytes | bytearray | memoryview  # a request payload: the server's is a reused buffer
_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_CORRELATION = struct.Struct(">i")

PRODUCE = 0
API_VERSIONS = 18
PRODUCE_FLOOR = 3  # kio's first Produce version: v0-v2 are read by producewire, lifted to v3
PRODUCE_LIFT = LegacyVersion(PRODUCE, 0, PRODUCE_FLOOR, request=[], response=[])

# The APIs and versions served: (key, name, lowest, highest). Lowest versions are Kafka 3.9's:
# the versions Kafka 4 removed (KIP-896) are still sent by clients in use (sarama's default,
# kafka-go 0.2, Burrow), and librdkafka before 2.x compresses only when Produce and Fetch v2
# are listed (KAFKA-18659); kio has no types for them, server/legacy.py describes them. The
# highest stop where a later version needs something mqcore does not keep (topic IDs in Fetch
# 13 and Produce 13, share groups) or changes semantics it does not implement (Produce 12: the
# transactions of KIP-890). docs/server.md explains each choice.
APIS: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 0, 11),
    1: ("Fetch", 0, 12),
    2: ("ListOffsets", 0, 7),
    3: ("Metadata", 0, 12),
    # consumer groups, classic protocol (groups.py)
    8: ("OffsetCommit", 0, 9),
    9: ("OffsetFetch", 0, 9),
    10: ("FindCoordinator", 0, 4),
    11: ("JoinGroup", 0, 9),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 5),
    14: ("SyncGroup", 0, 5),
    15: ("DescribeGroups", 0, 6),
    16: ("ListGroups", 0, 5),
    # SASL (server.auth, answered by the connection, not the broker): after SaslHandshake v0
    # the SASL messages are bare size-prefixed tokens (clients before Kafka 1.0); after v1
    # they are SaslAuthenticate requests
    17: ("SaslHandshake", 0, 1),
    18: ("ApiVersions", 0, 4),
    19: ("CreateTopics", 0, 7),
    20: ("DeleteTopics", 0, 6),
    21: ("DeleteRecords", 0, 2),
    22: ("InitProducerId", 0, 4),
    23: ("OffsetForLeaderEpoch", 0, 4),
    # Kafka's transactions (txnapis.py): the producer's versions of AddPartitionsToTxn and v4,
    # a partition leader's verification (KIP-890); those before KIP-890's second part (EndTxn
    # v5); WriteTxnMarkers, a coordinator's to a partition's leader on a cluster
    24: ("AddPartitionsToTxn", 0, 4),
    25: ("AddOffsetsToTxn", 0, 3),
    26: ("EndTxn", 0, 4),
    27: ("WriteTxnMarkers", 1, 1),
    28: ("TxnOffsetCommit", 0, 4),
    32: ("DescribeConfigs", 0, 4),
    33: ("AlterConfigs", 0, 2),
    36: ("SaslAuthenticate", 0, 2),
    37: ("CreatePartitions", 0, 3),
    42: ("DeleteGroups", 0, 2),
    44: ("IncrementalAlterConfigs", 0, 1),
    47: ("OffsetDelete", 0, 0),
    60: ("DescribeCluster", 0, 1),
    65: ("DescribeTransactions", 0, 0),
    66: ("ListTransactions", 0, 1),
    # consumer groups, KIP-848's protocol (consumergroups.py)
    68: ("ConsumerGroupHeartbeat", 0, 1),
    69: ("ConsumerGroupDescribe", 0, 1),
}

# the APIs the connection answers itself (authentication), before and besides the broker
CONNECTION_APIS = frozenset({17, 36})


@dataclass(frozen=True, slots=True)
class Api:
    """One (API, version): its request and response types, their reader and writer, and the
    header types of both."""

    key: int
    version: int
    name: str
    request: type
    response: type
    module: Any  # the response module: its nested types build the response
    read: Callable[[Frame, int], tuple[Any, int]]
    write: Callable[[io.BytesIO, Any], None]
    read_header: Callable[[Frame, int], tuple[Any, int]]
    write_header: Callable[[io.BytesIO, Any], None]
    response_header: type


_APIS: dict[tuple[int, int], Api] = {}


def api(key: int, version: int) -> Api | None:
    """The served (key, version), loaded once; None when it is not served. A version kio has
    no types for (server/legacy.py) is answered by the version it is lifted to."""
    found = _APIS.get((key, version))
    if found is None:
        spec = APIS.get(key)
        if spec is None or not spec[1] <= version <= spec[2]:
            return None
        legacy = lifted(key, version)
        if legacy is not None:
            return api(key, legacy.lift_to)
        req_mod = load_payload_module(key, version, EntityType.request)
        resp_mod = load_payload_module(key, version, EntityType.response)
        request = _payload(req_mod, EntityType.request)
        response = _payload(resp_mod, EntityType.response)
        request_header: type = getattr(request, "__header_schema__")  # noqa: B009
        response_header: type = getattr(response, "__header_schema__")  # noqa: B009
        found = Api(
            key, version, spec[0], request, response, resp_mod,
            entity_reader(request), entity_writer(response), entity_reader(request_header),
            entity_writer(response_header), response_header,
        )  # fmt: skip
        _APIS[(key, version)] = found
    return found


def _payload(module: Any, kind: EntityType) -> type:
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is kind:
            return value
    raise LookupError(f"no {kind.name} entity in {module.__name__}")


@dataclass(slots=True)
class Request:
    """A parsed request: its header fields and body (a kio entity), with the API it is.
    `version` is the client's; `api` the version the handler answers, which differs for a
    version Kafka 4 removed (`legacy`: lifted, server/legacy.py)."""

    api: Api
    correlation_id: int
    client_id: str | None
    body: Any
    version: int = -1
    legacy: LegacyVersion | None = None


def peek_header(frame: Frame) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame's payload."""
    if len(frame) < _HEAD.size:
        raise ProtocolError(f"a request of {len(frame)} bytes has no header (8 bytes at least)")
    return _HEAD.unpack_from(frame)


def peek_client_id(frame: Frame) -> str | None:
    """The client_id of a request header (v1 and v2 alike start with it after the fixed
    fields), or None when it is not there whole: for the log of a request refused unread."""
    if len(frame) < _HEAD.size + 2:
        return None
    (n,) = struct.unpack_from(">h", frame, _HEAD.size)
    start = _HEAD.size + 2
    if n < 0 or start + n > len(frame):
        return None
    return bytes(frame[start : start + n]).decode("utf-8", "replace")


def parse_request(frame: Frame) -> Request:
    """The request in a frame's payload. ProtocolError when the API or version is not served
    or the bytes do not parse as it (the caller answers or closes the connection)."""
    key, version, correlation = peek_header(frame)
    found = api(key, version)
    if found is None:
        spec = APIS.get(key)
        served = f"{spec[0]} v{spec[1]}-v{spec[2]}" if spec else "no such API"
        raise UnsupportedVersionError(
            f"API {key} version {version} is not served ({served})", key, version
        )
    view = memoryview(frame)
    data = view.toreadonly()  # kio's reader refuses a writable buffer; this one copies nothing
    try:
        # kio sizes arrays from the client's counts: bound them first (server/guard.py)
        start = check_header(bool(getattr(found.request, "__flexible__", False)), data)
        header, used = found.read_header(data, 0)
        if used != start:
            raise ProtocolError(f"request header of {used} bytes, {start} expected")
        legacy = lifted(key, version)
        if key == PRODUCE:  # the records stay writable views into the frame (producewire.py)
            body = read_produce(view, used, version)
        elif legacy is not None:
            body = read_request(legacy, found.request, data, used)
        else:  # unknown tagged fields are cut before kio reads (it refuses them)
            cleaned = check_body(found.request, data, used)
            body, _ = found.read(data if cleaned is None else cleaned, used)
    except Exception as e:  # kio raises several types for short or malformed input
        raise ProtocolError(
            f"{found.name} v{version} request of {len(frame)} bytes does not parse: {e}",
            key, version,
        ) from None  # fmt: skip
    # bytes after the body are ignored, as Kafka's broker ignores them (librdkafka 2.x sends
    # Metadata v12 requests with three of them)
    return Request(found, correlation, header.client_id, body, version, legacy)


def kio_floor(key: int) -> int:
    """The lowest served version of API `key` that kio has types for (the ones below it are
    server/legacy.py's)."""
    version = APIS[key][1]
    while lifted(key, version) is not None:
        version += 1
    return version


def lifted(key: int, version: int) -> LegacyVersion | None:
    """The description of a version kio has no types for (Produce v0-v2 included: its
    reader is producewire's), else None."""
    if key == PRODUCE and version < PRODUCE_FLOOR:
        return PRODUCE_LIFT
    return LEGACY.get((key, version))


def encode_response(found: Api, correlation_id: int, body: Any) -> bytes:
    """A whole response frame: size, header, body."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    found.write_header(out, found.response_header(correlation_id=correlation_id))
    found.write(out, body)
    data = out.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    del data
    return out.getvalue()


def unsupported_versions_response(correlation_id: int) -> bytes:
    """ApiVersions v0's answer to an ApiVersions request of a version not served: error
    UNSUPPORTED_VERSION and the versions that are, so the client retries with one (KIP-511)."""
    found = api(API_VERSIONS, 0)
    assert found is not None
    body = found.response(error_code=ErrorCode.unsupported_version, api_keys=api_keys(found))
    return encode_response(found, correlation_id, body)


def api_keys(found: Api) -> tuple[Any, ...]:
    """The served APIs as ApiVersions' entries of `found`'s version."""
    entry = found.module.ApiVersion
    return tuple(
        entry(api_key=k, min_version=lo, max_version=hi) for k, (_, lo, hi) in APIS.items()
    )


_FIELDS: dict[type, frozenset[str]] = {}


def build(cls: type, **values: Any) -> Any:
    """An entity of `cls` from the values its version has (the others are dropped): one
    handler builds every version of its response."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in fields(cls))
    return cls(**{k: v for k, v in values.items() if k in names})


def has_field(cls: type, name: str) -> bool:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in fields(cls))
    return name in names


def frame_size(size: int) -> bytes:
    """The 4-byte size that starts a frame of `size` bytes."""
    return _SIZE.pack(size)


def read_frame_size(head: Frame) -> int:
    return int(_SIZE.unpack(head)[0])


def correlation_of(frame: Frame) -> int:
    return int(_CORRELATION.unpack_from(frame, 4)[0]) if len(frame) >= 8 else -1
