from mmap import mmap

_Bytes = bytes | bytearray | memoryview | mmap

def check_whole_batch(
    buf: _Bytes, pos: int, max_decompressed: int, source: str | None = None
) -> tuple[int, int, int, int, bool]: ...
def stamp_batch(
    buf: bytearray | memoryview,
    pos: int,
    base_offset: int,
    leader_epoch: int,
    attributes: int = -1,
    max_timestamp: int = ...,
) -> None: ...
