"""The camera-rate scenario: queries issued at a frame rate, as a device's frame loop issues them.

LoadGen's SingleStream (and OpenVINO's ``benchmark_app``) issue the next query the moment
the last one returned.  A camera does not: a frame comes every ``1/fps`` seconds, and in
between the runtime sits idle, its thread pool parks, the core drops into an idle state
and its caches cool.  The first query after that gap pays for the wake-up, so a model that
takes 1 ms back to back can take 2.5 ms at 30 fps.  This module is the one measurement of
that scenario: ``edgekit bench`` reports it beside SingleStream, and the first-load
selection ranks by it.

* ``paced_run`` issues query ``i`` at its scheduled time ``t0 + i / fps``, never earlier
  (it sleeps, then checks the clock again).  A query that ends after the next one is due
  has overrun its slot: the next is issued at once and the overrun is counted.  The
  schedule never shifts: frames keep coming at the camera's rate whatever the model does.
* ``back_to_back_latencies`` is SingleStream: the next query as soon as the last returned.
* ``camera_rate`` summarizes a paced run; its ``wakeup_ms`` is paced p50 minus back-to-back
  p50, the price of the idle gap between frames.

The clock and the sleep are parameters, so tests drive the schedule with a fake clock and
never depend on this machine's speed.  Pure Python: a device's benchmark worker needs no
numpy for this.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit._core.stats import percentile

Clock = Callable[[], int]  # nanoseconds, monotonic
Sleep = Callable[[float], object]  # seconds


def fps_for_budget(budget_ms: float) -> float:
    """The frame rate a device's latency budget stands for: one frame per budget (33.3 ms -> 30 fps)."""
    if not budget_ms > 0:
        return 0.0
    return 1000.0 / budget_ms


@dataclass(frozen=True)
class PacedRun:
    """The raw numbers of one paced run: each measured query's latency (ms) and the overruns."""

    fps: float
    latencies_ms: tuple[float, ...]
    #: Measured queries that ended after the next query was due (a frame waited; it then went at once).
    overruns: int
    duration_s: float


def paced_run(
    run: Callable[[], object],
    fps: float,
    queries: int,
    *,
    warmup: int = 3,
    sleep: Sleep = time.sleep,
    clock: Clock = time.perf_counter_ns,
) -> PacedRun:
    """Call ``run`` ``warmup + queries`` times at ``fps``; time the last ``queries`` of them.

    The warm-up queries are paced too, on the same schedule: the first measured query then
    comes after an idle gap like every other, not straight after a burst of warm-up calls.
    """
    if not fps > 0 or math.isinf(fps):
        raise ValueError(f"fps must be a positive, finite number, got {fps}")
    if queries < 1 or warmup < 0:
        raise ValueError(f"queries must be 1 or more and warmup 0 or more, got {queries} and {warmup}")
    period_ns = 1e9 / fps
    total = warmup + queries
    lat: list[float] = []
    overruns = 0
    t0 = clock()
    start = None
    for i in range(total):
        due = t0 + round(i * period_ns)
        now = clock()
        while now < due:  # never early: a sleep may return before its time (a signal), so look again
            sleep((due - now) / 1e9)
            now = clock()
        if i == warmup:
            start = now
        run()
        end = clock()
        if i >= warmup:
            lat.append((end - now) / 1e6)
            # It overran its slot when the next frame was already waiting as it ended (a query
            # issued late to catch up counts too when it still ends past the next slot).
            if end > t0 + round((i + 1) * period_ns):
                overruns += 1
    assert start is not None  # queries >= 1
    return PacedRun(fps, tuple(lat), overruns, (clock() - start) / 1e9)


def back_to_back_latencies(
    run: Callable[[], object], queries: int, warmup: int = 3, *, clock: Clock = time.perf_counter_ns
) -> list[float]:
    """SingleStream: each query issued as soon as the last returned; ms per measured query."""
    if queries < 1 or warmup < 0:
        raise ValueError(f"queries must be 1 or more and warmup 0 or more, got {queries} and {warmup}")
    for _ in range(warmup):
        run()
    lat: list[float] = []
    for _ in range(queries):
        t0 = clock()
        run()
        lat.append((clock() - t0) / 1e6)
    return lat


@dataclass(frozen=True)
class CameraRate:
    """A paced run summarized: its percentiles, its overruns, and the wake-up cost.

    ``wakeup_ms`` is the paced p50 minus the back-to-back p50 of the same candidate (None
    when there is no back-to-back run to compare with); it may come out slightly negative
    on a candidate with nothing to wake.
    """

    fps: float
    queries: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    overruns: int
    wakeup_ms: float | None

    @property
    def headline_ms(self) -> float:
        """What selection ranks by at the camera rate: the paced p90 (SingleStream's headline percentile)."""
        return self.p90_ms

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None or math.isnan(x) else round(x, 4)

        return {
            "fps": round(self.fps, 3),
            "queries": self.queries,
            "p50_ms": r(self.p50_ms),
            "p90_ms": r(self.p90_ms),
            "p99_ms": r(self.p99_ms),
            "overruns": self.overruns,
            "wakeup_ms": r(self.wakeup_ms),
        }


def camera_rate(
    fps: float,
    paced_ms: Sequence[float],
    overruns: int,
    back_to_back_ms: Sequence[float] = (),
) -> CameraRate:
    """Summarize paced latencies (any order), with the wake-up cost against ``back_to_back_ms``."""
    ordered = sorted(paced_ms)
    p50 = percentile(ordered, 50.0)
    wake = p50 - percentile(sorted(back_to_back_ms), 50.0) if back_to_back_ms and ordered else None
    return CameraRate(
        fps=fps,
        queries=len(ordered),
        p50_ms=p50,
        p90_ms=percentile(ordered, 90.0),
        p99_ms=percentile(ordered, 99.0),
        overruns=overruns,
        wakeup_ms=wake,
    )
