"""Detections: what a detector says about a frame, and how its raw outputs become that.

A bundle whose ``model.task`` is ``"detection"`` carries a ``detection`` section
(:class:`edgekit.bundle.manifest.DetectionHead`): the decoder as data.  :class:`Detector`
compiles it once for a model and turns each frame's raw outputs into
:class:`Detection` objects with boxes in the frame's own pixels (mapped back through the
preprocessing's crop or letterbox).  The decoders and NMS are plain functions over arrays
(``edgekit.detection.decoders``, ``edgekit.detection.nms``), shared by the build's accuracy
gate, the device's health gate and the frame loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.bundle.manifest import DetectionHead
    from edgekit.processing.preprocessing import PreprocessSpec

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 (x0 <= x1, y0 <= y1)

#: A reference detection is matched by a detection of the same class whose box overlaps it this much.
MATCH_IOU = 0.5


@dataclass(frozen=True)
class Detection:
    """One detected object: its class, score in [0, 1], and box in frame pixels (x0, y0, x1, y1)."""

    class_id: int
    name: str
    score: float
    box: Box
    #: Landmarks in frame pixels, when the model gives them (BlazeFace: eyes, nose, mouth, ears).
    keypoints: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: ``class_id``, ``name``, ``score`` (5 places), ``box`` (1 place)."""
        return {
            "class_id": self.class_id,
            "name": self.name,
            "score": round(self.score, 5),
            "box": [round(v, 1) for v in self.box],
        }


