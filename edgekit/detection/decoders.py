"""A detector's raw outputs to candidate boxes: plain numpy functions, one per head format.

Every decoder returns the same four arrays for the candidates at or above the head's score
threshold, before non-maximum suppression: boxes ``(M, 4)`` as x0, y0, x1, y1 in
model-input pixels, scores ``(M,)`` in [0, 1], class ids ``(M,)`` and keypoints
``(M, K, 2)`` as x, y in model-input pixels (``K = 0`` when the model gives none).  The
threshold is applied to the scores first, so only the few survivors are decoded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgekit.errors import RunError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.bundle.manifest import BoxCoder, DetectionHead, SsdAnchors

Candidates = tuple["np.ndarray", "np.ndarray", "np.ndarray", "np.ndarray"]

_MISMATCH_HINT = (
    "the bundle's detection section does not describe this model's outputs: fix the model card and rebuild"
)


def ssd_anchors(a: SsdAnchors) -> np.ndarray:
    """Anchors ``(N, 4)`` as centre x, centre y, width, height in [0, 1], as MediaPipe's ``SsdAnchorsCalculator``.

    Layers that share a stride are merged into one grid (their anchors interleaved per
    cell), cells in row-major order; ``fixed_anchor_size`` makes every anchor 1 x 1 (the
    box coder's scales then carry the size, as in BlazeFace).
    """
    import numpy as np

    n = len(a.strides)

    def scale(i: int) -> float:
        if n == 1:
            return (a.min_scale + a.max_scale) * 0.5
        return a.min_scale + (a.max_scale - a.min_scale) * i / (n - 1)

    in_h, in_w = a.input_size
    layers = []
    layer = 0
    while layer < a.num_layers:
        ratios: list[float] = []
        scales: list[float] = []
        last = layer
        while last < n and a.strides[last] == a.strides[layer]:
            s = scale(last)
            if last == 0 and a.reduce_boxes_in_lowest_layer:
                ratios += [1.0, 2.0, 0.5]
                scales += [0.1, s, s]
            else:
                ratios += list(a.aspect_ratios)
                scales += [s] * len(a.aspect_ratios)
                if a.interpolated_scale_aspect_ratio > 0:
                    following = 1.0 if last == n - 1 else scale(last + 1)
                    scales.append(math.sqrt(s * following))
                    ratios.append(a.interpolated_scale_aspect_ratio)
            last += 1
        root = np.sqrt(np.asarray(ratios, np.float64))
        sizes = np.asarray(scales, np.float64)
        widths, heights = sizes * root, sizes / root
        if a.fixed_anchor_size:
            widths, heights = np.ones_like(widths), np.ones_like(heights)
        stride = a.strides[layer]
        fh, fw = math.ceil(in_h / stride), math.ceil(in_w / stride)
        grid = np.empty((fh, fw, len(ratios), 4), np.float64)
        grid[..., 0] = ((np.arange(fw) + a.anchor_offset[0]) / fw)[None, :, None]
        grid[..., 1] = ((np.arange(fh) + a.anchor_offset[1]) / fh)[:, None, None]
        grid[..., 2] = widths
        grid[..., 3] = heights
        layers.append(grid.reshape(-1, 4))
        layer = last
    # MediaPipe keeps anchors as C++ floats.
    return np.concatenate(layers).astype(np.float32)


def logit_floor(head: DetectionHead) -> float:
    """The lowest raw score that can still pass ``head.score_threshold`` (``-inf``: every score can).

    With ``sigmoid_scores`` the threshold is compared in logit space first (one comparison
    over all N raw scores, no exponentials) with a small margin below it; the survivors'
    exact scores are checked again after the sigmoid, so the margin never lets one through.
    """
    t = head.score_threshold
    if not head.sigmoid_scores:
        return t
    if t <= 0:
        return -math.inf
    if t >= 1:
        return math.inf
    floor = math.log(t / (1 - t)) - 1e-6 * (1 + abs(math.log(t / (1 - t))))
    if head.score_clipping is not None and floor <= -head.score_clipping:
        return -math.inf  # a clipped logit of -c still passes
    return floor


def _scores(raw: np.ndarray, head: DetectionHead) -> np.ndarray:
    """Raw best-class scores of the survivors to probabilities (clipped, then sigmoid, as the head says)."""
    import numpy as np

    s = raw.astype(np.float64)
    if head.score_clipping is not None:
        s = np.clip(s, -head.score_clipping, head.score_clipping)
    if head.sigmoid_scores:
        s = 1.0 / (1.0 + np.exp(-s))
    return s


def _keep(best: np.ndarray, head: DetectionHead, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the rows whose best score passes the threshold, and those scores as probabilities."""
    import numpy as np

    idx = np.flatnonzero(best >= floor) if floor > -math.inf else np.arange(best.shape[0])
    if not idx.size:  # the usual frame: nothing there
        return idx, np.zeros(0)
    scores = _scores(best[idx], head)
    ok = scores >= head.score_threshold
    if not ok.all():
        idx, scores = idx[ok], scores[ok]
    return idx, scores


def decode_ssd(
    boxes: np.ndarray,
    scores: np.ndarray,
    anchors: np.ndarray,
    coder: BoxCoder,
    head: DetectionHead,
    floor: float | None = None,
) -> Candidates:
    """SSD outputs (boxes ``[1, N, 4 + 2k]``, scores ``[1, N, classes]``) decoded against ``anchors``.

    As MediaPipe's ``TensorsToDetectionsCalculator``: per anchor the best class's score
    (clipped and through a sigmoid when the head says); the box's centre is ``anchor + d /
    scale * anchor_size``, its size ``d / scale * anchor_size`` (``exp(d / scale) *
    anchor_size`` with ``apply_exponential``); keypoints follow the box's four values.
    ``floor`` is :func:`logit_floor` precomputed (the frame loop passes it).
    """
    import numpy as np

    k = coder.num_keypoints
    raw_boxes = boxes.reshape(-1, boxes.shape[-1])
    raw_scores = scores.reshape(-1, scores.shape[-1])
    n = anchors.shape[0]
    if raw_boxes.shape[0] != n or raw_scores.shape[0] != n or raw_boxes.shape[1] < 4 + 2 * k:
        raise RunError(
            f"the ssd head expects {n} anchors with {4 + 2 * k} box values and scores, "
            f"the model gives boxes {tuple(boxes.shape)} and scores {tuple(scores.shape)}",
            _MISMATCH_HINT,
        )
    if raw_scores.shape[1] == 1:
        best, classes = raw_scores[:, 0], None
    else:
        classes = raw_scores.argmax(axis=1)
        best = raw_scores[np.arange(n), classes]
    idx, probs = _keep(best, head, logit_floor(head) if floor is None else floor)
    cls = np.zeros(idx.shape[0], np.int64) if classes is None else classes[idx]
    m = idx.shape[0]
    if not m:
        return np.zeros((0, 4)), probs, cls, np.zeros((0, k, 2))
    a = anchors[idx].astype(np.float64)
    # Rows of (x, y) pairs: centre, size, then the keypoints ([dy, dx, ...] unless reversed).
    v = raw_boxes[idx, : 4 + 2 * k].astype(np.float64).reshape(m, 2 + k, 2)
    if not coder.reverse_output_order:
        v = v[..., ::-1]
    scale = np.full((2 + k, 2), (1 / coder.x_scale, 1 / coder.y_scale))
    scale[1] = (1 / coder.w_scale, 1 / coder.h_scale)
    v = v * scale
    if coder.apply_exponential:
        v[:, 1] = np.exp(v[:, 1])
    v *= a[:, None, 2:]
    in_h, in_w = head.anchors.input_size if head.anchors is not None else (1, 1)
    pixels = np.array((in_w, in_h), np.float64)
    centre = (v[:, 0] + a[:, :2]) * pixels
    half = v[:, 1] * (pixels / 2)
    points = (v[:, 2:] + a[:, None, :2]) * pixels
    return np.concatenate([centre - half, centre + half], axis=1), probs, cls, points


def decode_yolo(
    output: np.ndarray, head: DetectionHead, input_hw: tuple[int, int], floor: float | None = None
) -> Candidates:
    """A YOLO-style head: ``[1, 4 + classes, N]`` (``channels-first``), ``[1, N, 5 + classes]`` (``rows``)
    or ``[1, N, 6]`` (``end2end``).

    Boxes are centre x, centre y, width, height in input pixels.  ``rows`` (YOLOv5) scores
    a box as objectness times its best class probability; ``channels-first`` (Ultralytics
    v8 and later) has class scores only.  Each box keeps its best class.  ``end2end`` rows
    are already decided (x0, y0, x1, y1, score, class): only the threshold applies.
    """
    import numpy as np

    nc = head.num_classes
    t = output.reshape(output.shape[-2], output.shape[-1]) if output.ndim >= 2 else output
    floor = logit_floor(head) if floor is None else floor
    if head.yolo_layout == "end2end":
        if t.ndim != 2 or t.shape[1] != 6:
            raise RunError(
                f"an end2end yolo head expects [1, N, 6] (x0, y0, x1, y1, score, class), got {tuple(output.shape)}",
                _MISMATCH_HINT,
            )
        idx, probs = _keep(t[:, 4], head, floor)
        cls = np.rint(t[idx, 5]).astype(np.int64)
        boxes = t[idx, :4].astype(np.float64)
        return boxes, probs, cls, np.zeros((boxes.shape[0], 0, 2))
    if head.yolo_layout == "channels-first":
        if t.ndim != 2 or t.shape[0] != 4 + nc:
            raise RunError(
                f"a channels-first yolo head with {nc} classes expects [1, {4 + nc}, N], got {tuple(output.shape)}",
                _MISMATCH_HINT,
            )
        class_scores = t[4:]
        best = class_scores[0] if nc == 1 else class_scores.max(axis=0)
        idx, probs = _keep(best, head, floor)
        cls = np.zeros(idx.shape[0], np.int64) if nc == 1 else class_scores[:, idx].argmax(axis=0)
        cxcywh = t[:4, idx].T.astype(np.float64)
    else:
        if t.ndim != 2 or t.shape[1] != 5 + nc:
            raise RunError(
                f"a rows yolo head with {nc} classes expects [1, N, {5 + nc}], got {tuple(output.shape)}",
                _MISMATCH_HINT,
            )
        # Class probabilities are at most 1, so objectness alone must pass: a cheap first cut.
        first, _ = _keep(t[:, 4], head, floor)
        rows = t[first]
        cls = rows[:, 5:].argmax(axis=1)
        probs = _scores(rows[:, 4], head) * _scores(rows[np.arange(rows.shape[0]), 5 + cls], head)
        ok = probs >= head.score_threshold
        rows, cls, probs = rows[ok], cls[ok], probs[ok]
        cxcywh = rows[:, :4].astype(np.float64)
    half = cxcywh[:, 2:4] / 2
    boxes = np.concatenate([cxcywh[:, :2] - half, cxcywh[:, :2] + half], axis=1)
    return boxes, probs, cls.astype(np.int64), np.zeros((boxes.shape[0], 0, 2))


def decode_tflite_postprocess(outputs: Sequence[np.ndarray], input_hw: tuple[int, int]) -> Candidates:
    """``TFLite_Detection_PostProcess``'s outputs (boxes, classes, scores, count) as candidates, in input pixels.

    Its boxes are ``[ymin, xmin, ymax, xmax]`` in [0, 1]; only the first ``count`` rows
    are real.  Nothing is thresholded or suppressed here: the graph did that already.
    """
    import numpy as np

    if len(outputs) != 4:
        raise RunError(
            f"TFLite_Detection_PostProcess has 4 outputs (boxes, classes, scores, count), got {len(outputs)}",
            _MISMATCH_HINT,
        )
    boxes, classes, scores, count = (np.asarray(o) for o in outputs)
    b = boxes.reshape(-1, 4)
    n = min(int(count.reshape(-1)[0]), b.shape[0]) if count.size else b.shape[0]
    in_h, in_w = input_hw
    yx = b[:n].astype(np.float64)
    out = np.stack([yx[:, 1] * in_w, yx[:, 0] * in_h, yx[:, 3] * in_w, yx[:, 2] * in_h], axis=1)
    return (
        out,
        scores.reshape(-1)[:n].astype(np.float64),
        np.rint(classes.reshape(-1)[:n]).astype(np.int64),
        np.zeros((n, 0, 2)),
    )


def pick_outputs(
    outputs: Sequence[np.ndarray], names: Sequence[str], head: DetectionHead
) -> tuple[np.ndarray, ...]:
    """The outputs the decoder takes, in its order: by the head's ``outputs`` names when all are there, else by shape.

    By shape: ssd's scores are the tensor whose last axis is ``num_classes`` and its boxes
    the one whose last axis is ``4 + 2k`` (session order breaks a tie); yolo's is the one
    rank-3 tensor of its layout; TFLite's post-process keeps the session's order (boxes,
    classes, scores, count), which is how the op defines it.
    """
    if head.outputs and names and all(n in names for n in head.outputs):
        position = {n: i for i, n in enumerate(names)}
        return tuple(outputs[position[n]] for n in head.outputs)
    if head.decoder == "ssd":
        k = head.box_coder.num_keypoints if head.box_coder is not None else 0
        box_i = [i for i, o in enumerate(outputs) if o.ndim >= 2 and o.shape[-1] == 4 + 2 * k]
        score_i = [i for i, o in enumerate(outputs) if o.ndim >= 2 and o.shape[-1] == head.num_classes]
        for b in box_i:
            for s in score_i:
                if b != s:
                    return outputs[b], outputs[s]
        raise RunError(
            f"no pair of outputs looks like ssd boxes (last axis {4 + 2 * k}) and scores "
            f"(last axis {head.num_classes}): {[tuple(o.shape) for o in outputs]}",
            _MISMATCH_HINT,
        )
    if head.decoder == "yolo":
        want = {"channels-first": 4 + head.num_classes, "end2end": 6}.get(
            head.yolo_layout or "", 5 + head.num_classes
        )
        axis = -2 if head.yolo_layout == "channels-first" else -1
        for o in outputs:
            if o.ndim >= 2 and o.shape[axis] == want:
                return (o,)
        raise RunError(
            f"no output has {want} values per box ({head.yolo_layout} yolo, {head.num_classes} classes): "
            f"{[tuple(o.shape) for o in outputs]}",
            _MISMATCH_HINT,
        )
    return tuple(outputs)
