"""A tiny classifier written straight to ONNX and to TFLite from the same weights.

Conv(3->8, 3x3) -> ReLU -> MaxPool(2) -> Conv(8->16, 3x3, stride 2) -> ReLU
-> global average pool -> Gemm(16->10).

The ONNX graph is NCHW, the TFLite graph NHWC (as a real LiteRT model would be); both
compute the same function, so the contract tests compare every backend's output with
one numpy reference.  Stride-2 convolution pads only at the end (TensorFlow's SAME
rule) so that the two graphs agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

INPUT_HW = 32
NUM_CLASSES = 10


@dataclass(frozen=True)
class TinyWeights:
    """Weights in ONNX layout (OIHW convolution kernels, Gemm as [out, in])."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    w3: np.ndarray
    b3: np.ndarray


def make_weights(seed: int = 7) -> TinyWeights:
    rng = np.random.default_rng(seed)

    def f(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return TinyWeights(
        w1=f(8, 3, 3, 3, scale=0.3),
        b1=f(8, scale=0.1),
        w2=f(16, 8, 3, 3, scale=0.2),
        b2=f(16, scale=0.1),
        w3=f(NUM_CLASSES, 16, scale=0.5),
        b3=f(NUM_CLASSES, scale=0.1),
    )


def sample_input(seed: int = 1) -> np.ndarray:
    """An NCHW float32 input in [0, 1)."""
    return np.random.default_rng(seed).random((1, 3, INPUT_HW, INPUT_HW), dtype=np.float32)


def reference(x_nchw: np.ndarray, w: TinyWeights) -> np.ndarray:
    """The model's output computed in float64 numpy, independent of every runtime."""

    def conv(
        x: np.ndarray, k: np.ndarray, b: np.ndarray, stride: int, pads: tuple[int, int, int, int]
    ) -> np.ndarray:
        top, left, bottom, right = pads
        x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        h, wd = x.shape[2:]
        o, _, kh, kw = k.shape
        oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
        cols = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
        out = np.einsum("nchwij,ocij->nohw", cols[:, :, :oh, :ow], k.astype(np.float64))
        return out + b.reshape(1, o, 1, 1)

    x = x_nchw.astype(np.float64)
    x = np.maximum(conv(x, w.w1, w.b1, 1, (1, 1, 1, 1)), 0)
    n, c, h, wd = x.shape
    x = x.reshape(n, c, h // 2, 2, wd // 2, 2).max(axis=(3, 5))
    x = np.maximum(conv(x, w.w2, w.b2, 2, (0, 0, 1, 1)), 0)
    x = x.mean(axis=(2, 3))
    return (x @ w.w3.T.astype(np.float64) + w.b3).astype(np.float32)


def write_onnx(path: Path, w: TinyWeights, *, free_batch: bool = False) -> Path:
    """The classifier as ONNX; ``free_batch``: dim 0 of its input and output is ``batch`` (as
    edgekit build exports it), so that its sessions can run several frames at once."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(v, name) for name, v in vars(w).items()]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        # ONNX pads are [top, left, bottom, right]: pad only at the end, as TFLite SAME does.
        helper.make_node(
            "Conv", ["p1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]
        ),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
    ]
    batch: int | str = "batch" if free_batch else 1
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, INPUT_HW, INPUT_HW])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, NUM_CLASSES])],
        initializer=inits,
    )
    return save_onnx(graph, path)


def save_onnx(graph: onnx.GraphProto, path: Path) -> Path:
    """``graph`` as a checked opset-17 model written to ``path``; the test models' one way to write ONNX.

    IR version 8: what every runtime here reads.
    """
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def write_tflite(path: Path, w: TinyWeights) -> Path:
    """Write the same model as a TFLite flatbuffer with LiteRT's own schema classes."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as s

    buffers: list[s.BufferT] = [s.BufferT()]  # buffer 0 is the empty sentinel
    tensors: list[s.TensorT] = []

    def tensor(
        name: str, shape: tuple[int, ...], data: np.ndarray | None = None, dtype: int = s.TensorType.FLOAT32
    ) -> int:
        t = s.TensorT()
        t.name = name
        t.shape = list(shape)
        t.type = dtype
        t.buffer = 0
        if data is not None:
            b = s.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
            buffers.append(b)
            t.buffer = len(buffers) - 1
        tensors.append(t)
        return len(tensors) - 1

    hw = INPUT_HW
    x = tensor("input", (1, hw, hw, 3))
    k1 = tensor("w1", (8, 3, 3, 3), w.w1.transpose(0, 2, 3, 1))  # OIHW -> OHWI
    b1 = tensor("b1", (8,), w.b1)
    c1 = tensor("c1", (1, hw, hw, 8))
    p1 = tensor("p1", (1, hw // 2, hw // 2, 8))
    k2 = tensor("w2", (16, 3, 3, 8), w.w2.transpose(0, 2, 3, 1))
    b2 = tensor("b2", (16,), w.b2)
    c2 = tensor("c2", (1, hw // 4, hw // 4, 16))
    axes = tensor("axes", (2,), np.array([1, 2], dtype=np.int32), s.TensorType.INT32)
    g = tensor("g", (1, 16))
    k3 = tensor("w3", (NUM_CLASSES, 16), w.w3)
    b3 = tensor("b3", (NUM_CLASSES,), w.b3)
    out = tensor("logits", (1, NUM_CLASSES))

    codes: list[int] = [
        s.BuiltinOperator.CONV_2D,
        s.BuiltinOperator.MAX_POOL_2D,
        s.BuiltinOperator.MEAN,
        s.BuiltinOperator.FULLY_CONNECTED,
    ]
    opcodes = []
    for code in codes:
        oc = s.OperatorCodeT()
        oc.builtinCode = code
        oc.deprecatedBuiltinCode = min(code, 127)
        oc.version = 1
        opcodes.append(oc)

    def op(code: int, ins: list[int], outs: list[int], opt_type: int, opts: object) -> s.OperatorT:
        o = s.OperatorT()
        o.opcodeIndex = codes.index(code)
        o.inputs, o.outputs = ins, outs
        o.builtinOptionsType, o.builtinOptions = opt_type, opts
        return o

    def conv_opts(stride: int) -> s.Conv2DOptionsT:
        c = s.Conv2DOptionsT()
        c.padding, c.strideH, c.strideW = s.Padding.SAME, stride, stride
        c.dilationHFactor = c.dilationWFactor = 1
        c.fusedActivationFunction = s.ActivationFunctionType.RELU
        return c

    pool = s.Pool2DOptionsT()
    pool.padding, pool.strideH, pool.strideW, pool.filterHeight, pool.filterWidth = (
        s.Padding.VALID,
        2,
        2,
        2,
        2,
    )
    mean = s.ReducerOptionsT()
    mean.keepDims = False
    fc = s.FullyConnectedOptionsT()

    sub = s.SubGraphT()
    sub.tensors, sub.inputs, sub.outputs, sub.name = tensors, [x], [out], "main"
    sub.operators = [
        op(s.BuiltinOperator.CONV_2D, [x, k1, b1], [c1], s.BuiltinOptions.Conv2DOptions, conv_opts(1)),
        op(s.BuiltinOperator.MAX_POOL_2D, [c1], [p1], s.BuiltinOptions.Pool2DOptions, pool),
        op(s.BuiltinOperator.CONV_2D, [p1, k2, b2], [c2], s.BuiltinOptions.Conv2DOptions, conv_opts(2)),
        op(s.BuiltinOperator.MEAN, [c2, axes], [g], s.BuiltinOptions.ReducerOptions, mean),
        op(s.BuiltinOperator.FULLY_CONNECTED, [g, k3, b3], [out], s.BuiltinOptions.FullyConnectedOptions, fc),
    ]
    model = s.ModelT()
    model.version, model.description = 3, "edgekit tiny test model"
    model.operatorCodes, model.subgraphs, model.buffers = opcodes, [sub], buffers
    builder = flatbuffers.Builder(4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.write_bytes(bytes(builder.Output()))
    return path
