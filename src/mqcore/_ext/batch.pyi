from collections.abc import Callable, Mapping, Sequence

_Bytes = bytes | bytearray | memoryview
_Headers = Mapping[str, _Bytes | None] | Sequence[tuple[str, _Bytes | None]] | None

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

class EncodedBatch:
    size: int
    count: int
    base_timestamp: int
    max_timestamp: int
    min_timestamp: int
    last_offset_delta: int
    base_offset: int
    crc: int
    attributes: int
    def set_base_offset(self, base_offset: int) -> None: ...
    @property
    def last_offset(self) -> int: ...
    def write_to(self, fd: int) -> int: ...
    def tobytes(self) -> bytes: ...
    @property
    def piece_count(self) -> int: ...
    @property
    def uids(self) -> bytes | None: ...
    @property
    def key_hits(self) -> bytes: ...

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
def encode_batch(
    values: Sequence[_Bytes | None],
    keys: Sequence[_Bytes | None] | None = None,
    headers: Sequence[_Headers] | None = None,
    timestamps: Sequence[int] | None = None,
    now_ms: int = 0,
    codec: int = 0,
    log_append_time: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    leader_epoch: int = -1,
    gather_threshold: int = ...,
    compress: Callable[[int, bytes], bytes] | None = None,
    uid_ms: int = -1,
    index: bool = False,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int = -1,
    max_bytes: int = 0,
) -> EncodedBatch: ...
