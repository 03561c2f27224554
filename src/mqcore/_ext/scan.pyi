from .batch import Message

_Bytes = bytes | bytearray | memoryview

END_OF_DATA: int
NEED_MORE: int
CORRUPT: int

class IndexPolicy:
    def __init__(
        self,
        index_interval_bytes: int,
        bytes_since_entry: int = 0,
        max_timestamp: int = -1,
        offset_of_max_timestamp: int = -1,
        last_time_entry_ts: int = -1,
        last_index_offset: int = -1,
    ) -> None: ...
    def on_batch(self, position: int, size: int, last_offset: int, max_ts: int) -> int: ...
    def close_entry(self) -> tuple[int, int] | None: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def offset_of_max_timestamp(self) -> int: ...

class SegmentScanner:
    base_offset: int
    valid_bytes: int
    next_offset: int
    batches: int
    first_batch_max_timestamp: int
    last_batch_position: int
    stop: int
    error: str | None
    error_position: int
    offset_entries: bytearray
    time_entries: bytearray
    def __init__(
        self, base_offset: int, index_interval_bytes: int, verify_crc: bool = True
    ) -> None: ...
    def feed(self, chunk: _Bytes, chunk_position: int) -> int: ...
    def skip_to(self, position: int) -> None: ...
    def finish(self) -> None: ...
    def policy(self) -> IndexPolicy: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def offset_of_max_timestamp(self) -> int: ...

def find_batch(
    buf: _Bytes,
    pos: int,
    target_offset: int,
    min_timestamp: int = -1,
    verify_crc: bool = False,
    source: str | None = None,
    file_pos: int = 0,
) -> tuple[int, int, int]: ...
def read_record(
    buf: _Bytes,
    position: int,
    offset: int,
    topic: str,
    partition: int,
    verify_crc: bool = True,
    verified: dict[int, bytes] | None = None,
    source: str | None = None,
    max_decompressed: int = ...,
) -> Message | None: ...
def first_offset_at_or_after(
    buf: _Bytes,
    pos: int,
    timestamp: int,
    verify_crc: bool = True,
    source: str | None = None,
    max_decompressed: int = ...,
    verified: dict[int, bytes] | None = None,
    min_offset: int = ...,
) -> int: ...
