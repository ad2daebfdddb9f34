"""ONNX int8 and OpenVINO IR artifacts, built from the real reference model with edgekit's own code.

The reference fp32 ONNX is exported and folded once per module; each artifact is then built
from it, loaded through ``edgekit.backends.open_session`` and must still recognise the cat
and the espresso.  The error-path tests use the tiny model and take a second each.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgekit.backends import open_session
from edgekit.convert.artifact import Artifact
from edgekit.errors import BuildError

import tiny_model

ROOT = Path(__file__).resolve().parents[1]
CHELSEA, COFFEE = 0, 3  # indices in the smoke set
EGYPTIAN_CAT, ESPRESSO = 285, 967

for _module in ("onnxruntime", "openvino", "nncf"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed (pip install -e '.[all]')", allow_module_level=True)

from edgekit.convert.onnx_int8 import quantize_onnx_int8  # noqa: E402 - after the skip
from edgekit.convert.openvino_ir import convert_openvino, quantize_openvino_int8  # noqa: E402


@dataclass(frozen=True)
class Reference:
    onnx: Path
    calibration: np.ndarray  # the 12 original smoke photographs
    chelsea: np.ndarray
    coffee: np.ndarray
    params: int  # number of weights and biases in the fp32 graph


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[build]')")
    pytest.importorskip("efficientnet_lite_pytorch", reason="the reference model packages are not installed")
    import onnx

    from edgekit.convert.images import smoke_set
    from edgekit.convert.model_sources import load_pytorch
    from edgekit.convert.modelcard import read_card
    from edgekit.convert.onnx_export import export_pytorch, fold

    card = read_card(ROOT / "models" / "efficientnet-lite0")
    d = tmp_path_factory.mktemp("reference")
    raw = export_pytorch(
        load_pytorch(card), card.preprocess, d / "raw.onnx", card.input_name, card.output_name
    )
    fp32 = fold(raw, d / f"{card.name}-fp32.onnx", card.preprocess.input_shape)
    batch = smoke_set().batch(card.preprocess)
    params = sum(int(np.prod(t.dims)) for t in onnx.load(str(fp32)).graph.initializer)
    return Reference(fp32, batch[::3], batch[CHELSEA : CHELSEA + 1], batch[COFFEE : COFFEE + 1], params)


def assert_recognises(artifact: Artifact, ref: Reference) -> None:
    session = open_session(artifact.path)
    cat = session.run(ref.chelsea)[0][0]
    cup = session.run(ref.coffee)[0][0]
    assert EGYPTIAN_CAT in np.argsort(cat)[-3:], f"{artifact.key}: chelsea top-3 {np.argsort(cat)[-3:]}"
    assert int(np.argmax(cup)) == ESPRESSO, f"{artifact.key}: coffee top-1 {int(np.argmax(cup))}"


def assert_only(out_dir: Path, artifact: Artifact) -> None:
    """Only the artifact's own files are in ``out_dir``: no temporary file left behind."""
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(p.name for p in artifact.all_files)


@pytest.mark.slow
def test_onnx_int8_recognises_and_is_int8(ref: Reference, tmp_path: Path) -> None:
    import onnx

    art = quantize_onnx_int8(ref.onnx, tmp_path / "efficientnet-lite0-int8.onnx", ref.calibration)
    assert (art.backend, art.precision, art.kind, art.files) == ("onnxruntime", "int8", "onnx", (art.path,))
    assert art.notes["calibration_images"] == len(ref.calibration)
    assert_only(tmp_path, art)
    assert_recognises(art, ref)
    graph = onnx.load(str(art.path)).graph
    int8_weights = [t for t in graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) > 1]
    assert len(int8_weights) > 30  # the convolutions' weights are stored as int8
    assert art.path.stat().st_size < ref.onnx.stat().st_size / 3


@pytest.mark.slow
def test_openvino_fp32_and_fp16_weights_have_their_size(ref: Reference, tmp_path: Path) -> None:
    fp32 = convert_openvino(ref.onnx, tmp_path, "fp32")
    fp16 = convert_openvino(ref.onnx, tmp_path, "fp16")
    for art, precision in ((fp32, "fp32"), (fp16, "fp16")):
        assert (art.backend, art.precision, art.kind) == ("openvino", precision, "openvino-ir")
        assert [p.name for p in art.files] == [
            f"efficientnet-lite0-{precision}.xml",
            f"efficientnet-lite0-{precision}.bin",
        ]
        assert_recognises(art, ref)
    # save_model compresses to fp16 unless told not to: the fp32 IR must really hold 4 bytes a weight.
    assert fp32.files[1].stat().st_size == pytest.approx(4 * ref.params, rel=0.02)
    assert fp16.files[1].stat().st_size == pytest.approx(2 * ref.params, rel=0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in fp32.files + fp16.files)


