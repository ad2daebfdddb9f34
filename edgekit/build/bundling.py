"""Turn a finished build into a bundle: the manifest's sections from the build, then write (and sign)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.build.images import ImageSet
from edgekit.packages import installed_versions

if TYPE_CHECKING:
    from edgekit.build.builder import ArtifactReport, _Build

TOOLS = ("onnxruntime", "openvino", "nncf", "ai-edge-litert", "litert-torch", "apache-tvm", "torch", "onnx")


def tool_versions() -> dict[str, str]:
    """Versions of the converters and runtimes installed on the build host."""
    return installed_versions(TOOLS)


def write(b: _Build, fp32: Path, fp32_hash: str, reports: Sequence[ArtifactReport], evals: ImageSet) -> Path:
    """Write the bundle for a build whose artifacts passed the gate (or were allowed through)."""
    from edgekit.bundle import Accuracy, ArtifactResults, Latency, bundle_meta, write_bundle

    req = b.req
    meta = bundle_meta(
        req.card,
        b.profile,
        source_sha256=fp32_hash,
        accuracy_threshold=req.threshold,
        allow_accuracy_drop=req.allow_accuracy_drop,
        tools=tool_versions(),
    )
    items = []
    for r in reports:
        if r.artifact is None:
            continue
        acc = r.accuracy
        items.append(
            (
                r.artifact,
                ArtifactResults(
                    latency=Latency(p50_ms=r.latency.p50_ms, p99_ms=r.latency.p99_ms, runs=r.latency.runs)
                    if r.latency
                    else None,
                    accuracy=Accuracy(
                        top1_agreement=acc.top1_agreement,
                        max_abs_logit_diff=acc.max_abs_logit_diff,
                        eval_images=acc.eval_images,
                        smoke_set=acc.smoke_set,
                        passed=acc.passed,
                        allowed_drop=not acc.passed,
                        top1_agreement_all=acc.top1_agreement_all,
                        decisive_images=acc.decisive_images,
                        flipped=acc.flipped,
                        threshold=acc.threshold,
                    )
                    if acc
                    else None,
                ),
            )
        )
    return write_bundle(req.out, meta, items, req.sign_key)
