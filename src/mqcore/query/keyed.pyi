from collections.abc import Sequence

from mqcore.query.engine import QueryResult
from mqcore.storage.partition import Partition

def find_indexed(
    parts: Sequence[Partition] | dict[int, Partition],
    key: bytes | str,
    kind: int,
    start: int | None,
    end: int | None,
    limit: int,
    cursor: str | None,
) -> QueryResult: ...
