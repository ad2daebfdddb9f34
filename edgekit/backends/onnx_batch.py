"""Whether an ONNX file's batch dimension is free, read from its bytes without the onnx package.

A device has onnxruntime but not onnx, and an ONNX Runtime session cannot say what the file
declared once a free dimension is pinned (it then reports the pinned size).  So the few fields
that matter are read straight from the protobuf wire format: the graph's inputs (less its
initializers, which old IR versions list as inputs too) and outputs, and the first dimension of
each.  The rest of the file (nodes, weights) is skipped by length, not decoded.
"""

from __future__ import annotations

from collections.abc import Iterator

# Field numbers of onnx.proto3 (stable since IR version 3).
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 5, 11, 12
_TENSOR_NAME = 8
_VALUE_NAME, _VALUE_TYPE = 1, 2
_TYPE_TENSOR = 1
_TENSOR_TYPE_SHAPE = 2
_SHAPE_DIM = 1
_DIM_PARAM = 2
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def batch_dim_params(model: bytes) -> tuple[str, ...] | None:
    """The ``dim_param`` names of dim 0 of every graph input and output, when all are free; else None.

    None also for a file that is not a readable ONNX model: the runtime reports that one itself.
    """
    try:
        graph = _first(model, 0, len(model), _MODEL_GRAPH)
        if graph is None:
            return None
        initializers: set[str] = set()
        values: list[tuple[int, int, int]] = []
        for field, wire, a, b in _fields(model, *graph):
            if wire != _BYTES:
                continue
            if field == _GRAPH_INITIALIZER:
                name = _first(model, a, b, _TENSOR_NAME)
                if name is not None:
                    initializers.add(model[name[0] : name[1]].decode())
            elif field in (_GRAPH_INPUT, _GRAPH_OUTPUT):
                values.append((field, a, b))
        params: list[str] = []
        for field, a, b in values:
            name = _first(model, a, b, _VALUE_NAME)
            if (
                field == _GRAPH_INPUT
                and name is not None
                and model[name[0] : name[1]].decode() in initializers
            ):
                continue  # a weight listed as an input (IR < 4): not something a caller feeds
            param = _dim0_param(model, a, b)
            if param is None:
                return None
            params.append(param)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    return tuple(dict.fromkeys(params)) or None


def _dim0_param(buf: bytes, start: int, end: int) -> str | None:
    """The dim_param of dim 0 of a ValueInfoProto's tensor type, or None (a size, or no shape)."""
    for field in (_VALUE_TYPE, _TYPE_TENSOR, _TENSOR_TYPE_SHAPE, _SHAPE_DIM, _DIM_PARAM):
        span = _first(buf, start, end, field)
        if span is None:
            return None
        start, end = span
    return buf[start:end].decode() or None


def _first(buf: bytes, start: int, end: int, wanted: int) -> tuple[int, int] | None:
    """The span of the first length-delimited field ``wanted`` of the message in ``buf[start:end]``."""
    for field, wire, a, b in _fields(buf, start, end):
        if field == wanted and wire == _BYTES:
            return a, b
    return None


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field, wire type, start, end) of each field of a message; a varint's value is its start."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, i = _varint(buf, i)
            yield field, wire, value, i
        elif wire == _BYTES:
            length, i = _varint(buf, i)
            if i + length > end:
                raise ValueError("field runs past its message")
            yield field, wire, i, i + length
            i += length
        elif wire == _FIXED64:
            i += 8
        elif wire == _FIXED32:
            i += 4
        else:  # groups (3, 4) are not used by onnx.proto
            raise ValueError(f"wire type {wire}")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
