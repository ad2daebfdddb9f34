"""Get a clean fp32 ONNX graph: export from PyTorch, validate a user's file, fold constants.

Everything downstream (quantizers, OpenVINO, TVM, TensorRT) starts from this one graph.
Folding matters: the PyTorch export computes padding at run time ("Dynamic pads are not
supported yet" in TVM's importer); ONNX Runtime's basic optimizations fold it into a
static Conv/Clip/Add graph with fixed shapes.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgekit._core.io import atomic_path
from edgekit.errors import BuildError, first_line
from edgekit.runtime.preprocessing import PreprocessSpec

OPSET = 17


def export_pytorch(
    module: Any,
    spec: PreprocessSpec,
    out: Path,
    input_name: str = "input",
    output_name: str | Sequence[str] = "logits",
) -> Path:
    """Trace ``module`` at the spec's static input shape to ONNX (opset 17).

    A module that returns a tuple (a detector's boxes and scores) gets one named graph output
    per element, in the tuple's order: ``output_name`` is then a sequence of that many names.
    """
    import torch

    names = [output_name] if isinstance(output_name, str) else list(output_name)

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow in the model
        torch.onnx.export(
            module,
            (torch.zeros(spec.input_shape),),
            str(tmp),
            opset_version=OPSET,
            dynamo=False,
            input_names=[input_name],
            output_names=names,
        )
    return out


def output_names(path: Path) -> tuple[str, ...]:
    """The graph outputs of an ONNX file, in order."""
    import onnx

    return tuple(o.name for o in onnx.load(str(path), load_external_data=False).graph.output)


def check_onnx(path: Path) -> Any:
    """Load and check a user's ONNX file; a corrupt or invalid file is a BuildError naming it."""
    import onnx

    if not path.is_file():
        raise BuildError(f"ONNX file {path} does not exist", "check the path given to --onnx")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as err:
        raise BuildError(
            f"{path} is not a valid ONNX model: {first_line(err)}",
            "re-export the model (torch.onnx.export, opset >= 13) or check the file was copied whole",
        ) from err
    return model


def fold(raw: Path, out: Path, input_shape: Iterable[int] | None = None) -> Path:
    """Fix the input shape (when given) and fold constants with ONNX Runtime's basic optimizations."""
    import onnx
    import onnxruntime as ort

    model = check_onnx(raw)
    if input_shape is not None:
        graph_inputs = [
            i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
        ]
        dims = graph_inputs[0].type.tensor_type.shape.dim
        shape = list(input_shape)
        if len(dims) != len(shape):
            raise BuildError(
                f"{raw}: input {graph_inputs[0].name} has rank {len(dims)}, the preprocessing gives {shape}",
                "fix --input-size/--layout to match the model",
            )
        for d, n in zip(dims, shape, strict=True):
            if d.HasField("dim_value") and d.dim_value not in (0, n):
                raise BuildError(
                    f"{raw}: input {graph_inputs[0].name} is {[x.dim_value for x in dims]}, the preprocessing gives {shape}",
                    "fix --input-size/--layout to match the model",
                )
            d.ClearField("dim_param")
            d.dim_value = n
    out.parent.mkdir(parents=True, exist_ok=True)
    fixed = out.with_name(f".{out.name}.fixed.onnx")
    onnx.save(model, str(fixed))
    with atomic_path(out, suffix=".onnx") as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(tmp)
        so.log_severity_level = 3
        try:
            ort.InferenceSession(str(fixed), so, providers=["CPUExecutionProvider"])
        except Exception as err:
            raise BuildError(
                f"ONNX Runtime cannot load {raw}: {first_line(err)}",
                "the model uses an operator or type ONNX Runtime does not support",
            ) from err
        finally:
            fixed.unlink(missing_ok=True)
    return out
