"""The active segment's key index grows with its data (issue 17): what that costs against a
table made at full size up front (the layout before, kept here as the baseline by setting the
initial size to the capacity).

- fill: one segment filled with 400,000 records of unique keys (800,000 key entries with their
  unique IDs): every growth step of the table happens inside the timed round.
- create: a 16-partition topic made in a fresh store (one .keyindex per partition).
"""

from __future__ import annotations

import os
import shutil

import pytest
from benchdata import prime_page_cache
from pytest_benchmark.fixture import BenchmarkFixture

import mqcore
from mqcore.storage import keyindex

RECORDS = 400_000
BATCH = 1000
VALUE = b"v" * 100
KEYS = [[b"key-%d" % (i + j) for j in range(BATCH)] for i in range(0, RECORDS, BATCH)]
LAYOUTS = {"growing": keyindex.INITIAL_ENTRIES, "full-size": 1 << 20}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_keyindex_fill_segment(
    benchmark: BenchmarkFixture, scratch: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyindex, "INITIAL_ENTRIES", LAYOUTS[layout])
    benchmark.group = "keyindex-fill-400k-unique-keys"
    prime_page_cache(scratch, 64 << 20)
    values = [VALUE] * BATCH
    runs = [0]

    def fresh() -> tuple[tuple[mqcore.Store], dict[str, object]]:
        path = os.path.join(scratch, f"s{runs[0]}")
        runs[0] += 1
        store = mqcore.open(path, flush="os")
        store.create_topic("t", partitions=1)
        return (store,), {}

    def fill(store: mqcore.Store) -> None:
        for keys in KEYS:
            store.append_batch("t", values, keys=keys, partition=0)
        assert store.end_offset("t", 0) == RECORDS
        store.close()
        shutil.rmtree(store.path)

    benchmark.pedantic(fill, setup=fresh, rounds=5, warmup_rounds=1, iterations=1)
    benchmark.extra_info["records"] = RECORDS


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_keyindex_create_topic(
    benchmark: BenchmarkFixture, scratch: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyindex, "INITIAL_ENTRIES", LAYOUTS[layout])
    benchmark.group = "keyindex-create-16-partitions"
    runs = [0]

    def fresh() -> tuple[tuple[mqcore.Store], dict[str, object]]:
        path = os.path.join(scratch, f"c{runs[0]}")
        runs[0] += 1
        return (mqcore.open(path, flush="os"),), {}

    def create(store: mqcore.Store) -> None:
        store.create_topic("t", partitions=16)
        store.close()
        disk = sum(
            os.stat(os.path.join(r, n)).st_blocks * 512
            for r, _, names in os.walk(store.path)
            for n in names
        )
        benchmark.extra_info["disk_bytes"] = disk
        shutil.rmtree(store.path)

    benchmark.pedantic(create, setup=fresh, rounds=20, warmup_rounds=2, iterations=1)
