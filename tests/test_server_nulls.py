"""A null (-1) where a request has a string, bytes or array, for every API and version served:
where Kafka's schema allows the null in that version, the server answers; where it does not,
the connection closes, as Kafka's broker closes it on a request its generated reader refuses
("non-nullable field ... was serialized as null"). Either way no handler fails on it (17
handlers raised TypeError on a null array, logged as an internal error) and the server goes
on serving.

Each request is the smallest one kio writes for the version (one element in each array, zeros
and empty strings elsewhere); the null is patched into its bytes at each field in turn."""

from __future__ import annotations

import dataclasses
import datetime
import io
import logging
import socket
import struct
import types
import uuid
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from typing import Any, Union, get_args, get_origin

import pytest
from kafkaclients import recv_exactly

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kio.serial import entity_writer  # noqa: E402

from mqcore.server import guard  # noqa: E402
from mqcore.server.protocol import APIS, api, build  # noqa: E402

WAIT = 30.0
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


def null_places(
    cls: type, plan: Any, buf: memoryview, pos: int, out: list[tuple[int, Any, bool]]
) -> int:
    """(position, step, nullable) of every string, bytes and array of the entity `cls` in the
    body from `pos`, walking the plan the server's guard walks; `nullable` read from kio's
    type of the field (Kafka's nullableVersions), not from the guard."""
    steps, tagged = plan
    untagged = [f for f in fields(cls) if "tag" not in f.metadata]
    for f, step in zip(untagged, steps, strict=True):
        tp, nullable = f.type, False
        if get_origin(tp) in (types.UnionType, Union):
            nullable, tp = True, next(a for a in get_args(tp) if a is not type(None))
        if step[0] in ("string", "bytes", "array"):
            out.append((pos, step, nullable))
        if step[0] == "array" and step[1][0] == "struct":
            n, at = step_count(buf, pos, step)
            for _ in range(n):
                at = null_places(get_args(tp)[0], step[1][1], buf, at, out)
        if step[0] == "struct":
            null_places(tp, step[1], buf, pos, out)
        pos = guard._walk(step, buf, pos, len(buf))
    if tagged is not None:
        pos += 1  # no tagged fields: a count of 0
    return pos


def step_count(buf: memoryview, pos: int, step: Any) -> tuple[int, int]:
    """An array's element count and where its first element starts."""
    if step[2]:  # compact: uvarint count + 1 (small here: one byte)
        return buf[pos] - 1, pos + 1
    return int.from_bytes(buf[pos : pos + 4], "big"), pos + 4


def with_null(body: bytes, pos: int, step: Any) -> bytes:
    """`body` with the empty string, bytes or one-element array at `pos` made null: the same
    number of bytes (int16/int32 -1, or the compact form's 0)."""
    kind, flexible = step[0], step[2]
    if flexible:
        assert body[pos] in (1, 2)  # "" / b"" (length + 1) or one element (count + 1)
        return body[:pos] + b"\0" + body[pos + 1 :] if body[pos] == 1 else b""
    size = 2 if kind == "string" else 4
    if int.from_bytes(body[pos : pos + size], "big") != (1 if kind == "array" else 0):
        return b""
    return body[:pos] + b"\xff" * size + body[pos + size :]


def cases() -> Iterator[tuple[int, int, int, bool, bytes]]:
    """(api key, version, place, nullable, request frame) for every null a request can carry."""
    for key, (_, low, high) in sorted(APIS.items()):
        for version in range(low, high + 1):
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
            places: list[tuple[int, Any, bool]] = []
            null_places(found.request, guard._plan(found.request), memoryview(body), 0, places)
            for i, (pos, step, nullable) in enumerate(places):
                patched = with_null(body, pos, step)
                if patched:
                    payload = head.getvalue() + patched
                    yield key, version, i, nullable, struct.pack(">i", len(payload)) + payload


def answered(address: tuple[str, int], frame: bytes) -> bytes | None:
    """The response payload, or None when the server closed the connection instead."""
    with socket.create_connection(address, timeout=WAIT) as sock:
        sock.sendall(frame)
        try:
            (size,) = struct.unpack(">i", recv_exactly(sock, 4))
            return recv_exactly(sock, size)
        except ConnectionError:
            return None


def test_a_null_gets_an_answer_or_a_close_never_a_handler_failure(
    kafka_server: Any, store: mqcore.Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.create_topic("t")
    seen = {"answered": 0, "closed": 0}
    with caplog.at_level(logging.DEBUG, logger="mqcore"):
        for key, version, place, nullable, frame in cases():
            got = answered(kafka_server.address, frame)
            where = f"API {key} v{version} field #{place} (nullable: {nullable})"
            if nullable:
                assert got is not None, f"{where}: closed instead of answered"
                assert struct.unpack_from(">i", got)[0] == key * 100 + version, where
            elif key == 18:  # ApiVersions that does not parse: answered in v0 (KIP-511)
                assert got is not None and got[4:6] == b"\0\x23", where  # UNSUPPORTED_VERSION
            elif key != 0:  # Produce's own reader (producewire.py) answers what it can
                assert got is None, f"{where}: answered a null the schema does not allow"
            seen["answered" if got is not None else "closed"] += 1
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert failures == []
    assert seen["answered"] > 50 and seen["closed"] > 300, seen
    with mqcore.open(store.path, read_only=True) as again:  # nothing was broken on the way
        assert "t" in again.topics()
