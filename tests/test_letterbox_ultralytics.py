"""A YOLO card's letterbox is Ultralytics' own, pixel for pixel, and its boxes map back as scale_boxes does.

``ultralytics_letterbox`` and ``ultralytics_scale_boxes`` below restate the arithmetic of
Ultralytics' ``LetterBox`` (``ultralytics/data/augment.py``: ``center=True``,
``scaleup=True``, ``auto=False``, grey 114) and ``ops.scale_boxes``, so the test needs no
Ultralytics install.  Frame sizes are odd on purpose: the two halves of the padding differ by
one pixel, and which side takes it is where implementations part.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgekit.backends.base import TensorSpec
from edgekit.processing.preprocessing import Preprocessor, PreprocessSpec, fit, placement, to_frame

SIZES = [(480, 640), (481, 643), (1080, 1920), (333, 500), (500, 333), (17, 1001), (640, 640), (99, 101)]
TARGETS = [(640, 640), (384, 640), (320, 320)]


def ultralytics_letterbox(image: np.ndarray, new_shape: tuple[int, int]) -> np.ndarray:
    shape = image.shape[:2]
    r = min(new_shape[0] / shape[0], new_shape[1] / shape[1])
    new_unpad = round(shape[1] * r), round(shape[0] * r)
    dw, dh = (new_shape[1] - new_unpad[0]) / 2, (new_shape[0] - new_unpad[1]) / 2
    if shape[::-1] != new_unpad:
        image = cv2.resize(image, new_unpad, interpolation=cv2.INTER_LINEAR)
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    return cv2.copyMakeBorder(image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114))


def ultralytics_scale_boxes(
    img1_shape: tuple[int, int], boxes: np.ndarray, img0_shape: tuple[int, int]
) -> np.ndarray:
    gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
    pad_x = round((img1_shape[1] - img0_shape[1] * gain) / 2 - 0.1)
    pad_y = round((img1_shape[0] - img0_shape[0] * gain) / 2 - 0.1)
    out = boxes.astype(np.float64).copy()
    out[:, [0, 2]] -= pad_x
    out[:, [1, 3]] -= pad_y
    scaled: np.ndarray = out / gain
    return scaled


def _frame(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _spec(target: tuple[int, int]) -> PreprocessSpec:
    return PreprocessSpec(
        size=target, mean=(0, 0, 0), std=(255, 255, 255), resize="letterbox", interpolation="linear"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_the_linear_letterbox_is_ultralytics_pixel_for_pixel(target: tuple[int, int]) -> None:
    spec = _spec(target)
    for i, (h, w) in enumerate(SIZES):
        frame = _frame(h, w, i)
        want = ultralytics_letterbox(frame, target)
        assert want.shape[:2] == target
        np.testing.assert_array_equal(fit(frame, spec), want, err_msg=f"{h}x{w} -> {target}")


def test_the_frame_loop_s_preprocessor_gives_the_same_pixels() -> None:
    spec = _spec((640, 640))
    prep = Preprocessor(spec, TensorSpec("images", (1, 3, 640, 640), "float32"), image_color="RGB")
    for i, (h, w) in enumerate(SIZES):
        frame = _frame(h, w, i)
        want = ultralytics_letterbox(frame, (640, 640)).transpose(2, 0, 1)[None].astype(np.float32) / 255
        np.testing.assert_allclose(prep(frame), want, rtol=0, atol=1e-6, err_msg=f"{h}x{w}")


def test_the_letterbox_places_the_frame_where_ultralytics_pads_it() -> None:
    for target in TARGETS:
        for h, w in SIZES:
            r = min(target[0] / h, target[1] / w)
            nw, nh = round(w * r), round(h * r)
            left, top = round((target[1] - nw) / 2 - 0.1), round((target[0] - nh) / 2 - 0.1)
            assert placement(_spec(target), h, w).dst == (left, top, nw, nh), (h, w, target)


def test_boxes_map_back_to_the_frame_as_scale_boxes_does_and_onto_the_pixels_drawn() -> None:
    """To within an input pixel and a half of scale_boxes; exactly where the letterbox drew the frame.

    scale_boxes recomputes the padding from the unrounded size (481x643 -> 640: its top is
    round(80.6 - 0.1) = 81) where LetterBox padded the rounded one (top 80), and divides by
    the ratio (0.99533) rather than the size drawn (479 / 481): its boxes sit up to a pixel
    off the pixels drawn there.  edgekit maps from the placement it drew.
    """
    rng = np.random.default_rng(3)
    for target in TARGETS:
        for h, w in SIZES:
            spec = _spec(target)
            x, y, nw, nh = placement(spec, h, w).dst
            # Boxes on the frame's pixels, as a detector finds them.
            a, b = (rng.uniform(0, 1, (20, 2)) * np.array([nw, nh]) + np.array([x, y]) for _ in range(2))
            boxes = np.concatenate([np.minimum(a, b), np.maximum(a, b)], 1)
            r = min(target[0] / h, target[1] / w)
            got = to_frame(boxes, spec, (h, w))
            want = ultralytics_scale_boxes(target, boxes, (h, w))
            assert np.abs(got - want).max() <= 1.5 / r + 1e-9, (h, w, target)
            edges = to_frame(np.array([[x, y, x + nw, y + nh]], np.float64), spec, (h, w))
            np.testing.assert_allclose(edges, [[0, 0, w, h]], atol=1e-9)


def test_a_linear_letterbox_travels_in_the_manifest() -> None:
    import json

    from edgekit.bundle.manifest import Preprocess

    spec = _spec((640, 640))
    written = json.loads(Preprocess.model_validate_json(json.dumps(spec.to_dict())).model_dump_json())
    assert written["interpolation"] == "linear"
    assert PreprocessSpec.from_dict(written) == spec
