"""``edgekit bench``'s camera-rate scenario on a real (tiny) bundle, and selection by the scenario the device runs.

The "slow only when paced" candidate is a stand-in (``ColdWakeSession``: the real session,
plus a long sleep on the first query after an idle gap, as a runtime whose threads have
parked pays), so the test never depends on how fast this machine is.
"""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from stand_in import SlowSession

from edgekit.backends import registry
from edgekit.backends.base import Session
from edgekit.bench import worker
from edgekit.bench.loadgen import summarize
from edgekit.bench.recording import selection_from, write_selection
from edgekit.bench.render import legend, table
from edgekit.bench.report import BenchCandidate, Report, Result, Settings
from edgekit.bundle import read_manifest
from edgekit.core.elf import host_arch
from edgekit.device.pacing import WARM_MAX_DUTY, WARM_MAX_PASSES
from edgekit.device.profiles import get_profile
from edgekit.selection.matching import candidates_for
from edgekit.selection.measured import measured_order

import tiny_model
from conftest import ROOT
from conftest import edgekit as run_edgekit

pytestmark = pytest.mark.slow

LABELS = tuple(f"thing {i}" for i in range(tiny_model.NUM_CLASSES))
# Short runs: the scenario's presence and ranking are tested here, not its statistics.
QUICK = ("--min-queries", "20", "--min-duration", "0", "--max-duration", "2", "--threads", "1")


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    """The tiny classifier for x86_64-cpu, fp32 on ONNX Runtime and OpenVINO, signed by the run's builder key."""
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    out = tmp_path_factory.mktemp("camera-rate")
    onnx = tiny_model.write_onnx(out / "tiny.onnx", tiny_model.make_weights())
    labels = out / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    card = card_for_file(
        onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0), labels=labels, resize="squash"
    )
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=out / "bundle",
        onnx=onnx,
        backends=("onnxruntime", "openvino"),
        precisions=("fp32",),
        use_cache=False,
        measure_latency=False,
        sign_key=keys[0],
    )
    bundle: Path = build(req).bundle
    return bundle


