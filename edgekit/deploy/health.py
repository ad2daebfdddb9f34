"""The health gate: before a bundle is activated, it must run here, fast enough and right enough.

The bundle is loaded exactly as ``edgekit run`` will load it (``edgekit.load`` with the
device profile's selection, so the artifact checked is the artifact that will run), warmed
up, then its evaluation frames (``eval/``, JPEGs written by the build) are run through the
whole frame path: decode, preprocess, infer.  It passes when

* p99 of the per-frame latency is within the bundle's budget (``device.budget_ms``), and
* top-1 agrees with the manifest's fp32 reference on at least the build's accuracy
  threshold (``build.accuracy_threshold``, 0.98 by default) of the frames.  As in the
  build's gate, frames where fp32 itself was undecided (margin under ``TIE_MARGIN``) are
  reported but do not count, unless no frame is decisive (``edgekit.core.stats.agreement``).
  For a detector (``model.task == "detection"``) the frames' detections are compared with
  the reference detections the bundle carries by the build's own rule
  (``edgekit.detection.agreement``): decisive reference detections matched at IoU >= 0.5
  on at least the threshold's share, and no decisive extra; the timed frame includes
  decoding and NMS.

Percentiles are LoadGen's over the timed runs (``edgekit.core.stats.percentile``, the
benchmark's rule too), never averaged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.stats import agreement, percentile
from edgekit.errors import EdgekitError
from edgekit.protocol import messages

if TYPE_CHECKING:
    from edgekit.bundle.manifest import ArtifactEntry, EvalFrame, Manifest
    from edgekit.detection.agreement import DetectionAgreement
    from edgekit.detection.detector import Detection
    from edgekit.model import Model

# Timed frames: LoadGen's p99 (index floor(0.99 n) of the sorted runs) leaves the slowest run
# out from 101 runs on, so one outlier on a busy device does not fail the gate.
DEFAULT_RUNS = 101
DEFAULT_WARMUP = 3


@dataclass(frozen=True)
class HealthReport:
    """What the health gate measured, and whether the bundle passed (``reason`` says why not)."""

    ok: bool
    reason: str = ""
    hint: str = ""
    p50_ms: float | None = None
    p99_ms: float | None = None
    budget_ms: float | None = None
    top1_agreement: float | None = None
    threshold: float | None = None
    frames: int = 0
    decisive_frames: int = 0
    runs: int = 0
    flipped: tuple[str, ...] = field(default=())
    backend: str | None = None
    precision: str | None = None
    candidate: str | None = None
    load_ms: float | None = None
    #: A detector's numbers (matched, missed, extra, IoU); None for a classifier.  On the wire as
    #: ``detection`` (matched, decisive, missed, extra, mean IoU); ``top1_agreement`` carries its
    #: agreement (matched / decisive), as an agent from before detection can read it.
    detection: DetectionAgreement | None = None

    def to_message(self) -> messages.HealthReport:
        """The wire form (what a ``cmd/result`` carries as ``health``): rounded, ``hint`` left out.

        A classifier's report has no ``detection`` field at all (not a null), so it reads as it did.
        """
        extra: dict[str, Any] = {}
        if self.detection is not None:
            d = self.detection
            extra["detection"] = messages.HealthDetection(
                matched=d.matched,
                decisive=d.decisive,
                missed=d.missed,
                extra=d.extra,
                mean_iou=min(1.0, max(0.0, round(d.mean_iou, 4))),
            )
        return messages.HealthReport(
            ok=self.ok,
            p50_ms=_round(self.p50_ms),
            p99_ms=_round(self.p99_ms),
            budget_ms=self.budget_ms,
            top1_agreement=_round(self.top1_agreement, 4),
            threshold=self.threshold,
            frames=self.frames,
            decisive_frames=self.decisive_frames,
            runs=self.runs,
            flipped=list(self.flipped),
            backend=self.backend,
            precision=self.precision,
            candidate=self.candidate,
            load_ms=_round(self.load_ms, 1),
            reason=self.reason or None,
            **extra,
        )

    def to_dict(self) -> dict[str, Any]:
        """The numbers as plain data: ``p50_ms, p99_ms, budget_ms, top1_agreement, frames, backend, precision`` and more."""
        return messages.dump(self.to_message())


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def check_health(
    bundle: Path,
    profile: str | None = None,
    trusted_keys: Sequence[Path] = (),
    *,
    runs: int = DEFAULT_RUNS,
    warmup: int = DEFAULT_WARMUP,
    budget_ms: float | None = None,
) -> HealthReport:
    """Run the health gate on the bundle folder ``bundle`` for device ``profile`` (None: detect this host).

    Returns a report; raises nothing for a bundle that does not load or run (that is a
    failed gate, with the runtime's reason).
    """
    import cv2
    import numpy as np

    from edgekit.bundle import read_manifest
    from edgekit.model import load
    from edgekit.selection.matching import artifact_for

    try:
        manifest = read_manifest(bundle)
    except EdgekitError as err:
        return HealthReport(False, err.message, err.hint)
    # The device's own budget when it runs the pipeline at another one (agent --budget), else the bundle's.
    budget = budget_ms if budget_ms is not None else manifest.device.budget_ms
    threshold = manifest.build.accuracy_threshold
    evals = manifest.eval_set
    if evals is None:
        return HealthReport(
            False,
            "the bundle carries no evaluation frames, so its accuracy on this device cannot be checked",
            "rebuild it with this edgekit version (edgekit build writes eval/ frames into every bundle)",
            budget_ms=budget,
            threshold=threshold,
        )
    frames = []
    for f in evals.frames:
        # The path was validated (under eval/) and, by the install's verify step, hashed.
        image = cv2.imdecode(np.frombuffer((bundle / f.path).read_bytes(), np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            return HealthReport(
                False, f"evaluation frame {f.path} cannot be decoded", "rebuild the bundle", budget_ms=budget
            )
        frames.append(image)

    t0 = time.perf_counter()
    try:
        model = load(bundle, device=profile or "auto", trusted_keys=trusted_keys, require_signature=True)
    except EdgekitError as err:
        return HealthReport(
            False,
            f"the bundle does not load here: {err.message}",
            err.hint,
            budget_ms=budget,
            threshold=threshold,
        )
    load_ms = (time.perf_counter() - t0) * 1000
    with model:
        cand = next((c for c in model.candidates if c.key == model.candidate), None)
        backend, precision, candidate = model.backend, cand.precision if cand else None, model.candidate
        measured_here = model.selection.how in ("measured", "cached")
        try:
            for _ in range(warmup):
                model.infer(frames[0])
            times: list[float] = []
            got: list[int] = []
            found: list[tuple[Detection, ...]] = []
            detect = _detector(model) if manifest.detection is not None else None
            for i in range(max(runs, len(frames))):
                frame = frames[i % len(frames)]
                start = time.perf_counter()
                if detect is None:
                    row = model.infer(frame)
                else:
                    dets = detect(frame)
                times.append((time.perf_counter() - start) * 1000)
                if i < len(frames):
                    if detect is None:
                        got.append(int(np.argmax(row)))
                    else:
                        found.append(dets)
        except EdgekitError as err:
            return HealthReport(
                False,
                f"the bundle loads but does not run here: {err.message}",
                err.hint,
                budget_ms=budget,
                threshold=threshold,
                backend=backend,
                precision=precision,
                candidate=candidate,
            )
    ordered = sorted(times)
    p50, p99 = percentile(ordered, 50), percentile(ordered, 99)
    if manifest.detection is not None:
        return _detection_report(
            manifest,
            evals.frames,
            found,
            p50=p50,
            p99=p99,
            budget=budget,
            runs=len(times),
            backend=backend,
            precision=precision,
            candidate=candidate,
            artifact=artifact_for(cand, manifest.artifacts) if cand else None,
            load_ms=load_ms,
            profile=profile,
            measured_here=measured_here,
        )
    agreed = agreement(got, [f.top1 for f in evals.frames], [f.margin for f in evals.frames])
    rate = agreed.rate if agreed.rate is not None else 0.0  # never None: a bundle has at least one frame
    flipped = agreed.flipped_names([Path(f.path).name for f in evals.frames])
    problems = []
    if p99 > budget:
        problems.append(f"p99 {p99:.1f} ms is over the budget of {budget:g} ms")
    if rate < threshold:
        problems.append(
            f"top-1 agrees with the fp32 reference on {rate:.0%} of {agreed.counted} frames, "
            f"under the build's threshold of {threshold:.0%} (flipped: {', '.join(flipped)})"
        )
    slow_only = p99 > budget and rate >= threshold  # measuring again cannot mend an accuracy failure
    hint = _hint(manifest, profile, candidate, measured_here, slow_only) if problems else ""
    return HealthReport(
        ok=not problems,
        reason="; ".join(problems),
        hint=hint,
        p50_ms=p50,
        p99_ms=p99,
        budget_ms=budget,
        top1_agreement=rate,
        threshold=threshold,
        frames=len(frames),
        decisive_frames=agreed.counted,
        runs=len(times),
        flipped=flipped,
        backend=backend,
        precision=precision,
        candidate=candidate,
        load_ms=load_ms,
    )


def _hint(manifest: Manifest, profile: str | None, candidate: str | None, measured: bool, slow: bool) -> str:
    """What to do about a failed gate: measure the choice again when only latency failed and the bundle
    already fits this device (``slow``: too slow, accurate enough; ``measured``: chosen by measuring here).

    A bundle built for this very profile whose chosen artifact is too slow was most likely chosen
    by a measurement on a busy host (edgekit.selection.candidate_timing): rebuilding it builds the same.
    """
    from edgekit.device.host import match_profile
    from edgekit.device.profiles import get_profile

    if slow and measured:
        try:
            here = get_profile(profile).name if profile else match_profile().name
        except EdgekitError:
            here = ""
        if here == manifest.device.profile:
            return (
                f"the bundle is built for {here} and this device chose {candidate} by measuring: "
                "measure the candidates again (edgekit select --measure BUNDLE) on a quiet device, "
                "or give the budget it can hold (edgekit deploy --budget MS)"
            )
    budget = (
        "; or, if this device cannot do better, give the budget it can hold "
        "(edgekit deploy --budget MS, edgekit agent run --budget MS)"
        if slow
        else ""
    )
    return (
        f"the {candidate} artifact is what this device selects: rebuild the bundle, "
        f"or deploy one built for this device's profile{budget}"
    )


def _detector(model: Model) -> Any:
    """Frame (BGR) -> the model's detections, decoded as the gates compare them (lowered threshold)."""
    from edgekit.detection.agreement import gate_detector

    assert model.manifest.detection is not None
    return gate_detector(model.session, model.manifest.detection, model.preprocess, model.labels)


def _detection_report(
    manifest: Manifest,
    frames: Sequence[EvalFrame],
    found: Sequence[Sequence[Detection]],
    *,
    p50: float,
    p99: float,
    budget: float,
    runs: int,
    backend: str | None,
    precision: str | None,
    candidate: str | None,
    artifact: ArtifactEntry | None,
    load_ms: float,
    profile: str | None,
    measured_here: bool,
) -> HealthReport:
    """A detector's verdict: its detections on the eval frames against the bundle's reference ones."""
    from edgekit.detection.agreement import compare_frame, device_bar, reference_detections, summarize

    head = manifest.detection
    assert head is not None
    labels = manifest.labels
    threshold = manifest.build.accuracy_threshold
    compared = []
    for f, got in zip(frames, found, strict=True):
        reference = reference_detections(f.detections, labels)
        # The head as the bundle has it, as the build's gate passes it: decisive means its threshold
        # plus the margin.  (Passing widened(head) would make the threshold itself decisive, and an
        # int8 artifact's detection scoring exactly the threshold where fp32 has none an extra.)
        compared.append(compare_frame(reference, got, head))
    result = summarize(compared)
    failing = tuple(
        f"{Path(frames[i].path).name} (missed {compared[i].missed}, extra {compared[i].extra})"
        for i in result.failing
    )
    # The build's rule, or what the build saw where it gated this artifact on labelled images.
    bar = device_bar(artifact, threshold)
    accurate = bar.passed(result)
    problems = []
    if p99 > budget:
        problems.append(f"p99 {p99:.1f} ms is over the budget of {budget:g} ms")
    if not accurate:
        problems.append(
            f"detections match {result.matched} of the fp32 reference's {result.decisive} decisive ones "
            f"({result.rate:.0%}, at least {bar.agreement:.0%} asked) with {result.extra} extra "
            f"({bar.extra or 'none'} allowed) on {len(frames)} frames ({', '.join(failing)})"
        )
    return HealthReport(
        ok=not problems,
        reason="; ".join(problems),
        hint=_hint(manifest, profile, candidate, measured_here, p99 > budget and accurate)
        if problems
        else "",
        p50_ms=p50,
        p99_ms=p99,
        budget_ms=budget,
        top1_agreement=result.rate,
        threshold=threshold,
        frames=len(frames),
        decisive_frames=sum(1 for c in compared if c.decisive),
        runs=runs,
        flipped=failing,
        backend=backend,
        precision=precision,
        candidate=candidate,
        load_ms=load_ms,
        detection=result,
    )
