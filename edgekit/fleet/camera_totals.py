"""A many-camera device's per-camera figures as the fleet keeps them: a ``FrameTally`` per camera
(frames, misses, drops and the merged latency sketch over some windows), how they add up, the
device page's camera table.

A window of a single-source pipeline has no ``cameras``; everything here then stays ``None``, so
such a device has no camera table and no camera series.  Latency percentiles of a camera come
from its merged sketches, never from averaged percentiles.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from edgekit.core.sketch import LatencySketch
from edgekit.core.tally import FrameTally

# Cameras kept per device and time step (or since the server started): a window holds at most 64,
# but a device may rename them over time, so sums fold the rest into OTHER (as classes are).
MAX_CAMERAS = 256
OTHER = "other"


def _slot(into: dict[str, FrameTally], name: str, cap: int) -> FrameTally:
    key = name if name in into or len(into) < cap - 1 else OTHER
    total = into.get(key)
    if total is None:
        total = into[key] = FrameTally()
    return total


def add_cameras(
    into: dict[str, FrameTally] | None, cameras: Mapping[str, Any] | None, cap: int = MAX_CAMERAS
) -> dict[str, FrameTally] | None:
    """Add a window's ``cameras`` (name -> its figures) into ``into``; ``None`` while no window had any."""
    if cameras is None:
        return into
    out = into if into is not None else {}
    for name, data in cameras.items():
        _slot(out, str(name), cap).add(data)
    return out


def merge_cameras(
    into: dict[str, FrameTally] | None, other: Mapping[str, FrameTally] | None, cap: int = MAX_CAMERAS
) -> dict[str, FrameTally] | None:
    """Add tallies (another step's, a bucket's) into ``into``; ``None`` while neither had cameras."""
    if other is None:
        return into
    out = into if into is not None else {}
    for name, tally in other.items():
        _slot(out, name, cap).merge(tally)
    return out


def _ms(sketch: LatencySketch, q: float) -> float | None:
    return round(sketch.quantile(q), 3) if sketch.count else None


def camera_table(steps: Iterable[Mapping[str, FrameTally] | None]) -> list[dict[str, Any]] | None:
    """The device page's camera rows (by name): frames, missed, dropped, p50 and p99 over the shown range.

    ``steps`` are the device's per-camera tallies of each step of the range, merged here.  ``None``
    for a device of fewer than two cameras: its own figures already say it all.
    """
    cameras: dict[str, FrameTally] | None = None
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
