"""``edgekit bench``'s engine: which candidates can run here, each run in its own process, in turns.

A candidate is one artifact of the bundle on its backend, with the profile's options and
a thread count.  Every candidate runs in a fresh worker process (``edgekit.bench.worker``)
per round (SingleStream back to back, then the camera-rate scenario at the device's frame
rate unless it is 0); with several rounds the candidates take turns, so that a noisy machine slows
all of them alike, and the latencies of a candidate's rounds are pooled.  What cannot
run here is listed with the reason, never silently left out.  The settings, candidates and
results are ``edgekit.bench.report``'s.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgekit.bench.loadgen import summarize
from edgekit.bench.report import BenchCandidate, Report, Result, Settings, Skipped
from edgekit.core.cpu import CpuFeatures, this_cpu
from edgekit.detection.agreement import DetectionAgreement, device_bar
from edgekit.device.pacing import fps_for_budget
from edgekit.device.profiles import PRECISIONS
from edgekit.errors import EdgekitError
from edgekit.selection.measured import THREAD_OPTION
from edgekit.selection.precision import int8_choice

log = logging.getLogger(__name__)

#: Every backend and precision ``edgekit bench`` looks for, so a missing one is listed with its reason.
BACKENDS = ("onnxruntime", "openvino", "litert", "tvm", "tensorrt")


class BenchError(EdgekitError):
    """A benchmark could not be set up or run."""


def host_facts() -> dict[str, Any]:
    """The machine the numbers come from."""
    import platform

    from edgekit.device.host import read_host

    h = read_host(probe_runtimes=False)
    return {
        "arch": h.arch,
        "cpu": h.cpu_model,
        "cores": h.cpu_count,
        "cpu_flags": list(h.cpu_flags),
        "cpu_capabilities": list(h.cpu_capabilities),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }


def plan(
    root: Path,
    backends: Sequence[str] = (),
    precisions: Sequence[str] = (),
    threads: Sequence[int] = (),
) -> tuple[list[BenchCandidate], list[Skipped]]:
    """The candidates of the bundle at ``root`` that can run here, and what was left out and why."""
    from edgekit.backends import registry
    from edgekit.bundle import read_manifest
    from edgekit.core.elf import host_arch
    from edgekit.device.profiles import Candidate as ProfileCandidate
    from edgekit.device.profiles import get_profile, pin_precision
    from edgekit.selection.matching import artifact_for, candidates_for
    from edgekit.selection.plan import backend_availability

    manifest = read_manifest(root)
    for b in backends:
        if b not in registry.names():
            raise BenchError(f"unknown backend {b!r}", f"known backends: {', '.join(registry.names())}")
    for p in precisions:
        if p not in PRECISIONS:
            raise BenchError(f"unknown precision {p!r}", f"use one of {', '.join(PRECISIONS)}")
    if any(t < 1 for t in threads):
        raise BenchError(f"thread counts must be 1 or more, got {list(threads)}", "for example --threads 1,2")
    want_b = tuple(backends) or BACKENDS
    want_p = tuple(precisions) or ("fp32", "bf16", "fp16", "int8")
    thread_counts = tuple(dict.fromkeys(threads)) or (os.cpu_count() or 1,)
    try:
        profile = get_profile(manifest.device.profile)
        options = {(c.backend, c.precision, c.variant): dict(c.options) for c in candidates_for(profile, ())}
    except EdgekitError:  # a bundle for a profile this edgekit does not know: backend defaults
        options = {}

    cands: list[BenchCandidate] = []
    skipped: list[Skipped] = []
    seen: set[tuple[str, str, str]] = set()
    for a in manifest.artifacts:
        if a.backend not in want_b or a.precision not in want_p:
            continue
        if a.kind in ("tflite-edgetpu", "tflite-edgetpu-src"):
            skipped.append(Skipped(a.backend, a.precision, "an Edge TPU model needs a Coral", a.name))
            continue
        if a.arch not in ("any", host_arch()):
            skipped.append(
                Skipped(a.backend, a.precision, f"built for {a.arch}, this host is {host_arch()}", a.name)
            )
            continue
        kind = (a.backend, a.precision, a.variant)
        base = options.get(kind) or pin_precision(a.backend, a.precision, {})
        probe = ProfileCandidate(a.backend, a.precision, base, variant=a.variant, requires=a.requires)
        if artifact_for(probe, (a,)) is None:
            skipped.append(Skipped(a.backend, a.precision, "not runnable on this CPU", a.name))
            continue
        # The CPU's capabilities first (int8-dot, bf16), then the runtime's own answer.
        avail = backend_availability(probe)
        if not avail.ok:
            skipped.append(
                Skipped(
                    a.backend, a.precision, avail.reason + (f" ({avail.hint})" if avail.hint else ""), a.name
                )
            )
            continue
        if kind in seen:
            continue
        seen.add(kind)
        for n in thread_counts:
            opts = dict(base)
            if a.backend in THREAD_OPTION:
                opts[THREAD_OPTION[a.backend]] = n
            gate = a.accuracy is None or a.accuracy.passed
            cands.append(
                BenchCandidate(
                    a.name,
                    a.backend,
                    a.precision,
                    n,
                    opts,
                    build_gate=gate,
                    caveat=caveat(a.backend, a.notes),
                    bar=device_bar(a, manifest.build.accuracy_threshold) if manifest.detection else None,
                )
            )
    have = {(a.backend, a.precision) for a in manifest.artifacts}
    for b in want_b:
        for p in want_p:
            # fp16 and bf16 exist only where a profile asks for them: listed as missing when asked.
            if (b, p) not in have and (backends or b != "tensorrt") and (precisions or p in ("fp32", "int8")):
                skipped.append(Skipped(b, p, _why_missing(manifest, b, p)))
    return cands, skipped


def caveat(backend: str, notes: dict[str, Any], cpu: CpuFeatures | None = None) -> str | None:
    """What to read next to an artifact's timings on ``cpu`` (this machine's by default), or ``None``.

    Only TVM has one: its speed is its tuned schedules', and those were timed on the CPU its
    notes name; on a CPU with other instruction-set flags they are not the fast ones.
    """
    if backend != "tvm":
        return None
    from edgekit.convert.tvm_cpu import runtime_caveat

    return runtime_caveat(notes, cpu or this_cpu())


def _why_missing(manifest: Any, backend: str, precision: str) -> str:
    """Why the bundle has no artifact for this backend/precision (the build notes it when it could not)."""
    for a in manifest.artifacts:
        note = a.notes.get(f"no-{backend}-{precision}")
        if note:
            return f"not built: {note}"
    return (
        f"the bundle has no {backend} {precision} artifact "
        f"(the {manifest.device.profile} profile does not ask for one)"
    )


Progress = Callable[[BenchCandidate, str, dict[str, Any]], None]


def frame_rate(settings: Settings, budget_ms: float) -> float:
    """The camera rate to measure at: ``settings.fps``, or the device's from its budget when None."""
    if settings.fps is not None:
        if settings.fps < 0:
            raise BenchError(
                f"--fps must be 0 or more, got {settings.fps:g}",
                "for example --fps 30 (0: back to back only)",
            )
        return settings.fps
    return fps_for_budget(budget_ms)


