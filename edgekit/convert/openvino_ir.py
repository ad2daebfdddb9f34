"""OpenVINO IR artifacts: fp32 and fp16 by conversion, int8 by NNCF post-training quantization.

An IR is two files, ``<stem>-<precision>.xml`` (the graph) and ``.bin`` (the weights).  Both
are written under temporary names and renamed into place, the ``.bin`` first, so a reader
never finds an ``.xml`` whose weights are missing or half-written.

``ov.save_model`` compresses weights to fp16 unless told not to, so the fp32 IR passes
``compress_to_fp16=False``.  The CPU plugin runs an fp16 IR in fp32 (the weights are
widened at load): it halves the file, not the arithmetic.

int8 choices, measured on EfficientNet-Lite0 with the 36 smoke images on an x86_64 AVX2 CPU
without VNNI (logit SQNR against fp32): NNCF's default overflow fix only halves the weight
range of the first layer; oneDNN's int8 kernels on such CPUs saturate int16 pair sums in the
others too (9.5 dB, 61% top-1 agreement).  ``OverflowFix.ENABLE`` applies the 7-bit weight
range everywhere (15.7 dB); keeping the first weighted layers in fp32 as well gives 20.8 dB.
Bias correction is NNCF's fast one: the full one took 2.5x longer for no gain here.
A detector's output heads (``edgekit.convert.heads``) stay fp32 in both int8 recipes, so its
scores are not on one 8-bit output grid; a classifier has none and is quantized as before.

A detector's full-range IR quantizes the heads' branches and calibrates activations
asymmetrically (NNCF's ``MIXED`` preset: a zero point, as ONNX Runtime's uint8 activations
have).  YOLOv8's SiLU outputs reach down to -0.28: one symmetric scale spends half its codes
on negatives that hardly occur.  The DocLayNet YOLOv8n (1024x1024, 40 labelled pages, fp32
65.35 mAP50, 57 ms on an AVX-512 VNNI CPU, 2 threads): branches float, symmetric 64.42 mAP50
at 40.4 ms; branches quantized, symmetric 64.09 at 32.1 ms; branches quantized, asymmetric
64.51 at 31.1 ms; the stem quantized too, 64.28 at 29.9 ms (the stem stays float).

The full-range int8 IR (``full_range=True``) is for CPUs with int8-dot (VNNI, AMX, Arm
SDOT): no overflow fix, every layer quantized.  On an AVX-512 VNNI/AMX CPU (2 threads) it
ran 1.79 ms against 1.94 for the portable IR and 3.3 for the f32 IR, oneDNN choosing its
AMX int8 kernels for the 1x1 convolutions.

The bf16 IR is the fp32 graph with fp16-stored weights (half the file) that the device
runs with ``INFERENCE_PRECISION_HINT=bf16`` (the candidate's precision pins it): on a CPU
with AVX512-BF16 or AMX it ran 1.96 ms against 3.3 for f32, at 26 dB logit SQNR.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.convert import heads
from edgekit.convert.artifact import Artifact
from edgekit.convert.onnx_export import check_onnx
from edgekit.convert.onnx_int8 import check_calibration, float_layers_of
from edgekit.errors import BuildError, first_line

if TYPE_CHECKING:
    import numpy as np

PRECISIONS = ("fp32", "fp16", "bf16")
FLOAT_LAYERS = 6  # weighted layers kept in fp32 at the start of the int8 graph
_WEIGHTED_OPS = ("Convolution", "GroupConvolution", "MatMul")
# heads.walk on OpenVINO's graph: the ops whose every input is data (heads.ONNX_ALL_DATA_OPS;
# OpenVINO's frontend splits a Conv's bias into an Add after the Convolution, walked through
# the same way), and the ops the walk stops at (a ShapeOf's input is not what its output computes from).
_ALL_DATA_OPS = ("Concat", "Add", "Subtract", "Multiply", "Divide", "MatMul", "Maximum", "Minimum", "Select")
_NOT_PASS_OPS = ("Constant", "Parameter", "ShapeOf")


def convert_openvino(fp32_onnx: Path, out_dir: Path, precision: str) -> Artifact:
    """Convert the fp32 ONNX to an OpenVINO IR for ``precision`` in ``out_dir``.

    fp32 keeps fp32 weights; fp16 and bf16 store them as fp16 (what they compute in is the
    device's inference precision, which the candidate's precision pins).
    """
    if precision not in PRECISIONS:
        raise BuildError(
            f"OpenVINO IR precision {precision!r} is not one of {', '.join(PRECISIONS)}",
            "int8 is built by quantize_openvino_int8",
        )
    model = _read(fp32_onnx)
    xml = _save(model, out_dir / f"{_stem(fp32_onnx)}-{precision}.xml", compress_to_fp16=precision != "fp32")
    notes: dict[str, Any] = {"converter": f"openvino {_version()} convert_model"}
    if precision != "fp32":
        notes["computes_in"] = f"{precision} (INFERENCE_PRECISION_HINT; weights stored as fp16)"
    return _artifact(xml, precision, notes)


def quantize_openvino_int8(
    fp32_onnx: Path,
    out_dir: Path,
    calibration: np.ndarray,
    *,
    float_layers: int = FLOAT_LAYERS,
    full_range: bool = False,
    on_image: Callable[[int, int], object] | None = None,
) -> Artifact:
    """Quantize the fp32 ONNX to an int8 OpenVINO IR with NNCF, calibrated on ``calibration`` (N, ...).

    ``full_range``: 8-bit weights everywhere and no float layers but a detector's stem, for CPUs with int8-dot.
    ``on_image(done, of)`` is called as NNCF takes each calibration image, on each of its passes
    (statistics, then bias correction): the build's own progress beside NNCF's bars.
    """
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    model = _read(fp32_onnx, calibration)
    layers = [op.get_friendly_name() for op in model.get_ordered_ops() if op.get_type_name() in _WEIGHTED_OPS]
    # A detector's output heads stay float in both recipes (edgekit.convert.heads says why), their
    # branches in the portable one (the module docstring has the full-range recipe's numbers).
    float_heads = _float_heads(model, with_branches=not full_range)
    detector = bool(float_heads)
    keep = layers[: float_layers_of(len(layers), float_layers, full_range, detector=detector)]
    # Asymmetric activations for a full-range detector (its SiLUs' negative tail); symmetric
    # elsewhere: what the CPU plugin runs fastest, and what the classifiers were measured with.
    mixed = full_range and detector
    preset = nncf.QuantizationPreset.MIXED if mixed else nncf.QuantizationPreset.PERFORMANCE
    try:
        with _quiet_nncf():
            quantized = nncf.quantize(
                model,
                nncf.Dataset(_Images(calibration, on_image)),
                preset=preset,
                subset_size=len(calibration),  # a few dozen images: use them all
                fast_bias_correction=True,
                ignored_scope=nncf.IgnoredScope(names=list(dict.fromkeys(keep + float_heads))),
                advanced_parameters=AdvancedQuantizationParameters(
                    overflow_fix=OverflowFix.DISABLE if full_range else OverflowFix.ENABLE
                ),
            )
    except Exception as err:  # NNCF's boundary: any failure is a build failure
        raise BuildError(
            f"NNCF could not quantize {fp32_onnx} to an int8 OpenVINO IR: {first_line(err)}",
            "check the calibration images match the model input; or build without the openvino-int8 artifact",
        ) from err
    # Keep what stays float (the first layers, biases) in fp32: the int8 weights are the saving.
    name = "int8-full" if full_range else "int8"
    xml = _save(quantized, out_dir / f"{_stem(fp32_onnx)}-{name}.xml", compress_to_fp16=False)
    notes = {
        "quantizer": f"nncf {nncf.__version__} post-training quantization, openvino {_version()}",
        "calibration_images": len(calibration),
        "preset": "mixed (asymmetric activations)" if mixed else "performance",
        "bias_correction": "fast",
        "overflow_fix": "disable (full 8-bit weights, for CPUs with int8-dot: VNNI, AMX, Arm)"
        if full_range
        else "enable (7-bit weight range: no int16 saturation on x86 CPUs without VNNI)",
        "float_layers": keep,
        **({"float_heads": float_heads, "float_heads_recipe": heads.RECIPE} if float_heads else {}),
    }
    return _artifact(xml, "int8", notes, variant="full" if full_range else "")


class _Images:
    """The calibration batch one image at a time, each pass from the start, telling ``on_image``."""

    def __init__(self, batch: np.ndarray, on_image: Callable[[int, int], object] | None) -> None:
        self.batch, self.on_image = batch, on_image

    def __iter__(self) -> Iterator[np.ndarray]:
        n = len(self.batch)
        for i in range(n):
            if self.on_image is not None:  # before: NNCF stops taking after its last image
                self.on_image(i + 1, n)
            yield self.batch[i : i + 1]

    def __len__(self) -> int:
        return len(self.batch)


def _float_heads(model: Any, *, with_branches: bool) -> list[str]:
    """Friendly names of the ops computing the model's dense outputs' heads (``heads.walk``) and,
    ``with_branches``, their own branches (``heads.branches``), in graph order."""
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}

    def source(op: Any, i: int) -> Any:
        return op.input(i).get_source_output().get_node()

    def constant(node: Any) -> bool:
        # A weight may be stored compressed (fp16) and widened by a Convert.
        while node.get_type_name() == "Convert":
            node = node.input(0).get_source_output().get_node()
        return bool(node.get_type_name() == "Constant")

    def inputs_of(name: str) -> list[str]:
        op = ops[name]
        # A Reshape's shape, a Slice's bounds: only the first input of other ops is data.
        data = range(op.get_input_size()) if op.get_type_name() in _ALL_DATA_OPS else range(1)
        return [source(op, i).get_friendly_name() for i in data if not constant(source(op, i))]

    def kind(name: str) -> str:
        op = ops[name]
        what = op.get_type_name()
        if what in _WEIGHTED_OPS and op.get_input_size() > 1 and constant(source(op, 1)):
            return "head"
        if what in ("Softmax", "SoftMax"):  # opset 8's name, then opset 1's
            return "softmax"
        return "" if what in _NOT_PASS_OPS or op.get_input_size() == 0 else "pass"

    def consumers_of(name: str) -> list[str]:
        # A Result (a graph output) is never in a branch: what it reads is read outside.
        return [
            target.get_node().get_friendly_name()
            for out in ops[name].outputs()
            for target in out.get_target_inputs()
        ]

    dense = [
        r.input_value(0).get_node().get_friendly_name()
        for r in model.get_results()
        if r.get_output_partial_shape(0).rank.get_length() >= heads.MIN_RANK
    ]
    found = heads.walk(dense, inputs_of, kind)
    kept = set(found)
    if with_branches:
        kept |= set(heads.branches(found, inputs_of, consumers_of, kind))
    return [name for name in ops if name in kept]


@contextlib.contextmanager
def _quiet_nncf() -> Iterator[None]:
    """NNCF logs every ignored node at INFO (several lines each); the build reports its own steps."""
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _read(fp32_onnx: Path, calibration: np.ndarray | None = None) -> Any:
    """The ONNX file as an OpenVINO model; a bad file (or calibration batch) is a BuildError naming it."""
    import openvino as ov

    onnx_model = check_onnx(fp32_onnx)
    if calibration is not None:
        check_calibration(fp32_onnx, onnx_model, calibration)
    try:
        return ov.convert_model(str(fp32_onnx))
    except Exception as err:  # OpenVINO's boundary: any failure is a build failure
        raise BuildError(
            f"OpenVINO cannot convert {fp32_onnx}: {first_line(err)}",
            "the model uses an operator OpenVINO's ONNX frontend does not support; "
            "build without the openvino artifacts for this model",
        ) from err


def _save(model: Any, xml: Path, *, compress_to_fp16: bool) -> Path:
    """Write ``xml`` and its ``.bin`` under temporary names, then rename the ``.bin`` and the ``.xml``."""
    import openvino as ov

    xml.parent.mkdir(parents=True, exist_ok=True)
    tmp_xml = xml.with_name(f".{xml.stem}.tmp.xml")
    tmp_bin = tmp_xml.with_suffix(".bin")
    try:
        ov.save_model(model, str(tmp_xml), compress_to_fp16=compress_to_fp16)
        os.replace(tmp_bin, xml.with_suffix(".bin"))
        os.replace(tmp_xml, xml)
    except OSError as err:
        raise BuildError(f"cannot write {xml}: {err.strerror}", "check the output directory") from err
    except Exception as err:  # OpenVINO's boundary: any failure is a build failure
        raise BuildError(f"OpenVINO could not save {xml}: {first_line(err)}", "") from err
    finally:
        tmp_xml.unlink(missing_ok=True)
        tmp_bin.unlink(missing_ok=True)
    return xml


def _artifact(xml: Path, precision: str, notes: dict[str, Any], variant: str = "") -> Artifact:
    return Artifact(
        path=xml,
        backend="openvino",
        precision=precision,
        files=(xml, xml.with_suffix(".bin")),
        kind="openvino-ir",
        notes=notes,
        variant=variant,
    )


def _stem(fp32_onnx: Path) -> str:
    """``model-fp32.onnx`` -> ``model``, so the IR files are ``model-fp32.xml``, not ``model-fp32-fp32.xml``."""
    return fp32_onnx.stem.removesuffix("-fp32")


def _version() -> str:
    import openvino as ov

    return str(ov.get_version()).split("-")[0]
