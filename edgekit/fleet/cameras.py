"""A many-camera device's per-camera figures as the fleet keeps them: ``CameraTally`` (frames, misses,
drops and the merged latency sketch of one camera over some windows), how they add up, the device
page's camera table and the copy ``/metrics`` reads.

A window of a single-source pipeline has no ``cameras``; everything here then stays ``None``, so
such a device has no camera table and no camera series.  Latency percentiles of a camera come
from its merged sketches, never from averaged percentiles.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edgekit._core.sketch import LatencySketch

# Cameras kept per device and time step (or since the server started): a window holds at most 64,
# but a device may rename them over time, so sums fold the rest into OTHER (as classes are).
MAX_CAMERAS = 256
OTHER = "other"


@dataclass
class CameraTally:
    """One camera over some windows: frames, frames over budget, frames dropped, merged latency (ms)."""

    frames: int = 0
    missed: int = 0
    dropped: int = 0
    latency: LatencySketch = field(default_factory=LatencySketch)

    def add(self, data: Mapping[str, Any]) -> None:
        """Fold in a window's (or a stored rollup's) ``{frames, missed, dropped, latency_ms}``, checked already."""
        self.frames += int(data["frames"])
        self.missed += int(data["missed"])
        self.dropped += int(data["dropped"])
        self.latency.merge_dict(data["latency_ms"])

    def merge(self, other: CameraTally) -> None:
        self.frames += other.frames
        self.missed += other.missed
        self.dropped += other.dropped
        self.latency.merge(other.latency)

    def copy(self) -> CameraTally:
        out = CameraTally(self.frames, self.missed, self.dropped)
        out.latency.merge(self.latency)
        return out

    def to_dict(self) -> dict[str, Any]:
        """As a window carries it (what a rollup row is built from)."""
        return {
            "frames": self.frames,
            "missed": self.missed,
            "dropped": self.dropped,
            "latency_ms": self.latency.to_dict(),
        }


def _slot(into: dict[str, CameraTally], name: str, cap: int) -> CameraTally:
    key = name if name in into or len(into) < cap - 1 else OTHER
    total = into.get(key)
    if total is None:
        total = into[key] = CameraTally()
    return total


def add_cameras(
    into: dict[str, CameraTally] | None, cameras: Mapping[str, Any] | None, cap: int = MAX_CAMERAS
) -> dict[str, CameraTally] | None:
    """Add a window's ``cameras`` (name -> its figures) into ``into``; ``None`` while no window had any."""
    if cameras is None:
        return into
    out = into if into is not None else {}
    for name, data in cameras.items():
        _slot(out, str(name), cap).add(data)
    return out


def merge_cameras(
    into: dict[str, CameraTally] | None, other: Mapping[str, CameraTally] | None, cap: int = MAX_CAMERAS
) -> dict[str, CameraTally] | None:
    """Add tallies (another step's, a bucket's) into ``into``; ``None`` while neither had cameras."""
    if other is None:
        return into
    out = into if into is not None else {}
    for name, tally in other.items():
        _slot(out, name, cap).merge(tally)
    return out


def cameras_copy(cameras: Mapping[str, CameraTally] | None) -> dict[str, CameraTally] | None:
    """A device's per-camera totals copied for ``/metrics`` (read outside the view's lock)."""
    return None if cameras is None else {name: t.copy() for name, t in cameras.items()}


def _ms(sketch: LatencySketch, q: float) -> float | None:
    return round(sketch.quantile(q), 3) if sketch.count else None


def camera_table(steps: Iterable[Mapping[str, CameraTally] | None]) -> list[dict[str, Any]] | None:
    """The device page's camera rows (by name): frames, missed, dropped, p50 and p99 over the shown range.

    ``steps`` are the device's per-camera tallies of each step of the range, merged here.  ``None``
    for a device of fewer than two cameras: its own figures already say it all.
    """
    cameras: dict[str, CameraTally] | None = None
    for step in steps:
        cameras = merge_cameras(cameras, step)
    if cameras is None or len(cameras) < 2:
        return None
    return [
        {
            "name": name,
            "frames": t.frames,
            "missed": t.missed,
            "dropped": t.dropped,
            "p50": _ms(t.latency, 0.5),
            "p99": _ms(t.latency, 0.99),
        }
        for name, t in sorted(cameras.items())
    ]