def _run_worker(
    root: Path, cand: BenchCandidate, settings: Settings, progress: Progress | None, fps: float = 0.0
) -> dict[str, Any]:
    """Run one worker process; return its loaded and result events plus the parent's start time."""
    spec = {
        "bundle": str(root),
        "artifact": cand.artifact,
        "options": cand.options,
        "min_queries": settings.min_queries,
        "min_duration_s": settings.min_duration_s,
        "max_duration_s": settings.max_duration_s,
        "warmup_s": settings.warmup_s,
        "warmup_queries": settings.warmup_queries,
        "fps": fps,
        "paced_queries": settings.paced_queries,
    }
    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    t_spawn = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgekit.bench.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    events: dict[str, Any] = {"t_spawn": t_spawn}
    # The paced run takes its schedule's time whatever the model: it adds to the worker's allowance.
    allowed = settings.timeout_s + (2 * (settings.paced_queries + 3) / fps if fps > 0 else 0.0)
    deadline = t_spawn + allowed
    try:
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a runtime printing to stdout: not ours
            kind = ev.get("event")
            if kind in ("loaded", "result", "error"):
                events[kind] = ev
            if progress is not None and kind in ("loaded", "progress", "pacing"):
                progress(cand, kind, ev)
            if time.monotonic() > deadline:
                proc.kill()
                events["error"] = {"message": f"still running after {allowed:.0f} s: stopped"}
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        events.setdefault("error", {"message": f"did not finish within {allowed:.0f} s"})
    stderr = proc.stderr.read() if proc.stderr else ""
    if "result" not in events and "error" not in events:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-1:] or [
            f"exit status {proc.returncode}"
        ]
        events["error"] = {"message": f"the worker died (exit {proc.returncode}): {tail[0][:300]}"}
    return events


