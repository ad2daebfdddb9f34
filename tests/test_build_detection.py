"""``edgekit build`` for a detector: BlazeFace (MediaPipe's face detector) through every backend.

The x86_64-cpu bundle is built once per session through the real command; every artifact it
runs here must find the smoke set's faces where the fp32 model finds them (the detection
gate), the manifest must say what the model is and carry fp32's detections on the eval
frames, and the device's health gate must pass on it.  A broken int8 model (its weights
shuffled after quantization) must fail the gate with the images and numbers named; the gate's
rule itself is checked on detections whose boxes and scores are set by hand.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deploy_bundles import broken_int8_bundle, scramble_onnx_weights
from detector_bundle import BLAZEFACE

from edgekit.backends.base import TensorSpec
from edgekit.bundle import read_manifest, verify
from edgekit.bundle.manifest import DetectionHead
from edgekit.convert.accuracy_detection import align_outputs
from edgekit.convert.modelcard import read_card
from edgekit.convert.recipes import plan_recipes
from edgekit.deploy.health import check_health
from edgekit.detection.agreement import compare_frame, summarize
from edgekit.detection.detector import Detection
from edgekit.device.profiles import get_profile
from edgekit.errors import BuildError

from conftest import build_json, edgekit

FACES = ("astronaut", "camera")  # the smoke set's photographs with a face (and their crops, mirrors)


@pytest.fixture(scope="module")
def blazeface_x86(
    tmp_path_factory: pytest.TempPathFactory, cache_env: dict[str, str], keys: tuple[Path, Path]
) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bundles") / "blazeface-x86"
    return build_json(cache_env, BLAZEFACE, "x86_64-cpu", out, keys[0])


# -- the gate's rule, on detections set by hand --------------------------------------------

HEAD = DetectionHead.from_dict(
    {"decoder": "yolo", "num_classes": 2, "score_threshold": 0.5, "yolo_layout": "rows"}
)


def face(score: float, x: float = 10, class_id: int = 0) -> Detection:
    return Detection(class_id, "face", score, (x, 10.0, x + 40, 50.0))


def test_a_score_wobbling_across_the_threshold_is_neither_a_miss_nor_an_extra() -> None:
    # fp32 0.55 (near the threshold: not decisive), the artifact 0.45: no miss.
    # fp32 0.45 (below the threshold), the artifact 0.62: it matches fp32's widened detection, no extra.
    near = compare_frame([face(0.55)], [face(0.45, x=12)], HEAD)
    up = compare_frame([face(0.45)], [face(0.62)], HEAD)
    assert (near.decisive, near.missed, near.extra, near.matched_all) == (0, 0, 0, 1)
    assert (up.decisive, up.missed, up.extra) == (0, 0, 0)


def test_a_decisive_face_lost_is_missed_and_one_found_from_nothing_is_extra() -> None:
    lost = compare_frame([face(0.9)], [face(0.9, x=45)], HEAD)  # moved by more than half its width
    assert (lost.decisive, lost.matched, lost.missed, lost.extra) == (1, 0, 1, 1)
    other_class = compare_frame([face(0.9)], [face(0.9, class_id=1)], HEAD)
    assert (other_class.missed, other_class.extra) == (1, 1)
    weak_extra = compare_frame([], [face(0.59)], HEAD)  # under threshold + 0.1: not counted
    assert weak_extra.extra == 0 and weak_extra.ok


def test_agreement_counts_decisive_detections_and_an_extra_always_fails() -> None:
    frames = [compare_frame([face(0.9)], [face(0.8, x=12)], HEAD) for _ in range(49)]
    frames.append(compare_frame([face(0.9)], [], HEAD))
    result = summarize(frames)
    assert (result.decisive, result.matched, result.missed, result.failing) == (50, 49, 1, (49,))
    assert result.rate == pytest.approx(0.98) and result.passed(0.98) and not result.passed(0.99)
    assert result.max_score_drift == pytest.approx(0.1)
    assert result.min_iou == pytest.approx(38 / 42)  # shifted 2 of 40 px: 38 px overlap of 42
    with_extra = summarize([*frames[:49], compare_frame([], [face(0.7)], HEAD)])
    assert with_extra.rate == 1.0 and with_extra.extra == 1 and not with_extra.passed(0.98)
    assert summarize([]).rate == 1.0 and summarize([]).passed(0.98)
    none_found = summarize([compare_frame([face(0.9)], [], HEAD)])
    assert (none_found.rate, none_found.mean_iou, none_found.min_iou) == (0.0, 0.0, 0.0)


# -- the real build -----------------------------------------------------------------------


@pytest.mark.slow
def test_every_artifact_of_the_profile_is_built_and_passes_the_detection_gate(
    blazeface_x86: tuple[Path, dict[str, Any]],
) -> None:
    bundle, summary = blazeface_x86
    manifest = read_manifest(bundle)
    reports = {a["recipe"]: a for a in summary["artifacts"]}
    assert list(reports) == plan_recipes(get_profile("x86_64-cpu"))
    assert {a.name for a in manifest.artifacts} >= {
        "onnxruntime-fp32",
        "openvino-fp32",
        "litert-fp32",
        "onnxruntime-int8",
        "openvino-int8",
        "litert-int8",
    }
    gated = 0
    for a in manifest.artifacts:
        report = next(r for r in summary["artifacts"] if r["path"] == Path(a.path).name)
        if a.accuracy is None:  # a recipe this CPU cannot compute as built (bf16, full-range int8)
            assert report["not_measured"], a.name
            continue
        det = a.accuracy.detection
        assert det is not None, a.name
        assert a.accuracy.passed and a.accuracy.top1_agreement >= 0.98, (a.name, det)
        # Both faces of the smoke set, in the photograph, its crop and its mirror, at least.
        assert det.decisive_detections >= 6 and det.missed == 0 and det.extra == 0, (a.name, det)
        assert det.matched == det.decisive_detections and det.mean_iou >= 0.8, (a.name, det)
        assert a.latency is not None and a.latency.p50_ms > 0, a.name
        gated += 1
    assert gated >= 6  # fp32 on three backends, int8 on three
    # No TVM schedules ship for BlazeFace: an untuned host library could never be chosen, so by
    # default it is not built (nor gated), and the report says how to get it.
    assert reports["tvm-fp32"]["path"] is None and "no tuned schedules" in reports["tvm-fp32"]["skipped"]
    assert "--tvm-untuned" in reports["tvm-fp32"]["skipped"]


@pytest.mark.slow
def test_the_manifest_says_detection_with_the_head_and_eval_frames_carry_fp32_faces(
    blazeface_x86: tuple[Path, dict[str, Any]], keys: tuple[Path, Path]
) -> None:
    bundle, _ = blazeface_x86
    manifest = read_manifest(bundle)
    card = read_card(BLAZEFACE)
    assert manifest.model.task == "detection" and manifest.detection == card.detection
    assert manifest.labels == card.labels
    assert verify(bundle, [keys[1]], require_signature=True).ok
    assert manifest.eval_set is not None
    frames = {Path(f.path).stem.split("-", 1)[1]: f for f in manifest.eval_set.frames}
    with_faces = [n for n, f in frames.items() if any(d.score >= 0.6 for d in f.detections or ())]
    assert all(n.split("-")[0] in FACES for n in with_faces) and len(with_faces) >= 4, frames.keys()
    assert any(not f.detections for f in frames.values()), "no frame without a face to check for extras"
    for f in manifest.eval_set.frames:
        assert f.detections is not None and f.margin == 0
        for d in f.detections:
            x0, y0, x1, y1 = d.box
            assert 0 <= x0 < x1 and 0 <= y0 < y1 and 0 < x1 - x0 < 256, (f.path, d)


@pytest.mark.slow
def test_the_health_gate_passes_on_the_bundle_and_fails_on_shuffled_int8_weights(
    blazeface_x86: tuple[Path, dict[str, Any]], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle, _ = blazeface_x86
    good = check_health(bundle, "x86_64-cpu", [keys[1]], runs=20, budget_ms=1000)
    assert good.ok, good.reason
    assert good.detection is not None and good.detection.decisive >= 4 and good.top1_agreement == 1.0
    broken = broken_int8_bundle(bundle, tmp_path / "broken", keys[0])
    bad = check_health(broken, "x86_64-cpu", [keys[1]], runs=5, budget_ms=1000)
    assert not bad.ok and bad.candidate == "onnxruntime-int8"
    assert bad.detection is not None and (bad.detection.missed or bad.detection.extra), bad.detection
    assert "decisive" in bad.reason and ".jpg" in bad.reason, bad.reason


@pytest.mark.slow
def test_a_broken_int8_artifact_fails_the_build_naming_images_and_numbers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from edgekit.convert import onnx_int8
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build

    real = onnx_int8.quantize_onnx_int8

    def quantize_then_shuffle(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        scramble_onnx_weights(made.path)  # it loads and runs, and finds faces where there are none
        return made

    monkeypatch.setattr(onnx_int8, "quantize_onnx_int8", quantize_then_shuffle)
    out = tmp_path / "bundle"
    request = BuildRequest(
        card=read_card(BLAZEFACE),
        device="x86_64-cpu",
        out=out,
        backends=("onnxruntime",),
        precisions=("int8",),
        use_cache=False,  # the broken step must not land in a cache other builds read
        measure_latency=False,
    )
    with pytest.raises(BuildError) as failed:
        build(request)
    message = failed.value.message
    assert "accuracy gate failed" in message and "onnxruntime-int8" in message, message
    assert "decisive fp32 detections" in message and "missed" in message and "extra" in message, message
    assert any(name in message for name in FACES), message
    assert not out.exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.slow
def test_build_and_inspect_show_the_detection_gate(
    blazeface_x86: tuple[Path, dict[str, Any]], cache_env: dict[str, str]
) -> None:
    bundle, summary = blazeface_x86
    fp32 = next(a for a in summary["artifacts"] if a["recipe"] == "onnxruntime-fp32")
    det = fp32["accuracy"]["detection"]
    assert det["missed"] == 0 and det["extra"] == 0 and det["matched"] == det["decisive_detections"] >= 6
    shown = edgekit({**cache_env, "COLUMNS": "200"}, "inspect", str(bundle))
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if "name" in line and "arch" in line)
    assert all(col in header for col in ("matched", "mean IoU", "missed", "extra")), header
    assert "top-1" not in header, header
    row = next(line for line in shown.stdout.splitlines() if "onnxruntime-fp32" in line)
    assert f"{det['matched']}/{det['decisive_detections']}" in row, row
    assert "ssd decoder" in shown.stdout and "no extra" in shown.stdout
    as_json = json.loads(edgekit(cache_env, "inspect", str(bundle), "--json").stdout)
    assert as_json["manifest"]["model"]["task"] == "detection"
    assert as_json["manifest"]["artifacts"][0]["accuracy"]["detection"]["decisive_detections"] >= 6


def test_outputs_pair_with_fp32_by_name_else_by_position_and_shapes_must_agree() -> None:
    boxes, scores = (
        TensorSpec("regressors", (1, 896, 16), "float32"),
        TensorSpec("classificators", (1, 896, 1), "float32"),
    )
    litert = [
        TensorSpec(f"serving_default_output_{i}_output", s.shape, "float32")
        for i, s in enumerate((boxes, scores))
    ]
    assert align_outputs([boxes, scores], [scores, boxes]) == [1, 0]  # by name, whatever the order
    assert align_outputs([boxes, scores], litert) == [0, 1]  # LiteRT renames them: by position
    with pytest.raises(ValueError, match="not the fp32 model's"):
        align_outputs([boxes, scores], litert[::-1])
    with pytest.raises(ValueError, match="1 outputs"):
        align_outputs([boxes, scores], [boxes])


@pytest.mark.slow
def test_the_rpi5_build_makes_every_artifact_and_gates_all_that_run_here(
    blazeface_x86: tuple[Path, dict[str, Any]],  # built first: the rpi5 build reuses its cached steps
    tmp_path_factory: pytest.TempPathFactory,
    cache_env: dict[str, str],
    keys: tuple[Path, Path],
) -> None:
    from edgekit.convert.gate import host_gap

    out = tmp_path_factory.mktemp("bundles") / "blazeface-rpi5"
    bundle, summary = build_json(cache_env, BLAZEFACE, "rpi5", out, keys[0])
    assert [a["recipe"] for a in summary["artifacts"]] == plan_recipes(get_profile("rpi5"))
    reports = {r["path"]: r for r in summary["artifacts"]}
    for a in read_manifest(bundle).artifacts:
        # The builder's rule: the TVM library is aarch64 code, openvino-fp16 needs a CPU with fp16
        # arithmetic (an AMD EPYC has none); the device gates those (edgekit bench, the health gate).
        gap = host_gap(a)
        if a.arch == "aarch64":
            assert a.backend == "tvm" and gap is not None
        if gap is not None:
            assert a.accuracy is None and reports[Path(a.path).name]["not_measured"] == gap, a.name
            continue
        assert a.accuracy is not None and a.accuracy.passed and a.accuracy.detection is not None, a.name
        assert a.accuracy.detection.missed == a.accuracy.detection.extra == 0, a.name


# -- int8 heads in float ---------------------------------------------------------------------


def _int8_scores(bundle: Path, frames: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each int8 artifact that runs here: per (BGR) frame, its score output (the 896 logits), as the device reads them."""
    from edgekit.backends import registry
    from edgekit.bench.runner import plan
    from edgekit.processing.preprocessing import Preprocessor, PreprocessSpec
    from edgekit.processing.tensors import from_output

    manifest = read_manifest(bundle)
    spec = PreprocessSpec.from_manifest(manifest)
    candidates, _ = plan(bundle, precisions=("int8",), threads=(1,))
    found: dict[str, dict[str, Any]] = {}
    for cand in candidates:
        art = manifest.artifact(cand.artifact)
        session = registry.get(art.backend).load(bundle / art.path, cand.options)
        try:
            prep = Preprocessor(spec, session.inputs[0])
            found[cand.artifact] = {}
            for name, frame in frames.items():
                raw = session.run(prep(frame))
                outputs = [from_output(y, o) for y, o in zip(raw, session.outputs, strict=True)]
                found[cand.artifact][name] = next(o for o in outputs if o.shape[-1] == 1).ravel()
        finally:
            session.close()
    return found


