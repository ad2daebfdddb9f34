"""``edgekit build``'s progress where no one watches a terminal, and its stage times.

A build in CI or piped to a log used to show nothing but NNCF's own progress bars: the
spinner needs a terminal.  There it prints plain lines instead, one per step's start and
end and, for a step that works through images (the gate), how far it got, at most one
line per ``EVERY_S`` seconds per step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.table import Table

#: At most one "images N/M" line per step this often (its start and end are always shown).
EVERY_S = 2.0


class PlainProgress:
    """The builder's ``progress(step, status)`` as lines on a stream: ``build: gate tvm-fp32 images 8/40 (14 s)``."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.clock = stream, clock
        self.started: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def __call__(self, step: str, status: str) -> None:
        now = self.clock()
        if status == "start":
            self.started[step] = self.last[step] = now
            self._say(f"{step} …")
            return
        took = f" ({now - self.started[step]:.1f} s)" if step in self.started else ""
        if status.startswith("images "):
            if now - self.last.get(step, -EVERY_S) < EVERY_S:
                return
            self.last[step] = now
            self._say(f"{step} {status.removeprefix('images ')} images{took}")
            return
        self.started.pop(step, None)
        self._say(f"{step} {status}{took}")

    def _say(self, line: str) -> None:
        stream = self.stream or sys.stderr  # looked up at each line: --json points stdout at it
        print(f"build: {line}", file=stream, flush=True)


def stage_table(stages: Sequence[dict[str, Any]]) -> Table:
    """The build's steps and their times, the slowest marked: where a build's minutes went."""
    table = Table(title="build steps", title_justify="left")
    for col in ("stage", "artifact", "seconds"):
        table.add_column(col, justify="right" if col == "seconds" else "left")
    slowest = max((s["seconds"] for s in stages), default=0.0)
    for s in stages:
        secs = f"{s['seconds']:.1f}" + (" cached" if s.get("cached") else "")
        if slowest and s["seconds"] == slowest:
            secs = f"[bold]{secs}[/]"
        table.add_row(s["stage"], s["artifact"] or "-", secs)
    table.add_row("total", "", f"{sum(s['seconds'] for s in stages):.1f}")
    return table
