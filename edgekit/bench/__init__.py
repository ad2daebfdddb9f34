"""``edgekit bench``: every candidate a bundle can run here, MLPerf-LoadGen-style SingleStream and at the camera rate.

``runner.plan`` lists the candidates (and what cannot run, with the reason), ``runner.run``
measures each in its own process into a ``report.Report`` (back to back, then paced at the
device's frame rate by ``edgekit.device.pacing``; selection ranks by the latter), ``stats`` holds the exact
percentiles and LoadGen's query-count rule, ``recording`` writes the measured choice into
the bundle, and ``render`` draws the table and the latency plot.

The names below are imported on first use: ``edgekit.load`` imports ``edgekit.bench.recording``
on every cold start, and must not pay for the runner (subprocess, the summary maths) there.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(("BenchCandidate", "Report", "Result", "Settings", "Skipped"), "report"),
    **dict.fromkeys(("plan", "run"), "runner"),
    **dict.fromkeys(("selection_from", "write_selection"), "recording"),
    **dict.fromkeys(("LatencySummary", "min_queries", "percentile", "summarize"), "loadgen"),
}

__all__ = [
    "BenchCandidate",
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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'edgekit.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgekit.bench.{_WHERE[name]}"), name)
