"""Zones and lines of one camera, as the run configuration states them, checked when read.

In the run TOML each camera lists its zones and lines by name::

    [cameras.door]
    count_interval_s = 60

    [cameras.door.zones.bay]            # a polygon, here in fractions of the frame
    polygon = [[0.1, 0.5], [0.9, 0.5], [0.9, 1.0], [0.1, 1.0]]
    classes = ["person"]                # only these classes; all when left out
    dwell_s = 30                        # a `dwell` event once a stay reaches 30 s
    min_frames = 10                     # a `present` event once a class is in it 10 frames running
    inertia = 3                         # frames on the new side before enter/leave counts

    [cameras.door.lines.gate]           # a segment; crossing it left to right of a->b is "in"
    a = [0, 400]
    b = [1280, 400]
    directions = ["in", "out"]

Coordinates are frame pixels, or fractions of the frame when every coordinate lies within
[0, 1] (or ``normalised = true`` says so); fractions resolve against the frame size on the
first frame, and again when the size changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from edgekit.errors import EdgekitError
from edgekit.events.geometry import ANCHORS, Anchor, FloatArray, Point, area, self_intersection

_ZONE_KEYS = ("polygon", "normalised", "classes", "anchor", "dwell_s", "min_frames", "inertia")
_LINE_KEYS = ("a", "b", "normalised", "classes", "anchor", "directions", "margin_px")


@dataclass(frozen=True, slots=True)
class Zone:
    """A polygon; objects whose anchor point is inside it are in the zone.

    ``inertia`` is Frigate's: a track counts as inside (or outside again) only after that many
    consecutive seen frames on the new side, so a box flickering on the border does not enter
    and leave on every frame.  ``min_frames`` > 0 asks for a ``present`` event once a class has
    been in the zone that many frames running.
    """

    name: str
    polygon: tuple[Point, ...]
    normalised: bool = False
    classes: frozenset[str] | None = None
    anchor: Anchor = "bottom_center"
    dwell_s: float | None = None
    min_frames: int = 0
    inertia: int = 1

    def __post_init__(self) -> None:
        where = f"zone {self.name!r}"
        if len(self.polygon) < 3:
            raise EdgekitError(
                f"{where} has {len(self.polygon)} point(s); a polygon needs at least 3",
                "list the corners in order, e.g. polygon = [[0.1, 0.5], [0.9, 0.5], [0.5, 1.0]]",
            )
        _check_points(where, self.polygon, self.normalised)
        crossing = self_intersection(self.polygon)
        if crossing is not None:
            i, j = crossing
            raise EdgekitError(
                f"{where}'s polygon crosses itself (edge {i}->{i + 1} meets edge {j}->{(j + 1) % len(self.polygon)})",
                "list the corners in order around the zone, clockwise or anticlockwise",
            )
        if area(self.polygon) == 0.0:
            raise EdgekitError(
                f"{where}'s polygon has no area", "its corners lie on one line; spread them out"
            )
        _check_common(where, self.anchor)
        if self.dwell_s is not None and not (math.isfinite(self.dwell_s) and self.dwell_s > 0):
            raise EdgekitError(
                f"{where}: dwell_s is {self.dwell_s}", "give a time in seconds above 0, or leave it out"
            )
        if self.min_frames < 0:
            raise EdgekitError(
                f"{where}: min_frames is {self.min_frames}", "give 0 (no present events) or more"
            )
        if self.inertia < 1:
            raise EdgekitError(f"{where}: inertia is {self.inertia}", "give 1 (no debouncing) or more frames")

    def resolve(self, size: tuple[int, int]) -> FloatArray:
        """The polygon in pixels of a frame of ``size`` (width, height), as an ``(m, 2)`` array."""
        pts = np.asarray(self.polygon, dtype=np.float64)
        return pts * np.asarray(size, dtype=np.float64) if self.normalised else pts

    def admits(self, class_name: str) -> bool:
        """Whether objects of this class count in this zone."""
        return self.classes is None or class_name in self.classes


@dataclass(frozen=True, slots=True)
class Line:
    """A segment from ``a`` to ``b``; an object crosses it when its anchor passes through it.

    ``directions[0]`` names a crossing from the left of ``a -> b`` to its right, as seen on the
    image (for a line drawn left to right: from above to below it); ``directions[1]`` the other
    way.  ``margin_px`` is the hysteresis: an anchor within that distance of the line has not
    left its side yet, so a box jittering on the line is not counted again and again.
    """

    name: str
    a: Point
    b: Point
    normalised: bool = False
    classes: frozenset[str] | None = None
    anchor: Anchor = "bottom_center"
    directions: tuple[str, str] = ("in", "out")
    margin_px: float = 4.0

    def __post_init__(self) -> None:
        where = f"line {self.name!r}"
        _check_points(where, (self.a, self.b), self.normalised)
        if self.a == self.b:
            raise EdgekitError(f"{where} starts and ends at {self.a}", "give two different points a and b")
        _check_common(where, self.anchor)
        if len(self.directions) != 2 or self.directions[0] == self.directions[1] or not all(self.directions):
            raise EdgekitError(
                f"{where}: directions are {list(self.directions)}",
                'name the two ways across with two different words, e.g. directions = ["in", "out"]',
            )
        if not (math.isfinite(self.margin_px) and self.margin_px >= 0):
            raise EdgekitError(
                f"{where}: margin_px is {self.margin_px}", "give a distance in pixels, 0 or more"
            )

    def resolve(self, size: tuple[int, int]) -> tuple[Point, Point]:
        """The segment's ends in pixels of a frame of ``size`` (width, height)."""
        if not self.normalised:
            return self.a, self.b
        w, h = size
        return (self.a[0] * w, self.a[1] * h), (self.b[0] * w, self.b[1] * h)

    def admits(self, class_name: str) -> bool:
        """Whether objects of this class are counted on this line."""
        return self.classes is None or class_name in self.classes


