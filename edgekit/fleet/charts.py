"""What the dashboard's charts draw, from merged telemetry: ``Tally`` (the frame tally and merged sketches
of some windows) and ``chart_series``, which turns per-step tallies into the latency, stage and
miss-rate heatmap series of a snapshot.

Every percentile here comes from a merged sketch: a step's fleet p99 is the p99 of all its
devices' windows together, never an average of per-device p99s.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit.core.sketch import LatencySketch
from edgekit.core.tally import ClassCount, FrameTally
from edgekit.fleet.camera_totals import add_cameras, merge_cameras
from edgekit.fleet.sums import Bucket, add_detections
from edgekit.protocol.stages import STAGES


@dataclass(kw_only=True)
class Tally(FrameTally):
    """The frame tally of some windows (one step, or since start) with their merged stage sketches,
    a detector's per-class counts and a many-camera device's per-camera tallies."""

    stages: dict[str, LatencySketch] = field(default_factory=lambda: {s: LatencySketch() for s in STAGES})
    #: A detector's per-class counts (bounded: ``sums.MAX_CLASSES``); ``None`` until a window has them.
    detections: dict[str, ClassCount] | None = None
    #: A many-camera device's figures per camera; ``None`` for a single-source device.
    cameras: dict[str, FrameTally] | None = None

    @classmethod
    def of(cls, b: Bucket) -> Tally:
        """A store's bucket as a tally (its sketches are the bucket's own: merge it, do not keep it)."""
        return cls(
            frames=b.frames,
            missed=b.missed,
            dropped=b.dropped,
            latency=b.latency,
            stages=dict(b.stages),
            detections=b.detections,
            cameras=b.cameras,
        )

    def add(self, window: Mapping[str, Any]) -> None:
        """Fold in one window as the collector accepted it (its sketches were checked there)."""
        super().add(window)
        for stage, data in (window.get("stages_ms") or {}).items():
            if stage in self.stages:
                self.stages[stage].merge_dict(data)
        counts = window.get("detections")
        if counts is not None:
            self.detections = add_detections(self.detections if self.detections is not None else {}, counts)
        self.cameras = add_cameras(self.cameras, window.get("cameras"))

    def merge(self, other: FrameTally) -> None:
        """Add another tally; of another ``Tally``, its stages, classes and cameras too (copied)."""
        super().merge(other)
        if not isinstance(other, Tally):
            return
        for stage, sketch in other.stages.items():
            self.stages[stage].merge(sketch)
        if other.detections is not None:
            self.detections = add_detections(
                self.detections if self.detections is not None else {}, other.detections
            )
        self.cameras = merge_cameras(self.cameras, other.cameras)


def quantile(sketch: LatencySketch, q: float) -> float | None:
    """The sketch's ``q`` quantile in ms, rounded for the JSON; ``None`` when it holds nothing."""
    value = sketch.quantile(q)
    return None if math.isnan(value) else round(value, 3)


def duration(seconds: float) -> str:
    """``95 s``, ``12 min``, ``3 h 5 min``: how long an alert has held."""
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def rate(missed: int, frames: int) -> float | None:
    """The share of frames missed, ``None`` without frames."""
    return round(missed / frames, 5) if frames else None


@dataclass
class Charts:
    """A snapshot's series, and the tallies they were drawn from (the table and groups reuse them)."""

    per_device: dict[str, Tally]  # each device key over the whole window
    total: Tally  # the fleet over the whole window
    latency: dict[str, list[Any]]  # t, p50, p95, p99, miss_rate: one value per step
    stages: dict[str, Any]  # t, then per stage its p50 and p99 series, then totals
    heatmap: dict[str, Any]  # t, devices, and per device its miss rate per step


def chart_series(series: dict[int, dict[str, Tally]], keys: Iterable[str]) -> Charts:
    """The charts of ``series`` (per step start, per device key, a tally) for the devices ``keys``."""
    times = sorted(series)
    per_device: dict[str, Tally] = defaultdict(Tally)
    latency: dict[str, list[Any]] = {"t": list(times), "p50": [], "p95": [], "p99": [], "miss_rate": []}
    stages: dict[str, Any] = {"t": times} | {s: {"p50": [], "p99": []} for s in STAGES}
    for t in times:
        merged = Tally()
        for key, b in series[t].items():
            per_device[key].merge(b)
            merged.merge(b)
        for q in (50, 95, 99):
            latency[f"p{q}"].append(quantile(merged.latency, q / 100))
        latency["miss_rate"].append(rate(merged.missed, merged.frames))
        for s in STAGES:
            stages[s]["p50"].append(quantile(merged.stages[s], 0.5))
            stages[s]["p99"].append(quantile(merged.stages[s], 0.99))
    total = Tally()
    for b in per_device.values():
        total.merge(b)
    stages["totals"] = {
        s: {"p50": quantile(total.stages[s], 0.5), "p99": quantile(total.stages[s], 0.99)} for s in STAGES
    }
    heat_devices = sorted(keys)
    heatmap = {
        "t": times,
        "devices": heat_devices,
        "miss_rate": [
            [rate(cell.missed, cell.frames) if (cell := series[t].get(k)) else None for t in times]
            for k in heat_devices
        ],
    }
    return Charts(dict(per_device), total, latency, stages, heatmap)
