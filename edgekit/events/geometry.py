"""Plane geometry for zones and lines, vectorised over the objects of one frame (numpy only).

Coordinates are frame pixels with y pointing down, as images are.  Each function takes every
object's point at once, so a frame with 100 objects costs one numpy call per zone or line,
not 100.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

Point = tuple[float, float]

#: Which point of a box stands for the object.  ``bottom_center`` (the feet of a person, the
#: wheels of a car) is what a floor zone or a line on the ground needs; supervision's
#: ``PolygonZone`` takes the same default.
Anchor = Literal[
    "bottom_center",
    "center",
    "top_center",
    "center_left",
    "center_right",
    "top_left",
    "top_right",
    "bottom_left",
    "bottom_right",
]
ANCHORS: tuple[Anchor, ...] = get_args(Anchor)  # the Literal's values, in its order: one list

# Each anchor as (weight of x0, weight of y0): x = x0 * wx + x1 * (1 - wx), likewise y.
_WEIGHTS: dict[str, tuple[float, float]] = {
    "bottom_center": (0.5, 0.0),
    "center": (0.5, 0.5),
    "top_center": (0.5, 1.0),
    "center_left": (1.0, 0.5),
    "center_right": (0.0, 0.5),
    "top_left": (1.0, 1.0),
    "top_right": (0.0, 1.0),
    "bottom_left": (1.0, 0.0),
    "bottom_right": (0.0, 0.0),
}


def anchor_points(boxes: FloatArray, anchor: Anchor) -> FloatArray:
    """The ``anchor`` point of each box: ``(n, 4)`` boxes ``x0, y0, x1, y1`` to ``(n, 2)`` points."""
    wx, wy = _WEIGHTS[anchor]
    x = boxes[:, 0] * wx + boxes[:, 2] * (1.0 - wx)
    y = boxes[:, 1] * wy + boxes[:, 3] * (1.0 - wy)
    return np.stack((x, y), axis=1)


def polygon_edges(polygon: FloatArray) -> FloatArray:
    """A ``(m, 2)`` polygon's edges as a ``(4, m)`` array of ``x0, y0, x1, y1`` rows.

    Worked out once per zone and frame size, so ``inside_polygon`` does not redo it per frame.
    """
    x0, y0 = polygon[:, 0], polygon[:, 1]
    return np.stack((x0, y0, np.roll(x0, -1), np.roll(y0, -1)))


def inside_polygon(points: FloatArray, edges: FloatArray) -> BoolArray:
    """Whether each of ``(n, 2)`` points lies inside the polygon of ``edges`` (even-odd ray casting).

    ``edges`` is ``polygon_edges(polygon)``.  A point exactly on an edge may fall either way;
    zones debounce that with their inertia.
    """
    if len(points) == 0:
        return np.zeros(0, dtype=np.bool_)
    px = points[:, 0:1]
    py = points[:, 1:2]
    x0, y0, x1, y1 = edges
    straddles = (y0 > py) != (y1 > py)
    # x where each edge meets the horizontal through the point; edges that do not straddle it
    # are masked out, so their division by a zero height never matters.
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x0 + (py - y0) * (x1 - x0) / (y1 - y0)
    hits = straddles & (px < x_cross)
    return np.asarray(np.count_nonzero(hits, axis=1) % 2 == 1)


def signed_distance(points: FloatArray, a: Point, b: Point) -> FloatArray:
    """Each point's distance from the infinite line through ``a`` and ``b``, in pixels.

    Positive on the right of ``a -> b`` as seen on the image (y down): for a line drawn left to
    right, below it.
    """
    ax, ay = a
    dx, dy = b[0] - ax, b[1] - ay
    length = float(np.hypot(dx, dy))
    return np.asarray((dx * (points[:, 1] - ay) - dy * (points[:, 0] - ax)) / length)


def paths_cross_segment(starts: FloatArray, ends: FloatArray, a: Point, b: Point) -> BoolArray:
    """Whether each move ``starts[i] -> ends[i]`` passes through the segment ``a``-``b``.

    The moves are known to change side of the infinite line; this says whether they do it
    between the segment's ends rather than around them.
    """
    a_arr = np.asarray(a, dtype=np.float64)
    seg = np.asarray(b, dtype=np.float64) - a_arr
    move = ends - starts
    denom = move[:, 0] * seg[1] - move[:, 1] * seg[0]
    rel = a_arr - starts
    with np.errstate(divide="ignore", invalid="ignore"):
        # Where along the segment (0 at a, 1 at b) the move meets its line.
        u = (rel[:, 0] * move[:, 1] - rel[:, 1] * move[:, 0]) / denom
    return np.asarray((denom != 0) & (u >= 0.0) & (u <= 1.0))


def _orientation(p: Point, q: Point, r: Point) -> float:
    return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])


def _segments_intersect(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    """Whether two closed segments share a point (touching and collinear overlap included)."""
    d1 = _orientation(q1, q2, p1)
    d2 = _orientation(q1, q2, p2)
    d3 = _orientation(p1, p2, q1)
    d4 = _orientation(p1, p2, q2)
    if ((d1 > 0) != (d2 > 0)) and d1 != 0 and d2 != 0 and ((d3 > 0) != (d4 > 0)) and d3 != 0 and d4 != 0:
        return True

    def on(p: Point, q: Point, r: Point) -> bool:
        return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(p[1], q[1])

    return (
        (d1 == 0 and on(q1, q2, p1))
        or (d2 == 0 and on(q1, q2, p2))
        or (d3 == 0 and on(p1, p2, q1))
        or (d4 == 0 and on(p1, p2, q2))
    )


def self_intersection(polygon: Sequence[Point]) -> tuple[int, int] | None:
    """The first pair of edges (by index, edge i runs from point i to i+1) that cross, or None.

    Adjacent edges share their common point and are not compared.  A polygon has a few dozen
    points at most, so the quadratic check runs once, when the configuration is read.
    """
    m = len(polygon)
    edges = [(polygon[i], polygon[(i + 1) % m]) for i in range(m)]
    for i in range(m):
        for j in range(i + 1, m):
            if j == i + 1 or (i == 0 and j == m - 1):
                continue
            if _segments_intersect(*edges[i], *edges[j]):
                return (i, j)
    return None


def area(polygon: Sequence[Point]) -> float:
    """The polygon's area (shoelace formula), positive whichever way it winds."""
    m = len(polygon)
    twice = sum(
        polygon[i][0] * polygon[(i + 1) % m][1] - polygon[(i + 1) % m][0] * polygon[i][1] for i in range(m)
    )
    return abs(twice) / 2.0
