"""Turn a finished build into a bundle: the manifest's sections from the build, then write (and sign).

The bundle also carries a few evaluation frames for the device's health gate: JPEGs of
the build's evaluation images with the fp32 reference's top-1 on each.  The reference is
computed on the JPEG *as decoded*, through the same ``Preprocessor`` a device runs, so
the device compares against exactly what fp32 said about the bytes it holds.  The frames
with the clearest fp32 answers are kept: the gate is a device-side sanity check (a broken
artifact, a runtime that computes differently), the build's accuracy gate did the rest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.convert.images import ImageSet
from edgekit.core.packages import installed_versions

if TYPE_CHECKING:
    import numpy as np

    from edgekit.bundle.manifest import DetectionAccuracy, DetectionHead
    from edgekit.convert.accuracy import GateAccuracy
    from edgekit.convert.build_records import ArtifactReport, BuildRequest
    from edgekit.convert.bundle_writer import EvalSamples
    from edgekit.convert.modelcard import ModelCard
    from edgekit.device.profiles import DeviceProfile

EVAL_FRAMES = 8  # enough to catch a broken artifact, small enough to keep a bundle small (~25 kB each)
EVAL_SHORT_SIDE = 256  # stored frames are shrunk to this short side (or the model's input, if larger)
EVAL_JPEG_QUALITY = 90

TOOLS = ("onnxruntime", "openvino", "nncf", "ai-edge-litert", "litert-torch", "apache-tvm", "torch", "onnx")


def tool_versions() -> dict[str, str]:
    """Versions of the converters and runtimes installed on the build host."""
    return installed_versions(TOOLS)


def write(
    req: BuildRequest,
    profile: DeviceProfile,
    fp32: Path,
    fp32_hash: str,
    reports: Sequence[ArtifactReport],
    evals: ImageSet,
    samples: EvalSamples | None = None,
) -> Path:
    """Write the bundle for a build whose artifacts passed the gate (or were allowed through).

    ``samples``: the evaluation frames to ship, when the gate made them already (labelled gating).
    """
    from edgekit.bundle import Accuracy, Latency
    from edgekit.convert.accuracy_detection import detection_head
    from edgekit.convert.bundle_writer import ArtifactResults, bundle_meta, write_bundle
    from edgekit.convert.coco_gate import with_map_note

    meta = bundle_meta(
        req.card,
        profile,
        source_sha256=fp32_hash,
        accuracy_threshold=req.threshold,
        allow_accuracy_drop=req.allow_accuracy_drop,
        tools=tool_versions(),
        serial=req.serial,
    )
    items = []
    for r in reports:
        if r.artifact is None:
            continue
        acc = r.accuracy
        items.append(
            (
                with_map_note(r.artifact, acc),
                ArtifactResults(
                    latency=Latency(p50_ms=r.latency.p50_ms, p99_ms=r.latency.p99_ms, runs=r.latency.runs)
                    if r.latency
                    else None,
                    accuracy=Accuracy(
                        top1_agreement=acc.top1_agreement,
                        max_abs_logit_diff=acc.max_abs_logit_diff,
                        eval_images=acc.eval_images,
                        smoke_set=acc.smoke_set,
                        passed=acc.passed,
                        allowed_drop=not acc.passed,
                        top1_agreement_all=acc.top1_agreement_all,
                        decisive_images=acc.decisive_images,
                        flipped=acc.flipped,
                        threshold=acc.threshold,
                        detection=_detection_accuracy(acc),
                    )
                    if acc
                    else None,
                ),
            )
        )
    head = detection_head(req.card)
    if samples is None:
        samples = (
            eval_samples(fp32, req.card, evals)
            if head is None
            else detection_eval_samples(fp32, req.card, head, evals)
        )
    return write_bundle(req.out, meta, items, req.sign_key, samples)


def _detection_accuracy(acc: GateAccuracy) -> DetectionAccuracy | None:
    """The manifest's detection numbers of a detector's gate result (None for a classifier)."""
    from edgekit.bundle.manifest import DetectionAccuracy

    d = acc.detection
    if d is None:
        return None
    return DetectionAccuracy(
        reference_detections=d.reference,
        decisive_detections=d.decisive,
        matched=d.matched,
        missed=d.missed,
        extra=d.extra,
        mean_iou=min(1.0, max(0.0, d.mean_iou)),
        min_iou=min(1.0, max(0.0, d.min_iou)),
        max_score_drift=d.max_score_drift,
    )


def _stored_frames(evals: ImageSet, spec_size: tuple[int, int]) -> list[tuple[int, str, bytes, np.ndarray]]:
    """Each evaluation image as a device will hold it: shrunk, JPEG-encoded, and decoded back (BGR)."""
    import cv2
    import numpy as np

    short = max(EVAL_SHORT_SIDE, *spec_size)
    stored = []
    for index, (name, rgb) in enumerate(zip(evals.names, evals.images, strict=True)):
        bgr = np.ascontiguousarray(rgb[..., ::-1])
        h, w = bgr.shape[:2]
        if min(h, w) > short:
            scale = short / min(h, w)
            bgr = cv2.resize(
                bgr, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
            )
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, EVAL_JPEG_QUALITY])
        if not ok:
            continue
        data = buf.tobytes()
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if decoded is None:
            continue
        stored.append((index, name, data, decoded))
    return stored


def _reference_backend(fp32: Path) -> str:
    """The runtime that computes the reference: LiteRT for a user's .tflite (a LiteRT-only build), else ONNX Runtime."""
    return "litert" if fp32.suffix == ".tflite" else "onnxruntime"


