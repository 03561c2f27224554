"""CI mode of the fuzz harnesses in fuzz/: each runs for a few seconds over a corpus seeded from
a real store (fuzz/make_corpus.py) and must end without a finding. `make fuzz` runs them for
longer over the clang build with native coverage and AddressSanitizer (docs/testing.md)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import child_env

FUZZ_DIR = Path(__file__).resolve().parent.parent / "fuzz"
HARNESSES = sorted(
    os.path.basename(p)[len("fuzz_") : -len(".py")] for p in glob.glob(str(FUZZ_DIR / "fuzz_*.py"))
)
SECONDS = 3  # per harness: the nine together stay under a minute with start-up

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


@pytest.mark.parametrize("harness", HARNESSES)
def test_harness_runs_clean(harness: str, corpus: Path, tmp_path: Path) -> None:
    seeds = corpus / harness
    seeds.mkdir(exist_ok=True)
    work = tmp_path / "corpus"
    work.mkdir()
    for seed in seeds.iterdir():
        (work / seed.name).write_bytes(seed.read_bytes())
    proc = subprocess.run(
        [
            sys.executable,
            str(FUZZ_DIR / f"fuzz_{harness}.py"),
            f"-max_total_time={SECONDS}",
            "-timeout=10",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={tmp_path}/crash-",
            str(work),
        ],
        env=child_env(),
        capture_output=True,
        timeout=60 + SECONDS,
        check=False,
    )
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-4000:]
    assert "Done" in err and "runs in" in err, err[-2000:]
    assert not list(tmp_path.glob("crash-*")), err[-4000:]
