"""Backends: one module per runtime behind one protocol, found lazily through the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.backends.base import Availability, Backend, Quantization, Session, TensorSpec
from edgekit.errors import BackendError

__all__ = ["Availability", "Backend", "Quantization", "Session", "TensorSpec", "backend_for", "open_session"]

# Which backend reads a file, by name ending; the first listed is the default.
_BY_SUFFIX = (
    ("_edgetpu.tflite", "litert"),
    (".tflite", "litert"),
    (".onnx", "onnxruntime"),
    (".xml", "openvino"),
    (".so", "tvm"),
    (".engine", "tensorrt"),
    (".plan", "tensorrt"),
)


def backend_for(artifact: Path) -> str:
    """The default backend for a model file, from its name."""
    for suffix, name in _BY_SUFFIX:
        if str(artifact).endswith(suffix):
            return name
    raise BackendError(
        f"no backend reads {artifact} (unknown file type)",
        "name a backend explicitly, or use .onnx, .xml, .tflite, .so, .engine",
    )


def open_session(artifact: str | Path, backend: str | None = None, **options: Any) -> Session:
    """Load one model file on one backend (default: chosen by its file type)."""
    from edgekit.backends import registry

    path = Path(artifact)
    return registry.get(backend or backend_for(path)).load(path, options)
