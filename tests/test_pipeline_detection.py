"""Detectors through the Python API and the frame loop, on a real runtime (tests/tiny_detector.py's square detector).

The square detector's answer is known exactly: a white square filling a grid cell is one
detection of class ``square``, score 1, whose box is that cell in frame pixels.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tiny_detector as td

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.errors import EdgekitError, InputError
from edgekit.pipeline.sinks import sink

import tiny_model

#: Where the square is in each frame of the moving-square folder: across the top row, down, one empty frame.
PATH: list[tuple[int, int] | None] = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (2, 3), None, (3, 3), (3, 2)]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_keypair(tmp_path_factory.mktemp("keys") / "signer")


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    bundle = td.detector_bundle(tmp_path_factory.mktemp("det") / "square", keys[0], with_openvino=True)
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[keys[1]]) as model:
        yield model


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    bundle = td.classifier_bundle(tmp_path_factory.mktemp("cls") / "tiny", keys[0])
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[keys[1]]) as model:
        yield model


@pytest.fixture(scope="module")
def moving_square(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("moving-square")
    for i, cell in enumerate(PATH):
        frame = td.square_frame(*cell) if cell else td.square_frame(None)
        cv2.imwrite(str(folder / f"{i:03d}.png"), frame)
    return folder


def expected(cell: tuple[int, int] | None) -> list[tuple[str, tuple[float, float, float, float]]]:
    return [(td.SQUARE, td.cell_box(*cell))] if cell else []


def seen(detections: tuple[edgekit.Detection, ...]) -> list[tuple[str, tuple[float, float, float, float]]]:
    return [(d.name, d.box) for d in detections]


def test_detect_gives_the_squares_box_in_frame_pixels(detector: edgekit.Model) -> None:
    assert detector.task == "detection"
    for row, col in [(0, 0), (1, 2), (3, 3)]:
        (found,) = detector.detect(td.square_frame(row, col))
        assert found.class_id == 0 and found.name == td.SQUARE
        assert found.score == pytest.approx(1.0, abs=1e-5)
        assert found.box == pytest.approx(td.cell_box(row, col), abs=1e-3)
    assert detector.detect(td.square_frame(None)) == ()
    # Two squares that do not overlap are two detections (NMS keeps both).
    two = np.maximum(td.square_frame(0, 0), td.square_frame(2, 3))
    boxes = sorted(d.box for d in detector.detect(two))
    assert boxes == [pytest.approx(td.cell_box(0, 0)), pytest.approx(td.cell_box(2, 3))]
    # A frame of another size maps back to its own pixels: half the width, the same height.
    half = cv2.resize(td.square_frame(1, 2), (td.FRAME_W // 2, td.FRAME_H), interpolation=cv2.INTER_AREA)
    x0, y0, x1, y1 = td.cell_box(1, 2)
    assert detector.detect(half)[0].box == pytest.approx((x0 / 2, y0, x1 / 2, y1), abs=1e-3)


def test_a_detectors_raw_outputs_and_what_it_refuses(detector: edgekit.Model) -> None:
    frame = td.square_frame(1, 2)
    scores, boxes = detector.outputs(frame)  # the session's order: scores first
    assert scores.shape == (1, 16, 1) and boxes.shape == (1, 16, 4)
    assert scores.reshape(4, 4)[1, 2] == pytest.approx(1.0) and scores.sum() == pytest.approx(1.0)
    assert boxes[0, 1 * 4 + 2].tolist() == pytest.approx([0, 0, td.CELL, td.CELL])
    # infer() stays what it was: the first output, flattened.
    assert detector.infer(frame).tolist() == pytest.approx(scores.reshape(-1).tolist())
    with pytest.raises(InputError, match="is a detector") as err:
        detector.classify(frame)
    assert "model.detect" in err.value.hint


def test_a_classifier_classifies_and_refuses_detect(classifier: edgekit.Model) -> None:
    assert classifier.task == "classification" and classifier.detector is None
    frame = td.square_frame(1, 2)
    (logits,) = classifier.outputs(frame)
    labels = classifier.classify(frame, k=3)
    assert logits.shape == (1, tiny_model.NUM_CLASSES)
    assert labels[0].id == int(np.argmax(logits)) and labels[0].name == td.CLASS_NAMES[labels[0].id]
    with pytest.raises(InputError, match="is a classifier") as err:
        classifier.detect(frame)
    assert "model.classify" in err.value.hint


def test_the_frame_loop_yields_detections_that_follow_the_square(
    detector: edgekit.Model, moving_square: Path
) -> None:
    sunk: list[edgekit.FrameResult] = []
    with edgekit.Pipeline(detector, str(moving_square)) as p:
        p.add_sink(sink("results", sunk.append))
        results = list(p)
        records = [r.record for r in sunk]
    assert [seen(r.detections) for r in results] == [expected(c) for c in PATH]
    assert all(r.labels == () and r.top is None for r in results)
    # The sink saw every frame once, in order, with its image, detections and final record.
    assert all(
        r.frame is y.frame and r.detections is y.detections for r, y in zip(sunk, results, strict=True)
    )
    assert len(sunk) == len(results) and records[-1] is p.last_record
    # The final records carry the same detections (what --records and telemetry read).
    assert [r.index for r in records] == list(range(len(PATH)))
    assert [rec.detections for rec in records] == [r.detections for r in results]
    assert all(rec.labels == () for rec in records)


def test_degrade_measures_and_runs_a_multi_output_alternative(
    detector: edgekit.Model, moving_square: Path
) -> None:
    # The bundle's other artifact (OpenVINO fp32) decodes to the same boxes from its own outputs.
    alternatives = detector.load_alternatives()
    try:
        assert [s.candidate for s in alternatives] == ["openvino-fp32"]
        for session in alternatives:
            names = [o.name for o in session.outputs]
            x = detector.preprocessor(session)(td.square_frame(2, 1))
            outs = [y.astype(np.float32) for y in session.run(x)]
            assert detector.detector is not None
            found = detector.detector(outs, (td.FRAME_H, td.FRAME_W), names)
            assert seen(found) == expected((2, 1))
    finally:
        for session in alternatives:
            session.close()
    # The degrade policy warms up and measures every level (two outputs each) before the first frame.
    with edgekit.Pipeline(detector, str(moving_square), policy="degrade") as p:
        chain = p.degrade_chain
        results = list(p)
    assert chain[0][0] == "onnxruntime-fp32" and all(np.isfinite(ms) and ms > 0 for _, ms in chain)
    # Degrade drops what the loop cannot keep up with, like drop-oldest: check the frames it labelled.
    assert results and [seen(r.detections) for r in results] == [
        expected(PATH[r.record.index]) for r in results
    ]


def test_a_classifiers_records_carry_its_top_labels(classifier: edgekit.Model, moving_square: Path) -> None:
    records: list[edgekit.FrameRecord] = []
    with edgekit.Pipeline(classifier, str(moving_square), top=3) as p:
        p.add_sink(sink("records", lambda r: records.append(r.record)))
        results = list(p)
    assert len(results) == len(records) == len(PATH)
    for i, (result, record) in enumerate(zip(results, records, strict=True)):
        cell = PATH[i]
        frame = td.square_frame(*cell) if cell else td.square_frame(None)
        assert [lab.id for lab in result.labels] == [lab.id for lab in classifier.classify(frame, k=3)]
        assert record.labels == result.labels and record.detections == result.detections == ()


def test_the_real_blazeface_bundle_finds_the_astronauts_face_through_the_loop(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from detector_bundle import build_blazeface
    from skimage import data

    def photograph(name: str) -> np.ndarray:  # scikit-image's loaders are untyped
        return np.ascontiguousarray(getattr(data, name)())

    bundle = build_blazeface(tmp_path_factory.mktemp("blazeface"))
    astronaut = photograph("astronaut")  # RGB, 512x512, one face
    folder = tmp_path_factory.mktemp("photos")
    cv2.imwrite(str(folder / "1-astronaut.png"), astronaut[..., ::-1])
    cv2.imwrite(str(folder / "2-coffee.png"), photograph("coffee")[..., ::-1])  # no face
    with edgekit.load(bundle, device="x86_64-cpu") as model:
        assert model.task == "detection"
        (face,) = model.detect(astronaut, color="RGB")
        assert face.name == "face" and face.score > 0.8
        # Her face, forehead to chin and ear to ear, in the photograph's pixels.
        x0, y0, x1, y1 = face.box
        assert 150 < x0 < 200 and 60 < y0 < 110 and 250 < x1 < 300 and 160 < y1 < 210
        records: list[edgekit.FrameRecord] = []
        with edgekit.Pipeline(model, str(folder)) as p:
            p.add_sink(sink("records", lambda r: records.append(r.record)))
            results = list(p)
    assert [len(r.detections) for r in results] == [1, 0]
    assert results[0].detections[0].box == pytest.approx(face.box, abs=1e-3)  # PNG is lossless
    assert [rec.detections for rec in records] == [r.detections for r in results]


def test_sinks_see_the_final_record(detector: edgekit.Model, moving_square: Path) -> None:
    # A sink is told a frame once it is finished: its record has the loop body's time and met.
    records: list[edgekit.FrameRecord] = []
    with edgekit.Pipeline(detector, str(moving_square), frames=3) as p:
        p.add_sink(sink("records", lambda r: records.append(r.record)))
        for _ in p:
            time.sleep(0.02)
    assert len(records) == 3 and all(r.sink_ms >= 15 for r in records)  # a lower bound: it slept 20 ms
    assert records[-1] is p.last_record


def test_a_head_that_does_not_fit_the_model_fails_load_and_leaves_nothing(
    tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deploy_bundles import resign

    from edgekit.bundle import pack

    def anchors_for_64(doc: dict[str, Any]) -> None:
        doc["detection"]["anchors"]["input_size"] = [64, 64]  # the model takes 32x32

    good = td.detector_bundle(tmp_path / "good", keys[0])
    bad = pack(resign(good, tmp_path / "bad", keys[0], edit=anchors_for_64), tmp_path / "bad.tar.gz")
    unpacked = tmp_path / "tmp"
    unpacked.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(unpacked))  # where load() unpacks an archive
    with pytest.raises(EdgekitError, match="32x32"):
        edgekit.load(bad, device="x86_64-cpu", trusted_keys=[keys[1]])
    assert list(unpacked.iterdir()) == []
