"""A null (-1) where a request has a string, bytes or array, for every API and version served:
where Kafka's schema allows the null in that version, the server answers; where it does not,
the connection closes, as Kafka's broker closes it on a request its generated reader refuses
("non-nullable field ... was serialized as null"). Either way no handler fails on it (17
handlers raised TypeError on a null array, logged as an internal error) and the server goes
on serving.

Each request is the smallest one kio writes for the version (one element in each array, zeros
and empty strings elsewhere); the null is patched into its bytes at each field in turn
(fuzz/make_corpus.py's null_requests, which also seeds the server_request harness)."""

from __future__ import annotations

import logging
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
from make_corpus import null_requests  # noqa: E402

WAIT = 30.0


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
        for key, version, place, nullable, payload in null_requests():
            frame = struct.pack(">i", len(payload)) + payload
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
