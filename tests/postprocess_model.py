"""A tiny .tflite detector ending in ``TFLite_Detection_PostProcess``, as Coral's SSD models do.

No TensorFlow here, so the flatbuffer is written with LiteRT's own schema module
(``ai_edge_litert.schema_py_generated``, the object API) and the op's options with
FlatBuffers' flexbuffers, the way TensorFlow's converter writes them.  The graph:

- ``image`` ``[1, 64, 64, 3]`` float (pixels / 255) → ``AVERAGE_POOL_2D`` 32x32, stride 32
  → ``[1, 2, 2, 3]``: each quadrant's mean R, G, B → ``RESHAPE`` → ``[1, 4, 3]``, the class
  predictions of four anchors (column 0 is the background, as the op expects: red; class 0
  is green, class 1 blue);
- box encodings ``[1, 4, 4]``, all zero (a constant), so each box is its anchor: the four
  quadrants (anchors as y centre, x centre, height, width in [0, 1]);
- ``TFLite_Detection_PostProcess`` (fast NMS, score threshold 0.5) → boxes, classes, scores,
  count.

A frame whose top-left quadrant is green and bottom-right blue gives those two quadrants as
``green`` and ``blue``; a grey frame gives nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SIZE = 64
CLASSES = ("green", "blue")
COLOURS = {"green": (10, 235, 10), "blue": (10, 10, 235), "background": (120, 120, 120)}
MAX_DETECTIONS = 10
#: The quadrants, in the op's anchor order (y centre, x centre, height, width): row-major cells.
ANCHORS = np.array(
    [[0.25, 0.25, 0.5, 0.5], [0.25, 0.75, 0.5, 0.5], [0.75, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5]],
    np.float32,
)


def _options() -> bytes:
    """The op's custom options: a flexbuffer map, with the keys TensorFlow's converter writes."""
    from flatbuffers import flexbuffers  # type: ignore[import-untyped]

    b = flexbuffers.Builder()
    with b.Map():
        b.Int("max_detections", MAX_DETECTIONS)
        b.Int("max_classes_per_detection", 1)
        b.Int("detections_per_class", 100)
        b.Bool("use_regular_nms", False)
        b.Float("nms_score_threshold", 0.5)
        b.Float("nms_iou_threshold", 0.5)
        b.Int("num_classes", len(CLASSES))
        b.Float("y_scale", 10.0)
        b.Float("x_scale", 10.0)
        b.Float("h_scale", 5.0)
        b.Float("w_scale", 5.0)
    return bytes(b.Finish())


def write_postprocess_tflite(path: Path) -> Path:
    """Write the detector to ``path`` (about 1 kB)."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as fb

    buffers = [fb.BufferT()]  # buffer 0 is the empty one, by convention

    def buffer(data: np.ndarray | None = None) -> int:
        buf = fb.BufferT()
        if data is not None:
            buf.data = list(np.ascontiguousarray(data).tobytes())
        buffers.append(buf)
        return len(buffers) - 1

    tensors: list[fb.TensorT] = []

    def tensor(
        name: str, shape: list[int], data: np.ndarray | None = None, dtype: int = fb.TensorType.FLOAT32
    ) -> int:
        t = fb.TensorT()
        t.name, t.shape, t.type = name, shape, dtype
        t.buffer = buffer(data) if data is not None else 0
        tensors.append(t)
        return len(tensors) - 1

    image = tensor("image", [1, SIZE, SIZE, 3])
    pooled = tensor("pooled", [1, 2, 2, 3])
    shape = tensor("shape", [3], np.array([1, 4, 3], np.int32), fb.TensorType.INT32)
    scores_in = tensor("class_predictions", [1, 4, 3])
    boxes_in = tensor("box_encodings", [1, 4, 4], np.zeros((1, 4, 4), np.float32))
    anchors = tensor("anchors", [4, 4], ANCHORS)
    outputs = [
        tensor("detection_boxes", [1, MAX_DETECTIONS, 4]),
        tensor("detection_classes", [1, MAX_DETECTIONS]),
        tensor("detection_scores", [1, MAX_DETECTIONS]),
        tensor("num_detections", [1]),
    ]

    def code(builtin: int, custom: str | None = None) -> fb.OperatorCodeT:
        c = fb.OperatorCodeT()
        c.builtinCode = builtin
        c.deprecatedBuiltinCode = min(builtin, 127)  # the old int8 field readers still look at
        c.version = 1
        if custom:
            c.customCode = custom
        return c

    pool = fb.OperatorT()
    pool.opcodeIndex, pool.inputs, pool.outputs = 0, [image], [pooled]
    pool.builtinOptionsType = fb.BuiltinOptions.Pool2DOptions
    pool.builtinOptions = fb.Pool2DOptionsT()
    pool.builtinOptions.padding = fb.Padding.VALID
    pool.builtinOptions.strideW = pool.builtinOptions.strideH = SIZE // 2
    pool.builtinOptions.filterWidth = pool.builtinOptions.filterHeight = SIZE // 2

    reshape = fb.OperatorT()
    reshape.opcodeIndex, reshape.inputs, reshape.outputs = 1, [pooled, shape], [scores_in]
    reshape.builtinOptionsType = fb.BuiltinOptions.ReshapeOptions
    reshape.builtinOptions = fb.ReshapeOptionsT()
    reshape.builtinOptions.newShape = [1, 4, 3]

    post = fb.OperatorT()
    post.opcodeIndex, post.inputs, post.outputs = 2, [boxes_in, scores_in, anchors], outputs
    post.customOptions = list(_options())
    post.customOptionsFormat = fb.CustomOptionsFormat.FLEXBUFFERS

    graph = fb.SubGraphT()
    graph.tensors, graph.inputs, graph.outputs = tensors, [image], outputs
    graph.operators, graph.name = [pool, reshape, post], "main"

    model = fb.ModelT()
    model.version = 3
    model.description = "edgekit tests: quadrants through TFLite_Detection_PostProcess"
    model.operatorCodes = [
        code(fb.BuiltinOperator.AVERAGE_POOL_2D),
        code(fb.BuiltinOperator.RESHAPE),
        code(fb.BuiltinOperator.CUSTOM, "TFLite_Detection_PostProcess"),
    ]
    model.subgraphs, model.buffers = [graph], buffers

    builder = flatbuffers.Builder(4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(builder.Output()))
    return path


