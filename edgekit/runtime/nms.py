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
    """Indices of the boxes kept, best first: each suppresses the lower-scored boxes of its class it overlaps."""
    import numpy as np

    rest = order(scores)
    suppresses = overlapping(boxes, classes, iou_threshold)
    kept: list[int] = []
    while rest.size and len(kept) < max_detections:
        best = int(rest[0])
        kept.append(best)
        rest = rest[1:]
        if rest.size:
            rest = rest[~suppresses(best, rest)]
    return np.asarray(kept, np.int64)


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
