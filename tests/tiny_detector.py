"""A tiny SSD-style detector whose boxes are known, and small signed bundles around it (and the tiny classifier).

The detector tiles its 32x32 input into a 4x4 grid of 8x8 cells (one SSD anchor per cell,
fixed size).  A cell's score is its mean brightness (channels averaged, 0..1); its box
regressors are ``[dx, dy, dw, dh] = [0, 0, 8 * score, 8 * score]`` in input pixels, so a
white square filling one cell decodes to exactly that cell and a dark cell to nothing
(score 0, under the threshold).  The ONNX graph emits ``scores`` before ``boxes`` on
purpose: the manifest's head names its outputs, and the decoder must go by the names.

A frame of ``FRAME_W`` x ``FRAME_H`` is squashed to 32x32 by whole factors (4 and 3), so
``square_frame(row, col)`` has its square at ``cell_box(row, col)`` in frame pixels exactly.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from deploy_bundles import resign

from edgekit.bundle import BuildHost, BuildInfo, DeviceInfo, ModelInfo, Preprocess
from edgekit.convert.artifact import Artifact
from edgekit.convert.bundle_writer import ArtifactResults, BundleMeta, write_bundle

import tiny_model

INPUT_HW = 32
CELL = 8
GRID = INPUT_HW // CELL
FRAME_W, FRAME_H = 128, 96  # 4x and 3x the input: area resizing averages whole blocks
SQUARE = "square"
THRESHOLD = 0.5

#: The manifest's detection section for the square detector (SSD anchors, MediaPipe's box coder).
HEAD: dict[str, Any] = {
    "decoder": "ssd",
    "num_classes": 1,
    "score_threshold": THRESHOLD,
    "iou_threshold": 0.3,
    "nms": "hard",
    "max_detections": 10,
    "outputs": ["boxes", "scores"],
    "anchors": {
        "input_size": [INPUT_HW, INPUT_HW],
        "num_layers": 1,
        "strides": [CELL],
        "min_scale": 0.25,
        "max_scale": 0.25,
        "aspect_ratios": [1.0],
        "interpolated_scale_aspect_ratio": 0.0,  # one anchor per cell
        "fixed_anchor_size": True,  # anchor w = h = 1: the regressors are the box size itself
    },
    "box_coder": {
        "x_scale": float(INPUT_HW),
        "y_scale": float(INPUT_HW),
        "w_scale": float(INPUT_HW),
        "h_scale": float(INPUT_HW),
        "reverse_output_order": True,  # [dx, dy, dw, dh], as BlazeFace
    },
}


def write_onnx(path: Path) -> Path:
    """The square detector as ONNX: input [1, 3, 32, 32] in 0..1, outputs scores [1, 16, 1], boxes [1, 16, 4]."""
    from onnx import TensorProto, helper, numpy_helper

    n = GRID * GRID
    inits = [
        numpy_helper.from_array(np.array([1, n, 1], np.int64), "cells_shape"),
        numpy_helper.from_array(np.array([0, 0, CELL, CELL], np.float32), "box_of_score"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["gray"], axes=[1], keepdims=1),
        helper.make_node("AveragePool", ["gray"], ["cells"], kernel_shape=[CELL, CELL], strides=[CELL, CELL]),
        helper.make_node("Reshape", ["cells", "cells_shape"], ["scores"]),  # row-major, as the anchors
        helper.make_node("Mul", ["scores", "box_of_score"], ["boxes"]),  # [1, n, 1] * [4] -> [1, n, 4]
    ]
    graph = helper.make_graph(
        nodes,
        "square-detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, INPUT_HW, INPUT_HW])],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, n, 1]),
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, n, 4]),
        ],
        initializer=inits,
    )
    return tiny_model.save_onnx(graph, path)


def cell_box(row: int, col: int) -> tuple[float, float, float, float]:
    """The frame-pixel box (x0, y0, x1, y1) of grid cell (row, col)."""
    sx, sy = FRAME_W // INPUT_HW * CELL, FRAME_H // INPUT_HW * CELL
    return (float(col * sx), float(row * sy), float((col + 1) * sx), float((row + 1) * sy))


def square_frame(row: int | None, col: int | None = None) -> np.ndarray:
    """A black BGR frame with a white square filling grid cell (row, col); ``None``: no square."""
    frame = np.zeros((FRAME_H, FRAME_W, 3), np.uint8)
    if row is not None and col is not None:
        x0, y0, x1, y1 = (int(v) for v in cell_box(row, col))
        frame[y0:y1, x0:x1] = 255
    return frame


def _meta(name: str, *, labels: tuple[str, ...], mean: float, std: float, resize: str) -> BundleMeta:
    return BundleMeta(
        model=ModelInfo(name=name, version="1.0", source_sha256="ab" * 32, input="input"),
        preprocess=Preprocess(
            size=(INPUT_HW, INPUT_HW),
            mean=(mean, mean, mean),
            std=(std, std, std),
            resize=resize,  # type: ignore[arg-type]  # one of the Literal's values, checked by pydantic
        ),
        device=DeviceInfo(profile="x86_64-cpu", arch="x86_64", budget_ms=33.0),
        build=BuildInfo(
            edgekit="test",
            created=datetime(2026, 12, 1, tzinfo=timezone.utc),
            host=BuildHost(arch="x86_64", cpu="test"),
            accuracy_threshold=0.98,
        ),
        labels=labels,
    )


def _artifacts(onnx: Path, with_openvino: bool) -> list[tuple[Artifact, ArtifactResults]]:
    arts = [(Artifact(onnx, "onnxruntime", "fp32", kind="onnx"), ArtifactResults())]
    if with_openvino:
        import openvino as ov

        xml = onnx.with_suffix(".xml")
        ov.save_model(ov.convert_model(str(onnx)), str(xml), compress_to_fp16=False)
        files = (xml, xml.with_suffix(".bin"))
        arts.append((Artifact(xml, "openvino", "fp32", files=files, kind="openvino-ir"), ArtifactResults()))
    return arts


def detector_bundle(out: Path, key: Path, *, with_openvino: bool = False) -> Path:
    """A signed bundle of the square detector (ONNX Runtime fp32; OpenVINO fp32 too when asked)."""
    work = out.parent / f"{out.name}-src"
    work.mkdir(parents=True, exist_ok=True)
    onnx = write_onnx(work / "square.onnx")
    meta = _meta("square-detector", labels=(SQUARE,), mean=0.0, std=255.0, resize="squash")
    plain = write_bundle(work / "plain", meta, _artifacts(onnx, with_openvino))

    def edit(doc: dict[str, Any]) -> None:
        doc["model"]["task"] = "detection"
        doc["detection"] = json.loads(json.dumps(HEAD))

    resign(plain, out, key, edit=edit)
    shutil.rmtree(work)
    return out


CLASS_NAMES = tuple(f"class-{n}" for n in "abcdefghij")  # tiny_model.NUM_CLASSES of them


def classifier_bundle(out: Path, key: Path, *, free_batch: bool = False) -> Path:
    """A signed bundle of tests/tiny_model.py's classifier (ten classes), ONNX Runtime fp32
    (``free_batch``: its dim 0 free, so that it can infer several frames at once)."""
    work = out.parent / f"{out.name}-src"
    work.mkdir(parents=True, exist_ok=True)
    onnx = tiny_model.write_onnx(work / "tiny.onnx", tiny_model.make_weights(), free_batch=free_batch)
    meta = _meta("tiny-classifier", labels=CLASS_NAMES, mean=127.5, std=127.5, resize="squash")
    plain = write_bundle(work / "plain", meta, _artifacts(onnx, False))
    resign(plain, out, key)
    shutil.rmtree(work)
    return out
