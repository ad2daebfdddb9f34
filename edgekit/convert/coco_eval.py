"""mAP on a user's labelled images: a detector's artifact, run as a device runs it, scored by pycocotools.

Each image is read from disk, preprocessed by the frame loop's ``Preprocessor`` (the
bundle's resize or letterbox), run, and decoded by the bundle's own
:class:`edgekit.detection.detector.Detector` (decoder, NMS, boxes mapped back to the image's
pixels), with the score threshold lowered to ``EVAL_SCORE_THRESHOLD`` and up to
``EVAL_MAX_DETECTIONS`` kept, as Ultralytics' ``val`` does: mAP integrates over the whole
precision/recall curve, so the low-score tail counts.  NMS keeps the bundle's own IoU
threshold (Ultralytics' val uses 0.7): the boxes measured are the ones a device would give.
pycocotools' ``COCOeval`` then gives mAP50-95 (COCO's AP, IoU 0.50:0.95) and mAP50, over the
categories the model's classes map to (``edgekit.convert.coco_data.class_ids``).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.backends.base import Session
    from edgekit.bundle.manifest import DetectionHead
    from edgekit.convert.coco_data import CocoSet
    from edgekit.processing.preprocessing import PreprocessSpec

#: Ultralytics ``val``'s defaults (``conf=0.001``, ``max_det=300``): the numbers its mAP is quoted at.
EVAL_SCORE_THRESHOLD = 0.001
EVAL_MAX_DETECTIONS = 300

#: (images done, images in all) after each image.
ImageProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class CocoScore:
    """One model's mAP on a labelled set (fractions in [0, 1])."""

    map50_95: float
    map50: float
    images: int
    boxes: int  # ground-truth boxes
    detections: int  # the model's, at the evaluation threshold, on mapped classes

    def to_dict(self) -> dict[str, Any]:
        return {
            "map50_95": round(self.map50_95, 5),
            "map50": round(self.map50, 5),
            "images": self.images,
            "boxes": self.boxes,
            "detections": self.detections,
        }


def eval_head(head: DetectionHead) -> DetectionHead:
    """``head`` decoding as mAP is measured: every candidate down to 0.001, up to 300 an image."""
    return head.model_copy(
        update={"score_threshold": EVAL_SCORE_THRESHOLD, "max_detections": EVAL_MAX_DETECTIONS}
    )


def detect(
    session: Session,
    head: DetectionHead,
    spec: PreprocessSpec,
    coco: CocoSet,
    mapping: Mapping[int, int],
    progress: ImageProgress | None = None,
) -> list[dict[str, Any]]:
    """``session``'s detections on every image of ``coco``, as COCO results (mapped classes only)."""
    import cv2

    from edgekit.detection.detector import Detector
    from edgekit.processing.preprocessing import Preprocessor
    from edgekit.processing.tensors import from_output

    detector = Detector(eval_head(head), spec)
    prep = Preprocessor(spec, session.inputs[0], image_color="BGR")
    names = [o.name for o in session.outputs]
    results: list[dict[str, Any]] = []
    for done, image in enumerate(coco.images, 1):
        bgr = cv2.imread(str(image.path), cv2.IMREAD_COLOR)
        if bgr is None:
            raise EdgekitError(
                f"image {image.file_name} of {coco.annotations} cannot be decoded",
                "replace it with a readable .jpg/.png, or drop its entry",
            )
        h, w = bgr.shape[:2]
        if image.width is not None and (image.width, image.height) != (w, h):
            raise EdgekitError(
                f"image {image.file_name} is {w}x{h} but {coco.annotations} says {image.width}x{image.height}",
                "the boxes are in the listed size's pixels: pass the images they were drawn on",
            )
        ys = session.run(prep(bgr))
        outputs = [from_output(y, s) for y, s in zip(ys, session.outputs, strict=True)]
        for d in detector(outputs, (h, w), names):
            cat = mapping.get(d.class_id)
            if cat is None:
                continue
            x0, y0, x1, y1 = d.box
            results.append(
                {
                    "image_id": image.id,
                    "category_id": cat,
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                    "score": d.score,
                }
            )
        if progress is not None:
            progress(done, len(coco.images))
    return results


def score(coco: CocoSet, results: Sequence[Mapping[str, Any]], mapping: Mapping[int, int]) -> CocoScore:
    """COCOeval's mAP50-95 and mAP50 of ``results`` against ``coco``, over the mapped categories."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError as err:
        raise EdgekitError(
            f"pycocotools is not installed ({err})", 'pip install "edgekit[build]" (it brings pycocotools)'
        ) from err
    images = len(coco.images)
    if not results:  # loadRes refuses an empty list; nothing found is mAP 0
        return CocoScore(0.0, 0.0, images, coco.boxes, 0)
    quiet = io.StringIO()  # pycocotools prints its progress and table on stdout
    with contextlib.redirect_stdout(quiet):
        gt = COCO()
        gt.dataset = {k: list(v) for k, v in coco.dataset.items()}
        gt.createIndex()
        dt = gt.loadRes([dict(r) for r in results])
        ev = COCOeval(gt, dt, "bbox")
        ev.params.imgIds = [m.id for m in coco.images]
        ev.params.catIds = sorted(set(mapping.values()) & coco.used_categories())
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    stats = [max(0.0, float(v)) for v in ev.stats[:2]]  # -1: no ground truth in range
    return CocoScore(stats[0], stats[1], images, coco.boxes, len(results))


def evaluate(
    session: Session,
    head: DetectionHead,
    spec: PreprocessSpec,
    coco: CocoSet,
    mapping: Mapping[int, int],
    progress: ImageProgress | None = None,
) -> CocoScore:
    """``session``'s mAP on ``coco``: :func:`detect`, then :func:`score`."""
    return score(coco, detect(session, head, spec, coco, mapping, progress), mapping)
