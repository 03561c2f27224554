"""A Spark standalone cluster for the tests (issue 35): a master and two workers, each its own
JVM process, started with pyspark's own `bin/spark-class` on loopback ports; a driver runs in
a process of its own (a test run keeps its one local[2] session in its own process: a JVM
holds one SparkContext). Every wait is bounded; stop() kills what it started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from zkserver import free_port

START_TIMEOUT = 120.0  # seconds for a JVM to listen, or a worker to register


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class StandaloneCluster:
    """spark://127.0.0.1:PORT with two one-core workers; the executors' Python is `python`
    (a worker's PYSPARK_PYTHON), with this source tree on its path."""

    def __init__(self, directory: Path, python: str = sys.executable, workers: int = 2):
        self.directory, self.python, self.count = directory, python, workers
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SPARK_HOME": spark_home(), "PYSPARK_PYTHON": python,
                    "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}  # fmt: skip

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - the process writes it
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        self.procs.append(subprocess.Popen(cmd, env=env or self.env, stdout=log,
                                           stderr=subprocess.STDOUT))  # fmt: skip
        log.close()

    def start(self, worker_env: dict[str, str] | None = None) -> StandaloneCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))  # fmt: skip
        self._wait(lambda: _listening(self.port), "the master to listen")
        for i in range(self.count):
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host",
                        "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                        str(free_port()), "--work-dir", str(self.directory / f"work-{i}"),
                        self.url, env={**self.env, **(worker_env or {})})  # fmt: skip
        self._wait(lambda: self.registered() >= self.count, "the workers to register")
        return self

    def registered(self) -> int:
        """Workers the master's log says registered (its REST status needs its UI)."""
        log = (self.directory / "master.log").read_text(errors="replace")
        return log.count("Registering worker")

    def _wait(self, check: Any, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not check():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
                                 for f in sorted(self.directory.glob("*.log")))  # fmt: skip
                raise AssertionError(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait(60)
