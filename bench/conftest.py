"""Fixtures for the benchmarks: scratch directories and the session's lookup stores."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest
from benchdata import LookupData, build_lookup_data


def pytest_configure(config: pytest.Config) -> None:
    """kafka-python (the codec baseline) calls importlib's deprecated open_text at import."""
    config.addinivalue_line("filterwarnings", "ignore:open_text is deprecated:DeprecationWarning")


@pytest.fixture
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An empty directory on the same filesystem as every other side's files, removed after the
    test (so the dirty pages of one benchmark do not weigh on the next)."""
    path = tempfile.mkdtemp(prefix="bench-", dir=tmp_path_factory.getbasetemp())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def lookup_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, LookupData]]:
    """Lookup stores keyed by append batch size (100 and 1000), built once per session."""
    built: dict[int, LookupData] = {}
    dirs = []
    try:
        for batch in (100, 1000):
            directory = str(tmp_path_factory.mktemp(f"lookup-{batch}"))
            dirs.append(directory)
            built[batch] = build_lookup_data(directory, batch)
        yield built
    finally:
        for data in built.values():
            data.store.close()
            data.sqlite.close()
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
