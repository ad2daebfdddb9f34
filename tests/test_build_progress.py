"""What a build says while it runs and after: plain progress lines where there is no terminal,
each step's time (``--json``'s ``stages``, the summary's table), and a slow artifact's gate on
a stated sample of the images.  On the tiny model: seconds, not minutes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from edgekit.bundle import read_manifest
from edgekit.commands.build_progress import EVERY_S, PlainProgress
from edgekit.convert.gate import MIN_SAMPLE, sample

from conftest import TinyArtifacts, edgekit

TINY = ("--mean", "0", "--std", "255", "--device", "x86_64-cpu", "--precisions", "fp32")


@pytest.mark.slow
def test_a_piped_build_prints_its_steps_and_reports_their_times(
    tiny: TinyArtifacts, cache_env: dict[str, str], tmp_path: Path
) -> None:
    # Run as CI runs it: stderr is a pipe, not a terminal.
    backends = ("--backends", "onnxruntime,openvino")
    r = edgekit(
        cache_env, "build", "--onnx", str(tiny.onnx), *TINY, *backends, "-o", str(tmp_path / "b"), "--json"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("build: ")]
    for step in ("export fp32-onnx", "convert openvino-fp32", "gate onnxruntime-fp32", "gate openvino-fp32"):
        assert f"build: {step} …" in lines, lines
        assert any(ln.startswith(f"build: {step} ") and ln.endswith(" s)") for ln in lines), (step, lines)
    assert lines[-1].startswith("build: bundle done (")
    stages = json.loads(r.stdout)["stages"]
    assert [(s["stage"], s["artifact"]) for s in stages] == [
        ("export", "fp32-onnx"),
        ("convert", "openvino-fp32"),
        ("reference", "fp32-onnx"),
        ("gate", "onnxruntime-fp32"),
        ("gate", "openvino-fp32"),
        ("bundle", None),
    ]
    assert all(s["seconds"] >= 0 and isinstance(s["cached"], bool) for s in stages)

    # The human summary: the same steps in a table, on stdout; the lines still on stderr.
    r = edgekit(cache_env, "build", "--onnx", str(tiny.onnx), *TINY, *backends, "-o", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "build steps" in r.stdout and "gate" in r.stdout and "total" in r.stdout
    assert "build: gate openvino-fp32 …" in r.stderr


def test_plain_progress_shows_images_at_most_every_two_seconds_per_step() -> None:
    now = [0.0]
    out = io.StringIO()
    say = PlainProgress(out, clock=lambda: now[0])

    def at(t: float, step: str, status: str) -> None:
        now[0] = t
        say(step, status)

    at(0.0, "gate tvm-fp32", "start")
    at(0.5, "gate tvm-fp32", "images 1/40")  # too soon after the start line
    at(1.0, "quantize onnxruntime-int8", "start")  # another step: its own clock
    at(EVERY_S + 0.1, "gate tvm-fp32", "images 9/40")
    at(EVERY_S + 1.0, "gate tvm-fp32", "images 12/40")  # too soon after the last
    at(2 * EVERY_S + 0.2, "gate tvm-fp32", "images 20/40")
    at(5.0, "gate tvm-fp32", "done")
    at(5.5, "compile tvm-fp32", "skipped: no tuned schedules")
    assert out.getvalue().splitlines() == [
        "build: gate tvm-fp32 …",
        "build: quantize onnxruntime-int8 …",
        f"build: gate tvm-fp32 9/40 images ({EVERY_S + 0.1:.1f} s)",
        f"build: gate tvm-fp32 20/40 images ({2 * EVERY_S + 0.2:.1f} s)",
        "build: gate tvm-fp32 done (5.0 s)",
        "build: compile tvm-fp32 skipped: no tuned schedules",
    ]


def test_a_slow_artifact_is_gated_on_an_even_sample_that_fits_the_budget() -> None:
    assert sample(0.01, 40, 120.0) == list(range(40))  # 0.4 s in all: every image
    assert sample(100.0, 6, 120.0) == list(range(6))  # fewer images than the least sample
    few = sample(100.0, 40, 120.0)  # not even the least sample fits: that many, no fewer
    assert len(few) == MIN_SAMPLE and few[0] == 0 and few[-1] == 39
    some = sample(5.0, 40, 120.0)  # 24 images fit in 120 s
    assert len(some) == 24 and some == sorted(set(some)) and (some[0], some[-1]) == (0, 39)


def test_the_gate_sample_is_stated_in_the_report_and_the_manifest(
    tiny: TinyArtifacts, tmp_path: Path
) -> None:
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    card = card_for_file(tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=tmp_path / "b",
        onnx=tiny.onnx,
        backends=("onnxruntime",),
        precisions=("fp32",),
        use_cache=False,
        gate_budget_s=0.0,  # any artifact is "slow": the rule, not this machine's speed, decides
    )
    result = build(req)
    (report,) = result.reports
    got: dict[str, Any] = report.to_dict()
    assert report.accuracy is not None and report.accuracy.eval_images == MIN_SAMPLE < result.eval_images
    assert got["gate_sample"].startswith(f"judged on {MIN_SAMPLE} of {result.eval_images} images")
    assert report.latency is not None and report.latency.runs == 3  # a slow one is timed briefly
    (art,) = read_manifest(result.bundle).artifacts
    assert art.notes["gate_sample"] == got["gate_sample"]
    assert art.accuracy is not None and art.accuracy.eval_images == MIN_SAMPLE


def test_calibration_and_the_gate_report_the_images_they_have_done(
    tiny: TinyArtifacts, tmp_path: Path
) -> None:
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    seen: list[tuple[str, str]] = []
    card = card_for_file(tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=tmp_path / "b",
        onnx=tiny.onnx,
        backends=("onnxruntime", "openvino"),
        precisions=("int8",),
        allow_accuracy_drop=True,
        use_cache=False,
        measure_latency=False,
    )
    result = build(req, lambda step, status: seen.append((step, status)))
    n = result.eval_images  # the smoke set: calibration and evaluation both
    for recipe in ("onnxruntime-int8", "openvino-int8"):
        ours = [status for step, status in seen if step == f"quantize {recipe}"]
        assert ours[0] == "start" and ours[-1] == "done", ours
        assert f"images 1/{n}" in ours and f"images {n}/{n}" in ours, ours
    gate = [status for step, status in seen if step == "gate onnxruntime-int8"]
    assert gate[0] == "start" and f"images {n}/{n}" in gate and gate[-1] == "done", gate
