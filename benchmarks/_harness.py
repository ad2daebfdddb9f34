"""What every benchmark does alike: its command line, the bundle it measures, JSON output, goal lines.

A benchmark's docstring's first line is its ``--help`` description; one that measures a
bundle takes it as an optional argument (default: the reference bundle ``edgekit demo``
builds) and ``--device``; one that reports for a program takes ``--json`` and then prints
one JSON document on stdout, its progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn


def parser(
    doc: str | None, *, bundle: bool = False, device: bool = True, json_flag: bool = False
) -> argparse.ArgumentParser:
    """The benchmark's argument parser: BUNDLE (and ``--device``) with ``bundle``, ``--json`` with ``json_flag``."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    if bundle:
        ap.add_argument(
            "bundle", nargs="?", type=Path, help="default: the reference bundle (built if needed)"
        )
        if device:
            ap.add_argument("--device", default="auto")
    if json_flag:
        ap.add_argument(
            "--json", action="store_true", help="print one JSON document (progress goes to stderr)"
        )
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; only warnings are logged (a benchmark's output is its measurements)."""
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return args


def bundle_of(args: argparse.Namespace) -> Path:
    """The bundle named on the command line, or the reference bundle (built the first time)."""
    if args.bundle is not None:
        return Path(args.bundle)
    from edgekit.demo import host_reference_bundle

    return host_reference_bundle()


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


@contextmanager
def progress_on_stderr(enabled: bool) -> Iterator[None]:
    """While measuring, send what is printed to stderr: stdout is kept for the one JSON document."""
    if not enabled:
        yield
        return
    real, sys.stdout = sys.stdout, sys.stderr
    try:
        yield
    finally:
        sys.stdout = real


def print_json(doc: Any, indent: int | None = None) -> None:
    print(json.dumps(doc, indent=indent), flush=True)


def print_doc(doc: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    """The result: one JSON document with ``--json``, else ``render(doc)`` for a person."""
    if as_json:
        print_json(doc, indent=1)
    else:
        print(render(doc))


def pinned(cores: Collection[int]) -> Callable[[], None] | None:
    """A ``preexec_fn`` that pins a child process to ``cores`` (None: no pinning)."""
    if not cores:
        return None
    chosen = set(cores)
    return lambda: os.sched_setaffinity(0, chosen)


def run(main: Callable[[], int]) -> NoReturn:
    """``if __name__ == "__main__": run(main)``: its return value is the exit status."""
    sys.exit(main())
