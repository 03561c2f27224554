"""Tagged fields a request's version does not define (a newer client's additions, KIP-482) are
skipped, as Kafka's broker keeps them aside unread; kio's reader refused them and the server
closed the connection. Every flexible request version served, with an unknown tagged field
added to its body, is answered; one added inside a nested struct too, with the same answer as
the request without it."""

from __future__ import annotations

import dataclasses
import io
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from kafkaclients import recv_exactly

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from kio.serial import entity_writer  # noqa: E402
from make_corpus import smallest  # noqa: E402

from mqcore.server.protocol import APIS, PRODUCE, api, build, kio_floor  # noqa: E402

WAIT = 30.0
UNKNOWN = bytes([1, 120, 3]) + b"new"  # one field: tag 120, 3 bytes


def frame(key: int, version: int, body: bytes) -> bytes:
    found = api(key, version)
    assert found is not None
    head, header = io.BytesIO(), found.request.__header_schema__
    entity_writer(header)(head, build(header, request_api_key=key, request_api_version=version,
                                      correlation_id=9, client_id="tags"))  # fmt: skip
    payload = head.getvalue() + body
    return struct.pack(">i", len(payload)) + payload


def body_of(key: int, version: int, **changes: Any) -> bytes:
    found = api(key, version)
    assert found is not None
    request = smallest(found.request)
    if key == PRODUCE:
        request = dataclasses.replace(request, acks=-1)
    if changes:
        request = dataclasses.replace(request, **changes)
    out = io.BytesIO()
    entity_writer(found.request)(out, request)
    return out.getvalue()


def answer(address: tuple[str, int], data: bytes) -> bytes | None:
    with socket.create_connection(address, timeout=WAIT) as sock:
        sock.sendall(data)
        try:
            (size,) = struct.unpack(">i", recv_exactly(sock, 4))
            return recv_exactly(sock, size)
        except ConnectionError:
            return None


def flexible_versions() -> list[tuple[int, int]]:
    out = []
    for key, (_, _low, high) in sorted(APIS.items()):
        for version in range(kio_floor(key), high + 1):
            found = api(key, version)
            if found is not None and getattr(found.request, "__flexible__", False):
                out.append((key, version))
    return out


def test_every_flexible_request_with_an_unknown_tagged_field_is_answered(
    kafka_server: Any, store: mqcore.Store
) -> None:
    store.create_topic("t")
    closed, tried = [], 0
    for key, version in flexible_versions():
        body = body_of(key, version)
        if not body.endswith(b"\0"):  # the smallest request sets a tagged field of its own
            continue
        tried += 1
        if answer(kafka_server.address, frame(key, version, body[:-1] + UNKNOWN)) is None:
            closed.append((key, version))
    assert closed == []
    assert tried >= 40


def test_an_unknown_tagged_field_in_a_nested_struct_changes_nothing(
    kafka_server: Any, store: mqcore.Store
) -> None:
    """Metadata v12 naming topic t, the topic's struct carrying an unknown field: the same
    answer as without it."""
    store.create_topic("t")
    found = api(3, 12)
    assert found is not None
    m = __import__(found.request.__module__, fromlist=["MetadataRequestTopic"])
    body = body_of(3, 12, topics=(m.MetadataRequestTopic(topic_id=None, name="t"),))
    # the topic struct: ... name "t" (compact: 0x02 't'), then its tagged fields (0x00)
    at = body.index(b"\x02t\x00") + 2
    tagged = body[:at] + UNKNOWN + body[at + 1 :]
    plain, with_field = (answer(kafka_server.address, frame(3, 12, b)) for b in (body, tagged))
    assert plain is not None and plain == with_field
