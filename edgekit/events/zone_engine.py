"""Tracks of one camera in, zone and line events out, frame by frame.

Rules, in the order a person counting people or cars would ask about them:

* **Which point counts.**  Each zone and line takes one anchor point of the box
  (``bottom_center`` unless configured).
* **Enter and leave** happen when a track's anchor has been ``inertia`` seen frames on the new
  side of the zone's border (Frigate's zone inertia; 1 = at once).  A track that ends while
  inside leaves at the frame it is gone from the tracker's output.
* **Dwell**: once per stay, on the first seen frame at which the stay (from the first frame
  inside) has lasted ``dwell_s``.
* **Cross**: a line keeps, per track, the side its anchor was last *clearly* on (farther than
  ``margin_px`` from the line) and where.  A crossing counts when the anchor is next clearly on
  the other side and the move between those two points passes between the segment's ends:
  a box jittering on the line stays within the margin and changes nothing; going around the
  end of the segment changes side without counting.  This is hysteresis on one anchor, not
  supervision's "all four corners changed side" rule: one point per line keeps the direction
  well defined for boxes that are much larger than the margin.
* **Present**: once a class has been inside a zone for ``min_frames`` frames running, again
  only after it has been absent.
* **Count**: every ``count_interval_s`` of capture time, a summary of enters, leaves and
  crossings per class, and the occupancy at the end of the interval.
* **Predicted tracks** (``missed > 0``: the tracker's guess, not a detection) keep their state
  (a stay goes on, the side of a line is kept) but trigger nothing: no enter, leave, dwell or
  cross from a box nobody saw.  They still count as occupancy and for ``present``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgekit.events.event import Event, EventKind, event_id
from edgekit.events.geometry import (
    Anchor,
    FloatArray,
    Point,
    anchor_points,
    inside_polygon,
    paths_cross_segment,
    polygon_edges,
    signed_distance,
)
from edgekit.events.tracking import Track
from edgekit.events.zones import CameraRegions, Line, Zone

TrackKey = tuple[int, float]  # (id, first_t): a tracker that reuses an id starts a new track


@dataclass(slots=True)
class _Stay:
    inside: bool = False
    streak: int = 0  # seen frames in a row on the other side of ``inside``
    streak_t: float = 0.0  # when that streak began
    since_t: float = 0.0  # when the current stay began
    dwelt: bool = False


@dataclass(slots=True)
class _Side:
    side: int = 0  # -1 left, +1 right, 0 not yet clear
    point: Point = (0.0, 0.0)  # where the anchor last was clearly on ``side``


@dataclass(slots=True)
class _Presence:
    frames: int = 0
    since_t: float = 0.0
    sent: bool = False


def _tally() -> defaultdict[str, defaultdict[str, int]]:
    return defaultdict(lambda: defaultdict(int))


@dataclass(slots=True)
class _Window:
    start: float
    zones: dict[str, defaultdict[str, defaultdict[str, int]]] = field(default_factory=dict)
    lines: dict[str, defaultdict[str, defaultdict[str, int]]] = field(default_factory=dict)


class ZoneEngine:
    """The zones and lines of one camera; ``update`` once per frame with that frame's tracks."""

    def __init__(self, camera: str, regions: CameraRegions) -> None:
        self.camera = camera
        self.regions = regions
        self._size: tuple[int, int] | None = None
        self._edges: list[FloatArray] = []
        self._segments: list[tuple[Point, Point]] = []
        self._stays: list[dict[TrackKey, _Stay]] = [{} for _ in regions.zones]
        self._sides: list[dict[TrackKey, _Side]] = [{} for _ in regions.lines]
        self._presence: list[dict[str, _Presence]] = [{} for _ in regions.zones]
        # Per track, how many events of each (kind, place) it has had: the last part of their ids.
        self._seq: dict[TrackKey, dict[tuple[str, str], int]] = {}
        self._last: dict[TrackKey, Track] = {}
        self._window: _Window | None = None

    # -- the frame loop ---------------------------------------------------------------------

    def update(
        self, tracks: Sequence[Track], t: float, frame_index: int, size: tuple[int, int]
    ) -> list[Event]:
        """This frame's events, given every track the tracker reports for it (seen or predicted)."""
        if size != self._size:
            self._resolve(size)
        events: list[Event] = []
        self._close_window(t, frame_index, events)
        assert self._window is not None
        current = {(tr.id, tr.first_t): tr for tr in tracks}
        keys = list(current)
        self._ended(current, t, frame_index, events)
        if keys:
            boxes = np.asarray([current[k].box for k in keys], dtype=np.float64)
            seen = np.asarray([current[k].missed == 0 for k in keys], dtype=np.bool_)
            anchors: dict[Anchor, FloatArray] = {}
            for zi, zone in enumerate(self.regions.zones):
                pts = anchors.get(zone.anchor)
                if pts is None:
                    pts = anchors[zone.anchor] = anchor_points(boxes, zone.anchor)
                inside = inside_polygon(pts, self._edges[zi])
                self._zone(zi, zone, keys, current, inside, seen, t, frame_index, events)
            for li, line in enumerate(self.regions.lines):
                pts = anchors.get(line.anchor)
                if pts is None:
                    pts = anchors[line.anchor] = anchor_points(boxes, line.anchor)
                self._line(li, line, keys, current, pts, seen, t, frame_index, events)
        for zi, zone in enumerate(self.regions.zones):
            self._present(zi, zone, current, t, frame_index, events)
        self._last = current
        return events

    def flush(self, t: float, frame_index: int) -> list[Event]:
        """At the end of a run: the partial interval's ``count`` event and the open stays' ``leave``."""
        events: list[Event] = []
        self._ended({}, t, frame_index, events)
        self._last = {}
        if self._window is not None and self.regions.count_interval_s is not None:
            events.append(self._count_event(t, frame_index))
            self._window = _Window(start=t)
        return events

    # -- zones ------------------------------------------------------------------------------

    def _zone(
        self,
        zi: int,
        zone: Zone,
        keys: list[TrackKey],
        current: dict[TrackKey, Track],
        inside: np.ndarray,
        seen: np.ndarray,
        t: float,
        frame_index: int,
        events: list[Event],
    ) -> None:
        stays = self._stays[zi]
        for i, key in enumerate(keys):
            track = current[key]
            if not zone.admits(track.name):
                continue
            stay = stays.get(key)
            if stay is None:
                stay = stays[key] = _Stay()
            if not seen[i]:
                continue
            now_inside = bool(inside[i])
            if now_inside == stay.inside:
                stay.streak = 0
            else:
                if stay.streak == 0:
                    stay.streak_t = t
                stay.streak += 1
                if stay.streak >= zone.inertia:
                    stay.inside, stay.streak = now_inside, 0
                    if now_inside:
                        stay.since_t, stay.dwelt = stay.streak_t, False
                        events.append(self._track_event("enter", zone.name, track, t, frame_index))
                        self._tally(self._window_zone(zone.name), "enter", track.name)
                    else:
                        # The stay lasted until the first frame outside, not until inertia agreed.
                        events.append(self._leave(zone.name, track, stay, t, frame_index, stay.streak_t))
            if (
                stay.inside
                and not stay.dwelt
                and zone.dwell_s is not None
                and t - stay.since_t >= zone.dwell_s
            ):
                stay.dwelt = True
                events.append(
                    self._track_event(
                        "dwell",
                        zone.name,
                        track,
                        t,
                        frame_index,
                        dwell_s=t - stay.since_t,
                        since_t=stay.since_t,
                    )
                )

    def _leave(
        self, zone: str, track: Track, stay: _Stay, t: float, frame_index: int, left_t: float
    ) -> Event:
        self._tally(self._window_zone(zone), "leave", track.name)
        return self._track_event(
            "leave", zone, track, t, frame_index, dwell_s=left_t - stay.since_t, since_t=stay.since_t
        )

    def _ended(self, current: dict[TrackKey, Track], t: float, frame_index: int, events: list[Event]) -> None:
        gone = [k for k in self._last if k not in current]
        for key in gone:
            track = self._last[key]
            for zone, stays in zip(self.regions.zones, self._stays, strict=True):
                stay = stays.pop(key, None)
                if stay is not None and stay.inside:
                    events.append(self._leave(zone.name, track, stay, t, frame_index, t))
            for sides in self._sides:
                sides.pop(key, None)
            self._seq.pop(key, None)

    def _present(
        self,
        zi: int,
        zone: Zone,
        current: dict[TrackKey, Track],
        t: float,
        frame_index: int,
        events: list[Event],
    ) -> None:
        if zone.min_frames <= 0:
            return
        # Stays of ended tracks were dropped already, so every stay here is a current track's.
        here = {current[k].name for k, s in self._stays[zi].items() if s.inside}
        presence = self._presence[zi]
        for name in list(presence):
            if name not in here:
                del presence[name]
        for name in sorted(here):
            p = presence.get(name)
            if p is None:
                p = presence[name] = _Presence(since_t=t)
            p.frames += 1
            if p.frames >= zone.min_frames and not p.sent:
                p.sent = True
                events.append(
                    Event(
                        id=event_id(self.camera, "present", zone.name, name, p.since_t),
                        kind="present",
                        camera=self.camera,
                        zone=zone.name,
                        t=t,
                        frame_index=frame_index,
                        class_name=name,
                        since_t=p.since_t,
                    )
                )

    # -- lines ------------------------------------------------------------------------------

    def _line(
        self,
        li: int,
        line: Line,
        keys: list[TrackKey],
        current: dict[TrackKey, Track],
        pts: FloatArray,
        seen: np.ndarray,
        t: float,
        frame_index: int,
        events: list[Event],
    ) -> None:
        a, b = self._segments[li]
        dist = signed_distance(pts, a, b)
        clear = np.where(dist > line.margin_px, 1, np.where(dist < -line.margin_px, -1, 0))
        sides = self._sides[li]
        flips: list[tuple[int, TrackKey, int]] = []
        for i, key in enumerate(keys):
            side = int(clear[i])
            if side == 0 or not line.admits(current[key].name):
                continue
            state = sides.get(key)
            if state is None:
                sides[key] = _Side(side=side, point=(float(pts[i, 0]), float(pts[i, 1])))
            elif state.side == side:
                state.point = (float(pts[i, 0]), float(pts[i, 1]))
            elif seen[i]:
                flips.append((i, key, side))
            # A predicted box on the other side changes nothing: the next seen one decides.
        if not flips:
            return
        idx = [i for i, _, _ in flips]
        starts = np.asarray([sides[k].point for _, k, _ in flips], dtype=np.float64)
        through = paths_cross_segment(starts, pts[idx], a, b)
        for (i, key, side), crossed in zip(flips, through, strict=True):
            sides[key] = _Side(side=side, point=(float(pts[i, 0]), float(pts[i, 1])))
            if crossed:
                track = current[key]
                direction = line.directions[0] if side > 0 else line.directions[1]
                events.append(
                    self._track_event("cross", line.name, track, t, frame_index, direction=direction)
                )
                self._tally(self._window_line(line.name), direction, track.name)

    # -- counts per interval ----------------------------------------------------------------

    def _close_window(self, t: float, frame_index: int, events: list[Event]) -> None:
        interval = self.regions.count_interval_s
        if self._window is None:
            self._window = _Window(start=t)
            return
        if interval is None or t < self._window.start + interval:
            return
        end = self._window.start + interval
        events.append(self._count_event(end, frame_index))
        # Skip whole intervals with no frames (a camera outage) rather than report empty ones.
        start = end + interval * int((t - end) // interval)
        self._window = _Window(start=start)

    def _count_event(self, end: float, frame_index: int) -> Event:
        assert self._window is not None
        zones: dict[str, dict[str, dict[str, int]]] = {}
        for zone, stays in zip(self.regions.zones, self._stays, strict=True):
            tally = self._window.zones.get(zone.name, _tally())
            occupancy: defaultdict[str, int] = defaultdict(int)
            for key, stay in stays.items():
                if stay.inside and key in self._last:
                    occupancy[self._last[key].name] += 1
            zones[zone.name] = {
                "enter": dict(tally["enter"]),
                "leave": dict(tally["leave"]),
                "occupancy": dict(occupancy),
            }
        lines = {
            line.name: {d: dict(self._window.lines.get(line.name, _tally())[d]) for d in line.directions}
            for line in self.regions.lines
        }
        start = self._window.start
        return Event(
            id=event_id(self.camera, "count", start),
            kind="count",
            camera=self.camera,
            zone=None,
            t=end,
            frame_index=frame_index,
            since_t=start,
            counts={"zones": zones, "lines": lines},
        )

    def _window_zone(self, name: str) -> defaultdict[str, defaultdict[str, int]]:
        assert self._window is not None
        return self._window.zones.setdefault(name, _tally())

    def _window_line(self, name: str) -> defaultdict[str, defaultdict[str, int]]:
        assert self._window is not None
        return self._window.lines.setdefault(name, _tally())

    @staticmethod
    def _tally(table: defaultdict[str, defaultdict[str, int]], what: str, class_name: str) -> None:
        table[what][class_name] += 1

    # -- helpers ----------------------------------------------------------------------------

    def _resolve(self, size: tuple[int, int]) -> None:
        # Fractions of the frame follow the frame: a camera that changes resolution keeps its zones.
        self._size = size
        self._edges = [polygon_edges(z.resolve(size)) for z in self.regions.zones]
        self._segments = [ln.resolve(size) for ln in self.regions.lines]

    def _next(self, track: TrackKey, kind: str, place: str) -> int:
        counts = self._seq.setdefault(track, {})
        counts[(kind, place)] = counts.get((kind, place), 0) + 1
        return counts[(kind, place)]

    def _track_event(
        self,
        kind: EventKind,
        place: str,
        track: Track,
        t: float,
        frame_index: int,
        *,
        direction: str | None = None,
        dwell_s: float | None = None,
        since_t: float | None = None,
    ) -> Event:
        x0, y0, x1, y1 = track.box
        seq = self._next((track.id, track.first_t), kind, place)
        return Event(
            id=event_id(self.camera, kind, place, track.id, track.first_t, seq),
            kind=kind,
            camera=self.camera,
            zone=place,
            t=t,
            frame_index=frame_index,
            track_id=track.id,
            class_name=track.name,
            direction=direction,
            dwell_s=dwell_s,
            since_t=since_t,
            box=(float(x0), float(y0), float(x1), float(y1)),
        )