@pytest.mark.slow
def test_openvino_int8_recognises_and_is_smaller(ref: Reference, tmp_path: Path) -> None:
    art = quantize_openvino_int8(ref.onnx, tmp_path, ref.calibration)
    assert (art.backend, art.precision, art.kind) == ("openvino", "int8", "openvino-ir")
    assert [p.name for p in art.files] == ["efficientnet-lite0-int8.xml", "efficientnet-lite0-int8.bin"]
    assert art.notes["calibration_images"] == len(ref.calibration)
    assert_only(tmp_path, art)
    assert_recognises(art, ref)
    assert art.files[1].stat().st_size < 1.5 * ref.params  # int8 weights, a few fp32 layers


# --- error paths, on the tiny model -------------------------------------------------------


@pytest.fixture
def corrupt_onnx(tmp_path: Path) -> Path:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"\x08\x07not a protobuf at all" * 10)
    return path


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    return tiny_model.write_onnx(tmp_path / "tiny-fp32.onnx", tiny_model.make_weights())


def tiny_calibration(n: int = 4) -> np.ndarray:
    return np.concatenate([tiny_model.sample_input(seed) for seed in range(n)])


def test_corrupt_onnx_is_a_build_error_naming_the_file(corrupt_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    builds = [
        lambda: quantize_onnx_int8(corrupt_onnx, out / "corrupt-int8.onnx", tiny_calibration()),
        lambda: convert_openvino(corrupt_onnx, out, "fp32"),
        lambda: quantize_openvino_int8(corrupt_onnx, out, tiny_calibration()),
    ]
    for build in builds:
        with pytest.raises(BuildError, match=r"corrupt\.onnx"):
            build()
    assert not out.exists() or not any(out.iterdir())


def test_tiny_model_builds_every_artifact_with_nothing_else_left(tiny_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    x = tiny_model.sample_input()
    expected = tiny_model.reference(x, tiny_model.make_weights())
    arts = [
        quantize_onnx_int8(tiny_onnx, out / "tiny-int8.onnx", tiny_calibration()),
        convert_openvino(tiny_onnx, out, "fp32"),
        convert_openvino(tiny_onnx, out, "fp16"),
        quantize_openvino_int8(tiny_onnx, out, tiny_calibration()),
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for a in arts for p in a.all_files)
    for art in arts:
        got = open_session(art.path).run(x)[0]
        # A model this small is quantized whole (no layer is kept in fp32).
        assert art.notes.get("float_layers", []) == []
        assert int(np.argmax(got)) == int(np.argmax(expected)), art.key
        assert np.abs(got - expected).max() < 0.1 * np.ptp(expected), art.key


def test_calibration_of_the_wrong_shape_is_refused_before_anything_is_written(
    tiny_onnx: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    wrong = np.zeros((2, 3, 16, 16), np.float32)  # the model takes 32x32
    with pytest.raises(BuildError, match=r"tiny-fp32\.onnx.*takes float32\[N, 3, 32, 32\]"):
        quantize_onnx_int8(tiny_onnx, out / "tiny-int8.onnx", wrong)
    with pytest.raises(BuildError, match=r"tiny-fp32\.onnx.*takes float32\[N, 3, 32, 32\]"):
        quantize_openvino_int8(tiny_onnx, out, wrong)
    assert not out.exists()


def test_a_write_that_fails_halfway_leaves_nothing(
    tiny_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime.quantization
    import openvino

    def ort_dies_writing(model: object, output: Path, *args: object, **kwargs: object) -> None:
        Path(output).write_bytes(b"half a model")
        raise RuntimeError("disk full")

    def ov_dies_writing(model: object, path: str, **kwargs: object) -> None:
        Path(path).write_text("<net>")
        Path(path).with_suffix(".bin").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(onnxruntime.quantization, "quantize_static", ort_dies_writing)
    monkeypatch.setattr(openvino, "save_model", ov_dies_writing)
    out = tmp_path / "out"
    with pytest.raises(BuildError, match="disk full"):
        quantize_onnx_int8(tiny_onnx, out / "tiny-int8.onnx", tiny_calibration())
    with pytest.raises(BuildError, match="disk full"):
        convert_openvino(tiny_onnx, out, "fp32")
    with pytest.raises(BuildError, match="disk full"):
        quantize_openvino_int8(tiny_onnx, out, tiny_calibration())
    assert list(out.iterdir()) == []


def test_bad_arguments_are_build_errors(tiny_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no input named 'pixels'"):
        quantize_onnx_int8(tiny_onnx, tmp_path / "x.onnx", tiny_calibration(), input_name="pixels")
    with pytest.raises(BuildError, match="takes float32"):
        quantize_onnx_int8(tiny_onnx, tmp_path / "x.onnx", tiny_calibration().astype(np.float64))
    with pytest.raises(BuildError, match="precision 'int4'"):
        convert_openvino(tiny_onnx, tmp_path, "int4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-fp32.onnx"]
