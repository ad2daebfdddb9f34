"""``edgekit bench``: MLPerf-LoadGen-style SingleStream measurement of every candidate a bundle can run here.

``runner.plan`` lists the candidates (and what cannot run, with the reason), ``runner.run``
measures each in its own process, ``stats`` holds the exact percentiles and LoadGen's
query-count rule, ``selection`` writes the measured choice into the bundle, and
``render`` draws the table and the latency plot.
"""

from __future__ import annotations

from edgekit.bench.runner import Candidate, Report, Result, Settings, Skipped, plan, run
from edgekit.bench.selection import selection_from, write_selection
from edgekit.bench.stats import LatencySummary, min_queries, percentile, summarize

__all__ = [
    "Candidate",
    "LatencySummary",
    "Report",
    "Result",
    "Settings",
    "Skipped",
    "min_queries",
    "percentile",
    "plan",
    "run",
    "selection_from",
    "summarize",
    "write_selection",
]
