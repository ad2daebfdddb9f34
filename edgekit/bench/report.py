"""What ``edgekit bench`` measures and reports: the settings, the candidates, each one's pooled result.

``Result`` holds a candidate's rounds pooled and judges it by the build's and the health
gate's accuracy rule for the model's task; ``Report`` is a whole run, with the fastest
candidate that passes, as ``edgekit bench --json`` writes it.  ``edgekit.bench.runner``
plans the candidates and fills these in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edgekit.bench.loadgen import LatencySummary, label, min_queries, percentile
from edgekit.core.stats import agreement, median
from edgekit.detection.agreement import DetectionAgreement, DeviceBar
from edgekit.device.pacing import CameraRate, PacedRun, camera_rate


@dataclass(frozen=True)
class Settings:
    """How long each candidate runs (per round) and how many rounds there are.

    The defaults keep ``edgekit bench`` on a reference bundle under three minutes: each
    candidate runs until it has LoadGen's 662 queries for a p99 *and* ``min_duration_s``,
    but never past ``max_duration_s`` (a slow candidate then reports fewer queries and a
    p99 marked as underpowered).

    Then, with a frame rate, the camera-rate scenario: ``paced_queries`` queries issued at
    ``fps`` (``edgekit.device.pacing``).  ``fps`` None takes the device's rate from the
    bundle's budget (1000 / budget_ms: 30 fps at 33 ms); 0 runs back to back only.  At 30 fps
    the default 100 queries take about 3.4 s per candidate.
    """

    min_queries: int = min_queries(99.0)
    min_duration_s: float = 4.0
    max_duration_s: float = 15.0
    warmup_s: float = 0.5
    warmup_queries: int = 10
    rounds: int = 1
    timeout_s: float = 180.0  # one worker: load + warm-up + run, before it is killed and reported
    fps: float | None = None
    paced_queries: int = 100  # a p90 needs 64 (LoadGen's rule); 100 keeps a few seconds at 30 fps


@dataclass(frozen=True)
class BenchCandidate:
    """One thing to measure: an artifact of the bundle on its backend with these options and threads."""

    artifact: str
    backend: str
    precision: str
    threads: int
    options: dict[str, Any]
    #: False when the build's accuracy gate did not pass this artifact (shipped under --allow-accuracy-drop).
    build_gate: bool = True
    #: What to read next to its timings, from the artifact's notes: a TVM library whose schedules
    #: were tuned on another CPU than this one (``edgekit.convert.tvm_cpu.runtime_caveat``).
    caveat: str | None = None
    #: A detector's bar on the evaluation frames when it is not the build's rule at the report's
    #: threshold: an artifact the build gated on labelled images (``detection_gate.device_bar``).
    bar: DeviceBar | None = None

    @property
    def key(self) -> str:
        return f"{self.artifact}-t{self.threads}"


@dataclass(frozen=True)
class Skipped:
    """A backend/precision that was asked for (or is in the bundle) but cannot be measured here."""

    backend: str
    precision: str
    reason: str
    artifact: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "precision": self.precision,
            "artifact": self.artifact,
            "reason": self.reason,
        }


@dataclass
class Result:
    """What one candidate measured, its rounds pooled."""

    candidate: BenchCandidate
    latencies_ms: list[float] = field(default_factory=list)
    duration_s: float = 0.0
    cpu_s: float = 0.0
    cold_start_s: list[float] = field(default_factory=list)
    cold_parts: list[dict[str, float]] = field(default_factory=list)
    peak_rss_mb: float | None = None
    top1: list[int] = field(default_factory=list)
    reference_top1: list[int] = field(default_factory=list)
    #: The fp32 reference's top-2 probability margin on each frame (the tie rule's input).
    reference_margin: list[float] = field(default_factory=list)
    device: str = ""
    #: Kernels the backend chose beyond its runtime's own (``Session.kernels``), one line each.
    kernels: tuple[str, ...] = ()
    error: str | None = None
    summary: LatencySummary | None = None
    #: A detector's detections against the bundle's reference ones (``edgekit.detection.agreement``);
    #: None for a classifier, whose ``top1`` answers are compared instead.
    detection: DetectionAgreement | None = None
    #: The evaluation frames (file names) where a detector missed or invented a decisive detection.
    failing_frames: list[str] = field(default_factory=list)
    #: A detector's postprocess stage per frame (decode, NMS, boxes to frame pixels), timed apart
    #: from the queries, rounds pooled; empty for a classifier.
    postprocess_ms: list[float] = field(default_factory=list)
    #: The camera-rate scenario (rounds pooled): latencies of the queries issued at ``fps``, and
    #: how many overran their frame slot; empty at ``fps`` 0.
    fps: float = 0.0
    paced_ms: list[float] = field(default_factory=list)
    paced_overruns: int = 0
    #: The same schedule with warm passes before each query, as the frame loop runs it (rounds pooled).
    paced_warm_ms: list[float] = field(default_factory=list)
    paced_warm_overruns: int = 0
    warm_passes: int = 0
    warm_pass_ms: list[float] = field(default_factory=list)  # each round's median warm passes before a query

    @property
    def ok(self) -> bool:
        return self.error is None and self.summary is not None and self.summary.count > 0

    @property
    def camera_rate(self) -> CameraRate | None:
        """The paced run summarized, its wake-up cost against this candidate's back-to-back run."""
        if self.fps <= 0 or not self.paced_ms:
            return None
        warm = None
        if self.paced_warm_ms:
            pass_ms = median(self.warm_pass_ms) if self.warm_pass_ms else math.nan
            warm = PacedRun(
                self.fps, tuple(self.paced_warm_ms), self.paced_warm_overruns, 0.0, self.warm_passes, pass_ms
            )
        return camera_rate(self.fps, self.paced_ms, self.paced_overruns, self.latencies_ms, warm=warm)

    @property
    def ranking_ms(self) -> float:
        """What selection ranks by: the scenario the device will run (paced p90, else SingleStream p90)."""
        paced = self.camera_rate
        if paced is not None:
            return paced.headline_ms
        return self.summary.headline_ms if self.summary else float("inf")

    @property
    def agreement_kind(self) -> str:
        """What ``agreement`` compares: ``"detections"`` for a detector, ``"top1"`` for a classifier."""
        return "detections" if self.detection is not None else "top1"

    def passes(self, threshold: float) -> bool:
        """The accuracy gate on this host, the build's and the health gate's rule for the model's task.

        A detector passes when its agreement reaches ``threshold`` and it has no decisive extra
        detection (or, gated by its build on labelled images, when it does what it did there:
        ``detection_gate.device_bar``); a classifier when its top-1 agreement does
        (or when there were no evaluation frames to judge it on).
        """
        if self.detection is not None:
            return (self.candidate.bar or DeviceBar(threshold, 0)).passed(self.detection)
        rate = self.agreement
        return rate is None or rate >= threshold - 1e-9

    @property
    def agreement(self) -> float | None:
        """Agreement with the bundle's fp32 reference on its evaluation frames (None: no frames).

        For a detector, the share of the reference's decisive detections it matched (same
        class, IoU >= 0.5; ``edgekit.detection.agreement``).  For a classifier, top-1
        agreement by the build's and the health gate's rule (``edgekit.core.stats.agreement``):
        only the frames where fp32 is decisive count, or every frame when none is.  A frame
        without a stored margin counts as decisive.
        """
        if self.detection is not None:
            return self.detection.rate
        margins = self.reference_margin or [1.0] * len(self.reference_top1)
        kept = [
            (a, r, m)
            for a, r, m in zip(self.top1, self.reference_top1, margins, strict=False)
            if r >= 0  # -1: the grey stand-in frame of a bundle without evaluation frames
        ]
        return agreement([k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept]).rate

    def to_dict(self, with_samples: bool = False) -> dict[str, Any]:
        c = self.candidate
        cold = median(self.cold_start_s) if self.cold_start_s else None
        parts = (
            {k: round(median(p[k] for p in self.cold_parts), 4) for k in self.cold_parts[0]}
            if self.cold_parts
            else {}
        )
        out: dict[str, Any] = {
            "key": c.key,
            "artifact": c.artifact,
            "backend": c.backend,
            "precision": c.precision,
            "threads": c.threads,
            "options": c.options,
            "caveat": c.caveat,
            "device": self.device,
            "kernels": list(self.kernels),
            "ok": self.ok,
            "error": self.error,
            "summary": self.summary.to_dict() if self.summary else None,
            # CPU time of every thread of the process per query: on a shared machine it moves less
            # than wall time (it does not count waiting for a core), but it counts spinning threads.
            "cpu_ms_per_query": round(1e3 * self.cpu_s / len(self.latencies_ms), 4)
            if self.latencies_ms
            else None,
            "cold_start_s": round(cold, 4) if cold is not None else None,
            "cold_start_parts_s": parts,
            "peak_rss_mb": round(self.peak_rss_mb, 1) if self.peak_rss_mb is not None else None,
            # ``agreement`` is the gate's number for the model's task, ``agreement_kind`` says which;
            # ``top1_agreement`` stays for readers from before detectors (None for a detector: its
            # argmax would mean nothing, and a reader taking boxes for labels would be misled).
            "agreement": self.agreement,
            "agreement_kind": self.agreement_kind,
            "top1_agreement": self.agreement if self.detection is None else None,
            "eval_frames": sum(r >= 0 for r in self.reference_top1),
            "camera_rate": self.camera_rate.to_dict() if self.camera_rate else None,
        }
        if self.detection is not None:
            out["detection"] = {
                **self.detection.to_dict(),
                "failing_frames": list(self.failing_frames),
            }
        if self.postprocess_ms:
            ordered = sorted(self.postprocess_ms)
            out["postprocess"] = {
                "what": "decode + NMS + boxes to frame pixels, per frame, not in the query times",
                "count": len(ordered),
                **{f"{label(q)}_ms": round(percentile(ordered, q), 4) for q in (50.0, 90.0, 99.0)},
            }
        if with_samples:
            out["latencies_ms"] = [round(x, 4) for x in self.latencies_ms]
            if self.paced_ms:
                out["paced_latencies_ms"] = [round(x, 4) for x in self.paced_ms]
            if self.paced_warm_ms:
                out["paced_warm_latencies_ms"] = [round(x, 4) for x in self.paced_warm_ms]
        return out


