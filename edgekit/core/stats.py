"""The two statistical rules every layer of edgekit shares: the percentile, and top-1 agreement.

Percentiles
    ``percentile(sorted, q)`` is MLPerf LoadGen's rule, the project's latency convention:
    the sample at index ``floor(n * q / 100)`` of the sorted latencies, clipped to the
    last (LoadGen's ``PerformanceSummary``).  It is always an observed latency, never an
    interpolated one, and it is what ``edgekit bench`` reports, so a device's health gate,
    the pipeline's degrade controller and the benchmark give the same p99 of the same
    samples.  ``method="linear"`` is numpy's default (Hyndman-Fan type 7), only for
    comparison with other tools.  ``PERCENTILES`` is every percentile edgekit reports;
    each report shows a subset of it (the pipeline summary leaves out p97).  ``median(values)``
    is the same rule at q = 50 on values in any order: the sample at index ``n // 2`` of the
    sorted values, so of an even count the upper of the two middle ones, not their mean.  Every
    median edgekit and its benchmarks take (a latency, a capture interval, a ratio) is this one.

Top-1 agreement
    An artifact agrees with the fp32 reference on a frame when both take the same best
    class.  A frame on which the reference itself is undecided (its two best classes
    within ``TIE_MARGIN`` = 10 points of softmax probability) has no single right answer,
    so a flip there is reported but does not count: ``agreement`` is measured on the
    decisive frames, or on every frame when none is decisive (a gate never passes on no
    evidence).  The build's accuracy gate, the device's health gate and the benchmark all
    call ``agreement``.

Pure Python, importing nothing else from edgekit: a device needs no numpy for this.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

#: Every percentile edgekit reports (p90 is SingleStream's headline); a report may show a subset.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 97.0, 99.0, 99.9)
#: A frame is decisive when the fp32 reference's two best softmax probabilities are at least this far apart.
TIE_MARGIN = 0.10

Method = Literal["loadgen", "linear"]


def percentile(sorted_values: Sequence[float], q: float, method: Method = "loadgen") -> float:
    """The ``q`` percentile (0-100) of already sorted values; NaN when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if method == "loadgen":
        return float(sorted_values[min(n - 1, int(n * q / 100))])
    if method == "linear":
        pos = (n - 1) * q / 100
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))
    raise ValueError(f"unknown percentile method {method!r} (loadgen or linear)")


def median(values: Iterable[float]) -> float:
    """The p50 of ``values`` in any order, by ``percentile``'s rule (an observed value); NaN when empty."""
    return percentile(sorted(values), 50.0)


def label(q: float) -> str:
    """``p50``, ``p99``, ``p99.9``: how a percentile is named in tables and JSON."""
    return f"p{q:g}"


def is_decisive(margin: float) -> bool:
    """Whether the reference's answer on a frame with this top-2 probability margin counts."""
    return margin >= TIE_MARGIN


@dataclass(frozen=True)
class Agreement:
    """How often an artifact's top-1 equals the reference's, under the tie rule.

    ``rate`` is the share of agreeing frames among the ``counted`` ones: the decisive
    frames, or every frame when none is decisive (None when there are no frames at all).
    ``all_rate`` counts every frame, near-ties included.  ``flipped`` are the indices of
    the frames whose top-1 changed, and ``near_tie`` says which frames are not decisive.
    """

    rate: float | None
    all_rate: float | None
    frames: int
    decisive: int
    counted: int
    flipped: tuple[int, ...]
    near_tie: tuple[bool, ...]

    def flipped_names(self, names: Sequence[str]) -> tuple[str, ...]:
        """The names of the flipped frames, a near-tie marked with a leading ``~``."""
        return tuple(("~" if self.near_tie[i] else "") + names[i] for i in self.flipped)


def agreement(got_top1: Sequence[int], ref_top1: Sequence[int], ref_margin: Sequence[float]) -> Agreement:
    """Top-1 agreement of ``got_top1`` with the reference's answers and margins, frame by frame."""
    if not len(got_top1) == len(ref_top1) == len(ref_margin):
        raise ValueError(
            f"agreement needs one answer and one margin per frame, got {len(got_top1)} answers, "
            f"{len(ref_top1)} reference answers and {len(ref_margin)} margins"
        )
    agree = [int(g) == int(r) for g, r in zip(got_top1, ref_top1, strict=True)]
    near_tie = tuple(not is_decisive(m) for m in ref_margin)
    n = len(agree)
    decisive = [a for a, tie in zip(agree, near_tie, strict=True) if not tie]
    counted = decisive or agree
    return Agreement(
        rate=sum(counted) / len(counted) if counted else None,
        all_rate=sum(agree) / n if n else None,
        frames=n,
        decisive=len(decisive),
        counted=len(counted),
        flipped=tuple(i for i, a in enumerate(agree) if not a),
        near_tie=near_tie,
    )
