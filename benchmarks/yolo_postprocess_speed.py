"""YOLO postprocess speed: decode + NMS of one 640x640 frame's ``[1, 4 + classes, 8400]`` head, p50 ms.

A channels-first Ultralytics head (COCO's 80 classes: 8400 x 84; a 2-class model: 8400 x 6)
filled as a typical frame leaves it: every anchor scoring near zero in every class except
around a few objects, where a cluster of neighbouring anchors scores above the threshold
(0.25) with jittered boxes, so NMS has a few dozen candidates per object to suppress.
``Detector.decode`` (threshold, best class, boxes to corners, hard NMS per class) is timed
on outputs cycled from a small set, then ``Detector.__call__`` (the same plus boxes back to
a 1280x720 frame's pixels).  The goal: well under 1 ms p50 on one core.

    .venv/bin/python -m benchmarks.yolo_postprocess_speed [--objects 6] [--runs 2000] [--json]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from benchmarks._harness import parse, parser, print_doc, run
from edgekit.bundle.manifest import DetectionHead
from edgekit.core.stats import median
from edgekit.detection.detector import Detector
from edgekit.processing.preprocessing import PreprocessSpec

ANCHORS = 8400  # 80x80 + 40x40 + 20x20 cells of a 640x640 input
SIZE = 640
FRAME_HW = (720, 1280)
VARIANTS = 8  # distinct outputs, cycled: the data is not the same array every call
GOAL_MS = 1.0


def head_output(classes: int, objects: int, rng: np.random.Generator) -> np.ndarray:
    """One frame's ``[1, 4 + classes, 8400]`` output: background everywhere, ``objects`` clusters of candidates."""
    out = np.empty((4 + classes, ANCHORS), np.float32)
    out[:2] = rng.uniform(0, SIZE, (2, ANCHORS))
    out[2:4] = rng.uniform(4, 64, (2, ANCHORS))
    out[4:] = rng.uniform(0, 0.02, (classes, ANCHORS))  # sigmoid scores of empty cells
    for _ in range(objects):
        cls = int(rng.integers(classes))
        centre, size = rng.uniform(100, 540, 2), rng.uniform(40, 300, 2)
        rows = rng.choice(ANCHORS, int(rng.integers(20, 60)), replace=False)  # the anchors that see it
        out[:2, rows] = (centre[:, None] + rng.normal(0, 4, (2, rows.size))).astype(np.float32)
        out[2:4, rows] = (size[:, None] * rng.uniform(0.9, 1.1, (2, rows.size))).astype(np.float32)
        out[4 + cls, rows] = rng.uniform(0.26, 0.95, rows.size).astype(np.float32)
    return out[None]


def p50_ms(call: Any, outputs: list[np.ndarray], runs: int) -> float:
    for y in outputs:  # warm: first calls allocate
        call(y)
    times = []
    for i in range(runs):
        y = outputs[i % len(outputs)]
        t0 = time.perf_counter_ns()
        call(y)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return median(times)


def measure(classes: int, objects: int, runs: int) -> dict[str, Any]:
    head = DetectionHead(
        decoder="yolo",
        yolo_layout="channels-first",
        num_classes=classes,
        score_threshold=0.25,
        iou_threshold=0.45,
        nms="hard",
        max_detections=300,
    )
    spec = PreprocessSpec(size=(SIZE, SIZE), mean=(0, 0, 0), std=(255, 255, 255), resize="letterbox")
    detector = Detector(head, spec)
    rng = np.random.default_rng(classes)
    outputs = [head_output(classes, objects, rng) for _ in range(VARIANTS)]
    kept = statistics.mean(len(detector([y], FRAME_HW)) for y in outputs)
    return {
        "head": f"{ANCHORS}x{4 + classes}",
        "objects": objects,
        "detections": kept,
        "decode_nms_p50_ms": p50_ms(lambda y: detector.decode([y]), outputs, runs),
        "to_frame_p50_ms": p50_ms(lambda y: detector([y], FRAME_HW), outputs, runs),
    }


def render(doc: dict[str, Any]) -> str:
    lines = [f"YOLO decode + NMS, p50 over {doc['runs']} runs (goal: under {GOAL_MS} ms)"]
    for r in doc["rows"]:
        lines.append(
            f"  {r['head']:>8}  {r['objects']} objects ({r['detections']:.1f} kept): "
            f"decode+NMS {r['decode_nms_p50_ms']:.3f} ms, with boxes to frame pixels {r['to_frame_p50_ms']:.3f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, json_flag=True)
    ap.add_argument("--objects", type=int, default=6, help="objects in the frame (candidate clusters)")
    ap.add_argument("--runs", type=int, default=2000)
    args = parse(ap, argv)
    rows = [measure(classes, args.objects, args.runs) for classes in (80, 2)]
    print_doc({"runs": args.runs, "goal_ms": GOAL_MS, "rows": rows}, args.json, render)
    return 0


if __name__ == "__main__":
    run(main)
