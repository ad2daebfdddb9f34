"""A device judges a detector's artifact by the rule its build applied (``detection_gate.device_bar``).

An artifact the build gated on labelled images (``--eval-coco``: its mAP50 within the allowed
drop) was not held to the agreement rule there.  The build runs it on the frames the bundle
ships and records what it found (``map_gate.eval_frames``); a device (``edgekit bench``, the
health gate) holds it to that.  The DocLayNet YOLOv8n's int8 artifacts lost at most 0.85
points of mAP50 and matched 29 to 31 of fp32's 32 decisive boxes on the smoke pages: before
this rule, the bench left them out of its ranking and a deploy's health gate would refuse them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgekit.bench.report import BenchCandidate, Result
from edgekit.bundle.manifest import ArtifactEntry
from edgekit.detection.agreement import LABELLED_NOTE, DetectionAgreement, DeviceBar, device_bar

THRESHOLD = 0.98


def artifact(matched: int, extra: int, labelled: dict[str, Any] | None) -> ArtifactEntry:
    return ArtifactEntry.model_validate_json(
        json.dumps(
            {
                "name": "onnxruntime-int8-full",
                "backend": "onnxruntime",
                "precision": "int8",
                "path": "artifacts/onnxruntime-int8-full/m.onnx",
                "files": [{"path": "artifacts/onnxruntime-int8-full/m.onnx", "sha256": "0" * 64, "size": 1}],
                "accuracy": {
                    "top1_agreement": matched / 32,
                    "max_abs_logit_diff": 1.0,
                    "eval_images": 36,
                    "smoke_set": True,
                    "passed": True,
                    "allowed_drop": False,
                    "detection": {
                        "reference_detections": 53,
                        "decisive_detections": 32,
                        "matched": matched,
                        "missed": 32 - matched,
                        "extra": extra,
                        "mean_iou": 0.95,
                        "min_iou": 0.84,
                        "max_score_drift": 0.2,
                    },
                },
                "notes": {LABELLED_NOTE: labelled} if labelled is not None else {},
            }
        )  # as a bundle's manifest.json reads
    )


def found(matched: int, extra: int, decisive: int = 32) -> DetectionAgreement:
    return DetectionAgreement(
        frames=36,
        reference=53,
        decisive=decisive,
        matched=matched,
        missed=decisive - matched,
        extra=extra,
        mean_iou=0.95,
        min_iou=0.84,
        max_score_drift=0.2,
    )


PASSED_ON_LABELS = {
    "map50": 0.648,
    "fp32_map50": 0.6535,
    "drop_points": 0.54,
    "max_drop_points": 1.0,
    "passed": True,
    # What the build saw on the frames the bundle ships (not the 36 smoke images' 29 of 32).
    "eval_frames": {"decisive": 10, "matched": 9, "extra": 1},
}


def test_an_artifact_gated_on_labels_is_held_to_what_its_build_saw() -> None:
    bar = device_bar(artifact(29, 1, PASSED_ON_LABELS), THRESHOLD)
    assert bar == DeviceBar(pytest.approx(9 / 10 - (1 - THRESHOLD)), 1)
    assert bar.passed(found(9, 1, decisive=10))  # as at build
    assert bar.passed(found(10, 0, decisive=10))  # better
    assert not bar.passed(found(8, 1, decisive=10))  # one box fewer than the build saw
    assert not bar.passed(found(9, 2, decisive=10))  # one false alarm more


@pytest.mark.parametrize(
    "labelled",
    [
        None,
        {**PASSED_ON_LABELS, "passed": False},
        "passed",
        {**PASSED_ON_LABELS, "eval_frames": None},
        {**PASSED_ON_LABELS, "eval_frames": {"decisive": 10, "matched": "9", "extra": 1}},
    ],
    ids=["agreement-gated", "failed-its-labels", "malformed-note", "not-run-at-build", "malformed-counts"],
)
def test_any_other_artifact_keeps_the_rule(labelled: Any) -> None:
    bar = device_bar(artifact(29, 1, labelled), THRESHOLD)
    assert bar == DeviceBar(THRESHOLD, 0)
    assert not bar.passed(found(29, 1)) and bar.passed(found(32, 0))
    assert device_bar(None, THRESHOLD) == DeviceBar(THRESHOLD, 0)


def test_the_bench_ranks_a_labelled_int8_detector_by_its_build_bar() -> None:
    def result(bar: DeviceBar | None) -> Result:
        cand = BenchCandidate("onnxruntime-int8-full", "onnxruntime", "int8", 2, {}, bar=bar)
        return Result(cand, detection=found(9, 1, decisive=10))

    assert not result(None).passes(THRESHOLD)
    assert result(device_bar(artifact(29, 1, PASSED_ON_LABELS), THRESHOLD)).passes(THRESHOLD)
