"""Exact latency statistics of one benchmark run, the way MLPerf LoadGen reports them.

A benchmark keeps every sample (a few thousand floats), so its percentiles are exact,
not sketched.  Two rules apply:

* ``percentile(sorted, q)`` with ``method="loadgen"`` takes the sample at index
  ``floor(n * q / 100)`` of the sorted latencies (clipped to the last), which is what
  LoadGen's ``PerformanceSummary`` reports; ``method="linear"`` is numpy's default
  (Hyndman-Fan type 7) for comparison with other tools.  It is edgekit's one percentile,
  defined in ``edgekit.core.stats`` with ``PERCENTILES`` and ``label``.
* LoadGen's early-stopping rule says how many queries a percentile needs before it means
  anything: with ``c = 99%`` confidence that the true ``q`` percentile is below the
  estimate, allowing one query over it, a p90 needs 64 queries and a p99 needs 662.
  ``min_queries(q)`` computes it from the binomial distribution (LoadGen's
  ``early_stopping.cc``, with exact sums instead of its hypergeometric series), and
  ``early_stopping_estimate`` gives the conservative percentile a run of ``n`` queries
  supports.

Pure Python: a device's benchmark worker needs no numpy for this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from edgekit.core.stats import PERCENTILES as PERCENTILES
from edgekit.core.stats import label as label
from edgekit.core.stats import percentile as percentile

#: SingleStream's headline percentile (a summary reports every one in ``PERCENTILES``).
HEADLINE = 90.0
#: LoadGen's early-stopping confidence.
CONFIDENCE = 0.99


def odds(h: int, t: int, p: float, tolerance: float = 0.0) -> float:
    """Chance of ``t`` or fewer queries over the true ``p`` quantile among ``h + t`` queries.

    Each query is over it with probability ``1 - (p - tolerance)``; this is the binomial
    CDF that LoadGen writes as ``BetaRegularized[p - d, h, 1 + t]``.
    """
    q = p - tolerance
    n = h + t
    log_q, log_over = math.log(q), math.log1p(-q)
    # Terms of the binomial sum in log space, each from the last (C(n, x+1) = C(n, x) (n-x)/(x+1)).
    logs = [n * log_q]
    for x in range(t):
        logs.append(logs[-1] + math.log((n - x) / (x + 1)) + log_over - log_q)
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(v - top) for v in logs))


@lru_cache(maxsize=4096)
def min_passing(t: int, p: float, confidence: float = CONFIDENCE, tolerance: float = 0.0) -> int:
    """The least ``h`` queries under the estimate such that ``t`` over it still bound the ``p`` quantile.

    LoadGen's ``MinPassingQueriesFinder``: the smallest ``h`` with
    ``odds(h, t, p, tolerance) <= 1 - confidence``.
    """
    if not 0 < p < 1:
        raise ValueError(f"quantile must be within (0, 1), got {p}")
    q = p - tolerance
    # Lower bounds: the t = 0 answer, and t * q / (1 - q) (LoadGen's minimum slope).
    lo = max(1, math.ceil(math.log(1 - confidence) / math.log(q)), math.floor(t * q / (1 - q)))
    hi = lo
    while odds(hi, t, p, tolerance) > 1 - confidence:
        lo, hi = hi + 1, hi * 2
    while lo < hi:  # the least h in [lo, hi] that passes
        mid = (lo + hi) // 2
        if odds(mid, t, p, tolerance) <= 1 - confidence:
            hi = mid
        else:
            lo = mid + 1
    return lo


def min_queries(q: float, confidence: float = CONFIDENCE) -> int:
    """Queries a run needs before its ``q`` percentile (0-100) is reportable: 64 for p90, 662 for p99.

    LoadGen's SingleStream floor: the least run that still bounds the percentile when one
    query is over it (``h_min(t=1) + 1``).
    """
    return min_passing(1, q / 100, confidence) + 1


def early_stopping_estimate(
    sorted_values: Sequence[float], q: float, confidence: float = CONFIDENCE
) -> float | None:
    """The latency the true ``q`` percentile is below with ``confidence``, or None if the run is too short.

    With ``n`` queries, ``t`` is the most queries allowed over the estimate (the largest
    ``t >= 1`` with ``h_min(t) + t <= n``); the estimate is the ``t+1``-th largest latency.
    It is never below the plain percentile of a run long enough to have one.
    """
    n = len(sorted_values)
    p = q / 100
    if n < min_queries(q, confidence):
        return None
    # h_min(t) + t grows with t: find the largest t that fits by bisection.
    lo, hi = 1, max(1, math.floor(n * (1 - p)))  # h_min(t) >= t p / (1 - p), so t <= n (1 - p)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if min_passing(mid, p, confidence) + mid <= n:
            lo = mid
        else:
            hi = mid - 1
    return float(sorted_values[n - 1 - lo])


@dataclass(frozen=True)
class LatencySummary:
    """What LoadGen's summary says of one SingleStream run, in milliseconds.

    ``percentiles`` maps ``"p50"``... to values; a percentile whose run was too short for it
    (fewer queries than ``min_queries``) is still given, and listed in ``underpowered``.
    """

    count: int
    duration_s: float
    min_ms: float
    max_ms: float
    mean_ms: float
    percentiles: dict[str, float]
    underpowered: tuple[str, ...]
    early_stopping_p90_ms: float | None
    early_stopping_p99_ms: float | None

    @property
    def qps(self) -> float:
        return self.count / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def headline_ms(self) -> float:
        """SingleStream's headline: the p90 latency."""
        return self.percentiles[label(HEADLINE)]

    @property
    def p99_valid(self) -> bool:
        """LoadGen's rule: a p99 needs at least 662 queries."""
        return label(99.0) not in self.underpowered

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None or math.isnan(x) else round(x, 4)

        return {
            "count": self.count,
            "duration_s": round(self.duration_s, 3),
            "qps": r(self.qps),
            "min_ms": r(self.min_ms),
            "max_ms": r(self.max_ms),
            "mean_ms": r(self.mean_ms),
            **{f"{k}_ms": r(v) for k, v in self.percentiles.items()},
            "headline": f"{label(HEADLINE)}_ms",
            "p99_valid": self.p99_valid,
            "min_queries_p99": min_queries(99.0),
            "underpowered": list(self.underpowered),
            "early_stopping_p90_ms": r(self.early_stopping_p90_ms),
            "early_stopping_p99_ms": r(self.early_stopping_p99_ms),
        }


def summarize(latencies_ms: Sequence[float], duration_s: float) -> LatencySummary:
    """The LoadGen-style summary of one run's query latencies (any order)."""
    ordered = sorted(latencies_ms)
    n = len(ordered)
    pct = {label(q): percentile(ordered, q) for q in PERCENTILES}
    under = tuple(label(q) for q in PERCENTILES if q < 100 and n < min_queries(q))
    return LatencySummary(
        count=n,
        duration_s=duration_s,
        min_ms=float(ordered[0]) if n else math.nan,
        max_ms=float(ordered[-1]) if n else math.nan,
        mean_ms=math.fsum(ordered) / n if n else math.nan,
        percentiles=pct,
        underpowered=under,
        early_stopping_p90_ms=early_stopping_estimate(ordered, 90.0),
        early_stopping_p99_ms=early_stopping_estimate(ordered, 99.0),
    )
