"""The accuracy gate for detectors: does an artifact find the boxes the fp32 reference finds?

Each artifact's raw outputs and the fp32 ONNX's are decoded by the same
:class:`edgekit.detection.detector.Detector` (the model card's head, its score threshold
lowered by ``DECISIVE_MARGIN``) on every evaluation image, boxes in the image's own pixels,
and compared by the one rule a device's health gate uses too
(:mod:`edgekit.detection.agreement`: decisive reference detections must be matched at
IoU >= 0.5 by the same class, no decisive extra).  The result is a :class:`GateAccuracy`
whose ``top1_agreement`` is the share of decisive reference detections matched, with the
detection numbers (missed, extra, mean and min IoU, score drift) beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgekit.convert.accuracy import DEFAULT_THRESHOLD, GateAccuracy
from edgekit.detection.agreement import compare_frame, summarize, widened
from edgekit.detection.detector import Detection, Detector

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.base import TensorSpec
    from edgekit.bundle.manifest import DetectionHead
    from edgekit.convert.modelcard import ModelCard
    from edgekit.processing.preprocessing import PreprocessSpec


def detection_head(card: ModelCard) -> DetectionHead | None:
    """The card's detection head when it is a detector (``task = "detection"``), else None."""
    head: DetectionHead | None = getattr(card, "detection", None)
    return head if getattr(card, "task", "classification") == "detection" else None


class DetectionReference:
    """The fp32 reference's detections on the evaluation images, and the decoder that made them.

    ``outputs`` are the reference's raw outputs (``accuracy.run_outputs``: one ``(N, ...)``
    array per output, in ``output_names`` order); ``frame_hw`` each image's (height, width).
    """

    def __init__(
        self,
        head: DetectionHead,
        spec: PreprocessSpec,
        labels: Sequence[str],
        outputs: Sequence[np.ndarray],
        output_names: Sequence[str],
        frame_hw: Sequence[tuple[int, int]],
    ) -> None:
        self.head = head
        self.output_names = tuple(output_names)
        self.frame_hw = tuple(frame_hw)
        self.outputs = tuple(outputs)
        self.detector = Detector(widened(head), spec, labels)
        self.detections = self.decode(outputs)

    def decode(self, outputs: Sequence[np.ndarray]) -> tuple[tuple[Detection, ...], ...]:
        """Every image's detections from a model's stacked outputs (reference order and names)."""
        if len(outputs) != len(self.output_names):
            raise ValueError(f"{len(outputs)} outputs given, the reference has {len(self.output_names)}")
        return tuple(
            self.detector([o[i : i + 1] for o in outputs], hw, self.output_names)
            for i, hw in enumerate(self.frame_hw)
        )

    def compare(
        self,
        outputs: Sequence[np.ndarray],
        names: Sequence[str],
        smoke_set: bool,
        threshold: float = DEFAULT_THRESHOLD,
    ) -> GateAccuracy:
        """An artifact's stacked outputs (in the reference's output order) against the reference."""
        import numpy as np

        frames = [
            compare_frame(ref, got, self.head)
            for ref, got in zip(self.detections, self.decode(outputs), strict=True)
        ]
        result = summarize(frames)
        diff = max(
            (
                float(np.abs(o.astype(np.float64) - r.astype(np.float64)).max())
                for o, r in zip(outputs, self.outputs, strict=True)
            ),
            default=0.0,
        )
        decisive_images = sum(1 for f in frames if f.decisive)
        return GateAccuracy(
            top1_agreement=result.rate,
            top1_agreement_all=result.all_rate,
            decisive_images=decisive_images,
            eval_images=len(names),
            max_abs_logit_diff=diff,
            flipped=tuple(
                f"{names[i]} (missed {frames[i].missed}, extra {frames[i].extra})" for i in result.failing
            ),
            smoke_set=smoke_set,
            threshold=threshold,
            passed=result.passed(threshold),
            detection=result,
        )


def align_outputs(reference: Sequence[TensorSpec], got: Sequence[TensorSpec]) -> list[int]:
    """Which of ``got``'s outputs is each of the reference's: ``got[order[k]]`` is reference output ``k``.

    Converters keep the graph's output order (checked for litert-torch, OpenVINO, TVM), but
    not always its names (LiteRT calls them ``serving_default_output_0``): outputs are paired
    by name when every reference name is there, else by position, and their shapes must agree
    either way (``ValueError`` naming both otherwise).
    """

    def dims(spec: TensorSpec) -> tuple[int | None, ...]:
        return tuple(spec.shape)

    ref_names = [s.name for s in reference]
    got_names = [s.name for s in got]
    if len(got) != len(reference):
        raise ValueError(
            f"it has {len(got)} outputs, the fp32 model {len(reference)} ({', '.join(ref_names)})"
        )
    order = (
        [got_names.index(n) for n in ref_names] if set(ref_names) <= set(got_names) else list(range(len(got)))
    )
    for k, j in enumerate(order):
        if not _same_shape(dims(reference[k]), dims(got[j])):
            shown = ", ".join(f"{s.name} {list(s.shape)}" for s in got)
            raise ValueError(
                f"its outputs ({shown}) are not the fp32 model's "
                f"({', '.join(f'{s.name} {list(s.shape)}' for s in reference)}) in order"
            )
    return order


def _same_shape(a: Sequence[int | None], b: Sequence[int | None]) -> bool:
    """Equal shapes, a free dimension matching any size."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))
