"""``edgekit bench`` on a detector: agreement is the detection gate's (boxes matched), not a top-1 argmax.

A real BlazeFace bundle (``tests/detector_bundle.py``: ONNX Runtime and OpenVINO, fp32 and int8)
is benched as a device would: each candidate's detections on the bundle's evaluation frames
against the reference detections it carries, by ``edgekit.detection.agreement``'s rule.  A
copy whose ONNX Runtime fp32 weights are shuffled (re-hashed and re-signed, so only its answers
give it away) is reported below the gate and never selected.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from deploy_bundles import resign, scramble_onnx_weights
from detector_bundle import blazeface_key, build_blazeface
from rich.console import Console

import edgekit
from edgekit.bench.render import legend, table
from edgekit.bundle import read_manifest
from edgekit.detection.agreement import decisive_score

from conftest import edgekit as run_edgekit

pytestmark = pytest.mark.slow

BROKEN = "onnxruntime-fp32"
# Short runs: the agreement is what is tested here, not the latency statistics (tests/test_bench.py).
QUICK = ("--min-queries", "20", "--min-duration", "0.1", "--max-duration", "2", "--threads", "1")


@pytest.fixture(scope="module")
def blazeface(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(bundle, private key, public key): BlazeFace for x86_64-cpu, ONNX Runtime and OpenVINO, fp32 and int8."""
    out = tmp_path_factory.mktemp("blazeface")
    bundle = build_blazeface(out, backends=("onnxruntime", "openvino"), precisions=("fp32", "int8"))
    private, public = blazeface_key(out)
    return bundle, private, public


def bench(env: dict[str, str], bundle: Path, public: Path, *args: str) -> dict[str, Any]:
    r = run_edgekit(env, "bench", str(bundle), "--key", str(public), *QUICK, *args, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def test_bench_judges_a_detector_by_its_boxes(
    blazeface: tuple[Path, Path, Path], cache_env: dict[str, str]
) -> None:
    bundle, _, public = blazeface
    report = bench(cache_env, bundle, public)
    threshold = report["accuracy_threshold"]
    assert report["task"] == "detection"
    ran = {c["artifact"]: c for c in report["candidates"]}
    assert {"onnxruntime-fp32", "openvino-fp32"} <= set(ran) and any("int8" in a for a in ran), sorted(ran)
    manifest = read_manifest(bundle)
    assert manifest.eval_set is not None and manifest.detection is not None
    floor = decisive_score(manifest.detection)
    decisive = sum(1 for f in manifest.eval_set.frames for d in f.detections or () if d.score >= floor)
    assert decisive >= 4  # the smoke set's faces: something to match
    for name, c in ran.items():
        assert c["ok"], (name, c["error"])
        det = c["detection"]
        # Honest about what it compares: no top-1 of a detector, the boxes' agreement instead.
        assert c["agreement_kind"] == "detections" and c["top1_agreement"] is None, name
        assert det["decisive_detections"] == decisive and det["frames"] == c["eval_frames"] >= 6, name
        assert c["agreement"] == det["matched"] / decisive == 1.0, (name, det)  # every face found
        assert 0.5 <= det["min_iou"] <= det["mean_iou"] <= 1.0, (name, det)
        # The gate: agreement at the threshold and no decisive extra (what the health gate decides),
        # by the build's own rule: every artifact the build passed passes here on its frames.
        assert c["passed_gate"] == (c["agreement"] >= threshold and det["extra"] == 0), (name, det)
        assert c["passed_gate"], (name, det)
        assert bool(det["failing_frames"]) == (det["extra"] > 0 or det["missed"] > 0), (name, det)
        # The postprocess stage (decode + NMS) timed apart, once per query (at most 1000).
        post = c["postprocess"]
        assert post["count"] == min(c["summary"]["count"], 1000), (name, post)
        assert 0 < post["p50_ms"] <= post["p90_ms"] <= post["p99_ms"], (name, post)
    for name in ("onnxruntime-fp32", "openvino-fp32"):  # fp32 on another runtime finds the same boxes
        det = ran[name]["detection"]
        assert det["extra"] == 0 and det["mean_iou"] > 0.99 and ran[name]["passed_gate"], (name, det)
    fastest = next(c for c in report["candidates"] if c["key"] == report["fastest"])
    assert fastest["passed_gate"], fastest

    # The terminal table names what it compares: boxes (with a candidate's extras) and decode times.
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(table(report))
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if "candidate" in line)
    assert "boxes" in header and "decode" in header and "top-1" not in header, header
    for name, c in ran.items():
        row = next(line for line in lines if line.split()[:1] == [name])
        extra = c["detection"]["extra"]
        assert row.rstrip().endswith("100%" + (f" +{extra}" if extra else "")), row
        assert f"{c['postprocess']['p50_ms']:.2f}" in row, row
    assert "boxes:" in legend(report) and "decode:" in legend(report)


def test_a_detector_with_broken_weights_is_below_the_gate_and_never_selected(
    blazeface: tuple[Path, Path, Path], cache_env: dict[str, str], tmp_path: Path
) -> None:
    bundle, private, public = blazeface

    def corrupt(folder: Path) -> None:
        (model,) = (folder / "artifacts" / BROKEN).glob("*.onnx")
        scramble_onnx_weights(model, seed=3, weights="float")

    broken = resign(bundle, tmp_path / "broken", private, change=corrupt, budget_ms=None)
    report = bench(cache_env, broken, public, "--backends", "onnxruntime,openvino", "--precisions", "fp32")
    ran = {c["artifact"]: c for c in report["candidates"]}
    bad, good = ran[BROKEN], ran["openvino-fp32"]
    assert bad["ok"], bad["error"]  # it runs: only its answers give it away
    det = bad["detection"]
    assert not bad["passed_gate"] and det["failing_frames"], det
    assert bad["agreement"] < report["accuracy_threshold"] or det["extra"] > 0, det
    assert good["passed_gate"] and report["fastest"] == good["key"]

    # --write-selection records the good candidate, whatever the broken one's speed.
    r = run_edgekit(
        cache_env, "bench", str(broken), "--key", str(public), *QUICK,
        "--backends", "onnxruntime,openvino", "--precisions", "fp32",
        "--write-selection", "--sign-key", str(private), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["selection_written"]["artifact"] == "openvino-fp32"
    selection = read_manifest(broken).selection
    assert selection is not None and selection.chosen == "openvino-fp32"
    measured = {m.artifact: m for m in selection.candidates}
    assert measured["openvino-fp32"].top1_agreement == 1.0
    # Not even recorded: load() tries measured candidates fastest first, before the profile's order.
    assert BROKEN not in measured, measured
    with edgekit.load(broken, device="x86_64-cpu", trusted_keys=[public]) as model:
        assert model.candidate == "openvino-fp32"  # the profile alone would take onnxruntime-fp32

    # With only the broken candidate, there is nothing to select: a clear error, the bundle unchanged.
    before = (broken / "manifest.json").read_bytes()
    r = run_edgekit(
        cache_env, "bench", str(broken), "--key", str(public), *QUICK,
        "--backends", "onnxruntime", "--precisions", "fp32",
        "--write-selection", "--sign-key", str(private),
    )  # fmt: skip
    assert r.returncode == 2 and "passed the accuracy gate" in r.stderr and BROKEN in r.stderr, r.stderr
    assert (broken / "manifest.json").read_bytes() == before
