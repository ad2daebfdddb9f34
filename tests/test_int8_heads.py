"""Which layers an int8 recipe keeps in float as a detector's output heads (``edgekit.convert.heads``).

Graphs built here with onnx.helper: a detector's two convolution heads reshaped and
concatenated into ``[1, N, K]`` outputs (scores as logits or through a Sigmoid), a classifier
ending in a Gemm (rank-2 logits: no head), and a YOLOv8-like detector whose output
concatenates boxes decoded by a DFL (Softmax, a 1x1 convolution with weights 0..R-1, anchor
arithmetic, strides) with Sigmoid class scores.  Then the ONNX Runtime and OpenVINO int8
recipes on them: the heads stay float on int8 features.  (What BlazeFace's int8 artifacts compute is checked on the real model in
test_build_detection.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from yolo_v8_model import SCALES, SIZE, yolo_v8_like, yolo_v8_module

from edgekit.convert.heads import RECIPE, branches, cache_params, onnx_heads, walk
from edgekit.convert.onnx_int8 import quantize_onnx_int8
from edgekit.convert.openvino_ir import quantize_openvino_int8

RNG = np.random.default_rng(18)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _conv(name: str, x: str, w: str, b: str) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w, b], [f"{name}_out"], name=name)


def detector(path: Path, *, sigmoid_scores: bool = False) -> Path:
    """A two-scale SSD-like graph: features (Conv, Relu, a residual block, MaxPool), then per scale a box head (4 values)
    and a score head (1 value) as 1x1 convs, each Transposed and Reshaped to rows, the scales
    concatenated: boxes [1, 80, 4] and scores [1, 80, 1]."""
    init = [
        _weight("w0", 8, 3, 3, 3),
        _weight("b0", 8),
        _weight("w1", 8, 8, 3, 3),
        _weight("b1", 8),
        numpy_helper.from_array(np.array([1, -1, 4], np.int64), "rows4"),
        numpy_helper.from_array(np.array([1, -1, 1], np.int64), "rows1"),
    ]
    init += [_weight("w2", 8, 8, 3, 3), _weight("b2", 8)]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="feat0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["f0"], name="relu0"),
        # A residual block as BlazeFace's: its Relu read by a MaxPool and by the heads.
        helper.make_node("Conv", ["f0", "w1", "b1"], ["c1"], name="feat1", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "f0"], ["a1"], name="add1"),
        helper.make_node("Relu", ["a1"], ["f1"], name="relu1"),  # 8x8 features
        helper.make_node("MaxPool", ["f1"], ["g1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["g1", "w2", "b2"], ["c2"], name="feat2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["f2"], name="relu2"),  # 4x4 features
    ]
    for scale, f in (("s0", "f1"), ("s1", "f2")):
        for what, k in (("box", 4), ("score", 1)):
            name = f"{what}_{scale}"
            init += [_weight(f"{name}_w", 2 * k, 8, 1, 1), _weight(f"{name}_b", 2 * k)]
            nodes += [
                _conv(name, f, f"{name}_w", f"{name}_b"),
                helper.make_node(
                    "Transpose", [f"{name}_out"], [f"{name}_t"], name=f"{name}_t", perm=[0, 2, 3, 1]
                ),
                helper.make_node("Reshape", [f"{name}_t", f"rows{k}"], [f"{name}_r"], name=f"{name}_r"),
            ]
    scores = "scores_raw" if sigmoid_scores else "scores"
    nodes += [
        helper.make_node("Concat", ["box_s0_r", "box_s1_r"], ["boxes"], name="boxes_cat", axis=1),
        helper.make_node("Concat", ["score_s0_r", "score_s1_r"], [scores], name="scores_cat", axis=1),
    ]
    if sigmoid_scores:
        nodes.append(helper.make_node("Sigmoid", ["scores_raw"], ["scores"], name="sigmoid"))
    graph = helper.make_graph(
        nodes,
        "detector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 160, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 160, 1]),
        ],
        init,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def classifier(path: Path) -> Path:
    """Conv, Relu, global pooling, Flatten, Gemm: logits [1, 5]."""
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="feat0", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c0"], ["f0"], name="relu0"),
            helper.make_node("GlobalAveragePool", ["f0"], ["p"], name="pool"),
            helper.make_node("Flatten", ["p"], ["flat"], name="flatten"),
            helper.make_node("Gemm", ["flat", "wfc", "bfc"], ["logits"], name="fc", transB=1),
        ],
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
        [_weight("w0", 8, 3, 3, 3), _weight("b0", 8), _weight("wfc", 5, 8), _weight("bfc", 5)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


HEADS = ["box_s0", "score_s0", "box_s1", "score_s1"]
SHAPES = [f"{h}_{op}" for h in HEADS for op in ("t", "r")]


def test_a_detectors_heads_are_its_output_convolutions_and_the_shape_ops_after_them(tmp_path: Path) -> None:
    found = onnx_heads(onnx.load(str(detector(tmp_path / "d.onnx"))))
    assert set(found) == {*HEADS, *SHAPES, "boxes_cat", "scores_cat"}
    assert not {"feat0", "feat1", "feat2", "add1", "relu1", "pool1"} & set(found)


def test_a_classifier_has_no_head_and_a_sigmoid_is_walked_through(tmp_path: Path) -> None:
    assert onnx_heads(onnx.load(str(classifier(tmp_path / "c.onnx")))) == []
    # The scores come out of a Sigmoid: it is computed in float from the float score heads.
    found = onnx_heads(onnx.load(str(detector(tmp_path / "s.onnx", sigmoid_scores=True))))
    assert set(found) == {*HEADS, *SHAPES, "boxes_cat", "scores_cat", "sigmoid"}


def test_walk_keeps_a_pass_node_only_when_a_head_lies_behind_it() -> None:
    edges = {"cat": ["r1", "r2"], "r1": ["conv"], "r2": ["input"], "conv": ["input"], "input": []}
    kinds = {"cat": "pass", "r1": "pass", "r2": "pass", "conv": "head", "input": ""}
    found = walk(["cat"], lambda n: edges[n], lambda n: kinds[n])
    assert sorted(found) == ["cat", "conv", "r1"]


def test_walk_goes_on_behind_a_decoder_fed_by_a_softmax_only() -> None:
    edges = {
        "mul": ["dfl", "sig"],
        "dfl": ["t"],  # the DFL's convolution reads a Softmax through a Transpose
        "t": ["softmax"],
        "softmax": ["box"],
        "sig": ["cls"],
        "box": ["feat"],
        "cls": ["feat"],
        "feat": ["input"],
        "input": [],
    }
    kinds = {"softmax": "softmax", "dfl": "head", "box": "head", "cls": "head", "feat": "head", "input": ""}
    found = walk(["mul"], lambda n: edges[n], lambda n: kinds.get(n, "pass"))
    assert sorted(found) == ["box", "cls", "dfl", "mul", "sig", "softmax", "t"]  # not the features
    # A head reading two joined inputs (an attention's scores times values) is no decoder.
    edges |= {"dfl": ["matmul"], "matmul": ["softmax", "feat"]}
    found = walk(["mul"], lambda n: edges[n], lambda n: kinds.get(n, "pass"))
    assert sorted(found) == ["cls", "dfl", "mul", "sig"]


def _calibration() -> np.ndarray:
    return RNG.uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32)


def _run(path: Path, x: np.ndarray) -> list[Any]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, {"x": x}))


def test_onnx_int8_keeps_the_heads_float_on_int8_features(tmp_path: Path) -> None:
    fp32 = detector(tmp_path / "d.onnx")
    calib = _calibration()
    for full in (False, True):
        # No float first layers: the features feeding the heads are int8 in both recipes.
        art = quantize_onnx_int8(
            fp32, tmp_path / f"d-int8-{full}.onnx", calib, "x", float_layers=0, full_range=full
        )
        model = onnx.load(str(art.path))
        nodes = {n.name: n for n in model.graph.node}
        floats = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
        for head in HEADS:
            # The head reads float weights straight from an initializer, its input dequantized int8.
            assert nodes[head].input[1] in floats, head
            assert nodes[head].input[0].endswith("DequantizeLinear_Output"), nodes[head].input
        assert not any(
            n.op_type == "QuantizeLinear" and n.input[0] in ("boxes", "scores") for n in model.graph.node
        )
        assert art.notes["float_heads"][:2] == ["box_s0", "box_s0_t"]
        # Scores are not on one 8-bit output grid: every row its own value.
        x = calib[:1]
        scores = _run(art.path, x)[1]
        assert len(np.unique(scores)) == scores.size
        reference = _run(fp32, x)[1]
        assert np.abs(scores - reference).max() < 0.25 * np.abs(reference).max()


def test_onnx_int8_of_a_classifier_has_no_float_head_note(tmp_path: Path) -> None:
    art = quantize_onnx_int8(classifier(tmp_path / "c.onnx"), tmp_path / "c-int8.onnx", _calibration(), "x")
    assert "float_heads" not in art.notes
    model = onnx.load(str(art.path))
    fc = next(n for n in model.graph.node if n.name == "fc")
    assert fc.input[1].endswith("DequantizeLinear_Output")  # the classifier's Gemm is int8 as before


def test_openvino_int8_ignores_the_heads(tmp_path: Path) -> None:
    import openvino as ov

    fp32 = detector(tmp_path / "d.onnx")
    art = quantize_openvino_int8(fp32, tmp_path / "ov", _calibration())
    heads = art.notes["float_heads"]
    # OpenVINO names an op producing a graph output after the output.
    assert {"box_s0", "score_s1", "boxes", "scores"} <= set(heads)
    model = ov.Core().read_model(str(art.path))
    fake_quantized = {
        consumer.get_node().get_friendly_name()
        for op in model.get_ordered_ops()
        if op.get_type_name() == "FakeQuantize"
        for consumer in op.output(0).get_target_inputs()
    }
    assert fake_quantized, "the features are quantized"
    assert not fake_quantized & set(heads)


def test_the_cache_key_changes_for_a_detector_only(tmp_path: Path) -> None:
    assert cache_params(detector(tmp_path / "d.onnx")) == {"float_heads": RECIPE}
    assert cache_params(classifier(tmp_path / "c.onnx")) == {}  # a classifier's keys stay as they were


def test_a_new_float_head_recipe_rebuilds_a_detectors_int8_steps_and_nothing_else(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The build's int8 steps (ONNX Runtime, OpenVINO, LiteRT) are keyed by the recipe: no stale int8 reused."""
    from detector_bundle import BLAZEFACE, blazeface_key

    from edgekit.convert import heads
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import read_card

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    private, _ = blazeface_key(tmp_path)

    def hits(out: str) -> list[str]:
        result = build(
            BuildRequest(
                card=read_card(BLAZEFACE),
                device="x86_64-cpu",
                out=tmp_path / out,
                backends=("onnxruntime", "litert"),
                precisions=("int8",),
                sign_key=private,
                measure_latency=False,
            )
        )
        return sorted(result.cache_hits)

    hits("first")
    assert hits("again") == ["fp32-onnx", "litert", "onnxruntime-int8", "onnxruntime-int8-full"]
    monkeypatch.setattr(heads, "RECIPE", heads.RECIPE + 1)
    assert hits("new-recipe") == ["fp32-onnx"]  # the same fp32 model, every int8 step made anew


