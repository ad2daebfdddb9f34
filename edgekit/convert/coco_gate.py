"""The build's detection gate on labelled images: an artifact may lose at most ``max_map_drop`` points of mAP50.

With ``edgekit build --eval-coco ann.json --eval-images DIR`` the fp32 ONNX and every
artifact are scored on those images (``edgekit.convert.coco_eval``: the device's
preprocessing and decoder, score >= 0.001, 300 detections an image, pycocotools).  An
artifact whose mAP50 is more than ``max_map_drop`` points below fp32's fails the gate as the
agreement gate's failures do (the build stops, or ships it under ``--allow-accuracy-drop``,
recorded).  The fp32-agreement numbers are still measured and recorded beside it; they no
longer decide.  The manifest's ``Accuracy`` has no field for mAP and devices refuse fields
they do not know, so the numbers travel in the artifact's free-form ``notes`` as ``map_gate``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.convert.map_gate import NOTE, CocoGate, MapGateResult
from edgekit.errors import BuildError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import DetectionHead
    from edgekit.convert.accuracy import GateAccuracy
    from edgekit.convert.artifact import Artifact
    from edgekit.convert.bundle_writer import EvalSamples
    from edgekit.convert.gate import Judge
    from edgekit.convert.modelcard import ModelCard


def map_judge(
    gate: CocoGate,
    card: ModelCard,
    head: DetectionHead,
    ref_session: Session,
    agreement: Judge,
    shipped: EvalSamples,
) -> Judge:
    """The build's judge with labels: ``agreement``'s result, passed or failed by mAP50 against fp32.

    The fp32 reference (``ref_session``) is scored here, once, before any artifact.  Each
    artifact is also run on the frames the bundle ships (``shipped``), against fp32's
    detections there: what a device will hold it to (``MapGateResult.eval_frames``).
    """
    from edgekit.convert.coco_data import class_ids, load_coco
    from edgekit.convert.coco_eval import evaluate

    coco = load_coco(gate.annotations, gate.images)
    mapping = class_ids(card.labels, coco, gate.class_map)
    ref = evaluate(ref_session, head, card.preprocess, coco, mapping)

    def judge(session: Session, outputs: list[np.ndarray], chosen: list[int]) -> GateAccuracy:
        # The agreement gate judges the eval set's outputs (or the sample ``chosen``); the mAP
        # is scored on every labelled image, however slow the artifact: labels are the user's claim.
        acc = agreement(session, outputs, chosen)
        got = evaluate(session, head, card.preprocess, coco, mapping)
        result = MapGateResult(
            map50=got.map50,
            map50_95=got.map50_95,
            fp32_map50=ref.map50,
            fp32_map50_95=ref.map50_95,
            max_drop=gate.max_map_drop,
            images=got.images,
            boxes=got.boxes,
            annotations=gate.annotations.name,
            eval_frames=_on_shipped_frames(session, head, card, shipped),
        )
        return replace(acc, passed=result.passed, map_gate=result)

    return judge


def _on_shipped_frames(
    session: Session, head: DetectionHead, card: ModelCard, shipped: EvalSamples
) -> tuple[int, int, int]:
    """``session`` on the bundle's evaluation frames, decoded as the device decodes them (JPEG,
    ``widened`` head): decisive fp32 detections, those it matched, its extras."""
    import cv2
    import numpy as np

    from edgekit.detection.agreement import compare_frame, gate_detector, reference_detections, summarize

    detect = gate_detector(session, head, card.preprocess, card.labels)
    compared = []
    for frame in shipped.frames:
        image = cv2.imdecode(np.frombuffer(frame.data, np.uint8), cv2.IMREAD_COLOR)
        if image is None:  # the build encoded it a moment ago (bundling._stored_frames)
            raise BuildError(f"evaluation frame {frame.name} does not decode", "report this as a bug")
        reference = reference_detections(frame.detections, card.labels)
        compared.append(compare_frame(reference, detect(image), head))
    result = summarize(compared)
    return result.decisive, result.matched, result.extra


def with_map_note(artifact: Artifact, acc: GateAccuracy | None) -> Artifact:
    """``artifact`` with its mAP gate's numbers in its notes (the manifest's place for them), when it had one."""
    if acc is None or acc.map_gate is None:
        return artifact
    return replace(artifact, notes={**artifact.notes, NOTE: acc.map_gate.to_dict()})


def gate_request(
    annotations: Path | None, images: Path | None, max_map_drop: float, class_map: str | None
) -> CocoGate | None:
    """``edgekit build``'s labelled-images flags as a :class:`CocoGate` (None without them), checked."""
    from edgekit.errors import BuildError

    if annotations is None and images is None:
        if class_map is not None:
            raise BuildError(
                "--class-map maps classes for --eval-coco", "give --eval-coco and --eval-images too"
            )
        return None
    if annotations is None or images is None:
        raise BuildError(
            "--eval-coco and --eval-images go together: the annotations and the folder of their images",
            "for example --eval-coco val/annotations.json --eval-images val/images",
        )
    # Read and checked now, not after minutes of conversion.
    from edgekit.convert.coco_data import load_coco

    load_coco(annotations, images)
    return CocoGate(annotations, images, max_map_drop, class_map)
