"""The embedding API: ``edgekit.load(bundle)`` and ``Model.classify(frame)`` on a real (tiny) bundle."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import edgekit
from edgekit.bundle import pack, read_manifest
from edgekit.errors import EdgekitError, NoUsableBackendError
from edgekit.processing.postprocess import Label, softmax, top_k
from edgekit.processing.preprocessing import preprocess

from conftest import TinyArtifacts

LABELS = tuple(f"thing {i}" for i in range(10))


def test_top_k_matches_numpy_and_breaks_ties_by_id() -> None:
    scores = np.array([0.1, 3.0, 3.0, -1.0, 2.0], np.float32)
    labels = top_k(scores, ["a", "b", "c"], k=4)
    assert [lab.id for lab in labels] == [1, 2, 4, 0]
    assert [lab.name for lab in labels] == ["b", "c", "class 4", "a"]
    np.testing.assert_allclose([lab.score for lab in labels], np.sort(softmax(scores))[::-1][:4], rtol=1e-12)
    assert abs(sum(lab.score for lab in top_k(scores, [], k=99)) - 1.0) < 1e-9
    assert top_k(np.array([0.2, 0.7]), ["x", "y"], k=1, logits=False) == (Label(1, "y", pytest.approx(0.7)),)


@pytest.fixture(scope="module")
def tiny_bundles(
    tiny: TinyArtifacts, tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]
) -> dict[str, Path]:
    # Signed with the session's builder key, which the run's trust store holds (conftest).
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    out = tmp_path_factory.mktemp("tiny-bundles")
    labels = out / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    card = card_for_file(
        tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0), labels=labels, resize="squash"
    )
    made = {}
    for device, backends in (("x86_64-cpu", ("onnxruntime", "openvino", "tvm")), ("rpi5", ("tvm",))):
        req = BuildRequest(
            card=card,
            device=device,
            out=out / device,
            onnx=tiny.onnx,
            backends=backends,
            precisions=("fp32",),
            use_cache=False,
            measure_latency=False,
            sign_key=keys[0],
            tvm_untuned=True,  # the tiny model has no tuned schedules; the jetson fallback test runs TVM
        )
        made[device] = build(req).bundle
    return made


def frame() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (48, 64, 3), dtype=np.uint8)


def expected_logits(model: edgekit.Model, bgr: np.ndarray) -> np.ndarray:
    import tiny_model

    x = preprocess(bgr, model.preprocess, image_color="BGR")
    return tiny_model.reference(x, tiny_model.make_weights())[0]


def test_load_picks_the_profiles_first_candidate_and_classifies(tiny_bundles: dict[str, Path]) -> None:
    with edgekit.load(tiny_bundles["x86_64-cpu"], device="x86_64-cpu") as model:
        assert model.candidate == "onnxruntime-fp32" and model.backend == "onnxruntime"
        assert model.labels == LABELS and not model.session.fallbacks
        img = frame()
        want = expected_logits(model, img)
        np.testing.assert_allclose(model.infer(img), want, atol=1e-4)
        labels = model.classify(img, k=3)
        assert [lab.id for lab in labels] == list(np.argsort(-want)[:3])
        assert (
            labels[0].name == LABELS[labels[0].id] and labels[0].score >= labels[1].score >= labels[2].score
        )


def test_jetson_profile_falls_back_to_what_runs_here(
    tiny_bundles: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with edgekit.load(tiny_bundles["x86_64-cpu"], device="jetson") as model:
        assert model.candidate == "tvm-fp32"
        assert [who for who, _ in model.session.fallbacks] == ["tensorrt-fp16", "onnxruntime-gpu"]
        np.testing.assert_allclose(model.infer(frame()), expected_logits(model, frame()), atol=1e-4)
    assert "runs on tvm-fp32 after" in caplog.text


def test_a_tarball_loads_and_its_unpacked_copy_goes_away(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    tar = pack(tiny_bundles["x86_64-cpu"], tmp_path / "tiny.tar.gz")
    model = edgekit.load(tar, device="x86_64-cpu")
    unpacked = model.root
    assert unpacked.is_dir() and read_manifest(unpacked).model.name == "tiny"
    model.close()
    assert not unpacked.exists()


def test_a_tampered_bundle_does_not_load(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "tampered"
    shutil.copytree(tiny_bundles["x86_64-cpu"], copy)
    onnx = next(copy.glob("artifacts/onnxruntime-fp32/*.onnx"))
    onnx.write_bytes(onnx.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(EdgekitError) as err:
        edgekit.load(copy, device="x86_64-cpu")
    assert onnx.name in str(err.value)


def test_load_hashes_what_it_loads_and_checks_the_rest_by_size(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    # Hashing every artifact was a tenth of a cold start: load hashes an artifact just before it
    # loads it (alternatives included) and checks every other file's presence and size.
    copy = tmp_path / "unused-tampered"
    shutil.copytree(tiny_bundles["x86_64-cpu"], copy)
    bin_file = next(copy.glob("artifacts/openvino-fp32/*.bin"))
    data = bin_file.read_bytes()
    bin_file.write_bytes(data[:-4] + bytes(b ^ 0xFF for b in data[-4:]))  # same size, other bytes
    with edgekit.load(copy, device="x86_64-cpu") as model:
        assert model.candidate == "onnxruntime-fp32" and model.load_ms["hash"] >= 0
        with pytest.raises(EdgekitError) as err:
            model.load_alternatives()
        assert bin_file.name in str(err.value) and "tampered" in str(err.value)
    bin_file.write_bytes(data + b"x")  # another size: caught without hashing
    with pytest.raises(EdgekitError, match=bin_file.name):
        edgekit.load(copy, device="x86_64-cpu")


def test_a_bundle_records_its_interpolation_and_a_device_preprocesses_with_it(
    tiny: TinyArtifacts, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    from dataclasses import replace

    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    card = card_for_file(tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0), labels=labels)
    card = replace(card, preprocess=replace(card.preprocess, interpolation="box2-linear"))
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=tmp_path / "bundle",
        onnx=tiny.onnx,
        backends=("onnxruntime",),
        precisions=("fp32",),
        use_cache=False,
        measure_latency=False,
        sign_key=keys[0],
    )
    bundle = build(req).bundle
    assert read_manifest(bundle).preprocess.interpolation == "box2-linear"
    img = np.random.default_rng(5).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    with edgekit.load(bundle, device="x86_64-cpu") as model:
        assert model.preprocess.interpolation == "box2-linear"
        np.testing.assert_allclose(model.infer(img), expected_logits(model, img), atol=1e-4)


def test_a_bundle_with_nothing_for_this_host_lists_every_cause(tiny_bundles: dict[str, Path]) -> None:
    with pytest.raises(NoUsableBackendError) as err:
        edgekit.load(tiny_bundles["rpi5"], device="x86_64-cpu")
    causes = dict(err.value.causes)
    assert "no tvm fp32 artifact for this host" in causes["tvm-fp32"]
    assert "onnxruntime-fp32" in causes