# -- a YOLOv8-like detector: DFL boxes and Sigmoid scores in one output ------------------------

YOLO_HEADS = [f"{branch}_{scale}_out" for scale, _, _ in SCALES for branch in ("box", "cls")]
YOLO_FEATURES = ["stem", "down"]  # each read by a box and a class branch (and the stem by "down")
# Each head's own branch: the Conv+SiLU before its 1x1 convolution (YOLOv8's cv2.i.0-1, cv3.i.0-1).
YOLO_BRANCHES = [f"{b}_{scale}_0" for scale, _, _ in SCALES for b in ("box", "cls")]


def test_a_yolo_v8_output_keeps_its_head_convolutions_their_branches_and_its_dfl_float(
    tmp_path: Path,
) -> None:
    found = onnx_heads(onnx.load(str(yolo_v8_like(tmp_path / "y.onnx"))))
    assert {*YOLO_HEADS, "dfl", "dfl_softmax", "split", "scores", "scaled", "out"} <= set(found)
    assert {*YOLO_BRANCHES, *(f"{b}_{s}" for b in YOLO_BRANCHES for s in ("sig", "silu"))} <= set(found)
    assert not {*YOLO_FEATURES, *(f"{f}_silu" for f in YOLO_FEATURES), "points"} & set(found)


