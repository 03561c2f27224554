"""Helpers the `mqcore serve` tests share: reading a raw socket, a client speaking any served
request encoded by kio, and consuming with confluent-kafka (librdkafka) by assign(), without a
group."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WAIT = 30.0


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock`; ConnectionError when it closes first."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def closed_by_peer(sock: socket.socket, timeout: float = WAIT) -> bool:
    """Whether the server closes the connection within `timeout` (a clean close or a reset),
    reading and dropping whatever it sends first."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


class KioWire:
    """Requests framed and encoded with kio's writers (Kafka's schemas) over one connection,
    answers decoded with its readers: a client for any request no PyPI client sends as the
    test needs it."""

    def __init__(self, address: tuple[str, int], client_id: str = "wire"):
        self.sock = socket.create_connection(address, timeout=WAIT)
        self.client_id = client_id
        self.correlation = 0

    def call(self, key: int, version: int, /, **values: Any) -> Any:
        """Send request (key, version) with `values`; the response body."""
        import io
        import struct

        from kio.serial import entity_reader, entity_writer

        from mqcore.server.protocol import api, build

        found = api(key, version)
        assert found is not None, f"API {key} v{version} is not served"
        head = found.request.__header_schema__
        self.correlation += 1
        out = io.BytesIO()
        entity_writer(head)(out, build(head, request_api_key=key, request_api_version=version,
                                       correlation_id=self.correlation,
                                       client_id=self.client_id))  # fmt: skip
        entity_writer(found.request)(out, build(found.request, **values))
        self.sock.sendall(struct.pack(">i", out.tell()) + out.getvalue())
        (size,) = struct.unpack(">i", recv_exactly(self.sock, 4))
        payload = recv_exactly(self.sock, size)
        header, used = entity_reader(found.response_header)(payload, 0)
        assert header.correlation_id == self.correlation
        return entity_reader(found.response)(payload, used)[0]

    def close(self) -> None:
        self.sock.close()


def kafka_python_call(address: tuple[str, int], request: Any) -> Any:
    """One request of kafka-python's protocol classes (kafka.protocol.old, every version down
    to v0), encoded and its response decoded by kafka-python: not by kio, not by us."""
    import importlib
    import struct

    from kafka.protocol.old.api import RequestHeader, RequestHeaderV2

    # a flexible version ends its structs in tagged fields; kafka-python's classes do not all
    # say FLEXIBLE_VERSION, so the schema tells
    flexible = request.FLEXIBLE_VERSION or "tags" in request.SCHEMA.names
    fields = {"api_key": request.API_KEY, "api_version": request.API_VERSION,
              "correlation_id": 7, "client_id": "old"}  # fmt: skip
    header = RequestHeaderV2(**fields, tags={}) if flexible else RequestHeader(**fields)
    payload = header.encode() + request.encode()
    with socket.create_connection(address, timeout=WAIT) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        body = recv_exactly(sock, size)
    assert struct.unpack_from(">i", body)[0] == 7
    module = importlib.import_module(type(request).__module__)
    response = getattr(module, type(request).__name__.replace("Request_", "Response_"))
    if flexible:  # a flexible response header carries tagged fields (none here)
        assert body[4] == 0, "no tagged fields expected in the response header"
        return response.decode(body[5:])
    return response.decode(body[4:])


def kio_response_frame(response: type, correlation: int, values: dict[str, Any]) -> bytes:
    """A whole response frame written by kio: `response` (a kio response entity) built from
    those of `values` it has (versions differ in their fields), with its header."""
    import io

    from kio.serial import entity_writer

    fields = set(response.__dataclass_fields__)  # type: ignore[attr-defined]
    header = response.__header_schema__  # type: ignore[attr-defined]
    out = io.BytesIO()
    entity_writer(header)(out, header(correlation_id=correlation))
    entity_writer(response)(out, response(**{k: v for k, v in values.items() if k in fields}))
    payload = out.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def consume_confluent(config: dict[str, Any], topic: str, partitions: int, n: int) -> list[Any]:
    """The first `n` messages of partitions 0..partitions-1 of `topic` from offset 0, read by a
    confluent-kafka consumer with `config` (bootstrap and security settings) and assign()."""
    import confluent_kafka as ck

    c = ck.Consumer({**config, "group.id": "t", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        c.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        deadline = time.monotonic() + WAIT
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m)
        return got
    finally:
        c.close()


@contextmanager
def sasl_acl_server(store: Any, directory: Path, acl: str) -> Iterator[Any]:
    """`mqcore serve` over `store` with SASL users alice (password alice-secret-Pa55) and
    reader (reader-secret-9x) and the ACL file `acl`, written under `directory`."""
    from mqcore.server import Server
    from mqcore.server.auth import add_user

    users = directory / "users.jsonl"
    add_user(users, "alice", "alice-secret-Pa55")
    add_user(users, "reader", "reader-secret-9x")
    acl_file = directory / "acl.txt"
    acl_file.write_text(acl)
    with Server(store, "127.0.0.1:0", sasl_credentials=str(users), acl=str(acl_file)) as srv:
        yield srv
