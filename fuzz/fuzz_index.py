"""Fuzz the `.index` / `.timeindex` readers: OffsetIndex and TimeIndex load + floor + last over
a file holding the input, and the _ext.index kernels directly on the same bytes."""

from __future__ import annotations

import os

import fuzzcommon
from fuzzcommon import EXPECTED

index = fuzzcommon.index
storage_index = fuzzcommon.mqcore.storage.index

_DIR = fuzzcommon.scratch_dir("mqcore-fuzz-index-")
_PATH = os.path.join(_DIR, "00000000000000000000.index")

# probe values: below, inside and above anything a real index holds
_PROBES = (-1, 0, 1, 7, 1 << 20, (1 << 31) - 1, 1 << 40, (1 << 63) - 1)


def kernels(data: bytes) -> None:
    for size, floor, entry in (
        (8, index.offset_floor, index.offset_entry),
        (12, index.time_floor, index.time_entry),
    ):
        entries = len(data) // size
        for probe in _PROBES:
            if entries:
                floor(data, entries, probe)
        if entries:
            entry(data, entries - 1)
        for bad in (entries + 1, -1):
            try:
                floor(data, bad, 0)
            except ValueError:
                pass
            else:
                raise AssertionError(f"{bad} entries of a {len(data)}-byte buffer accepted")
        try:
            entry(data, entries)
        except IndexError:
            pass
        else:
            raise AssertionError("entry past the end accepted")
    for max_rel in (0, 1 << 20, (1 << 31) - 1):
        n = index.count_offset_entries(data, max_rel, 1 << 30)
        assert 0 <= n <= len(data) // 8
        n = index.count_time_entries(data, max_rel)
        assert 0 <= n <= len(data) // 12


def files(data: bytes) -> None:
    with open(_PATH, "wb") as f:
        f.write(data)
    for cls in (storage_index.OffsetIndex, storage_index.TimeIndex):
        idx = cls(_PATH, 10 << 20, False)
        try:
            if cls is storage_index.OffsetIndex:
                idx.load(1 << 20, 1 << 30)
            else:
                idx.load(1 << 20)
            for probe in _PROBES:
                idx.floor(probe)
            idx.last()
        except EXPECTED:
            pass
        finally:
            idx.close(trim=False)


def test_one_input(data: bytes) -> None:
    kernels(data)
    files(data)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