def quadrant_frame(quadrants: dict[int, str], height: int = SIZE, width: int = SIZE) -> np.ndarray:
    """An RGB frame of the background colour with the given quadrants (0 top-left .. 3 bottom-right) filled."""
    frame = np.empty((height, width, 3), np.uint8)
    frame[:] = COLOURS["background"]
    for q, cls in quadrants.items():
        y, x = divmod(q, 2)
        frame[y * height // 2 : (y + 1) * height // 2, x * width // 2 : (x + 1) * width // 2] = COLOURS[cls]
    return frame


def quadrant_box(q: int, height: int = SIZE, width: int = SIZE) -> tuple[float, float, float, float]:
    """Quadrant ``q``'s box in frame pixels: x0, y0, x1, y1."""
    y, x = divmod(q, 2)
    return x * width / 2, y * height / 2, (x + 1) * width / 2, (y + 1) * height / 2


def write_card(folder: Path, model_file: str) -> Path:
    """A card for the .tflite in ``folder`` with a ``tflite-postprocess`` head; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    (folder / "model.toml").write_text(
        f"""name = "quadrants"
version = "1.0.0"
description = "coloured quadrants through TFLite_Detection_PostProcess, a test detector"
task = "detection"
license = "MIT"
labels = "labels.txt"

[source]
kind = "file"
file = "{model_file}"

[input]
size = [{SIZE}, {SIZE}]
layout = "NHWC"
color = "RGB"
resize = "squash"
mean = [0.0, 0.0, 0.0]
std = [255.0, 255.0, 255.0]

[detection]
decoder = "tflite-postprocess"
num_classes = {len(CLASSES)}
score_threshold = 0.5
nms = "none"
max_detections = {MAX_DETECTIONS}
""",
        encoding="utf-8",
    )
    return folder
