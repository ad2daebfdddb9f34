"""What a build step produces: one model artifact for one backend and precision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PORTABLE = "any"  # an artifact that runs on any architecture (ONNX, OpenVINO IR, .tflite)


@dataclass(frozen=True)
class Artifact:
    """A built model file (and the files that travel with it) plus how to load it.

    ``path`` is the file a backend loads; ``files`` lists every file that belongs to it
    (``path`` first): an OpenVINO IR is ``.xml`` + ``.bin``, a TVM library is ``.so`` +
    ``.io.json``.  ``arch`` is ``"any"`` for portable formats, else the CPU the code was
    compiled for.  ``options`` are backend options the artifact needs to load (for example
    the Edge TPU delegate); ``notes`` is free-form build information for the manifest
    (tuning trials, calibration size, what was skipped and why).
    """

    path: Path
    backend: str
    precision: str
    arch: str = PORTABLE
    files: tuple[Path, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    notes: Mapping[str, Any] = field(default_factory=dict)
    kind: str = ""  # e.g. "onnx", "openvino-ir", "tflite", "tflite-edgetpu", "tvm-so", "tensorrt-onnx"
    variant: str = ""  # a second recipe of the same precision: "full" (full-range int8 weights)
    requires: tuple[str, ...] = ()  # CPU capabilities it needs to compute as built (edgekit.core.cpu)

    @property
    def all_files(self) -> tuple[Path, ...]:
        return self.files or (self.path,)

    @property
    def key(self) -> str:
        """``backend-precision`` (plus ``-edgetpu`` and so on from the kind when it tells more)."""
        suffix = f"-{self.kind.split('-', 1)[1]}" if self.kind.startswith("tflite-") else ""
        variant = f"-{self.variant}" if self.variant else ""
        return f"{self.backend}-{self.precision}{variant}{suffix}"
