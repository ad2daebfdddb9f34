"""The live view of a running pipeline: a rich panel on a terminal, one plain line a second otherwise.

Rendering runs on rich's refresh thread from a snapshot the frame loop leaves behind, so
a slow terminal never delays a frame.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from edgekit.protocol.stages import STAGES

if TYPE_CHECKING:
    from edgekit.pipeline import FrameResult, Pipeline


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:.2f}"


def _box(box: tuple[float, float, float, float]) -> str:
    return "({:.0f},{:.0f},{:.0f},{:.0f})".format(*box)


class LiveView:
    """What the terminal shows while a pipeline runs; ``update(result)`` is all the loop calls."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.result: FrameResult | None = None
        self._last_line = time.monotonic()
        self._detector = pipeline.model.task == "detection"

    def update(self, result: FrameResult) -> None:
        self.result = result  # a reference swap: the rendering happens elsewhere

    def headline(self) -> str:
        p = self.pipeline
        return (
            f"{p.model.name} on [bold]{p.candidate}[/] · {p.source.info.uri} · "
            f"budget {p.budget_ms:g} ms · {p.policy.value}"
        )

    def __rich__(self) -> Group:
        p = self.pipeline
        w = p.stats.window()
        c = p.counters
        frames = c.frames
        miss_rate = f" ({c.missed / frames:.1%})" if frames else ""
        status = Text.from_markup(
            f"frame [bold]{frames}[/]   fps [bold]{_ms(w['fps'])}[/]   "
            f"misses [{'red' if c.missed else 'green'}]{c.missed}{miss_rate}[/]   drops {c.dropped}   "
            f"reopens {c.source_reopens}"
            + (f"   degrade switches {c.degrade_switches}" if c.degrade_switches else "")
        )
        labels = Table(box=None, show_header=False, pad_edge=False)
        result = self.result
        if result is not None and self._detector:
            labels.add_row(f"[bold]{len(result.detections)}[/] detections", "", "")
            for d in result.detections[:3]:
                labels.add_row(escape(d.name), f"{d.score:.2f}", _box(d.box))
        elif result is not None:
            for lab in result.labels[:3]:
                bar = "█" * max(1, round(lab.score * 20))
                labels.add_row(escape(lab.name), f"[cyan]{bar}[/]", f"{lab.score:.2f}")
        stages = Table(title=f"last {w['frames']} frames (ms)", title_justify="left", box=None)
        stages.add_column("stage")
        stages.add_column("p50", justify="right")
        stages.add_column("p99", justify="right")
        for name in (*STAGES, "latency"):
            colour = "bold" if name == "latency" else ""
            p99 = w[name]["p99"]
            over = name == "latency" and not math.isnan(p99) and p99 > p.budget_ms
            stages.add_row(
                f"[{colour}]{name}[/]" if colour else name,
                _ms(w[name]["p50"]),
                f"[red]{_ms(p99)}[/]" if over else _ms(p99),
            )
        return Group(Text.from_markup(self.headline()), status, labels, stages)

    def plain_line(self, console: Console) -> None:
        """At most one line a second, for logs and pipes."""
        now = time.monotonic()
        if now - self._last_line < 1.0 or self.result is None:
            return
        self._last_line = now
        p, c, w = self.pipeline, self.pipeline.counters, self.pipeline.stats.window()
        console.print(
            f"frame={c.frames} fps={_ms(w['fps'])} p50={_ms(w['latency']['p50'])}ms "
            f"p99={_ms(w['latency']['p99'])}ms misses={c.missed} drops={c.dropped} "
            f"reopens={c.source_reopens} candidate={p.candidate} {self._seen_now(self.result)}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )

    def _seen_now(self, result: FrameResult) -> str:
        if self._detector:
            best = " ".join(f"{d.name}:{d.score:.2f}@{_box(d.box)}" for d in result.detections[:3])
            return f"detections={len(result.detections)}" + (f" {best}" if best else "")
        top = result.top
        return f"top={top.name if top else '-'}:{top.score if top else 0:.2f}"
