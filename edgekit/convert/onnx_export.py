"""Get a clean fp32 ONNX graph: export from PyTorch, validate a user's file, fold constants.

Everything downstream (quantizers, OpenVINO, TVM, TensorRT) starts from this one graph.
Folding matters: the PyTorch export computes padding at run time ("Dynamic pads are not
supported yet" in TVM's importer); ONNX Runtime's basic optimizations fold it into a
static Conv/Clip/Add graph with fixed shapes.

Then the batch is freed (``free_batch``): the folded graph's input and outputs get a named
first dimension (``batch``) and each ``Reshape`` that kept the batch of one as a constant
``1`` copies it instead (``0``), so ONNX Runtime and OpenVINO can run several cameras'
frames as one batch.  The graph is otherwise the static one: a session pins the batch to 1
when it loads, and computes exactly what the static graph computes.  The change is proven
on the spot (two different inputs as one batch of two against each alone); a graph that
bakes its batch in anywhere else fails the proof and stays static.  TVM and TensorRT take
the batch pinned back to 1 (``pin_batch``): their compiled code is for one shape.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgekit.core.io import atomic_path
from edgekit.errors import BuildError, first_line
from edgekit.processing.preprocessing import PreprocessSpec

OPSET = 17
#: The name of the free first dimension of a batch-capable graph.
BATCH_DIM = "batch"
# How far one frame's outputs may move when it is run in a batch (kernels may sum in another order).
_BATCH_RTOL, _BATCH_ATOL = 1e-4, 1e-5


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
    """Fix the input shape (when given), widen a float16 graph to float32, and fold constants with ONNX
    Runtime's basic optimizations."""
    import onnx
    import onnxruntime as ort

    model = check_onnx(raw)
    from edgekit.convert import onnx_fp16

    if onnx_fp16.is_fp16(model):  # the reference every artifact is checked against is float32
        onnx_fp16.widen(model)
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
        if input_shape is not None and list(input_shape)[:1] == [1]:
            free_batch(tmp)
    return out


def _graph_inputs(model: Any) -> list[Any]:
    init = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in init]


def free_batch(path: Path) -> bool:
    """Rewrite the static batch-of-one graph at ``path`` with a free ``batch`` first dimension,
    in place, when a batch of two provably computes what each frame alone does; True if it did."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inputs = _graph_inputs(model)
    tensors = [*inputs, *model.graph.output]
    if not inputs or any(
        not t.type.tensor_type.shape.dim or t.type.tensor_type.shape.dim[0].dim_value != 1 for t in tensors
    ):
        return False
    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in constants:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            return False  # a 0 would mean an empty dimension, not "copy it"
        shape_t = constants[node.input[1]]
        shape = numpy_helper.to_array(shape_t)
        if shape.ndim == 1 and shape.size and shape[0] == 1:
            shape = shape.copy()
            shape[0] = 0  # copy the first dimension: the batch, whatever it is
            shape_t.CopyFrom(numpy_helper.from_array(shape, shape_t.name))
    for t in tensors:
        dim = t.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = BATCH_DIM
    del model.graph.value_info[:]  # inferred shapes of the batch of one: stale now
    candidate = path.with_name(f".{path.name}.batch.onnx")
    onnx.save(model, str(candidate))
    try:
        if not _batch_agrees(candidate, inputs, np):
            return False
        candidate.replace(path)
        return True
    finally:
        candidate.unlink(missing_ok=True)


def _batch_agrees(path: Path, inputs: list[Any], np: Any) -> bool:
    import onnx
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(2):
        feed = {}
        for i in inputs:
            t = i.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            shape = [1, *(d.dim_value for d in t.shape.dim[1:])]
            feed[i.name] = (rng.standard_normal(shape) * 2).astype(dtype)
        feeds.append(feed)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        alone = [sess.run(None, f) for f in feeds]
        both = sess.run(None, {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]})
    except Exception:  # noqa: BLE001 - whatever fails, a batch of two does not run: the graph stays static
        return False
    return all(
        b.shape[0] == 2
        and all(np.allclose(b[j : j + 1], alone[j][n], rtol=_BATCH_RTOL, atol=_BATCH_ATOL) for j in range(2))
        for n, b in enumerate(both)
    )


def pin_batch(model: Any, n: int = 1) -> Any:
    """``model`` (an ``onnx.ModelProto``) with its free ``batch`` dimension fixed to ``n``, in place."""
    for t in [*_graph_inputs(model), *model.graph.output]:
        dims = t.type.tensor_type.shape.dim
        if dims and dims[0].dim_param == BATCH_DIM:
            dims[0].ClearField("dim_param")
            dims[0].dim_value = n
    return model
