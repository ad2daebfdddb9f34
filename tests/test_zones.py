"""Zones and lines: made-up tracks on known paths, and the events (and frames) they must give."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from edgekit.detection.detector import Detection
from edgekit.errors import EdgekitError
from edgekit.events.event import Event
from edgekit.events.tracking import Track, Tracker
from edgekit.events.zone_engine import ZoneEngine
from edgekit.events.zones import CameraRegions, Line, Zone, line_from_dict, regions_from_dict, zone_from_dict

SIZE = (640, 480)
DT = 0.125  # 8 fps: frame times are exact in binary, so "at 1.0 s" is one frame, not a rounding


def track(tid: int, x: float, bottom: float, i: int, *, name: str = "person", missed: int = 0) -> Track:
    """A 20 x 40 box whose bottom centre is at (x, bottom), at frame i."""
    return Track(tid, 0, name, 0.9, (x - 10, bottom - 40, x + 10, bottom), i + 1, missed, 0.0, i * DT)


Path = Callable[[int], Sequence[Track]]


def run(regions: CameraRegions, path: Path, frames: int, size: tuple[int, int] = SIZE) -> list[Event]:
    engine = ZoneEngine("door", regions)
    events: list[Event] = []
    for i in range(frames):
        events += engine.update(path(i), i * DT, i, size)
    return events


def kinds(events: list[Event], *keep: str) -> list[tuple[str, int, str | None]]:
    """(kind, frame, direction) of the events of the kinds kept."""
    return [(e.kind, e.frame_index, e.direction) for e in events if e.kind in keep]


GATE = Line("gate", (0.0, 240.0), (640.0, 240.0))  # drawn left to right: "in" is downwards
LINES = CameraRegions(lines=(GATE,), count_interval_s=None)


def test_a_line_crossed_downwards_is_in_at_the_frame_the_anchor_clears_the_margin() -> None:
    # The anchor is at y = 100 + 10 i; it is clearly below (beyond 4 px) first at i = 15 (y = 250).
    events = run(LINES, lambda i: [track(1, 320, 100 + 10 * i, i)], 40)
    assert kinds(events, "cross") == [("cross", 15, "in")]


def test_a_line_crossed_upwards_is_out() -> None:
    events = run(LINES, lambda i: [track(1, 320, 400 - 10 * i, i)], 40)
    # Clearly above (y < 236) first at i = 17 (y = 230).
    assert kinds(events, "cross") == [("cross", 17, "out")]


def _hover(i: int) -> float:
    """Down to the line in 14 frames, 60 frames on it with 2 px of jitter either way, then on down."""
    if i < 14:
        return 100 + 10 * i
    if i < 74:
        return 240 + (2 if i % 2 else -2)
    return 240 + 10 * (i - 73)


def test_a_track_hovering_on_the_line_is_counted_once() -> None:
    events = run(LINES, lambda i: [track(1, 320, _hover(i), i)], 100)
    assert kinds(events, "cross") == [("cross", 74, "in")]


def test_without_the_margin_the_same_hover_would_count_every_jitter() -> None:
    # What the margin is for: with none, each 2 px jitter across the line is a crossing.
    bare = CameraRegions(
        lines=(Line("gate", (0.0, 240.0), (640.0, 240.0), margin_px=0.0),), count_interval_s=None
    )
    events = run(bare, lambda i: [track(1, 320, _hover(i), i)], 100)
    assert len(kinds(events, "cross")) > 50


def test_a_track_that_crosses_and_comes_back_is_counted_both_ways() -> None:
    def path(i: int) -> list[Track]:
        return [track(1, 320, 100 + 10 * i if i <= 30 else 400 - 10 * (i - 30), i)]

    events = run(LINES, path, 60)
    # Down: clear at i = 15.  Back up from y = 400: below 236 first at i = 47 (y = 230).
    assert kinds(events, "cross") == [("cross", 15, "in"), ("cross", 47, "out")]


def test_going_around_the_end_of_the_segment_is_no_crossing() -> None:
    short = CameraRegions(lines=(Line("gate", (200.0, 240.0), (440.0, 240.0)),), count_interval_s=None)
    events = run(short, lambda i: [track(1, 100, 100 + 10 * i, i)], 40)
    assert kinds(events, "cross") == []
    # ...while the same path at x = 320 goes through it.
    events = run(short, lambda i: [track(1, 320, 100 + 10 * i, i)], 40)
    assert kinds(events, "cross") == [("cross", 15, "in")]


def test_a_predicted_box_on_the_other_side_does_not_cross_but_the_next_seen_one_does() -> None:
    def path(i: int) -> list[Track]:
        return [track(1, 320, 100 + 10 * i, i, missed=1 if 15 <= i <= 16 else 0)]

    events = run(LINES, path, 40)
    assert kinds(events, "cross") == [("cross", 17, "in")]


BAY = Zone("bay", ((100.0, 100.0), (300.0, 100.0), (300.0, 300.0), (100.0, 300.0)), dwell_s=1.0)


def _walk(i: int, tid: int = 1, name: str = "person") -> list[Track]:
    """Left to right along y = 200: inside the bay from i = 10 (x = 105) to i = 29 (x = 295)."""
    return [track(tid, 5 + 10 * i, 200, i, name=name)]


def test_enter_dwell_and_leave_at_the_frames_the_path_gives() -> None:
    events = run(CameraRegions(zones=(BAY,), count_interval_s=None), _walk, 45)
    assert kinds(events, "enter", "dwell", "leave") == [
        ("enter", 10, None),
        ("dwell", 18, None),  # 8 frames of 0.125 s after entering
        ("leave", 30, None),
    ]
    leave = events[-1]
    assert leave.since_t == 10 * DT and leave.dwell_s == 20 * DT


def test_inertia_delays_enter_and_leave_and_counts_the_stay_from_the_first_frame_inside() -> None:
    slow = Zone("bay", BAY.polygon, dwell_s=1.0, inertia=3)
    events = run(CameraRegions(zones=(slow,), count_interval_s=None), _walk, 45)
    assert kinds(events, "enter", "dwell", "leave") == [
        ("enter", 12, None),
        ("dwell", 18, None),
        ("leave", 32, None),
    ]
    assert events[-1].since_t == 10 * DT and events[-1].dwell_s == 20 * DT  # frames 10..30, as with none


def test_inertia_ignores_a_box_flickering_across_the_border() -> None:
    def path(i: int) -> list[Track]:
        return [track(1, 100 + (3 if i % 2 else -3), 200, i)]

    flicker = CameraRegions(zones=(Zone("bay", BAY.polygon, inertia=2),), count_interval_s=None)
    assert kinds(run(flicker, path, 30), "enter", "leave") == []
    bare = CameraRegions(zones=(Zone("bay", BAY.polygon),), count_interval_s=None)
    assert len(kinds(run(bare, path, 30), "enter", "leave")) > 20


def test_a_track_that_ends_inside_leaves_when_it_is_gone() -> None:
    events = run(CameraRegions(zones=(BAY,), count_interval_s=None), lambda i: _walk(i) if i < 20 else [], 25)
    assert kinds(events, "enter", "leave") == [("enter", 10, None), ("leave", 20, None)]


def test_flush_ends_the_open_stays_and_the_partial_interval() -> None:
    engine = ZoneEngine("door", CameraRegions(zones=(BAY,), count_interval_s=60.0))
    for i in range(15):
        engine.update(_walk(i), i * DT, i, SIZE)
    events = engine.flush(15 * DT, 15)
    assert [(e.kind, e.frame_index) for e in events] == [("leave", 15), ("count", 15)]
    counts = events[1].counts
    assert counts is not None and counts["zones"]["bay"]["enter"] == {"person": 1}
    assert counts["zones"]["bay"]["leave"] == {"person": 1}


def test_a_predicted_box_inside_does_not_enter() -> None:
    def path(i: int) -> list[Track]:
        return [track(1, 5 + 10 * i, 200, i, missed=1 if 10 <= i <= 12 else 0)]

    events = run(CameraRegions(zones=(BAY,), count_interval_s=None), path, 20)
    assert kinds(events, "enter") == [("enter", 13, None)]


def test_normalised_and_pixel_coordinates_give_the_same_events() -> None:
    w, h = SIZE
    frac = Zone("bay", tuple((x / w, y / h) for x, y in BAY.polygon), normalised=True, dwell_s=1.0)
    line = Line("gate", (0.0, 0.5), (1.0, 0.5), normalised=True)
    pixels = run(CameraRegions(zones=(BAY,), lines=(GATE,), count_interval_s=None), _walk, 45)
    fractions = run(CameraRegions(zones=(frac,), lines=(line,), count_interval_s=None), _walk, 45)
    assert [(e.kind, e.frame_index) for e in fractions] == [(e.kind, e.frame_index) for e in pixels]
    assert pixels  # the comparison compared something
    # At twice the resolution the fractions follow the frame, the pixels do not.
    doubled = run(CameraRegions(zones=(frac,), count_interval_s=None), _walk, 45, size=(1280, 960))
    assert kinds(doubled, "enter") == [("enter", 20, None)]


def test_fractions_resolve_again_when_the_frame_size_changes() -> None:
    w, h = SIZE
    frac = Zone("bay", tuple((x / w, y / h) for x, y in BAY.polygon), normalised=True)
    engine = ZoneEngine("door", CameraRegions(zones=(frac,), count_interval_s=None))
    assert engine.update(_walk(12), 0.0, 0, SIZE)[0].kind == "enter"  # x = 125: inside at 640 wide
    # The camera now sends 1280 x 960: the bay spans x 200..600, so x = 125 is outside.
    assert [e.kind for e in engine.update(_walk(12), DT, 1, (1280, 960))] == ["leave"]


def test_class_filters() -> None:
    people = Zone("bay", BAY.polygon, classes=frozenset({"person"}))
    cars = Line("gate", (0.0, 240.0), (640.0, 240.0), classes=frozenset({"car"}))
    regions = CameraRegions(zones=(people,), lines=(cars,), count_interval_s=None)
    assert run(regions, lambda i: _walk(i, name="car"), 45) == []
    assert kinds(run(regions, _walk, 45), "enter", "leave") == [("enter", 10, None), ("leave", 30, None)]
    down = run(regions, lambda i: [track(1, 320, 100 + 10 * i, i, name="car")], 40)
    assert kinds(down, "cross") == [("cross", 15, "in")]


def test_present_once_a_class_has_been_inside_min_frames() -> None:
    zone = Zone("bay", BAY.polygon, min_frames=5)
    events = run(CameraRegions(zones=(zone,), count_interval_s=None), _walk, 45)
    present = [e for e in events if e.kind == "present"]
    assert [(e.frame_index, e.class_name) for e in present] == [(14, "person")]


def test_counts_per_interval() -> None:
    regions = CameraRegions(zones=(BAY,), lines=(GATE,), count_interval_s=2.0)

    def path(i: int) -> list[Track]:
        return [*_walk(i, tid=1), track(2, 320, 100 + 10 * i, i, name="car")]

    counts = [e for e in run(regions, path, 50) if e.kind == "count"]
    # Windows [0, 2), [2, 4), [4, 6): frames 16, 32 and 48 close them.
    assert [(e.since_t, e.t, e.frame_index) for e in counts] == [
        (0.0, 2.0, 16),
        (2.0, 4.0, 32),
        (4.0, 6.0, 48),
    ]
    first, second = counts[0].counts, counts[1].counts
    assert first is not None and second is not None
    assert first["zones"]["bay"]["enter"] == {"person": 1} and first["zones"]["bay"]["occupancy"] == {
        "person": 1
    }
    assert first["lines"]["gate"] == {"in": {"car": 1}, "out": {}}
    assert second["zones"]["bay"]["leave"] == {"person": 1} and second["zones"]["bay"]["occupancy"] == {}
    assert second["lines"]["gate"] == {"in": {}, "out": {}}


def test_event_ids_are_stable_across_runs_and_distinct_across_events() -> None:
    regions = CameraRegions(
        zones=(Zone("bay", BAY.polygon, dwell_s=1.0, min_frames=3),), lines=(GATE,), count_interval_s=2.0
    )

    def path(i: int) -> list[Track]:
        back = 100 + 10 * i if i <= 30 else 400 - 10 * (i - 30)
        third = [track(3, 320, 100 + 10 * i, i)] if i < 35 else []
        return [*_walk(i, tid=1), track(2, 320, back, i), *third]

    one, two = run(regions, path, 60), run(regions, path, 60)
    assert [e.id for e in one] == [e.id for e in two]
    assert len({e.id for e in one}) == len(one) == 10
    assert {e.kind for e in one} == {"enter", "leave", "dwell", "cross", "present", "count"}
    # Another camera, or the same track ids first seen at another time (a restarted device), differ.
    other = ZoneEngine("yard", regions).update(path(20), 20 * DT, 20, SIZE)
    assert other and not {e.id for e in other} & {e.id for e in one}
    later = [replace(tr, first_t=3600.0) for tr in path(20)]
    again = ZoneEngine("door", regions).update(path(20), 20 * DT, 20, SIZE)
    restarted = ZoneEngine("door", regions).update(later, 20 * DT, 20, SIZE)
    assert again and not {e.id for e in again} & {e.id for e in restarted}


def test_events_are_plain_json() -> None:
    events = run(CameraRegions(zones=(BAY,), lines=(GATE,), count_interval_s=2.0), _walk, 40)
    for e in events:
        doc = json.loads(json.dumps(e.to_dict()))
        assert doc["id"] == e.id and doc["kind"] == e.kind
    enter = next(e for e in events if e.kind == "enter").to_dict()
    assert enter["box"] == [95.0, 160.0, 115.0, 200.0] and "counts" not in enter


def test_regions_from_a_camera_table() -> None:
    regions = regions_from_dict(
        {
            "source": "rtsp://cam/door",  # the camera's other settings are not ours
            "count_interval_s": 30,
            "zones": {
                "bay": {"polygon": [[0.1, 0.2], [0.9, 0.2], [0.5, 0.9]], "classes": ["person"], "dwell_s": 5}
            },
            "lines": {"gate": {"a": [0, 400], "b": [1280, 400], "directions": ["arrive", "depart"]}},
        }
    )
    (bay,), (gate,) = regions.zones, regions.lines
    assert bay.normalised and bay.classes == frozenset({"person"}) and bay.dwell_s == 5.0
    assert not gate.normalised and gate.directions == ("arrive", "depart")
    assert regions.count_interval_s == 30.0


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"polygon": [[0.1, 0.1], [0.5, 0.5]]}, "at least 3"),
        ({"polygon": [[0, 0], [100, 100], [100, 0], [0, 100]]}, "crosses itself"),
        ({"polygon": [[0, 0], [50, 50], [100, 100]]}, "no area"),
        ({"polygon": [[0.1, 0.1], [1.5, 0.1], [0.5, 0.5]], "normalised": True}, "outside [0, 1]"),
        ({"polygon": [[0, 0], [100, 0], [50, 80]], "anchor": "feet"}, "unknown anchor"),
        ({"polygon": [[0, 0], [100, 0], [50, 80]], "dwell": 3}, "unknown setting(s) dwell"),
        ({"polygon": [[0, 0], [100, 0], [50, 80]], "dwell_s": -1}, "dwell_s"),
        ({"polygon": [[0, 0], [100, 0], [50]]}, "not a point"),
        ({}, "has no polygon"),
    ],
)
def test_bad_zones_are_refused_with_a_hint(table: dict[str, Any], says: str) -> None:
    with pytest.raises(EdgekitError) as err:
        zone_from_dict("bay", table)
    assert says in err.value.message and err.value.hint


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"a": [10, 10], "b": [10, 10]}, "starts and ends at"),
        ({"a": [0.1, 0.1], "b": [2.0, 0.5], "normalised": True}, "outside [0, 1]"),
        ({"a": [0, 0]}, "needs both ends"),
        ({"a": [0, 0], "b": [10, 0], "directions": ["in", "in"]}, "directions"),
    ],
)
def test_bad_lines_are_refused_with_a_hint(table: dict[str, Any], says: str) -> None:
    with pytest.raises(EdgekitError) as err:
        line_from_dict("gate", table)
    assert says in err.value.message and err.value.hint


def test_a_zone_and_a_line_may_not_share_a_name() -> None:
    with pytest.raises(EdgekitError, match="names both a zone and a line"):
        regions_from_dict(
            {
                "zones": {"x": {"polygon": [[0.1, 0.1], [0.9, 0.1], [0.5, 0.9]]}},
                "lines": {"x": {"a": [0, 0], "b": [1, 1]}},
            }
        )


def test_through_the_tracker_a_detection_gap_neither_loses_nor_repeats_a_crossing() -> None:
    """Detections of a square walking down across the gate, missing on frames 14 to 15 (the crossing)."""
    tracker = Tracker(max_missed_s=0.4)  # 3 frames at these 8 fps
    engine = ZoneEngine("door", CameraRegions(zones=(BAY,), lines=(GATE,), count_interval_s=None))
    events: list[Event] = []
    for i in range(40):
        bottom = 100 + 10 * i
        dets = (
            []
            if i in (14, 15)
            else [Detection(0, "person", 0.9, (190.0, bottom - 40.0, 210.0, float(bottom)))]
        )
        events += engine.update(tracker.update(dets, i * DT), i * DT, i, SIZE)
    ids = {e.track_id for e in events}
    assert len(ids) == 1  # one track throughout: the gap did not start a second one
    crossings = kinds(events, "cross")
    # Clear of the line from frame 15 (y = 250), but that box is the prediction: frame 16 decides.
    assert crossings == [("cross", 16, "in")]
    # Into the bay (y 100..300) and out of it again, once each.
    assert [e.kind for e in events if e.kind in ("enter", "leave")] == ["enter", "leave"]
