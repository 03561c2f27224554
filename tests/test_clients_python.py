"""`mqcore serve` driven by Debian 12's own Python Kafka clients, which are older than the
ones the rest of the suite installs from PyPI: kafka-python 2.0.2 (python3-kafka) and
confluent-kafka 1.7.0 over librdkafka 2.0.2 (python3-confluent-kafka). Debian's interpreter
runs tests/clients/pyclients.py in isolated mode (`/usr/bin/python3 -I`), so Debian's packages
are the ones imported; the checks are those of tests/test_clients_go.py: messages intact and
in order, batches of the codec sent, a group's commits as `Store.group_lag` has them.
`make test-tools` installs both packages as root; a missing one skips its tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from clients.harness import N, check_produced, client, committed, fill, seen, stored

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytestmark = pytest.mark.slow  # outside programs: a build, a daemon or an interpreter each

DEBIAN_PYTHON = "/usr/bin/python3"
SCRIPT = str(Path(__file__).resolve().parent / "clients" / "pyclients.py")
PACKAGES = {"kafka-python": ("python3-kafka", "kafka"),
            "confluent": ("python3-confluent-kafka", "confluent_kafka")}  # fmt: skip
OLD_LIBRDKAFKA_CODECS = (
    "ApiVersions lists Produce 3-11: librdkafka 2.0.2 compresses gzip/lz4 only when the "
    "broker lists Produce v0 (KAFKA-18659), so the batches arrive uncompressed"
)


def debian_client(library: str) -> list[str]:
    """The argv that runs pyclients.py for `library` under Debian's Python; skips when the
    package is not installed there."""
    package, module = PACKAGES[library]
    found = os.access(DEBIAN_PYTHON, os.X_OK) and subprocess.run(
        [DEBIAN_PYTHON, "-I", "-c", f"import {module}"], capture_output=True, check=False
    ).returncode == 0  # fmt: skip
    if not found:
        pytest.skip(f"{package} is not installed (apt-get install {package}; make test-tools)")
    return [DEBIAN_PYTHON, "-I", SCRIPT, library]


# kafka-python compresses in Python: Debian's package brings gzip; snappy, lz4 and zstd need
# modules it only recommends
@pytest.mark.parametrize(
    ("library", "codec"),
    [
        ("kafka-python", "none"),
        ("kafka-python", "gzip"),
        ("confluent", "none"),
        ("confluent", "gzip"),
        ("confluent", "lz4"),
        ("confluent", "zstd"),
    ],
)
def test_debian_python_client_produces(
    kafka_server: Any, store: mqcore.Store, library: str, codec: str
) -> None:
    """N messages with a header each land in order, in batches of the codec the producer
    used, at the offsets it was told."""
    program = debian_client(library)
    store.create_topic("pp", partitions=2)
    acks = client(program, "produce", kafka_server, "pp", "-count", str(N), "-partition", "1",
                  "-codec", codec)  # fmt: skip
    assert sorted((a["partition"], a["offset"]) for a in acks) == [(1, i) for i in range(N)]
    check_produced(store, "pp", library, codec)
    assert [m.header("i") for m in store.read("pp", 1, 0, 10 * N)] == [b"%d" % i for i in range(N)]


@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_debian_python_client_consumes(
    kafka_server: Any, store: mqcore.Store, library: str
) -> None:
    """assign() of partition 1 from the start reads every message in order (gzip batches)."""
    program = debian_client(library)
    fill(store, "pc", 2, compression="gzip")
    records = client(program, "consume", kafka_server, "pc", "-count", str(N), "-partition", "1")
    assert seen(records) == stored(store, "pc", 2)[N:]


@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_debian_python_client_consumer_group(
    kafka_server: Any, store: mqcore.Store, library: str
) -> None:
    """subscribe() as a group member, committing what it read: both partitions read, the
    group's committed offsets are the ends, lag 0."""
    program = debian_client(library)
    fill(store, "pg", 2)
    group = f"debian-{library}"
    records = client(program, "group", kafka_server, "pg", "-count", str(2 * N), "-group", group)
    assert seen(records) == stored(store, "pg", 2)
    assert committed(store, group) == {("pg", p): (N, 0) for p in range(2)}