def test_a_branch_ends_where_a_tensor_is_read_outside_it() -> None:
    # feat -> a (Conv) -> act -> box (head); feat -> cls (head); feat -> next (the neck).
    edges = {"box": ["act"], "act": ["a"], "a": ["feat"], "cls": ["feat"], "feat": ["input"], "input": []}
    readers = {"act": ["box"], "a": ["act"], "feat": ["a", "cls", "next"], "input": ["feat"]}
    kinds = {"box": "head", "cls": "head", "a": "head", "feat": "head", "act": "pass", "input": ""}
    found = branches(["box", "cls"], lambda n: edges[n], lambda n: readers[n], lambda n: kinds[n])
    assert sorted(found) == ["a", "act"]  # not the shared features, even read by heads alone
    readers["feat"] = ["a", "cls"]
    assert sorted(branches(["box", "cls"], lambda n: edges[n], lambda n: readers[n], lambda n: kinds[n])) == [
        "a",
        "act",
    ]


def _yolo_calibration() -> np.ndarray:
    return RNG.uniform(0, 1, (16, 3, SIZE, SIZE)).astype(np.float32)


def test_onnx_int8_of_a_yolo_v8_keeps_boxes_in_pixels_and_scores_apart(tmp_path: Path) -> None:
    fp32 = yolo_v8_like(tmp_path / "y.onnx")
    calib = _yolo_calibration()
    art = quantize_onnx_int8(fp32, tmp_path / "y-int8.onnx", calib, "x", float_layers=0)
    assert {*YOLO_HEADS, "dfl"} <= set(art.notes["float_heads"])
    assert art.notes["float_heads_recipe"] == RECIPE
    model = onnx.load(str(art.path))
    quantized = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert {"stem_silu_y", "down_silu_y"} <= quantized  # the features are int8
    assert not {"output0", "scores_y", "dfl_softmax_y", "scaled_y"} & quantized
    x = calib[:4]
    for i in range(len(x)):
        got, want = _run(art.path, x[i : i + 1])[0], _run(fp32, x[i : i + 1])[0]
        # One 8-bit scale over pixels (0..64) and probabilities would put every score on a
        # step of ~0.25; in float each anchor keeps its own score, near fp32's.
        assert len(np.unique(got[0, 4:])) == got[0, 4:].size
        assert np.abs(got[0, 4:] - want[0, 4:]).max() < 0.1
        assert np.abs(got[0, :4] - want[0, :4]).max() < 4.0  # pixels, at stride 16 at most


