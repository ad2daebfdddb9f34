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
* ``paced_run(..., warm=...)`` is the same schedule as the frame loop runs it by default
  (``edgekit.pipeline.warm``): one untimed pass ends ``WARM_MARGIN_NS`` before each query is
  due, while a pass takes at most ``WARM_MAX_DUTY`` of the period.  Selection ranks by this
  one, since it is what the device's loop will see.

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

#: A warm pass ends at least this long before the frame (or query) it warms for, in ns.
WARM_MARGIN_NS = 400_000
#: A warm pass runs only while its time fits in this share of the frame period (its CPU cost).
WARM_MAX_DUTY = 0.2


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
    #: Untimed warm passes run before the queries (``warm=``); 0 when not asked or not worth it.
    warm_passes: int = 0
    #: The warm pass's median time, ms (NaN without passes).
    warm_pass_ms: float = math.nan


def paced_run(
    run: Callable[[], object],
    fps: float,
    queries: int,
    *,
    warmup: int = 3,
    sleep: Sleep = time.sleep,
    clock: Clock = time.perf_counter_ns,
    warm: Callable[[], object] | None = None,
) -> PacedRun:
    """Call ``run`` ``warmup + queries`` times at ``fps``; time the last ``queries`` of them.

    The warm-up queries are paced too, on the same schedule: the first measured query then
    comes after an idle gap like every other, not straight after a burst of warm-up calls.
    ``warm``: call it, untimed, so that it ends ``WARM_MARGIN_NS`` before each query is due
    (planned from its own median time so far), as the frame loop does; once its median time
    is over ``WARM_MAX_DUTY`` of the period it stops, as the loop's ``auto`` would.
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
    passes: list[int] = []
    for i in range(total):
        due = t0 + round(i * period_ns)
        if warm is not None and i > 0:
            typical = sorted(passes)[len(passes) // 2] if passes else 0
            if typical <= WARM_MAX_DUTY * period_ns:
                at = due - typical - WARM_MARGIN_NS
                now = clock()
                if now < at:  # room for a pass before the query (not when catching up after an overrun)
                    while now < at:
                        sleep((at - now) / 1e9)
                        now = clock()
                    warm()
                    passes.append(clock() - now)
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
    typical_ms = sorted(passes)[len(passes) // 2] / 1e6 if passes else math.nan
    return PacedRun(fps, tuple(lat), overruns, (clock() - start) / 1e9, len(passes), typical_ms)


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

    The percentiles and overruns are those of the scenario the frame loop runs: the warm
    run (a warm pass before each query) when there is one, else the cold one.  ``wakeup_ms``
    is the cold paced p50 minus the back-to-back p50 of the same candidate (None when there
    is no back-to-back run to compare with): what the idle gap costs without a warm pass; it
    may come out slightly negative on a candidate with nothing to wake.
    """

    fps: float
    queries: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    overruns: int
    wakeup_ms: float | None
    #: The cold run's p50 (no warm pass), None when only a warm run was given.
    cold_p50_ms: float | None = None
    #: The warm pass's median time when the percentiles are a warm run's, else None.
    warm_pass_ms: float | None = None

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
            "cold_p50_ms": r(self.cold_p50_ms),
            "warm_pass_ms": r(self.warm_pass_ms),
        }


def camera_rate(
    fps: float,
    paced_ms: Sequence[float],
    overruns: int,
    back_to_back_ms: Sequence[float] = (),
    *,
    warm: PacedRun | None = None,
) -> CameraRate:
    """Summarize paced latencies (any order), with the wake-up cost against ``back_to_back_ms``.

    ``warm``: the same schedule with warm passes (``paced_run(..., warm=...)``); when it ran
    any, its percentiles are the headline ones and ``paced_ms`` gives the cold p50 and the
    wake-up cost.
    """
    cold = sorted(paced_ms)
    cold_p50 = percentile(cold, 50.0) if cold else None
    wake = cold_p50 - percentile(sorted(back_to_back_ms), 50.0) if back_to_back_ms and cold_p50 else None
    warmed = warm is not None and warm.warm_passes > 0 and bool(warm.latencies_ms)
    used = sorted(warm.latencies_ms) if warm is not None and warmed else cold
    return CameraRate(
        fps=fps,
        queries=len(used),
        p50_ms=percentile(used, 50.0),
        p90_ms=percentile(used, 90.0),
        p99_ms=percentile(used, 99.0),
        overruns=warm.overruns if warm is not None and warmed else overruns,
        wakeup_ms=wake,
        cold_p50_ms=cold_p50,
        warm_pass_ms=warm.warm_pass_ms if warm is not None and warmed else None,
    )
