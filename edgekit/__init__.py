"""edgekit: take a trained vision model to edge devices and keep it within its frame budget there.

``import edgekit`` is cheap: it imports no runtime (and not numpy).  Runtimes are imported
when a backend is probed or loads a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgekit._version import __version__
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.detection.detector import Detection
    from edgekit.model import Model, load
    from edgekit.pipeline import Camera, FrameRecord, FrameResult, Pipeline, Policy, Summary, open_source
    from edgekit.processing.postprocess import Label

__all__ = [
    "Camera",
    "Detection",
    "EdgekitError",
    "FrameRecord",
    "FrameResult",
    "Label",
    "Model",
    "Pipeline",
    "Policy",
    "Summary",
    "__version__",
    "load",
    "open_source",
]

_LAZY = {
    "load": "edgekit.model",
    "Model": "edgekit.model",
    "Label": "edgekit.processing.postprocess",
    "Detection": "edgekit.detection.detector",
    **dict.fromkeys(
        ("Camera", "Pipeline", "Policy", "FrameRecord", "FrameResult", "Summary", "open_source"),
        "edgekit.pipeline",
    ),
}


def __getattr__(name: str) -> Any:
    # The embedding API is imported on first use, so `import edgekit` stays cheap on a device.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edgekit' has no attribute {name!r}")