def test_openvino_int8_of_a_yolo_v8_ignores_its_heads_and_dfl(tmp_path: Path) -> None:
    fp32 = yolo_v8_like(tmp_path / "y.onnx")
    art = quantize_openvino_int8(fp32, tmp_path / "ov", _yolo_calibration(), float_layers=0)
    float_heads = set(art.notes["float_heads"])
    # OpenVINO splits a Conv's bias off into an Add named after the Conv.
    assert {*(f"{h}/WithoutBiases" for h in YOLO_HEADS), *YOLO_HEADS, "dfl", "dfl_softmax"} <= float_heads
    assert {*YOLO_BRANCHES, *(f"{b}/WithoutBiases" for b in YOLO_BRANCHES)} <= float_heads
    assert not {*YOLO_FEATURES, *(f"{f}/WithoutBiases" for f in YOLO_FEATURES)} & float_heads
    import openvino as ov

    model = ov.Core().read_model(str(art.path))
    fake_quantized = {
        consumer.get_node().get_friendly_name()
        for op in model.get_ordered_ops()
        if op.get_type_name() == "FakeQuantize"
        for consumer in op.output(0).get_target_inputs()
    }
    assert {"stem/WithoutBiases", "down/WithoutBiases"} & fake_quantized, "the features are quantized"
    assert not fake_quantized & float_heads


