"""What goes into a build and what comes out: the request, each artifact's report, the result.

Shared by the build (:mod:`edgekit.convert.builder`), which fills them, and the bundle
writer (:mod:`edgekit.convert.bundling`), which turns the reports into the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.convert.accuracy import DEFAULT_THRESHOLD, GateAccuracy
from edgekit.convert.artifact import Artifact
from edgekit.convert.latency import MeasuredLatency
from edgekit.convert.map_gate import CocoGate
from edgekit.convert.modelcard import ModelCard


@dataclass(frozen=True)
class BuildRequest:
    """Everything ``edgekit build`` needs; the CLI fills it from flags, the Python API directly."""

    card: ModelCard
    device: str
    out: Path
    onnx: Path | None = None  # the user's ONNX instead of the card's PyTorch source
    tflite: Path | None = None  # the user's .tflite: bundled as it is (no converter starts from .tflite)
    pytorch_module: Any = None  # a torch.nn.Module given through the Python API
    calibration: Path | None = None
    eval: Path | None = None
    backends: tuple[str, ...] = ()  # empty: every backend the profile names
    precisions: tuple[str, ...] = ()
    tune_trials: int = 0
    tvm_untuned: bool = False  # build a host-arch TVM library even with no tuned schedules for it
    sign_key: Path | None = None
    serial: int | None = None  # the bundle's build counter (None: UTC seconds at the build)
    threshold: float = DEFAULT_THRESHOLD
    allow_accuracy_drop: bool = False
    use_cache: bool = True
    measure_latency: bool = True
    gate_budget_s: float = 120.0  # an artifact slower than this on the eval set is gated on a sample
    coco: CocoGate | None = None  # labelled images: the detection gate is mAP50 against fp32


@dataclass
class ArtifactReport:
    """One artifact and what the build measured about it."""

    recipe: str
    artifact: Artifact | None
    accuracy: GateAccuracy | None = None
    latency: MeasuredLatency | None = None
    not_measured: str = ""
    skipped: str = ""
    evaluated_as: str = ""  # how the gate ran it when not as the device will (empty: as the device will)
    gate_sample: str = ""  # which of the images the gate judged it on, when not all (a slow artifact)

    def to_dict(self) -> dict[str, Any]:
        a = self.artifact
        return {
            "recipe": self.recipe,
            "backend": a.backend if a else None,
            "precision": a.precision if a else None,
            "arch": a.arch if a else None,
            "kind": a.kind if a else None,
            "path": str(a.path.name) if a else None,
            "accuracy": self.accuracy.to_dict() if self.accuracy else None,
            "latency_ms": {"p50": self.latency.p50_ms, "p99": self.latency.p99_ms, "runs": self.latency.runs}
            if self.latency
            else None,
            "not_measured": self.not_measured or None,
            "evaluated_as": self.evaluated_as or None,
            "gate_sample": self.gate_sample or None,
            "variant": a.variant if a else None,
            "requires": list(a.requires) if a else [],
            "skipped": self.skipped or None,
            "notes": dict(a.notes) if a else {},
        }


@dataclass(frozen=True)
class StageTime:
    """How long one step of the build took (``artifact`` empty for a step of the whole build)."""

    stage: str  # export, convert, quantize, compile, reference, gate, bundle
    artifact: str
    seconds: float
    cached: bool = False  # read back from the build cache

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "artifact": self.artifact or None,
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
        }


@dataclass
class BuildResult:
    """What a build produced."""

    bundle: Path
    profile: str
    reports: list[ArtifactReport] = field(default_factory=list)
    cache_hits: list[str] = field(default_factory=list)
    smoke_set: bool = True
    eval_images: int = 0
    stages: list[StageTime] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "profile": self.profile,
            "eval_images": self.eval_images,
            "smoke_set": self.smoke_set,
            "cache_hits": self.cache_hits,
            "artifacts": [r.to_dict() for r in self.reports],
            "stages": [t.to_dict() for t in self.stages],
        }
