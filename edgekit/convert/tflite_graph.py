"""A float ``.tflite`` graph re-expressed as a PyTorch module with the file's own weights.

A detector that ships only as ``.tflite`` (MediaPipe's BlazeFace) has to reach ONNX, because
every artifact of the build starts from the fp32 ONNX.  The converter packages do not fit:
tf2onnx reads ``.tflite`` only through TensorFlow (a dependency of several GB that edgekit
does not install), and tflite2onnx is unmaintained (its last release predates the op
versions current files use).  Re-expressing the graph as a ``torch.nn.Module`` instead reuses
every converter the build already has — the ONNX export (and from it ONNX int8, OpenVINO,
TVM, TensorRT) and LiteRT's own through litert-torch — and the weights stay the file's,
bit for bit (fp16 weights are widened to fp32 once, as TFLite's DEQUANTIZE does).

The file is read with the flatbuffer schema that ai-edge-litert ships.  Activations are
held in NCHW: 4-D weights are transposed once at load, and ops that name an axis or a memory
order (PAD, CONCATENATION, RESHAPE) are mapped so that the module computes what the file
says in TFLite's NHWC.  TF "SAME" padding is applied exactly, asymmetric included (the extra
row or column goes after, as TensorFlow does), as an explicit pad before a padding-free op.

Only the ops listed in ``SUPPORTED_OPS`` are known; any other op is a ``BuildError`` that
names it and the model, never a silently different network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgekit.errors import BuildError

#: Ops the converter re-expresses (TFLite builtin names).
SUPPORTED_OPS = (
    "ADD",
    "CONCATENATION",
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "DEQUANTIZE",
    "MAX_POOL_2D",
    "PAD",
    "PRELU",
    "RELU",
    "RELU6",
    "RESHAPE",
    "RESIZE_BILINEAR",
)

# NHWC axis -> NCHW axis, for ops that name an axis of a 4-D tensor.
_NHWC_TO_NCHW_AXIS = (0, 2, 3, 1)
# NCHW axis i is NHWC axis _NCHW_FROM_NHWC[i] (for per-axis tables such as PAD's paddings).
_NCHW_FROM_NHWC = (0, 3, 1, 2)
_HINT = "edgekit converts float .tflite models made of: " + ", ".join(SUPPORTED_OPS)


def _schema() -> Any:
    try:
        from ai_edge_litert import schema_py_generated
    except ImportError as err:
        raise BuildError(
            f"reading a .tflite graph needs ai-edge-litert ({err})", 'pip install "edgekit[litert]"'
        ) from err
    return schema_py_generated


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF "SAME" padding along one axis: (before, after); the odd pixel goes after."""
    out = math.ceil(size / stride)
    effective = (kernel - 1) * dilation + 1
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _activation(code: int, model: str) -> int:
    """A fused activation code the module can apply (ActivationFunctionType: NONE, RELU, RELU_N1_TO_1, RELU6)."""
    if code not in (0, 1, 2, 3):
        raise BuildError(f"{model}: fused activation {code} (TANH, SIGN_BIT, ...) is not supported", _HINT)
    return code


def _apply(code: int, x: torch.Tensor) -> torch.Tensor:
    # Held as a code, not a callable, so the module deep-copies and pickles like any other.
    if code == 1:
        return F.relu(x)
    if code == 2:
        return torch.clamp(x, -1.0, 1.0)
    if code == 3:
        return torch.clamp(x, 0.0, 6.0)
    return x


class _Conv(nn.Module):
    """CONV_2D / DEPTHWISE_CONV_2D: explicit TF padding, then a padding-free conv, then the activation."""

    def __init__(
        self,
        weight: np.ndarray,
        bias: np.ndarray | None,
        stride: tuple[int, int],
        dilation: tuple[int, int],
        pad: tuple[int, int, int, int],
        groups: int,
        activation: int,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(np.ascontiguousarray(weight)), requires_grad=False)
        self.bias = (
            nn.Parameter(torch.from_numpy(np.ascontiguousarray(bias)), requires_grad=False)
            if bias is not None
            else None
        )
        self.stride = stride
        self.dilation = dilation
        self.pad = pad  # F.pad order: (left, right, top, bottom)
        self.groups = groups
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if any(self.pad):
            x = F.pad(x, self.pad)
        y = F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return _apply(self.activation, y)


