"""The hand-written Fetch responses (server/fetchwire.py) against kio's encoding of the same
response, at every version served, with record sets as bytes and as file regions."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
from kafkaclients import kio_response_frame  # noqa: E402
from kio.index import load_payload_module  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402
from kio.static.constants import EntityType  # noqa: E402

from mqcore.log import FileRegion  # noqa: E402
from mqcore.server.fetchwire import (  # noqa: E402
    FetchedPartition,
    FetchedTopic,
    encode_fetch,
)
from mqcore.server.protocol import APIS, kio_floor  # noqa: E402

VERSIONS = range(kio_floor(1), APIS[1][2] + 1)  # v0-v3: tests/test_server_legacy.py


def kio_frame(version: int, correlation: int, topics: list[FetchedTopic]) -> bytes:
    """The same response built and written by kio."""
    m = load_payload_module(1, version, EntityType.response)
    part_fields = {f for f in m.PartitionData.__dataclass_fields__}
    responses = []
    for t in topics:
        parts = []
        for p in t.partitions:
            records = p.records.read() if isinstance(p.records, FileRegion) else p.records
            values = dict(partition_index=p.index, error_code=ErrorCode(p.error_code),
                          high_watermark=p.high_watermark,
                          last_stable_offset=p.last_stable_offset,
                          log_start_offset=p.log_start_offset,
                          aborted_transactions=None if p.aborted is None else tuple(
                              m.AbortedTransaction(producer_id=pid, first_offset=first)
                              for pid, first in p.aborted),
                          preferred_read_replica=-1, records=records)  # fmt: skip
            parts.append(m.PartitionData(**{k: v for k, v in values.items() if k in part_fields}))
        responses.append(m.FetchableTopicResponse(topic=t.name, partitions=tuple(parts)))
    body = dict(throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
                responses=tuple(responses))  # fmt: skip
    return kio_response_frame(m.FetchResponse, correlation, body)


def ours(version: int, correlation: int, topics: list[FetchedTopic]) -> bytes:
    frame = encode_fetch(version, correlation, topics)
    data = b"".join(p.read() if isinstance(p, FileRegion) else p for p in frame.pieces)
    assert len(data) == frame.size
    return data


partitions = st.builds(
    FetchedPartition,
    index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([0, 1, 3, 56]),
    high_watermark=st.integers(-1, 2**62),
    last_stable_offset=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**62),
    records=st.binary(max_size=300),
    aborted=st.none()
    | st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=3),
)
topics = st.lists(
    st.builds(
        FetchedTopic,
        name=st.text("abc._-XYZ0123", min_size=1, max_size=200),
        partitions=st.lists(partitions, max_size=4),
    ),  # fmt: skip
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(version=st.sampled_from(list(VERSIONS)), correlation=st.integers(-(2**31), 2**31 - 1),
       topics=topics)  # fmt: skip
def test_fetch_frames_equal_kios(version: int, correlation: int, topics: Any) -> None:
    assert ours(version, correlation, topics) == kio_frame(version, correlation, topics)


@pytest.mark.parametrize("version", list(VERSIONS))
def test_file_regions_are_framed_like_bytes(tmp_path: Any, version: int) -> None:
    path = tmp_path / "seg.log"
    path.write_bytes(os.urandom(5000))
    region = FileRegion(os.open(path, os.O_RDONLY), str(path), 1000, 3000)
    try:
        topic = [FetchedTopic("t", [FetchedPartition(0, 0, 10, 10, 0, region),
                                    FetchedPartition(1, 0, 5, 5, 0, b"tail")])]  # fmt: skip
        assert ours(version, 7, topic) == kio_frame(version, 7, topic)
    finally:
        region.close()
