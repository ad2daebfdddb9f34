"""A quantized ``.tflite`` detector's output heads put back in float (``edgekit.convert.heads`` says why).

LiteRT's post-training calibrator (the only one edgekit uses without TensorFlow) cannot leave
chosen ops in float: its Python wrapper quantizes every op, or a single one, and has no deny
list.  So the int8 model is edited after quantization, with LiteRT's own flatbuffer schema:

- the head layers (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED found by walking back from each
  dense output through shape-only ops) get the fp32 model's weights and bias (same tensor
  names: the calibrator keeps them) and float32 outputs;
- their int8 input is dequantized by a DEQUANTIZE op (one per feature map);
- the shape-only ops after them compute in float32; the requantizing QUANTIZE and the output's
  DEQUANTIZE between them go, the output tensor (its index and name, so the signature) kept.

The features stay int8; what the model outputs is computed in fp32 from them.  Only the
float-input model is edited: the Edge TPU's must stay full-integer.
"""

from __future__ import annotations

from typing import Any

from edgekit.convert import heads

SHAPE_OPS = ("RESHAPE", "TRANSPOSE", "CONCATENATION", "SQUEEZE", "EXPAND_DIMS", "QUANTIZE", "DEQUANTIZE")
HEAD_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def float_heads(int8_model: bytes, fp32_model: bytes) -> tuple[bytes, list[str]]:
    """``int8_model`` with its dense outputs' heads computed in float, and the head tensors' names.

    ``fp32_model`` is the model it was quantized from (the heads' float weights).  A model with
    no such head, or whose head does not have the shape expected here, comes back unchanged
    with no names.
    """
    import flatbuffers  # type: ignore[import-untyped]
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(int8_model, 0)
    reference = schema.ModelT.InitFromPackedBuf(fp32_model, 0)
    graph = model.subgraphs[0]
    found = _Heads(model, schema)
    if not found.heads:
        return int8_model, []
    ref_graph = reference.subgraphs[0]
    by_name = {t.name: t for t in ref_graph.tensors}
    floats = schema.TensorType.FLOAT32
    # Every tensor the edit turns float must be a plain one; a weight must exist in fp32 alike.
    for op in found.heads:
        for t in op.inputs[1:]:
            if t < 0:
                continue
            ref = by_name.get(graph.tensors[t].name)
            if ref is None or list(ref.shape) != list(graph.tensors[t].shape) or ref.type != floats:
                return int8_model, []
            if reference.buffers[ref.buffer].data is None:
                return int8_model, []  # weights stored outside the flatbuffer (>2 GB models)
    consumers: dict[int, int] = {}
    for op in graph.operators:
        for t in op.inputs:
            consumers[t] = consumers.get(t, 0) + 1
    outputs = set(graph.outputs)
    alias: dict[int, int] = {}
    for op in found.requantize:
        src, dst = op.inputs[0], op.outputs[0]
        if consumers.get(src, 0) != 1 or src in outputs:
            return int8_model, []  # the int8 tensor is read elsewhere: leave the model as it is
        alias[src] = dst

    for op in found.path:
        op.outputs = [alias.get(t, t) for t in op.outputs]
        for t in op.outputs:
            graph.tensors[t].type = floats
            graph.tensors[t].quantization = None
    for op in found.heads:
        for t in op.inputs[1:]:
            if t < 0:
                continue
            tensor = graph.tensors[t]
            ref = by_name[tensor.name]
            buffer = schema.BufferT()
            buffer.data = reference.buffers[ref.buffer].data
            model.buffers.append(buffer)
            old, tensor.buffer = tensor.buffer, len(model.buffers) - 1
            tensor.type, tensor.quantization = floats, None
            if not any(other.buffer == old for other in graph.tensors):
                model.buffers[old].data = None  # the int8 weights: nothing reads them now

    # One DEQUANTIZE per int8 feature map a head reads, placed before the first head reading it.
    dequantize = _opcode(model, schema, schema.BuiltinOperator.DEQUANTIZE)
    dequantized: dict[int, int] = {}
    inserted: dict[int, Any] = {}
    for op in found.heads:
        x = op.inputs[0]
        if x not in dequantized:
            source = graph.tensors[x]
            tensor = schema.TensorT()
            tensor.name = source.name + b"_float"
            tensor.shape = source.shape
            tensor.shapeSignature = source.shapeSignature
            tensor.type = floats
            tensor.buffer = 0  # buffer 0 is the empty one: an activation
            graph.tensors.append(tensor)
            dequantized[x] = len(graph.tensors) - 1
            new = schema.OperatorT()
            new.opcodeIndex, new.inputs, new.outputs = dequantize, [x], [dequantized[x]]
            inserted[id(op)] = [*inserted.get(id(op), []), new]
        op.inputs = [dequantized[x], *op.inputs[1:]]
    removed = {id(op) for op in found.requantize}
    graph.operators = [
        new for op in graph.operators if id(op) not in removed for new in [*inserted.get(id(op), []), op]
    ]
    builder = flatbuffers.Builder(len(int8_model) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    names = [graph.tensors[op.outputs[0]].name.decode() for op in found.heads]
    return bytes(builder.Output()), names


class _Heads:
    """The ops of a model's dense-output heads, found by ``heads.walk`` over its operators."""

    def __init__(self, model: Any, schema: Any) -> None:
        graph = model.subgraphs[0]
        codes = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
        ops = graph.operators
        producer = {t: i for i, op in enumerate(ops) for t in op.outputs}

        def name(i: int) -> str:
            code = model.operatorCodes[ops[i].opcodeIndex]
            return str(codes.get(max(code.builtinCode, code.deprecatedBuiltinCode), ""))

        def constant(t: int) -> bool:
            return t >= 0 and t not in producer and model.buffers[graph.tensors[t].buffer].data is not None

        def inputs_of(i: int) -> list[int]:
            data = ops[i].inputs if name(i) == "CONCATENATION" else ops[i].inputs[:1]
            return [producer[t] for t in data if t in producer]

        def kind(i: int) -> str:
            if name(i) in HEAD_OPS and len(ops[i].inputs) > 1 and constant(ops[i].inputs[1]):
                return "head"
            return "shape" if name(i) in SHAPE_OPS else ""

        dense = [
            producer[t]
            for t in graph.outputs
            if t in producer and len(graph.tensors[t].shape) >= heads.MIN_RANK
        ]
        kept = sorted(heads.walk(dense, inputs_of, kind))
        self.heads = [ops[i] for i in kept if kind(i) == "head"]
        # QUANTIZE/DEQUANTIZE on the path only change the scale: in float they are nothing.
        self.requantize = [ops[i] for i in kept if name(i) in ("QUANTIZE", "DEQUANTIZE")]
        self.path = [ops[i] for i in kept if name(i) not in ("QUANTIZE", "DEQUANTIZE")]


def _opcode(model: Any, schema: Any, builtin: int) -> int:
    """The index of ``builtin``'s operator code in the model, added if the model has none."""
    for i, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 2
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1
