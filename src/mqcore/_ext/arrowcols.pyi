from typing import Any

_Bytes = bytes | bytearray | memoryview

class OwnedBuffer:
    def __len__(self) -> int: ...

class ArrowColumns:
    num_rows: int
    num_headers: int
    include_headers: bool
    def __init__(self, include_headers: bool = False, max_decompressed: int = ...) -> None: ...
    @property
    def data_bytes(self) -> int: ...
    def add(
        self,
        buf: _Bytes,
        pos: int,
        min_offset: int,
        max_offset: int = ...,
        max_rows: int = ...,
        max_bytes: int = ...,
        verify_crc: bool = True,
        source: str | None = None,
        file_pos: int = 0,
    ) -> tuple[int, int, bool, bool]: ...
    def finish(self) -> dict[str, Any]: ...

def repeated_string(text: bytes, n: int) -> tuple[OwnedBuffer, OwnedBuffer]: ...
def repeated_int32(value: int, n: int) -> OwnedBuffer: ...
