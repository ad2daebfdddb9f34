"""Objects tracked per camera: a stable id for each, through a missed detection or two.

:class:`Tracker` is a ByteTrack-style tracker (Zhang et al., 2022) in numpy alone, one per
camera.  Each frame, its detections are split by score: those at or above ``high_score``
are matched first to every live track by the IoU of the track's predicted box; those
between ``low_score`` and ``high_score`` (an occluded or blurred object the detector is
unsure of) then continue the confirmed tracks still unmatched, at a stricter IoU
(``LOW_IOU``), and never start a track.  A high-score detection left over starts a
tentative track, confirmed (given its id) after ``min_hits`` frames matched in a row; a
tentative track that misses a frame is dropped, so a one-frame false positive never takes
an id.  A person's box never continues a car's track: only boxes of the same class match.

Why our own and not a library's
    Evaluated against what the device extra already holds (numpy, opencv-python-headless,
    no scipy, no torch) and an SDK shipped inside products:

    ================  ==============  ==========================================  =================
    candidate         licence         dependencies it adds to a device            fit
    ================  ==============  ==========================================  =================
    supervision 0.31  MIT             its ByteTrack moved out to ``trackers``;    no
                                      supervision itself pulls matplotlib,
                                      scipy, av, pillow, requests
    trackers 2.6      Apache-2.0      supervision (above), scipy, opencv-python   no
                                      (the GUI build, beside our headless one),
                                      numpy >= 2
    boxmot 25.0       AGPL-3.0        torch, torchvision, timm, pandas, pyarrow,  no (licence alone)
                                      scikit-learn, opencv-python, lapx
    norfair 2.3       BSD-3-Clause    scipy, filterpy, rich < 15; numpy < 2       no (numpy pin)
    ================  ==============  ==========================================  =================

    None is numpy-only.  AGPL rules boxmot out of anything flashed onto a customer's
    device; norfair's ``numpy < 2`` cannot sit beside a current numpy, and it keeps one
    Python object and filterpy Kalman filter per tracked object (timed on the same frames
    of ``benchmarks/tracker_cost.py``, norfair 2.3 IoU tracking took p50 92, 758 and 3492 µs a
    frame at 1, 20 and 100 objects against this module's 59, 116 and 572); ByteTrack through
    supervision now means two packages and scipy for a few dozen lines of matching.  The
    algorithm is small and well described, so it is written here, vectorised over tracks,
    and measured (``benchmarks/tracker_cost.py``).

Prediction: an alpha-beta filter, not a full Kalman filter
    Each track keeps its box as centre and size, and their velocities in pixels per second.
    A Kalman filter with constant noise settles within a few frames to fixed gains, which
    is exactly an alpha-beta filter; the per-track covariance it carries adds matrix work
    and tuning knobs (two noise matrices) and buys nothing for boxes whose noise does not
    change from frame to frame.  Velocity is per second and the prediction spans the time
    since the track's last match, so a dropped frame (a camera or the degrade controller
    skipping one) predicts as far as the object really moved.  A track's second match sets
    its velocity outright (two points give it); later matches refine it.

How long a track outlives its detections: seconds, not frames
    ``max_missed_s`` (0.2 s: six frames at 30 fps, two at 10 fps) is time since the last
    match, because frames are dropped under load: counted in frames, a track would live
    three times longer at 10 fps than at 30.  While missed, a track's box is its
    prediction and it stays in :meth:`Tracker.update`'s result with ``missed > 0``.

Matching: greedy, best IoU first, not the Hungarian algorithm
    scipy is no dependency of edgekit, and at the object counts of a camera (up to ~100)
    the IoU matrix of predicted against detected boxes is nearly diagonal: an object's
    predicted box overlaps its own next box and rarely another's by ``iou_match``.
    Where two do compete, greedy gives the best overlap its pair, which is what the
    optimum does too unless a chain of three near-equal overlaps forms; the velocity
    prediction keeps crossing objects' boxes apart in exactly those frames.  It is also
    the rule :func:`edgekit.detection.detector.match` uses, with its deterministic ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgekit.detection.detector import Box, Detection
from edgekit.errors import EdgekitError

#: A low-score detection continues a track only when it overlaps the prediction this much
#: (ByteTrack's second stage): such detections are often clutter, so they must fit closely.
LOW_IOU = 0.5
#: The alpha-beta gains: how far a match moves the box towards the detection, and its
#: velocity towards the implied one.  Within the filter's stable region, tolerant of a few
#: pixels of detector jitter, and still converging on a new velocity within a few frames.
ALPHA = 0.7
BETA = 0.3
#: A predicted box is never narrower or lower than this many pixels (a shrinking object's
#: size velocity would otherwise carry it through zero while it is missed).
MIN_SIZE = 1.0
#: Capture times are floats: 25/30 - 19/30 comes out a hair over 0.2, and a track kept for
#: 0.2 s must still see its sixth missed frame at 30 fps.
TIME_SLACK_S = 1e-6


@dataclass(frozen=True, slots=True)
class Track:
    """One tracked object on one frame, as :meth:`Tracker.update` reports it."""

    id: int  # stable per camera, never reused
    class_id: int
    name: str
    score: float  # the score of the last matched detection
    box: Box  # the matched detection's box, or the prediction while missed
    hits: int  # frames it was matched
    missed: int  # consecutive frames without a match (0 when matched now)
    first_t: float  # when it was first seen (s, the frame's capture time)
    t: float  # this frame's time


class Tracker:
    """Tracks of one camera's detections; call :meth:`update` once per frame, in time order."""

    def __init__(
        self,
        *,
        high_score: float = 0.5,
        low_score: float = 0.1,
        iou_match: float = 0.3,
        max_missed_s: float = 0.2,
        min_hits: int = 2,
    ) -> None:
        if not 0.0 <= low_score <= high_score <= 1.0:
            raise EdgekitError(
                f"tracker scores must satisfy 0 <= low_score <= high_score <= 1, got {low_score} and {high_score}",
                hint="low_score is the least a detection needs to continue a track, high_score to start one",
            )
        if not 0.0 < iou_match <= 1.0:
            raise EdgekitError(
                f"tracker iou_match must be within (0, 1], got {iou_match}",
                hint="0.3 is a good start: a detection must overlap a track's predicted box this much",
            )
        if max_missed_s < 0 or min_hits < 1:
            raise EdgekitError(
                f"tracker needs max_missed_s >= 0 and min_hits >= 1, got {max_missed_s} and {min_hits}",
                hint="max_missed_s is how long a track outlives its last detection (0.2 s is ~6 frames at 30 fps)",
            )
        self.high_score = high_score
        self.low_score = low_score
        self.iou_match = iou_match
        self.max_missed_s = max_missed_s
        self.min_hits = min_hits
        self._next_id = 1
        self.reset()

    def reset(self) -> None:
        """Forget every track (a camera restarted or moved); ids go on from where they were, never reused."""
        self._t: float | None = None
        # Per track, one row each: state is cx, cy, w, h; velocity their change per second.
        self._state = np.zeros((0, 4))
        self._velocity = np.zeros((0, 4))
        self._matched_t = np.zeros(0)  # time of the last match (the state is as of then)
        self._class = np.zeros(0, dtype=np.int64)
        self._ids: list[int] = []  # 0 while tentative
        self._names: list[str] = []
        self._scores: list[float] = []
        self._boxes: list[Box] = []
        self._hits: list[int] = []
        self._missed: list[int] = []
        self._first_t: list[float] = []

    def update(self, detections: Sequence[Detection], t: float) -> list[Track]:
        """Match this frame's detections (taken at ``t`` s) to the tracks; the confirmed live tracks, by id.

        Missed tracks still within ``max_missed_s`` are included, with their predicted box
        and ``missed > 0``.  ``t`` must not go back in time.
        """
        if self._t is not None and t < self._t:
            raise ValueError(
                f"frame time went back from {self._t} to {t}: one Tracker per camera, frames in order"
            )
        self._t = t
        dets = [d for d in detections if d.score >= self.low_score]
        predicted = self._predict(t)
        boxes = np.array([d.box for d in dets], dtype=np.float64).reshape(-1, 4)
        scores = np.array([d.score for d in dets], dtype=np.float64)
        classes = np.array([d.class_id for d in dets], dtype=np.int64)
        iou = _iou_matrix(_corners(predicted), boxes)
        iou[self._class[:, None] != classes[None, :]] = 0.0

        high = scores >= self.high_score
        confirmed = np.array([h >= self.min_hits for h in self._hits], dtype=bool)
        matched_tracks = np.zeros(len(self._ids), dtype=bool)
        matched_dets = np.zeros(len(dets), dtype=bool)
        pairs: list[tuple[int, int]] = []
        # ByteTrack's order: confirmed tracks take the sure detections, then the unsure ones;
        # only what is left may continue a tentative track, so a duplicate box started a frame
        # ago never takes an object away from its confirmed track.
        for tracks, wanted, min_iou in (
            (confirmed, high, self.iou_match),
            (confirmed, ~high, max(self.iou_match, LOW_IOU)),
            (~confirmed, high, self.iou_match),
        ):
            stage = _greedy(iou, tracks & ~matched_tracks, wanted & ~matched_dets, min_iou)
            for ti, di in stage:
                matched_tracks[ti] = matched_dets[di] = True
            pairs += stage

        self._correct(pairs, dets, boxes, t)
        for ti in sorted(ti for ti, _ in pairs):  # in the order they were first seen: ids follow it
            if not self._ids[ti] and self._hits[ti] >= self.min_hits:
                self._ids[ti] = self._take_id()
        keep = np.ones(len(self._ids), dtype=bool)
        for ti in np.flatnonzero(~matched_tracks).tolist():
            self._missed[ti] += 1
            self._boxes[ti] = _box_of(predicted[ti])
            tentative = self._hits[ti] < self.min_hits
            keep[ti] = not tentative and t - self._matched_t[ti] <= self.max_missed_s + TIME_SLACK_S
        self._drop(keep)
        for di in np.flatnonzero(high & ~matched_dets).tolist():
            self._start(dets[di], boxes[di], t)

        out = [
            Track(
                id=self._ids[i],
                class_id=int(self._class[i]),
                name=self._names[i],
                score=self._scores[i],
                box=self._boxes[i],
                hits=self._hits[i],
                missed=self._missed[i],
                first_t=self._first_t[i],
                t=t,
            )
            for i in range(len(self._ids))
            if self._ids[i]
        ]
        out.sort(key=lambda track: track.id)
        return out

    def _predict(self, t: float) -> np.ndarray:
        """Each track's centre and size at ``t``, carried on from its last match at its velocity."""
        dt = (t - self._matched_t)[:, None]
        predicted = self._state + self._velocity * dt
        predicted[:, 2:] = np.maximum(predicted[:, 2:], MIN_SIZE)
        return predicted

    def _correct(
        self, pairs: list[tuple[int, int]], dets: list[Detection], boxes: np.ndarray, t: float
    ) -> None:
        """Move each matched track towards its detection, all in one set of array operations.

        Row by row, numpy's per-call overhead made this half of ``update``'s time at 100 objects.
        """
        if not pairs:
            return
        ti = np.array([p[0] for p in pairs])
        z = _centre_size(boxes[[p[1] for p in pairs]])
        dt = t - self._matched_t[ti]
        moving = dt > 0  # two frames with one time stamp have no motion to learn from
        second = moving & np.array([self._hits[i] == 1 for i in ti.tolist()])
        steady = (moving & ~second)[:, None]
        per_s = np.where(moving, dt, 1.0)[:, None]
        state, velocity = self._state[ti], self._velocity[ti]
        prior = state + velocity * dt[:, None]
        residual = z - prior
        # Two points give a new track's velocity outright; later matches refine it.
        self._velocity[ti] = np.where(
            second[:, None],
            (z - state) / per_s,
            np.where(steady, velocity + BETA * residual / per_s, velocity),
        )
        self._state[ti] = np.where(steady, prior + ALPHA * residual, z)
        self._matched_t[ti] = t
        for i, d in pairs:
            det = dets[d]
            self._hits[i] += 1
            self._missed[i] = 0
            self._scores[i] = det.score
            self._names[i] = det.name
            self._boxes[i] = det.box

    def _start(self, det: Detection, box: np.ndarray, t: float) -> None:
        self._state = np.vstack([self._state, _centre_size(box[None, :])])
        self._velocity = np.vstack([self._velocity, np.zeros(4)])
        self._matched_t = np.append(self._matched_t, t)
        self._class = np.append(self._class, det.class_id)
        self._ids.append(self._take_id() if self.min_hits <= 1 else 0)
        self._names.append(det.name)
        self._scores.append(det.score)
        self._boxes.append(det.box)
        self._hits.append(1)
        self._missed.append(0)
        self._first_t.append(t)

    def _take_id(self) -> int:
        # Given at confirmation, not at the first sighting: the ids a user sees run 1, 2, 3
        # without the gaps that dropped one-frame false positives would leave.
        self._next_id += 1
        return self._next_id - 1

    def _drop(self, keep: np.ndarray) -> None:
        if keep.all():
            return
        self._state = self._state[keep]
        self._velocity = self._velocity[keep]
        self._matched_t = self._matched_t[keep]
        self._class = self._class[keep]
        kept = np.flatnonzero(keep).tolist()
        for name in ("_ids", "_names", "_scores", "_boxes", "_hits", "_missed", "_first_t"):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in kept])