def test_litert_int8_of_a_yolo_v8_computes_its_heads_dfl_and_decoding_in_float(tmp_path: Path) -> None:
    """The calibrated model is edited: head convolutions and DFL in float, the decoding after them too."""
    from ai_edge_litert.interpreter import Interpreter

    from edgekit.convert.litert import convert_fp32, quantize_tflite
    from edgekit.processing.preprocessing import PreprocessSpec

    spec = PreprocessSpec(size=(SIZE, SIZE), mean=(0, 0, 0), std=(255, 255, 255))
    fp32 = convert_fp32(yolo_v8_module(), spec, tmp_path / "y.tflite")
    calib = _yolo_calibration().transpose(0, 2, 3, 1).copy()
    int8 = tmp_path / "y-int8.tflite"
    _, float_heads = quantize_tflite(fp32, calib, {int8: "float32"})[int8]
    assert len(float_heads) == 5 and "dfl" in float_heads[-1]  # four 1x1 head convolutions and the DFL's

    def run(path: Path, x: np.ndarray) -> np.ndarray:
        interpreter = Interpreter(str(path))
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        return np.asarray(interpreter.get_tensor(interpreter.get_output_details()[0]["index"]))

    for i in range(3):
        got, want = run(int8, calib[i : i + 1]), run(fp32, calib[i : i + 1])
        # Calibrated as it is, the output's one int8 scale gave every score the same value.
        assert len(np.unique(got[0, 4:])) == got[0, 4:].size
        assert np.abs(got[0, 4:] - want[0, 4:]).max() < 0.05
        assert np.abs(got[0, :4] - want[0, :4]).max() < 1.0


def test_the_full_range_recipe_keeps_a_detectors_stem_float_and_quantizes_a_classifier_whole(
    tmp_path: Path,
) -> None:
    fp32 = yolo_v8_like(tmp_path / "y.onnx")
    art = quantize_onnx_int8(fp32, tmp_path / "y-int8-full.onnx", _yolo_calibration(), "x", full_range=True)
    assert art.notes["float_layers"] == ["stem", "stem_sig", "stem_silu"]  # its SiLU too
    # ORT's int8-full quantizes the heads' branches (its speed); the portable recipe keeps them float.
    assert {*YOLO_HEADS, "dfl"} <= set(art.notes["float_heads"])
    assert not set(YOLO_BRANCHES) & set(art.notes["float_heads"])
    portable = quantize_onnx_int8(fp32, tmp_path / "y-int8.onnx", _yolo_calibration(), "x")
    assert set(YOLO_BRANCHES) <= set(portable.notes["float_heads"])
    ov = quantize_openvino_int8(fp32, tmp_path / "ov", _yolo_calibration(), full_range=True)
    assert ov.notes["float_layers"] == ["stem/WithoutBiases"]
    # So does OpenVINO's, with asymmetric activations (a SiLU's negative tail gets a zero point).
    assert {*YOLO_HEADS, "dfl"} <= set(ov.notes["float_heads"])
    assert not set(YOLO_BRANCHES) & set(ov.notes["float_heads"])
    assert ov.notes["preset"].startswith("mixed")
    c = quantize_onnx_int8(
        classifier(tmp_path / "c.onnx"), tmp_path / "c-int8-full.onnx", _calibration(), "x", full_range=True
    )
    assert c.notes["float_layers"] == []
    # A classifier keeps the symmetric preset its int8 speed was measured with.
    c_ov = quantize_openvino_int8(
        classifier(tmp_path / "c2.onnx"), tmp_path / "c-ov", _calibration(), full_range=True
    )
    assert c_ov.notes["preset"] == "performance" and "float_heads" not in c_ov.notes
