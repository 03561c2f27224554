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

master, mode, path, sink, checkpoint, python, pythonpath, unseen = sys.argv[1:9]


def session(python, **conf):
    builder = (SparkSession.builder.master(master).appName("mqcore-cluster-test")
               .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m")
               .config("spark.cores.max", "2").config("spark.sql.shuffle.partitions", "2")
               .config("spark.pyspark.python", python)
               .config("spark.executorEnv.PYTHONPATH", pythonpath))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


if mode == "refusals":  # executors set to `python`
    spark = session(python)
    try:
        mqcore.spark.register(spark)
        print(json.dumps({}))
    except Exception as e:
        print(json.dumps({"refused": type(e).__name__ + ": " + str(e)}))
    spark.stop()
    sys.exit(0)
spark = session(python)
mqcore.spark.register(spark)
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
if unseen != "-":  # a store only this process's mount namespace has (the workers' is empty)
    with mqcore.open(unseen, create=True) as st:
        st.create_topic("events", partitions=2)
        for i in range(20):
            st.append("events", b"v%d" % i, partition=i % 2)
    try:
        out["unseen_rows"] = len(spark.read.format("mqcore").option("subscribe", "events")
                                 .load(unseen).collect())
    except Exception as e:
        out["unseen_failed"] = str(e)
print(json.dumps(out))
spark.stop()
"""


def run_driver(cluster: StandaloneCluster, path: str, sink: str, checkpoint: str,
               python: str = sys.executable, mode: str = "full", unseen: str = "-",
               wrap: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """DRIVER's answer, run as `wrap + [python, -c, DRIVER, ...]`."""
    env = {**child_env(), "PYSPARK_PYTHON": sys.executable}  # the driver's planner processes
    argv = [sys.executable, "-c", DRIVER, cluster.url, mode, path, sink, checkpoint, python,
            env["PYTHONPATH"], unseen]  # fmt: skip
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


CAN_MOUNT = os.geteuid() == 0 and shutil.which("unshare") is not None


@pytest.fixture(scope="module")
def full_run(
    cluster: StandaloneCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str, list[Any], str]:
    """DRIVER's full run: (its answers, the sink, the store's records, the unseen store's
    path). As root it runs in a mount namespace of its own with a tmpfs over `hidden`, where
    it makes a store the executors, outside, cannot see ("-" without root)."""
    tmp_path = tmp_path_factory.mktemp("driver")
    path, sink, everything = make_stores(tmp_path)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    unseen = str(hidden / "store") if CAN_MOUNT else "-"
    mount = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs mqcore-test "$0" && exec "$@"', str(hidden)]  # fmt: skip
    out = run_driver(cluster, path, sink, str(tmp_path / "checkpoint"), unseen=unseen,
                     wrap=mount if CAN_MOUNT else None)  # fmt: skip
    return out, sink, everything, unseen


@pytest.mark.slow
def test_a_standalone_cluster_reads_queries_streams_and_writes_as_local_mode(
    full_run: tuple[dict[str, Any], str, list[Any], str],
) -> None:
    out, sink, everything, _ = full_run
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
@pytest.mark.skipif(not CAN_MOUNT, reason="a mount namespace needs root and unshare(1)")
def test_a_read_of_a_store_the_workers_cannot_see_fails_naming_the_path_and_the_machine(
    full_run: tuple[dict[str, Any], str, list[Any], str],
) -> None:
    """The driver planned the read from the store in its namespace; every executor found
    `hidden` empty, and the job failed with their NotAStoreError, which names the path, the
    machine and why (after Spark's four attempts of the task)."""
    out, _, _, unseen = full_run
    assert "unseen_failed" in out, out  # the driver saw the store, the executors did not
    failed = out["unseen_failed"]
    assert f"NotAStoreError: {unseen} is not an mqcore store" in failed, failed
    assert "it does not exist" in failed
    assert f"on {socket.gethostname()}, in a Spark task" in failed
    assert not os.path.exists(unseen)  # outside the namespace there never was a store


@pytest.mark.slow
def test_executors_whose_python_lacks_mqcore_are_refused_at_register(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    path, sink, _ = make_stores(tmp_path)
    out = run_driver(cluster, path, sink, str(tmp_path / "checkpoint"), mode="refusals",
                     python=str(no_mqcore_python(tmp_path)))  # fmt: skip
    assert "cannot import mqcore" in out.get("refused", ""), out
    assert "spark.pyspark.python=" in out["refused"]  # the executors' setting is named


def no_mqcore_python(tmp_path: Path) -> Path:
    """This interpreter without its site-packages (-S): a worker's Python that lacks mqcore
    and pyarrow, as on a machine where mqcore was not installed."""
    wrapper = tmp_path / "python-without-mqcore"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper
