"""``tools/module_sizes.py``: the report of the largest modules that CI prints (not a limit)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# tools/ is scripts, not a package: load the one under test by its path.
_spec = importlib.util.spec_from_file_location("module_sizes", REPO / "tools" / "module_sizes.py")
assert _spec is not None and _spec.loader is not None
module_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(module_sizes)
largest = module_sizes.largest


def test_the_report_lists_the_longest_modules_first_and_skips_tests(tmp_path: Path) -> None:
    (tmp_path / "edgekit" / "sub").mkdir(parents=True)
    (tmp_path / "edgekit" / "sub" / "big.py").write_text("x = 1\n" * 501)
    (tmp_path / "edgekit" / "small.py").write_text("x = 1\n" * 20)
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "tool.py").write_text("\n" * 600 + "y = 2")  # no final newline
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_long.py").write_text("x = 1\n" * 900)  # tests are not counted
    assert largest(tmp_path, 2) == [("tools/tool.py", 601), ("edgekit/sub/big.py", 501)]
    assert largest(tmp_path, 9)[-1] == ("edgekit/small.py", 20)


def test_the_report_sees_the_package_it_reports_on() -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "tools" / "module_sizes.py"), "--top", "500", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(r.stdout)
    # A wrong root would print nothing: the report must count the code it is about.
    assert {"edgekit/bundle/manifest.py", "tools/module_sizes.py"} <= {row["module"] for row in rows}
    assert [row["lines"] for row in rows] == sorted((row["lines"] for row in rows), reverse=True)
