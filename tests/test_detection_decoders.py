"""Detection's runtime half: anchors, the SSD / YOLO / TFLite decoders, NMS, the mapping back to frame pixels, matching.

Every decoder is checked against constructed tensors whose boxes are known: a box is
written in the head's own terms (anchor-relative offsets, centre and size), decoded, and
must come back where it was placed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgekit.bundle.manifest import DetectionHead, SsdAnchors
from edgekit.convert.modelcard import read_card
from edgekit.convert.package_files import tflite_file
from edgekit.detection import decoders, nms
from edgekit.detection.detector import Detection, Detector, Match, iou, match
from edgekit.errors import EdgekitError, RunError
from edgekit.processing.preprocessing import PreprocessSpec, fit, placement, preprocess, to_frame

MODELS = Path(__file__).parent.parent / "models"

# BlazeFace as MediaPipe configures it (face_detection_short_range_common.pbtxt and _full_range_).
SHORT_ANCHORS = {
    "input_size": [128, 128],
    "num_layers": 4,
    "min_scale": 0.1484375,
    "max_scale": 0.75,
    "strides": [8, 16, 16, 16],
    "fixed_anchor_size": True,
}
FULL_ANCHORS = {**SHORT_ANCHORS, "input_size": [192, 192], "num_layers": 1, "strides": [4]}
FULL_ANCHORS["interpolated_scale_aspect_ratio"] = 0.0
BLAZEFACE = {
    "decoder": "ssd",
    "num_classes": 1,
    "score_threshold": 0.5,
    "iou_threshold": 0.3,
    "nms": "weighted",
    "sigmoid_scores": True,
    "score_clipping": 100.0,
    "anchors": SHORT_ANCHORS,
    "box_coder": {
        "x_scale": 128,
        "y_scale": 128,
        "w_scale": 128,
        "h_scale": 128,
        "num_keypoints": 6,
        "reverse_output_order": True,
    },
}
# MobileNet-SSD (ssd_mobilenet_v2 300x300): varied anchor sizes, [dy, dx, dh, dw], exponential sizes.
MOBILENET_ANCHORS = {
    "input_size": [300, 300],
    "num_layers": 6,
    "min_scale": 0.2,
    "max_scale": 0.95,
    "strides": [16, 32, 64, 128, 256, 512],
    "aspect_ratios": [1.0, 2.0, 0.5, 3.0, 0.3333],
    "reduce_boxes_in_lowest_layer": True,
}
MOBILENET = {
    "decoder": "ssd",
    "num_classes": 3,
    "score_threshold": 0.5,
    "sigmoid_scores": True,
    "anchors": MOBILENET_ANCHORS,
    "box_coder": {"x_scale": 10, "y_scale": 10, "w_scale": 5, "h_scale": 5, "apply_exponential": True},
}


def head(base: dict[str, object], **changes: object) -> DetectionHead:
    return DetectionHead.from_dict({**base, **changes})


def spec(size: tuple[int, int], resize: str) -> PreprocessSpec:
    return PreprocessSpec(size=size, mean=(127.5,) * 3, std=(127.5,) * 3, layout="NHWC", resize=resize)


def anchors_of(data: dict[str, object]) -> SsdAnchors:
    return SsdAnchors.model_validate_json(json.dumps(data))


def logit(p: float) -> float:
    return math.log(p / (1 - p))


# --- anchors ---------------------------------------------------------------------------------


def test_blazeface_anchors_are_mediapipes() -> None:
    short = decoders.ssd_anchors(anchors_of(SHORT_ANCHORS))
    full = decoders.ssd_anchors(anchors_of(FULL_ANCHORS))
    assert short.shape == (896, 4) and full.shape == (2304, 4)
    # Short range: a 16x16 grid with 2 anchors a cell (stride 8), then 8x8 with 6 (three stride-16 layers merged).
    assert short[0].tolist() == short[1].tolist() == [0.03125, 0.03125, 1.0, 1.0]
    assert short[2].tolist() == [0.09375, 0.03125, 1.0, 1.0]
    assert short[511].tolist() == [0.96875, 0.96875, 1.0, 1.0]
    assert short[512].tolist() == short[517].tolist() == [0.0625, 0.0625, 1.0, 1.0]
    assert short[518].tolist() == [0.1875, 0.0625, 1.0, 1.0]
    assert short[895].tolist() == [0.9375, 0.9375, 1.0, 1.0]
    # Full range: one 48x48 grid, one anchor a cell (no interpolated scale).
    assert full[:2, :2] == pytest.approx(np.array([[1 / 96, 1 / 96], [3 / 96, 1 / 96]]))
    assert full[48, :2].tolist() == pytest.approx([1 / 96, 3 / 96])
    assert full[2303].tolist() == pytest.approx([95 / 96, 95 / 96, 1.0, 1.0])


def test_mobilenet_ssd_anchors_have_mediapipes_sizes() -> None:
    a = decoders.ssd_anchors(anchors_of(MOBILENET_ANCHORS))
    # 19x19x3 (the reduced lowest layer) + 10x10x6 + 5x5x6 + 3x3x6 + 2x2x6 + 1x1x6.
    assert a.shape == (1917, 4)
    r2 = math.sqrt(2)
    first = a[:3].astype(np.float64)
    assert first[:, :2] == pytest.approx(np.full((3, 2), 0.5 / 19))
    assert first[:, 2:] == pytest.approx(np.array([[0.1, 0.1], [0.2 * r2, 0.2 / r2], [0.2 / r2, 0.2 * r2]]))
    # Layer 1: scale 0.2 + 0.75 / 5 = 0.35; the sixth anchor is the interpolated sqrt(0.35 * 0.5), ratio 1.
    layer1 = a[1083:1089].astype(np.float64)
    assert layer1[0, :2].tolist() == pytest.approx([0.05, 0.05])
    assert layer1[0, 2:].tolist() == pytest.approx([0.35, 0.35])
    assert layer1[5, 2:].tolist() == pytest.approx([math.sqrt(0.175)] * 2)
    # The last layer's interpolated anchor blends with scale 1.
    assert a[-1, 2:].tolist() == pytest.approx([math.sqrt(0.95)] * 2)


# --- SSD decoding --------------------------------------------------------------------------


def blazeface_outputs(
    anchors: np.ndarray, placed: dict[int, tuple[tuple[float, float, float, float], float]], size: int = 128
) -> tuple[np.ndarray, np.ndarray]:
    """Raw BlazeFace outputs: at each anchor index a box (x0, y0, x1, y1 in input pixels) and a probability.

    Keypoint j sits at (x0 + j, y0 + 2j): known, distinct and inside the box.
    """
    boxes = np.zeros((1, anchors.shape[0], 16), np.float32)
    scores = np.full((1, anchors.shape[0], 1), -20.0, np.float32)
    for i, ((x0, y0, x1, y1), p) in placed.items():
        ax, ay = anchors[i, 0] * size, anchors[i, 1] * size
        # reverse_output_order: [dx, dy, dw, dh], in input pixels because the scales are the input size.
        boxes[0, i, :4] = [(x0 + x1) / 2 - ax, (y0 + y1) / 2 - ay, x1 - x0, y1 - y0]
        for j in range(6):
            boxes[0, i, 4 + 2 * j : 6 + 2 * j] = [x0 + j - ax, y0 + 2 * j - ay]
        scores[0, i, 0] = logit(p)
    return boxes, scores


def test_ssd_decode_gives_back_the_placed_box_score_and_keypoints() -> None:
    h = head(BLAZEFACE)
    anchors = decoders.ssd_anchors(h.anchors)  # type: ignore[arg-type]
    boxes, scores = blazeface_outputs(
        anchors, {100: ((25.0, 42.0, 55.0, 62.0), 0.9), 700: ((3, 4, 120, 90), 0.6)}
    )
    got_boxes, got_scores, classes, points = decoders.decode_ssd(boxes, scores, anchors, h.box_coder, h)  # type: ignore[arg-type]
    assert got_boxes == pytest.approx(np.array([[25, 42, 55, 62], [3, 4, 120, 90]]), abs=1e-4)
    assert got_scores.tolist() == pytest.approx([0.9, 0.6], abs=1e-6)
    assert classes.tolist() == [0, 0]
    assert points.shape == (2, 6, 2)
    assert points[0] == pytest.approx(np.array([[25 + j, 42 + 2 * j] for j in range(6)]), abs=1e-4)


def test_ssd_decode_in_tensorflow_order_with_exponential_sizes_and_classes() -> None:
    h = head(MOBILENET)
    anchors = decoders.ssd_anchors(h.anchors).astype(np.float64)  # type: ignore[arg-type]
    n = anchors.shape[0]
    boxes = np.zeros((1, n, 4), np.float32)
    scores = np.full((1, n, 3), -9.0, np.float32)
    i = 1100
    cx, cy, w, hh = anchors[i]
    # Target: centre (0.3, 0.4), size 0.25 x 0.125 of the input; raw [dy, dx, dh, dw].
    boxes[0, i] = [
        (0.4 - cy) / hh * 10,
        (0.3 - cx) / w * 10,
        math.log(0.125 / hh) * 5,
        math.log(0.25 / w) * 5,
    ]
    scores[0, i] = [logit(0.3), logit(0.2), logit(0.8)]  # class 2 is this anchor's best
    got, s, c, k = decoders.decode_ssd(boxes, scores, anchors, h.box_coder, h)  # type: ignore[arg-type]
    x0, y0, x1, y1 = (0.3 - 0.125) * 300, (0.4 - 0.0625) * 300, (0.3 + 0.125) * 300, (0.4 + 0.0625) * 300
    assert got == pytest.approx(np.array([[x0, y0, x1, y1]]), abs=1e-3)
    assert c.tolist() == [2] and s.tolist() == pytest.approx([0.8], abs=1e-6)
    assert k.shape == (1, 0, 2)


def test_score_threshold_is_inclusive_and_applies_to_probabilities() -> None:
    h = head(BLAZEFACE, score_threshold=0.75)
    anchors = decoders.ssd_anchors(h.anchors)  # type: ignore[arg-type]
    boxes, scores = blazeface_outputs(anchors, {i: ((10, 10, 20, 20), 0.5) for i in range(5)})
    scores[0, :5, 0] = [logit(0.75) + 1e-4, logit(0.75) - 1e-4, 0.0, 5.0, 30.0]
    _, s, _, _ = decoders.decode_ssd(boxes, scores, anchors, h.box_coder, h)  # type: ignore[arg-type]
    assert s.tolist() == pytest.approx([0.75, 1 / (1 + math.exp(-5)), 1 / (1 + math.exp(-30))], abs=1e-4)
    assert s.min() >= 0.75
    # Without the sigmoid the raw scores are probabilities already: 0.5 passes a 0.5 threshold.
    plain = head(BLAZEFACE, sigmoid_scores=False, score_clipping=None, score_threshold=0.5)
    scores[0, :, 0] = 0.0
    scores[0, :3, 0] = [0.5, 0.49999, 0.7]
    _, s, _, _ = decoders.decode_ssd(boxes, scores, anchors, plain.box_coder, plain)  # type: ignore[arg-type]
    assert s.tolist() == pytest.approx([0.5, 0.7])


def test_score_clipping_caps_the_logit_before_the_sigmoid() -> None:
    anchors = decoders.ssd_anchors(head(BLAZEFACE).anchors)  # type: ignore[arg-type]
    boxes, scores = blazeface_outputs(anchors, {3: ((10, 10, 20, 20), 0.5)})
    scores[0, 3, 0] = 100.0
    capped = 1 / (1 + math.exp(-2.0))  # 0.8808
    h = head(BLAZEFACE, score_clipping=2.0, score_threshold=0.85)
    _, s, _, _ = decoders.decode_ssd(boxes, scores, anchors, h.box_coder, h)  # type: ignore[arg-type]
    assert s.tolist() == pytest.approx([capped])
    h = head(BLAZEFACE, score_clipping=2.0, score_threshold=0.9)  # above what any clipped logit reaches
    _, s, _, _ = decoders.decode_ssd(boxes, scores, anchors, h.box_coder, h)  # type: ignore[arg-type]
    assert s.size == 0
    # A threshold below sigmoid(-c) lets every anchor through, even the most negative logits.
    h = head(BLAZEFACE, score_clipping=2.0, score_threshold=0.1)
    _, s, _, _ = decoders.decode_ssd(boxes, scores, anchors, h.box_coder, h)  # type: ignore[arg-type]
    assert s.size == 896 and s.min() == pytest.approx(1 / (1 + math.exp(2.0)))


def test_ssd_outputs_that_do_not_fit_the_head_are_refused() -> None:
    h = head(BLAZEFACE)
    anchors = decoders.ssd_anchors(h.anchors)  # type: ignore[arg-type]
    with pytest.raises(RunError, match="896 anchors"):
        decoders.decode_ssd(np.zeros((1, 2304, 16)), np.zeros((1, 2304, 1)), anchors, h.box_coder, h)  # type: ignore[arg-type]


# --- YOLO and TFLite's post-process -----------------------------------------------------------


def test_yolo_channels_first_decodes_centre_size_boxes_and_best_class() -> None:
    h = head({"decoder": "yolo", "num_classes": 3, "score_threshold": 0.5, "yolo_layout": "channels-first"})
    out = np.zeros((1, 7, 6), np.float32)
    out[0, :4, 1] = [100, 80, 40, 20]  # cx, cy, w, h
    out[0, 4:, 1] = [0.1, 0.9, 0.3]
    out[0, :4, 4] = [10, 20, 6, 8]
    out[0, 4:, 4] = [0.6, 0.2, 0.5]
    out[0, 4:, 5] = [0.4, 0.49, 0.3]  # below the threshold in every class
    boxes, scores, classes, points = decoders.decode_yolo(out, h, (640, 640))
    assert boxes.tolist() == [[80, 70, 120, 90], [7, 16, 13, 24]]
    assert scores.tolist() == pytest.approx([0.9, 0.6])
    assert classes.tolist() == [1, 0]
    assert points.shape == (2, 0, 2)


def test_yolo_rows_score_is_objectness_times_class_probability() -> None:
    h = head({"decoder": "yolo", "num_classes": 2, "score_threshold": 0.5, "yolo_layout": "rows"})
    out = np.zeros((1, 4, 7), np.float32)
    out[0, 0] = [50, 50, 20, 10, 0.9, 0.5, 0.4]  # 0.45: objectness passes, the product does not
    out[0, 1] = [30, 40, 10, 20, 0.8, 0.1, 0.9]  # 0.72, class 1
    out[0, 2] = [5, 5, 2, 2, 0.3, 1.0, 0.0]  # objectness alone already fails
    boxes, scores, classes, _ = decoders.decode_yolo(out, h, (640, 640))
    assert boxes.tolist() == [[25, 30, 35, 50]]
    assert scores.tolist() == pytest.approx([0.72])
    assert classes.tolist() == [1]


def test_yolo_output_of_the_wrong_width_is_refused() -> None:
    h = head({"decoder": "yolo", "num_classes": 80, "score_threshold": 0.5, "yolo_layout": "rows"})
    with pytest.raises(RunError, match="85"):
        decoders.decode_yolo(np.zeros((1, 100, 84), np.float32), h, (640, 640))


def test_tflite_postprocess_passes_count_rows_through_in_input_pixels() -> None:
    boxes = np.array([[[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 0.5], [0.3, 0.3, 0.4, 0.4]]], np.float32)
    classes = np.array([[17.0, 0.0, 3.0]], np.float32)
    scores = np.array([[0.9, 0.7, 0.1]], np.float32)
    count = np.array([2.0], np.float32)
    b, s, c, k = decoders.decode_tflite_postprocess([boxes, classes, scores, count], (300, 200))
    assert b == pytest.approx(np.array([[40, 30, 120, 150], [0, 0, 100, 300]]))
    assert s.tolist() == pytest.approx([0.9, 0.7]) and c.tolist() == [17, 0] and k.shape == (2, 0, 2)


def test_outputs_are_picked_by_name_then_by_shape() -> None:
    h = head(BLAZEFACE)
    boxes, scores = np.zeros((1, 896, 16)), np.ones((1, 896, 1))
    picked = decoders.pick_outputs([scores, boxes], [], h)
    assert picked[0] is boxes and picked[1] is scores
    named = head(BLAZEFACE, outputs=["b", "s"])
    picked = decoders.pick_outputs([scores, boxes], ["s", "b"], named)
    assert picked[0] is boxes and picked[1] is scores
    with pytest.raises(RunError, match="ssd boxes"):
        decoders.pick_outputs([np.zeros((1, 896, 12)), scores], [], h)


# --- mapping back through the preprocessing ---------------------------------------------------


def test_letterbox_box_maps_back_to_frame_pixels() -> None:
    s = spec((128, 128), "letterbox")
    # 640x480 -> scale 0.2: the frame fills 128x96, 16 grey rows above and below.
    assert placement(s, 480, 640) == ((0, 0, 640, 480), (0, 16, 128, 96))
    frame_box = np.array([[100.0, 50.0, 300.0, 250.0]])
    input_box = np.array([[20.0, 26.0, 60.0, 66.0]])
    assert to_frame(input_box, s, (480, 640)) == pytest.approx(frame_box)
    # The same geometry fit() draws with: a white rectangle lands where the mapping says.
    frame = np.zeros((480, 640, 3), np.uint8)
    frame[50:250, 100:300] = 255
    x = fit(frame, s)
    ys, xs = np.nonzero(x[..., 0] > 127)
    assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (20, 26, 60, 66)
    assert (x[:16] == 114).all() and (x[112:] == 114).all()


def test_center_crop_and_squash_boxes_map_back_to_frame_pixels() -> None:
    crop = spec((128, 128), "center-crop")
    # 640x480 -> the centred 480x480 (80 columns cut each side), 3.75 frame pixels an input pixel.
    assert placement(crop, 480, 640) == ((80, 0, 480, 480), (0, 0, 128, 128))
    assert to_frame(np.array([[0.0, 0.0, 64.0, 64.0]]), crop, (480, 640)).tolist() == [[80, 0, 320, 240]]
    frame = np.zeros((480, 640, 3), np.uint8)
    frame[120:360, 200:440] = 255
    ys, xs = np.nonzero(fit(frame, crop)[..., 0] > 127)
    assert to_frame(
        np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], float), crop, (480, 640)
    ).tolist() == [[200, 120, 440, 360]]
    squash = spec((100, 200), "squash")
    assert to_frame(np.array([[10.0, 10.0, 20.0, 50.0]]), squash, (300, 400)).tolist() == [[20, 30, 40, 150]]
    # Keypoints (x, y pairs) map with the same arithmetic.
    points = to_frame(np.array([[[64.0, 32.0]]]), crop, (480, 640))
    assert points.tolist() == [[[320, 120]]]


# --- NMS -----------------------------------------------------------------------------------


def test_hard_nms_ties_keep_the_lower_index() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], np.float64)
    classes = np.zeros(3, np.int64)
    assert nms.hard_nms(boxes, np.array([0.8, 0.9, 0.9]), classes, 0.5, 10).tolist() == [1]
    assert nms.hard_nms(boxes, np.array([0.9, 0.9, 0.9]), classes, 0.5, 10).tolist() == [0]
    # Disjoint boxes with equal scores come out in index order.
    apart = np.array([[0, 0, 1, 1], [5, 5, 6, 6], [9, 9, 10, 10]], np.float64)
    assert nms.hard_nms(apart, np.array([0.5, 0.7, 0.5]), classes, 0.5, 10).tolist() == [1, 0, 2]


def test_hard_nms_suppresses_only_above_the_threshold() -> None:
    boxes = np.array([[0, 0, 2, 1], [1, 0, 3, 1]], np.float64)  # IoU exactly 1/3
    scores, classes = np.array([0.9, 0.8]), np.zeros(2, np.int64)
    assert nms.hard_nms(boxes, scores, classes, 1 / 3, 10).tolist() == [0, 1]
    assert nms.hard_nms(boxes, scores, classes, 0.3, 10).tolist() == [0]


def test_weighted_nms_averages_overlapping_boxes_by_score() -> None:
    boxes = np.array([[0, 0, 10, 10], [2, 0, 12, 10], [50, 50, 60, 60]], np.float64)
    scores = np.array([0.6, 0.9, 0.7])
    classes = np.zeros(3, np.int64)
    points = np.array([[[1, 1]], [[3, 1]], [[55, 55]]], np.float64)
    hard = nms.hard_nms(boxes, scores, classes, 0.3, 10)
    assert hard.tolist() == [1, 2]  # hard: the best box as it was
    b, s, c, k = nms.weighted_nms(boxes, scores, classes, points, 0.3, 10)
    x0 = (0.9 * 2 + 0.6 * 0) / 1.5
    assert b == pytest.approx(np.array([[x0, 0, x0 + 10, 10], [50, 50, 60, 60]]))
    assert s.tolist() == [0.9, 0.7] and c.tolist() == [0, 0]
    assert k == pytest.approx(np.array([[[(0.9 * 3 + 0.6 * 1) / 1.5, 1]], [[55, 55]]]))


def test_nms_is_per_class_and_stops_at_max_detections() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10]], np.float64)
    scores = np.array([0.9, 0.8])
    classes = np.array([0, 1])
    assert nms.hard_nms(boxes, scores, classes, 0.5, 10).tolist() == [0, 1]
    b, s, c, _ = nms.weighted_nms(boxes, scores, classes, np.zeros((2, 0, 2)), 0.5, 10)
    assert b.ravel().tolist() == pytest.approx(boxes.ravel().tolist()) and c.tolist() == [0, 1]
    apart = np.array([[i * 10, 0, i * 10 + 5, 5] for i in range(5)], np.float64)
    ranked = np.array([0.1, 0.5, 0.3, 0.9, 0.7])
    assert nms.hard_nms(apart, ranked, np.zeros(5, np.int64), 0.5, 3).tolist() == [3, 4, 1]
    _, s, _, _ = nms.weighted_nms(apart, ranked, np.zeros(5, np.int64), np.zeros((5, 0, 2)), 0.5, 3)
    assert s.tolist() == [0.9, 0.7, 0.5]
    empty = nms.weighted_nms(
        np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), np.zeros((0, 6, 2)), 0.5, 3
    )
    assert [a.shape for a in empty] == [(0, 4), (0,), (0,), (0, 6, 2)]


def naive_hard_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, threshold: float) -> list[int]:
    """The textbook loop, one pair at a time, as the reference for the vectorized one."""
    kept: list[int] = []
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        box = (boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3])
        if all(classes[k] != classes[i] or iou(box, tuple(boxes[k])) <= threshold for k in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("count", [40, nms.MATRIX_MAX + 60])
def test_nms_agrees_with_the_textbook_loop_on_many_boxes(count: int) -> None:
    # Both ways of finding overlaps (one matrix for few candidates, one row a step for many).
    rng = np.random.default_rng(count)
    xy = rng.uniform(0, 100, (count, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 30, (count, 2))], axis=1)
    scores = rng.choice([0.5, 0.6, 0.7, 0.8, 0.9], count)  # many ties
    classes = rng.integers(0, 3, count)
    kept = nms.hard_nms(boxes, scores, classes, 0.4, 10_000)
    assert kept.tolist() == naive_hard_nms(boxes, scores, classes, 0.4)
    assert len(kept) < count  # something was suppressed
    assert nms.hard_nms(boxes, scores, classes, 0.4, 7).tolist() == kept[:7].tolist()
    _, s, c, _ = nms.weighted_nms(boxes, scores, classes, np.zeros((count, 0, 2)), 0.4, 10_000)
    # Weighted clusters start at the same boxes the hard loop keeps.
    assert s.tolist() == scores[kept].tolist() and c.tolist() == classes[kept].tolist()


def test_nms_separates_classes_by_shifting_them_apart_exactly() -> None:
    # Past ROW_STEPS kept boxes the rest go through one matrix: a grid of 3 classes keeps dozens.
    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 400, (150, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.uniform(10, 40, (150, 2)).astype(np.float32)], axis=1)
    scores, classes = rng.uniform(0.3, 1, 150), rng.integers(0, 3, 150)
    kept = nms.hard_nms(boxes, scores, classes, 0.45, 10_000)
    assert len(kept) > 3 * nms.ROW_STEPS
    assert kept.tolist() == naive_hard_nms(boxes.astype(np.float64), scores, classes, 0.45)
    shifted = nms.class_separated(boxes, classes)
    assert shifted is not None
    wide = boxes.astype(np.float64)  # the widths within a class are the very same numbers
    assert np.array_equal(shifted[:, 2] - shifted[:, 0], wide[:, 2] - wide[:, 0])
    # A coordinate that is not finite has no span: the classes are compared instead.
    odd = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, np.inf, 10]], np.float64)
    assert nms.class_separated(odd, np.array([0, 1, 0])) is None
    assert nms.hard_nms(odd, np.array([0.9, 0.8, 0.1]), np.array([0, 1, 0]), 0.5, 10).tolist() == [0, 1, 2]


# --- iou and match --------------------------------------------------------------------------


def det(box: tuple[float, float, float, float], class_id: int = 0, score: float = 0.9) -> Detection:
    return Detection(class_id=class_id, name=f"c{class_id}", score=score, box=box)


def test_iou() -> None:
    assert iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # touching edges
    assert iou((0, 0, 0, 10), (0, 0, 0, 10)) == 0.0  # empty boxes
    assert iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0


def test_match_is_greedy_by_iou_within_a_class() -> None:
    reference = [det((0, 0, 10, 10)), det((2, 0, 12, 10)), det((50, 50, 60, 60), class_id=1)]
    other = [
        det((2, 0, 12, 10)),
        det((0, 0, 9, 10)),
        det((50, 50, 60, 60), class_id=2),
        det((80, 80, 90, 90)),
    ]
    m = match(reference, other)
    # ref 1 and other 0 are identical (IoU 1) and pair first; ref 0 then takes other 1 (IoU 0.9).
    assert [(r, o) for r, o, _ in m.pairs] == [(1, 0), (0, 1)]
    assert m.pairs[0][2] == 1.0 and m.pairs[1][2] == pytest.approx(0.9)
    assert m.missed == (2,)  # class 1 is not matched by a class 2 box, however well it overlaps
    assert m.extra == (2, 3)
    assert match(reference, other, min_iou=0.95).pairs == ((1, 0, 1.0),)


def test_match_ties_go_to_the_lower_indices() -> None:
    m = match([det((0, 0, 10, 10))], [det((0, 0, 10, 10)), det((0, 0, 10, 10))])
    assert m.pairs == ((0, 0, 1.0),) and m.extra == (1,) and m.missed == ()
    m = match([det((0, 0, 10, 10)), det((0, 0, 10, 10))], [det((0, 0, 10, 10))])
    assert m.pairs == ((0, 0, 1.0),) and m.missed == (1,)
    assert match([], [det((0, 0, 1, 1))]) == Match(pairs=(), missed=(), extra=(0,))


def test_detection_to_dict_rounds_for_json() -> None:
    d = Detection(
        class_id=2, name="face", score=0.987654321, box=(1.04, 2.06, 3.0, 4.56), keypoints=((1.0, 2.0),)
    )
    assert d.to_dict() == {"class_id": 2, "name": "face", "score": 0.98765, "box": [1.0, 2.1, 3.0, 4.6]}


# --- the Detector end to end -----------------------------------------------------------------


def test_detector_maps_a_blazeface_face_back_to_the_frame() -> None:
    h = head(BLAZEFACE)
    s = spec((128, 128), "letterbox")
    detector = Detector(h, s, ["face"])
    anchors = detector.anchors
    assert anchors is not None
    # A face at frame (100, 50)-(300, 250) of a 640x480 frame is (20, 26)-(60, 66) in the letterboxed input.
    boxes, scores = blazeface_outputs(
        anchors,
        {
            140: ((20, 26, 60, 66), 0.9),
            141: ((21, 26, 61, 66), 0.6),  # the same face from the next anchor: merged by weighted NMS
            10: ((30, 2, 50, 12), 0.95),  # wholly in the grey bar above the frame: dropped
            600: ((90, 60, 110, 80), 0.4),  # below the threshold
            650: ((80, 40, 120, 100), 0.7),  # a second face
        },
    )
    found = detector([scores, boxes], (480, 640), ["classificators", "regressors"])
    assert [d.name for d in found] == ["face", "face"]
    assert [d.score for d in found] == pytest.approx([0.9, 0.7], abs=1e-6)
    x0 = (0.9 * 20 + 0.6 * 21) / 1.5
    assert found[0].box == pytest.approx((x0 * 5, 50, (x0 + 40) * 5, 250), abs=1e-3)
    assert found[1].box == pytest.approx((400, 120, 600, 420), abs=1e-3)
    # Keypoint j was placed at (x0 + j, y0 + 2j) in input pixels: 5 frame pixels each, 16 rows of bar off.
    expected = [((20 + j) * 0.6 + (21 + j) * 0.4, 26 + 2 * j) for j in range(6)]
    got = [v for point in found[0].keypoints for v in point]
    assert got == pytest.approx([v for x, y in expected for v in (5 * x, 5 * (y - 16))], abs=1e-3)
    assert [d.box[3] for d in detector([boxes, scores], (480, 640))] == pytest.approx([250, 420], abs=1e-3)


def test_detector_clips_to_the_frame_names_unknown_classes_and_sorts_best_first() -> None:
    h = head(
        {
            "decoder": "yolo",
            "num_classes": 3,
            "score_threshold": 0.25,
            "yolo_layout": "channels-first",
            "nms": "hard",
        }
    )
    detector = Detector(h, spec((64, 64), "squash"), ["person", "car"])
    out = np.zeros((1, 7, 4), np.float32)
    out[0, :, 0] = [10, 10, 40, 40, 0.3, 0.0, 0.0]  # reaches past the top-left corner
    out[0, :, 1] = [40, 40, 10, 10, 0.0, 0.0, 0.8]  # class 2 has no name
    out[0, :, 2] = [41, 40, 10, 10, 0.0, 0.0, 0.5]  # suppressed by the one above
    out[0, :, 3] = [40, 40, 10, 10, 0.0, 0.6, 0.0]  # same place, another class: kept
    found = detector([out], (128, 256))
    assert [(d.name, d.class_id) for d in found] == [("class 2", 2), ("car", 1), ("person", 0)]
    assert found[0].box == pytest.approx((140, 70, 180, 90))
    assert found[2].box == pytest.approx((0, 0, 120, 60))  # (-40, -20) clipped to the frame
    assert detector([np.zeros((1, 7, 4), np.float32)], (128, 256)) == ()


def test_detector_refuses_anchors_for_another_input_size() -> None:
    with pytest.raises(EdgekitError, match="128x128"):
        Detector(head(BLAZEFACE), spec((192, 192), "letterbox"))


# --- the real BlazeFace, through LiteRT ---------------------------------------------------------


def photograph(name: str) -> np.ndarray:
    """One of scikit-image's photographs as RGB uint8 (grey ones and the black-and-white horse repeated thrice)."""
    from skimage import data

    image = np.asarray(getattr(data, name)())
    image = (image * 255).astype(np.uint8) if image.dtype == bool else image
    return image if image.ndim == 3 else np.repeat(image[..., None], 3, axis=2)