class _MaxPool(nn.Module):
    def __init__(
        self,
        kernel: tuple[int, int],
        stride: tuple[int, int],
        pad: tuple[int, int, int, int],
        activation: int,
    ) -> None:
        super().__init__()
        self.kernel, self.stride, self.pad, self.activation = kernel, stride, pad, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if any(self.pad):
            # TFLite's SAME max pool ignores the padded cells: pad with -inf, never with 0.
            x = F.pad(x, self.pad, value=float("-inf"))
        return _apply(self.activation, F.max_pool2d(x, self.kernel, self.stride))


class _Add(nn.Module):
    def __init__(self, activation: int) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _apply(self.activation, a + b)


class _Relu(nn.Module):
    def __init__(self, ceiling: float | None) -> None:
        super().__init__()
        self.ceiling = ceiling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x) if self.ceiling is None else torch.clamp(x, 0.0, self.ceiling)


class _PRelu(nn.Module):
    """PRELU: ``x`` where ``x >= 0``, ``alpha * x`` below.

    A per-channel alpha (MediaPipe's ``[1, 1, C]``) is ``F.prelu``, which exports as ONNX's
    PRelu; any other broadcast shape takes the elementwise form, which computes the same.
    """

    def __init__(self, alpha: np.ndarray, per_channel: bool) -> None:
        super().__init__()
        self.per_channel = per_channel
        self.register_buffer("alpha", torch.from_numpy(np.ascontiguousarray(alpha)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.get_buffer("alpha")
        if self.per_channel:
            return F.prelu(x, alpha)
        return torch.where(x >= 0, x, alpha * x)


class _Pad(nn.Module):
    def __init__(self, pad: tuple[int, ...]) -> None:
        super().__init__()
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pad)


class _Reshape(nn.Module):
    """RESHAPE in TFLite's memory order: a 4-D input goes back to NHWC first, a 4-D result to NCHW."""

    def __init__(self, in_rank: int, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.in_rank, self.shape = in_rank, shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_rank == 4:
            x = x.permute(0, 2, 3, 1)
        y = x.reshape(self.shape)
        return y.permute(0, 3, 1, 2) if len(self.shape) == 4 else y


class _Concat(nn.Module):
    def __init__(self, axis: int, activation: int) -> None:
        super().__init__()
        self.axis, self.activation = axis, activation

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return _apply(self.activation, torch.cat(xs, dim=self.axis))


class _ResizeBilinear(nn.Module):
    """RESIZE_BILINEAR to ``size``, or by an integer ``scale`` (the same source coordinates).

    A scale exports as ONNX Resize ``scales`` (1, 1, sy, sx), right for any batch; a size as
    the batch-of-one's whole output shape, which would pin the ONNX graph's batch to 1.
    """

    def __init__(
        self, size: tuple[int, int], align_corners: bool, scale: tuple[int, int] | None = None
    ) -> None:
        super().__init__()
        self.size, self.align_corners, self.scale = size, align_corners, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's align_corners=False is TF's half_pixel_centers (both clamp at the border).
        if self.scale is not None:
            factor = (float(self.scale[0]), float(self.scale[1]))
            return F.interpolate(x, scale_factor=factor, mode="bilinear", align_corners=False)
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=self.align_corners)


class _Constant(nn.Module):
    """A constant operand of an elementwise op or a concatenation, held as a buffer."""

    def __init__(self, value: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("value", torch.from_numpy(np.ascontiguousarray(value)))

    def forward(self) -> torch.Tensor:
        return self.get_buffer("value")


class TFLiteGraph(nn.Module):
    """The graph of a float ``.tflite`` file as a PyTorch module.

    Takes the model's one input in NCHW float32 (``(1, 3, H, W)`` for an image model whose
    ``.tflite`` takes ``(1, H, W, 3)``) and returns its outputs as a tuple in the file's
    output order, shaped as the file says (4-D outputs back in NHWC).  ``input_name`` and
    ``output_names`` are the file's tensor names.
    """

    def __init__(
        self,
        steps: Sequence[tuple[nn.Module, tuple[int, ...], int]],
        input_id: int,
        outputs: Sequence[tuple[int, int]],
        input_name: str,
        output_names: Sequence[str],
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList([layer for layer, _, _ in steps])
        self._wiring = [(inputs, out) for _, inputs, out in steps]
        self._input_id = input_id
        self._outputs = list(outputs)  # (tensor id, rank)
        self.input_name = input_name
        self.output_names = tuple(output_names)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env: dict[int, torch.Tensor] = {self._input_id: x}
        for layer, (inputs, out) in zip(self.layers, self._wiring, strict=True):
            env[out] = layer(*(env[i] for i in inputs))
        return tuple(env[tid].permute(0, 2, 3, 1) if rank == 4 else env[tid] for tid, rank in self._outputs)


class _Reader:
    """Walks one subgraph of a parsed model and builds the module's steps."""

    def __init__(self, schema: Any, model: Any, name: str) -> None:
        self.s, self.m, self.name = schema, model, name
        self.g = model.subgraphs[0]
        self.op_names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
        self.consts: dict[int, np.ndarray] = {}
        self.steps: list[tuple[nn.Module, tuple[int, ...], int]] = []
        self.materialized: set[int] = set()
        for tid, tensor in enumerate(self.g.tensors):
            data = model.buffers[tensor.buffer].data if tensor.buffer < len(model.buffers) else None
            if data is not None and len(data):
                self.consts[tid] = self._decode(tensor, bytes(np.asarray(data, dtype=np.uint8)))

    def _decode(self, tensor: Any, raw: bytes) -> np.ndarray:
        types = self.s.TensorType
        dtypes = {types.FLOAT32: np.float32, types.FLOAT16: np.float16, types.INT32: np.int32}
        if tensor.type not in dtypes:
            raise BuildError(
                f"{self.name}: constant {tensor.name.decode()!r} has tensor type {tensor.type}, not float",
                "edgekit converts float .tflite models (fp32, or fp16 weights); quantize after the build",
            )
        shape = tuple(int(d) for d in tensor.shape) if tensor.shape is not None else ()
        return np.frombuffer(raw, dtype=dtypes[tensor.type]).reshape(shape)

    def shape(self, tid: int) -> tuple[int, ...]:
        t = self.g.tensors[tid]
        return tuple(int(d) for d in t.shape) if t.shape is not None else ()

    def const(self, tid: int, op: str) -> np.ndarray:
        if tid not in self.consts:
            raise BuildError(
                f"{self.name}: {op} needs a constant for {self.g.tensors[tid].name.decode()!r}", _HINT
            )
        return self.consts[tid]

    def operand(self, tid: int, rank: int) -> int:
        """A tensor an op reads at run time; a constant becomes a buffer step, laid out like the others."""
        if tid in self.consts and tid not in self.materialized:
            value = self.consts[tid].astype(np.float32)
            if rank == 4:
                # Broadcast as in NHWC: left-pad the shape to 4-D, then hold it as NCHW.
                value = value.reshape((1,) * (4 - value.ndim) + value.shape).transpose(0, 3, 1, 2)
            elif value.ndim != rank and value.ndim > 0:
                value = value.reshape((1,) * (rank - value.ndim) + value.shape)
            self.steps.append((_Constant(value), (), tid))
            self.materialized.add(tid)
        return tid

    def build(self) -> list[tuple[nn.Module, tuple[int, ...], int]]:
        for op in self.g.operators:
            code = self.m.operatorCodes[op.opcodeIndex]
            builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
            kind = self.op_names.get(builtin, f"builtin {builtin}")
            if kind == "CUSTOM":
                kind = f"CUSTOM {code.customCode.decode() if code.customCode else '?'}"
            handler = getattr(self, f"_op_{kind.lower()}", None)
            if kind not in SUPPORTED_OPS or handler is None:
                raise BuildError(f"{self.name}: TFLite op {kind} is not supported", _HINT)
            handler(op, list(op.inputs), list(op.outputs), op.builtinOptions)
        return self.steps

    # --- one method per op ---------------------------------------------------------------

    def _op_dequantize(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        # fp16 weights stored once and widened at load: the fp32 the TFLite kernel would compute.
        value = self.const(ins[0], "DEQUANTIZE")
        if value.dtype != np.float16:
            raise BuildError(f"{self.name}: DEQUANTIZE of a {value.dtype} tensor is not supported", _HINT)
        self.consts[outs[0]] = value.astype(np.float32)

    def _conv(self, ins: list[int], outs: list[int], opt: Any, depthwise: bool) -> None:
        kind = "DEPTHWISE_CONV_2D" if depthwise else "CONV_2D"
        kernel = self.const(ins[1], kind).astype(np.float32)
        bias = self.const(ins[2], kind).astype(np.float32) if len(ins) > 2 and ins[2] >= 0 else None
        _, h, w, _ = self.shape(ins[0])
        kh, kw = kernel.shape[1], kernel.shape[2]
        stride = (int(opt.strideH), int(opt.strideW))
        dilation = (int(opt.dilationHFactor), int(opt.dilationWFactor))
        pad = (0, 0, 0, 0)
        if opt.padding == self.s.Padding.SAME:
            top, bottom = same_padding(h, kh, stride[0], dilation[0])
            left, right = same_padding(w, kw, stride[1], dilation[1])
            pad = (left, right, top, bottom)
        if depthwise:
            # [1, kh, kw, C*M] -> [C*M, 1, kh, kw]; output channel c*M + m reads input channel c,
            # which is what groups=C computes.
            weight = kernel.transpose(3, 0, 1, 2)
            groups = self.shape(ins[0])[3]
        else:
            weight = kernel.transpose(0, 3, 1, 2)  # [O, kh, kw, I] -> [O, I, kh, kw]
            groups = 1
        act = _activation(int(opt.fusedActivationFunction), self.name)
        layer = _Conv(weight, bias, stride, dilation, pad, groups, act)
        self.steps.append((layer, (ins[0],), outs[0]))

    def _op_conv_2d(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        self._conv(ins, outs, opt, depthwise=False)

    def _op_depthwise_conv_2d(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        self._conv(ins, outs, opt, depthwise=True)

    def _op_max_pool_2d(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        _, h, w, _ = self.shape(ins[0])
        kernel = (int(opt.filterHeight), int(opt.filterWidth))
        stride = (int(opt.strideH), int(opt.strideW))
        pad = (0, 0, 0, 0)
        if opt.padding == self.s.Padding.SAME:
            top, bottom = same_padding(h, kernel[0], stride[0])
            left, right = same_padding(w, kernel[1], stride[1])
            pad = (left, right, top, bottom)
        act = _activation(int(opt.fusedActivationFunction), self.name)
        self.steps.append((_MaxPool(kernel, stride, pad, act), (ins[0],), outs[0]))

    def _op_add(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        rank = len(self.shape(outs[0]))
        for tid in ins:
            if tid not in self.consts and len(self.shape(tid)) != rank and rank == 4:
                raise BuildError(f"{self.name}: ADD broadcasting a {self.shape(tid)} tensor to 4-D", _HINT)
        a, b = (self.operand(t, rank) for t in ins)
        act = _activation(int(opt.fusedActivationFunction), self.name)
        self.steps.append((_Add(act), (a, b), outs[0]))

    def _op_relu(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        self.steps.append((_Relu(None), (ins[0],), outs[0]))

    def _op_prelu(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        alpha = self.const(ins[1], "PRELU").astype(np.float32)
        shape = self.shape(ins[0])
        rank = len(shape)
        if rank == 4 and alpha.size == shape[3] and alpha.shape[-1] == shape[3]:
            self.steps.append((_PRelu(alpha.reshape(-1), True), (ins[0],), outs[0]))
            return
        # Broadcast as in NHWC, held in the module's layout (as a constant operand is).
        if rank == 4:
            alpha = alpha.reshape((1,) * (4 - alpha.ndim) + alpha.shape).transpose(0, 3, 1, 2)
        self.steps.append((_PRelu(np.ascontiguousarray(alpha), False), (ins[0],), outs[0]))

    def _op_relu6(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        self.steps.append((_Relu(6.0), (ins[0],), outs[0]))

    def _op_pad(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        pads = self.const(ins[1], "PAD").astype(np.int64).reshape(-1, 2)
        if len(pads) == 4:
            pads = pads[list(_NCHW_FROM_NHWC)]
        # F.pad lists the last axis first.
        flat = tuple(int(v) for row in pads[::-1] for v in row)
        self.steps.append((_Pad(flat), (self.operand(ins[0], len(pads)),), outs[0]))

    def _op_reshape(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        # The output tensor's static shape is what the new_shape (option or second input) resolves to.
        shape = self.shape(outs[0])
        if not shape or any(d < 0 for d in shape):
            raise BuildError(
                f"{self.name}: RESHAPE to a dynamic shape {shape}", "give the model a static input"
            )
        self.steps.append((_Reshape(len(self.shape(ins[0])), shape), (ins[0],), outs[0]))

    def _op_concatenation(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        rank = len(self.shape(outs[0]))
        axis = int(opt.axis) % rank
        if rank == 4:
            axis = _NHWC_TO_NCHW_AXIS[axis]
        act = _activation(int(opt.fusedActivationFunction), self.name)
        operands = tuple(self.operand(t, rank) for t in ins)
        self.steps.append((_Concat(axis, act), operands, outs[0]))

    def _op_resize_bilinear(self, op: Any, ins: list[int], outs: list[int], opt: Any) -> None:
        size = self.const(ins[1], "RESIZE_BILINEAR").astype(np.int64)
        align = bool(opt.alignCorners)
        if not align and not opt.halfPixelCenters:
            raise BuildError(
                f"{self.name}: RESIZE_BILINEAR without align_corners or half_pixel_centers "
                "(TF1's legacy sampling) is not supported",
                _HINT,
            )
        out_h, out_w = int(size[0]), int(size[1])
        _, h, w, _ = self.shape(ins[0])
        scale = (out_h // h, out_w // w) if not align and out_h % h == 0 and out_w % w == 0 else None
        layer = _ResizeBilinear((out_h, out_w), align, scale)
        self.steps.append((layer, (ins[0],), outs[0]))


def parse(data: bytes, name: str) -> TFLiteGraph:
    """Build the module from a ``.tflite`` file's bytes; ``name`` is how errors name the model."""
    schema = _schema()
    try:
        if not schema.Model.ModelBufferHasIdentifier(data, 0):
            raise ValueError("no TFL3 identifier")
        model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(data, 0))
    except Exception as err:  # a damaged flatbuffer raises anything (IndexError, struct.error, ...)
        raise BuildError(
            f"{name} is not a readable .tflite flatbuffer ({err})", "check the file was copied whole"
        ) from err
    if not model.subgraphs or len(model.subgraphs) != 1:
        raise BuildError(f"{name}: a .tflite with {len(model.subgraphs or [])} subgraphs", _HINT)
    reader = _Reader(schema, model, name)
    graph = reader.g
    if len(graph.inputs) != 1:
        raise BuildError(f"{name}: the graph has {len(graph.inputs)} inputs; edgekit models take one", _HINT)
    steps = reader.build()
    tensors = graph.tensors
    outputs = [(int(tid), len(reader.shape(int(tid)))) for tid in graph.outputs]
    module = TFLiteGraph(
        steps,
        int(graph.inputs[0]),
        outputs,
        tensors[graph.inputs[0]].name.decode(),
        [tensors[tid].name.decode() for tid, _ in outputs],
    )
    return module.eval()


def load_tflite(path: Path) -> TFLiteGraph:
    """Build the module from a ``.tflite`` file."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BuildError(f"{path} cannot be read: {err.strerror}", "check the path") from err
    return parse(data, path.name)
