"""What the build's mAP gate is asked (``CocoGate``) and what it found for one artifact (``MapGateResult``).

Plain data, below the gate's logic (:mod:`edgekit.convert.coco_gate`) and the build's
request and accuracy records that carry it (:mod:`edgekit.convert.build_records`,
:mod:`edgekit.convert.accuracy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.detection.agreement import LABELLED_NOTE

#: Points of mAP50 an artifact may lose against fp32 by default: quantization costs YOLO-family
#: detectors about this much on COCO when it goes well.
DEFAULT_MAX_MAP_DROP = 1.0
NOTE = LABELLED_NOTE  # read by a device to judge the artifact (detection_gate.device_bar)


@dataclass(frozen=True)
class CocoGate:
    """What ``--eval-coco``/``--eval-images``/``--max-map-drop``/``--class-map`` ask of the build."""

    annotations: Path
    images: Path
    max_map_drop: float = DEFAULT_MAX_MAP_DROP
    class_map: str | None = None


@dataclass(frozen=True)
class MapGateResult:
    """One artifact's mAP on the labelled images against the fp32 reference's, and the verdict."""

    map50: float
    map50_95: float
    fp32_map50: float
    fp32_map50_95: float
    max_drop: float  # points of mAP50
    images: int
    boxes: int
    annotations: str  # the file's name
    #: The artifact on the evaluation frames the bundle ships (JPEGs, as a device decodes them)
    #: against fp32's detections there: decisive, matched, extra.  A device holds the artifact
    #: to these (``detection_gate.device_bar``): the agreement rule did not decide here.
    eval_frames: tuple[int, int, int] | None = None

    @property
    def drop(self) -> float:
        """Points of mAP50 lost against fp32 (negative: gained)."""
        return 100 * (self.fp32_map50 - self.map50)

    @property
    def passed(self) -> bool:
        return self.drop <= self.max_drop

    def to_dict(self) -> dict[str, Any]:
        return {
            "map50": round(self.map50, 5),
            "map50_95": round(self.map50_95, 5),
            "fp32_map50": round(self.fp32_map50, 5),
            "fp32_map50_95": round(self.fp32_map50_95, 5),
            "drop_points": round(self.drop, 3),
            "max_drop_points": self.max_drop,
            "passed": self.passed,
            "images": self.images,
            "boxes": self.boxes,
            "annotations": self.annotations,
            **(
                {"eval_frames": dict(zip(("decisive", "matched", "extra"), self.eval_frames, strict=True))}
                if self.eval_frames
                else {}
            ),
        }

    def failure_row(self, recipe: str) -> str:
        """One line of the failed-gate error."""
        return (
            f"  {recipe:18} mAP50 {100 * self.map50:.2f} against fp32's {100 * self.fp32_map50:.2f}: "
            f"{self.drop:.2f} points lost, at most {self.max_drop:g} allowed "
            f"({self.images} labelled images of {self.annotations}; mAP50-95 {100 * self.map50_95:.2f})"
        )