def eval_samples(fp32: Path, card: ModelCard, evals: ImageSet, count: int = EVAL_FRAMES) -> EvalSamples:
    """The ``count`` evaluation frames fp32 is surest about, as JPEGs with its top-1 on each (decoded).

    ``fp32`` is the reference model (ONNX, or the user's .tflite for a LiteRT-only build).
    """
    import numpy as np

    from edgekit.backends import open_session
    from edgekit.convert.bundle_writer import EvalSample, EvalSamples
    from edgekit.processing.postprocess import softmax
    from edgekit.processing.preprocessing import Preprocessor
    from edgekit.processing.tensors import from_output

    backend = _reference_backend(fp32)
    spec = card.preprocess
    scored: list[tuple[float, int, str, bytes, int]] = []
    with open_session(fp32, backend) as session:
        prep = Preprocessor(spec, session.inputs[0], image_color="BGR")
        for index, name, data, decoded in _stored_frames(evals, spec.size):
            row = from_output(session.run(prep(decoded))[0], session.outputs[0]).reshape(-1)
            probs = softmax(row) if card.output_name != "probabilities" else row.astype(np.float64)
            top2 = np.sort(probs)[-2:]
            margin = min(1.0, max(0.0, float(top2[-1] - top2[0]))) if probs.size > 1 else 1.0
            scored.append((margin, index, name, data, int(np.argmax(row))))
    # The clearest answers first; the evaluation set's order breaks ties, so a build is repeatable.
    chosen = sorted(sorted(scored, key=lambda s: (-s[0], s[1]))[:count], key=lambda s: s[1])
    frames = tuple(
        EvalSample(f"{i:02d}-{_file_stem(name)}.jpg", data, top1, margin)
        for i, (margin, _, name, data, top1) in enumerate(chosen)
    )
    return EvalSamples(frames, reference=f"{backend}-fp32")


def detection_eval_samples(
    fp32: Path, card: ModelCard, head: DetectionHead, evals: ImageSet, count: int = EVAL_FRAMES
) -> EvalSamples:
    """A detector's evaluation frames: JPEGs with the fp32 reference's detections on each (as decoded).

    The detections are decoded as the gates compare them (``detection_gate.widened``: down to
    the score threshold minus the decisive margin), boxes in the stored frame's pixels, so a
    device's health gate applies the build's rule to them; ``top1`` is the best detection's
    class (0 when none) and ``margin`` 0.  Kept: frames with no near-threshold detection (their
    answer is clear), those with decisive detections first, then ones with none, so the gate
    sees both boxes found and nothing found where there is nothing.
    """
    from edgekit.backends import open_session
    from edgekit.bundle.manifest import EvalDetection
    from edgekit.convert.bundle_writer import EvalSample, EvalSamples
    from edgekit.detection.agreement import decisive_score, widened
    from edgekit.detection.detector import Detector
    from edgekit.processing.preprocessing import Preprocessor
    from edgekit.processing.tensors import from_output

    spec = card.preprocess
    detector = Detector(widened(head), spec, card.labels)
    floor = decisive_score(head)
    ranked: list[tuple[tuple[int, int, int], int, str, bytes, tuple[EvalDetection, ...]]] = []
    backend = _reference_backend(fp32)
    with open_session(fp32, backend) as session:
        prep = Preprocessor(spec, session.inputs[0], image_color="BGR")
        names = [o.name for o in session.outputs]
        for index, name, data, decoded in _stored_frames(evals, spec.size):
            raw = session.run(prep(decoded))
            outputs = [from_output(y, o) for y, o in zip(raw, session.outputs, strict=True)]
            found = detector(outputs, (int(decoded.shape[0]), int(decoded.shape[1])), names)
            near = sum(1 for d in found if d.score < floor)
            dets = tuple(
                EvalDetection(
                    class_id=d.class_id,
                    score=min(1.0, max(0.0, float(d.score))),
                    box=tuple(float(v) for v in d.box),  # type: ignore[arg-type]
                )
                for d in found
            )
            ranked.append(((near, 0 if found else 1, index), index, name, data, dets))
    chosen = sorted(sorted(ranked)[:count], key=lambda r: r[1])
    frames = tuple(
        EvalSample(
            f"{i:02d}-{_file_stem(name)}.jpg",
            data,
            top1=dets[0].class_id if dets else 0,
            margin=0.0,
            detections=dets,
        )
        for i, (_, _, name, data, dets) in enumerate(chosen)
    )
    return EvalSamples(frames, reference=f"{backend}-fp32")


def _file_stem(name: str) -> str:
    """A safe file stem from an image's name (a user's eval folder may name files anything)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).stem).strip("._")[:40] or "frame"
