"""Latency statistics of a run: whole-run sketches, a recent window for the live view, the summary.

The summary follows MLPerf LoadGen's ``mlperf_log_summary.txt``: count, duration, QPS,
min/max/mean and the p50/p90/p95/p99/p99.9 of the end-to-end latency, then each stage.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from edgekit.core.sketch import LatencySketch
from edgekit.core.stats import PERCENTILES as REPORTED
from edgekit.core.stats import percentile
from edgekit.core.tally import FrameTally, SourceHealth
from edgekit.pipeline.records import Counters, FrameRecord
from edgekit.protocol.stages import STAGES

#: The percentiles the summary (and ``edgekit run --json``) reports: edgekit's list less p97.
PERCENTILES: tuple[float, ...] = tuple(q for q in REPORTED if q != 97.0)


class RunStats:
    """Sketches of every stage and of the latency over the whole run, and the last ``window`` records."""

    def __init__(self, window: int = 300) -> None:
        self.latency = LatencySketch()
        self.stages = {s: LatencySketch() for s in STAGES}
        self.recent: deque[FrameRecord] = deque(maxlen=window)

    def add(self, record: FrameRecord) -> None:
        self.latency.add(record.latency_ms)
        for stage, ms in record.stage_ms().items():
            self.stages[stage].add(ms)
        self.recent.append(record)

    def window(self) -> dict[str, Any]:
        """p50/p99 per stage and of the latency over the recent window, and its frame rate."""
        recs = list(self.recent)
        out: dict[str, Any] = {"frames": len(recs), "fps": math.nan}
        if len(recs) >= 2:
            span = (recs[-1].captured_ns - recs[0].captured_ns) / 1e9
            out["fps"] = (len(recs) - 1) / span if span > 0 else math.nan
        for name in ("latency", *STAGES):
            vals = [r.latency_ms if name == "latency" else getattr(r, f"{name}_ms") for r in recs]
            vals.sort()
            out[name] = {"p50": percentile(vals, 50), "p99": percentile(vals, 99)}
        return out


@dataclass(kw_only=True)
class CameraStats(FrameTally):
    """One camera's share of a many-camera run: its tally, its budget and policy, how it ended.

    Its ``dropped`` follows the camera's slot (set by the loop, drops after its last frame
    included), so a frame is counted with ``count(latency_ms, met)`` alone.
    """

    budget_ms: float = math.nan  # the camera's own budget, or the pipeline's
    policy: str = ""  # its overload policy
    ended: str = ""
    #: How its source kept delivering (set when the run is summed up; ``Pipeline.health`` is live).
    health: SourceHealth = field(default_factory=SourceHealth)

    def to_dict(self) -> dict[str, Any]:
        def r(x: float) -> float | None:
            return None if math.isnan(x) else round(x, 4)

        return {
            "budget_ms": r(self.budget_ms),
            "policy": self.policy,
            "frames": self.frames,
            "met": self.met,
            "missed": self.missed,
            "dropped": self.dropped,
            "ended": self.ended or None,
            "latency_ms": {f"p{p:g}": r(self.latency.quantile(p / 100)) for p in (50, 90, 99)},
            "health": self.health.to_dict(),
        }


@dataclass(frozen=True)
class Summary:
    """The end-of-run report (``to_dict`` for ``--json``, ``render`` for people)."""

    model: str
    candidate: str
    source: str
    source_kind: str
    policy: str
    budget_ms: float
    duration_s: float
    counters: dict[str, int]
    latency: dict[str, float]
    stages: dict[str, dict[str, float]]
    candidates_used: dict[str, int] = field(default_factory=dict)
    ended_by: str = ""
    #: Per camera, for a pipeline of many (``CameraStats.to_dict``); empty for one source.
    cameras: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Batching of many cameras' frames: the largest batch allowed and the mean frames per inference.
    batch: dict[str, float] = field(default_factory=lambda: {"max": 1, "mean": 1.0})
    #: How the sources kept delivering, together (``SourceHealth.to_dict``): outages, stalls, time without frames.
    health: dict[str, Any] = field(default_factory=lambda: SourceHealth().to_dict())
    #: Frames each queued sink lost to its full queue, and frames each sink raised on, by sink name.
    sink_dropped: dict[str, int] = field(default_factory=dict)
    sink_errors: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, stats: RunStats, counters: Counters, duration_s: float, **meta: Any) -> Summary:
        def describe(s: LatencySketch) -> dict[str, float]:
            d = {f"p{p:g}": s.quantile(p / 100) for p in PERCENTILES}
            d.update(min=s.min, max=s.max, mean=s.mean)
            return d

        return cls(
            duration_s=duration_s,
            counters=counters.to_dict(),
            latency=describe(stats.latency),
            stages={s: describe(sk) for s, sk in stats.stages.items()},
            **meta,
        )

    @property
    def frames(self) -> int:
        return self.counters["frames"]

    @property
    def qps(self) -> float:
        return self.frames / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def valid(self) -> bool:
        """LoadGen's verdict, for a frame budget: the p99 latency is within the budget."""
        return self.frames > 0 and self.latency["p99"] <= self.budget_ms

    def to_dict(self) -> dict[str, Any]:
        def clean(d: dict[str, float]) -> dict[str, float | None]:
            return {k: (None if math.isnan(v) else round(v, 4)) for k, v in d.items()}

        return {
            "model": self.model,
            "candidate": self.candidate,
            "candidates_used": self.candidates_used,
            "source": self.source,
            "source_kind": self.source_kind,
            "policy": self.policy,
            "budget_ms": self.budget_ms,
            "result": "VALID" if self.valid else "INVALID",
            "ended_by": self.ended_by,
            "frames": self.frames,
            "duration_s": round(self.duration_s, 4),
            "qps": None if math.isnan(self.qps) else round(self.qps, 3),
            "counters": self.counters,
            "miss_rate": round(self.counters["missed"] / self.frames, 6) if self.frames else None,
            "latency_ms": clean(self.latency),
            "stages_ms": {s: clean(v) for s, v in self.stages.items()},
            "sketch_relative_accuracy": 0.01,
            **({"cameras": self.cameras} if self.cameras else {}),
            "batch": self.batch,
            "health": self.health,
            **({"sink_dropped": self.sink_dropped} if self.sink_dropped else {}),
            **({"sink_errors": self.sink_errors} if self.sink_errors else {}),
        }

    def render(self) -> str:
        """LoadGen-style text: a header, the verdict, the latency lines, the per-stage table."""
        c = self.counters
        lat = self.latency
        rule = "=" * 64
        lines = [
            rule,
            "edgekit pipeline summary",
            rule,
            f"Model            : {self.model} ({self.candidate})",
            f"Source           : {self.source} ({self.source_kind})",
            f"Policy / budget  : {self.policy} / {self.budget_ms:g} ms",
            f"Result           : {'VALID' if self.valid else 'INVALID'}"
            f" (p99 {'<=' if self.valid else '>'} budget)"
            + (f"; ended by {self.ended_by}" if self.ended_by else ""),
            "",
            f"Frames labelled  : {self.frames}",
            f"Duration (s)     : {self.duration_s:.2f}",
            f"QPS (frames/s)   : {self.qps:.2f}",
            f"Deadline misses  : {c['missed']}"
            + (f" ({c['missed'] / self.frames:.2%})" if self.frames else ""),
            f"Frames dropped   : {c['dropped']}",
            f"Source outages   : {c['source_outages']} (reopened {c['source_reopens']})"
            + (f", {c['source_stalls']} stalled" if c.get("source_stalls") else "")
            + (f", {self.health['down_s']:.1f} s without frames" if self.health.get("down_s") else ""),
        ]
        if c["degrade_switches"]:
            used = ", ".join(f"{k} x{v}" for k, v in self.candidates_used.items())
            lines.append(f"Degrade switches : {c['degrade_switches']} ({used})")
        if self.batch["max"] > 1:
            lines.append(
                f"Batching         : up to {self.batch['max']:g} frames, {self.batch['mean']:.2f} per inference"
            )
        for name, cam in self.cameras.items():
            p99 = cam["latency_ms"]["p99"]
            own = [
                *([f"budget {cam['budget_ms']:g} ms"] if cam["budget_ms"] != self.budget_ms else []),
                *([cam["policy"]] if cam["policy"] != self.policy else []),
                *([cam["ended"]] if cam["ended"] else []),
            ]
            lines.append(
                f"Camera {name:<10}: {cam['frames']} frames, {cam['missed']} missed, {cam['dropped']} dropped, "
                f"p99 {'-' if p99 is None else f'{p99:.2f}'} ms" + (f" ({'; '.join(own)})" if own else "")
            )
        for key, label in (
            ("source_corrupt", "Corrupt frames"),
            ("converted", "Frames converted"),
            ("size_changes", "Size changes"),
            ("unreadable", "Unreadable"),
        ):
            if c.get(key):
                lines.append(f"{label:<17}: {c[key]}")
        lines += [
            "",
            "End-to-end latency (capture -> sink), ms",
            f"Min latency      : {lat['min']:.3f}",
            f"Max latency      : {lat['max']:.3f}",
            f"Mean latency     : {lat['mean']:.3f}",
        ]
        for p in PERCENTILES:
            lines.append(f"{p:05.2f} percentile : {lat[f'p{p:g}']:.3f}")
        lines += [
            "",
            f"{'stage (ms)':<14}" + "".join(f"{h:>9}" for h in ("p50", "p90", "p99", "p99.9", "max", "mean")),
        ]
        for stage, d in self.stages.items():
            lines.append(
                f"{stage:<14}"
                + "".join(f"{d[k]:>9.3f}" for k in ("p50", "p90", "p99", "p99.9", "max", "mean"))
            )
        lines.append(rule)
        return "\n".join(lines)
