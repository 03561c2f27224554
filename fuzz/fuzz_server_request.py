"""Fuzz what `mqcore serve` does with a request's bytes: the frame's size, the request header,
the body of every API and version served (kio's readers, which the server trusts to refuse what
does not parse, and server/producewire.py's for Produce), and then the handler that answers it.

The input is a request payload (seeds: real requests of each API and the smallest request of
each with a null in every place one can go, fuzz/make_corpus.py). It must parse or raise
ProtocolError, never anything else; a parsed request must name a served API and version; an
ApiVersions request of any version gets an answer that encodes. A parsed request then goes to
the Broker over a scratch store, as the server hands it (a request that would wait is polled
for its final answer at once): the handler answers with a response that encodes, or raises an
mqcore error or CloseConnection (what the server turns into a closed connection), never
anything else (17 handlers once raised TypeError on a null array).
"""

from __future__ import annotations

import datetime

import atheris
import fuzzcommon
from fuzzcommon import EXPECTED
from kio.schema.errors import ErrorCode

with atheris.instrument_imports(include=["mqcore", "kio"]):
    import mqcore
    from mqcore.server.broker import Broker
    from mqcore.server.common import CloseConnection, Session
    from mqcore.server.delayed import Delayed
    from mqcore.server.protocol import (
        API_VERSIONS,
        APIS,
        CONNECTION_APIS,
        api_keys,
        build,
        encode_response,
        parse_request,
        peek_header,
        read_frame_size,
        unsupported_versions_response,
    )
    from mqcore.server.server import response_frame

_STORE = mqcore.open(fuzzcommon.scratch_dir("mqcore-fuzz-server-"))
_STORE.create_topic("t", 2)
_STORE.append("t", b"v", partition=0)
_BROKER = Broker(_STORE, "127.0.0.1", 9092, execute=lambda fn: fn())


def handle(request: object) -> None:
    """The broker's answer to a parsed request, encoded, or an expected refusal."""
    try:
        body = _BROKER.begin(request.api, request.body, Session(("127.0.0.1", 1)))  # type: ignore[attr-defined]
        if isinstance(body, Delayed):  # what the purgatory gets at the request's deadline
            body = body.then(body.poll(True))
        frame = response_frame(request, body)  # type: ignore[arg-type]
    except (*EXPECTED, CloseConnection):
        return
    if frame is not None and not isinstance(frame, bytes):
        frame.close()  # a FetchFrame's file regions


def test_one_input(data: bytes) -> None:
    if len(data) >= 4:
        read_frame_size(data[:4])  # any 4 bytes are a size (the server checks its range)
    try:
        key, version, correlation = peek_header(data)
    except EXPECTED:
        return
    try:
        request = parse_request(bytearray(data))  # writable, as the server's receive buffer
    except EXPECTED:
        if key == API_VERSIONS:
            assert unsupported_versions_response(correlation)[8:10] == b"\x00\x23"
        return
    assert request.api.key == key and request.version == version  # api: maybe the lifted one
    lo, hi = APIS[key][1], APIS[key][2]
    assert lo <= version <= hi
    assert request.correlation_id == correlation
    if key == API_VERSIONS:
        body = build(
            request.api.response, error_code=ErrorCode.none, api_keys=api_keys(request.api),
            throttle_time=datetime.timedelta(0),
        )  # fmt: skip
        assert encode_response(request.api, correlation, body)[4:8] == data[4:8]
    elif key not in CONNECTION_APIS:
        handle(request)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