def blazeface_on(frames: list[np.ndarray]) -> list[tuple[Detection, ...]]:
    """BlazeFace short range (the shipped card, its .tflite from PyPI) run by LiteRT, decoded by Detector."""
    interpreter_module = pytest.importorskip("ai_edge_litert.interpreter")
    card = read_card(MODELS / "blazeface")
    assert card.detection is not None
    path, _ = tflite_file(card.source, "blazeface")
    interpreter = interpreter_module.Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    outputs = interpreter.get_output_details()
    # The .tflite takes NHWC; the card's NCHW is for the PyTorch re-expression.
    nhwc = dataclasses.replace(card.preprocess, layout="NHWC")
    detector = Detector(card.detection, nhwc, card.labels)
    found = []
    for frame in frames:
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], preprocess(frame, nhwc, "RGB"))
        interpreter.invoke()
        raw = [interpreter.get_tensor(o["index"]) for o in outputs]
        found.append(detector(raw, frame.shape[:2], [o["name"] for o in outputs]))
    return found


def test_blazeface_finds_the_astronauts_face_and_its_box_follows_the_frame() -> None:
    (found,) = blazeface_on([photograph("astronaut")])  # 512x512, one face, upper middle
    assert len(found) == 1 and found[0].name == "face" and found[0].score > 0.8
    box = found[0].box
    # Her face, forehead to chin and ear to ear, in the photograph's pixels; eyes, nose, mouth inside it.
    assert 150 < box[0] < 200 and 60 < box[1] < 110 and 250 < box[2] < 300 and 160 < box[3] < 210
    assert all(box[0] < x < box[2] and box[1] < y < box[3] for x, y in found[0].keypoints[:4])
    # One 96x128 picture blown up 5x (640x480) and 2x (256x192): letterboxing gives the model
    # the very same input (area averages of constant blocks, 16 grey rows above and below),
    # so every box and keypoint in the big frame is 2.5 times the small frame's.
    picture = cv2.resize(photograph("astronaut")[:384], (128, 96), interpolation=cv2.INTER_AREA)
    big, small = (picture.repeat(k, axis=0).repeat(k, axis=1) for k in (5, 2))
    (in_big,), (in_small,) = blazeface_on([big, small])
    assert in_big.score == in_small.score
    assert np.array(in_big.box) == pytest.approx(np.array(in_small.box) * 2.5, abs=1e-6)
    assert np.array(in_big.keypoints) == pytest.approx(np.array(in_small.keypoints) * 2.5, abs=1e-6)
    # ... and 1.25 times the photograph's (640 / 512), give or take what the smaller input changes.
    assert np.array(in_big.box) == pytest.approx(np.array(box) * 1.25, abs=10)


