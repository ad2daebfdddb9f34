"""ONNX Runtime int8 of an opset-12 graph (Ultralytics exports with ``opset=12``, as the DocLayNet
YOLOv8n on PyPI is): per-channel QDQ needs opset 13's DequantizeLinear ``axis``, so the recipe
converts the graph first; quantized as it was, ORT refused to load the int8 model.

The YOLOv8-like graph of ``yolo_v8_model`` written as opset 12 (its Split's sizes an attribute;
its DFL Softmax then means opset 12's softmax over the flattened trailing axes, which the
conversion must keep), then both int8 recipes on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from yolo_v8_model import SIZE, yolo_v8_like

from edgekit.convert.heads import cache_params
from edgekit.convert.onnx_int8 import QDQ_OPSET, opset_params, quantize_onnx_int8

RNG = np.random.default_rng(12)


def _opset12(tmp_path: Path) -> Path:
    # ONNX's converter has no adapters down from 13: the one op written differently is done by hand.
    model = onnx.load(str(yolo_v8_like(tmp_path / "y13.onnx")))
    model.opset_import[0].version = 12
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Split":
            sizes = numpy_helper.to_array(initializers[node.input[1]])
            del node.input[1]
            node.attribute.append(helper.make_attribute("split", [int(v) for v in sizes]))
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "y12.onnx"
    onnx.save(model, str(path))
    return path


def _opset(path: Path) -> int:
    return int(next(o.version for o in onnx.load(str(path)).opset_import if o.domain in ("", "ai.onnx")))


@pytest.mark.parametrize("full_range", [False, True], ids=["portable", "full"])
def test_int8_of_an_opset_12_graph_loads_and_computes_what_fp32_does(
    tmp_path: Path, full_range: bool
) -> None:
    fp32 = _opset12(tmp_path)
    assert _opset(fp32) == 12
    calib = RNG.uniform(0, 1, (16, 3, SIZE, SIZE)).astype(np.float32)
    art = quantize_onnx_int8(
        fp32, tmp_path / "y-int8.onnx", calib, "x", float_layers=0, full_range=full_range
    )
    assert _opset(art.path) == QDQ_OPSET
    model = onnx.load(str(art.path))
    # Weights and biases are per channel: their DequantizeLinears carry an axis, valid from opset 13.
    assert any(
        n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute)
        for n in model.graph.node
    )
    assert "dfl" in art.notes["float_heads"]  # the conversion keeps the nodes the heads are found by
    session = ort.InferenceSession(str(art.path), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    for i in range(4):
        x = calib[i : i + 1]
        got, want = session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0]
        assert got.shape == want.shape
        assert np.abs(got[0, 4:] - want[0, 4:]).max() < 0.1  # scores
        assert np.abs(got[0, :4] - want[0, :4]).max() < 4.0  # pixels, at stride 16 at most


def test_the_cache_key_changes_for_an_old_opset_only(tmp_path: Path) -> None:
    # int8 models of an opset-12 graph cached before the conversion did not load: they are rebuilt.
    assert opset_params(_opset12(tmp_path)) == {"qdq_opset": QDQ_OPSET}
    new = yolo_v8_like(tmp_path / "y.onnx")
    assert opset_params(new) == {}
    assert cache_params(new) == cache_params(_opset12(tmp_path))
