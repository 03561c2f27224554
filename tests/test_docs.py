"""The documentation's examples run, and its links and commands point at things that exist."""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(
    os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")
)

_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def _read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def python_blocks(name: str) -> list[str]:
    """The ```python blocks of a Markdown file, in order."""
    return _FENCE.findall(_read(name))


EXAMPLES = [(name, i, code) for name in DOCS for i, code in enumerate(python_blocks(name))]


def test_readme_has_a_quick_start() -> None:
    blocks = python_blocks("README.md")
    assert blocks, "README.md lost its ```python quick start"
    assert "mqcore.open(" in blocks[0]


@pytest.mark.parametrize(
    ("name", "index", "code"), EXAMPLES, ids=[f"{n}[{i}]" for n, i, _ in EXAMPLES]
)
def test_example_runs(
    name: str,
    index: int,
    code: str,
    tmp_path: os.PathLike[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Each block runs on its own, in a fresh namespace, in an empty directory; a Spark example
    gets the test run's one session (its getOrCreate() returns it), or is skipped with it."""
    if "pyspark" in code:
        request.getfixturevalue("spark")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{name}[python block {index}]", "exec"), {"__name__": "__main__"})


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)  # no comments in code
    for heading in re.findall(r"^#+ (.+)$", prose, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("name", DOCS)
def test_relative_links_resolve(name: str) -> None:
    """Every relative link names a file of the repository (and a heading of it, if given)."""
    text = _read(name)
    for target, anchor in _LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(name), target))
        assert os.path.exists(os.path.join(ROOT, path)), f"{name}: broken link {target}"
        if anchor and path.endswith(".md"):
            assert anchor in _anchors(_read(path)), f"{name}: no heading #{anchor} in {path}"


def test_readme_commands_exist() -> None:
    """The two commands the README promises are Makefile targets, and so are the others."""
    makefile = _read("Makefile")
    targets = set(re.findall(r"^([a-z]+):", makefile, re.M))
    mentioned = set(re.findall(r"(?:`|^\$ )make ([a-z]+)", _read("README.md"), re.M))
    assert {"demo", "test"} <= mentioned
    for target in mentioned:
        assert target in targets, f"README mentions `make {target}`, the Makefile has no target"
