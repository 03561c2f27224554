"""Fuzz what `mqcore serve` reads from a socket before any handler runs: the frame's size, the
request header, and the body of every API and version served (kio's readers, which the server
trusts to refuse what does not parse, and server/producewire.py's for Produce).

The input is a request payload (seeds: real requests of each API, fuzz/make_corpus.py). It must
parse or raise ProtocolError, never anything else; a parsed request must name a served API and
version; an ApiVersions request of any version gets an answer that encodes.
"""

from __future__ import annotations

import datetime

import atheris
import fuzzcommon
from fuzzcommon import EXPECTED
from kio.schema.errors import ErrorCode

with atheris.instrument_imports(include=["mqcore", "kio"]):
    from mqcore.server.protocol import (
        API_VERSIONS,
        APIS,
        api_keys,
        build,
        encode_response,
        parse_request,
        peek_header,
        read_frame_size,
        unsupported_versions_response,
    )


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
    assert request.api.key == key and request.api.version == version
    lo, hi = APIS[key][1], APIS[key][2]
    assert lo <= version <= hi
    assert request.correlation_id == correlation
    if key == API_VERSIONS:
        body = build(
            request.api.response, error_code=ErrorCode.none, api_keys=api_keys(request.api),
            throttle_time=datetime.timedelta(0),
        )  # fmt: skip
        assert encode_response(request.api, correlation, body)[4:8] == data[4:8]


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
