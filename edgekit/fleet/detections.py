"""A detector's per-class counts as the fleet server shows them: the device page's class table
(over the window and its last few steps).

The counts themselves (``ClassCount``) are summed by :mod:`edgekit.fleet.sums` inside the view's
buckets (:class:`edgekit.fleet.charts.Tally`); this module only shapes them for reading.
"""

from __future__ import annotations

from typing import Any

from edgekit.core.tally import ClassCount
from edgekit.fleet.charts import Tally

DETECTION_STEPS = 6  # the most recent steps the device page lists a detector's classes for


def class_table(key: str, series: dict[int, dict[str, Tally]]) -> dict[str, Any] | None:
    """Device ``key``'s classes over the window and its last few steps (most objects first); ``None`` for a classifier.

    ``{"t": [step starts], "classes": [{"name", "frames", "objects", "max_score", "steps": [objects per step]}]}``
    """
    steps = {t: tally.detections for t, by in series.items() if (tally := by.get(key)) is not None}
    if all(counts is None for counts in steps.values()):
        return None
    total: Tally = Tally()
    for t in sorted(steps):
        total.merge(Tally(detections=steps[t]))
    recent = sorted(steps)[-DETECTION_STEPS:]
    classes = sorted((total.detections or {}).items(), key=lambda kv: (-kv[1].objects, kv[0]))
    return {
        "t": recent,
        "classes": [
            c.to_dict()
            | {"name": name, "steps": [(steps[t] or {}).get(name, ClassCount()).objects for t in recent]}
            for name, c in classes
        ],
    }
