from collections.abc import Sequence

from .encode import EncodedBatch as EncodedBatch
from .encode import encode_batch as encode_batch

_Bytes = bytes | bytearray | memoryview

TIMESTAMP_CREATE_TIME: int
TIMESTAMP_LOG_APPEND_TIME: int

class Message:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int  # share groups: deliveries of this record so far, this one included
    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp: int,
        timestamp_type: int = 0,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> None: ...
    def header(self, name: str, default: bytes | None = None) -> bytes | None: ...
    @property
    def msg_id(self) -> str: ...
    @property
    def unique_id(self) -> str | None: ...
    @property
    def tag(self) -> str | None: ...
    @property
    def properties(self) -> dict[str, str]: ...

class BatchInfo:
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    @property
    def last_offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def codec(self) -> int: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def timestamp_type(self) -> int: ...

def read_batch_info(
    buf: _Bytes, pos: int = 0, verify_crc: bool = True, source: str | None = None, file_pos: int = 0
) -> BatchInfo | None: ...
def peek_batch_header(buf: _Bytes, pos: int = 0) -> BatchInfo | None: ...
def decode_messages(
    buf: _Bytes,
    pos: int,
    topic: str,
    partition: int,
    min_offset: int,
    max_records: int,
    out: list[Message],
    verify_crc: bool = True,
    max_decompressed: int = ...,
    source: str | None = None,
    file_pos: int = 0,
    max_offset: int = ...,
    include_control: bool = False,
) -> tuple[int, int]: ...
