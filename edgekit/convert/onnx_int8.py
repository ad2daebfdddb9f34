"""ONNX int8: ONNX Runtime static quantization (QDQ, per-channel weights), calibrated on images.

The recipe was chosen by measuring EfficientNet-Lite0 on the 36 smoke images with ONNX
Runtime 1.32 on an x86_64 CPU with AVX2 and no VNNI (logit SQNR against fp32, higher is
better; the numbers are in the issue-3 notes):

- **uint8 activations, int8 per-channel weights (U8S8).**  On x86 ORT fuses every Conv and
  Add of a U8S8 QDQ graph into QLinearConv/QLinearAdd.  With int8 activations (S8S8) it
  left 14 Convs and every Add in float between Q/DQ pairs and ran ~15% slower.
- **7-bit weight range on the GEMM-type layers** (non-depthwise Conv, Gemm, MatMul).  x86
  CPUs without VNNI multiply u8 x s8 with VPMADDUBSW, whose int16 pair sums saturate: with
  full 8-bit weights the model ORT ran was far from the QDQ graph it was given (7 dB and
  56% top-1 agreement, against 18 dB when the QDQ graph is evaluated in float).  Halving
  the weight range removes the overflow on every CPU; depthwise kernels accumulate in
  int32 and keep all 8 bits.  This is ORT's documented ``reduce_range`` fix, applied only
  where it is needed.
- **The first few weighted layers stay fp32** (stem and first blocks: high resolution, few
  channels, the most sensitive to rounding): 12.4 -> 18.3 dB for the first 6, at no
  measurable speed cost.  A model with few layers is quantized whole.
- **MinMax calibration**: Percentile and Entropy were within 0.2 dB and 2-3x slower.
- **A detector's output heads stay fp32** (``edgekit.convert.heads``): the layers whose
  results go straight to a dense output (box offsets, score logits), with every op after
  them (reshapes, a Sigmoid, YOLOv8's DFL and anchor arithmetic), in both recipes.  One 8-bit
  scale over BlazeFace's logits put its scores on a grid ~0.4 logits wide (0.500, 0.805...)
  and invented a face at 0.500 in a photograph without one; over a YOLOv8 output (pixels
  0..640 and probabilities 0..1) it lost every box.  A classifier has no such head and is
  quantized exactly as before.
- ``quant_pre_process`` is not run: on the already folded graph its output quantized to the
  very same model.

**The full-range recipe** (``full_range=True``, the ``int8-full`` artifact) is for CPUs whose
int8 dot products accumulate in int32 without saturating: x86 with VNNI or AMX
(``VPDPBUSD``), Arm with ``SDOT``/``UDOT`` or ``i8mm`` (and on Arm, ORT widens each product
to 16 bits and pair-adds in 32, so even cores without the dot product do not saturate).
There every weight keeps its 8 bits and every layer is quantized, first ones included (but a
detector's stem: ``float_layers_of``):
on an AVX-512 VNNI/AMX CPU it ran 2.06 ms against 2.12 for the portable recipe (ORT 1.32,
2 threads), with the same top-1 on the smoke set's decisive images.  On x86 without
VNNI the same model saturates, so a device profile marks it ``requires = ["int8-dot"]``,
and a build host without int8-dot gates it by running the QDQ graph unfused (in float:
the arithmetic a non-saturating CPU computes).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.convert import heads
from edgekit.convert.artifact import Artifact
from edgekit.convert.onnx_export import check_onnx
from edgekit.errors import BuildError, first_line

if TYPE_CHECKING:
    import numpy as np

FLOAT_LAYERS = 6  # weighted layers kept in fp32 at the start of the graph
FULL_RANGE_DETECTOR_FLOAT_LAYERS = 1  # a detector's stem, in the full-range recipe (float_layers_of)
# Per-channel QDQ needs DequantizeLinear's ``axis``, which opset 13 added: ORT's quantizer writes it
# into an older graph all the same, and ORT then refuses to load the model.
QDQ_OPSET = 13
_GEMM_OPS = ("Conv", "Gemm", "MatMul")


def quantize_onnx_int8(
    fp32: Path,
    out: Path,
    calibration: np.ndarray,
    input_name: str = "input",
    *,
    float_layers: int = FLOAT_LAYERS,
    full_range: bool = False,
    on_image: Callable[[int, int], object] | None = None,
) -> Artifact:
    """Quantize the fp32 ONNX ``fp32`` to an int8 QDQ model at ``out``, calibrated on ``calibration``.

    ``calibration`` is a preprocessed batch (N, ...) fed one image at a time to ``input_name``.
    The input and output stay float32, so a device feeds the int8 model what it feeds fp32.
    ``full_range``: 8-bit weights everywhere and no float layers but a detector's stem, for CPUs with int8-dot.
    ``on_image(done, of)`` is called as each calibration image is read (the build's progress).
    """
    from onnxruntime import __version__ as ort_version
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    model = check_onnx(fp32)
    check_calibration(fp32, model, calibration, input_name)
    model = _at_least_qdq_opset(model)
    _name_nodes(model)
    weights = {t.name: t for t in model.graph.initializer}
    layers = [
        n for n in model.graph.node if n.op_type in _GEMM_OPS and n.input[1:2] and n.input[1] in weights
    ]
    # A detector's output heads stay float in both recipes (edgekit.convert.heads says why), their
    # branches in the portable one: on the DocLayNet YOLOv8n (1024x1024) they are 37% of the MACs;
    # float in int8-full, it ran 1.43x faster than fp32 (65.40 mAP50, fp32 65.35), quantized 1.88x
    # (64.82: the stem is what int8-full needs float).  The portable recipe (7-bit weights) lost
    # 1.36 points with them quantized, 0.65 with them float.
    float_heads = heads.onnx_heads(model, with_branches=not full_range)
    keep = [
        n.name
        for n in layers[: float_layers_of(len(layers), float_layers, full_range, detector=bool(float_heads))]
    ]
    if full_range:
        keep += _activations(model, keep)
    overrides = {} if full_range else _seven_bit_weights(layers, weights)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with _without_preprocess_advice():
            quantize_static(
                model,
                tmp,
                _Reader(calibration, input_name, on_image),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                nodes_to_exclude=list(dict.fromkeys(keep + float_heads)),
                extra_options={
                    # One Q/DQ pair per consumer: a DQ shared by two nodes blocks ORT's fusions.
                    "DedicatedQDQPair": True,
                    "TensorQuantOverrides": overrides,
                },
            )
        if float_heads:
            _dequantize_head_inputs(tmp, float_heads)
        os.replace(tmp, out)
    except Exception as err:  # the quantizer's boundary: any failure is a build failure
        raise BuildError(
            f"ONNX Runtime could not quantize {fp32} to int8: {first_line(err)}",
            "check the calibration images match the model input; or build without the onnxruntime-int8 artifact",
        ) from err
    finally:
        tmp.unlink(missing_ok=True)
    return Artifact(
        path=out,
        backend="onnxruntime",
        precision="int8",
        files=(out,),
        kind="onnx",
        variant="full" if full_range else "",
        notes={
            "quantizer": f"onnxruntime {ort_version} quantize_static",
            "format": "QDQ",
            "calibration_images": len(calibration),
            "calibration_method": "minmax",
            "activations": "uint8, per tensor",
            "weights": "int8 symmetric per channel, full 8-bit range (for CPUs with int8-dot: VNNI, AMX, Arm)"
            if full_range
            else "int8 symmetric per channel; 7-bit range on non-depthwise Conv/Gemm/MatMul "
            "(no int16 saturation on x86 CPUs without VNNI)",
            "float_layers": keep,
            **_float_heads_note(float_heads),
        },
    )


def float_layers_of(layers: int, float_layers: int, full_range: bool, *, detector: bool) -> int:
    """How many weighted layers at the start of the graph stay float.

    The portable recipe: ``float_layers`` (at most a quarter of the model).  The full-range
    recipe quantizes every layer of a classifier, but keeps a detector's first (unless
    ``float_layers`` is 0: the stem, on
    the image itself; under 1% of a YOLOv8n's work): quantized, it cost the DocLayNet YOLOv8n
    1.8 points of mAP50 on typeset pages with ONNX Runtime (63.0 against 64.8 kept float,
    fp32 65.4), boxes being placed to the pixel where a class only needs the right argmax.
    """
    if full_range:
        return min(FULL_RANGE_DETECTOR_FLOAT_LAYERS, float_layers, layers) if detector else 0
    return min(float_layers, layers // 4)


_ACTIVATION_OPS = ("Relu", "Sigmoid", "Mul", "Add", "Clip", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh")


def _activations(model: Any, kept: list[str]) -> list[str]:
    """The activation ops computed from the ``kept`` layers alone (a SiLU's Sigmoid and Mul), in graph order.

    A float stem whose activation is quantized still rounds its output: with only its Conv
    excluded, ORT int8-full of the DocLayNet YOLOv8n scored 63.5 mAP50, with the SiLU too 65.4.
    """
    producer = {out: node.name for node in model.graph.node for out in node.output}
    float_nodes, found = set(kept), []
    for node in model.graph.node:
        sources = [producer[i] for i in node.input if i in producer]
        if node.op_type in _ACTIVATION_OPS and sources and all(s in float_nodes for s in sources):
            float_nodes.add(node.name)
            found.append(node.name)
    return found


def _float_heads_note(float_heads: list[str]) -> dict[str, Any]:
    """The artifact notes' record of the float heads: nothing for a classifier, whose notes stay as they were."""
    return {"float_heads": float_heads, "float_heads_recipe": heads.RECIPE} if float_heads else {}


def _dequantize_head_inputs(path: Path, float_heads: list[str]) -> None:
    """Feed each float head its input's int8 values: a DequantizeLinear of its own after the input's Q.

    ORT gives a Q/DQ pair to quantized consumers only; an excluded node reads the float tensor
    itself.  That is wrong where ORT dropped a Relu whose output it quantizes (the Q clips at
    zero): the tensor is then the layer before it, unclipped (BlazeFace's heads read negative
    features and scored faces everywhere).  Keeping every Relu instead (QDQKeepRemovableActivations)
    cost 0.2 ms of 1.6 on the full-range recipe; one DQ per head input costs nothing measurable.
    """
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    quantized = {n.input[0]: n for n in graph.node if n.op_type == "QuantizeLinear"}
    dequantizers = {n.input[0]: n for n in graph.node if n.op_type == "DequantizeLinear"}
    added: dict[str, str] = {}
    heads_ = set(float_heads)
    nodes = list(graph.node)
    for node in nodes:
        if node.name not in heads_ or node.op_type not in _GEMM_OPS or node.input[0] not in quantized:
            continue
        x = node.input[0]
        if x not in added:
            q = quantized[x]
            dq = dequantizers[q.output[0]]
            added[x] = f"{x}_DequantizeLinear_Output_float_head"
            copy = onnx.helper.make_node(
                "DequantizeLinear", [q.output[0], *dq.input[1:]], [added[x]], name=f"{dq.name}_float_head"
            )
            copy.attribute.extend(dq.attribute)
            graph.node.insert(list(graph.node).index(node), copy)
        node.input[0] = added[x]
    onnx.save(model, str(path))


class _PreprocessAdvice(logging.Filter):
    """Drops ORT's "consider pre-processing" warning: quant_pre_process was measured and changes nothing here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


@contextlib.contextmanager
def _without_preprocess_advice() -> Iterator[None]:
    # ORT logs it on the root logger, once per quantization.
    advice = _PreprocessAdvice()
    logging.getLogger().addFilter(advice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)


class _Reader:
    """ORT's CalibrationDataReader protocol over a batch: one image per call, then None."""

    def __init__(
        self, batch: np.ndarray, input_name: str, on_image: Callable[[int, int], object] | None = None
    ) -> None:
        self._items: Iterator[dict[str, np.ndarray]] = iter(
            {input_name: batch[i : i + 1]} for i in range(len(batch))
        )
        self._n, self._read, self._on_image = len(batch), 0, on_image

    def get_next(self) -> dict[str, np.ndarray] | None:
        item = next(self._items, None)
        if item is not None and self._on_image is not None:
            self._read += 1
            self._on_image(self._read, self._n)
        return item


def check_calibration(path: Path, model: Any, calibration: np.ndarray, input_name: str | None = None) -> None:
    """The calibration batch must be float32 images shaped like ``input_name`` (default: the first input)."""
    import numpy as np

    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    name = input_name if input_name is not None else next(iter(inputs), "")
    if name not in inputs:
        raise BuildError(
            f"{path} has no input named {name!r} (its inputs: {', '.join(inputs)})",
            "set the model card's input name to the ONNX graph's input",
        )
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[name].type.tensor_type.shape.dim]
    shape = list(calibration.shape)
    fits = len(shape) == len(dims) and all(
        d in (None, 0, n) for d, n in zip(dims[1:], shape[1:], strict=True)
    )
    if calibration.dtype != np.float32 or not shape or shape[0] == 0 or not fits:
        raise BuildError(
            f"calibration for {path} is {calibration.dtype}{shape}; input {name!r} takes float32"
            f"[N, {', '.join('?' if d is None else str(d) for d in dims[1:])}]",
            "pass images preprocessed with the model's own preprocessing (ImageSet.batch(spec))",
        )


def opset_params(fp32_onnx: Path) -> dict[str, int]:
    """What the opset conversion adds to an ORT int8 step's cache key: ``{"qdq_opset": 13}`` for an
    older graph (whose int8 models cached before the conversion did not load), nothing otherwise."""
    import onnx

    return {"qdq_opset": QDQ_OPSET} if _opset(onnx.load(str(fp32_onnx))) < QDQ_OPSET else {}


def _opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), QDQ_OPSET)


