"""LiteRT ``.tflite`` artifacts: fp32, int8, and the full-integer model for the Coral Edge TPU.

Two tools, each doing what it is good at:

- **fp32**: ``litert-torch`` converts the PyTorch module straight to a ``.tflite`` (no
  TensorFlow).  The module is wrapped so the converted graph takes NHWC input, the layout
  LiteRT kernels and the Edge TPU use; the converter then folds the layout change into the
  convolutions (the EfficientNet-Lite0 graph has no TRANSPOSE op left).
- **int8** and **edgetpu**: LiteRT's own post-training calibrator (shipped in
  ``ai-edge-litert``, the tool behind TensorFlow's "full integer quantization") calibrates
  the fp32 ``.tflite`` once on the calibration images (activation min/max, per-channel
  symmetric weights) and writes two models from it: ``int8`` keeps float32 input and output
  (a QUANTIZE and a DEQUANTIZE op at the edges) so a device feeds it the same floats as the
  fp32 model; the Edge TPU source model has int8 input and output and every op in int8, which
  is what ``edgetpu_compiler`` needs.  In the ``int8`` model a detector's output heads are put
  back in float after quantization (``tflite_heads``: the calibrator has no deny list), so its
  scores are not on one 8-bit output grid; a classifier's model is left as calibrated.  litert-torch's PT2E quantizer was tried first: it left
  float ADDs, TRANSPOSE and PAD ops in the graph and agreed with fp32 on far fewer images.

``edgetpu_compiler`` exists only for x86_64 Debian/Ubuntu.  When it is on PATH the source
model is compiled (``<stem>-int8_edgetpu.tflite``) and its log parsed for how many operators
map to the TPU; otherwise the full-integer model is returned with a note saying what to run
where.  A ``*_edgetpu.tflite`` is never produced without the compiler.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.convert import heads, tflite_heads
from edgekit.convert.artifact import Artifact
from edgekit.core.io import write_atomic
from edgekit.core.packages import installed_versions
from edgekit.errors import BuildError, EdgekitError
from edgekit.processing.preprocessing import PreprocessSpec

if TYPE_CHECKING:
    import numpy as np

PRECISIONS = ("fp32", "int8", "edgetpu")
LAYOUT = "NHWC"
TARGET = "LiteRT (.tflite)"
# Not an extra of edgekit: litert-torch 0.10.0 pulls xdsl==0.28.0 (through ai-edge-litert[model-utils]
# and litert-converter), which pins typing-extensions<4.13, and TVM's apache-tvm-ffi 0.1.14 needs
# >=4.13, so no resolver can install it beside edgekit[tvm] (edgekit[all]).
CONVERTER_HINT = (
    'pip install "litert-torch==0.10.0", then pip install "typing-extensions>=4.14" "pydantic>=2.12" '
    "(a second step, not in edgekit[all]: its xdsl pins typing-extensions<4.13, TVM needs >=4.13; "
    "edgekit's LiteRT paths work with the newer one)"
)
COMPILER_TIMEOUT_S = 600
EDGETPU_NOT_COMPILED = (
    "not compiled for the Edge TPU: edgetpu_compiler is not on PATH here. {src} is the "
    "full-integer source model (int8 input and output, every op int8); it runs on a CPU as is. "
    "The compiler exists only for x86_64 Debian/Ubuntu (Coral's apt repository "
    "https://packages.cloud.google.com/apt, suite coral-edgetpu-stable, package edgetpu-compiler). "
    "On such a host run: edgetpu_compiler -s {src}  (or: edgetpu_compiler -s -o OUT_DIR {src}). "
    "It writes {compiled} and a .log saying how many operators map to the TPU; ship {compiled} "
    'and load it with delegate = "edgetpu" (libedgetpu1-std and a Coral device on the target). '
    "Or rebuild there: edgekit build compiles it when edgetpu_compiler is on PATH."
)


def convert_tflite(
    module: Any,
    spec: PreprocessSpec,
    out_dir: Path,
    calibration: np.ndarray,
    precisions: Sequence[str] = PRECISIONS,
    *,
    stem: str = "model",
) -> list[Artifact]:
    """Convert a PyTorch image model to ``.tflite`` artifacts, one per precision asked for.

    A module that returns a tuple (a detector's boxes and scores) gives one output per element,
    in the tuple's order, in every model written (litert-torch and the calibrator keep it; the
    int8 model's outputs stay float32).  LiteRT names them ``serving_default_output_<i>_output``,
    not the ONNX names: the build's gate pairs them with the fp32 ONNX's by position and checks
    their shapes (``accuracy_detection.align_outputs``).

    ``calibration`` is a float32 batch already preprocessed by ``spec`` (NCHW or NHWC; it is
    transposed to NHWC here); it is needed for ``int8`` and ``edgetpu`` only.  Every model
    written is loaded with LiteRT and run once before it is returned.  Files are
    ``<stem>-fp32.tflite``, ``<stem>-int8.tflite``, ``<stem>-int8_edgetpu_src.tflite`` and, when
    ``edgetpu_compiler`` is on PATH, ``<stem>-int8_edgetpu.tflite``.  The fp32 model is always
    converted (the quantized models derive from it) but kept only when asked for.  On failure
    nothing this call wrote is left in ``out_dir``.
    """
    wanted = list(dict.fromkeys(precisions))
    unknown = [p for p in wanted if p not in PRECISIONS]
    if unknown or not wanted:
        raise BuildError(
            f"LiteRT: unknown precision(s) {', '.join(unknown) or '(none given)'}",
            f"use one or more of {', '.join(PRECISIONS)}",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    calib = nhwc_batch(calibration, spec) if set(wanted) & {"int8", "edgetpu"} else None
    before = set(out_dir.iterdir())
    try:
        return _convert(module, spec, out_dir, calib, wanted, stem)
    except BaseException:
        # A failed build leaves none of its models behind, so nothing looks like a finished artifact.
        for path in set(out_dir.iterdir()) - before:
            if path.is_file():
                path.unlink(missing_ok=True)
        raise


def _convert(
    module: Any, spec: PreprocessSpec, out_dir: Path, calib: np.ndarray | None, wanted: list[str], stem: str
) -> list[Artifact]:
    converter = {"converter": _versions("litert-torch")}
    with tempfile.TemporaryDirectory(prefix=".litert-", dir=out_dir) as work:
        # The quantized models derive from the fp32 one: it lives in scratch unless it was asked for.
        fp32_dir = out_dir if "fp32" in wanted else Path(work)
        fp32 = convert_fp32(module, spec, fp32_dir / f"{stem}-fp32.tflite")
        made = [_artifact(fp32, "fp32", "tflite", converter)] if "fp32" in wanted else []
        if calib is None:
            return made
        quantized = quantize_tflite(
            fp32,
            calib,
            {
                **({out_dir / f"{stem}-int8.tflite": "float32"} if "int8" in wanted else {}),
                **({out_dir / f"{stem}-int8_edgetpu_src.tflite": "int8"} if "edgetpu" in wanted else {}),
            },
        )
    notes = {**converter, "quantizer": QUANTIZER, "calibration_images": len(calib)}
    for path, (io, float_heads) in quantized.items():
        if io == "float32":
            io_note: dict[str, Any] = {"io": "float32 (quantized inside the model)"}
            if float_heads:
                io_note |= {"float_heads": float_heads, "float_heads_recipe": heads.RECIPE}
            made.append(_artifact(path, "int8", "tflite", {**notes, **io_note}))
        else:
            made.append(edgetpu_artifact(path, stem, notes))
    return made


def nhwc_batch(calibration: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """The calibration batch as contiguous float32 NHWC at the spec's size; a clear error if it is not one."""
    import numpy as np

    x = np.asarray(calibration)
    h, w = spec.size
    if x.ndim == 4 and x.shape[1:] == (3, h, w):
        x = x.transpose(0, 2, 3, 1)
    if x.ndim != 4 or x.shape[1:] != (h, w, 3) or len(x) == 0:
        raise BuildError(
            f"LiteRT: calibration batch has shape {tuple(x.shape)}, expected (N, 3, {h}, {w}) or (N, {h}, {w}, 3)",
            "pass at least one preprocessed image (ImageSet.batch(spec))",
        )
    return np.ascontiguousarray(x, dtype=np.float32)


def convert_fp32(module: Any, spec: PreprocessSpec, out: Path) -> Path:
    """Convert ``module`` with litert-torch to an fp32 ``.tflite`` taking ``[1, H, W, 3]`` float32."""
    try:
        import litert_torch
        import torch
    except ImportError as err:
        raise BuildError(
            f"{TARGET}: the PyTorch to LiteRT converter is not installed ({err})", CONVERTER_HINT
        ) from err

    class _NHWCInput(torch.nn.Module):
        """Takes NHWC and hands the wrapped NCHW module what it expects."""

        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> Any:
            return self.inner(x.permute(0, 3, 1, 2))

    # The converter names tensors after the module path: keep "convert_fp32.<locals>" out of them.
    _NHWCInput.__module__, _NHWCInput.__qualname__ = "edgekit", "NHWCInput"
    h, w = spec.size
    wrapped = _NHWCInput(module) if spec.layout == "NCHW" else module
    wrapped.eval()
    try:
        with _quiet_converter(), torch.no_grad():
            content = litert_torch.convert(wrapped, (torch.zeros(1, h, w, 3),)).model_content()
    except Exception as err:  # the converter's boundary: any failure becomes one BuildError
        raise conversion_error(err) from err
    write_atomic(out, content, mode=0o644)  # a model is shipped and read by others
    _check_runs(out)
    return out


def conversion_error(err: BaseException) -> BuildError:
    """Turn a litert-torch failure into a BuildError naming the operator and the target when it can."""
    text = str(err)
    op = unsupported_op(text)
    # The converter quotes the model code the failing node came from; skip the NHWC wrapper here.
    frames = [f for f in re.findall(r'File "([^"]+)", line (\d+), in (\w+)', text) if f[0] != __file__]
    at = f" (model code: {Path(frames[-1][0]).name}:{frames[-1][1]} in {frames[-1][2]})" if frames else ""
    if op:
        return BuildError(
            f"{TARGET}: operator {op} is not supported by the litert-torch converter{at}",
            "leave LiteRT out (--backends), or replace the operator in the model with ones LiteRT has "
            "(see https://ai.google.dev/edge/litert/models/ops_compatibility)",
        )
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    return BuildError(
        f"{TARGET}: litert-torch could not convert the model: {type(err).__name__}: {first[:300]}{at}",
        "check that the model exports with torch.export.export(model, (x,)) at a static input shape",
    )


_OP_PATTERNS = (
    re.compile(r"Lowering not found: (\S+)"),  # litert-torch has no lowering for an aten op
    re.compile(r"failed to legalize operation '([^']+)'"),  # MLIR: no LiteRT op for it
    re.compile(r"call_function\[target=torch\.ops\.([\w.]+)\]"),  # the FX node it was on
    re.compile(r"'([a-z_]+\.[\w.]+)' op .*not supported"),
    re.compile(r"Quantization not yet supported for op: '?([A-Z0-9_]+)"),  # LiteRT's calibrator
)


def unsupported_op(message: str) -> str | None:
    """The operator a converter message complains about (``aten.bucketize.Tensor``), if it names one."""
    for pattern in _OP_PATTERNS:
        found = pattern.search(message)
        if found:
            return found[1]
    return None


QUANTIZER = "LiteRT post-training calibrator: activations int8 per-tensor (min/max), weights int8 per-channel"
_IO_TYPES = ("float32", "int8", "uint8")


def quantize_tflite(
    fp32: Path, calibration_nhwc: np.ndarray, outputs: Mapping[Path, str]
) -> dict[Path, tuple[str, list[str]]]:
    """Calibrate the fp32 ``.tflite`` once, then write one int8 model per ``{path: io_dtype}``.

    ``io_dtype`` is the model's input and output type: ``float32`` (quantize/dequantize inside
    the model), ``int8`` or ``uint8`` (the caller quantizes with the input tensor's scale and
    zero point).  Every op is int8 in the int8/uint8 models (the Edge TPU's).  In the float32
    one a detector's output heads compute in float (``tflite_heads``): the result maps each
    path to its io type and the names of those heads' outputs (none for a classifier).  Each
    model is checked to load and run.
    """
    import numpy as np

    bad = {str(p): io for p, io in outputs.items() if io not in _IO_TYPES}
    if bad:
        raise BuildError(f"LiteRT: unknown input/output type(s) {bad}", f"use one of {', '.join(_IO_TYPES)}")
    try:
        from ai_edge_litert import _pywrap_tensorflow_lite_calibration_wrapper as calibration_wrapper
    except ImportError as err:
        raise BuildError(
            f"{TARGET}: LiteRT's calibrator is not importable ({err})",
            'pip install "ai-edge-litert>=2.3" (tflite-runtime alone cannot quantize)',
        ) from err
    where = f"{TARGET} int8 quantization of {fp32.name}"
    try:
        # The wrapper reads the model from this buffer without owning it: keep a reference alive.
        model_content = fp32.read_bytes()
        calibrator = calibration_wrapper.CalibrationWrapper(model_content, [], [])
        calibrator.Prepare([[1, *calibration_nhwc.shape[1:]]])
        for image in calibration_nhwc:
            calibrator.FeedTensor([image[None]])
        models = {
            path: calibrator.QuantizeModel(
                np.dtype(io).num,  # input type
                np.dtype(io).num,  # output type
                False,  # allow_float: no op may stay in float
                np.dtype(np.int8).num,  # activations
                np.dtype(np.int32).num,  # biases
                False,  # disable_per_channel
                False,  # disable_per_channel_quantization_for_dense_layers
            )
            for path, io in outputs.items()
        }
    except (ValueError, RuntimeError) as err:  # what the calibrator raises for a model it cannot take
        op = unsupported_op(str(err))
        targets = "LiteRT int8" + (" / Edge TPU" if "int8" in outputs.values() else "")
        raise BuildError(
            f"{where} failed"
            + (
                f": operator {op} has no int8 kernel (target {targets})"
                if op
                else f": {str(err).strip()[:300]}"
            ),
            "every operator needs an int8 kernel in LiteRT; build fp32 only (--precisions fp32) or change the model",
        ) from err
    made: dict[Path, tuple[str, list[str]]] = {}
    for path, content in models.items():
        float_heads: list[str] = []
        if outputs[path] == "float32":
            content, float_heads = tflite_heads.float_heads(bytes(content), model_content)
        write_atomic(path, bytes(content), mode=0o644)
        _check_runs(path)
        made[path] = (outputs[path], float_heads)
    return made


def edgetpu_artifact(src: Path, stem: str, notes: Mapping[str, Any]) -> Artifact:
    """The Edge TPU artifact for a full-integer source model: compiled if the compiler is here, else the source with a note."""
    float_ops = non_integer_ops(src)
    if float_ops:
        raise BuildError(
            f"{TARGET}: {src.name} is not full-integer: {', '.join(float_ops)} still run in float (target Edge TPU)",
            "the Edge TPU needs every op in int8; replace those operators in the model",
        )
    base = {**notes, "io": "int8"}
    compiler = shutil.which("edgetpu_compiler")
    if compiler is None:
        compiled_name = f"{stem}-int8_edgetpu.tflite"
        message = EDGETPU_NOT_COMPILED.format(src=src.name, compiled=compiled_name)
        return _artifact(src, "int8", "tflite-edgetpu-src", {**base, "edgetpu": message})
    compiled, summary = compile_edgetpu(src, src.with_name(f"{stem}-int8_edgetpu.tflite"), compiler)
    return Artifact(
        path=compiled,
        backend="litert",
        precision="int8",
        files=(compiled, src),  # the source travels too: it is the CPU fallback and what the build evaluates
        options={"delegate": "edgetpu"},
        notes={**base, "layout": LAYOUT, "source_model": src.name, "edgetpu": summary},
        kind="tflite-edgetpu",
    )


def compile_edgetpu(src: Path, out: Path, compiler: str = "edgetpu_compiler") -> tuple[Path, dict[str, Any]]:
    """Run ``edgetpu_compiler -s`` on ``src``, place the result at ``out``; return it and the parsed log."""
    with tempfile.TemporaryDirectory(prefix=".edgetpu-", dir=out.parent) as tmp:
        # The compiler names its output <input>_edgetpu.tflite: give it the input name that yields ``out``.
        name = out.name.removesuffix("_edgetpu.tflite") + ".tflite"
        staged = Path(tmp) / name
        shutil.copyfile(src, staged)
        try:
            run = subprocess.run(
                [compiler, "-s", "-o", tmp, str(staged)],
                capture_output=True,
                text=True,
                timeout=COMPILER_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise BuildError(f"edgetpu_compiler could not compile {src.name}: {err}", _COMPILER_HINT) from err
        produced = Path(tmp) / out.name
        log = run.stdout + run.stderr
        if run.returncode != 0 or not produced.is_file():
            tail = " | ".join(line for line in log.strip().splitlines()[-5:])
            raise BuildError(
                f"edgetpu_compiler failed on {src.name} (exit {run.returncode}): {tail[:500]}", _COMPILER_HINT
            )
        summary = parse_compiler_log(log)
        if summary.get("edgetpu_ops") == 0:
            raise BuildError(
                f"edgetpu_compiler mapped no operator of {src.name} to the Edge TPU (target Edge TPU): "
                + ", ".join(f"{op} ({why})" for op, why in summary.get("not_mapped", {}).items()),
                "every op must be int8 and one of the Edge TPU's operators (g.co/coral/model-reqs)",
            )
        os.replace(produced, out)
    return out, summary


_COMPILER_HINT = "run edgetpu_compiler -s by hand to see its full log; see g.co/coral/model-reqs"
_OPERATOR_ROW = re.compile(r"^([A-Z][A-Z0-9_]+)\s+(\d+)\s+(\S.*?)\s*$")


def parse_compiler_log(log: str) -> dict[str, Any]:
    """Read ``edgetpu_compiler -s`` output: version, operators mapped to the TPU and left on the CPU.

    When everything maps, the compiler prints only the total and the operator table; the
    "will run on Edge TPU/CPU" lines appear only when some operators stay on the CPU.
    """
    summary: dict[str, Any] = {}
    version = re.search(r"Edge TPU Compiler version (\S+)", log)
    if version:
        summary["compiler"] = version[1]
    numbers = {
        "total_ops": r"Total number of operations: (\d+)",
        "edgetpu_subgraphs": r"Number of Edge TPU subgraphs: (\d+)",
        "edgetpu_ops": r"Number of operations that will run on Edge TPU: (\d+)",
        "cpu_ops": r"Number of operations that will run on CPU: (\d+)",
    }
    for key, pattern in numbers.items():
        found = re.search(pattern, log)
        if found:
            summary[key] = int(found[1])
    mapped, on_cpu = 0, 0
    not_mapped: dict[str, str] = {}
    for line in log.splitlines():
        row = _OPERATOR_ROW.match(line.strip())
        if not row or row[1] == "Operator":
            continue
        count, status = int(row[2]), row[3]
        if status == "Mapped to Edge TPU":
            mapped += count
        else:
            on_cpu += count
            not_mapped[row[1]] = status
    summary.setdefault("edgetpu_ops", mapped)
    summary.setdefault("cpu_ops", on_cpu)
    if not_mapped:
        summary["not_mapped"] = not_mapped
    return summary


def tflite_ops(path: Path) -> dict[str, int]:
    """How many of each operator the model's main graph has (``{"CONV_2D": 33, ...}``)."""
    counts: Counter[str] = Counter(name for name, _ in _ops(path))
    return dict(counts)


def non_integer_ops(path: Path) -> list[str]:
    """Operators that read or write a float tensor (a full-integer model has none), sorted."""
    return sorted({name for name, floating in _ops(path) if floating})


def _ops(path: Path) -> Iterator[tuple[str, bool]]:
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    floats = {schema.TensorType.FLOAT32, schema.TensorType.FLOAT16, schema.TensorType.FLOAT64}
    model = schema.Model.GetRootAsModel(path.read_bytes(), 0)
    graph = model.Subgraphs(0)
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        name = names.get(builtin) or (code.CustomCode() or b"CUSTOM").decode()
        tensors = [*op.InputsAsNumpy().tolist(), *op.OutputsAsNumpy().tolist()]
        yield name, any(t >= 0 and graph.Tensors(t).Type() in floats for t in tensors)


def _artifact(path: Path, precision: str, kind: str, notes: Mapping[str, Any]) -> Artifact:
    return Artifact(
        path=path,
        backend="litert",
        precision=precision,
        files=(path,),
        notes={**notes, "layout": LAYOUT, "ops": tflite_ops(path)},
        kind=kind,
    )


def _check_runs(path: Path) -> None:
    """Load the model with LiteRT and run a zero image: a file that does not run is not an artifact."""
    import numpy as np

    from edgekit.backends import open_session
    from edgekit.processing.tensors import to_input

    try:
        with open_session(path, "litert", num_threads=1) as session:
            spec = session.inputs[0]
            shape = tuple(d or 1 for d in spec.shape)
            session.run(to_input(np.zeros(shape, np.float32), spec))
    except EdgekitError as err:
        path.unlink(missing_ok=True)
        raise BuildError(
            f"{TARGET}: {path.name} was written but does not run in LiteRT: {err.message}",
            "this is a converter problem: report it with the model",
        ) from err


@contextlib.contextmanager
def _quiet_converter() -> Iterator[None]:
    """Silence litert-torch's own progress printing (edgekit shows its own), unless the user asked for it."""
    key = "LITERT_TORCH_SHOW_PROGRESS"
    before = os.environ.get(key)
    os.environ.setdefault(key, "n")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


def _versions(*packages: str) -> str:
    return ", ".join(f"{p} {v}" for p, v in installed_versions(packages).items())
