"""The one frame tally and the one per-class count: what they add up, and their wire form."""

from __future__ import annotations

import pytest

from edgekit.core.tally import ClassCount, FrameTally, count_detections
from edgekit.protocol.messages import CameraWindow, DetectionCount


def test_a_tally_counts_frames_and_its_wire_form_is_a_camera_entry() -> None:
    t = FrameTally()
    for ms, met, dropped in ((5.0, True, 0), (30.0, False, 2), (7.0, True, 1)):
        t.count(ms, met, dropped)
    assert (t.frames, t.missed, t.met, t.dropped) == (3, 1, 2, 3)
    assert t.miss_rate == pytest.approx(1 / 3)
    wire = t.to_dict()
    assert set(wire) == {"frames", "missed", "dropped", "latency_ms"}
    CameraWindow.model_validate(wire)  # what a window's camera entry is checked against

    back = FrameTally()
    back.add(wire)
    back.merge(t)
    assert (back.frames, back.missed, back.dropped, back.latency.count) == (6, 2, 6, 6)
    assert back.latency.max == pytest.approx(30.0, rel=0.02)
    assert t.frames == 3  # merging read it, did not change it


def test_a_copy_does_not_share_the_sketch() -> None:
    t = FrameTally()
    t.count(4.0, True)
    c = t.copy()
    c.count(8.0, False)
    assert (t.frames, t.latency.count) == (1, 1) and (c.frames, c.latency.count) == (2, 2)


def test_a_window_without_drops_adds_as_none_dropped() -> None:
    # A window's own figures (not a camera's) carry frames, missed and latency, no dropped.
    t = FrameTally()
    t.add({"frames": 2, "missed": 1, "latency_ms": FrameTally().latency.to_dict()})
    assert (t.frames, t.missed, t.dropped) == (2, 1, 0)


def test_a_class_count_counts_frames_once_and_keeps_the_best_score() -> None:
    counts: dict[str, ClassCount] = {}
    count_detections(counts, [("face", 0.5), ("face", 0.3), ("hand", 0.6)])
    count_detections(counts, [("face", 0.9)])
    assert counts == {"face": ClassCount(2, 3, 0.9), "hand": ClassCount(1, 1, 0.6)}
    c = counts["face"]
    c.merge({"frames": 1, "objects": 4, "max_score": 0.7})
    c.merge(ClassCount(1, 1, 0.2))
    assert c == ClassCount(4, 8, 0.9)
    DetectionCount.model_validate(c.to_dict())  # the wire's names
    assert ClassCount.from_dict(c.to_dict()) == c


def test_the_old_spelling_of_run_json_seen_still_reads() -> None:
    old = {"frames_with_detections": 2, "detections": 3, "max_score": 0.95}
    assert ClassCount.from_dict(old) == ClassCount(2, 3, 0.95)
    assert ClassCount.from_dict(old).to_dict() == {"frames": 2, "objects": 3, "max_score": 0.95}
