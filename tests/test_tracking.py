"""The tracker on objects moving along known straight paths, fed frame by frame with box noise."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from edgekit.detection.detector import Detection
from edgekit.errors import EdgekitError
from edgekit.events.tracking import Track, Tracker

FPS = 30.0
SIZE = 40.0


def det(cx: float, cy: float, *, class_id: int = 0, score: float = 0.9, size: float = SIZE) -> Detection:
    half = size / 2
    return Detection(class_id, f"class{class_id}", score, (cx - half, cy - half, cx + half, cy + half))


class Path:
    """An object moving at a constant velocity (pixels per frame) from a start point."""

    def __init__(self, x: float, y: float, vx: float, vy: float, class_id: int = 0) -> None:
        self.x, self.y, self.vx, self.vy, self.class_id = x, y, vx, vy, class_id

    def at(self, frame: int, rng: random.Random, score: float = 0.9) -> Detection:
        jitter = [rng.uniform(-1.5, 1.5) for _ in range(4)]
        cx, cy = self.x + self.vx * frame, self.y + self.vy * frame
        half = SIZE / 2
        box = (cx - half + jitter[0], cy - half + jitter[1], cx + half + jitter[2], cy + half + jitter[3])
        return Detection(self.class_id, f"class{self.class_id}", score, box)


def centre(track: Track) -> tuple[float, float]:
    return ((track.box[0] + track.box[2]) / 2, (track.box[1] + track.box[3]) / 2)


def nearest(tracks: Iterable[Track], x: float, y: float) -> Track:
    return min(tracks, key=lambda tr: (centre(tr)[0] - x) ** 2 + (centre(tr)[1] - y) ** 2)


def run(tracker: Tracker, frames: Iterable[list[Detection]], start: int = 0) -> list[list[Track]]:
    return [tracker.update(dets, (start + f) / FPS) for f, dets in enumerate(frames)]


def test_ids_stay_the_same_along_each_path() -> None:
    rng = random.Random(1)
    paths = [Path(50, 50, 4, 1), Path(600, 80, -3, 2, class_id=1), Path(100, 400, 5, -2)]
    tracker = Tracker()
    ids: list[set[int]] = [set() for _ in paths]
    for f in range(120):
        tracks = tracker.update([p.at(f, rng) for p in paths], f / FPS)
        if f == 0:
            assert tracks == []  # tentative until min_hits
            continue
        assert len(tracks) == 3
        for k, p in enumerate(paths):
            track = nearest(tracks, p.x + p.vx * f, p.y + p.vy * f)
            assert track.class_id == p.class_id and track.missed == 0
            ids[k].add(track.id)
    assert [len(s) for s in ids] == [1, 1, 1]
    assert sorted(next(iter(s)) for s in ids) == [1, 2, 3]
    last = {tr.id: tr for tr in tracker.update([p.at(120, rng) for p in paths], 120 / FPS)}
    assert all(tr.hits == 121 and tr.first_t == 0.0 and tr.t == 120 / FPS for tr in last.values())


def test_a_gap_of_two_frames_keeps_the_id_and_predicts_the_box() -> None:
    rng = random.Random(2)
    path = Path(50, 200, 6, 0)
    tracker = Tracker()
    seen: list[Track] = []
    for f in range(60):
        dets = [] if f in (30, 31) else [path.at(f, rng)]
        tracks = tracker.update(dets, f / FPS)
        if f >= 1:
            assert len(tracks) == 1
            seen.append(tracks[0])
    assert {tr.id for tr in seen} == {1}
    gap = [tr for tr in seen if tr.missed]
    assert [tr.missed for tr in gap] == [1, 2]
    for tr, f in zip(gap, (30, 31), strict=True):  # the prediction follows the object while it is not seen
        assert abs(centre(tr)[0] - (50 + 6 * f)) < 4
    assert seen[-1].missed == 0 and seen[-1].hits == 58


def test_a_gap_longer_than_max_missed_ends_the_track_and_a_new_id_comes() -> None:
    rng = random.Random(3)
    path = Path(50, 200, 3, 0)
    tracker = Tracker(max_missed_s=0.2)
    history = run(tracker, ([] if 20 <= f < 30 else [path.at(f, rng)] for f in range(45)))
    # Last matched at frame 19 (0.633 s): alive through 0.2 s of misses, gone after.
    alive = [f for f in range(20, 30) if history[f]]
    assert alive == list(range(20, 26))
    assert all(history[f][0].id == 1 for f in alive)
    assert history[30] == []  # the reappearing object is tentative again
    assert {tr.id for h in history[31:] for tr in h} == {2}
    assert history[31][0].first_t == 30 / FPS


def test_crossing_objects_of_one_class_keep_their_ids() -> None:
    rng = random.Random(4)
    left, right = Path(100, 200, 8, 0), Path(500, 212, -8, 0)  # cross at frame 25
    tracker = Tracker()
    for f in range(50):
        tracks = tracker.update([left.at(f, rng), right.at(f, rng)], f / FPS)
        if f == 0:
            continue
        assert len(tracks) == 2
        if abs(f - 25) > 2:  # the boxes overlap too much to tell by position near the crossing itself
            assert nearest(tracks, 100 + 8 * f, 200).id == 1
            assert nearest(tracks, 500 - 8 * f, 212).id == 2


def test_crossing_objects_keep_their_ids_when_one_is_hidden_behind_the_other() -> None:
    rng = random.Random(5)
    left, right = Path(100, 200, 8, 0), Path(500, 212, -8, 0)
    tracker = Tracker()
    for f in range(50):
        dets = [left.at(f, rng)] if 24 <= f <= 26 else [left.at(f, rng), right.at(f, rng)]
        tracks = tracker.update(dets, f / FPS)
        if f > 30:
            assert len(tracks) == 2
            assert nearest(tracks, 100 + 8 * f, 200).id == 1
            assert nearest(tracks, 500 - 8 * f, 212).id == 2


def test_a_low_score_detection_continues_a_track_but_never_starts_one() -> None:
    rng = random.Random(6)
    tracked, faint = Path(50, 100, 3, 0), Path(50, 400, 3, 0)
    tracker = Tracker(high_score=0.5, low_score=0.1)
    for f in range(40):
        score = 0.9 if f < 10 else 0.3  # the tracked object fades after frame 10
        tracks = tracker.update([tracked.at(f, rng, score), faint.at(f, rng, 0.3)], f / FPS)
        if f >= 1:
            assert [(tr.id, tr.missed) for tr in tracks] == [(1, 0)]
            assert tracks[0].score == score
    below = tracker.update([tracked.at(40, rng, 0.05)], 40 / FPS)
    assert [(tr.id, tr.missed) for tr in below] == [(1, 1)]  # under low_score: as if not detected


def test_classes_are_tracked_apart() -> None:
    tracker = Tracker()
    for f in range(5):
        tracks = tracker.update([det(100 + f, 100, class_id=2)], f / FPS)
    assert [(tr.id, tr.class_id) for tr in tracks] == [(1, 2)]
    # A person where the car was: the car's track is missed, the person starts its own.
    tracks = tracker.update([det(105, 100, class_id=0)], 5 / FPS)
    assert [(tr.id, tr.class_id, tr.missed) for tr in tracks] == [(1, 2, 1)]
    tracks = tracker.update([det(106, 100, class_id=0)], 6 / FPS)
    assert sorted((tr.id, tr.class_id, tr.missed) for tr in tracks) == [(1, 2, 2), (2, 0, 0)]


def test_a_dropped_frame_is_predicted_over_by_time() -> None:
    # 15 px a frame with a 40 px box: two frames unseen, the object moves further than its width.
    rng = random.Random(7)
    path = Path(50, 100, 15, 0)
    tracker = Tracker()
    frames = [f for f in range(30) if f not in (12, 13, 20, 21)]
    ids = set()
    for f in frames:
        tracks = tracker.update([path.at(f, rng)], f / FPS)
        if f:
            assert [tr.missed for tr in tracks] == [0]
            ids.add(tracks[0].id)
    assert ids == {1}


def test_ids_are_never_reused() -> None:
    tracker = Tracker(min_hits=1)
    assert [tr.id for tr in tracker.update([det(100, 100), det(300, 100)], 0.0)] == [1, 2]
    assert tracker.update([], 1.0) == []  # both ended
    assert [tr.id for tr in tracker.update([det(100, 100)], 1.1)] == [3]
    tracker.reset()
    assert [tr.id for tr in tracker.update([det(100, 100)], 0.0)] == [4]


def test_a_one_frame_false_positive_takes_no_id() -> None:
    tracker = Tracker(min_hits=2)
    tracker.update([det(500, 500)], 0.0)  # seen once, never again
    run(tracker, ([det(100, 100)] for _ in range(3)), start=1)
    assert [tr.id for tr in tracker.update([det(100, 100)], 4 / FPS)] == [1]


@pytest.mark.parametrize(
    "kwargs",
    [{"low_score": 0.6, "high_score": 0.5}, {"iou_match": 0.0}, {"max_missed_s": -1.0}, {"min_hits": 0}],
)
def test_bad_settings_are_refused_with_a_hint(kwargs: dict[str, float]) -> None:
    with pytest.raises(EdgekitError) as err:
        Tracker(**kwargs)  # type: ignore[arg-type]
    assert err.value.hint


def test_time_going_back_is_refused() -> None:
    tracker = Tracker()
    tracker.update([det(100, 100)], 1.0)
    with pytest.raises(ValueError, match="went back"):
        tracker.update([det(100, 100)], 0.5)
