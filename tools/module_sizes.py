"""The largest modules of the package, the tools and the benchmarks: a report CI prints, not a limit.

A module is split where it has a real seam (a concept of its own, as ``bundle.detection_schema``
came out of ``bundle.manifest``), never cut anywhere to get under a number: a line count says
where to look, the seam says whether to split.  CI prints the largest ones each run so growth is
seen as it happens.

    .venv/bin/python tools/module_sizes.py [--top 15] [--json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKED = ("edgekit", "benchmarks", "tools")


def modules(root: Path) -> Iterator[Path]:
    """Every ``.py`` file under the checked folders of ``root``, in a stable order."""
    for top in CHECKED:
        if (root / top).is_dir():
            yield from sorted((root / top).rglob("*.py"))


def largest(root: Path, top: int) -> list[tuple[str, int]]:
    """The ``top`` longest modules under ``root`` as (path, lines), longest first (ties by path)."""
    sizes = [(p.relative_to(root).as_posix(), len(p.read_bytes().splitlines())) for p in modules(root)]
    return sorted(sizes, key=lambda s: (-s[1], s[0]))[:top]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = largest(REPO, args.top)
    if args.json:
        print(json.dumps([{"module": m, "lines": n} for m, n in rows]))
        return
    print(f"largest modules (of {sum(1 for _ in modules(REPO))}):")
    for module, lines in rows:
        print(f"  {lines:5d}  {module}")


if __name__ == "__main__":
    main()