@dataclass
class Report:
    """A whole ``edgekit bench`` run."""

    bundle: str
    model: str
    profile: str
    budget_ms: float
    host: dict[str, Any]
    settings: Settings
    results: list[Result]
    skipped: list[Skipped]
    threshold: float
    started: str
    wall_s: float = 0.0
    #: The int8 artifact a device with this CPU takes, and why (``precision.int8_pick``).
    int8: dict[str, Any] | None = None
    #: The manifest's ``model.task``: what the candidates' agreement compares.
    task: str = "classification"
    #: The camera-rate scenario's frame rate (0: back to back only, ranked by SingleStream).
    fps: float = 0.0

    @property
    def ranked_by(self) -> str:
        """The scenario ``fastest`` ranks by: the one the device will run."""
        return f"camera rate {self.fps:g} fps, p90" if self.fps > 0 else "SingleStream p90"

    def gated(self) -> list[Result]:
        """Candidates that ran and agree with fp32 at least as well as the bundle's accuracy gate asks."""
        return [r for r in self.results if r.ok and r.candidate.build_gate and r.passes(self.threshold)]

    def fastest(self) -> Result | None:
        """The gated candidate with the lowest p90 in the scenario the device will run.

        At a camera rate that is the paced p90: a runtime that is fastest back to back but
        slow to wake after the idle gap between frames is not the one to run at 30 fps.
        """
        ok = self.gated()
        return min(ok, key=lambda r: r.ranking_ms) if ok else None

    def to_dict(self, with_samples: bool = False) -> dict[str, Any]:
        best = self.fastest()
        passed = {r.candidate.key for r in self.gated()}
        candidates = []
        for r in self.results:
            row = r.to_dict(with_samples)
            # Ran, passed the build's gate and agrees here: what --write-selection may choose.
            row["passed_gate"] = r.candidate.key in passed
            candidates.append(row)
        return {
            "bundle": self.bundle,
            "model": self.model,
            "task": self.task,
            "profile": self.profile,
            "budget_ms": self.budget_ms,
            "host": self.host,
            "started": self.started,
            "wall_s": round(self.wall_s, 2),
            "scenario": "SingleStream",
            "camera_rate_fps": round(self.fps, 3),
            "ranked_by": self.ranked_by,
            "settings": {
                "min_queries": self.settings.min_queries,
                "min_duration_s": self.settings.min_duration_s,
                "max_duration_s": self.settings.max_duration_s,
                "warmup_s": self.settings.warmup_s,
                "rounds": self.settings.rounds,
                "paced_queries": self.settings.paced_queries if self.fps > 0 else 0,
            },
            "accuracy_threshold": self.threshold,
            "fastest": best.candidate.key if best else None,
            "int8": self.int8,
            "candidates": candidates,
            "skipped": [s.to_dict() for s in self.skipped],
        }
