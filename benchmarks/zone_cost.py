"""Zone cost: ``ZoneEngine.update`` per frame at 1, 20 and 100 objects, p50 and p99 in µs.

Four zones (quadrant-sized polygons, one with a dwell time and one with ``present``) and two
lines on a 1280 x 720 frame, counts every 10 s; objects move on straight paths that bounce off
the frame's edges, so they enter, leave and cross throughout, and one object in ten is a
predicted (missed) box on any frame.  Frames run at 30 fps of capture time, back to back.

    .venv/bin/python -m benchmarks.zone_cost [--frames 3000] [--objects 1 20 100]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgekit.core.stats import percentile
from edgekit.events.tracking import Track
from edgekit.events.zone_engine import ZoneEngine
from edgekit.events.zones import CameraRegions, Line, Zone

W, H = 1280, 720


REGIONS = CameraRegions(
    zones=(
        Zone("door", ((0.05, 0.1), (0.45, 0.1), (0.45, 0.45), (0.05, 0.45)), normalised=True, dwell_s=2.0),
        Zone("bay", ((0.55, 0.1), (0.95, 0.1), (0.95, 0.45), (0.7, 0.5), (0.55, 0.45)), normalised=True),
        Zone("lane", ((0.05, 0.55), (0.45, 0.55), (0.45, 0.9), (0.05, 0.9)), normalised=True, min_frames=15),
        Zone("dock", ((0.55, 0.55), (0.95, 0.55), (0.95, 0.9), (0.55, 0.9)), normalised=True, inertia=3),
    ),
    lines=(
        Line("gate", (0.0, 0.5), (1.0, 0.5), normalised=True),
        Line("aisle", (0.5, 0.0), (0.5, 1.0), normalised=True, directions=("east", "west")),
    ),
    count_interval_s=10.0,
)


def measure(objects: int, frames: int) -> tuple[float, float, int]:
    """(p50 µs, p99 µs, events) of ``frames`` updates with ``objects`` moving objects."""
    rng = np.random.default_rng(objects)
    pos = rng.uniform((0, 0), (W, H), size=(objects, 2))
    vel = rng.uniform(-12, 12, size=(objects, 2))
    names = [("person", "car", "bike")[i % 3] for i in range(objects)]
    engine = ZoneEngine("bench", REGIONS)
    times: list[float] = []
    events = 0
    for f in range(frames):
        t = f / 30.0
        pos += vel
        out = (pos < 0) | (pos > (W, H))
        vel[out] *= -1
        pos = np.clip(pos, 0, (W, H))
        tracks = [
            Track(i, i % 3, names[i], 0.9, (x - 20, y - 60, x + 20, y), f + 1, int((f + i) % 10 == 0), 0.0, t)
            for i, (x, y) in enumerate(pos.tolist())
        ]
        start = time.perf_counter_ns()
        events += len(engine.update(tracks, t, f, (W, H)))
        times.append((time.perf_counter_ns() - start) / 1000.0)
    times.sort()
    return percentile(times, 50), percentile(times, 99), events


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--objects", type=int, nargs="+", default=[1, 20, 100])
    args = ap.parse_args()
    print(f"ZoneEngine.update, 4 zones + 2 lines, {args.frames} frames each")
    print(f"{'objects':>8} {'p50 µs':>9} {'p99 µs':>9} {'events':>8}")
    for n in args.objects:
        p50, p99, events = measure(n, args.frames)
        print(f"{n:>8} {p50:>9.1f} {p99:>9.1f} {events:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
