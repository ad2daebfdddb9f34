"""The build's fp32 graph has a free batch where a batch provably computes what each frame alone does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.convert.onnx_export import BATCH_DIM, fold, pin_batch

W = np.arange(15, dtype=np.float32).reshape(3, 5) / 10


def graph(path: Path, flatten: str) -> Path:
    # input [1,3,4,4] -> global average pool -> (Reshape [1, -1] | Flatten axis 0) -> MatMul -> [1, 5]
    nodes = [helper.make_node("GlobalAveragePool", ["input"], ["pooled"])]
    inits = [numpy_helper.from_array(W, "w")]
    if flatten == "reshape":
        inits.append(numpy_helper.from_array(np.array([1, -1], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["pooled", "shape"], ["flat"]))
    else:  # axis 0 folds the batch into the features: a batch of two is not two frames
        nodes.append(helper.make_node("Flatten", ["pooled"], ["flat"], axis=0))
    nodes.append(helper.make_node("MatMul", ["flat", "w"], ["logits"]))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def first_dims(path: Path) -> list[int | str]:
    m = onnx.load(str(path))
    return [
        t.type.tensor_type.shape.dim[0].dim_param or t.type.tensor_type.shape.dim[0].dim_value
        for t in [*m.graph.input, *m.graph.output]
    ]


def test_a_batch_of_frames_computes_each_frame_as_alone(tmp_path: Path) -> None:
    out = fold(graph(tmp_path / "raw.onnx", "reshape"), tmp_path / "m-fp32.onnx", (1, 3, 4, 4))
    assert first_dims(out) == [BATCH_DIM, BATCH_DIM]
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((3, 3, 4, 4)).astype(np.float32)
    both = sess.run(None, {"input": x})[0]
    alone = np.concatenate([sess.run(None, {"input": x[i : i + 1]})[0] for i in range(3)])
    assert both.shape == (3, 5)
    np.testing.assert_allclose(both, alone, rtol=1e-6)
    np.testing.assert_allclose(alone, x.mean(axis=(2, 3)) @ W, rtol=1e-5)  # and it is still the model


def test_a_graph_that_bakes_its_batch_in_stays_static(tmp_path: Path) -> None:
    out = fold(graph(tmp_path / "raw.onnx", "flatten0"), tmp_path / "m-fp32.onnx", (1, 3, 4, 4))
    assert first_dims(out) == [1, 1]
    assert not list(tmp_path.glob(".*"))  # no candidate left behind


def test_pin_batch_gives_compilers_one_frame(tmp_path: Path) -> None:
    out = fold(graph(tmp_path / "raw.onnx", "reshape"), tmp_path / "m-fp32.onnx", (1, 3, 4, 4))
    pinned = pin_batch(onnx.load(str(out)))
    assert [
        t.type.tensor_type.shape.dim[0].dim_value for t in [*pinned.graph.input, *pinned.graph.output]
    ] == [
        1,
        1,
    ]
