"""How the first load's measurement ranks every candidate: the build's figures first, a busy host, the rest.

The same real tiny bundle (ONNX Runtime and OpenVINO, fp32) and real runtimes as
``test_first_load_choice``; ONNX Runtime is made slower with ``stand_in.SlowSession``, and the
build's latency figures are written into a re-signed manifest, so which candidate is faster,
and what the build said of each, never depends on this machine's speed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_first_load_choice import LIMITS, ORT, OV, bundle, cache_file, load, slow_backend, state  # noqa: F401

from edgekit.selection import candidate_timing, choice_cache
from edgekit.selection.candidate_timing import MeasureLimits

from conftest import edgekit as run_cli


def _with_build_figures(figures: dict[str, float]) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        for art in doc["artifacts"]:
            ms = figures.get(art["backend"])
            if ms is not None:
                art["latency"] = {"p50_ms": ms, "p99_ms": 2 * ms, "runs": 100}

    return edit


@pytest.fixture
def figured(bundle: Path, tmp_path: Path, keys: tuple[Path, Path]) -> Path:  # noqa: F811
    """The bundle as a build that timed OpenVINO at a tenth of ONNX Runtime would have written it."""
    from deploy_bundles import resign

    edit = _with_build_figures({"onnxruntime": 10.0, "openvino": 1.0})
    return resign(bundle, tmp_path / "figured", keys[0], edit=edit, budget_ms=None)


def test_the_builds_figures_time_the_fast_artifact_first_though_it_is_last_in_the_profile(
    figured: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    model, lines = load(figured)
    with model:
        assert model.candidate == OV and model.selection.how == "measured"
        assert set(model.selection.latency_ms) == {ORT, OV} and not model.selection.estimated_ms
    # Announced and timed in the build's order: OpenVINO (1 ms at build) before ONNX Runtime (10 ms).
    assert lines[0].endswith(f": {OV}, {ORT}")
    timed = [line.split(":")[0].strip() for line in lines[1:] if ": p90" in line]
    assert timed == [OV, ORT]
    assert "build p50 1.00 ms" in next(line for line in lines if line.strip().startswith(OV))


def test_a_budget_that_runs_out_ranks_the_untimed_by_the_builds_figures_and_says_so(
    figured: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_loads = slow_backend(monkeypatch, "onnxruntime")
    # Time for one candidate only: the first (OpenVINO, by the build's figures) takes longer than this.
    short = MeasureLimits(
        per_candidate_s=0.01, total_s=0.01, queries=8, min_queries=3, warmup=1, fps=200, busy_load=None
    )
    model, lines = load(figured, measure=short)
    with model:
        sel = model.selection
        assert model.candidate == OV
        assert set(sel.latency_ms) == {OV} and set(sel.estimated_ms) == {ORT}
        # ONNX Runtime's estimate: its build figure times what OpenVINO showed against its own (10x).
        assert sel.estimated_ms[ORT] == pytest.approx(10 * sel.latency_ms[OV])
        assert f"measured: {OV}; from the build's figures: {ORT}" in sel.describe()
        assert sel.to_dict()["estimated_ms"][ORT] > 0
    assert slow_loads == []  # never loaded: ranked from the build's figures
    assert any(f"{ORT}: not timed" in line and "ranked by the build's figures" in line for line in lines)
    kept = json.loads(cache_file(figured).read_text())
    assert set(kept["p90_ms"]) == {OV} and set(kept["estimated_ms"]) == {ORT}

    model, lines = load(figured, measure=short)  # read back: the same ranking, nothing measured
    with model:
        assert model.selection.how == "cached" and set(model.selection.estimated_ms) == {ORT}
    assert lines == []


def test_a_measurement_on_a_busy_host_is_provisional_and_measured_again(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    busy = replace(LIMITS, busy_load=1.0)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 4.0 * cores, 4.0 * cores))
    model, lines = load(bundle, measure=busy)
    with model:
        assert model.candidate == OV
        assert model.selection.provisional and "load average 4.00 per core" in model.selection.busy
        assert "provisional" in model.selection.describe()
    assert any("the host is busy" in line for line in lines)
    kept = json.loads(cache_file(bundle).read_text())
    assert kept["provisional"] is True and kept["attempt"] == 1 and kept["load_per_core"] == 4.0

    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # quiet now
    model, lines = load(bundle, measure=busy)
    with model:
        assert model.selection.how == "measured" and not model.selection.provisional
    assert "measured on a busy host" in lines[0]
    model, lines = load(bundle, measure=busy)
    model.close()
    assert model.selection.how == "cached" and lines == []


def test_a_host_that_stays_busy_keeps_its_third_measurement(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    busy = replace(LIMITS, busy_load=1.0)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cores, 4.0 * cores, 4.0 * cores))
    hows = []
    for _ in range(choice_cache.MAX_ATTEMPTS + 1):
        model, _ = load(bundle, measure=busy)
        model.close()
        hows.append((model.selection.how, model.selection.provisional))
    last = choice_cache.MAX_ATTEMPTS - 1
    assert hows == [("measured", True)] * last + [("measured", False), ("cached", False)]


def test_the_spread_of_a_measurement_says_a_host_is_busy_when_it_matters_against_the_period() -> None:
    period = 33.3
    assert candidate_timing.busy_reason({"a": (10.0, 11.0), "b": (20.0, 23.0)}, period, 0.2, 1.0) == ""
    wide = candidate_timing.busy_reason({"a": (10.0, 40.0), "b": (20.0, 57.0)}, period, None, 1.0)
    assert wide.startswith("wide spread: a p90 40.0 ms against p50 10.0 ms")
    # A 0.1 ms model's jitter is three times its p50 and nothing against a 33 ms period.
    assert candidate_timing.busy_reason({"a": (0.1, 0.3)}, period, None, None) == ""
    # One wide candidate of three is that candidate, not the host.
    spread = {"a": (10.0, 40.0), "b": (10.0, 11.0), "c": (5.0, 5.5)}
    assert candidate_timing.busy_reason(spread, period, None, None) == ""


def test_an_older_format_record_reads_as_stale_and_is_measured_again(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    path = cache_file(bundle)
    path.parent.mkdir(parents=True)
    sha = choice_cache.manifest_sha256(bundle)
    old = {"format": "edgekit-choice/1", "bundle_sha256": sha, "host": {}, "fps": 200.0}
    path.write_text(json.dumps({**old, "measured_at": "2026-01-01T00:00:00+00:00", "p90_ms": {ORT: 0.1}}))
    caplog.set_level(logging.INFO, "edgekit.selection.choice_cache")
    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and model.candidate == OV and lines
    assert "older format" in caplog.text
    assert json.loads(path.read_text())["format"] == choice_cache.FORMAT


@pytest.mark.parametrize(
    "change",
    [
        {"attempt": 99},
        {"provisional": "yes"},
        {"estimated_ms": {OV: 1.0}},  # both timed and estimated
        {"p50_ms": {"someone-else": 1.0}},
        {"stale": "x" * (choice_cache.MAX_REASON + 1)},
        {"load_per_core": -1},
    ],
    ids=["attempt", "provisional", "estimated-and-timed", "p50-of-nobody", "long-reason", "load"],
)
def test_a_record_whose_fields_do_not_fit_is_not_trusted(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, Any],
) -> None:
    slow_backend(monkeypatch, "onnxruntime")
    model, _ = load(bundle)
    model.close()
    path = cache_file(bundle)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    assert choice_cache.read_record(choice_cache.manifest_sha256(bundle)) is None
    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and lines


def test_a_choice_the_running_pipeline_contradicts_is_measured_again(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from stand_in import slower

    from edgekit.pipeline import Pipeline, choice_watch

    slow_backend(monkeypatch, "onnxruntime")
    monkeypatch.setattr(choice_watch, "WINDOW", 5)
    model, _ = load(bundle)
    sha = choice_cache.manifest_sha256(bundle)
    with model:
        assert model.candidate == OV and model.selection.p50_ms[OV] < 5
        # At the speed measured: nothing to say.
        with Pipeline(model, "synthetic:64x48@200", frames=6, budget_ms=33.3) as pipeline:
            pipeline.run()
        record = choice_cache.read_record(sha)
        assert record is not None and record.stale == ""
        # The same artifact now infers 40 ms a frame (what a busy host did to it): stale, said once.
        with (
            slower(model, 40.0),
            Pipeline(model, "synthetic:64x48@200", frames=12, budget_ms=33.3) as pipeline,
        ):
            pipeline.run()
    record = choice_cache.read_record(sha)
    assert record is not None and record.stale.startswith(f"{OV} inferred at p50 4")
    assert caplog.text.count("is marked stale, the next load measures the candidates again") == 1

    model, lines = load(bundle)
    model.close()
    assert model.selection.how == "measured" and "contradicted by a later run" in lines[0]
    record = choice_cache.read_record(sha)
    assert record is not None and record.stale == ""


def _select(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGEKIT_MEASURE"}
    r = run_cli(env, "select", *args, "--device", "x86_64-cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_edgekit_select_shows_measures_again_and_forgets_the_kept_choice(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = json.loads(_select(str(bundle), "--json").stdout)
    assert out["kept"] is None and out["profile"] == "x86_64-cpu" and out["bundle_selection"] is False
    assert out["bundle_sha256"] == choice_cache.manifest_sha256(bundle)

    slow_backend(monkeypatch, "onnxruntime")
    model, _ = load(bundle)
    model.close()
    kept = json.loads(_select(str(bundle), "--json").stdout)["kept"]
    assert kept["chosen"] == OV and set(kept["p90_ms"]) == {ORT, OV} and set(kept["p50_ms"]) == {ORT, OV}
    assert kept["estimated_ms"] == {} and kept["provisional"] is False and kept["stale"] == ""
    assert kept["host_matches"] is True and kept["next_load"] == "uses it"
    assert kept["host"]["profile"] == "x86_64-cpu" and "load_per_core" in kept
    text = _select(str(bundle)).stdout
    assert f"chosen: {OV} at 200 fps" in text and f"measured  {ORT}: p90" in text
    assert "next load: uses it" in text

    forgot = json.loads(_select(str(bundle), "--forget", "--json").stdout)
    assert forgot["forgot"] is True and forgot["kept"] is None and not cache_file(bundle).exists()
    assert "no choice kept here" in _select(str(bundle)).stdout

    r = _select(str(bundle), "--measure", "--json")
    again = json.loads(r.stdout)  # stdout is the JSON document alone; the progress is on stderr
    assert again["measured_now"]["how"] == "measured" and again["measured_now"]["candidate"] in (ORT, OV)
    assert again["kept"]["chosen"] == again["measured_now"]["candidate"]
    assert "measuring 2 candidates at 30 fps" in r.stderr


def test_the_health_gate_points_a_slow_choice_of_a_bundle_built_for_this_profile_to_select(
    bundle: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    keys: tuple[Path, Path],
) -> None:
    from edgekit.deploy.health import check_health

    monkeypatch.setenv("EDGEKIT_MEASURE", "0")  # the profile's order: nothing measured, rebuild is the hint
    report = check_health(bundle, "x86_64-cpu", [keys[1]], runs=3, warmup=1, budget_ms=1e-6)
    assert not report.ok and "over the budget" in report.reason and "rebuild the bundle" in report.hint

    monkeypatch.delenv("EDGEKIT_MEASURE")  # chosen by measuring: measuring again is the hint
    report = check_health(bundle, "x86_64-cpu", [keys[1]], runs=3, warmup=1, budget_ms=1e-6)
    assert not report.ok and "edgekit select --measure" in report.hint and "rebuild" not in report.hint
    assert "built for x86_64-cpu" in report.hint
