"""`mqcore serve` driven by the Go Kafka clients Debian 12 packages: sarama 1.22.1 (at its
default protocol version, Kafka 0.8.2, and at V2_2_0), segmentio/kafka-go 0.2.1,
confluent-kafka-go 0.11.6 (over Debian's librdkafka 2.0.2) and optiopay/kafka 2.1.1. Each
client is a small program of ours (tests/clients/*.go) built at test time against Debian's
library sources, offline
(GO111MODULE=off, GOPATH=/usr/share/gocode), that produces, consumes, or consumes in a group
and prints what it saw; the test compares that with the store: messages intact and in order,
each batch stored with the codec the client sent, a group's committed offsets and lag as
`Store.group_lag` has them. sarama's default version and optiopay speak Produce v0 (magic 0
message sets), kafka-go Produce and Fetch v2 (magic 1) and JoinGroup v1: the server turns
legacy message sets into v2 batches of the same codec. `make test-tools` installs golang-go
and the four -dev packages as root; a missing one skips its client's tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from clients.harness import N, check_produced, client, committed, fill, seen, stored

import mqcore

pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
pytestmark = pytest.mark.slow  # outside programs: a build, a daemon or an interpreter each

GOPATH = "/usr/share/gocode"
SOURCES = {  # program -> (the Debian package, the source it builds against)
    "sarama": ("golang-github-shopify-sarama-dev", "github.com/Shopify/sarama"),
    "kafkago": ("golang-github-segmentio-kafka-go-dev", "github.com/segmentio/kafka-go"),
    "confluent": (
        "golang-github-confluentinc-confluent-kafka-go-dev",
        "github.com/confluentinc/confluent-kafka-go",
    ),
    "optiopay": ("golang-github-optiopay-kafka-dev", "github.com/optiopay/kafka/v2"),
}
HERE = Path(__file__).resolve().parent / "clients"


def go_env(cache: Path) -> dict[str, str]:
    """Debian's way to build against its -dev packages: GOPATH mode over /usr/share/gocode,
    nothing fetched."""
    env = dict(os.environ, GO111MODULE="off", GOPATH=GOPATH, GOFLAGS="", GOPROXY="off")
    if "HOME" not in env and "GOCACHE" not in env:
        env["GOCACHE"] = str(cache / "go-build")
    return env


@pytest.fixture(scope="session")
def go_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """name -> a built program, built on first use (once a run)."""
    return {}


def program(go_programs: dict[str, str], tmp_path_factory: Any, name: str) -> str:
    """The client program `name` (tests/clients/NAME.go with common.go), built against
    Debian's sources; skips when Go or the client's package is missing."""
    package, source = SOURCES[name]
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed (apt-get install golang-go; `make test-tools` as root)")
    if not os.path.isdir(os.path.join(GOPATH, "src", source)):
        pytest.skip(f"{package} is not installed (apt-get install {package}; make test-tools)")
    if name not in go_programs:
        out = tmp_path_factory.mktemp("go")
        built = subprocess.run(
            [go, "build", "-o", str(out / name), str(HERE / f"{name}.go"), str(HERE / "common.go")],
            env=go_env(out), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-3000:]
        go_programs[name] = str(out / name)
    return go_programs[name]


@pytest.fixture
def sarama(go_programs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return [program(go_programs, tmp_path_factory, "sarama")]


@pytest.fixture
def kafkago(go_programs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return [program(go_programs, tmp_path_factory, "kafkago")]


@pytest.fixture
def optiopay(go_programs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return [program(go_programs, tmp_path_factory, "optiopay")]


@pytest.fixture
def confluent(go_programs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return [program(go_programs, tmp_path_factory, "confluent")]


# sarama: each Kafka version it can speak picks its request versions; "default" is the
# V0_8_2_0 a sarama.Config starts with. lz4 needs V0_10_0_0, zstd V2_1_0_0 (sarama's checks).
@pytest.mark.parametrize(
    ("version", "codec"),
    [
        *(("default", c) for c in ("none", "gzip", "snappy")),
        *(("2.2.0", c) for c in ("none", "gzip", "snappy", "lz4", "zstd")),
    ],
)
def test_sarama_produces(
    kafka_server: Any, store: mqcore.Store, sarama: list[str], version: str, codec: str
) -> None:
    """A SyncProducer's N messages land in order, in batches of the codec it used, at the
    offsets it was told."""
    store.create_topic("sp", partitions=2)
    acks = client(sarama, "produce", kafka_server, "sp", "-count", str(N), "-partition", "1",
                  "-version", version, "-codec", codec)  # fmt: skip
    assert [(a["partition"], a["offset"]) for a in acks] == [(1, i) for i in range(N)]
    check_produced(store, "sp", "sarama", codec)


@pytest.mark.parametrize("version", ["default", "2.2.0"])
def test_sarama_consumes(
    kafka_server: Any, store: mqcore.Store, sarama: list[str], version: str
) -> None:
    """A partition consumer per partition, from the oldest offset, sees every message once,
    intact, each partition in order (the store's batches gzip-compressed)."""
    fill(store, "sc", 2, compression="gzip")
    records = client(sarama, "consume", kafka_server, "sc", "-count", str(2 * N),
                     "-version", version)  # fmt: skip
    assert seen(records) == stored(store, "sc", 2)


@pytest.mark.parametrize("version", ["2.2.0"])
def test_sarama_consumer_group(
    kafka_server: Any, store: mqcore.Store, sarama: list[str], version: str
) -> None:
    """A ConsumerGroup member reads both partitions and commits what it marked on close: the
    group's committed offsets are the ends, lag 0. (sarama allows groups from V0_10_2_0 only,
    so its default version has none.)"""
    fill(store, "sg", 2)
    records = client(sarama, "group", kafka_server, "sg", "-count", str(2 * N), "-group",
                     "sarama-group", "-version", version)  # fmt: skip
    assert seen(records) == stored(store, "sg", 2)
    assert committed(store, "sarama-group") == {("sg", p): (N, 0) for p in range(2)}


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_kafka_go_writer_writes(
    kafka_server: Any, store: mqcore.Store, kafkago: list[str], codec: str
) -> None:
    """A Writer's N messages (Produce v2, magic 1 message sets) land in order, in batches of
    the codec it used."""
    store.create_topic("kw", partitions=2)
    assert client(kafkago, "write", kafka_server, "kw", "-count", str(N), "-partition", "1",
                  "-codec", codec) == [{"written": N}]  # fmt: skip
    check_produced(store, "kw", "kafka-go", codec)


def test_kafka_go_reader_reads(kafka_server: Any, store: mqcore.Store, kafkago: list[str]) -> None:
    """A Reader of partition 1 (Fetch v2) reads every message from the first, in order."""
    fill(store, "kr", 2, compression="snappy")
    records = client(kafkago, "read", kafka_server, "kr", "-count", str(N), "-partition", "1")
    assert seen(records) == stored(store, "kr", 2)[N:]


def test_kafka_go_group_reader_commits(
    kafka_server: Any, store: mqcore.Store, kafkago: list[str]
) -> None:
    """A Reader with a GroupID (JoinGroup v1, SyncGroup v0, OffsetCommit v2) reads both
    partitions, committing each message: the group's lag is 0."""
    fill(store, "kg", 2)
    records = client(kafkago, "group", kafka_server, "kg", "-count", str(2 * N), "-group",
                     "kafka-go-group")  # fmt: skip
    assert seen(records) == stored(store, "kg", 2)
    assert committed(store, "kafka-go-group") == {("kg", p): (N, 0) for p in range(2)}


@pytest.mark.parametrize(
    "codec",
    ["none", "gzip", "snappy", "lz4", "zstd"],
)
def test_confluent_kafka_go_produces(
    kafka_server: Any, store: mqcore.Store, confluent: list[str], codec: str
) -> None:
    """A Producer's N messages with a header each land in order, in batches of its codec, at
    the offsets its delivery reports gave."""
    store.create_topic("cp", partitions=2)
    acks = client(confluent, "produce", kafka_server, "cp", "-count", str(N), "-partition", "1",
                  "-codec", codec)  # fmt: skip
    assert sorted((a["partition"], a["offset"]) for a in acks) == [(1, i) for i in range(N)]
    check_produced(store, "cp", "confluent", codec)
    assert [m.header("i") for m in store.read("cp", 1, 0, 10 * N)] == [b"%d" % i for i in range(N)]


def test_confluent_kafka_go_consumes(
    kafka_server: Any, store: mqcore.Store, confluent: list[str]
) -> None:
    """assign() of partition 1 from offset 0 reads every message in order (lz4 batches)."""
    fill(store, "cc", 2, compression="lz4")
    records = client(confluent, "consume", kafka_server, "cc", "-count", str(N), "-partition",
                     "1")  # fmt: skip
    assert seen(records) == stored(store, "cc", 2)[N:]


def test_confluent_kafka_go_consumer_group(
    kafka_server: Any, store: mqcore.Store, confluent: list[str]
) -> None:
    """subscribe() as a group member, committing each message: both partitions read, the
    group's committed offsets are the ends, lag 0."""
    fill(store, "cg", 2, compression="zstd")
    records = client(confluent, "group", kafka_server, "cg", "-count", str(2 * N), "-group",
                     "confluent-group")  # fmt: skip
    assert seen(records) == stored(store, "cg", 2)
    assert committed(store, "confluent-group") == {("cg", p): (N, 0) for p in range(2)}


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy"])
def test_optiopay_produces(
    kafka_server: Any, store: mqcore.Store, optiopay: list[str], codec: str
) -> None:
    """One Produce call of N messages lands in order, in batches of its codec, at the offsets
    the library filled in."""
    store.create_topic("op", partitions=2)  # the library asks for metadata of every topic
    acks = client(optiopay, "produce", kafka_server, "op", "-count", str(N), "-partition", "1",
                  "-codec", codec)  # fmt: skip
    assert [(a["partition"], a["offset"]) for a in acks] == [(1, i) for i in range(N)]
    check_produced(store, "op", "optiopay", codec)


def test_optiopay_consumes(kafka_server: Any, store: mqcore.Store, optiopay: list[str]) -> None:
    """A consumer of partition 1 from the oldest offset reads every message in order.
    Uncompressed batches: optiopay 2.1.1 decompresses a v2 batch by reading to the end of the
    partition's records (proto/messages.go, readRecordBatch), so a fetch of several
    compressed batches fails in the client ("gzip: invalid header"), from Kafka too."""
    fill(store, "oc", 2)
    records = client(optiopay, "consume", kafka_server, "oc", "-count", str(N), "-partition", "1")
    assert seen(records) == stored(store, "oc", 2)[N:]
