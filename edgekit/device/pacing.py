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
  (``edgekit.pipeline.warm``): untimed passes, back to back, end ``WARM_MARGIN_NS`` before
  each query is due; as many as fit in ``WARM_MAX_DUTY`` of the period, at most
  ``WARM_MAX_PASSES`` (``WarmCosts``).  Selection ranks by this one, since it is what the
  device's loop will see.

The clock and the sleep are parameters, so tests drive the schedule with a fake clock and
never depend on this machine's speed.  Pure Python: a device's benchmark worker needs no
numpy for this.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.core.stats import median, percentile

Clock = Callable[[], int]  # nanoseconds, monotonic
Sleep = Callable[[float], object]  # seconds

#: A warm pass ends at least this long before the frame (or query) it warms for, in ns.
WARM_MARGIN_NS = 400_000
#: Warm passes run only while their time fits in this share of the frame period (their CPU cost).
WARM_MAX_DUTY = 1 / 3
#: At most this many warm passes back to back before a frame.  One pass does not undo an
#: idle gap: measured on a 2-core x86_64 VM (reference bundle, openvino-int8-full, 30 fps,
#: a new frame's preprocessing between the last pass and the frame's query), the query took
#: 2.2x its back-to-back time with no pass, 1.75x after one, 1.5x after two, 1.1x after three.
WARM_MAX_PASSES = 3
#: Warm bursts the pass times are taken over.
WARM_HISTORY = 16


class WarmCosts:
    """What warm passes cost here: the first of a burst (the cold one) and each one after it.

    Medians of the last ``WARM_HISTORY`` bursts.  ``passes`` is the rule for how many run:
    as many as fit in ``WARM_MAX_DUTY`` of the period, at most ``WARM_MAX_PASSES``.
    """

    def __init__(self) -> None:
        self._first: deque[int] = deque(maxlen=WARM_HISTORY)
        self._extra: deque[int] = deque(maxlen=WARM_HISTORY)
        self._burst: deque[int] = deque(maxlen=WARM_HISTORY)
        self.count = 0  # passes recorded

    def add(self, bounds: Sequence[int]) -> None:
        """One burst: ``bounds`` are its start and each pass's end, in ns (``n`` passes, ``n + 1`` times)."""
        if len(bounds) < 2:
            raise ValueError("a burst has a start and at least one pass's end")
        self._first.append(bounds[1] - bounds[0])
        self._extra.extend(b - a for a, b in itertools.pairwise(bounds[1:]))
        self._burst.append(bounds[-1] - bounds[0])
        self.count += len(bounds) - 1

    def clear(self) -> None:
        """Forget the times (not the count): what the device does from now on is what counts."""
        self._first.clear()
        self._extra.clear()
        self._burst.clear()

    @property
    def burst_ms(self) -> float:
        """A burst's median time, ms (NaN before any): the warm CPU a frame costs."""
        return _median(self._burst) / 1e6 if self._burst else math.nan

    def passes(self, period_ns: float, first_guess_ns: int = 0) -> int:
        """How many passes fit before a frame every ``period_ns``; 0 when not even the first does.

        ``first_guess_ns`` stands in for the first pass's time until one ran (0: one pass fits).
        """
        first, extra = self._times(first_guess_ns)
        if first <= 0:
            return 1
        budget = WARM_MAX_DUTY * period_ns
        if first > budget:
            return 0
        return min(WARM_MAX_PASSES, 1 + int((budget - first) // extra))

    def lead_ns(self, passes: int, first_guess_ns: int = 0) -> int:
        """How long ``passes`` passes back to back are expected to take."""
        first, extra = self._times(first_guess_ns)
        return first + (passes - 1) * extra

    def _times(self, first_guess_ns: int) -> tuple[int, int]:
        # A later pass costs less than the first, the cold one: timed apart.  Until one ran it is
        # taken as the first's, so a burst never runs into the frame on a guess.
        first = _median(self._first) or first_guess_ns
        return first, _median(self._extra) or first


def _median(values: deque[int]) -> int:
    return int(median(values)) if values else 0


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
    #: The median time of the warm passes before a query, all of them together, ms (NaN without).
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
    ``warm``: call it, untimed, back to back (``WarmCosts.passes`` times) so that the last call
    ends ``WARM_MARGIN_NS`` before each query is due (planned from its own times so far), as
    the frame loop does; once not even one pass fits in ``WARM_MAX_DUTY`` of the period it
    stops, as the loop's ``auto`` would.
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
    costs = WarmCosts()
    for i in range(total):
        due = t0 + round(i * period_ns)
        if warm is not None and i > 0:
            burst = costs.passes(period_ns)
            if burst:
                at = due - costs.lead_ns(burst) - WARM_MARGIN_NS
                now = clock()
                if now < at:  # room for the passes before the query (not when catching up after an overrun)
                    while now < at:
                        sleep((at - now) / 1e9)
                        now = clock()
                    bounds = [now]
                    for _ in range(burst):
                        warm()
                        bounds.append(clock())
                    costs.add(bounds)
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
    return PacedRun(fps, tuple(lat), overruns, (clock() - start) / 1e9, costs.count, costs.burst_ms)


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
    #: The warm passes' median time before a query when the percentiles are a warm run's, else None.
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
