"""The detection gate's one rule: does a detector's artifact find what the fp32 reference finds?

Used by the build's accuracy gate (``edgekit.convert.accuracy_detection``, every artifact
against the fp32 ONNX on the evaluation images) and by a device's health gate
(``edgekit.deploy.health``, the selected artifact against the reference detections the
bundle carries), so a bundle is judged the same way on both sides.

Both sides are decoded with the head's score threshold lowered by ``DECISIVE_MARGIN``
(:func:`widened`).  A reference detection is *decisive* when it scores at least
``DECISIVE_MARGIN`` above the threshold: like a classifier's near-tie, a face fp32 itself
scores close to the threshold may fall on either side of it after quantization, so it is
counted and reported but does not fail the gate.

- **missed**: a decisive reference detection that no detection of the artifact matches
  (same class, IoU >= ``MATCH_IOU``).  The artifact is decoded at the lowered threshold, so a
  score that merely wobbles across the threshold is a score drift, not a miss.
- **extra**: an artifact detection scoring at least ``DECISIVE_MARGIN`` above the threshold
  that matches no reference detection, the reference too decoded at the lowered threshold (so
  an artifact scoring a bit higher than fp32 on a near-threshold face is no extra either).
- **agreement**: matched decisive / decisive (1.0 when no detection is decisive).

It passes when the agreement reaches the build's threshold (0.98 by default, as for
classification) **and** there is no extra.  Extras get no allowance because they have no
denominator to share one with: a decisive detection where fp32 sees nothing even at the
lowered threshold is a false alarm a camera acts on, and the evaluation images hold few
objects (the smoke set: a handful of faces), so "98% of them" would allow none anyway.
IoU and score drift are measured over the matched decisive pairs and reported, not gated:
the matching already requires IoU >= 0.5, and the agreement says whether scores held.

**On a device** (``edgekit bench``, the health gate) an artifact is held to the same rule,
unless the build gated it on labelled images (``--eval-coco``: its mAP50 within the allowed
drop, ``LABELLED_NOTE`` in its notes).  That gate replaced the agreement rule: an int8 YOLO
that loses 0.5 points of mAP50 may still move a few boxes of the evaluation frames past IoU
0.5.  Such an artifact is held to what its build saw on those same frames (:func:`device_bar`):
the device checks that it computes here as it did there, not a rule the build did not apply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgekit.detection.detector import MATCH_IOU, Detection, match

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import ArtifactEntry, DetectionHead, EvalDetection
    from edgekit.processing.preprocessing import PreprocessSpec

#: How far above the score threshold a reference detection must be to count (and an artifact's
#: detection to be an extra); both sides are decoded this far below it.
DECISIVE_MARGIN = 0.10
#: The note of an artifact the build gated on labelled images (``edgekit.convert.coco_gate``).
LABELLED_NOTE = "map_gate"


def widened(head: DetectionHead) -> DetectionHead:
    """``head`` with its score threshold lowered by ``DECISIVE_MARGIN``: how both sides are decoded."""
    return head.model_copy(update={"score_threshold": max(0.0, head.score_threshold - DECISIVE_MARGIN)})


def gate_detector(
    session: Session, head: DetectionHead, spec: PreprocessSpec, labels: Sequence[str]
) -> Callable[[np.ndarray], tuple[Detection, ...]]:
    """Frame (BGR or grey) -> ``session``'s detections, decoded as both gates compare them
    (:func:`widened`): the build's scoring of the frames a bundle ships and a device's health gate."""
    from edgekit.detection.detector import Detector
    from edgekit.processing.preprocessing import Preprocessor, as_bgr
    from edgekit.processing.tensors import from_output

    detector = Detector(widened(head), spec, list(labels))
    prep = Preprocessor(spec, session.inputs[0], image_color="BGR")
    names = [o.name for o in session.outputs]

    def detect(frame: np.ndarray) -> tuple[Detection, ...]:
        image, _ = as_bgr(frame)
        raw = session.run(prep(image))
        outputs = [from_output(y, o) for y, o in zip(raw, session.outputs, strict=True)]
        found: tuple[Detection, ...] = detector(outputs, (int(image.shape[0]), int(image.shape[1])), names)
        return found

    return detect


def reference_detections(stored: Sequence[EvalDetection] | None, labels: Sequence[str]) -> list[Detection]:
    """A shipped evaluation frame's fp32 detections as :class:`Detection` values, to compare against."""
    return [
        Detection(
            d.class_id,
            labels[d.class_id] if d.class_id < len(labels) else f"class {d.class_id}",
            d.score,
            d.box,
        )
        for d in stored or ()
    ]


def decisive_score(head: DetectionHead) -> float:
    """The score at and above which a detection is decisive."""
    return head.score_threshold + DECISIVE_MARGIN


