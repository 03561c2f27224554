from collections.abc import Callable, Mapping, Sequence

_Bytes = bytes | bytearray | memoryview
_Headers = Mapping[str, _Bytes | None] | Sequence[tuple[str, _Bytes | None]] | None

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
    def set_leader_epoch(self, leader_epoch: int) -> None: ...
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
