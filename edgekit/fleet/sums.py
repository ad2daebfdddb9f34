"""Stored telemetry added up: sketch dicts summed (``SketchSum``), windows and rollups of one device and
time step summed (``WindowSum``) into a ``Bucket``, ``merge`` of sketch dicts, and a detector's
per-class counts (``ClassCount``s) summed by ``add_detections``.

The store decodes and sums thousands of stored windows per query or compaction; these sums
work on the decoded dicts and check the result once, which is what keeps that fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from edgekit.core.sketch import DEFAULT_ACCURACY, LatencySketch
from edgekit.core.tally import ClassCount, FrameTally
from edgekit.fleet.camera_totals import add_cameras

_fast_loads: Callable[[str], Any]
try:
    # Queries and compaction decode every stored window; orjson (edgekit[fleet]) does it 2-3x faster.
    from orjson import loads as _fast_loads
except ImportError:
    _fast_loads = json.loads


def loads(text: str) -> Any:
    """Stored JSON decoded (with orjson when installed)."""
    try:
        return _fast_loads(text)
    except ValueError:  # orjson refuses some JSON the standard library reads (integers past 64 bits)
        return json.loads(text)


# Classes kept per device and time step (or per device since the server started): a window holds
# at most 64, but a device may name other classes in each, so sums fold the rest into OTHER.
MAX_CLASSES = 256
OTHER = "other"


def add_detections(
    into: dict[str, ClassCount], counts: dict[str, Any], cap: int = MAX_CLASSES
) -> dict[str, ClassCount]:
    """Add per-class counts (a window's ``detections``, or stored sums' dicts) into ``into``, at most ``cap`` classes."""
    for name, c in counts.items():
        key = name if name in into or len(into) < cap - 1 else OTHER
        total = into.get(key)
        if total is None:
            total = into[key] = ClassCount()
        total.merge(c)
    return into


@dataclass(kw_only=True)
class Bucket(FrameTally):
    """One device's telemetry over one time step: its frame tally and merged stage sketches (``t0`` =
    the step's start).  Its ``dropped`` stays 0: a window's own figures carry none."""

    fleet: str
    device: str
    t0: float
    stages: dict[str, LatencySketch]
    #: A detector's per-class counts; ``None`` when no window of the step had any (a classifier).
    detections: dict[str, ClassCount] | None = None
    #: A many-camera device's figures per camera; ``None`` when no window of the step had any.
    cameras: dict[str, FrameTally] | None = None


class SketchSum:
    """Sketch dicts added up as dicts: the same result as ``LatencySketch.merge``, a few times faster.

    The fleet store sums thousands of windows per query or compaction; building and checking
    a ``LatencySketch`` per window cost most of that time.  Only sketches the collector has
    checked (or the store wrote) are summed; the total is checked once, by ``sketch()``.
    """

    __slots__ = ("accuracy", "buckets", "count", "max", "min", "sum", "zero")

    def __init__(self) -> None:
        self.accuracy: float | None = None
        self.buckets: dict[str, int] = {}
        self.zero = self.count = 0
        self.sum = 0.0
        self.min, self.max = math.inf, -math.inf

    def add(self, data: dict[str, Any]) -> None:
        if self.accuracy is None:
            self.accuracy = float(data["accuracy"])
        elif not math.isclose(float(data["accuracy"]), self.accuracy):
            raise ValueError(f"cannot merge sketches of accuracy {data['accuracy']} and {self.accuracy}")
        buckets = self.buckets
        for key, n in data["buckets"].items():
            buckets[key] = buckets.get(key, 0) + n
        self.zero += data["zero"]
        self.count += data["count"]
        self.sum += data["sum"]
        if data["count"]:
            self.min = min(self.min, data["min"])
            self.max = max(self.max, data["max"])

    def to_dict(self) -> dict[str, Any]:
        """As ``LatencySketch.to_dict`` writes it (buckets in key order)."""
        return {
            "accuracy": DEFAULT_ACCURACY if self.accuracy is None else self.accuracy,
            "count": self.count,
            "sum": self.sum,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
            "zero": self.zero,
            "buckets": {k: self.buckets[k] for k in sorted(self.buckets, key=int)},
        }

    def sketch(self) -> LatencySketch:
        return LatencySketch.from_dict(self.to_dict())


class WindowSum:
    """Windows (or rollups) of one device and time step being added up."""

    __slots__ = ("cameras", "detections", "frames", "latency", "missed", "stages", "stop", "windows")

    def __init__(self) -> None:
        self.frames = self.missed = self.windows = 0
        self.stop = -math.inf
        self.latency = SketchSum()
        self.stages: dict[str, SketchSum] = {}
        self.detections: dict[str, ClassCount] | None = None
        self.cameras: dict[str, FrameTally] | None = None

    def add(
        self,
        stop: float,
        frames: int,
        missed: int,
        latency: dict[str, Any],
        stages: dict[str, Any],
        windows: int = 1,
        detections: dict[str, Any] | None = None,
        cameras: dict[str, Any] | None = None,
    ) -> None:
        self.frames += int(frames)
        self.missed += int(missed)
        self.windows += int(windows)
        self.stop = max(self.stop, float(stop))
        self.latency.add(latency)
        for name, data in stages.items():
            total = self.stages.get(name)
            if total is None:
                total = self.stages[name] = SketchSum()
            total.add(data)
        if detections is not None:
            self.detections = add_detections(
                self.detections if self.detections is not None else {}, detections
            )
        self.cameras = add_cameras(self.cameras, cameras)

    def bucket(self, fleet: str, device: str, t0: float) -> Bucket:
        stages = {name: s.sketch() for name, s in self.stages.items()}
        return Bucket(
            fleet=fleet,
            device=device,
            t0=t0,
            frames=self.frames,
            missed=self.missed,
            latency=self.latency.sketch(),
            stages=stages,
            detections=self.detections,
            cameras=self.cameras,
        )


def merge(sketches: Iterable[dict[str, Any]]) -> LatencySketch:
    """Merge sketch dicts (as telemetry carries them) into one."""
    total = LatencySketch()
    for data in sketches:
        total.merge(LatencySketch.from_dict(data))
    return total
