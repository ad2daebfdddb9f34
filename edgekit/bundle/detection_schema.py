"""A detector's part of the manifest: how its raw outputs decode, and what its gate and reference found.

``DetectionHead`` (with ``SsdAnchors`` and ``BoxCoder``) is the decoder as data, the
manifest's ``detection`` section and a model card's ``[detection]`` table;
``DetectionAccuracy`` is an artifact's ``accuracy.detection``; ``EvalDetection`` one of an
evaluation frame's reference ``detections``.  A classifier's manifest has none of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from edgekit.bundle._schema import Schema


class SsdAnchors(Schema):
    """SSD anchors as MediaPipe's ``SsdAnchorsCalculator`` generates them (BlazeFace, MobileNet-SSD).

    Field names follow MediaPipe's ``SsdAnchorsCalculatorOptions``; sizes are fractions of
    the model input, centres in [0, 1].
    """

    input_size: tuple[int, int] = Field(description="(height, width) of the model input the anchors tile")
    num_layers: int = Field(ge=1, le=16)
    strides: tuple[int, ...] = Field(min_length=1, max_length=16)
    min_scale: float = Field(gt=0, le=4)
    max_scale: float = Field(gt=0, le=4)
    aspect_ratios: tuple[float, ...] = Field(default=(1.0,), min_length=1, max_length=16)
    anchor_offset: tuple[float, float] = (0.5, 0.5)
    reduce_boxes_in_lowest_layer: bool = False
    interpolated_scale_aspect_ratio: float = Field(default=1.0, ge=0, le=16)
    fixed_anchor_size: bool = False

    @model_validator(mode="after")
    def _one_stride_per_layer(self) -> SsdAnchors:
        if len(self.strides) != self.num_layers:
            raise ValueError(f"strides has {len(self.strides)} entries for {self.num_layers} layers")
        return self


class BoxCoder(Schema):
    """How raw SSD box outputs decode against their anchors (MediaPipe's ``TensorsToDetectionsCalculator``).

    Each raw row is ``[dy, dx, dh, dw]`` (``reverse_output_order``: ``[dx, dy, dw, dh]``, as
    BlazeFace) followed by ``num_keypoints`` pairs; centres are ``anchor + d / scale *
    anchor_size``, sizes ``d / scale * anchor_size`` (``apply_exponential``: ``exp(d / scale)``).
    """

    x_scale: float = Field(gt=0)
    y_scale: float = Field(gt=0)
    w_scale: float = Field(gt=0)
    h_scale: float = Field(gt=0)
    num_keypoints: int = Field(default=0, ge=0, le=64)
    reverse_output_order: bool = False
    apply_exponential: bool = False


class DetectionHead(Schema):
    """How a detector's raw outputs become detections: the decoder, as data.

    ``decoder``:
    - ``ssd``: a box tensor ``[1, N, 4 + 2k]`` and a score tensor ``[1, N, classes]`` decoded
      against ``anchors`` with ``box_coder``;
    - ``yolo``: one tensor, ``[1, 4 + classes, N]`` (``yolo_layout = "channels-first"``, the
      common Ultralytics export) or ``[1, N, 5 + classes]`` (``"rows"``: box, objectness,
      classes), boxes as centre x, centre y, width, height in input pixels; or ``[1, N, 6]``
      (``"end2end"``: NMS already in the graph, as YOLOv10/YOLO26 and ``nms=True`` exports give:
      rows of x0, y0, x1, y1, score, class, padded with zero scores);
    - ``tflite-postprocess``: the model ends in TFLite's ``TFLite_Detection_PostProcess`` (boxes
      ``[ymin, xmin, ymax, xmax]`` in [0, 1], classes, scores, count): passed through.

    Scores below ``score_threshold`` are dropped, then non-maximum suppression (``hard``, or
    MediaPipe's ``weighted`` blending of overlapping boxes) at ``iou_threshold``, keeping at
    most ``max_detections``.
    """

    decoder: Literal["ssd", "yolo", "tflite-postprocess"]
    num_classes: int = Field(ge=1, le=100_000)
    score_threshold: float = Field(ge=0, le=1)
    iou_threshold: float = Field(default=0.5, ge=0, le=1)
    nms: Literal["hard", "weighted", "none"] = "hard"
    max_detections: int = Field(default=100, ge=1, le=10_000)
    #: Scores are logits that need a sigmoid (MediaPipe's ``sigmoid_score``); ``score_clipping``
    #: clips the logits first (MediaPipe's ``score_clipping_thresh``).
    sigmoid_scores: bool = False
    score_clipping: float | None = Field(default=None, gt=0)
    #: Output names in decoding order (ssd: boxes, scores); empty: told apart by shape.
    outputs: tuple[str, ...] = Field(default=(), max_length=8)
    anchors: SsdAnchors | None = None
    box_coder: BoxCoder | None = None
    yolo_layout: Literal["channels-first", "rows", "end2end"] | None = None

    @model_validator(mode="after")
    def _decoder_has_its_parameters(self) -> DetectionHead:
        if self.decoder == "ssd" and (self.anchors is None or self.box_coder is None):
            raise ValueError("an ssd decoder needs anchors and box_coder")
        if self.decoder == "yolo" and self.yolo_layout is None:
            raise ValueError("a yolo decoder needs yolo_layout ('channels-first', 'rows' or 'end2end')")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DetectionHead:
        """From a model card's ``[detection]`` table or a manifest (JSON's types: lists, not tuples)."""
        return cls.model_validate_json(json.dumps(data))


class DetectionAccuracy(Schema):
    """A detector's artifact against the fp32 reference's detections on the evaluation images."""

    reference_detections: int = Field(ge=0)
    decisive_detections: int = Field(ge=0, description="reference detections well above the score threshold")
    matched: int = Field(ge=0, description="decisive reference detections matched (same class, IoU >= 0.5)")
    missed: int = Field(ge=0, description="decisive reference detections with no match")
    extra: int = Field(
        ge=0, description="decisive detections of the artifact that match no reference detection"
    )
    mean_iou: float = Field(ge=0, le=1, description="over matched pairs")
    min_iou: float = Field(ge=0, le=1)
    max_score_drift: float = Field(
        ge=0, le=1, description="largest |score - reference score| over matched pairs"
    )


class EvalDetection(Schema):
    """One detection of the fp32 reference on an evaluation frame."""

    class_id: int = Field(ge=0)
    score: float = Field(ge=0, le=1)
    box: tuple[float, float, float, float] = Field(description="x0, y0, x1, y1 in frame pixels")
