"""A YOLOv8 export's head in small, as an ONNX graph (``yolo_v8_like``) and a PyTorch module (``yolo_v8_module``).

Conv+SiLU features at two scales; per scale a box branch (Conv+SiLU, then a 1x1 Conv to
4 x REG_MAX bins) and a class branch (Conv+SiLU, 1x1 Conv to 2 logits), concatenated and
flattened to anchors; then as Ultralytics exports it: Split, the DFL (Reshape, Transpose,
Softmax over the bins, a 1x1 Conv with weights 0..REG_MAX-1, Reshape), distances to corners
around the anchor points (Slice, Sub, Add), centre and size (Add, Div, Sub, Concat), times the
strides, concatenated with the Sigmoid of the class logits: ``[1, 4 + 2, 80]`` for a
``[1, 3, 32, 32]`` input.  Weights are random: the int8 tests compare with fp32, not with boxes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(8)

REG_MAX = 4  # DFL bins per box side (YOLOv8 has 16)
SCALES = (("p3", 8, 8), ("p4", 4, 16))  # name, feature size, stride: 64 + 16 anchors
SIZE = 32


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _anchors() -> tuple[np.ndarray, np.ndarray]:
    """Anchor points [2, 80] (cell centres, in feature cells) and strides [80]."""
    points, strides = [], []
    for _, size, stride in SCALES:
        ys, xs = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
        points.append(np.stack([xs.ravel(), ys.ravel()]))
        strides.append(np.full(size * size, stride))
    return np.concatenate(points, 1).astype(np.float32), np.concatenate(strides).astype(np.float32)


def yolo_v8_like(path: Path) -> Path:
    """The graph, its nodes named as the tests name them (``box_p3_out``: a head's 1x1 Conv; ``dfl``)."""
    init: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: Any, dtype: Any = np.float32) -> str:
        init.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [f"{name}_y"], name=name, **attrs))
        return f"{name}_y"

    def conv_silu(name: str, x: str, cin: int, cout: int, stride: int = 1) -> str:
        init.extend([_weight(f"{name}_w", cout, cin, 3, 3), _weight(f"{name}_b", cout)])
        c = node("Conv", [x, f"{name}_w", f"{name}_b"], name, pads=[1, 1, 1, 1], strides=[stride, stride])
        return node("Mul", [c, node("Sigmoid", [c], f"{name}_sig")], f"{name}_silu")

    def conv1x1(name: str, x: str, cin: int, cout: int) -> str:
        init.extend([_weight(f"{name}_w", cout, cin, 1, 1), _weight(f"{name}_b", cout)])
        return node("Conv", [x, f"{name}_w", f"{name}_b"], name)

    fields = 4 * REG_MAX + 2
    p3 = conv_silu("stem", "x", 3, 8, stride=4)  # 8x8
    p4 = conv_silu("down", p3, 8, 8, stride=2)  # 4x4
    rows = []
    for (scale, _, _), feat in zip(SCALES, (p3, p4), strict=True):
        box = conv1x1(f"box_{scale}_out", conv_silu(f"box_{scale}_0", feat, 8, 8), 8, 4 * REG_MAX)
        cls = conv1x1(f"cls_{scale}_out", conv_silu(f"cls_{scale}_0", feat, 8, 8), 8, 2)
        both = node("Concat", [box, cls], f"cat_{scale}", axis=1)
        rows.append(
            node("Reshape", [both, const(f"rows_{scale}", [1, fields, -1], np.int64)], f"rows_{scale}")
        )
    flat = node("Concat", rows, "anchors_cat", axis=2)  # [1, fields, 80]
    n = sum(s * s for _, s, _ in SCALES)
    nodes.append(
        helper.make_node(
            "Split",
            [flat, const("split", [4 * REG_MAX, 2], np.int64)],
            ["bins", "logits"],
            name="split",
            axis=1,
        )
    )
    dist = node("Reshape", ["bins", const("dfl_shape", [1, 4, REG_MAX, n], np.int64)], "dfl_reshape")
    dist = node("Softmax", [node("Transpose", [dist], "dfl_t", perm=[0, 2, 1, 3])], "dfl_softmax", axis=1)
    dist = node("Conv", [dist, const("dfl_w", np.arange(REG_MAX).reshape(1, REG_MAX, 1, 1))], "dfl")
    dist = node("Reshape", [dist, const("dist_shape", [1, 4, n], np.int64)], "dfl_out")
    starts, ends, axis = (
        const("lt_from", [0], np.int64),
        const("lt_to", [2], np.int64),
        const("ax", [1], np.int64),
    )
    lt = node("Slice", [dist, starts, ends, axis], "lt")
    rb = node("Slice", [dist, ends, const("rb_to", [4], np.int64), axis], "rb")
    points, strides = _anchors()
    # The anchor points come from a Constant node, as in Ultralytics' exports.
    nodes.append(
        helper.make_node(
            "Constant",
            [],
            ["points"],
            name="points",
            value=numpy_helper.from_array(points[None]),
        )
    )
    x1y1 = node("Sub", ["points", lt], "x1y1")
    x2y2 = node("Add", ["points", rb], "x2y2")
    centre = node("Div", [node("Add", [x1y1, x2y2], "corners"), const("two", 2.0)], "centre")
    boxes = node("Concat", [centre, node("Sub", [x2y2, x1y1], "size")], "xywh", axis=1)
    boxes = node("Mul", [boxes, const("strides", strides[None, None])], "scaled")
    nodes.append(
        helper.make_node(
            "Concat", [boxes, node("Sigmoid", ["logits"], "scores")], ["output0"], name="out", axis=1
        )
    )
    graph = helper.make_graph(
        nodes,
        "yolo_v8_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 6, n])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def yolo_v8_module() -> Any:
    """The same network as a PyTorch module (its own random weights), for LiteRT's converter."""
    import torch
    from torch import nn

    class ConvSiLU(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, stride, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.silu(self.conv(x))

    class YoloV8Like(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.down = ConvSiLU(3, 8, 4), ConvSiLU(8, 8, 2)
            self.box = nn.ModuleList(
                [nn.Sequential(ConvSiLU(8, 8), nn.Conv2d(8, 4 * REG_MAX, 1)) for _ in SCALES]
            )
            self.cls = nn.ModuleList([nn.Sequential(ConvSiLU(8, 8), nn.Conv2d(8, 2, 1)) for _ in SCALES])
            self.dfl = nn.Conv2d(REG_MAX, 1, 1, bias=False).requires_grad_(False)
            self.dfl.weight[:] = torch.arange(REG_MAX, dtype=torch.float32).view(1, REG_MAX, 1, 1)
            points, strides = _anchors()
            self.register_buffer("points", torch.from_numpy(points)[None])
            self.register_buffer("strides", torch.from_numpy(strides)[None, None])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            p3 = self.stem(x)
            feats = (p3, self.down(p3))
            fields = 4 * REG_MAX + 2
            rows = [
                torch.cat([b(f), c(f)], 1).view(1, fields, -1)
                for f, b, c in zip(feats, self.box, self.cls, strict=True)
            ]
            flat = torch.cat(rows, 2)
            bins, logits, n = flat[:, : 4 * REG_MAX], flat[:, 4 * REG_MAX :], flat.shape[2]
            dist = self.dfl(bins.view(1, 4, REG_MAX, n).transpose(2, 1).softmax(1)).view(1, 4, n)
            lt, rb = dist.chunk(2, 1)
            points = self.get_buffer("points")
            x1y1, x2y2 = points - lt, points + rb
            boxes = torch.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], 1) * self.get_buffer("strides")
            return torch.cat([boxes, logits.sigmoid()], 1)

    torch.manual_seed(8)
    return YoloV8Like().eval()