@pytest.mark.slow
def test_int8_scores_are_computed_in_float_not_on_an_output_grid(
    blazeface_x86: tuple[Path, dict[str, Any]],
) -> None:
    # The score logits (about -100..+10) quantized at the output with one 8-bit scale took some
    # 60 values over the 896 anchors, 0 (score 0.500) among them; the float head gives each its own.
    from skimage import data

    bundle, _ = blazeface_x86
    manifest = read_manifest(bundle)
    # Frames are BGR, as a camera's through OpenCV.
    frames = {
        name: np.ascontiguousarray(getattr(data, name)()[..., ::-1])
        for name in ("astronaut", "coffee", "rocket")
    }
    scores = _int8_scores(bundle, frames)
    assert {"onnxruntime-int8", "openvino-int8", "litert-int8"} <= set(scores)
    for artifact, per_frame in scores.items():
        for name, logits in per_frame.items():
            assert len(np.unique(logits)) > 0.9 * logits.size, (artifact, name, len(np.unique(logits)))
        notes = manifest.artifact(artifact).notes
        assert notes["float_heads"] and notes["float_heads_recipe"] >= 1, artifact


@pytest.fixture(scope="module")
def blazeface_x86_int8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The x86_64-cpu bundle as tools/detection_table.py measured it: fp32 and int8 of ONNX Runtime, OpenVINO, LiteRT."""
    from detector_bundle import build_blazeface

    return build_blazeface(
        tmp_path_factory.mktemp("int8"),
        backends=("onnxruntime", "openvino", "litert"),
        precisions=("fp32", "int8"),
    )


@pytest.mark.slow
def test_no_int8_artifact_finds_a_face_in_the_china_photograph(blazeface_x86_int8: Path) -> None:
    # scikit-learn's china (a temple, no face): fp32's best score 0.357; with the scores on the
    # output grid, this build's ONNX Runtime and LiteRT int8 reported a face at exactly 0.500.
    datasets = pytest.importorskip("sklearn.datasets")
    bundle = blazeface_x86_int8
    threshold = read_manifest(bundle).detection.score_threshold  # type: ignore[union-attr]
    china = np.ascontiguousarray(
        datasets.load_sample_image("china.jpg")[..., ::-1]
    )  # BGR, as a camera's frames
    scores = _int8_scores(bundle, {"china": china})
    assert {"onnxruntime-int8", "litert-int8"} <= set(scores)
    for artifact, per_frame in scores.items():
        best = 1 / (1 + np.exp(-per_frame["china"].max()))
        assert best < threshold - 0.02, (artifact, best)
