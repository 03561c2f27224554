"""Run mqcore's test suite against the installed package, never against a source tree.

`make wheel-test`, `make sdist-test` and cibuildwheel's test-command call this with the
interpreter of the environment that holds the install. It copies the tests and the files they
read (the docs and their link targets, the Makefile, pytest's settings in pyproject.toml) into a
temporary directory that has no src/, checks that `import mqcore` there resolves to this
interpreter's site-packages, and runs pytest in it. Arguments after `--` go to pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

# What the suite opens besides its own files: README/docs examples and relative links
# (bench/README.md, CHANGELOG.md, LICENSE), the Makefile targets the README names, and pytest's
# configuration.
COPIED = ["tests", "docs", "bench", "README.md", "CHANGELOG.md", "LICENSE", "Makefile"]
CONFIG = "pyproject.toml"

# Imports the package and one compiled kernel, printing where each came from.
_PROBE = "import mqcore, mqcore._ext.batch as b; print(mqcore.__file__); print(b.__file__)"


def _within(path: str, directory: str) -> bool:
    """True if `path` is `directory` or lies below it."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def _copy_sources(source: str, work: str) -> None:
    """Copy the test inputs that exist in `source` (an sdist may lack some) into `work`."""
    skip = shutil.ignore_patterns("__pycache__", "*.py[cod]", ".hypothesis", ".benchmarks")
    for name in [*COPIED, CONFIG]:
        src = os.path.join(source, name)
        dst = os.path.join(work, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=skip)
        elif os.path.isfile(src):
            shutil.copy2(src, dst)
    if not os.path.isdir(os.path.join(work, "tests")):
        raise SystemExit(f"test_installed: no tests/ directory in {source}")
    if not os.path.isfile(os.path.join(work, CONFIG)):
        raise SystemExit(f"test_installed: no {CONFIG} (pytest's settings) in {source}")


def _installed_location(work: str, env: dict[str, str]) -> str:
    """Where `import mqcore` resolves from `work`; exits unless that is this interpreter's
    site-packages (not a source tree's src/, as with PYTHONPATH=src or an editable install)."""
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise SystemExit(f"test_installed: mqcore is not importable here:\n{probe.stderr}")
    site_dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    paths = probe.stdout.split()
    for path in paths:
        if not any(_within(path, d) for d in site_dirs):
            raise SystemExit(f"test_installed: {path} is not an install in {sorted(site_dirs)}")
    return os.path.dirname(paths[0])


def main(argv: list[str] | None = None) -> int:
    """Copy the tests out, check the import, run pytest; returns pytest's exit status."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        default=here,
        help="source tree or unpacked sdist holding tests/ (default: %(default)s)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    source = os.path.abspath(args.source)

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # a PYTHONPATH=src left over from development must not leak in
    with tempfile.TemporaryDirectory(prefix="mqcore-installed-tests-") as work:
        _copy_sources(source, work)
        location = _installed_location(work, env)
        print(f"test_installed: testing mqcore installed at {location}", flush=True)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
        return subprocess.call([*command, *args.pytest_args], cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