@dataclass(frozen=True)
class FrameAgreement:
    """One frame: the artifact's detections against the reference's, both decoded by :func:`widened`."""

    reference: int  # reference detections (at the lowered threshold)
    decisive: int
    matched: int  # decisive reference detections matched
    missed: int
    extra: int
    matched_all: int = 0  # reference detections matched, near-threshold ones included
    #: (IoU, |score - reference score|) of each matched decisive reference detection.
    pairs: tuple[tuple[float, float], ...] = ()

    @property
    def ok(self) -> bool:
        """No miss and no extra on this frame."""
        return self.missed == 0 and self.extra == 0


def compare_frame(
    reference: Sequence[Detection], other: Sequence[Detection], head: DetectionHead
) -> FrameAgreement:
    """Compare one frame's detections (both decoded with :func:`widened` ``head``)."""
    floor = decisive_score(head)
    m = match(reference, other, MATCH_IOU)
    paired = {r: (o, overlap) for r, o, overlap in m.pairs}
    decisive = [i for i, d in enumerate(reference) if d.score >= floor]
    pairs = tuple(
        (paired[i][1], abs(other[paired[i][0]].score - reference[i].score)) for i in decisive if i in paired
    )
    used = {o for _, o, _ in m.pairs}
    extra = sum(1 for j, d in enumerate(other) if d.score >= floor and j not in used)
    return FrameAgreement(
        reference=len(reference),
        decisive=len(decisive),
        matched=len(pairs),
        missed=len(decisive) - len(pairs),
        extra=extra,
        matched_all=len(m.pairs),
        pairs=pairs,
    )


@dataclass(frozen=True)
class DetectionAgreement:
    """Frames' :class:`FrameAgreement` summed: the numbers a gate decides on and reports."""

    frames: int
    reference: int
    decisive: int
    matched: int
    missed: int
    extra: int
    #: Over the matched decisive pairs; with none, 0.0 if a detection was decisive (nothing it
    #: found overlaps) and 1.0 if none was (nothing to move).
    mean_iou: float
    min_iou: float
    max_score_drift: float
    matched_all: int = 0  # reference detections matched, near-threshold ones included
    failing: tuple[int, ...] = field(default=())  # indices of frames with a miss or an extra

    @property
    def rate(self) -> float:
        """Matched decisive / decisive; 1.0 when no reference detection is decisive."""
        return self.matched / self.decisive if self.decisive else 1.0

    @property
    def all_rate(self) -> float:
        """Matched / every reference detection, near-threshold ones included (1.0 when none)."""
        return self.matched_all / self.reference if self.reference else 1.0

    def passed(self, threshold: float) -> bool:
        """The gate: agreement at least ``threshold`` and no extra (see the module's docstring)."""
        return self.rate >= threshold and self.extra == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "reference_detections": self.reference,
            "decisive_detections": self.decisive,
            "matched": self.matched,
            "missed": self.missed,
            "extra": self.extra,
            "agreement": self.rate,
            "mean_iou": self.mean_iou,
            "min_iou": self.min_iou,
            "max_score_drift": self.max_score_drift,
        }


def summarize(frames: Sequence[FrameAgreement]) -> DetectionAgreement:
    """The gate's numbers over ``frames``."""
    ious = [iou for f in frames for iou, _ in f.pairs]
    drifts = [drift for f in frames for _, drift in f.pairs]
    nothing = 0.0 if any(f.decisive for f in frames) else 1.0
    return DetectionAgreement(
        frames=len(frames),
        reference=sum(f.reference for f in frames),
        decisive=sum(f.decisive for f in frames),
        matched=sum(f.matched for f in frames),
        missed=sum(f.missed for f in frames),
        extra=sum(f.extra for f in frames),
        mean_iou=sum(ious) / len(ious) if ious else nothing,
        min_iou=min(ious, default=nothing),
        max_score_drift=min(1.0, max(drifts, default=0.0)),
        matched_all=sum(f.matched_all for f in frames),
        failing=tuple(i for i, f in enumerate(frames) if not f.ok),
    )


@dataclass(frozen=True)
class DeviceBar:
    """What a device holds an artifact's detections on the bundle's evaluation frames to."""

    agreement: float
    extra: int

    def passed(self, result: DetectionAgreement) -> bool:
        return result.rate >= self.agreement - 1e-9 and result.extra <= self.extra


def device_bar(artifact: ArtifactEntry | None, threshold: float) -> DeviceBar:
    """The build's rule (agreement >= ``threshold``, no extra); for an artifact the build passed on
    labelled images, what its build saw on the frames the bundle ships (its note's ``eval_frames``:
    decisive, matched, extra), with the rule's own slack (1 - threshold)."""
    labelled = artifact.notes.get(LABELLED_NOTE) if artifact is not None else None
    seen = (
        labelled.get("eval_frames") if isinstance(labelled, dict) and labelled.get("passed") is True else None
    )
    got = [seen.get(k) for k in ("decisive", "matched", "extra")] if isinstance(seen, dict) else []
    counts = [n for n in got if type(n) is int and n >= 0]
    if len(counts) != 3:  # a note without them (or not numbers): the rule
        return DeviceBar(threshold, 0)
    decisive, matched, extra = counts
    rate = min(matched, decisive) / decisive if decisive else 1.0
    return DeviceBar(min(threshold, rate - (1.0 - threshold)), extra)
