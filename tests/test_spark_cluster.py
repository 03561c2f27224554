"""The Spark source on a real Spark cluster (issue 35): a standalone master and two workers,
each its own process (tests/sparkcluster.py), and a driver process that reads a store on a
path every worker sees (batch, the query options, a streaming read with a checkpoint) and
writes to another; its answers equal what the store holds, as local[2]'s do. Then the
refusals: executors whose Python cannot import mqcore are named when the source is
registered, before any read."""

from __future__ import annotations

import json
import subprocess
import sys
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
import mqcore.spark

master, path, sink, checkpoint, python, pythonpath = sys.argv[1:7]
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
               python: str = sys.executable) -> dict[str, Any]:  # fmt: skip
    env = {**child_env(), "PYSPARK_PYTHON": sys.executable}  # the driver's planner processes
    proc = subprocess.run([sys.executable, "-c", DRIVER, cluster.url, path, sink, checkpoint,
                           python, env["PYTHONPATH"]], env=env, capture_output=True, text=True,
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


@pytest.mark.slow
def test_a_standalone_cluster_reads_queries_streams_and_writes_as_local_mode(
    tmp_path: Path,
) -> None:
    path, sink, everything = make_stores(tmp_path)
    cluster = StandaloneCluster(tmp_path / "spark", workers=2)
    try:
        cluster.start(worker_env={"PYTHONPATH": child_env()["PYTHONPATH"]})
        out = run_driver(cluster, path, sink, str(tmp_path / "checkpoint"))
        refused = run_driver(cluster, path, sink, str(tmp_path / "checkpoint-2"),
                             python=str(no_mqcore_python(tmp_path)))  # fmt: skip
    finally:
        cluster.stop()
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
    assert "refused" in refused and "cannot import mqcore" in refused["refused"], refused
    assert "spark.pyspark.python=" in refused["refused"]  # the executors' setting is named


def no_mqcore_python(tmp_path: Path) -> Path:
    """This interpreter without its site-packages (-S): a worker's Python that lacks mqcore
    and pyarrow, as on a machine where mqcore was not installed."""
    wrapper = tmp_path / "python-without-mqcore"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    wrapper.chmod(0o755)
    return wrapper
