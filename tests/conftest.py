"""Shared fixtures: a fresh store directory per test, a guard against swallowed errors, and the
one SparkSession of a test run with the store the Spark tests read."""

from __future__ import annotations

import os
import random
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cliserver import run_module_cli
from clusterinproc import make_cluster  # noqa: F401  (a fixture: three brokers of this process)
from hypothesis import settings
from zkserver import ZooKeeper

import mqcore

# No per-example deadline in any property test: a loaded 2-core CI machine stalls an example
# past Hypothesis's default 200 ms now and then, and that DeadlineExceeded says nothing about
# the code (the examples take 0-6 ms). Tests that need a bound on time say so themselves.
settings.register_profile("mqcore", deadline=None)
settings.load_profile("mqcore")


def _import_root() -> str | None:
    """The directory a child process needs on PYTHONPATH to import the mqcore these tests
    imported: the source tree's src/ (PYTHONPATH=src or an editable install), or None for an
    installed copy, which the child finds in site-packages as the tests did."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(mqcore.__file__)))
    installed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    installed.update(site.getsitepackages())
    return None if any(os.path.realpath(root) == os.path.realpath(d) for d in installed) else root


IMPORT_ROOT = _import_root()


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    """A path for a new store (the directory does not exist yet)."""
    return str(tmp_path / "store")


@pytest.fixture
def fast_tmp() -> Iterator[Path]:
    """A fresh directory on tmpfs when there is one (else in the temp directory), for tests
    whose subject is not the disk: the trim cycles and recovery's reopens fdatasync several
    times each, which a shared disk turns into minutes; the 20,000-segment store is 80,000
    small files. What they measure (sizes, descriptors, bytes cut) is the same."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix="mqcore-test-", dir=base)
    try:
        yield Path(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fast_path(fast_tmp: Path) -> str:
    """A path for a new store (the directory does not exist yet) in fast_tmp."""
    return str(fast_tmp / "store")


@pytest.fixture
def store(store_path: str) -> Iterator[mqcore.Store]:
    """An open store with flush="os" (fast); closed after the test."""
    s = mqcore.open(store_path, flush="os")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def kafka_server(store: mqcore.Store) -> Iterator[Any]:
    """`mqcore serve` over the test's store on a free loopback port: `.bootstrap` is what a
    client's bootstrap.servers takes. Skips where the server's extra is missing (kio needs
    Python 3.11+)."""
    server = pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
    # a short initial rebalance delay: groups of members started together still form in one
    # generation (Kafka's 3 s default would only slow the tests)
    with server.Server(store, listen="127.0.0.1:0", group_initial_rebalance_delay=0.3) as srv:
        yield srv


@pytest.fixture(autouse=True)
def no_unraisable_errors(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Fail a test whose run printed 'Exception ignored' (an error swallowed in __del__, a
    callback or a thread): fastavro's habit, since such errors hide real bugs."""
    yield
    _out, err = capfd.readouterr()
    sys.stderr.write(err)
    assert "Exception ignored" not in err, err


def _zookeeper_sessions() -> set[threading.Thread]:
    """The live threads of kazoo clients: each session's connection loop and its handler's
    workers (kazoo names them after their targets)."""
    targets = ("(zk_loop)", "(_thread_worker)")
    return {t for t in threading.enumerate() if t.is_alive() and t.name.endswith(targets)}


@pytest.fixture(autouse=True, scope="module")
def no_leaked_zookeeper_sessions() -> Iterator[None]:
    """A module ends with every ZooKeeper client it started stopped. A leaked one keeps
    reconnecting to a ZooKeeper that is gone, drawing from the global `random` for its
    back-off, and Hypothesis fails whichever later property test is drawing at that moment
    ("Do not use the random module inside strategies"): the CI failure of two selector
    property tests, from a cluster test's helper that raced to open its session twice."""
    before = _zookeeper_sessions()
    yield
    deadline = time.monotonic() + 10.0
    leaked = _zookeeper_sessions() - before
    for t in leaked:
        t.join(max(0.0, deadline - time.monotonic()))
    leaked = {t for t in leaked if t.is_alive()}
    assert not leaked, f"ZooKeeper client threads still running: {sorted(t.name for t in leaked)}"


def file_bytes(path: str) -> dict[str, bytes]:
    """Every file under `path` with its content: proves that an error or a reader wrote nothing."""
    files = {}
    for root, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                files[os.path.relpath(full, path)] = f.read()
    return files


def shown_time(ms: int) -> str:
    """How the CLI's text output shows a timestamp, computed independently of mqcore:
    `2024-06-10T10:00:00.123Z (1718013600123)` (UTC, milliseconds, then the epoch ms)."""
    when = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{when.microsecond // 1000:03d}Z ({ms})"


def child_env() -> dict[str, str]:
    """Environment for subprocesses that import mqcore (writer processes killed by tests)."""
    env = dict(os.environ)
    if IMPORT_ROOT is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [IMPORT_ROOT, env.get("PYTHONPATH")]))
    return env


def interruptible(argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start `argv` (with child_env()) so that a SIGINT reaches it as Ctrl-C does. A suite
    started in the background by a non-interactive shell (`cmd &`, nohup) has SIGINT ignored,
    and an ignored signal stays ignored across fork and exec, so a child would never see the
    test's SIGINT; for the child's start the handler is Python's own, which exec resets to the
    default."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(argv, env=child_env(), **popen)
    finally:
        signal.signal(signal.SIGINT, old)


def plain_partition(store: mqcore.Store, key: bytes, partitions: int) -> int:
    """Where a plain keyed append lands in a topic of `partitions` partitions: what a message
    held back (delayed, or half of a transaction) must be routed to as well."""
    twin = f"plain-{partitions}"
    if twin not in store.topics():
        store.create_topic(twin, partitions=partitions)
    return store.append(twin, b"", key=key).partition


def run_cli(*argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run the `mqcore` command as a process (`python -m mqcore.cli`, forked from an
    interpreter that imported it: tests/cliserver.py): (exit status, stdout, stderr). No run
    may end in a traceback: every failure is a one-line error or a usage message."""
    status, stdout, stderr = run_module_cli(
        list(argv), stdin if stdin is not None else b"", child_env(), timeout=120
    )
    out, err = stdout.decode(), stderr.decode()
    assert "Traceback" not in err, err
    return status, out, err


@pytest.fixture
def zk(tmp_path: Path) -> Iterator[ZooKeeper]:
    """A ZooKeeper of the test's own (tests/zkserver.py), stopped after it; skips where
    Debian's zookeeper is not installed."""
    server = ZooKeeper(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one local[2] SparkSession of the test run (starting one takes seconds); Python
    workers run this interpreter with this source tree. Skipped without PySpark or Java."""
    pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+: no java on PATH and no JAVA_HOME")
    if os.environ.get("MQCORE_TEST_NO_SPARK"):
        pytest.skip("MQCORE_TEST_NO_SPARK is set (make asan: Spark's JVM hangs under the preload)")
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYTHONPATH")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = child_env()["PYTHONPATH"]
    session = (
        SparkSession.builder.master("local[2]")
        .appName("mqcore-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def session(spark: Any) -> Any:
    """The shared session with the mqcore source registered as Spark's setting says (pushdown
    off unless a test sets it): what every Spark test reads through."""
    import mqcore.spark

    mqcore.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def spark_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store of make_spark_store, built once per run; tests only read it."""
    path = str(tmp_path_factory.mktemp("spark") / "store")
    make_spark_store(path)
    return path


SPARK_CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
SPARK_BASE_TS = 1_700_000_000_000


def make_spark_store(path: str) -> None:
    """The store the Spark tests read: topic "events" (3 partitions of several small segments,
    batches in every codec, null and empty keys and values, tombstones, headers with null
    values, timestamps that go backwards), "audit" (LogAppendTime) and "other" (1 record)."""
    rng = random.Random(5)
    with mqcore.open(path, flush="os") as st:
        st.create_topic("events", partitions=3, segment_bytes=1000, key_index_entries=512)
        st.create_topic("audit", partitions=1, timestamp_type="LogAppendTime")
        st.create_topic("other", partitions=1)
        for p in range(3):
            seq = 0
            for i in range(12 + 4 * p):
                n = rng.randrange(1, 12)
                st.append_batch(
                    "events",
                    [rng.choice([None, b"", b"v%d" % rng.randrange(999), rng.randbytes(40)])
                     for _ in range(n)],
                    keys=[rng.choice([None, b"", b"k%d" % rng.randrange(9)]) for _ in range(n)],
                    headers=[
                        [(rng.choice(["a", "b", "\u00fc"]), rng.choice([None, b"", b"hv"]))
                         for _ in range(rng.randrange(3))]
                        for _ in range(n)
                    ],
                    partition=p,
                    timestamps=[SPARK_BASE_TS + 1000 * (seq + j) - rng.choice([0, 0, 0, 2500])
                                for j in range(n)],
                    compression=SPARK_CODECS[i % 5],
                )  # fmt: skip
                seq += n
        for i in range(5):
            st.append("audit", b"entry %d" % i, key=b"a")
        st.append("other", b"only")


class PausedScan:
    """A reader thread inside `part.scan(0, ...)`, held after its first segment until release():
    what retention and compaction must not pull out from under it. `messages` collects what it
    read, `errors` what it raised."""

    def __init__(self, part: Any) -> None:
        from mqcore._ext.batch import decode_messages

        self.messages: list[Any] = []
        self.errors: list[BaseException] = []
        self._in_scan, self._released = threading.Event(), threading.Event()

        def decode(buf: memoryview, file_pos: int, seg: object) -> tuple[int, bool]:
            out: list[Any] = []
            used, _ = decode_messages(buf, 0, part.topic, part.partition, 0, 1 << 30, out)
            self.messages.extend(out)
            if not self._in_scan.is_set():
                self._in_scan.set()
                assert self._released.wait(30)
            return used, False

        def reader() -> None:
            try:
                part.scan(0, decode)
            except BaseException as e:  # noqa: BLE001 - reported by finish()
                self.errors.append(e)

        self._thread = threading.Thread(target=reader)
        self._thread.start()
        assert self._in_scan.wait(30)

    def finish(self) -> list[Any]:
        """Let the reader go on to the end; the messages it read (its errors fail the test)."""
        self._released.set()
        self._thread.join(30)
        assert not self.errors, self.errors
        return self.messages


def spark_arrow_schema(schema: Any) -> Any:
    """The Arrow schema Spark checks a Python source's batches against (timestamps in UTC).
    PySpark 4.2 names the zone (`timezone=`); 4.1 only says UTC or not (`timestamp_utc=`)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]  # 4.1 only
