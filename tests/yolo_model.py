"""A small YOLO-format detector whose boxes are known: ``write_yolo_onnx(path, layout)``.

The model is an ONNX graph (``onnx.helper``, opset 17) that really computes its boxes from
the pixels, so a test can draw objects and know where the detector must find them: a 1x1
convolution scores each pixel as *red* (class 0: R - G - B > 0.5, the input in [0, 1]) or
*green* (class 1: G - R - B > 0.5), a sigmoid makes that a probability, and per class the
columns and rows holding such a pixel give the box (first to last, in input pixels) and the
best pixel's probability its score.  One object per class, then: a red square and a green
square in a frame give two boxes where they are.

Each class also gets a decoy: its box shrunk to 3/4 of the width and height about the same
centre (IoU 0.5625 with it) at 0.9 of its score, so a head without working NMS reports
four objects instead of two.  Candidates are ordered box 0, box 1, decoy 0, decoy 1.

Layouts, as ``DetectionHead.yolo_layout`` names them:

- ``channels-first``: ``[1, 4 + 2, 4]`` — rows cx, cy, w, h, score of class 0, of class 1;
- ``rows``: ``[1, 4, 5 + 2]`` — per candidate cx, cy, w, h, objectness, class 0, class 1
  (the class columns one-hot, so objectness times class probability is the score).

Helpers draw test frames (``frame_with``) and write a model card for the file (``write_card``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

Layout = Literal["channels-first", "rows"]

CLASSES = ("red", "green")
#: RGB colours of the two classes' squares and of the frames' background.
COLOURS = {"red": (240, 10, 10), "green": (10, 235, 10)}
BACKGROUND = (40, 44, 48)
INPUT_NAME = "images"
OUTPUT_NAME = "output0"
#: How sharply the convolution's scores separate: a pure class colour gives a logit of +10.
_GAIN = 20.0


def write_yolo_onnx(
    path: Path, size: int = 96, layout: Layout = "channels-first", *, external_data: bool = False
) -> Path:
    """Write the detector for a ``size`` x ``size`` RGB input (NCHW, pixels / 255) to ``path``.

    ``external_data``: its weights in ``<name>.data`` beside it, as large models are saved.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    s = size
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(op: str, inputs: Sequence[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    weight = _GAIN * np.array([[1, -1, -1], [-1, 1, -1]], np.float32).reshape(2, 3, 1, 1)
    logits = node(
        "Conv", [INPUT_NAME, const("conv_w", weight), const("conv_b", np.full(2, -0.5 * _GAIN))], "logits"
    )
    prob = node("Sigmoid", [logits], "prob")  # [1, 2, S, S]
    one, half, size_c = const("one", np.float32(1)), const("half", np.float32(0.5)), const("s", np.float32(s))
    coords = const("coords", np.arange(s, dtype=np.float32))
    ends = const("ends", np.arange(1, s + 1, dtype=np.float32))

    def extent(axis: int, tag: str) -> tuple[str, str]:
        """First and last+1 pixel along x (axis 2 reduced: columns) or y (axis 3: rows), per class: [1, 2]."""
        profile = node("ReduceMax", [prob], f"{tag}_profile", axes=[axis], keepdims=0)  # [1, 2, S]
        hit = node(
            "Cast", [node("Greater", [profile, half], f"{tag}_gt")], f"{tag}_hit", to=TensorProto.FLOAT
        )
        miss = node("Sub", [one, hit], f"{tag}_miss")
        # An empty class has first = S, last = 0: a box of negative size, scored near 0.
        first_at = node(
            "Add",
            [node("Mul", [hit, coords], f"{tag}_hx"), node("Mul", [miss, size_c], f"{tag}_mx")],
            f"{tag}_fa",
        )
        first = node("ReduceMin", [first_at], f"{tag}_first", axes=[2], keepdims=0)
        last = node("ReduceMax", [node("Mul", [hit, ends], f"{tag}_he")], f"{tag}_last", axes=[2], keepdims=0)
        return first, last

    x0, x1 = extent(2, "x")
    y0, y1 = extent(3, "y")
    score = node("ReduceMax", [prob], "score", axes=[2, 3], keepdims=0)  # [1, 2]
    cx = node("Mul", [node("Add", [x0, x1], "xs"), half], "cx")
    cy = node("Mul", [node("Add", [y0, y1], "ys"), half], "cy")
    w = node("Sub", [x1, x0], "w")
    h = node("Sub", [y1, y0], "h")
    three_q, nine_t = const("three_q", np.float32(0.75)), const("nine_t", np.float32(0.9))

    def with_decoys(value: str, decoy: str, tag: str) -> str:
        """[1, 4]: the two classes' values, then their decoys'."""
        return node("Concat", [value, decoy], f"{tag}_all", axis=1)

    cx_all = with_decoys(cx, cx, "cx")
    cy_all = with_decoys(cy, cy, "cy")
    w_all = with_decoys(w, node("Mul", [w, three_q], "w_d"), "w")
    h_all = with_decoys(h, node("Mul", [h, three_q], "h_d"), "h")
    s_all = with_decoys(score, node("Mul", [score, nine_t], "score_d"), "score")
    is0 = const("is0", np.array([[1, 0, 1, 0]], np.float32))
    is1 = const("is1", np.array([[0, 1, 0, 1]], np.float32))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))

    def row(value: str) -> str:
        return node("Unsqueeze", [value, "axis1"], f"{value}_row")  # [1, 1, 4]

    if layout == "channels-first":
        fields = [
            cx_all,
            cy_all,
            w_all,
            h_all,
            node("Mul", [s_all, is0], "s0"),
            node("Mul", [s_all, is1], "s1"),
        ]
        node("Concat", [row(f) for f in fields], OUTPUT_NAME, axis=1)  # [1, 6, 4]
    else:
        fields = [cx_all, cy_all, w_all, h_all, s_all, is0, is1]
        stacked = node("Concat", [row(f) for f in fields], "stacked", axis=1)  # [1, 7, 4]
        node("Transpose", [stacked], OUTPUT_NAME, perm=[0, 2, 1])  # [1, 4, 7]
    n_fields = len(fields)
    out_shape = [1, n_fields, 4] if layout == "channels-first" else [1, 4, n_fields]
    graph = helper.make_graph(
        nodes,
        "squares",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [1, 3, s, s])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, out_shape)],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgekit-tests"
    )
    model.ir_version = 8  # what every runtime here reads
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_data:
        onnx.save(
            model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=0
        )
    else:
        onnx.save(model, str(path))
    return path


