"""How many cameras one pipeline holds: ``edgekit bench BUNDLE --streams N``.

For n = 1, 2, ..., N: one ``Pipeline`` with n ``synthetic:640x480@FPS`` cameras for a few
seconds (drop-oldest, the bundle's budget).  n is *held* when every camera's p99 is within the
budget and no frame was dropped.  Two series: batched (``batch="auto"``: frames of cameras
waiting together inferred as one batch, where the model allows it) and unbatched
(``batch="off"``); each stops at its first n not held.  The answer of a series is its largest
held n (0: not even one camera; ``capped``: it held all the way to N, so more may fit).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from edgekit.pipeline import Pipeline

if TYPE_CHECKING:
    from edgekit.model import Model

Series = Literal["batched", "unbatched"]
#: What each series passes to ``Pipeline(batch=...)``.
BATCH_OF: dict[Series, str] = {"batched": "auto", "unbatched": "off"}
#: A camera of the size the streams are measured at (VGA, as most IP cameras' substream).
FRAME_SIZE = "640x480"


def held(p99_ms: dict[str, float | None], dropped: int, budget_ms: float) -> bool:
    """The rule: every camera has a p99 within the budget, and no frame was dropped."""
    return (
        bool(p99_ms)
        and dropped == 0
        and all(v is not None and not math.isnan(v) and v <= budget_ms for v in p99_ms.values())
    )


@dataclass(frozen=True)
class StreamStep:
    """One pipeline run of ``n`` cameras in one series, and whether it held."""

    series: Series
    n: int
    budget_ms: float
    p99_ms: dict[str, float | None]
    dropped: int
    frames: int
    #: Frames per inference (mean, max), as the pipeline's summary reports them; None if it does not.
    batch_mean: float | None
    batch_max: int | None
    seconds: float

    @property
    def held(self) -> bool:
        return held(self.p99_ms, self.dropped, self.budget_ms)

    @property
    def worst_p99_ms(self) -> float | None:
        known = [v for v in self.p99_ms.values() if v is not None]
        # A camera with no p99 (no frame) is the worst there is.
        return max(known) if known and len(known) == len(self.p99_ms) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "batch": BATCH_OF[self.series],
            "n": self.n,
            "held": self.held,
            "worst_p99_ms": self.worst_p99_ms,
            "p99_ms": self.p99_ms,
            "dropped": self.dropped,
            "frames": self.frames,
            "batch_mean": self.batch_mean,
            "batch_max": self.batch_max,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class StreamsReport:
    """Both series of one ``--streams`` run, and their answers."""

    candidate: str
    fps: float
    seconds: float
    max_streams: int
    budget_ms: float
    steps: tuple[StreamStep, ...] = field(default_factory=tuple)
    wall_s: float = 0.0

    def series(self, name: Series) -> list[StreamStep]:
        return [s for s in self.steps if s.series == name]

    def most_held(self, name: Series) -> int:
        """The largest n held in the series (each series stops at its first n not held)."""
        return max((s.n for s in self.series(name) if s.held), default=0)

    def capped(self, name: Series) -> bool:
        """The series held up to ``max_streams``: the device may hold more than was asked."""
        return self.most_held(name) == self.max_streams

    def to_dict(self) -> dict[str, Any]:
        names: tuple[Series, ...] = ("batched", "unbatched")
        return {
            "scenario": "streams",
            "candidate": self.candidate,
            "source": f"synthetic:{FRAME_SIZE}@{self.fps:g}",
            "fps": self.fps,
            "seconds": self.seconds,
            "max_streams": self.max_streams,
            "budget_ms": self.budget_ms,
            "policy": "drop-oldest",
            "held_means": "every camera's p99 <= budget_ms and 0 dropped",
            "steps": [s.to_dict() for s in self.steps],
            "most_held": {n: self.most_held(n) for n in names},
            "capped": {n: self.capped(n) for n in names},
            "wall_s": round(self.wall_s, 3),
        }


def measure_step(
    model: Model, series: Series, n: int, fps: float, seconds: float, budget_ms: float | None = None
) -> StreamStep:
    """One pipeline of ``n`` synthetic cameras at ``fps`` for ``seconds``, batched or not."""
    sources = [f"synthetic:{FRAME_SIZE}@{fps:g}"] * n
    started = time.perf_counter()
    with Pipeline(
        model,
        sources=sources,
        duration_s=seconds,
        budget_ms=budget_ms,
        policy="drop-oldest",
        batch=BATCH_OF[series],
    ) as p:
        for _ in p:
            pass
        d = p.summary().to_dict()
    cams: dict[str, dict[str, Any]] = d.get("cameras", {})
    batch: dict[str, Any] = d.get("batch") or {}
    return StreamStep(
        series=series,
        n=n,
        budget_ms=float(d["budget_ms"]),
        p99_ms={name: c["latency_ms"]["p99"] for name, c in cams.items()},
        dropped=sum(int(c["dropped"]) for c in cams.values()),
        frames=int(d["frames"]),
        batch_mean=None if batch.get("mean") is None else float(batch["mean"]),
        batch_max=None if batch.get("max") is None else int(batch["max"]),
        seconds=time.perf_counter() - started,
    )


def check_settings(max_streams: int, fps: float, seconds: float) -> None:
    """Raise ``BenchError`` unless there is at least one camera, and a positive rate and duration."""
    if max_streams < 1 or not fps > 0 or not seconds > 0:
        from edgekit.bench.runner import BenchError

        raise BenchError(
            "--streams must be 1 or more and --fps and --seconds positive, "
            f"got {max_streams}, {fps:g}, {seconds:g}",
            "for example --streams 8 --fps 30 --seconds 10",
        )


def measure_streams(
    model: Model,
    max_streams: int,
    *,
    fps: float = 30.0,
    seconds: float = 10.0,
    budget_ms: float | None = None,
    progress: Callable[[StreamStep], None] | None = None,
) -> StreamsReport:
    """Both series, n = 1..``max_streams`` each, each stopped at its first n not held."""
    check_settings(max_streams, fps, seconds)
    started = time.perf_counter()
    steps: list[StreamStep] = []
    for series in ("batched", "unbatched"):
        for n in range(1, max_streams + 1):
            step = measure_step(model, series, n, fps, seconds, budget_ms)
            steps.append(step)
            if progress is not None:
                progress(step)
            if not step.held:
                break
    return StreamsReport(
        candidate=model.candidate,
        fps=fps,
        seconds=seconds,
        max_streams=max_streams,
        budget_ms=steps[0].budget_ms,
        steps=tuple(steps),
        wall_s=time.perf_counter() - started,
    )


def step_line(step: StreamStep) -> str:
    """One progress line: ``batched, 3 cameras: worst p99 12.31 ms, dropped 0, 2.41 frames per inference: held``."""
    worst = "-" if step.worst_p99_ms is None else f"{step.worst_p99_ms:.2f} ms"
    mean = "" if step.batch_mean is None else f", {step.batch_mean:.2f} frames per inference"
    return (
        f"{step.series}, {step.n} camera{'s' if step.n > 1 else ''}: worst p99 {worst}, "
        f"dropped {step.dropped}{mean}: {'held' if step.held else 'NOT held'}"
    )
