"""In which order the first load times a bundle's candidates, what it says of those it had no time for,
and whether the host was too busy for the result to be final.

The first load has a few seconds (``MeasureLimits.total_s``).  On a model slower than the frame
period two candidates can use all of it; timing them in the profile's order then leaves the
fastest artifact (an int8 one, last in the order) unmeasured and never chosen.  So:

* ``timing_order``: likely fastest first, by the build's own p50 per artifact (``latency`` in
  the manifest), else by a static preference (int8, then 16-bit, then fp32; profile order within).
* ``estimate_untimed``: candidates the time left no room for are ranked by the build's p50
  scaled by what the timed ones showed (median of measured p90 / build p50): the build host is
  not this device, but the ratio between artifacts mostly carries over.
* ``measure_candidates``: each candidate in that order, loaded, timed at the camera rate
  (at least ``min_queries`` each) and closed, until the time is spent.
* ``busy_reason``: a measurement on a busy host ranks the host's load, not the artifacts.  Its
  own spread says so (p90 well above p50, by more than a share of the frame period), and so does
  the load average against the cores.  Such a choice is kept provisional and measured again.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgekit.core.stats import median
from edgekit.errors import EdgekitError, InputError
from edgekit.selection.matching import artifact_for

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import Manifest
    from edgekit.device.profiles import Candidate

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasureLimits:
    """How long the first-load measurement may take: a first load costs seconds, never minutes.

    Each candidate gets at most ``per_candidate_s`` (its load included) and an even share of
    what is left of ``total_s``; within that, as many paced queries as fit, between
    ``min_queries`` and ``queries`` (a slow candidate gets fewer).  ``fps`` None: the
    profile's budget (33.3 ms -> 30 fps), the rate the device's frame loop will run at.
    ``total_s`` bounds the queries; a candidate that takes long to load can overrun it once, and
    so can the one whose estimate (from the build's figures) beats every candidate timed.
    ``busy_load``: a 1-minute load average per core above this makes the choice provisional
    (None: only the measurement's own spread says the host is busy).
    """

    per_candidate_s: float = 2.0
    total_s: float = 8.0
    queries: int = 40
    min_queries: int = 5
    warmup: int = 3
    fps: float | None = None
    busy_load: float | None = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.per_candidate_s <= self.total_s:
            raise InputError(
                f"measuring: per_candidate_s {self.per_candidate_s} must be above 0 and at most total_s {self.total_s}",
                "e.g. MeasureLimits(per_candidate_s=2, total_s=8)",
            )
        if not 1 <= self.min_queries <= self.queries or self.warmup < 0:
            raise InputError(
                f"measuring: need 1 <= min_queries ({self.min_queries}) <= queries ({self.queries}) "
                f"and warmup ({self.warmup}) >= 0",
                "e.g. MeasureLimits(queries=40, min_queries=5, warmup=3)",
            )
        if self.fps is not None and not 0 < self.fps <= 10_000:
            raise InputError(f"measuring: fps must be within (0, 10000], got {self.fps}", "e.g. fps=30")
        if self.busy_load is not None and not self.busy_load > 0:
            raise InputError(
                f"measuring: busy_load must be above 0, got {self.busy_load}", "e.g. busy_load=1.0, or None"
            )


#: Without build figures, narrower arithmetic is usually the faster artifact on a CPU or an
#: accelerator alike (less memory traffic); the profile's order breaks ties.
PRECISION_PREFERENCE: Mapping[str, int] = {"int8": 0, "fp16": 1, "bf16": 1, "fp32": 2}
#: p90 / p50 of one candidate's paced queries above this is a wide spread ...
SPREAD_RATIO = 1.5
#: ... when p90 - p50 is also above this share of the frame period (a 0.1 ms model's jitter is not
#: a busy host: only a spread that matters against the budget counts).
SPREAD_SHARE_OF_PERIOD = 0.05


def build_p50(candidate: Candidate, manifest: Manifest) -> float | None:
    """The build host's p50 (ms) of the candidate's artifact, when the build measured it."""
    art = artifact_for(candidate, manifest.artifacts)
    if art is None or art.latency is None or not art.latency.p50_ms > 0:
        return None
    return float(art.latency.p50_ms)


def build_figures(candidates: Sequence[Candidate], manifest: Manifest) -> dict[str, float]:
    """Build p50 per candidate key, for those the build measured."""
    out: dict[str, float] = {}
    for c in candidates:
        ms = build_p50(c, manifest)
        if ms is not None:
            out[c.key] = ms
    return out


def timing_order(candidates: Sequence[Candidate], figures: Mapping[str, float]) -> list[Candidate]:
    """``candidates``, likely fastest first: by build p50 where recorded, then by precision preference."""

    def rank(item: tuple[int, Candidate]) -> tuple[int, float, int]:
        index, c = item
        ms = figures.get(c.key)
        if ms is not None:
            return (0, ms, index)
        return (1, float(PRECISION_PREFERENCE.get(c.precision, 3)), index)

    return [c for _, c in sorted(enumerate(candidates), key=rank)]


def scale_ratio(measured_ms: Mapping[str, float], figures: Mapping[str, float]) -> float | None:
    """Median of measured / build figure over the candidates that have both; None without any."""
    ratios = [measured_ms[k] / figures[k] for k in measured_ms if figures.get(k, 0) > 0]
    return median(ratios) if ratios else None


def estimate_untimed(
    measured_ms: Mapping[str, float], figures: Mapping[str, float], untimed: Sequence[str]
) -> dict[str, float]:
    """Estimated p90 here (ms) of each untimed candidate that has a build figure: figure x observed ratio."""
    ratio = scale_ratio(measured_ms, figures)
    if ratio is None:
        return {}
    return {k: figures[k] * ratio for k in untimed if k in figures}


def load_per_core() -> float | None:
    """The 1-minute load average per CPU core; None where the OS has none (Windows)."""
    try:
        one = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return one / (os.cpu_count() or 1)


def busy_reason(
    spread: Mapping[str, tuple[float, float]],
    period_ms: float,
    load: float | None,
    load_bound: float | None,
) -> str:
    """Why the host was too busy for a final ranking ("" when it was not).

    ``spread``: (p50, p90) per measured candidate.  Busy when the load per core was above
    ``load_bound``, or when most measured candidates had a wide spread (``SPREAD_RATIO`` and
    ``SPREAD_SHARE_OF_PERIOD``).
    """
    if load is not None and load_bound is not None and load > load_bound:
        return f"load average {load:.2f} per core (above {load_bound:g})"
    wide = [
        k
        for k, (p50, p90) in spread.items()
        if p50 > 0
        and p90 / p50 > SPREAD_RATIO
        and p90 - p50 > SPREAD_SHARE_OF_PERIOD * period_ms
        and math.isfinite(p90)
    ]
    if spread and 2 * len(wide) > len(spread):
        worst = max(wide, key=lambda k: spread[k][1] / spread[k][0])
        p50, p90 = spread[worst]
        return f"wide spread: {worst} p90 {p90:.1f} ms against p50 {p50:.1f} ms"
    return ""


def _measure_one(
    session: Session,
    x: Sequence[np.ndarray],
    fps: float,
    share_s: float,
    limits: MeasureLimits,
    best_ms: float | None,
) -> tuple[float, float, int]:
    """Paced p50 and p90 (ms) of ``session`` on ``x`` and the number of queries it took."""
    from edgekit.core.stats import percentile
    from edgekit.device.pacing import back_to_back_latencies, paced_run

    def run() -> None:
        session.run(*x)

    # Back to back first: the warm-up (first-run compilation, allocations) and an estimate of
    # one query, from which the number of paced queries that fit in this candidate's share.
    one_ms = median(back_to_back_latencies(run, max(1, limits.warmup), warmup=1))
    slot_s = max(1.0 / fps, one_ms / 1e3)
    queries = max(limits.min_queries, min(limits.queries, int(share_s / slot_s)))
    if best_ms is not None and one_ms > 2 * best_ms:
        # Twice as slow back to back as the best is paced: its minimum ranks it, more is time lost.
        queries = limits.min_queries
    # One paced warm-up (an idle gap first), and warm passes before each query: the schedule the
    # frame loop keeps by default (edgekit.pipeline.warm), so this ranks what the loop will see.
    paced = sorted(paced_run(run, fps, queries, warmup=1, warm=run).latencies_ms)
    return percentile(paced, 50.0), percentile(paced, 90.0), queries


@dataclass
class Timing:
    """What ``measure_candidates`` found: paced p90 and p50 of those timed, and the rest.

    ``estimated_ms``: p90 of untimed candidates from the build's figures scaled by the ratio
    the timed ones showed; ``untimed``: every candidate the time left no room for, in order.
    """

    p90_ms: dict[str, float] = field(default_factory=dict)
    p50_ms: dict[str, float] = field(default_factory=dict)
    untimed: list[str] = field(default_factory=list)
    estimated_ms: dict[str, float] = field(default_factory=dict)


def measure_candidates(
    candidates: Sequence[Candidate],
    open_session: Callable[[Candidate], Session],
    make_input: Callable[[Session], Sequence[np.ndarray]],
    fps: float,
    limits: MeasureLimits,
    progress: Callable[[str], None] | None = None,
    figures: Mapping[str, float] | None = None,
) -> tuple[Timing, Session | None]:
    """Load, measure at ``fps`` and close each candidate in ``candidates``' order (likely fastest first).

    The fastest one's session is handed back open (``candidate`` set) for ``load()`` to use,
    so it is not loaded twice.  A candidate that does not load or run here is skipped with
    a line.  Each one timed gets at least ``limits.min_queries``; once ``limits.total_s`` is
    spent the rest are not timed: those with a build figure (``figures``, build p50 per key)
    are estimated from it, scaled by the ratio the timed ones showed.  When the best estimate
    beats every candidate timed, that one is timed too (once), so what runs was measured.
    """

    def say(line: str) -> None:
        log.info("%s", line.strip())
        if progress is not None:
            progress(line)

    figures = figures or {}
    say(
        f"measuring {len(candidates)} candidates at {fps:.3g} fps, at most {limits.total_s:g} s "
        "(first load of this bundle on this host; --no-measure skips it): "
        + ", ".join(c.key for c in candidates)
    )
    found = Timing()
    best: Session | None = None
    start = time.monotonic()
    queue = list(candidates)
    overran = False
    try:
        while queue:
            left = limits.total_s - (time.monotonic() - start)
            if left <= 0:
                est = estimate_untimed(found.p90_ms, figures, [c.key for c in queue])
                first = min(est, key=lambda k: est[k]) if est else None
                if first is not None and not overran and est[first] < min(found.p90_ms.values()):
                    overran = True
                    say(f"  {first}: estimated p90 {est[first]:.2f} ms from the build's figures, timed too")
                    queue.sort(key=lambda c: c.key != first)
                    left = limits.per_candidate_s
                else:
                    found.untimed = [c.key for c in queue]
                    found.estimated_ms = est
                    ratio = scale_ratio(found.p90_ms, figures)
                    say(
                        f"  {', '.join(found.untimed)}: not timed ({limits.total_s:g} s spent)"
                        + (
                            f"; ranked by the build's figures x {ratio:.3g}: "
                            + ", ".join(f"{k} ~{v:.2f} ms" for k, v in est.items())
                            if est
                            else ""
                        )
                    )
                    break
            cand = queue.pop(0)
            share = min(limits.per_candidate_s, left / (len(queue) + 1))
            t0 = time.monotonic()
            try:
                session = open_session(cand)
            except EdgekitError as err:
                say(f"  {cand.key}: does not load here ({err.message})")
                continue
            try:
                p50, ms, queries = _measure_one(
                    session,
                    make_input(session),
                    fps,
                    share - (time.monotonic() - t0),
                    limits,
                    found.p90_ms[best.candidate] if best is not None else None,
                )
            except EdgekitError as err:
                session.close()
                say(f"  {cand.key}: does not run here ({err.message})")
                continue
            except BaseException:
                session.close()
                raise
            found.p90_ms[cand.key], found.p50_ms[cand.key] = ms, p50
            build = f", build p50 {figures[cand.key]:.2f} ms" if cand.key in figures else ""
            say(f"  {cand.key}: p90 {ms:.2f} ms, p50 {p50:.2f} ms ({queries} queries{build})")
            if best is None or ms < found.p90_ms[best.candidate]:
                if best is not None:
                    best.close()
                session.candidate = cand.key
                best = session
            else:
                session.close()
    except BaseException:
        if best is not None:
            best.close()
        raise
    return found, best
