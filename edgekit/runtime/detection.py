"""Detections: what a detector says about a frame, and how its raw outputs become that.

A bundle whose ``model.task`` is ``"detection"`` carries a ``detection`` section
(:class:`edgekit.bundle.manifest.DetectionHead`): the decoder as data.  :class:`Detector`
compiles it once for a model and turns each frame's raw outputs into
:class:`Detection` objects with boxes in the frame's own pixels (mapped back through the
preprocessing's crop or letterbox).  The decoders and NMS are plain functions over arrays
(``edgekit.runtime.decoders``, ``edgekit.runtime.nms``), shared by the build's accuracy
gate, the device's health gate and the frame loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from edgekit.bundle.manifest import DetectionHead
    from edgekit.runtime.preprocessing import PreprocessSpec

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
        raise NotImplementedError


@dataclass(frozen=True)
class Match:
    """How one set of detections compares with a reference set (greedy, best IoU first, same class)."""

    pairs: tuple[tuple[int, int, float], ...]  # (reference index, other index, IoU)
    missed: tuple[int, ...]  # reference indices with no match
    extra: tuple[int, ...]  # other indices that match no reference detection


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes (0 when either is empty)."""
    raise NotImplementedError


def match(reference: Sequence[Detection], other: Sequence[Detection], min_iou: float = MATCH_IOU) -> Match:
    """Pair ``other``'s detections with ``reference``'s: same class, IoU >= ``min_iou``, each used once."""
    raise NotImplementedError


class Detector:
    """A :class:`DetectionHead` compiled for one model: raw outputs of one frame in, detections out.

    ``spec`` is the model's preprocessing (its size and resize mode decide how boxes map
    back to the frame); ``labels`` name the classes (``class N`` past their end).  Anchors
    are generated once here.
    """

    def __init__(self, head: DetectionHead, spec: PreprocessSpec, labels: Sequence[str] = ()) -> None:
        raise NotImplementedError

    def __call__(
        self, outputs: Sequence[np.ndarray], frame_hw: tuple[int, int], output_names: Sequence[str] = ()
    ) -> tuple[Detection, ...]:
        """The frame's detections, best score first, boxes clipped to the frame.

        ``outputs`` are the session's float outputs in its order (``output_names`` their
        names, used when the head names its outputs); ``frame_hw`` is the frame's (height,
        width) before preprocessing.
        """
        raise NotImplementedError
