"""``edgekit build`` end to end on the reference model, as a user runs it.

One x86_64-cpu bundle is built once per test session through the real command; the rpi5
and Jetson bundles reuse its cached steps.  Every artifact that can run here is loaded on
its backend and must still recognise the cat and the espresso.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.backends import open_session
from edgekit.bundle import read_manifest, verify
from edgekit.convert.images import smoke_set
from edgekit.convert.modelcard import read_card
from edgekit.core.elf import elf_arch, host_arch
from edgekit.processing.tensors import from_output, to_input

from conftest import CARD, ROOT, edgekit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def images() -> tuple[np.ndarray, np.ndarray]:
    spec = read_card(CARD).preprocess
    s = smoke_set()
    return s.batch(spec)[0:1], s.batch(spec)[3:4]  # chelsea, coffee


def top(session: Any, x: np.ndarray, k: int) -> list[int]:
    y = from_output(session.run(to_input(x, session.inputs[0]))[0], session.outputs[0]).reshape(-1)
    return [int(i) for i in np.argsort(-y)[:k]]


def test_every_artifact_still_sees_the_cat_and_the_espresso(
    x86_bundle: tuple[Path, dict[str, Any]], images: tuple[np.ndarray, np.ndarray]
) -> None:
    bundle, _ = x86_bundle
    manifest = read_manifest(bundle)
    kinds = {(a.backend, a.precision) for a in manifest.artifacts}
    assert {
        ("onnxruntime", "fp32"),
        ("openvino", "fp32"),
        ("litert", "fp32"),
        ("tvm", "fp32"),
        ("onnxruntime", "int8"),
        ("openvino", "int8"),
        ("litert", "int8"),
    } <= kinds
    chelsea, coffee = images
    for a in manifest.artifacts:
        with open_session(bundle / a.path, a.backend) as s:
            cat = top(s, chelsea, 3)
            assert 285 in cat and (281 in cat or 282 in cat), (a.name, cat)
            assert top(s, coffee, 1) == [967], a.name


def test_int8_artifacts_pass_the_gate_and_the_manifest_says_so(
    x86_bundle: tuple[Path, dict[str, Any]],
) -> None:
    bundle, summary = x86_bundle
    for a in read_manifest(bundle).artifacts:
        assert a.accuracy is not None and a.accuracy.smoke_set, a.name
        assert a.accuracy.passed and a.accuracy.top1_agreement >= 0.98, a.name
        assert a.latency is not None and a.latency.p50_ms > 0
        for f in a.files:
            assert (bundle / f.path).stat().st_size == f.size
    assert summary["smoke_set"] is True and summary["eval_images"] >= 30


def test_bundle_verifies_with_the_key_and_not_when_tampered(
    x86_bundle: tuple[Path, dict[str, Any]],
    keys: tuple[Path, Path],
    cache_env: dict[str, str],
    tmp_path: Path,
) -> None:
    bundle, _ = x86_bundle
    assert verify(bundle, [keys[1]], require_signature=True).ok
    copy = tmp_path / "tampered"
    shutil.copytree(bundle, copy)
    victim = next(
        a for a in read_manifest(copy).artifacts if a.backend == "onnxruntime" and a.precision == "int8"
    )
    path = copy / victim.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    r = edgekit(cache_env, "verify", str(copy), "--key", str(keys[1]))
    assert (
        r.returncode == 2
        and victim.path.split("/")[-1] in r.stderr + r.stdout
        and "Traceback" not in r.stderr
    )


def test_second_build_is_served_from_the_cache(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str], tmp_path: Path
) -> None:
    r = edgekit(
        cache_env,
        "build",
        "--model",
        str(CARD),
        "--device",
        "x86_64-cpu",
        "-o",
        str(tmp_path / "again"),
        "--precisions",
        "fp32,int8",
        "--backends",
        "onnxruntime,tvm",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert {"fp32-onnx", "tvm-fp32", "onnxruntime-int8-full"} <= set(report["cache_hits"])
    # Artifacts read back from the cache are the recipes that made them (variant and all).
    first = {
        a["recipe"]: a["path"] for a in x86_bundle[1]["artifacts"] if a["backend"] in ("onnxruntime", "tvm")
    }
    assert {a["recipe"]: a["path"] for a in report["artifacts"]} == first
    assert {a.name for a in read_manifest(tmp_path / "again").artifacts} == set(first)


@pytest.mark.parametrize("device", ["rpi5", "jetson"])
def test_arm_bundles_hold_an_aarch64_tvm_library(
    device: str, x86_bundle: Any, cache_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / device
    r = edgekit(cache_env, "build", "--model", str(CARD), "--device", device, "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = read_manifest(out)
    (lib,) = [a for a in manifest.artifacts if a.backend == "tvm"]
    assert lib.arch == "aarch64" and elf_arch(out / lib.path) == "aarch64"
    assert lib.latency is None or host_arch() == "aarch64"  # not timed on a host of another architecture
    if device == "jetson":
        (trt,) = [a for a in manifest.artifacts if a.backend == "tensorrt"]
        files = {Path(f.path).name for f in trt.files}
        assert any(n.endswith(".onnx") for n in files) and any(n.endswith(".trt.json") for n in files)
        config = json.loads(
            next((out / f.path) for f in trt.files if f.path.endswith(".trt.json")).read_text()
        )
        assert config["precision"] == "fp16" and config["options"]["fp16"] is True


def test_unknown_device(cache_env: dict[str, str], tmp_path: Path) -> None:
    r = edgekit(cache_env, "build", "--model", str(CARD), "--device", "jetsn", "-o", str(tmp_path / "b"))
    assert r.returncode == 2 and "unknown device 'jetsn'" in r.stderr and not (tmp_path / "b").exists()


def test_corrupt_onnx_is_refused_and_nothing_is_written(cache_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf" * 10)
    out = tmp_path / "b"
    r = edgekit(
        cache_env,
        "build",
        "--onnx",
        str(bad),
        "--device",
        "x86_64-cpu",
        "-o",
        str(out),
        "--mean",
        "127",
        "--std",
        "128",
        "--input-size",
        "224,224",
    )
    assert r.returncode == 2 and "broken.onnx" in r.stderr and "not a valid ONNX model" in r.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["broken.onnx"]


def test_unsupported_operator_names_the_op_and_the_target(cache_env: dict[str, str], tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
            helper.make_node("Celu", ["c"], ["y"]),
        ],
        "celu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [onnx.numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")],
    )
    path = tmp_path / "celu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    out = tmp_path / "b"
    r = edgekit(
        cache_env,
        "build",
        "--onnx",
        str(path),
        "--device",
        "rpi5",
        "--backends",
        "tvm",
        "-o",
        str(out),
        "--mean",
        "0",
        "--std",
        "1",
    )
    assert r.returncode == 2, r.stdout
    assert "Celu" in r.stderr and "tvm" in r.stderr and "rpi5" in r.stderr
    assert not out.exists()


def test_user_onnx_needs_its_normalisation(cache_env: dict[str, str], tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    r = edgekit(cache_env, "build", "--onnx", str(path), "--device", "x86_64-cpu", "-o", str(tmp_path / "b"))
    assert r.returncode == 2 and "--mean" in r.stderr and "normalization" in r.stderr


def test_a_user_tflite_is_bundled_as_it_is(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str], tmp_path: Path
) -> None:
    bundle, _ = x86_bundle
    fp32 = next(a for a in read_manifest(bundle).artifacts if a.backend == "litert" and a.precision == "fp32")
    out = tmp_path / "from-tflite"
    r = edgekit(
        cache_env,
        "build",
        "--tflite",
        str(bundle / fp32.path),
        "--device",
        "pi",
        "-o",
        str(out),
        "--mean",
        "127",
        "--std",
        "128",
        "--labels",
        str(ROOT / "models/labels/imagenet-1k.txt"),
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = read_manifest(out)
    assert [(a.backend, a.precision) for a in manifest.artifacts] == [("litert", "fp32")]
    assert manifest.preprocess.layout == "NHWC" and tuple(manifest.preprocess.size) == (224, 224)
    assert len(manifest.labels) == 1000 and manifest.device.profile == "rpi5"
    skipped = {a["recipe"]: a["skipped"] for a in json.loads(r.stdout)["artifacts"] if a["skipped"]}
    assert "tvm-fp32" in skipped and "no converter starts from .tflite" in skipped["tvm-fp32"]


def test_a_pytorch_module_builds_through_onnx_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import ModelCard
    from edgekit.processing.preprocessing import PreprocessSpec

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 5),
    ).eval()
    spec = PreprocessSpec(size=(32, 32), mean=(127.5,) * 3, std=(127.5,) * 3)
    card = ModelCard(
        "tiny-torch",
        "0.1",
        "a test net",
        "MIT",
        "",
        {"kind": "pytorch"},
        "input",
        "logits",
        spec,
        tuple(f"class {i}" for i in range(5)),
    )
    result = build(
        BuildRequest(
            card=card,
            device="x86_64-cpu",
            out=tmp_path / "b",
            pytorch_module=module,
            backends=("onnxruntime", "openvino"),
            precisions=("fp32",),
        )
    )
    manifest = read_manifest(result.bundle)
    assert {a.name for a in manifest.artifacts} == {"onnxruntime-fp32", "openvino-fp32"}
    x = torch.rand(1, 3, 32, 32)
    expected = module(x).detach().numpy()
    for a in manifest.artifacts:
        with open_session(result.bundle / a.path, a.backend) as s:
            np.testing.assert_allclose(s.run(x.numpy())[0], expected, atol=1e-4)
