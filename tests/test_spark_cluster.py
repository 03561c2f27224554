"""The Spark source on a real Spark cluster (issue 35): a standalone master and two workers,
each its own process (tests/sparkcluster.py), and a driver process that reads a store on a
path every worker sees (batch, the query options, a streaming read with a checkpoint) and
writes to another; its answers equal what the store holds, as local[2]'s do. Then the
refusals: executors whose Python cannot import mqcore are named when the source is
registered, before any read; a store the driver sees and the workers do not fails the read
with an error naming the path and the machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import child_env

import mqcore

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'mqcore[spark]')")

from sparkcluster import StandaloneCluster  # noqa: E402

DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession
import mqcore, mqcore.spark

master, mode, path, sink, checkpoint, python, pythonpath = sys.argv[1:8]
if mode == "unseen":  # a store only this process's mount namespace has (the workers' is empty)
    with mqcore.open(path, create=True) as st:
        st.create_topic("events", partitions=2)
        for i in range(20):
            st.append("events", b"v%d" % i, partition=i % 2)
spark = (SparkSession.builder.master(master).appName("mqcore-cluster-test")
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m")
         .config("spark.cores.max", "2").config("spark.sql.shuffle.partitions", "2")
         .config("spark.pyspark.python", python)
         .config("spark.executorEnv.PYTHONPATH", pythonpath).getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
try:
    mqcore.spark.register(spark)
except Exception as e:
    print(json.dumps({"refused": type(e).__name__ + ": " + str(e)}))
    spark.stop()
    sys.exit(0)
if mode == "unseen":
    try:
        rows = spark.read.format("mqcore").option("subscribe", "events").load(path).collect()
        print(json.dumps({"rows": len(rows)}))
    except Exception as e:
        print(json.dumps({"failed": str(e)}))
    spark.stop()
    sys.exit(0)
out = {}
df = (spark.read.format("mqcore").option("subscribe", "events").option("minPartitions", "4")
      .load(path))
out["rows"] = sorted([r.partition, r.offset, r.value.decode()] for r in df.collect())
out["by_partition"] = {str(r["partition"]): r["count"]
                       for r in df.groupBy("partition").count().collect()}
keyed = (spark.read.format("mqcore").option("subscribe", "events").option("key", "k3")
         .option("tag", "red").load(path))
out["key"] = sorted([r.partition, r.offset] for r in keyed.collect())
hosts = spark.sparkContext.parallelize(range(8), 8).map(
    lambda _: __import__("os").getpid()).distinct().count()
out["executor_pids"] = hosts
df.selectExpr("key", "value", "partition").write.format("mqcore").option("topic", "copy") \
    .mode("append").save(sink)
query = (spark.readStream.format("mqcore").option("subscribe", "events")
         .option("startingOffsets", "earliest").load(path).selectExpr("key", "value", "partition")
         .writeStream.format("mqcore").option("topic", "streamed")
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(sink))
query.awaitTermination()
print(json.dumps(out))
spark.stop()
"""


def run_driver(cluster: StandaloneCluster, path: str, sink: str, checkpoint: str,
               python: str = sys.executable, mode: str = "full",
               wrap: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """DRIVER's answer, run as `wrap + [python, -c, DRIVER, ...]`."""
    env = {**child_env(), "PYSPARK_PYTHON": sys.executable}  # the driver's planner processes
    argv = [sys.executable, "-c", DRIVER, cluster.url, mode, path, sink, checkpoint, python,
            env["PYTHONPATH"]]  # fmt: skip
    proc = subprocess.run([*(wrap or []), *argv], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return dict(json.loads(lines[-1]))


def make_stores(tmp_path: Path) -> tuple[str, str, list[Any]]:
    path, sink = str(tmp_path / "store"), str(tmp_path / "sink")
    with mqcore.open(path, create=True) as st:
        st.create_topic("events", partitions=3, segment_bytes=4096)
        for i in range(900):
            st.append("events", b"event-%d" % i, key=b"k%d" % (i % 7), partition=i % 3,
                      tag="red" if i % 4 == 0 else "blue")  # fmt: skip
        everything = [m for p in range(3) for m in st.read("events", p, 0, 10_000)]
    with mqcore.open(sink, create=True) as st:
        st.create_topic("copy", partitions=3)
        st.create_topic("streamed", partitions=3)
    return path, sink, everything


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One standalone cluster for the module's tests: its workers' Python imports mqcore."""
    started = StandaloneCluster(tmp_path_factory.mktemp("spark"), workers=2)
    try:
        yield started.start(worker_env={"PYTHONPATH": child_env()["PYTHONPATH"]})
    finally:
        started.stop()


@pytest.mark.slow
def test_a_standalone_cluster_reads_queries_streams_and_writes_as_local_mode(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    path, sink, everything = make_stores(tmp_path)
    out = run_driver(cluster, path, sink, str(tmp_path / "checkpoint"))
    assert "rows" in out, out
    assert out["rows"] == sorted([m.partition, m.offset, m.value.decode()] for m in everything)
    assert out["by_partition"] == {str(p): 300 for p in range(3)}
    assert out["key"] == sorted([m.partition, m.offset] for m in everything
                                if m.key == b"k3" and m.tag == "red")  # fmt: skip
    assert out["executor_pids"] >= 2  # tasks ran in more than one executor process
    with mqcore.open(sink, read_only=True) as st:
        for topic in ("copy", "streamed"):
            got = sorted((m.partition, m.value) for p in range(3)
                         for m in st.read(topic, p, 0, 10_000))  # fmt: skip
            assert got == sorted((m.partition, m.value) for m in everything), topic


@pytest.mark.slow
def test_executors_whose_python_lacks_mqcore_are_refused_at_register(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    path, sink, _ = make_stores(tmp_path)
    refused = run_driver(cluster, path, sink, str(tmp_path / "checkpoint"),
                         python=str(no_mqcore_python(tmp_path)))  # fmt: skip
    assert "refused" in refused and "cannot import mqcore" in refused["refused"], refused
    assert "spark.pyspark.python=" in refused["refused"]  # the executors' setting is named


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a mount namespace needs root and unshare(1)")  # fmt: skip
def test_a_read_of_a_store_the_workers_cannot_see_fails_naming_the_path_and_the_machine(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """The driver runs in a mount namespace of its own with a tmpfs over `hidden`, and makes
    a store there: it plans the read, and every executor, outside, finds `hidden` empty. The
    job fails with the executors' NotAStoreError, which names the path, the machine and why,
    in bounded time (Spark's four attempts of a task)."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    path = str(hidden / "store")
    mount = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs mqcore-test "$0" && exec "$@"', str(hidden)]  # fmt: skip
    out = run_driver(cluster, path, str(tmp_path / "sink"), str(tmp_path / "checkpoint"),
                     mode="unseen", wrap=mount)  # fmt: skip
    assert "failed" in out, out  # the driver saw the store, the executors did not
    assert f"NotAStoreError: {path} is not an mqcore store" in out["failed"], out
    assert "it does not exist" in out["failed"]
    assert f"on {socket.gethostname()}, in a Spark task" in out["failed"]
    assert not os.path.exists(path)  # outside the namespace there never was a store


def no_mqcore_python(tmp_path: Path) -> Path:
    """This interpreter without its site-packages (-S): a worker's Python that lacks mqcore
    and pyarrow, as on a machine where mqcore was not installed."""
    wrapper = tmp_path / "python-without-mqcore"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper
