"""Whether Spark's Python workers can import mqcore: checked when the source is registered.

Spark starts its Python workers with PYSPARK_PYTHON as read when the SparkContext started,
else `python3` on PATH, not with the driver's interpreter. A script run with a virtualenv's
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
    """Raise InvalidConfigError when the Python Spark starts its workers with cannot import
    mqcore. Spark Connect sessions are not checked (their workers run on the server)."""
    try:
        sc = spark.sparkContext
    except (AttributeError, NotImplementedError):
        return
    python = str(sc.pythonExec)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in dict(sc.environment).items()})
    paths = [str(sc.environment.get("PYTHONPATH", "")), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    key = (python, env["PYTHONPATH"], os.getcwd())
    if key in _good:
        return
    problem = _import_problem(python, env)
    if problem is None:
        _good.add(key)
        return
    given = os.environ.get("PYSPARK_PYTHON")
    if given == python:
        where = f"PYSPARK_PYTHON={python!r}"
    elif given:
        where = f"{python!r} (PYSPARK_PYTHON={given!r} was set after the SparkSession started)"
    else:
        where = f"{python!r} (PYSPARK_PYTHON is not set)"
    raise InvalidConfigError(
        f"Spark's Python workers run {where}, which cannot import mqcore ({problem}): set "
        f"PYSPARK_PYTHON to a Python that has mqcore, such as this one ({sys.executable}), "
        f"before the SparkSession starts"
    )


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