@dataclass(frozen=True)
class Match:
    """How one set of detections compares with a reference set (greedy, best IoU first, same class)."""

    pairs: tuple[tuple[int, int, float], ...]  # (reference index, other index, IoU)
    missed: tuple[int, ...]  # reference indices with no match
    extra: tuple[int, ...]  # other indices that match no reference detection


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes (0 when either is empty)."""
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    if a[2] <= a[0] or a[3] <= a[1] or b[2] <= b[0] or b[3] <= b[1]:
        return 0.0
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return inter / (area_a + area_b - inter)


def match(reference: Sequence[Detection], other: Sequence[Detection], min_iou: float = MATCH_IOU) -> Match:
    """Pair ``other``'s detections with ``reference``'s: same class, IoU >= ``min_iou``, each used once.

    Greedy over every same-class pair, highest IoU first; equal IoUs go to the lower
    reference index, then the lower other index, so the pairing is the same on every run.
    ``pairs`` come in that order.
    """
    candidates = sorted(
        (-v, r, o)
        for r, ref in enumerate(reference)
        for o, det in enumerate(other)
        if ref.class_id == det.class_id and (v := iou(ref.box, det.box)) >= min_iou
    )
    used_r: set[int] = set()
    used_o: set[int] = set()
    pairs = []
    for negative, r, o in candidates:
        if r not in used_r and o not in used_o:
            used_r.add(r)
            used_o.add(o)
            pairs.append((r, o, -negative))
    return Match(
        pairs=tuple(pairs),
        missed=tuple(r for r in range(len(reference)) if r not in used_r),
        extra=tuple(o for o in range(len(other)) if o not in used_o),
    )


class Detector:
    """A :class:`DetectionHead` compiled for one model: raw outputs of one frame in, detections out.

    ``spec`` is the model's preprocessing (its size and resize mode decide how boxes map
    back to the frame); ``labels`` name the classes (``class N`` past their end).  Anchors
    are generated once here.
    """

    def __init__(self, head: DetectionHead, spec: PreprocessSpec, labels: Sequence[str] = ()) -> None:
        from edgekit.detection.decoders import logit_floor, ssd_anchors

        self.head = head
        self.spec = spec
        self.labels = tuple(labels)
        self.anchors: np.ndarray | None = None
        if head.decoder == "ssd" and head.anchors is not None:
            if tuple(head.anchors.input_size) != tuple(spec.size):
                raise EdgekitError(
                    f"the ssd anchors tile a {head.anchors.input_size[0]}x{head.anchors.input_size[1]} input "
                    f"but the model's preprocessing makes {spec.size[0]}x{spec.size[1]}",
                    "make the detection section's anchors.input_size the preprocessing size, and rebuild",
                )
            self.anchors = ssd_anchors(head.anchors)
        self._floor = logit_floor(head)
        # Frames from one source share one size: the mapping back is computed once per size.
        self._mapping: tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray] | None = None

    def _name(self, class_id: int) -> str:
        return self.labels[class_id] if 0 <= class_id < len(self.labels) else f"class {class_id}"

    def _to_frame(self, frame_hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scale, offset, upper bound) per coordinate of an x0, y0, x1, y1 row, for this frame size."""
        import numpy as np

        from edgekit.processing.preprocessing import placement

        if self._mapping is None or self._mapping[0] != frame_hw:
            sx, sy, ox, oy = placement(self.spec, *frame_hw).scale_offset()
            h, w = frame_hw
            self._mapping = (
                frame_hw,
                np.array([sx, sy, sx, sy]),
                np.array([ox, oy, ox, oy]),
                np.array([w, h, w, h], np.float64),
            )
        return self._mapping[1], self._mapping[2], self._mapping[3]

    def decode(
        self, outputs: Sequence[np.ndarray], output_names: Sequence[str] = ()
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The candidates after the threshold and NMS, best first, in model-input pixels: boxes, scores, classes, keypoints."""
        from edgekit.detection import decoders, nms

        head = self.head
        picked = decoders.pick_outputs(outputs, output_names, head)
        if head.decoder == "ssd" and self.anchors is not None and head.box_coder is not None:
            boxes, scores, classes, points = decoders.decode_ssd(
                picked[0], picked[1], self.anchors, head.box_coder, head, self._floor
            )
        elif head.decoder == "yolo":
            boxes, scores, classes, points = decoders.decode_yolo(
                picked[0], head, self.spec.size, self._floor
            )
        else:
            boxes, scores, classes, points = decoders.decode_tflite_postprocess(picked, self.spec.size)
            ok = scores >= head.score_threshold
            boxes, scores, classes, points = boxes[ok], scores[ok], classes[ok], points[ok]
        if not scores.shape[0]:
            return boxes, scores, classes, points
        if head.nms == "weighted":
            return nms.weighted_nms(boxes, scores, classes, points, head.iou_threshold, head.max_detections)
        if head.nms == "hard":
            keep = nms.hard_nms(boxes, scores, classes, head.iou_threshold, head.max_detections)
        else:
            keep = nms.order(scores)[: head.max_detections]
        return boxes[keep], scores[keep], classes[keep], points[keep]

    def __call__(
        self, outputs: Sequence[np.ndarray], frame_hw: tuple[int, int], output_names: Sequence[str] = ()
    ) -> tuple[Detection, ...]:
        """The frame's detections, best score first, boxes clipped to the frame.

        ``outputs`` are the session's float outputs in its order (``output_names`` their
        names, used when the head names its outputs); ``frame_hw`` is the frame's (height,
        width) before preprocessing.  A box that lies wholly outside the frame (in the
        letterbox's bars) is dropped.
        """
        import numpy as np

        boxes, scores, classes, points = self.decode(outputs, output_names)
        if not scores.shape[0]:
            return ()
        scale, offset, bound = self._to_frame(frame_hw)
        frame_boxes = np.clip(boxes * scale + offset, 0, bound)
        frame_points = points * scale[:2] + offset[:2]
        out = []
        for box, score, class_id, kps in zip(
            frame_boxes.tolist(), scores.tolist(), classes.tolist(), frame_points.tolist(), strict=True
        ):
            if box[2] <= box[0] or box[3] <= box[1]:
                continue
            out.append(
                Detection(
                    class_id=class_id,
                    name=self._name(class_id),
                    score=score,
                    box=(box[0], box[1], box[2], box[3]),
                    keypoints=tuple((p[0], p[1]) for p in kps),
                )
            )
        return tuple(out)
