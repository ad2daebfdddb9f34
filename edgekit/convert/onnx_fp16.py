"""An fp16 ONNX graph widened to fp32: the build's reference must be float32.

A model exported with ``half=True`` takes and computes float16.  Every artifact is checked
against the fp32 reference, so the graph is rewritten to float32 when it is loaded: its
float16 initializers, constants, inputs, outputs and value types become float32, and a
``Cast`` to float16 casts to float32 instead.  Widening loses nothing (every float16 is a
float32); what the artifacts then do with precision is the recipes' business.
"""

from __future__ import annotations

from typing import Any

FLOAT, FLOAT16 = 1, 10


def _widen_tensor(t: Any) -> bool:
    """A float16 TensorProto rewritten as float32, in place; True if it was float16."""
    from onnx import numpy_helper

    if t.data_type != FLOAT16:
        return False
    wide = numpy_helper.from_array(numpy_helper.to_array(t).astype("float32"), t.name)
    t.CopyFrom(wide)
    return True


def _widen_type(value_info: Any) -> bool:
    tt = value_info.type.tensor_type
    if tt.elem_type == FLOAT16:
        tt.elem_type = FLOAT
        return True
    return False


def _widen_graph(graph: Any) -> int:
    changed = sum(_widen_tensor(t) for t in graph.initializer)
    for vi in (*graph.input, *graph.output, *graph.value_info):
        changed += _widen_type(vi)
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == FLOAT16:
                attr.i = FLOAT
                changed += 1
            elif attr.HasField("t"):
                changed += _widen_tensor(attr.t)
            elif attr.HasField("g"):
                changed += _widen_graph(attr.g)
            for g in attr.graphs:
                changed += _widen_graph(g)
    return changed


def is_fp16(model: Any) -> bool:
    """Whether the model's first (non-initializer) input is float16."""
    init = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    return bool(inputs) and inputs[0].type.tensor_type.elem_type == FLOAT16


def widen(model: Any) -> int:
    """Rewrite ``model`` (a ModelProto) from float16 to float32 in place; returns how many things changed."""
    return _widen_graph(model.graph)
