"""mAP on labelled images: ``edgekit eval --coco`` and the build's ``--eval-coco`` gate, on a real BlazeFace bundle.

The labelled set is made here: scikit-image's two face photographs (astronaut, camera),
each with a mirror and a crop, written as PNG (lossless, so what is scored is what was
labelled), and as annotations the fp32 model's own boxes.  Its mAP is then known: a model
scored on its own answers finds every box.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from detector_bundle import BLAZEFACE, blazeface_key, build_blazeface

from edgekit.bundle import read_manifest
from edgekit.errors import BuildError, EdgekitError

from conftest import edgekit

pytest.importorskip("pycocotools", reason="pycocotools is not installed (pip install -e '.[build]')")


def _frames() -> dict[str, np.ndarray]:
    import skimage.data as data

    frames = {}
    for name in ("astronaut", "camera"):
        img = np.asarray(getattr(data, name)())
        img = np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img[..., :3]
        h, w = img.shape[:2]
        frames[name] = np.ascontiguousarray(img)
        frames[f"{name}-mirror"] = np.ascontiguousarray(img[:, ::-1])
        frames[f"{name}-crop"] = np.ascontiguousarray(img[: h * 3 // 4, w // 8 : w * 7 // 8])
    return frames


def _write_set(
    folder: Path, boxes: Mapping[str, Sequence[tuple[float, float, float, float]]], category: str = "face"
) -> Path:
    """Annotations of the images in ``folder``: ``boxes`` (x0, y0, x1, y1) per file name, one category."""
    import cv2

    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    for i, (name, found) in enumerate(boxes.items(), 1):
        h, w = np.asarray(cv2.imread(str(folder / name))).shape[:2]
        images.append({"id": i, "file_name": name, "width": w, "height": h})
        for x0, y0, x1, y1 in found:
            anns.append(
                {"id": len(anns) + 1, "image_id": i, "category_id": 3, "bbox": [x0, y0, x1 - x0, y1 - y0]}
            )
    path = folder.parent / f"{folder.name}-{category}.json"
    cats = [{"id": 3, "name": category}, {"id": 4, "name": "unused"}]
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_blazeface(tmp_path_factory.mktemp("blazeface"))


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import cv2

    folder = tmp_path_factory.mktemp("labelled") / "images"
    folder.mkdir()
    for name, rgb in _frames().items():
        cv2.imwrite(str(folder / f"{name}.png"), rgb[..., ::-1])
    return folder


@pytest.fixture(scope="module")
def own_boxes(bundle: Path, images: Path) -> Path:
    """Annotations = what the bundle finds through ``edgekit.load`` (its own threshold and NMS): six faces."""
    import cv2

    import edgekit as ek

    boxes = {}
    with ek.load(bundle, device="x86_64-cpu", allow_unsigned=True) as model:
        for f in sorted(images.iterdir()):
            boxes[f.name] = [d.box for d in model.detect(np.asarray(cv2.imread(str(f))))]
    assert sum(len(b) for b in boxes.values()) == 6  # one face in each
    return _write_set(images, boxes)


def _eval(bundle: Path, ann: Path, images: Path, *args: str) -> tuple[dict[str, Any], str]:
    r = edgekit(dict(os.environ), "eval", str(bundle), "--coco", str(ann), "--images", str(images), *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), r.stderr


def test_eval_prints_map_per_artifact_as_json_with_progress_on_stderr(
    bundle: Path, images: Path, own_boxes: Path
) -> None:
    result, stderr = _eval(bundle, own_boxes, images, "--json")
    (row,) = result["artifacts"]
    assert row["artifact"] == "onnxruntime-fp32" and result["reference"] == "onnxruntime-fp32"
    assert (result["images"], result["boxes"]) == (6, 6)
    assert result["class_map"] == {"face": "face"}
    # At the evaluation threshold (0.001) the weighted NMS blends low-score candidates into each
    # face's box, so the boxes move a little from the ones labelled at 0.5: every face is found
    # (mAP50 1), not every one at IoU 0.95.
    assert row["map50"] == 1.0
    assert 0.8 < row["map50_95"] <= 1.0
    assert row["delta_map50"] == 0.0 and row["delta_map50_95"] == 0.0
    assert row["detections"] > 6  # the low-score tail is kept, as Ultralytics val keeps it
    assert "eval onnxruntime-fp32: 6/6 images" in stderr


def test_a_model_scored_on_its_own_evaluation_boxes_has_map_1(bundle: Path, images: Path) -> None:
    from edgekit.backends import open_session
    from edgekit.convert.coco_data import class_ids, load_coco
    from edgekit.convert.coco_eval import detect, evaluate
    from edgekit.processing.preprocessing import PreprocessSpec

    manifest = read_manifest(bundle)
    head = manifest.detection
    assert head is not None
    spec = PreprocessSpec.from_manifest(manifest)
    art = manifest.artifacts[0]
    names = [f.name for f in sorted(images.iterdir())]
    # Any one box an image makes a set to run the model on; the labels are then what it finds
    # as mAP is measured (score >= 0.001, 300 an image), those at its own threshold and above.
    seed = load_coco(_write_set(images, {n: [(0, 0, 10, 10)] for n in names}, "seed"), images)
    with open_session(bundle / art.path, art.backend) as session:
        found = detect(session, head, spec, seed, {0: 3})
        labels = {
            name: [
                (r["bbox"][0], r["bbox"][1], r["bbox"][0] + r["bbox"][2], r["bbox"][1] + r["bbox"][3])
                for r in found
                if r["image_id"] == i and r["score"] >= head.score_threshold
            ]
            for i, name in enumerate(names, 1)
        }
        truth = load_coco(_write_set(images, labels, "face"), images)
        got = evaluate(session, head, spec, truth, class_ids(manifest.labels, truth))
    assert (got.map50_95, got.map50, got.boxes) == (1.0, 1.0, 6)


def test_a_category_the_model_lacks_is_named(bundle: Path, images: Path, own_boxes: Path) -> None:
    from edgekit.commands.eval import evaluate_bundle

    people = own_boxes.with_name("people.json")
    data = json.loads(own_boxes.read_text())
    data["categories"][0]["name"] = "person"
    people.write_text(json.dumps(data))
    with pytest.raises(EdgekitError) as err:
        evaluate_bundle(bundle, people, images)
    assert "'person'" in err.value.message and "face" in err.value.message
    assert "--class-map" in err.value.hint
    mapped = evaluate_bundle(bundle, people, images, class_map="face=person")
    assert mapped["class_map"] == {"face": "person"} and mapped["artifacts"][0]["map50"] == 1.0
    with pytest.raises(EdgekitError, match="model class 'dog'"):
        evaluate_bundle(bundle, people, images, class_map="dog=person")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "top level must be an object"),
        ('{"images": [], "annotations": [], "categories": []}', "lists no images"),
        ('{"images": {}, "annotations": [], "categories": []}', "'images' must be a list"),
    ],
)
def test_a_malformed_annotation_file_is_an_error_with_a_hint(
    images: Path, tmp_path: Path, content: str, message: str
) -> None:
    from edgekit.convert.coco_data import load_coco

    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(EdgekitError, match=message) as err:
        load_coco(bad, images)
    assert err.value.hint


def test_bad_entries_and_missing_files_are_named(
    bundle: Path, images: Path, own_boxes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgekit.convert import coco_data

    good = json.loads(own_boxes.read_text())

    def fails(change: Any, message: str) -> None:
        data = json.loads(json.dumps(good))
        change(data)
        path = tmp_path / "changed.json"
        path.write_text(json.dumps(data))
        with pytest.raises(EdgekitError, match=message):
            coco_data.load_coco(path, images)

    fails(lambda d: d["annotations"][0].update(bbox=[1, 2, -3, 4]), r"annotations\[0\].bbox")
    fails(lambda d: d["annotations"][0].update(bbox=[1, 2, "3", 4]), r"annotations\[0\].bbox")
    fails(lambda d: d["annotations"][0].update(image_id=99), "image id 99")
    fails(lambda d: d["annotations"][0].update(category_id=99), "category id 99")
    fails(lambda d: d["annotations"].append(dict(d["annotations"][0])), "appears twice")
    fails(lambda d: d["images"][0].update(file_name="gone.png"), "gone.png")
    fails(lambda d: d["images"][0].update(file_name="../../etc/passwd"), "outside")
    with pytest.raises(EdgekitError, match="does not exist"):
        coco_data.load_coco(tmp_path / "none.json", images)
    monkeypatch.setattr(coco_data, "MAX_ANNOTATION_BYTES", 100)
    with pytest.raises(EdgekitError, match="over the"):
        coco_data.load_coco(own_boxes, images)


def test_eval_refuses_a_classifier_bundle(tiny: Any, tmp_path: Path, images: Path, own_boxes: Path) -> None:
    from edgekit.commands.eval import evaluate_bundle
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    card = card_for_file(tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=tmp_path / "classifier",
        onnx=tiny.onnx,
        backends=("onnxruntime",),
        precisions=("fp32",),
        measure_latency=False,
    )
    classifier = build(req).bundle
    with pytest.raises(EdgekitError, match="classifier") as err:
        evaluate_bundle(classifier, own_boxes, images)
    assert "detector" in err.value.hint
    r = edgekit(dict(os.environ), "eval", str(classifier), "--coco", str(own_boxes), "--images", str(images))
    assert r.returncode != 0 and "classifier" in r.stderr and "Traceback" not in r.stderr


def _gated_build(out: Path, ann: Path, images: Path, max_drop: float, allow: bool = False) -> Path:
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.map_gate import CocoGate
    from edgekit.convert.modelcard import read_card

    return build(
        BuildRequest(
            card=read_card(BLAZEFACE),
            device="x86_64-cpu",
            out=out,
            backends=("onnxruntime",),
            precisions=("fp32",),
            sign_key=blazeface_key(out.parent)[0],
            measure_latency=False,
            allow_accuracy_drop=allow,
            coco=CocoGate(ann, images, max_drop),
        )
    ).bundle


def test_the_build_gate_is_map50_against_fp32_with_labels(
    tmp_path: Path, images: Path, own_boxes: Path
) -> None:
    # A drop of at most -1 points asks the artifact to beat fp32 by a point: the fp32 artifact
    # itself loses 0, so it fails the gate as an artifact that lost accuracy would.
    with pytest.raises(BuildError) as err:
        _gated_build(tmp_path / "strict", own_boxes, images, -1.0)
    assert "mAP50 100.00 against fp32's 100.00" in err.value.message
    assert not (tmp_path / "strict").exists()
    shipped = _gated_build(tmp_path / "allowed", own_boxes, images, -1.0, allow=True)
    art = read_manifest(shipped).artifacts[0]
    assert art.accuracy is not None and not art.accuracy.passed and art.accuracy.allowed_drop
    assert art.notes["map_gate"]["passed"] is False and art.notes["map_gate"]["drop_points"] == 0.0

    # The command line: the same gate, passed at the default 1 point, and its numbers in the report.
    key = blazeface_key(tmp_path)[0]
    out = tmp_path / "passed"
    r = edgekit(
        dict(os.environ),
        *("build", "--model", str(BLAZEFACE), "--device", "x86_64-cpu", "-o", str(out)),
        *("--backends", "onnxruntime", "--precisions", "fp32", "--sign-key", str(key), "--json"),
        *("--eval-coco", str(own_boxes), "--eval-images", str(images)),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    reported = json.loads(r.stdout)["artifacts"][0]["accuracy"]["map_gate"]
    art = read_manifest(out).artifacts[0]
    assert art.accuracy is not None and art.accuracy.passed and not art.accuracy.allowed_drop
    gate = art.notes["map_gate"]
    assert gate == reported
    assert (gate["map50"], gate["fp32_map50"], gate["max_drop_points"], gate["images"]) == (1.0, 1.0, 1.0, 6)
    # What the artifact found on the frames the bundle ships: what a device will hold it to.
    from edgekit.detection.agreement import decisive_score

    m = read_manifest(out)
    assert m.eval_set is not None and m.detection is not None
    floor = decisive_score(m.detection)
    decisive = sum(d.score >= floor for f in m.eval_set.frames for d in f.detections or ())
    assert gate["eval_frames"] == {"decisive": decisive, "matched": decisive, "extra": 0} and decisive > 0


def test_build_flags_for_labels_go_together(images: Path, own_boxes: Path) -> None:
    from edgekit.convert.coco_gate import gate_request

    assert gate_request(None, None, 1.0, None) is None
    with pytest.raises(BuildError, match="go together"):
        gate_request(own_boxes, None, 1.0, None)
    with pytest.raises(BuildError, match="--class-map"):
        gate_request(None, None, 1.0, "face=person")
    gate = gate_request(own_boxes, images, 0.5, None)
    assert gate is not None and gate.max_map_drop == 0.5
