"""CI mode of the fuzz harnesses in fuzz/: each runs for a few seconds over a corpus seeded from
a real store (fuzz/make_corpus.py) and must end without a finding. `make fuzz` runs them for
longer over the clang build with native coverage and AddressSanitizer (docs/testing.md)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import child_env

FUZZ_DIR = Path(__file__).resolve().parent.parent / "fuzz"
HARNESSES = sorted(
    os.path.basename(p)[len("fuzz_") : -len(".py")] for p in glob.glob(str(FUZZ_DIR / "fuzz_*.py"))
)
SECONDS = 2  # per harness, two at a time (the runs fixture): the ten take under a minute

pytest.importorskip(
    "atheris", reason="atheris (in the `dev` extra where a wheel exists) not installed"
)
if not HARNESSES:
    pytest.skip(
        "fuzz/ is not next to tests/ (an installed copy of the tests)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    subprocess.run(
        [sys.executable, str(FUZZ_DIR / "make_corpus.py"), str(out)],
        env=child_env(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def test_every_reader_has_a_harness() -> None:
    assert set(HARNESSES) >= {
        "batch",
        "scan",
        "compression",
        "index",
        "keyindex",
        "ids",
        "selector",
        "logdir",
        "recovery",
        "server_request",
    }


def run_harness(harness: str, corpus: Path, workdir: Path) -> subprocess.CompletedProcess[bytes]:
    """One harness for SECONDS over a copy of its seeds; crash files go to workdir/crash-*."""
    seeds = corpus / harness
    seeds.mkdir(exist_ok=True)
    work = workdir / "corpus"
    work.mkdir(parents=True)
    for seed in seeds.iterdir():
        (work / seed.name).write_bytes(seed.read_bytes())
    scratch = workdir / "scratch"  # the harness's files: here, not left in /dev/shm
    scratch.mkdir()
    return subprocess.run(
        [
            sys.executable,
            str(FUZZ_DIR / f"fuzz_{harness}.py"),
            f"-max_total_time={SECONDS}",
            "-timeout=10",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={workdir}/crash-",
            str(work),
        ],
        env={**child_env(), "MQCORE_FUZZ_SCRATCH": str(scratch)},
        capture_output=True,
        timeout=60 + SECONDS,
        check=False,
    )


def shared_scratch() -> set[str]:
    """The harnesses' directories in the machine-wide default scratch place (tmpfs)."""
    shm = Path("/dev/shm")
    return {p.name for p in shm.glob("mqcore-fuzz-*")} if shm.is_dir() else set()


@pytest.fixture(scope="module")
def shm_before() -> set[str]:
    return shared_scratch()


@pytest.fixture(scope="module")
def runs(
    corpus: Path, tmp_path_factory: pytest.TempPathFactory, shm_before: set[str]
) -> Iterator[dict[str, tuple[Path, Future[subprocess.CompletedProcess[bytes]]]]]:
    """Every harness's run, two at a time: each spends most of its wall time importing mqcore
    under instrumentation in one process, so two run side by side on CI's two cores in about
    the time of one (the module took two minutes run one after another). `shm_before` is
    taken first, so the leak check compares with the time before any run."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        out = {}
        for harness in HARNESSES:
            workdir = tmp_path_factory.mktemp(f"fuzz-{harness}")
            out[harness] = (workdir, pool.submit(run_harness, harness, corpus, workdir))
        yield out


@pytest.mark.parametrize("harness", HARNESSES)
def test_harness_runs_clean(
    harness: str, runs: dict[str, tuple[Path, Future[subprocess.CompletedProcess[bytes]]]]
) -> None:
    workdir, future = runs[harness]
    proc = future.result()
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-4000:]
    assert "Done" in err and "runs in" in err, err[-2000:]
    assert not list(workdir.glob("crash-*")), err[-4000:]


def test_harness_runs_leave_nothing_in_dev_shm(
    shm_before: set[str],
    runs: dict[str, tuple[Path, Future[subprocess.CompletedProcess[bytes]]]],
) -> None:
    """libFuzzer's exit skips the harnesses' cleanup: their files go to each run's own
    directory, which pytest removes, and none is left in /dev/shm (three per run were)."""
    for _, future in runs.values():
        future.result()
    assert shared_scratch() - shm_before == set()