def _greedy(iou: np.ndarray, tracks: np.ndarray, dets: np.ndarray, min_iou: float) -> list[tuple[int, int]]:
    """Pairs (track, detection) among the allowed ones, best IoU first, each used once."""
    allowed = iou * tracks[:, None] * dets[None, :]
    ti, di = np.nonzero(allowed >= min_iou)
    # Highest IoU first; ties go to the lower track, then the lower detection (lexsort is stable).
    order = np.lexsort((di, ti, -allowed[ti, di]))
    pairs: list[tuple[int, int]] = []
    used_t: set[int] = set()
    used_d: set[int] = set()
    for k in order.tolist():
        a, b = int(ti[k]), int(di[k])
        if a not in used_t and b not in used_d:
            used_t.add(a)
            used_d.add(b)
            pairs.append((a, b))
    return pairs


def _iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each of ``a``'s boxes (x0, y0, x1, y1 rows) with each of ``b``'s; 0 where the union is empty."""
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.maximum(w, 0.0) * np.maximum(h, 0.0)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    out: np.ndarray = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return out


def _centre_size(boxes: np.ndarray) -> np.ndarray:
    """Rows of x0, y0, x1, y1 as rows of centre x, centre y, width, height."""
    return np.hstack([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]])


def _corners(cs: np.ndarray) -> np.ndarray:
    half = cs[:, 2:] / 2
    return np.hstack([cs[:, :2] - half, cs[:, :2] + half])


def _box_of(cs: np.ndarray) -> Box:
    cx, cy, w, h = (float(v) for v in cs)
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