def bench(env: dict[str, str], bundle: Path, *args: str) -> dict[str, Any]:
    r = run_edgekit(env, "bench", str(bundle), *QUICK, *args, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def test_bench_reports_the_camera_rate_beside_single_stream(
    tiny_bundle: Path, cache_env: dict[str, str]
) -> None:
    budget = read_manifest(tiny_bundle).device.budget_ms
    report = bench(cache_env, tiny_bundle, "--paced-queries", "8")
    # No --fps: the device's rate, one frame per budget.
    fps = round(1000 / budget, 3)
    assert report["camera_rate_fps"] == fps
    assert report["ranked_by"] == f"camera rate {1000 / budget:g} fps, p90"
    assert report["settings"]["paced_queries"] == 8
    ran = [c for c in report["candidates"] if c["ok"]]
    assert {c["artifact"] for c in ran} == {"onnxruntime-fp32", "openvino-fp32"}
    for c in ran:
        paced = c["camera_rate"]
        assert set(paced) == {
            *("fps", "queries", "p50_ms", "p90_ms", "p99_ms", "overruns", "wakeup_ms"),
            *("cold_p50_ms", "warm_pass_ms"),
        }
        assert paced["fps"] == fps and paced["queries"] == 8
        assert 0 < paced["p50_ms"] <= paced["p90_ms"] <= paced["p99_ms"]
        assert isinstance(paced["overruns"], int) and 0 <= paced["overruns"] <= 8
        # The headline is the warm run's (how many passes fit is this machine's business: the
        # rule is checked on stand-ins of set latency below).
        assert paced["warm_pass_ms"] > 0
        # The wake-up cost is the cold paced p50 less the back-to-back p50 of the same candidate.
        assert paced["wakeup_ms"] == pytest.approx(paced["cold_p50_ms"] - c["summary"]["p50_ms"], abs=2e-4)
        assert c["summary"]["count"] >= 20  # SingleStream is still there, as before
    gated = [c for c in ran if c["passed_gate"]]
    assert report["fastest"] == min(gated, key=lambda c: c["camera_rate"]["p90_ms"])["key"]

    text = io.StringIO()
    console = Console(file=text, width=200, color_system=None)
    console.print(table(report))
    console.print(legend(report))
    shown = text.getvalue()
    assert f"{1000 / budget:g}fps p50" in shown and "wake" in shown and "over" in shown
    assert "what selection ranks by" in shown

    # The performance report's camera-rate rows, from the same JSON.
    spec = importlib.util.spec_from_file_location("perf_report", ROOT / "tools" / "perf_report.py")
    assert spec is not None and spec.loader is not None
    perf_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(perf_report)
    rows = perf_report.camera_rate_rows(report)
    assert rows[0].startswith(f"## At the camera rate ({1000 / budget:g} fps")
    body = [r for r in rows if r.startswith("| ") and "---" not in r][1:]
    assert len(body) == len(ran) and sum("✓" in r for r in body) == 1
    assert "✓" in next(r for r in body if r.startswith(f"| {report['fastest']}"))
    assert perf_report.camera_rate_rows({**report, "camera_rate_fps": 0}) == []


def test_warm_passes_run_while_they_fit_their_share_of_the_period(tiny_bundle: Path) -> None:
    """The warm-pass rule on stand-ins of set latency: as many passes as fit in ``WARM_MAX_DUTY``
    of the period, at most ``WARM_MAX_PASSES``; none once not even one fits."""
    manifest = read_manifest(tiny_bundle)
    art = manifest.artifact("onnxruntime-fp32")
    real = registry.get(art.backend).load(tiny_bundle / art.path, {})
    spec = real.inputs[0]
    samples = [np.zeros([d or 1 for d in spec.shape], spec.dtype)]
    try:
        # 5 fps: 200 ms frames, 67 ms for warm passes; a pass of 4 ms and more: the cap of three fits.
        fits = worker.paced_queries(SlowSession(real, 4), samples, 5.0, 8)["paced_warm"]
        # 10 fps: 33 ms for warm passes; a pass of 50 ms and more never fits.
        over = worker.paced_queries(SlowSession(real, 50), samples, 10.0, 8)["paced_warm"]
    finally:
        real.close()
    bursts = 3 + 8 - 1  # one before each query (warm-up ones too) but the first
    assert 4 * WARM_MAX_PASSES <= 1000 / 5 * WARM_MAX_DUTY  # the premise: three fit
    # The first burst is one pass (nothing timed yet), every later one the cap.
    assert fits["warm_passes"] == 1 + (bursts - 1) * WARM_MAX_PASSES
    assert fits["warm_pass_ms"] >= 4 * WARM_MAX_PASSES  # a burst's median: three passes of 4 ms or more
    # Too slow: the one pass tried before anything was timed, then none.
    assert over["warm_passes"] == 1


def test_fps_zero_is_back_to_back_only(tiny_bundle: Path, cache_env: dict[str, str]) -> None:
    report = bench(cache_env, tiny_bundle, "--fps", "0")
    assert report["camera_rate_fps"] == 0 and report["ranked_by"] == "SingleStream p90"
    assert all(c["camera_rate"] is None for c in report["candidates"])
    gated = [c for c in report["candidates"] if c["passed_gate"]]
    assert report["fastest"] == min(gated, key=lambda c: c["summary"]["p90_ms"])["key"]


def test_a_negative_fps_is_refused_with_a_hint(tiny_bundle: Path, cache_env: dict[str, str]) -> None:
    r = run_edgekit(cache_env, "bench", str(tiny_bundle), "--fps", "-5")
    assert r.returncode != 0
    assert "--fps must be 0 or more" in r.stderr and "hint" in r.stderr


class ColdWakeSession(SlowSession):
    """A real session that is fast back to back and slow after an idle gap: a cold wake-up, made to order.

    A run that starts more than ``idle_ms`` after the last one ended sleeps ``cold_ms``,
    any other sleeps ``warm_ms`` (after the real inference, on the real input).
    """

    def __init__(self, inner: Session, warm_ms: float, cold_ms: float, idle_ms: float) -> None:
        super().__init__(inner, warm_ms)
        self.cold_s, self.idle_s = cold_ms / 1e3, idle_ms / 1e3
        self.last_end: float | None = None

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        idle = self.last_end is not None and time.monotonic() - self.last_end > self.idle_s
        out = self.inner.run(*arrays)
        time.sleep(self.cold_s if idle else self.latency_s)
        self.last_end = time.monotonic()
        return out


FPS = 20.0  # 50 ms frames: the idle gap (~30 ms and more) is far over ColdWakeSession's 10 ms


def measure(cand: BenchCandidate, session: Session) -> Result:
    """The worker's two scenarios on ``session``, pooled into a ``Result`` as the runner pools them."""
    spec = session.inputs[0]
    samples = [np.zeros([d or 1 for d in spec.shape], spec.dtype)]
    lat, duration, _ = worker.single_stream(
        session, samples, {"min_queries": 30, "min_duration_s": 0.0, "max_duration_s": 60.0}
    )
    paced = worker.paced_queries(session, samples, FPS, 20)["paced"]
    res = Result(
        cand,
        latencies_ms=lat,
        duration_s=duration,
        fps=FPS,
        paced_ms=paced["latencies_ms"],
        paced_overruns=paced["overruns"],
    )
    res.summary = summarize(lat, duration)
    return res


def test_selection_follows_the_camera_rate_not_back_to_back(
    tiny_bundle: Path, keys: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = read_manifest(tiny_bundle)

    def real(name: str) -> Session:
        art = manifest.artifact(name)
        return registry.get(art.backend).load(tiny_bundle / art.path, {})

    def cand(name: str, gate: bool = True) -> BenchCandidate:
        art = manifest.artifact(name)
        return BenchCandidate(name, art.backend, art.precision, 1, {}, build_gate=gate)

    ort, ov = real("onnxruntime-fp32"), real("openvino-fp32")
    try:
        # ONNX Runtime: 1 ms back to back, 20 ms after an idle gap; OpenVINO: 8 ms always.
        wakes = measure(cand("onnxruntime-fp32"), ColdWakeSession(ort, warm_ms=1, cold_ms=20, idle_ms=10))
        steady = measure(cand("openvino-fp32"), SlowSession(ov, 8))
        # Fastest of all at either rate, but below the accuracy gate: never chosen.
        below_gate = measure(cand("openvino-fp32", gate=False), SlowSession(ov, 0.1))
    finally:
        ort.close()
        ov.close()
    capsys.readouterr()  # the worker's "pacing" events

    assert wakes.summary is not None and steady.summary is not None
    assert wakes.summary.headline_ms < 8 <= steady.summary.headline_ms  # back to back: it is faster
    paced_wakes, paced_steady = wakes.camera_rate, steady.camera_rate
    assert paced_wakes is not None and paced_steady is not None
    assert paced_wakes.p90_ms >= 20 > paced_steady.p90_ms  # at the camera rate: it is slower
    assert paced_wakes.wakeup_ms is not None and paced_wakes.wakeup_ms >= 15

    def report(results: list[Result], fps: float) -> Report:
        return Report(
            bundle=str(tiny_bundle),
            model=manifest.model.name,
            profile=manifest.device.profile,
            budget_ms=1000 / FPS,
            host={"arch": host_arch(), "cpu": "stand-in"},
            settings=Settings(fps=fps),
            results=results,
            skipped=[],
            threshold=manifest.build.accuracy_threshold,
            started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            fps=fps,
        )

    paced = report([wakes, steady, below_gate], FPS)
    back_to_back = report([replace(r, fps=0.0) for r in (wakes, steady, below_gate)], 0.0).fastest()
    assert back_to_back is not None and back_to_back.candidate.artifact == "onnxruntime-fp32"
    best = paced.fastest()
    assert best is steady  # the scenario the device will run decides

    selection = selection_from(paced)
    assert selection.chosen == "openvino-fp32" and "camera rate 20 fps" in selection.by
    # Only what passed the gate is recorded, with the paced numbers load() will order by.
    assert [c.artifact for c in selection.candidates] == ["openvino-fp32", "onnxruntime-fp32"]
    assert selection.candidates[0].p90_ms == pytest.approx(paced_steady.p90_ms)
    assert selection.candidates[1].p90_ms == pytest.approx(paced_wakes.p90_ms)

    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, copy)
    write_selection(copy, selection, keys[0])
    written = read_manifest(copy)
    assert written.selection is not None and written.selection.chosen == "openvino-fp32"
    profile = get_profile(written.device.profile)
    cands = candidates_for(profile, written.artifacts)
    latency, _ = measured_order(written, profile.name, cands, host_arch())
    by_backend = {c.backend: latency[c.key] for c in cands if c.key in latency}
    assert by_backend["openvino"] < by_backend["onnxruntime"]  # load() tries OpenVINO first