def _at_least_qdq_opset(model: Any) -> Any:
    """``model`` converted to opset 13 when it is older (as Ultralytics' ``opset=12`` exports are).

    Quantized as it is, an opset-12 graph gets per-channel weight and bias DequantizeLinears
    with an ``axis`` attribute (opset 13), and ORT refused the int8 model: "Unrecognized
    attribute: axis for operator DequantizeLinear".  ONNX's version converter keeps the
    graph's meaning (Split's sizes become an input, Softmax keeps its axis' semantics).
    """
    import onnx
    from onnx import version_converter

    opset = _opset(model)
    if opset >= QDQ_OPSET:
        return model
    try:
        converted = version_converter.convert_version(model, QDQ_OPSET)
        onnx.checker.check_model(converted)
    except Exception as err:  # the converter's boundary: any failure is a build failure
        raise BuildError(
            f"the model's opset {opset} could not be converted to opset {QDQ_OPSET} for int8: {first_line(err)}",
            f"re-export the model with opset >= {QDQ_OPSET}, or build without the onnxruntime int8 artifacts",
        ) from err
    return converted


def _name_nodes(model: Any) -> None:
    """Give unnamed nodes a name: ORT's quantizer excludes and reports nodes by name."""
    used = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
            while node.name in used:
                node.name += "_"
            used.add(node.name)


def _seven_bit_weights(layers: list[Any], weights: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """ORT tensor overrides: a 7-bit range for every weight that goes through a u8 x s8 GEMM kernel."""
    overrides: dict[str, list[dict[str, Any]]] = {}
    for node in layers:
        dims = list(weights[node.input[1]].dims)
        attrs = {a.name: a for a in node.attribute}
        group = attrs["group"].i if "group" in attrs else 1
        if node.op_type == "Conv" and group > 1 and len(dims) > 1 and dims[1] == 1:
            continue  # depthwise: ORT's kernel accumulates in int32, so it keeps all 8 bits
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "Gemm":
            axis = 0 if "transB" in attrs and attrs["transB"].i else 1
        elif len(dims) == 2:
            axis = 1  # MatMul weights are [in, out]
        else:
            continue  # a batched MatMul weight: leave it to ORT's defaults
        # The per-channel axis must be given, or ORT takes the override as per-tensor.
        overrides[node.input[1]] = [{"reduce_range": True, "axis": axis}]
    return overrides
