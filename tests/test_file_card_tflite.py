"""What a .tflite says about itself fills its card: MediaPipe's palm detector, and ``--tflite FILE``.

models/palm-detection names only what the file cannot say (the letterbox, the decoder); its
input size and normalization, its label and its output names come from the file's TFLite
metadata and graph.  The detector is then run end to end on a photograph with hands: the
card's PyTorch re-expression and the .tflite under LiteRT, both decoded by the card's head.
"""

from __future__ import annotations

import hashlib
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from edgekit.bundle import read_manifest
from edgekit.convert.model_sources import load_pytorch
from edgekit.convert.modelcard import card_for_file, read_card
from edgekit.convert.package_files import tflite_file
from edgekit.detection.detector import Detection, Detector
from edgekit.errors import BuildError
from edgekit.processing.preprocessing import preprocess

from conftest import edgekit

litert = pytest.importorskip("ai_edge_litert.interpreter")

MODELS = Path(__file__).parent.parent / "models"
PALM = MODELS / "palm-detection"


def mediapipe_file(name: str) -> Path:
    try:
        dist = metadata.distribution("mediapipe")
    except metadata.PackageNotFoundError:
        pytest.skip('mediapipe is not installed (tools/setup.sh: pip install --no-deps "mediapipe==0.10.14")')
    return Path(str(dist.locate_file(f"mediapipe/modules/{name}")))


def cameraman() -> np.ndarray:
    """scikit-image's cameraman (512x512 grey, as RGB) cropped to 448x448: his gloved hands, on the camera."""
    from skimage import data

    grey = np.asarray(data.camera())[:448, :448]  # type: ignore[no-untyped-call]
    return np.repeat(grey[..., None], 3, axis=2)


def test_the_palm_card_takes_from_the_file_what_mediapipe_configures() -> None:
    mediapipe_file("palm_detection")
    card = read_card(PALM)
    # MediaPipe's PalmDetectionCpu: 192x192, output_tensor_float_range [0, 1], RGB, letterboxed in black.
    assert card.input_name == "input_1"
    assert card.preprocess.size == (192, 192)
    assert card.preprocess.mean == (0.0, 0.0, 0.0) and card.preprocess.std == (255.0, 255.0, 255.0)
    assert (card.preprocess.color, card.preprocess.layout) == ("RGB", "NCHW")
    assert (card.preprocess.resize, card.preprocess.letterbox_fill) == ("letterbox", 0)
    assert card.labels == ("palm",)
    assert card.output_names == ("Identity", "Identity_1") and card.output_name == "Identity"
    assert card.license == "Apache-2.0" and "MediaPipe Hands" in card.attribution
    assert card.detection is not None and card.detection.box_coder is not None
    assert card.detection.box_coder.num_keypoints == 7
    # 4 + 2 * 7 = 18 values per anchor, one anchor per row of the file's outputs.
    assert Detector(card.detection, card.preprocess).anchors.shape == (2016, 4)  # type: ignore[union-attr]


def test_what_the_card_says_wins_and_the_file_is_then_not_read(tmp_path: Path) -> None:
    mediapipe_file("palm_detection")
    text = (PALM / "model.toml").read_text(encoding="utf-8")
    full = text.replace(
        'layout = "NCHW"\n',
        'layout = "NCHW"\nname = "image"\nsize = [192, 192]\nmean = 127.5\nstd = 127.5\n',
    ).replace("[detection]\n", '[output]\nnames = ["Identity", "Identity_1"]\n\n[detection]\n')
    (tmp_path / "labels.txt").write_text("hand\n", encoding="utf-8")
    # Every field given and a wrong pin: the file is never opened, so the wrong pin goes unseen here
    # (the build checks it when it reads the weights).
    card_path = tmp_path / "model.toml"
    card_path.write_text('labels = "labels.txt"\n' + full.replace("1b14e942", "00000000"), encoding="utf-8")
    card = read_card(card_path)
    assert (card.input_name, card.preprocess.mean, card.labels) == ("image", (127.5,) * 3, ("hand",))
    # A field missing: the file is read, and its pin checked first.
    card_path.write_text(text.replace("1b14e942", "00000000"), encoding="utf-8")
    with pytest.raises(BuildError, match="SHA-256"):
        read_card(card_path)


def test_a_file_without_normalization_needs_it_in_the_card(tmp_path: Path) -> None:
    lite = mediapipe_file("palm_detection/palm_detection_lite.tflite")
    text = (PALM / "model.toml").read_text(encoding="utf-8")
    digest = hashlib.sha256(lite.read_bytes()).hexdigest()
    text = text.replace("palm_detection_full", "palm_detection_lite").replace(
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54", digest
    )
    (tmp_path / "model.toml").write_text(text, encoding="utf-8")
    with pytest.raises(BuildError, match="no normalization metadata") as err:
        read_card(tmp_path)
    assert "mean and std" in err.value.hint
    (tmp_path / "model.toml").write_text(
        text.replace('layout = "NCHW"\n', 'layout = "NCHW"\nmean = 0\nstd = 255\n')
    )
    card = read_card(tmp_path)
    # The lite file has no metadata: size and names from its graph, no labels.
    assert (card.preprocess.size, card.output_names, card.labels) == (
        (192, 192),
        ("Identity", "Identity_1"),
        (),
    )


