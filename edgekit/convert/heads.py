"""A detector's output heads: the layers whose results go straight to a graph output.

A detector's outputs are dense predictions (one row per anchor or cell: box offsets and
class logits, BlazeFace ``[1, 896, 16]`` and ``[1, 896, 1]``).  Quantized at the output with
one 8-bit scale, BlazeFace's score logits (about -100..+10) land on a grid ~0.4 logits wide:
near the threshold (logit 0, score 0.5) an int8 score takes only 0.500, 0.6, ... and a photograph
without a face came out with one at exactly 0.500.  The int8 recipes therefore keep these
head layers in float: the features stay int8, the boxes and logits are computed in fp32.

A head is found from the graph, not from names: from each dense output (rank 3 or more) walk
back through shape-only ops (Reshape, Transpose, Concat, ...) to the weighted layers that
produce it.  A classifier's logits (``[N, C]``, rank 2) have no head here: top-1 is an argmax,
not a threshold, and its int8 recipes were measured as they are.

``walk`` is the graph-agnostic search; ``onnx_heads`` applies it to an ONNX graph (the
OpenVINO recipe applies it to its own graph, whose ops have other names).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

# Version of the float-head recipe: in the int8 artifacts' notes of a detector and in its build
# steps' cache key (cache_params): bump it when what stays float changes.
RECIPE = 1
MIN_RANK = 3  # a dense-prediction output: batch, rows (anchors, cells) and values per row

ONNX_SHAPE_OPS = ("Reshape", "Transpose", "Concat", "Flatten", "Squeeze", "Unsqueeze", "Identity")
ONNX_HEAD_OPS = ("Conv", "Gemm", "MatMul")

N = TypeVar("N", bound=Hashable)


def walk(
    outputs: Iterable[N],
    inputs_of: Callable[[N], Sequence[N]],
    kind: Callable[[N], str],
) -> list[N]:
    """The nodes from each of ``outputs`` back through ``"shape"`` nodes to ``"head"`` nodes.

    ``inputs_of(node)`` gives the nodes feeding ``node``'s data inputs (constants left out);
    ``kind(node)`` says ``"head"``, ``"shape"`` or anything else (the walk stops there).  A
    shape node is kept only when some head lies behind it: an output computed by other ops
    (a Sigmoid, an Add of two branches) leaves nothing to keep in float on that path.
    """
    found: dict[N, bool] = {}

    def visit(node: N) -> bool:
        if node in found:
            return found[node]
        found[node] = False  # a cycle (none in a valid graph) ends here
        what = kind(node)
        if what == "head":
            found[node] = True
        elif what == "shape":
            found[node] = any([visit(i) for i in inputs_of(node)])  # a list: visit every input
        return found[node]

    for out in outputs:
        visit(out)
    return [node for node, kept in found.items() if kept]


def onnx_heads(model: Any) -> list[str]:
    """Names of the nodes of an ONNX graph that compute its dense outputs' heads, in graph order.

    The head layers (Conv, Gemm, MatMul with an initializer weight) and the shape-only nodes
    between them and the outputs; empty for a model whose outputs are all rank 2 or less.
    Nodes must be named (``onnx_int8._name_nodes``).
    """
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    producer = {out: node.name for node in graph.node for out in node.output}
    nodes = {node.name: node for node in graph.node}

    def inputs_of(name: str) -> list[str]:
        node = nodes[name]
        # Reshape's shape, Squeeze's axes...: only the first input carries data, except in Concat.
        data = node.input if node.op_type == "Concat" else node.input[:1]
        return [producer[i] for i in data if i in producer and i not in weights]

    def kind(name: str) -> str:
        node = nodes[name]
        if node.op_type in ONNX_HEAD_OPS and len(node.input) > 1 and node.input[1] in weights:
            return "head"
        return "shape" if node.op_type in ONNX_SHAPE_OPS else ""

    dense = [o.name for o in graph.output if len(o.type.tensor_type.shape.dim) >= MIN_RANK]
    kept = set(walk([producer[o] for o in dense if o in producer], inputs_of, kind))
    return [node.name for node in graph.node if node.name in kept]


def cache_params(fp32_onnx: Path) -> dict[str, int]:
    """What the float-head recipe adds to an int8 build step's cache key, from the fp32 ONNX.

    ``{"float_heads": RECIPE}`` for a model with heads (so int8 artifacts cached before this
    recipe, or by an older one, are not reused), nothing for one without: a classifier's keys,
    and its cached artifacts, stay as they were.
    """
    import onnx

    return {"float_heads": RECIPE} if onnx_heads(_named(onnx.load(str(fp32_onnx)))) else {}


def _named(model: Any) -> Any:
    """``model`` with every node named (its name, else ``<op>_<index>``): ``onnx_heads`` works on names."""
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"
    return model
