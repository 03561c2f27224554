"""Fuzz the key index reader (_ext.keyindex KeyTable: open, chains_valid, probe, tag_entries,
first_unresolved) over `.keyindex` bytes, and batch_hits (what indexing reads from a log)."""

from __future__ import annotations

from array import array

import fuzzcommon
from fuzzcommon import EXPECTED, MAX_DECOMPRESSED

keyindex = fuzzcommon.keyindex

_STARTS = array("q", [0, 100, 4096])
_FIRST = array("q", [0, 10, 20])
_LAST = array("q", [9, 19, 1 << 20])


def test_one_input(data: bytes) -> None:
    try:
        keyindex.batch_hits(data, 0, MAX_DECOMPRESSED, "fuzz.log")
    except EXPECTED:
        pass
    try:
        table = keyindex.KeyTable(bytearray(data), False)
    except EXPECTED:
        return
    try:
        _ = (table.key_count, table.tag_count, table.complete, table.covered_position)
        valid = table.chains_valid()
        for slot in range(min(table.slot_count, 64)):
            for h in (slot, slot | (1 << 63)):
                try:
                    hits = table.probe(h, 1000)
                except EXPECTED:
                    assert not valid, "probe failed on a table whose chains are valid"
                    continue
                assert len(hits) <= 1000
                try:
                    entries, _next = table.tag_entries(h, 0, 1000)
                    assert len(entries) <= 1000
                except EXPECTED:
                    pass
        table.first_unresolved(_STARTS, _FIRST, _LAST)
        table.first_unresolved(array("q"), array("q"), array("q"))
    finally:
        table.release()


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
