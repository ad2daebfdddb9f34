"""The package's shape holds: no import cycles, and the layer contract in pyproject.toml bites.

Every first-party import counts, function-level and ``TYPE_CHECKING`` ones included (grimp
reads them all), so a cycle cannot hide inside a function.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="the import graph needs grimp (pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def import_cycles(package: str = "edgekit") -> list[list[str]]:
    """Each set of modules that import each other (directly or around a loop), sorted (Tarjan)."""
    graph = grimp.build_graph(package)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for m in sorted(edges):
        if m not in index:
            visit(m)
    return found


def test_no_first_party_import_cycles() -> None:
    assert import_cycles() == []


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "loopy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from loopy import b  # function-level\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from loopy import a\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("loopy") == [["loopy.a", "loopy.b"]]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        timeout=300,
    )


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="lint-imports comes with import-linter ('.[dev]')")
def test_an_upward_import_breaks_the_layer_contract(tmp_path: Path) -> None:
    """A copy of the package where the core imports the CLI: lint-imports must fail and say where."""
    shutil.copytree(REPO / "edgekit", tmp_path / "edgekit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _lint_imports(tmp_path).returncode == 0, "the contract should hold on the copy as it is"
    io = tmp_path / "edgekit" / "core" / "io.py"
    io.write_text(io.read_text() + "\n\ndef _upward() -> None:\n    import edgekit.cli  # noqa: F401\n")
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0
    assert "BROKEN" in broken.stdout and "edgekit.core.io -> edgekit.cli" in broken.stdout, broken.stdout
