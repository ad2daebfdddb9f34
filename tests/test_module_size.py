"""No Python module of the package, the tools or the benchmarks is over 500 lines.

A module that grows past it is split along a real seam into a small module named after what
it holds (as ``bundle.detection_schema`` came out of ``bundle.manifest``), not cut anywhere
to get under the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 500
CHECKED = ("edgekit", "benchmarks", "tools")


def modules(root: Path) -> Iterator[Path]:
    """Every ``.py`` file under the checked folders of ``root``, in a stable order."""
    for top in CHECKED:
        if (root / top).is_dir():
            yield from sorted((root / top).rglob("*.py"))


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``"path: N lines"`` for each module under ``root`` with more than ``limit`` lines."""
    found = []
    for path in modules(root):
        count = len(path.read_bytes().splitlines())
        if count > limit:
            found.append(f"{path.relative_to(root).as_posix()}: {count} lines")
    return found


def test_no_module_is_over_500_lines() -> None:
    checked = list(modules(REPO))
    # The check must see the code it guards: a wrong root would pass with nothing to count.
    assert {p.relative_to(REPO).parts[0] for p in checked} == set(CHECKED)
    assert REPO / "edgekit" / "bundle" / "manifest.py" in checked
    assert oversized(REPO) == [], f"split these along a real seam (at most {MAX_LINES} lines a module)"


def test_the_size_check_names_each_file_over_the_limit_and_its_count(tmp_path: Path) -> None:
    (tmp_path / "edgekit" / "sub").mkdir(parents=True)
    (tmp_path / "edgekit" / "sub" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "edgekit" / "at_limit.py").write_text("x = 1\n" * 500)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "tool.py").write_text("\n" * 600 + "y = 2")  # no final newline
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_long.py").write_text("x = 1\n" * 900)  # tests are not checked
    assert oversized(tmp_path) == ["edgekit/sub/big.py: 501 lines", "tools/tool.py: 601 lines"]