def run(
    bundle_root: Path,
    candidates: Sequence[BenchCandidate],
    skipped: Sequence[Skipped],
    # Settings is a frozen dataclass, so one default shared by every call is safe.
    settings: Settings = Settings(),  # noqa: B008
    progress: Progress | None = None,
) -> Report:
    """Measure every candidate (each round: each in turn, in a fresh process) and summarize."""
    from edgekit.bundle import read_manifest

    manifest = read_manifest(bundle_root)
    fps = frame_rate(settings, manifest.device.budget_ms)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    results = {c.key: Result(c, fps=fps) for c in candidates}
    for _ in range(settings.rounds):
        for cand in candidates:
            res = results[cand.key]
            if res.error is not None:
                continue  # it failed once: do not spend every round on it
            ev = _run_worker(bundle_root, cand, settings, progress, fps)
            if "error" in ev:
                err = ev["error"]
                res.error = err["message"] + (f" ({err['hint']})" if err.get("hint") else "")
                log.warning("%s: %s", cand.key, res.error)
                if progress is not None:
                    progress(cand, "error", {"message": res.error})
                continue
            loaded, out = ev["loaded"], ev["result"]
            res.cold_start_s.append(loaded["t_first"] - ev["t_spawn"])
            res.cold_parts.append(
                {
                    "interpreter": loaded["t_main"] - ev["t_spawn"],
                    "imports": loaded["t_imported"] - loaded["t_main"],
                    "load": loaded["t_loaded"] - loaded["t_imported"],
                    "first_result": loaded["t_first"] - loaded["t_loaded"],
                }
            )
            res.latencies_ms += out["latencies_ms"]
            res.duration_s += out["duration_s"]
            res.cpu_s += out.get("cpu_s", 0.0)
            rss = out.get("peak_rss_mb")
            if rss is not None:
                res.peak_rss_mb = max(res.peak_rss_mb or 0.0, rss)
            res.top1, res.reference_top1 = out["top1"], out["reference_top1"]
            res.reference_margin = out.get("reference_margin", [])
            if out.get("detection") is not None:
                d = out["detection"]
                res.detection = DetectionAgreement(**{**d, "failing": tuple(d.get("failing", ()))})
                res.failing_frames = list(out.get("failing_frames", []))
            res.postprocess_ms += out.get("postprocess_ms", [])
            paced = out.get("paced") or {}
            res.paced_ms += paced.get("latencies_ms", [])
            res.paced_overruns += paced.get("overruns", 0)
            warm = out.get("paced_warm") or {}
            res.paced_warm_ms += warm.get("latencies_ms", [])
            res.paced_warm_overruns += warm.get("overruns", 0)
            res.warm_passes += warm.get("warm_passes", 0)
            if warm.get("warm_pass_ms") is not None:
                res.warm_pass_ms.append(warm["warm_pass_ms"])
            res.device = loaded.get("device", "")
            res.kernels = tuple(loaded.get("kernels", ()))
            if progress is not None:
                progress(cand, "done", {"queries": len(out["latencies_ms"])})
    for res in results.values():
        if res.latencies_ms:
            res.summary = summarize(res.latencies_ms, res.duration_s)
    return Report(
        bundle=str(bundle_root),
        model=manifest.model.name,
        profile=manifest.device.profile,
        budget_ms=manifest.device.budget_ms,
        host=host_facts(),
        settings=settings,
        results=list(results.values()),
        skipped=list(skipped),
        threshold=manifest.build.accuracy_threshold,
        started=started,
        wall_s=time.monotonic() - t0,
        int8=int8_choice(manifest, this_cpu()),
        task=manifest.model.task,
        fps=fps,
    )