@dataclass(frozen=True, slots=True)
class CameraRegions:
    """Every zone and line of one camera, and how often their counts are summed up."""

    zones: tuple[Zone, ...] = ()
    lines: tuple[Line, ...] = ()
    count_interval_s: float | None = 60.0


def _check_points(where: str, points: tuple[Point, ...], normalised: bool) -> None:
    for x, y in points:
        if not (math.isfinite(x) and math.isfinite(y)):
            raise EdgekitError(f"{where} has a point ({x}, {y}) that is not a finite number", "give numbers")
        if normalised and not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise EdgekitError(
                f"{where} is normalised but has the point ({x}, {y}) outside [0, 1]",
                "give fractions of the frame's width and height, or pixels with normalised = false",
            )


def _check_common(where: str, anchor: str) -> None:
    if anchor not in ANCHORS:
        raise EdgekitError(f"{where}: unknown anchor {anchor!r}", f"use one of: {', '.join(ANCHORS)}")


def _point(where: str, value: object) -> Point:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        raise EdgekitError(f"{where}: {value!r} is not a point", "write a point as [x, y], e.g. [0.5, 0.25]")
    return (float(value[0]), float(value[1]))


def _normalised(where: str, table: Mapping[str, Any], points: list[Point]) -> bool:
    stated = table.get("normalised")
    if stated is None:
        # A polygon in pixels that fits in [0, 1] would cover one pixel: such coordinates are fractions.
        return all(0.0 <= v <= 1.0 for p in points for v in p)
    if not isinstance(stated, bool):
        raise EdgekitError(f"{where}: normalised is {stated!r}", "write normalised = true or false")
    return stated


def _classes(where: str, value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(c, str) and c for c in value):
        raise EdgekitError(
            f"{where}: classes is {value!r}", 'list class names, e.g. classes = ["person", "car"]'
        )
    return frozenset(cast("list[str]", value))


