"""A detector's output heads: the layers whose results go straight to a graph output.

A detector's outputs are dense predictions (one row per anchor or cell: box offsets and
class scores, BlazeFace ``[1, 896, 16]`` and ``[1, 896, 1]``, YOLOv8 ``[1, 4 + nc, 8400]``).
Quantized at the output with one 8-bit scale, BlazeFace's score logits (about -100..+10) land
on a grid ~0.4 logits wide: near the threshold (logit 0, score 0.5) an int8 score takes only
0.500, 0.6, ... and a photograph without a face came out with one at exactly 0.500.  A YOLOv8
output is worse: it concatenates boxes in input pixels (0..640) with class probabilities
(0..1), so one int8 scale for both (~2.5 pixels a step) rounds every score to 0 and every
box was lost.  The int8 recipes therefore keep these head layers, and everything computed
from them up to the output, in float: the features stay int8, boxes and scores are fp32.

A head is found from the graph, not from names: from each dense output (rank 3 or more) walk
back through every op without weights ("pass" ops: Reshape, Concat, Sigmoid, Mul, Sub, Split,
Softmax, ...) to the weighted layers (Conv, Gemm, MatMul with constant weights) that produce
it.  YOLOv8's box decoding (DFL) has a weighted layer of its own: a 1x1 convolution with
fixed weights 0..15 reading a Softmax over 16 bins.  A weighted layer fed by a Softmax is
such a decoder: it is kept too, and the walk goes on behind the Softmax to the real head
convolutions.  A classifier's logits (``[N, C]``, rank 2) have no head here: top-1 is an
argmax, not a threshold, and its int8 recipes were measured as they are.

A head's own branch stays float too (``branches``): the layers behind a head whose results
go to that head and nowhere else.  YOLOv8's Detect has, per scale, two 3x3 convolutions
before each 1x1 head convolution; quantized, they cost the DocLayNet YOLOv8n 0.3-1.4 points
of mAP50 on typeset pages (edgekit's int8 recipes, ONNX Runtime 1.32 / NNCF, AVX-512 VNNI).
A branch ends at a tensor read elsewhere too (the neck's features read by the box and class
branches and the next neck stage; an SSD's features read by its box and score heads): the
shared features stay int8.  The full-range recipes (ONNX Runtime's and OpenVINO's) quantize
the branches: float, they are a third of that model's work (``onnx_int8`` and ``openvino_ir``
have the numbers).

``walk`` and ``branches`` are the graph-agnostic searches; ``onnx_heads`` applies it to an ONNX graph (the
OpenVINO and LiteRT recipes apply it to their own graphs, whose ops have other names).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

# Version of the float-head recipe: in the int8 artifacts' notes of a detector and in its build
# steps' cache key (cache_params): bump it when what stays float changes.
# 2: every op without weights is walked through (YOLOv8's Sigmoid, DFL Softmax, anchor arithmetic).
# 3: each head's own branch (``branches``: YOLOv8's Detect convolutions before the heads), and
#    in the full-range recipes a detector's stem (ORT: with its activation).
# 4: ORT's full-range recipe quantizes the branches (onnx_int8.quantize_onnx_int8 says why).
# 5: OpenVINO's full-range recipe quantized the branches with symmetric activations (a trial).
# 6: so does OpenVINO's, with asymmetric activations (openvino_ir says why).
RECIPE = 6
MIN_RANK = 3  # a dense-prediction output: batch, rows (anchors, cells) and values per row

ONNX_HEAD_OPS = ("Conv", "Gemm", "MatMul")
# Ops every input of which is data (a Concat's parts, an Add's operands): the walk follows each
# one that is not a constant.  Any other op's inputs after the first are parameters (Reshape's
# shape, Slice's starts, Split's sizes): only its first input is followed.
ONNX_ALL_DATA_OPS = ("Concat", "Add", "Sub", "Mul", "Div", "MatMul", "Max", "Min", "Sum", "Mean", "Where")

N = TypeVar("N", bound=Hashable)


def walk(
    outputs: Iterable[N],
    inputs_of: Callable[[N], Sequence[N]],
    kind: Callable[[N], str],
) -> list[N]:
    """The nodes from each of ``outputs`` back through ``"pass"`` nodes to ``"head"`` nodes.

    ``inputs_of(node)`` gives the nodes feeding ``node``'s data inputs (constants left out);
    ``kind(node)`` says ``"head"`` (a weighted layer), ``"softmax"`` (a pass node that marks a
    decoder: see below), ``"pass"`` (any other op computing from data) or anything else (a
    graph input, a constant: the walk stops there).  A pass node is kept only when some head
    lies behind it: an output computed from the input alone leaves nothing to keep in float.

    A head fed by a softmax node (directly, or through nodes with a single data input) is a
    decoder (YOLOv8's DFL): it is kept, and the walk goes on behind it.  Nodes that join two
    data inputs (an attention's MatMul of scores and values) end that search: a transformer's
    projection after its attention is a head, not a decoder.
    """
    found: dict[N, bool] = {}

    def fed_by_softmax(node: N) -> bool:
        sources = list(inputs_of(node))
        seen: set[N] = set()
        while len(sources) == 1 and sources[0] not in seen:
            source = sources[0]
            seen.add(source)
            what = kind(source)
            if what == "softmax":
                return True
            if what != "pass":
                return False
            sources = list(inputs_of(source))
        return False

    def visit(node: N) -> bool:
        if node in found:
            return found[node]
        found[node] = False  # a cycle (none in a valid graph) ends here
        what = kind(node)
        if what == "head":
            found[node] = True
            if fed_by_softmax(node):
                for i in inputs_of(node):
                    visit(i)
        elif what in ("pass", "softmax"):
            found[node] = any([visit(i) for i in inputs_of(node)])  # a list: visit every input
        return found[node]

    for out in outputs:
        visit(out)
    return [node for node, kept in found.items() if kept]


def branches(
    kept: Iterable[N],
    inputs_of: Callable[[N], Sequence[N]],
    consumers_of: Callable[[N], Sequence[N]],
    kind: Callable[[N], str],
) -> list[N]:
    """The nodes of each head's own branch: behind each ``"head"`` node of ``kept`` (``walk``'s result),
    the nodes whose every consumer is in that head's branch already.

    ``consumers_of(node)`` gives every node reading ``node``'s results (a graph output counts as
    a reader outside any branch).  Each head is searched alone: a tensor read by two heads (an
    SSD's box and score convolutions on the same features) is shared, so it and what computes
    it stay out; so does anything read by a node outside the branch.  Only ``"head"``,
    ``"pass"`` and ``"softmax"`` nodes are taken.  The result excludes ``kept`` itself.
    """
    kept = list(kept)
    done = set(kept)
    found: list[N] = []
    for head in kept:
        if kind(head) != "head":
            continue
        branch = {head}
        frontier = [i for i in inputs_of(head) if i not in done]
        while frontier:
            grew = False
            for node in list(frontier):
                if node in branch or node in done:
                    frontier.remove(node)
                elif kind(node) in ("head", "pass", "softmax") and all(
                    c in branch for c in consumers_of(node)
                ):
                    branch.add(node)
                    frontier.remove(node)
                    frontier.extend(i for i in inputs_of(node) if i not in branch and i not in done)
                    grew = True
            if not grew:  # what is left is read outside the branch
                break
        branch.discard(head)
        found.extend(n for n in branch if n not in done)
        done |= branch
    return found


def onnx_heads(model: Any, *, with_branches: bool = True) -> list[str]:
    """Names of the nodes of an ONNX graph that compute its dense outputs' heads, in graph order.

    The head layers (Conv, Gemm, MatMul with an initializer weight), a decoder's (the DFL's
    Conv), the nodes between them and the outputs, and each head's own branch (unless not
    ``with_branches``); empty for a model whose outputs are all
    rank 2 or less.  Nodes must be named (``onnx_int8._name_nodes``).
    """
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    producer = {out: node.name for node in graph.node for out in node.output}
    nodes = {node.name: node for node in graph.node}

    def inputs_of(name: str) -> list[str]:
        node = nodes[name]
        data = node.input if node.op_type in ONNX_ALL_DATA_OPS else node.input[:1]
        return [producer[i] for i in data if i in producer and i not in weights]

    def kind(name: str) -> str:
        node = nodes[name]
        if node.op_type in ONNX_HEAD_OPS and len(node.input) > 1 and node.input[1] in weights:
            return "head"
        if node.op_type == "Softmax":
            return "softmax"
        return "pass" if node.op_type != "Constant" else ""

    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for i in node.input:
            if i in producer:
                readers.setdefault(producer[i], []).append(node.name)
    for o in graph.output:  # an output is read outside any branch
        if o.name in producer:
            readers.setdefault(producer[o.name], []).append("")

    def consumers_of(name: str) -> list[str]:
        return readers.get(name, [])

    dense = [o.name for o in graph.output if len(o.type.tensor_type.shape.dim) >= MIN_RANK]
    found = walk([producer[o] for o in dense if o in producer], inputs_of, kind)
    kept = set(found) | (set(branches(found, inputs_of, consumers_of, kind)) if with_branches else set())
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
