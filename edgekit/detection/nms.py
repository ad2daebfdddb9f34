"""Non-maximum suppression over candidate boxes, per class: hard, and MediaPipe's weighted blending.

Boxes are ``(M, 4)`` x0, y0, x1, y1.  Candidates are visited best score first, equal
scores in index order (a stable sort), so the result never depends on the platform's sort.
A box is suppressed by one of its own class whose IoU with it is above ``iou_threshold``
(MediaPipe's and torchvision's rule).  The loop runs once per kept box, not once per
candidate: up to ``MATRIX_MAX`` candidates every pairwise overlap is computed at once
(a handful of numpy calls; each step is then one row lookup), beyond it each step
computes one vectorized IoU row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

#: Up to this many candidates the pairwise overlaps are one matrix (256 x 256 floats: 0.5 MB).
MATRIX_MAX = 256
#: Hard NMS computes one IoU row per kept box for this many, then one matrix for what is left.
ROW_STEPS = 8


def areas(boxes: np.ndarray) -> np.ndarray:
    """Each box's area (0 for an empty or inverted box)."""
    import numpy as np

    out: np.ndarray = np.maximum(boxes[:, 2] - boxes[:, 0], 0.0) * np.maximum(boxes[:, 3] - boxes[:, 1], 0.0)
    return out


def iou_one(box: np.ndarray, area: float, boxes: np.ndarray, box_areas: np.ndarray) -> np.ndarray:
    """IoU of one box (and its area) against each of ``boxes`` (and theirs); 0 where the union is empty."""
    import numpy as np

    w = np.maximum(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0.0)
    h = np.maximum(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0.0)
    inter = w * h
    union = area + box_areas - inter
    out: np.ndarray = np.divide(inter, union, out=np.zeros_like(inter, dtype=np.float64), where=union > 0)
    return out


def overlapping(
    boxes: np.ndarray, classes: np.ndarray, iou_threshold: float
) -> Callable[[int, np.ndarray], np.ndarray]:
    """``(best, rest) -> mask``: which of the ``rest`` indices are of ``best``'s class with IoU above the threshold."""
    import numpy as np

    box_areas = areas(boxes)
    if boxes.shape[0] > MATRIX_MAX:

        def row(best: int, rest: np.ndarray) -> np.ndarray:
            overlap = iou_one(boxes[best], box_areas[best], boxes[rest], box_areas[rest]) > iou_threshold
            out: np.ndarray = overlap & (classes[rest] == classes[best])
            return out

        return row
    b = boxes.astype(np.float64)
    w = np.minimum(b[:, None, 2], b[None, :, 2]) - np.maximum(b[:, None, 0], b[None, :, 0])
    h = np.minimum(b[:, None, 3], b[None, :, 3]) - np.maximum(b[:, None, 1], b[None, :, 1])
    inter = np.maximum(w, 0.0) * np.maximum(h, 0.0)
    union = box_areas[:, None] + box_areas[None, :] - inter
    # The same division as iou_one, so both ways give the same answer at the threshold.
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    matrix = (iou > iou_threshold) & (classes[:, None] == classes[None, :])

    def lookup(best: int, rest: np.ndarray) -> np.ndarray:
        out: np.ndarray = matrix[best, rest]
        return out

    return lookup


def order(scores: np.ndarray) -> np.ndarray:
    """Indices best score first; equal scores keep index order."""
    import numpy as np

    out: np.ndarray = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    return out


def hard_nms(
    boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou_threshold: float, max_detections: int
) -> np.ndarray:
    """Indices of the boxes kept, best first: each suppresses the lower-scored boxes of its class it overlaps.

    All classes at once: each class's boxes are moved along x by a whole multiple of the
    boxes' span (``class_separated``), so boxes of two classes never overlap and one IoU per
    pair decides.  A typical frame keeps a few boxes of a few hundred candidates: the first
    ``ROW_STEPS`` kept ones each compute one IoU row against the rest (YOLO's 8400 x 84 head
    decodes and suppresses in ~0.4 ms here); a crowded frame then finishes its remaining
    candidates through one overlap matrix (``overlapping``), whose IoUs are the same numbers.
    """
    import numpy as np

    rest = order(scores)
    separated = class_separated(boxes, classes)
    b = boxes.astype(np.float64) if separated is None else separated
    box_areas = areas(b)
    kept: list[int] = []
    while rest.size and len(kept) < max_detections:
        if len(kept) == ROW_STEPS and rest.size > 1:
            suppresses = overlapping(
                b[rest], np.zeros(rest.size) if separated is not None else classes[rest], iou_threshold
            )
            local = np.arange(rest.size)
            while local.size and len(kept) < max_detections:
                best = int(local[0])
                kept.append(int(rest[best]))
                local = local[1:]
                if local.size:
                    local = local[~suppresses(best, local)]
            break
        best = int(rest[0])
        kept.append(best)
        rest = rest[1:]
        if rest.size:
            overlap = iou_one(b[best], box_areas[best], b[rest], box_areas[rest]) > iou_threshold
            if separated is None:
                overlap &= classes[rest] == classes[best]
            rest = rest[~overlap]
    return np.asarray(kept, np.int64)


def class_separated(boxes: np.ndarray, classes: np.ndarray) -> np.ndarray | None:
    """``boxes`` (float64) moved along x by class times a whole number wider than all of them; None if not finite.

    The shift is an integer and the coordinates come from float32 or smaller: each sum, and
    each difference of two, is exact in float64, so IoUs within a class are unchanged.
    """
    import numpy as np

    b = boxes.astype(np.float64)
    if not b.size:
        return b
    span = float(b[:, 0::2].max() - b[:, 0::2].min())
    if not np.isfinite(span) or span >= 2.0**20:
        return None
    shift = (classes.astype(np.int64) - int(classes.min())) * (int(span) + 1)
    b[:, 0] += shift
    b[:, 2] += shift
    return b


def weighted_nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    keypoints: np.ndarray,
    iou_threshold: float,
    max_detections: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MediaPipe's weighted NMS: the best remaining box and every box of its class above the IoU threshold form a cluster.

    The cluster becomes one detection: its boxes (and keypoints) averaged with their
    scores as weights, its score the best one's.  Returns boxes, scores, classes and
    keypoints of the clusters, best first.
    """
    import numpy as np

    m = boxes.shape[0]
    # Box and keypoints side by side: one weighted average per cluster.
    width = int(np.prod(keypoints.shape[1:]))  # not reshape(m, -1): that fails for m = 0
    values = np.concatenate([boxes, keypoints.reshape(m, width)], axis=1).astype(np.float64)
    weights = scores.astype(np.float64)
    joins = overlapping(boxes, classes, iou_threshold)
    rest = order(scores)
    merged: list[np.ndarray] = []
    kept: list[int] = []
    while rest.size and len(kept) < max_detections:
        best = int(rest[0])
        cluster = joins(best, rest)
        cluster[0] = True  # the best box is in its own cluster even at an IoU threshold of 1
        members = rest[cluster]
        w = weights[members]
        total = w.sum()
        merged.append(w @ values[members] / total if total > 0 else values[best])
        kept.append(best)
        rest = rest[~cluster]
    idx = np.asarray(kept, np.int64)
    out = np.array(merged).reshape(len(kept), values.shape[1])
    return out[:, :4], weights[idx], classes[idx], out[:, 4:].reshape(len(kept), *keypoints.shape[1:])
