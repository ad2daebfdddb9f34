"""Which operators of an ONNX graph a target cannot take — found before a long compile fails.

TVM's ONNX importer has a fixed table of converters; an operator outside it fails the
import with a long traceback.  Checking the graph against the table first gives one line:
which operator, which target.
"""

from __future__ import annotations

from pathlib import Path

from edgekit.errors import BuildError


def onnx_ops(path: Path) -> list[str]:
    """The operator types a graph uses (domain-qualified when not the default domain), sorted."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return sorted(
        {(f"{n.domain}:" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in model.graph.node}
    )


def tvm_unsupported(path: Path) -> list[str]:
    """Operators in the graph that TVM's Relax ONNX importer has no converter for."""
    from tvm.relax.frontend.onnx import onnx_frontend

    known = set(onnx_frontend._get_convert_map())
    return [op for op in onnx_ops(path) if op not in known]


def require_supported(path: Path, backend: str, target: str) -> None:
    """Raise a BuildError naming each unsupported operator and the target, before converting."""
    missing = tvm_unsupported(path) if backend == "tvm" else []
    if missing:
        raise BuildError(
            f"{path.name}: operator{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
            f"{'are' if len(missing) > 1 else 'is'} not supported by {backend} (target {target})",
            f"leave {backend} out with --backends, or replace the operator in the model before export",
        )
