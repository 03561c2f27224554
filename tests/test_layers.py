"""The layer rule for compiled code (docs/architecture.md "Who imports whom"), which
import-linter does not read: a module under src/mqcore/_ext imports from mqcore only other
kernels and the bottom utility modules, at load or inside a function, so nothing in storage or
query can be renamed under a kernel unseen; a compiled module of a higher layer (query/keyed.pyx)
imports only its layer and those below it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "mqcore"
# tools/test_installed.py runs the suite where only the install is
if not SRC.is_dir():
    pytest.skip("no source tree (src/mqcore) to check", allow_module_level=True)
KERNEL_SOURCES = sorted(
    p for suffix in ("*.pyx", "*.pxd", "*.pxi") for p in (SRC / "_ext").glob(suffix)
)
# below every layer: they import nothing of mqcore but errors (checked below)
BOTTOM = {"mqcore.errors", "mqcore.compression"}

# `import mqcore.x`, `cimport mqcore.x`, `from mqcore.x import/cimport ...`, `from mqcore import
# x`, at any indentation (a lazy import inside a function counts), and the dynamic forms
_STATEMENT = re.compile(
    r"^[ \t]*(?:(?:c?import)[ \t]+(mqcore(?:\.[\w.]+)?)"
    r"|from[ \t]+(mqcore(?:\.[\w.]+)?)[ \t]+c?import[ \t]+\(?[ \t]*([\w, \t]+))",
    re.MULTILINE,
)
_DYNAMIC = re.compile(r"__import__\(|importlib|import_module\(")
# an `if TYPE_CHECKING:` block (annotations only: no import at run time)
_TYPE_CHECKING = re.compile(r"^if TYPE_CHECKING:\n(?:[ \t]+.*\n|\n)+", re.MULTILINE)


def mqcore_imports(text: str) -> list[str]:
    """Every mqcore module the source text imports, as dotted names (`from mqcore import x`
    gives mqcore.x)."""
    found = []
    for plain, base, names in _STATEMENT.findall(text):
        if plain:
            found.append(plain)
        elif base == "mqcore":
            found.extend(f"mqcore.{n.strip()}" for n in names.split(",") if n.strip())
        else:
            found.append(base)
    return found


def allowed(module: str) -> bool:
    return module.startswith("mqcore._ext.") or module in BOTTOM


def test_the_import_finder_sees_every_form() -> None:
    """The checker below can fail: each way of importing upward is found."""
    text = (
        "from mqcore._ext.batch cimport Message\n"
        "from mqcore.errors import CorruptRecordError\n"
        "def f():\n"
        "    from mqcore.query.ids import encode_msg_id\n"
        "    import mqcore.query.engine as engine\n"
        "cimport mqcore.storage.segment\n"
        "from mqcore import store, config\n"
    )
    assert mqcore_imports(text) == [
        "mqcore._ext.batch",
        "mqcore.errors",
        "mqcore.query.ids",
        "mqcore.query.engine",
        "mqcore.storage.segment",
        "mqcore.store",
        "mqcore.config",
    ]
    assert [m for m in mqcore_imports(text) if not allowed(m)] == [
        "mqcore.query.ids",
        "mqcore.query.engine",
        "mqcore.storage.segment",
        "mqcore.store",
        "mqcore.config",
    ]


def test_kernel_sources_are_found() -> None:
    names = {p.name for p in KERNEL_SOURCES}
    assert {"batch.pyx", "lookup.pyx", "segtable.pyx", "batch.pxd"} <= names


@pytest.mark.parametrize("path", KERNEL_SOURCES, ids=lambda p: p.name)
def test_kernels_import_only_kernels_and_bottom_modules(path: Path) -> None:
    text = path.read_text()
    upward = [m for m in mqcore_imports(text) if not allowed(m)]
    assert upward == [], f"{path.name} imports {upward} (kernels import only mqcore._ext.*)"
    assert not _DYNAMIC.search(text), f"{path.name} imports dynamically"


@pytest.mark.parametrize("module", sorted(BOTTOM))
def test_bottom_modules_import_only_errors(module: str) -> None:
    """What the kernels may import stays at the bottom: it imports nothing else of mqcore at
    run time (errors.py names QueryResult for annotations only)."""
    text = (SRC / (module.split(".", 1)[1].replace(".", "/") + ".py")).read_text()
    text = _TYPE_CHECKING.sub("", text)
    assert [m for m in mqcore_imports(text) if m != "mqcore.errors"] == []


def layer_of(module: str, layers: list[list[str]]) -> int:
    """The index of the contract layer holding `module` (0 is the top)."""
    for i, names in enumerate(layers):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    raise AssertionError(f"{module} is in no layer of pyproject.toml's contract")


@pytest.fixture(scope="module")
def contract() -> list[list[str]]:
    """pyproject.toml's layers contract, top first, each layer as its module names."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((SRC.parent.parent / "pyproject.toml").read_text())
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    return [[name.strip() for name in layer.split("|")] for layer in layers]


# compiled modules above the kernels (setup.py LAYER_MODULES): import-linter reads .py files
# only, so their imports are checked here against the same contract
LAYER_SOURCES = sorted(p for p in SRC.rglob("*.pyx") if p.parent.name != "_ext")


def test_layer_sources_are_found(contract: list[list[str]]) -> None:
    assert SRC / "query" / "keyed.pyx" in LAYER_SOURCES
    assert layer_of("mqcore.query.keyed", contract) > layer_of("mqcore.log.trace", contract)
    assert layer_of("mqcore.query.keyed", contract) < layer_of("mqcore._ext.lookup", contract)


@pytest.mark.parametrize("path", LAYER_SOURCES, ids=lambda p: p.name)
def test_compiled_layer_modules_import_downward(path: Path, contract: list[list[str]]) -> None:
    """A compiled module of a layer imports its own layer and the layers below it, as the
    layer's Python modules do."""
    module = "mqcore." + ".".join(path.relative_to(SRC).with_suffix("").parts)
    own = layer_of(module, contract)
    text = path.read_text()
    upward = [m for m in mqcore_imports(text) if layer_of(m, contract) < own]
    assert upward == [], f"{path.name} imports {upward}, above its layer"
    assert not _DYNAMIC.search(text), f"{path.name} imports dynamically"
