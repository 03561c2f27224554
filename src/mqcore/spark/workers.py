"""Whether Spark's Python workers can import mqcore: checked when the source is registered.

Spark starts the Python workers that plan a read (on the driver) with PYSPARK_PYTHON as read
when the SparkContext started, else `python3` on PATH, and those of the executors with the
`spark.pyspark.python` setting when it is set, else the same: not with the driver's
interpreter. A script run with a virtualenv's
python without activating the virtualenv therefore gets workers that lack mqcore, and the first
read fails deep in a worker with an unpickling traceback. register() runs that interpreter once
with the workers' PYTHONPATH and says what is wrong in one sentence instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from mqcore.errors import InvalidConfigError

# what a worker of the mqcore source imports besides PySpark itself (pyspark.zip on its path)
WORKER_IMPORTS = "import pyarrow, mqcore.spark.plan, mqcore.spark.batches"
CHECK_TIMEOUT_S = 120

_good: set[tuple[str, str, str]] = set()  # (python, PYTHONPATH, cwd) that imported it


def check_workers(spark: Any) -> None:
    """Raise InvalidConfigError when a Python Spark starts its workers with cannot import
    mqcore: the planner processes on the driver run PYSPARK_PYTHON (as read when the
    SparkContext started; else `python3`), the executors `spark.pyspark.python` when it is set
    (else the same), and each must. Spark Connect sessions are not checked (their workers run
    on the server)."""
    try:
        sc = spark.sparkContext
    except (AttributeError, NotImplementedError):
        return
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in dict(sc.environment).items()})
    paths = [str(sc.environment.get("PYTHONPATH", "")), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    executors = sc.getConf().get("spark.pyspark.python", None)
    for python, setting in ((str(sc.pythonExec), None),
                            (executors, "spark.pyspark.python")):  # fmt: skip
        if python is None:
            continue
        key = (python, env["PYTHONPATH"], os.getcwd())
        if key in _good:
            continue
        problem = _import_problem(python, env)
        if problem is None:
            _good.add(key)
            continue
        raise InvalidConfigError(
            f"Spark's Python workers run {_named(python, setting)}, which cannot import mqcore "
            f"({problem}): set {setting or 'PYSPARK_PYTHON'} to a Python that has mqcore, such "
            f"as this one ({sys.executable}), before the SparkSession starts"
        )


def _named(python: str, setting: str | None) -> str:
    """Where the workers' Python comes from, for the refusal."""
    if setting is not None:
        return f"{setting}={python!r}"
    given = os.environ.get("PYSPARK_PYTHON")
    if given == python:
        return f"PYSPARK_PYTHON={python!r}"
    if given:
        return f"{python!r} (PYSPARK_PYTHON={given!r} was set after the SparkSession started)"
    return f"{python!r} (PYSPARK_PYTHON is not set)"


def _import_problem(python: str, env: dict[str, str]) -> str | None:
    """Why `python` cannot import what a worker of the source needs (its last error line),
    or None when it can, or when the check itself could not finish in time."""
    try:
        proc = subprocess.run(
            [python, "-c", WORKER_IMPORTS],
            env=env,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except OSError as e:
        return f"it cannot be started: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return None  # a slow machine is no reason to refuse; the read will tell
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"