def test_blazeface_finds_no_face_in_photographs_without_one() -> None:
    names = ("coffee", "rocket", "hubble_deep_field", "horse", "clock")
    assert blazeface_on([photograph(name) for name in names]) == [()] * len(names)


def test_the_letterbox_pads_with_the_cards_fill_and_the_manifest_keeps_it() -> None:
    from edgekit.backends.base import TensorSpec
    from edgekit.bundle.manifest import Preprocess
    from edgekit.processing.preprocessing import Preprocessor

    frame = np.full((100, 200, 3), 200, np.uint8)  # wide: bars above and below
    black = PreprocessSpec((64, 64), (127.5,) * 3, (127.5,) * 3, resize="letterbox", letterbox_fill=0)
    grey = PreprocessSpec((64, 64), (127.5,) * 3, (127.5,) * 3, resize="letterbox")
    assert fit(frame, black)[0].max() == 0 and fit(frame, grey)[0].min() == 114
    assert (fit(frame, black)[32] == 200).all()  # the picture itself is the same either way
    # The device prepares the same tensor: the bars are -1 after (x - 127.5) / 127.5.
    x = Preprocessor(black, TensorSpec("x", (1, 3, 64, 64), "float32"), image_color="BGR")(frame)
    assert float(x[0, :, 0].max()) == -1.0
    # The manifest carries it (and leaves the default out, so older bundles read the same).
    assert Preprocess.from_dict(black.to_dict()).letterbox_fill == 0
    assert "letterbox_fill" not in grey.to_dict()
    assert PreprocessSpec.from_dict(Preprocess.from_dict(black.to_dict()).model_dump()) == black
    with pytest.raises(EdgekitError, match="letterbox_fill"):
        PreprocessSpec((64, 64), (0.0,) * 3, (1.0,) * 3, resize="letterbox", letterbox_fill=300)
