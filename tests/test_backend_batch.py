"""Sessions that take n frames at once (Session.batchable / batched(n)), on the tiny model.

The build exports ONNX with a free batch dimension (dim 0 a ``dim_param`` named "batch"); here
the tiny model's fixed-batch ONNX (and an int8 QDQ quantization of it) are turned into such files
the same way, and an OpenVINO IR is converted from them.  A batch of n frames must give, row by
row, what n batch-1 runs give; a fixed-batch file keeps loading as before and refuses batched().
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.backends.base import Session
from edgekit.backends.onnx_batch import batch_dim_params
from edgekit.backends.registry import get as get_backend
from edgekit.errors import InputError, ModelLoadError

import tiny_model
from conftest import TinyArtifacts

ORT = {"intra_op_threads": 2}
OV = {"device": "CPU", "hint": "LATENCY"}


def free_batch(src: Path, dst: Path) -> Path:
    """``src`` with dim 0 of every graph input and output named "batch", as the build exports it.

    A Reshape to ``[1, -1]`` becomes ``[0, -1]`` (0 copies the input's dim 0), and the inferred
    shapes are dropped (they say batch 1).
    """
    import onnx

    model = onnx.load(str(src))
    for value in [*model.graph.input, *model.graph.output]:
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "batch"
    shapes = {n.input[1] for n in model.graph.node if n.op_type == "Reshape"}
    for init in model.graph.initializer:
        if init.name in shapes:
            shape = onnx.numpy_helper.to_array(init)
            if shape.ndim == 1 and shape[0] == 1:
                init.CopyFrom(onnx.numpy_helper.from_array(np.concatenate([[0], shape[1:]]), init.name))
    del model.graph.value_info[:]
    onnx.checker.check_model(model)
    dst.write_bytes(model.SerializeToString())
    return dst


def to_ir(onnx_path: Path, xml: Path) -> Path:
    import openvino as ov

    # fp32 IR: save_model would compress weights to fp16 by default.
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml), compress_to_fp16=False)
    return xml


@dataclass(frozen=True)
class Free:
    fp32: Path
    fp32_ir: Path
    int8: Path
    static_int8: Path


@pytest.fixture(scope="module")
def free(tiny: TinyArtifacts, tmp_path_factory: pytest.TempPathFactory) -> Free:
    pytest.importorskip("openvino")
    from edgekit.convert.onnx_int8 import quantize_onnx_int8

    out = tmp_path_factory.mktemp("free")
    calibration = np.random.default_rng(3).random((4, 3, 32, 32), dtype=np.float32)
    static_int8 = quantize_onnx_int8(tiny.onnx, out / "tiny-int8.onnx", calibration).path
    fp32 = free_batch(tiny.onnx, out / "free.onnx")
    return Free(
        fp32, to_ir(fp32, out / "free.xml"), free_batch(static_int8, out / "free-int8.onnx"), static_int8
    )


def frames(n: int, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).random(
        (n, 3, tiny_model.INPUT_HW, tiny_model.INPUT_HW), dtype=np.float32
    )


def load(backend: str, artifact: Path, options: dict[str, Any]) -> Session:
    return get_backend(backend).load(artifact, options)


CASES = {
    "onnxruntime-fp32": ("onnxruntime", "fp32", ORT),
    "onnxruntime-int8": ("onnxruntime", "int8", ORT),
    "openvino-ir-fp32": ("openvino", "fp32_ir", OV),
    "openvino-onnx-fp32": ("openvino", "fp32", OV),
    "openvino-onnx-int8": ("openvino", "int8", OV),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("n", [2, 3])
def test_a_batch_gives_row_by_row_what_single_frames_give(
    case: tuple[str, str, dict[str, Any]], n: int, free: Free
) -> None:
    backend, artifact, options = case
    with load(backend, getattr(free, artifact), options) as one:
        assert one.batchable
        x = frames(n)
        singles = np.concatenate([one.run(x[i : i + 1])[0] for i in range(n)])
        with one.batched(n) as many:
            assert many.inputs[0].shape == (n, 3, 32, 32)
            assert many.outputs[0].shape == (n, tiny_model.NUM_CLASSES)
            batch = many.run(x)[0]
        assert batch.shape == (n, tiny_model.NUM_CLASSES)
        if artifact == "int8":
            # Static quantization: scales are fixed at calibration, so a row's integers do not depend
            # on the other rows, and the integer sums are exact in any order.
            np.testing.assert_array_equal(batch, singles)
        else:
            np.testing.assert_allclose(batch, singles, rtol=0, atol=1e-5)
        # Closing the batched twin leaves the original running.
        assert not one.closed
        one.run(x[:1])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_free_batch_loads_pinned_to_one(case: tuple[str, str, dict[str, Any]], free: Free) -> None:
    backend, artifact, options = case
    with load(backend, getattr(free, artifact), options) as session:
        assert session.inputs[0].shape == (1, 3, 32, 32)
        assert session.outputs[0].shape == (1, tiny_model.NUM_CLASSES)
        with pytest.raises(InputError, match=r"shape \(2, 3, 32, 32\)"):  # pinned: two frames are refused
            session.run(frames(2))


STATIC = {
    "onnxruntime": ("onnxruntime", "onnx", ORT),
    "openvino-ir": ("openvino", "openvino_ir", OV),
    "openvino-onnx": ("openvino", "onnx", OV),
    "litert": ("litert", "tflite", {"num_threads": 2}),
}


@pytest.mark.parametrize("case", STATIC.values(), ids=STATIC.keys())
def test_a_fixed_batch_is_not_batchable(case: tuple[str, str, dict[str, Any]], tiny: TinyArtifacts) -> None:
    backend, artifact, options = case
    if not get_backend(backend).available(options):
        pytest.skip(f"{backend} is not available here")
    with load(backend, getattr(tiny, artifact), options) as session:
        assert not session.batchable
        with pytest.raises(ModelLoadError, match="batch is fixed at 1") as err:
            session.batched(2)
        assert "free batch dimension" in err.value.hint


def test_a_fixed_batch_int8_is_not_batchable(free: Free) -> None:
    with load("onnxruntime", free.static_int8, ORT) as session:
        assert not session.batchable
        with pytest.raises(ModelLoadError):
            session.batched(3)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_batched_does_not_read_the_file_again(
    backend: str, free: Free, tiny: TinyArtifacts, tmp_path: Path
) -> None:
    # A copy of the free-batch model, loaded, then deleted and replaced by a model with other
    # weights: the batched session must still compute the model that was loaded.
    other = free_batch(
        tiny_model.write_onnx(tmp_path / "other-static.onnx", tiny_model.make_weights(seed=11)),
        tmp_path / "other.onnx",
    )
    model = tmp_path / "model.onnx"
    model.write_bytes(free.fp32.read_bytes())
    x = frames(2)
    options = ORT if backend == "onnxruntime" else OV
    with load(backend, model, options) as one:
        model.unlink()
        os.replace(other, model)  # a new file where the loaded one was
        with one.batched(2) as many:
            got = many.run(x)[0]
    expected = np.concatenate(
        [tiny_model.reference(x[i : i + 1], tiny_model.make_weights()) for i in range(2)]
    )
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    with load(backend, model, options) as replaced:  # the new file is another model: the check can fail
        assert not np.allclose(replaced.run(x[:1])[0], expected[:1], rtol=0, atol=1e-4)


@pytest.mark.parametrize("change", ["deleted", "overwritten in place"])
def test_openvino_ir_batched_after_its_files_change(change: str, free: Free, tmp_path: Path) -> None:
    xml, bin_ = tmp_path / "m.xml", tmp_path / "m.bin"
    xml.write_bytes(free.fp32_ir.read_bytes())
    bin_.write_bytes(free.fp32_ir.with_suffix(".bin").read_bytes())
    x = frames(3)
    with load("openvino", xml, OV) as one:
        singles = np.concatenate([one.run(x[i : i + 1])[0] for i in range(3)])
        if change == "deleted":
            xml.unlink()
            bin_.unlink()
        else:  # same inode, other bytes: what a mapped .bin would show the twin
            with bin_.open("r+b") as f:
                f.write(bytes(bin_.stat().st_size))
        with one.batched(3) as many:
            np.testing.assert_allclose(many.run(x)[0], singles, rtol=0, atol=1e-5)
        np.testing.assert_allclose(one.run(x[:1])[0], singles[:1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_batched_after_the_onnx_file_is_overwritten_in_place(
    backend: str, free: Free, tmp_path: Path
) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(free.fp32.read_bytes())
    x = frames(2)
    with load(backend, model, ORT if backend == "onnxruntime" else OV) as one:
        singles = np.concatenate([one.run(x[i : i + 1])[0] for i in range(2)])
        with model.open("r+b") as f:
            f.write(bytes(model.stat().st_size))
        with one.batched(2) as many:
            np.testing.assert_allclose(many.run(x)[0], singles, rtol=0, atol=1e-5)


def test_the_twin_keeps_the_originals_options_and_candidate(free: Free) -> None:
    with load("onnxruntime", free.fp32, {"intra_op_threads": 1}) as one:
        one.candidate = "onnxruntime-fp32"
        one.fallbacks = (("tensorrt-fp16", "no GPU"),)
        with one.batched(2) as many:
            assert many.candidate == "onnxruntime-fp32"
            assert many.fallbacks == one.fallbacks
            assert many.device == one.device
            assert many.batchable
            assert many._sess.get_session_options().intra_op_num_threads == 1  # type: ignore[attr-defined]
            # A twin of a twin is again the same model at its own batch.
            with many.batched(3) as three:
                assert three.inputs[0].shape[0] == 3
    with load("openvino", free.fp32_ir, {**OV, "num_threads": 1}) as one, one.batched(2) as many:
        assert many.compute_precision == one.compute_precision == "f32"
        assert many.device == one.device


def test_batched_refuses_a_bad_n_and_a_closed_session(free: Free) -> None:
    session = load("onnxruntime", free.fp32, ORT)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ModelLoadError, match="not a whole number"):
            session.batched(bad)  # type: ignore[arg-type]
    session.close()
    with pytest.raises(ModelLoadError, match="closed"):
        session.batched(2)


def test_the_free_batch_is_read_from_the_file_itself(free: Free, tiny: TinyArtifacts) -> None:
    assert batch_dim_params(free.fp32.read_bytes()) == ("batch",)
    assert batch_dim_params(free.int8.read_bytes()) == ("batch",)
    assert batch_dim_params(tiny.onnx.read_bytes()) is None
    assert batch_dim_params(b"not an onnx file") is None
    assert batch_dim_params(free.fp32.read_bytes()[:200]) is None  # truncated


def test_batchable_only_when_every_input_and_output_is_free(free: Free, tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(free.fp32))
    # Old IR versions list weights among the inputs, with their fixed shapes: not inputs a caller feeds.
    weight = model.graph.initializer[0]
    model.graph.input.append(onnx.helper.make_tensor_value_info(weight.name, weight.data_type, weight.dims))
    assert batch_dim_params(model.SerializeToString()) == ("batch",)
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1  # the output's batch fixed
    assert batch_dim_params(model.SerializeToString()) is None
    path = tmp_path / "half.onnx"
    path.write_bytes(model.SerializeToString())
    with load("onnxruntime", path, ORT) as session:
        assert not session.batchable


def test_a_free_batch_model_with_external_data_loads_from_its_bytes(free: Free, tmp_path: Path) -> None:
    import onnx

    # Made from bytes, the session finds the weights beside the file, as a session made from the path does.
    onnx.save_model(
        onnx.load(str(free.fp32)),
        str(tmp_path / "m.onnx"),
        save_as_external_data=True,
        location="m.weights",
        size_threshold=0,
    )
    x = frames(2)
    with load("onnxruntime", tmp_path / "m.onnx", ORT) as one, one.batched(2) as many:
        singles = np.concatenate([one.run(x[i : i + 1])[0] for i in range(2)])
        np.testing.assert_allclose(many.run(x)[0], singles, rtol=0, atol=1e-5)
