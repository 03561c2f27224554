"""The architecture holds (docs/architecture.md "Layers"): imports point one way, no module
imports itself through others, no module reaches into another's private names. These are the
checks of `make lint`, run in the suite so CI runs them too."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a store, log or partition of a child process's code reaching a private name
CHILD_PRIVATE = re.compile(r"\b(?:store|s|st|log|part)\._[a-z]\w*")
SRC = ROOT / "src"
# tools/test_installed.py runs the suite where only the install is
if not (SRC / "mqcore").is_dir():
    pytest.skip("no source tree (src/mqcore) to check", allow_module_level=True)


def _tool(name: str) -> str:
    """A console script of the venv running the tests (the dev extra installs them)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return found


def test_imports_follow_the_layers() -> None:
    """import-linter's layers contract of pyproject.toml over the source tree: lazy imports
    inside functions count, TYPE_CHECKING imports do not."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    proc = subprocess.run(
        [_tool("lint-imports"), "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_import_cycle() -> None:
    """No strongly connected set of modules in the import graph (Tarjan over grimp's graph,
    runtime imports only, lazy ones included): every module can be understood bottom-up."""
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(SRC))
    try:
        graph = grimp.build_graph("mqcore", exclude_type_checking_imports=True)
    finally:
        sys.path.remove(str(SRC))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    assert cycles == []


def test_no_module_touches_another_modules_privates() -> None:
    """ruff's SLF001 over src/ (a class using its own underscored names is fine)."""
    proc = subprocess.run(
        [_tool("ruff"), "check", "--select", "SLF001", "--no-cache", "src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]


def _private_imports(path: Path) -> list[str]:
    """`from m import _name` and imports of a module whose path has a `_part` (the kernels'
    package `mqcore._ext` excepted: its modules' public names are the kernels' API)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # the code of child processes, handed over as a string: its store privates too
            for m in CHILD_PRIVATE.finditer(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} child code uses {m[0]}")
            continue
        if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [a.name for a in node.names], []
        else:
            continue
        for module in modules:
            parts = [p for p in module.split(".") if p not in ("", "_ext", "__future__")]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
        for name in names:
            if name.startswith("_") and not name.startswith("__"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    return found


def test_tests_use_public_names() -> None:
    """No test, benchmark, fuzz target or tool imports another module's private name or
    touches another object's `_private` attribute (SLF001): they drive the code as users do."""
    dirs = ("tests", "bench", "fuzz", "tools")
    files = [p for d in dirs for p in sorted((ROOT / d).rglob("*.py"))]
    assert files
    found = [hit for p in files for hit in _private_imports(p)]
    assert found == []
    proc = subprocess.run(
        [_tool("ruff"), "check", "--select", "SLF001", "--no-cache", *dirs],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