Square = tuple[str, int, int, int]  # class name, x0, y0, side (frame pixels)


def frame_with(squares: Sequence[Square], height: int = 120, width: int = 160) -> np.ndarray:
    """An RGB frame of the background colour with each square drawn in its class's colour."""
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = BACKGROUND
    for cls, x0, y0, side in squares:
        frame[y0 : y0 + side, x0 : x0 + side] = COLOURS[cls]
    return frame


def box_of(square: Square) -> tuple[float, float, float, float]:
    """A square's box as a detector gives it: x0, y0, x1, y1 in frame pixels."""
    _, x0, y0, side = square
    return float(x0), float(y0), float(x0 + side), float(y0 + side)


def write_card(
    folder: Path,
    model_file: str,
    *,
    layout: Layout = "channels-first",
    size: int = 96,
    sha256: str | None = None,
    name: str = "squares",
    input_name: str | None = None,
) -> Path:
    """A model card for the detector in ``folder/model_file`` (and its labels); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    pin = f'sha256 = "{sha256}"\n' if sha256 else ""
    named = f'name = "{input_name}"\n' if input_name else ""
    (folder / "model.toml").write_text(
        f"""name = "{name}"
version = "1.0.0"
description = "red and green squares, a YOLO-format test detector"
task = "detection"
license = "MIT"
labels = "labels.txt"

[source]
kind = "file"
file = "{model_file}"
{pin}
[input]
{named}size = [{size}, {size}]
layout = "NCHW"
color = "RGB"
resize = "letterbox"
mean = [0.0, 0.0, 0.0]
std = [255.0, 255.0, 255.0]

[output]
names = ["{OUTPUT_NAME}"]

[detection]
decoder = "yolo"
yolo_layout = "{layout}"
num_classes = {len(CLASSES)}
score_threshold = 0.5
iou_threshold = 0.45
nms = "hard"
max_detections = 20
outputs = ["{OUTPUT_NAME}"]
""",
        encoding="utf-8",
    )
    return folder
