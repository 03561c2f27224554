from typing import Any

from .batch import Message
from .segtable import SegmentTable

DEFAULT_MAX_DECOMPRESSED: int
KEY_KIND: int
UID_KIND: int

def get_record(
    table: SegmentTable[Any], offset: int, verify_crc: bool = True, max_decompressed: int = ...
) -> Message | None: ...
def offset_for_time(
    table: SegmentTable[Any],
    timestamp: int,
    verify_crc: bool = True,
    max_decompressed: int = ...,
) -> int | None: ...
def get_by_id(
    partitions: dict[str, dict[int, Any]],
    msg_id: object,
    decode: Any,
    max_decompressed: int = ...,
) -> Message | None: ...
def find_hashed(
    table: SegmentTable[Any],
    raw: bytes,
    kind: int,
    lo: int,
    hi: int,
    from_offset: int,
    max_probe: int,
    max_decompressed: int = ...,
) -> tuple[list[Message], int]: ...
def find_keyed(
    parts: list[Any] | dict[int, Any],
    raw: bytes,
    kind: int,
    lo: int,
    hi: int,
    limit: int,
    resume_partition: int,
    resume_offset: int,
    max_probe: int,
    max_decompressed: int = ...,
) -> tuple[list[Message], int, int, int]: ...
