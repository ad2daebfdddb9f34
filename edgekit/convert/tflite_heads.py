"""A quantized ``.tflite`` detector's output heads put back in float (``edgekit.convert.heads`` says why).

LiteRT's post-training calibrator (the only one edgekit uses without TensorFlow) cannot leave
chosen ops in float: its Python wrapper quantizes every op, or a single one, and has no deny
list.  So the int8 model is edited after quantization, with LiteRT's own flatbuffer schema:

- the head layers (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED found by ``heads.walk`` from
  each dense output through the ops without weights, and a decoder's layer behind a SOFTMAX)
  get the fp32 model's weights and bias (same tensor names: the calibrator keeps them) and
  float32 outputs;
- their int8 input is dequantized by a DEQUANTIZE op (one per feature map);
- the ops after them compute in float32, their quantized constants (a MUL's strides, an
  ADD's anchors) replaced by the fp32 model's; the requantizing QUANTIZE and the output's
  DEQUANTIZE between them go, the output tensor (its index and name, so the signature) kept.

The features stay int8; what the model outputs is computed in fp32 from them.  Only the
float-input model is edited: the Edge TPU's must stay full-integer.
"""

from __future__ import annotations

from typing import Any

from edgekit.convert import heads

HEAD_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
# Ops every input of which is data (heads.ONNX_ALL_DATA_OPS): the walk follows each produced one;
# of any other op only the first input (a RESHAPE's shape, a SLICE's bounds are parameters).
ALL_DATA_OPS = ("CONCATENATION", "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "ADD_N", "BATCH_MATMUL")


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
            if ref is None or _shape(ref) != _shape(graph.tensors[t]) or ref.type != floats:
                return int8_model, []
            if reference.buffers[ref.buffer].data is None:
                return int8_model, []  # weights stored outside the flatbuffer (>2 GB models)
    producer = {t: op for op in graph.operators for t in op.outputs}
    kept = {id(op) for op in [*found.path, *found.requantize]}  # what computes in float after the edit
    heads_ = {id(op) for op in found.heads}
    # A pass op's inputs: float after the edit, a plain parameter (an int32 shape), or a quantized
    # constant the fp32 model has under the same name.  Anything else (an int8 tensor from
    # the features) would be read as float: leave the model as it is.
    constants: list[tuple[Any, int, Any]] = []  # op, input slot, fp32 tensor
    for op in found.path:
        if id(op) in heads_:
            continue
        for slot, t in enumerate(op.inputs):
            source = producer.get(t)
            if (
                t < 0
                or (source is not None and id(source) in kept)
                or not _quantized(graph.tensors[t], schema)
            ):
                continue
            ref = by_name.get(graph.tensors[t].name)
            if source is not None or ref is None or ref.type != floats:
                return int8_model, []
            if _shape(ref) != _shape(graph.tensors[t]) or reference.buffers[ref.buffer].data is None:
                return int8_model, []
            constants.append((op, slot, ref))
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

    def resolved(t: int) -> int:
        while t in alias:  # a QUANTIZE then a DEQUANTIZE: both go
            t = alias[t]
        return t

    for op in found.path:
        op.outputs = [resolved(t) for t in op.outputs]
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
    for op, slot, ref in constants:
        # A tensor of its own: the int8 constant may be read by int8 ops too.
        buffer = schema.BufferT()
        buffer.data = reference.buffers[ref.buffer].data
        model.buffers.append(buffer)
        tensor = schema.TensorT()
        tensor.name, tensor.shape, tensor.type = ref.name + b"_float", ref.shape, floats
        tensor.buffer = len(model.buffers) - 1
        graph.tensors.append(tensor)
        op.inputs = [len(graph.tensors) - 1 if i == slot else t for i, t in enumerate(op.inputs)]

    # One DEQUANTIZE per int8 feature map a head reads, placed before the first head reading it.
    dequantize = _opcode(model, schema, schema.BuiltinOperator.DEQUANTIZE)
    dequantized: dict[int, int] = {}
    inserted: dict[int, Any] = {}
    for op in found.heads:
        x = op.inputs[0]
        if id(producer.get(x)) in kept:
            continue  # a decoder's layer (the DFL's) reads a float op's output: no DEQUANTIZE
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
            data = ops[i].inputs if name(i) in ALL_DATA_OPS else ops[i].inputs[:1]
            return [producer[t] for t in data if t in producer]

        def kind(i: int) -> str:
            if name(i) in HEAD_OPS and len(ops[i].inputs) > 1 and constant(ops[i].inputs[1]):
                return "head"
            if name(i) == "SOFTMAX":
                return "softmax"
            return "pass" if inputs_of(i) else ""

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


def _shape(tensor: Any) -> list[int]:
    return [] if tensor.shape is None else list(tensor.shape)  # a scalar has no shape array


def _quantized(tensor: Any, schema: Any) -> bool:
    """Whether ``tensor`` holds quantized values (int8, uint8, int16, or int32 with a scale: a bias)."""
    types = schema.TensorType
    if tensor.type in (types.INT8, types.UINT8, types.INT16):
        return True
    q = tensor.quantization
    return bool(tensor.type == types.INT32 and q is not None and q.scale is not None and len(q.scale))


def _opcode(model: Any, schema: Any, builtin: int) -> int:
    """The index of ``builtin``'s operator code in the model, added if the model has none."""
    for i, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 2
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1
