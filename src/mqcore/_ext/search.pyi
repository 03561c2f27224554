from .arrowcols import ArrowColumns
from .batch import Message

_Bytes = bytes | bytearray | memoryview

class ScanResult:
    messages: list[Message]
    next_position: int
    next_offset: int
    records_scanned: int
    bytes_scanned: int
    reason: str
    properties_seen: int
    selector_runs: int

class SelectorProgram:
    vals_size: int
    scratch_size: int
    def __init__(
        self,
        ops: list[tuple[int, int, bool, int, int, int, float, bytes | None]],
        names: list[bytes | None],
        stack_depth: int,
        tags_slot: int = -1,
        tag_slot: int = -1,
    ) -> None: ...
    def evaluate(self, headers: bytes, count: int) -> bool | None: ...

SELECTOR_CODES: dict[str, int]

def scan_records(
    buf: _Bytes,
    pos: int,
    topic: str,
    partition: int,
    min_offset: int,
    max_offset: int,
    min_ts: int,
    max_ts: int,
    needle: bytes | None = None,
    in_key: bool = False,
    tag: bytes | None = None,
    limit: int = 1000,
    max_records: int = ...,
    verify_crc: bool = True,
    max_decompressed: int = ...,
    source: str | None = None,
    file_pos: int = 0,
    selector: SelectorProgram | None = None,
    count_partial: bool = True,
    into: ArrowColumns | None = None,
    max_bytes: int = ...,
) -> ScanResult: ...
def implementation() -> str: ...
def select_implementation(fast: bool) -> str: ...