def _detect(card_detector: Detector, outputs: list[np.ndarray], frame: np.ndarray) -> tuple[Detection, ...]:
    return card_detector(outputs, frame.shape[:2], ["Identity", "Identity_1"])


def test_the_palm_card_finds_the_cameramans_hands_as_litert_does() -> None:
    import torch

    card = read_card(PALM)
    assert card.detection is not None
    module = load_pytorch(card)
    frame = cameraman()
    x = preprocess(frame, card.preprocess, "RGB")  # NCHW, pixels / 255
    with torch.no_grad():
        ours = [o.numpy() for o in module(torch.from_numpy(x))]
    path, _ = tflite_file(card.source, "palm-detection")
    interp = litert.Interpreter(model_path=str(path))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    interp.invoke()
    theirs = [interp.get_tensor(o["index"]) for o in interp.get_output_details()]
    detector = Detector(card.detection, card.preprocess, card.labels)
    found, reference = _detect(detector, ours, frame), _detect(detector, theirs, frame)
    assert len(found) == len(reference) >= 1
    for a, b in zip(found, reference, strict=True):
        assert a.name == "palm" and abs(a.score - b.score) < 1e-4
        assert np.abs(np.array(a.box) - np.array(b.box)).max() < 0.05  # frame pixels
        assert np.abs(np.array(a.keypoints) - np.array(b.keypoints)).max() < 0.05
        assert len(a.keypoints) == 7
    # The palm is his gloved hand below his chin (about x 185-225, y 195-236 in the 448x448
    # frame), its seven keypoints (wrist, finger bases, thumb) on it.
    (best,) = found
    cx, cy = (best.box[0] + best.box[2]) / 2, (best.box[1] + best.box[3]) / 2
    assert 190 < cx < 220 and 200 < cy < 230 and 30 < best.box[2] - best.box[0] < 60, best.box
    assert best.score > 0.6
    margin = 5
    x0, y0, x1, y1 = best.box
    assert all(x0 - margin < kx < x1 + margin and y0 - margin < ky < y1 + margin for kx, ky in best.keypoints)


def test_tflite_file_card_takes_normalization_and_labels_from_metadata(tmp_path: Path) -> None:
    full = mediapipe_file("palm_detection/palm_detection_full.tflite")
    card = card_for_file(full)
    assert card.preprocess.size == (192, 192) and card.preprocess.layout == "NHWC"
    assert (card.preprocess.mean, card.preprocess.std) == ((0.0,) * 3, (255.0,) * 3)
    assert card.labels == ("palm",) and card.input_name == "input_1"
    # The flags win over the file.
    labels = tmp_path / "labels.txt"
    labels.write_text("hand\n", encoding="utf-8")
    told = card_for_file(full, mean=(127.5,) * 3, std=(127.5,) * 3, labels=labels)
    assert (told.preprocess.mean, told.labels) == ((127.5,) * 3, ("hand",))
    # A file without metadata still needs the flags.
    lite = tmp_path / "lite.tflite"
    shutil.copy(mediapipe_file("palm_detection/palm_detection_lite.tflite"), lite)
    with pytest.raises(BuildError, match="normalization is not known"):
        card_for_file(lite)
    assert card_for_file(lite, mean=(0.0,) * 3, std=(255.0,) * 3).labels == ()


def test_the_palm_card_takes_the_build_path_to_onnx(tmp_path: Path) -> None:
    """Exported and folded as the build does (PRELU as ONNX PRelu), onnxruntime gives LiteRT's numbers."""
    import onnx
    import onnxruntime as ort

    from edgekit.convert.onnx_export import export_pytorch, fold, output_names

    card = read_card(PALM)
    module = load_pytorch(card)
    raw = export_pytorch(module, card.preprocess, tmp_path / "raw.onnx", card.input_name, card.output_names)
    folded = fold(raw, tmp_path / "fp32.onnx", card.preprocess.input_shape)
    assert output_names(folded) == card.output_names
    graph = onnx.load(str(folded)).graph
    # Its upsampling is by scale, so the build's batch probe frees the batch dimension.
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    ops = {n.op_type for n in graph.node}
    assert "PRelu" in ops and ops <= {
        "Conv",
        "Add",
        "PRelu",
        "Pad",
        "MaxPool",
        "Concat",
        "Reshape",
        "Transpose",
        "Resize",
    }
    x = preprocess(cameraman(), card.preprocess, "RGB")
    got = ort.InferenceSession(str(folded)).run(None, {card.input_name: x})
    path, _ = tflite_file(card.source, "palm-detection")
    interp = litert.Interpreter(model_path=str(path))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    interp.invoke()
    for o, g in zip(interp.get_output_details(), got, strict=True):
        np.testing.assert_allclose(g, interp.get_tensor(o["index"]), rtol=1e-4, atol=1e-3, err_msg=o["name"])


def test_build_tflite_takes_what_the_file_says(cache_env: dict[str, str], tmp_path: Path) -> None:
    """``edgekit build --tflite`` on the palm detector without --mean/--std/--labels: the manifest has the file's."""
    full = mediapipe_file("palm_detection/palm_detection_full.tflite")
    out = tmp_path / "palm"
    r = edgekit(cache_env, "build", "--tflite", str(full), "--device", "x86_64-cpu", "-o", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = read_manifest(out)
    assert tuple(manifest.labels) == ("palm",)
    assert (list(manifest.preprocess.mean), list(manifest.preprocess.std)) == ([0.0] * 3, [255.0] * 3)
