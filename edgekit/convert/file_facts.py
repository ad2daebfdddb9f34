"""What an ONNX file says about itself: its input and outputs, and the metadata its exporter wrote.

Ultralytics writes ``metadata_props`` into every export (``task``, ``names``, ``imgsz``,
``stride``, ``batch``, ``author``, ``version``, ``license``, ``args``, ``end2end``); from them
and the output's shape a detector's card can be inferred (:mod:`edgekit.convert.file_card`).
Reading never runs anything in the file: ``names`` and ``imgsz`` are Python literals, parsed
only when they are exactly a dict of int -> str (a list of ints), never evaluated.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgekit.errors import BuildError

#: ONNX TensorProto element types by number, for the ones a vision model's input may have.
DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    6: "int32",
    7: "int64",
    10: "float16",
    11: "float64",
    16: "bfloat16",
}

Dim = int | str | None  # a fixed size, a symbolic name, or unknown


@dataclass(frozen=True)
class TensorFacts:
    """One graph input or output: its name, shape (symbolic axes by name) and element type."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def fixed(self) -> tuple[int, ...] | None:
        """The shape when every axis has a fixed size, else None."""
        if all(isinstance(d, int) for d in self.shape):
            return tuple(int(d) for d in self.shape if isinstance(d, int))
        return None

    def shape_text(self) -> str:
        return "[" + ", ".join(str(d) if d is not None else "?" for d in self.shape) + "]"


@dataclass(frozen=True)
class FileFacts:
    """An ONNX file's first (non-initializer) input, its outputs, and its ``metadata_props``."""

    path: Path
    input: TensorFacts
    outputs: tuple[TensorFacts, ...]
    metadata: Mapping[str, str]


def _tensor(value_info: object) -> TensorFacts:
    t = value_info.type.tensor_type  # type: ignore[attr-defined]
    dims: list[Dim] = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(str(d.dim_param))
        else:
            dims.append(None)
    return TensorFacts(str(value_info.name), tuple(dims), DTYPES.get(int(t.elem_type), f"type {t.elem_type}"))  # type: ignore[attr-defined]


def read_facts(path: Path) -> FileFacts:
    """The facts of the ONNX file at ``path`` (its weights are not loaded)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises DecodeError, ValueError, google.protobuf errors
        raise BuildError(
            f"{path} is not a valid ONNX model: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
            "re-export the model (torch.onnx.export, opset >= 13) or check the file was copied whole",
        ) from err
    init = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    if not inputs:
        raise BuildError(f"{path.name} has no input", "export the model with its image input")
    return FileFacts(
        path=path,
        input=_tensor(inputs[0]),
        outputs=tuple(_tensor(o) for o in model.graph.output),
        metadata={p.key: p.value for p in model.metadata_props},
    )


def _literal(text: str) -> ast.expr | None:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None


def parse_names(text: str, where: str) -> tuple[str, ...]:
    """Ultralytics' ``names`` (``"{0: 'person', 1: 'bicycle'}"``) as class names in class order.

    Only a dict whose keys are int literals and values str literals is read (checked on the
    syntax tree before ``ast.literal_eval``); the ids must be 0..n-1.
    """
    node = _literal(text)
    hint = "the file's 'names' metadata should be a dict of class id -> name, e.g. {0: 'person'}"
    if not isinstance(node, ast.Dict) or not all(
        isinstance(k, ast.Constant)
        and type(k.value) is int
        and isinstance(v, ast.Constant)
        and type(v.value) is str
        for k, v in zip(node.keys, node.values, strict=True)
    ):
        raise BuildError(
            f"{where}: ONNX metadata 'names' is not a dict of class id -> name: {text[:80]!r}", hint
        )
    names: dict[int, str] = ast.literal_eval(node)
    if not names or sorted(names) != list(range(len(names))):
        raise BuildError(
            f"{where}: ONNX metadata 'names' has class ids {sorted(names)[:8]}, not 0..{len(names) - 1}", hint
        )
    return tuple(names[i] for i in range(len(names)))


def parse_imgsz(text: str, where: str) -> tuple[int, int]:
    """Ultralytics' ``imgsz``: ``"[640, 640]"`` (height, width) or ``"640"``."""
    node = _literal(text)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value, node.value
    if (
        isinstance(node, ast.List | ast.Tuple)
        and len(node.elts) in (1, 2)
        and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts)
    ):
        vals = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, int)]
        return vals[0], vals[-1]
    raise BuildError(f"{where}: ONNX metadata 'imgsz' is not a size: {text[:40]!r}", "pass --input-size H,W")


def flag(text: str | None, key: str) -> bool | None:
    """A boolean from ``metadata`` (``'True'``) or from the ``args`` dict's ``key`` (``"{'nms': True}"``)."""
    if text is None:
        return None
    node = _literal(text)
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == key and isinstance(v, ast.Constant):
                return v.value if isinstance(v.value, bool) else None
    return None


def detector_like(out: TensorFacts) -> bool:
    """Whether an output's shape looks like a YOLO-style detection head (``[1, 84, 8400]``,
    ``[1, 25200, 85]``, ``[1, 300, 6]``) rather than a classifier's ``[1, classes]``."""
    if len(out.shape) != 3 or (out.shape[0] not in (1, None) and not isinstance(out.shape[0], str)):
        return False
    a, b = out.shape[1], out.shape[2]
    if not isinstance(a, int) or not isinstance(b, int):
        return False
    small, large = min(a, b), max(a, b)
    # A 64x64 YOLO has 84 boxes (8x8 + 4x4 + 2x2), 4 + classes or 5 + classes values each.
    return small >= 5 and large >= 20 and large >= 2 * small
