from typing import Any

from .batch import Message

DEFAULT_MAX_DECOMPRESSED: int
KEY_KIND: int
UID_KIND: int

def get_record(
    part: Any, offset: int, verify_crc: bool = True, max_decompressed: int = ...
) -> Message | None: ...
def decode_store_id(text: object) -> tuple[str, int, int] | None: ...
def get_by_id(
    partitions: dict[str, dict[int, Any]],
    msg_id: object,
    decode: Any,
    max_decompressed: int = ...,
) -> Message | None: ...
def find_hashed(
    part: Any,
    raw: bytes,
    kind: int,
    lo: int,
    hi: int,
    from_offset: int,
    max_probe: int,
    max_decompressed: int = ...,
) -> tuple[list[Message], int]: ...
def find_indexed(
    parts: Any,
    key: bytes | str,
    kind: int,
    start: int | None,
    end: int | None,
    limit: int,
    cursor: str | None,
) -> Any: ...