def _known_keys(where: str, table: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise EdgekitError(f"{where}: unknown setting(s) {', '.join(unknown)}", f"known: {', '.join(known)}")


def _number(where: str, key: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise EdgekitError(f"{where}: {key} is {value!r}", f"give {key} as a number")
    return float(value)


def _count(where: str, key: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise EdgekitError(f"{where}: {key} is {value!r}", f"give {key} as a whole number of frames")
    return value


def zone_from_dict(name: str, table: Mapping[str, Any]) -> Zone:
    """A zone from its table in the run configuration (``[cameras.<camera>.zones.<name>]``)."""
    where = f"zone {name!r}"
    _known_keys(where, table, _ZONE_KEYS)
    raw = table.get("polygon")
    if not isinstance(raw, list | tuple):
        raise EdgekitError(f"{where} has no polygon", "add polygon = [[x, y], [x, y], [x, y], ...]")
    points = [_point(where, p) for p in raw]
    dwell = table.get("dwell_s")
    return Zone(
        name=name,
        polygon=tuple(points),
        normalised=_normalised(where, table, points),
        classes=_classes(where, table.get("classes")),
        anchor=cast("Anchor", table.get("anchor", "bottom_center")),
        dwell_s=None if dwell is None else _number(where, "dwell_s", dwell),
        min_frames=_count(where, "min_frames", table.get("min_frames", 0)),
        inertia=_count(where, "inertia", table.get("inertia", 1)),
    )


def line_from_dict(name: str, table: Mapping[str, Any]) -> Line:
    """A line from its table in the run configuration (``[cameras.<camera>.lines.<name>]``)."""
    where = f"line {name!r}"
    _known_keys(where, table, _LINE_KEYS)
    if "a" not in table or "b" not in table:
        raise EdgekitError(f"{where} needs both ends", "add a = [x, y] and b = [x, y]")
    a, b = _point(where, table["a"]), _point(where, table["b"])
    directions = table.get("directions", ["in", "out"])
    if not isinstance(directions, list | tuple) or not all(isinstance(d, str) for d in directions):
        raise EdgekitError(f"{where}: directions is {directions!r}", 'write directions = ["in", "out"]')
    return Line(
        name=name,
        a=a,
        b=b,
        normalised=_normalised(where, table, [a, b]),
        classes=_classes(where, table.get("classes")),
        anchor=cast("Anchor", table.get("anchor", "bottom_center")),
        directions=cast("tuple[str, str]", tuple(directions)),
        margin_px=_number(where, "margin_px", table.get("margin_px", 4.0)),
    )


def regions_from_dict(camera: Mapping[str, Any]) -> CameraRegions:
    """A camera's zones, lines and count interval from its table; other settings are left alone."""
    zones_table = camera.get("zones", {})
    lines_table = camera.get("lines", {})
    for key, value in (("zones", zones_table), ("lines", lines_table)):
        if not isinstance(value, Mapping) or not all(isinstance(v, Mapping) for v in value.values()):
            raise EdgekitError(
                f"{key} is not a table of named {key}", f"write [cameras.<camera>.{key}.<name>] tables"
            )
    zones = tuple(zone_from_dict(str(n), t) for n, t in zones_table.items())
    lines = tuple(line_from_dict(str(n), t) for n, t in lines_table.items())
    shared = sorted({z.name for z in zones} & {ln.name for ln in lines})
    if shared:
        raise EdgekitError(
            f"{', '.join(shared)} names both a zone and a line",
            "give each zone and line of a camera its own name",
        )
    interval = camera.get("count_interval_s", 60.0)
    if interval is not None:
        interval = _number("count_interval_s", "count_interval_s", interval)
        if not (math.isfinite(interval) and interval > 0):
            raise EdgekitError(
                f"count_interval_s is {interval}", "give seconds above 0, or leave it out for 60"
            )
    return CameraRegions(zones=zones, lines=lines, count_interval_s=interval)
