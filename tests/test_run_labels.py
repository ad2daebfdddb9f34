"""What ``edgekit run`` says the model saw: per-frame labels or detections in ``--records``, and
``--json`` / the summary ending with the run's tally (a detector's classes, a classifier's top-1 histogram).

Real runtimes on tests/tiny_detector.py's bundles: the square detector (whose boxes are
known exactly) and the tiny classifier (whose answers the test computes in-process).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tiny_detector as td
from rich.console import Console

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.commands.live import LiveView
from edgekit.detection.detector import Detection
from edgekit.pipeline import FrameRecord, Seen
from edgekit.processing.postprocess import Label

from conftest import EDGEKIT
from conftest import edgekit as run_cli

#: The square's cell in each frame of the folder (None: an empty frame).
PATH: list[tuple[int, int] | None] = [(0, 0), (0, 1), None, (1, 1), (2, 2), None, (3, 3)]


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_keypair(tmp_path_factory.mktemp("keys") / "signer")


@pytest.fixture(scope="module")
def detector_bundle(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    return td.detector_bundle(tmp_path_factory.mktemp("det") / "square", keys[0])


@pytest.fixture(scope="module")
def classifier_bundle(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    return td.classifier_bundle(tmp_path_factory.mktemp("cls") / "tiny", keys[0])


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("frames")
    for i, cell in enumerate(PATH):
        cv2.imwrite(str(folder / f"{i:03d}.png"), td.square_frame(*cell) if cell else td.square_frame(None))
    return folder


def _read(path: Path) -> np.ndarray:
    image = cv2.imread(str(path))
    assert image is not None, path
    return image


def run(bundle: Path, pub: Path, *args: str) -> tuple[str, str]:
    r = run_cli(dict(os.environ), "run", str(bundle), "--key", str(pub), "--device", "x86_64-cpu", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, r.stderr


def test_a_detectors_records_and_json_say_what_it_found(
    detector_bundle: Path, frames: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    records = tmp_path / "frames.jsonl"
    out, _ = run(detector_bundle, keys[1], "--source", str(frames), "--json", "--records", str(records))
    summary = json.loads(out)
    assert summary["frames"] == len(PATH)
    # The document ends with what was seen: per class, frames with it, detections (objects), best
    # score, under the names a telemetry window gives them.
    assert list(summary)[-2:] == ["task", "seen"] and summary["task"] == "detection"
    squares = sum(c is not None for c in PATH)
    assert summary["seen"] == {"square": {"frames": squares, "objects": squares, "max_score": 1.0}}
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(len(PATH)))
    # The last frames, each with its boxes: the same as their --records lines.
    assert [f["index"] for f in summary["last_frames"]] == [row["index"] for row in rows[-5:]]
    assert [f["detections"] for f in summary["last_frames"]] == [row["detections"] for row in rows[-5:]]
    # Each says which image it was: the folder's file names, in order.
    assert [row["source_name"] for row in rows] == [f"{i:03d}.png" for i in range(len(PATH))]
    assert summary["last_frames"][-1]["source_name"] == f"{len(PATH) - 1:03d}.png"
    for row, cell in zip(rows, PATH, strict=True):
        want = (
            [{"class_id": 0, "name": "square", "score": 1.0, "box": list(td.cell_box(*cell))}] if cell else []
        )
        assert row["detections"] == want and row["labels"] == []
        assert {"inference_ms", "postprocess_ms", "met", "candidate"} <= row.keys()


def test_a_classifiers_records_carry_labels_and_json_the_top1_histogram(
    classifier_bundle: Path, frames: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    with edgekit.load(classifier_bundle, device="x86_64-cpu", trusted_keys=[keys[1]]) as model:
        want = [model.classify(_read(p), k=3) for p in sorted(frames.iterdir())]
    records = tmp_path / "frames.jsonl"
    out, _ = run(
        classifier_bundle, keys[1], "--source", str(frames), "--top", "3", "--json", "--records", str(records)
    )
    summary = json.loads(out)
    assert summary["task"] == "classification"
    assert summary["seen"] == dict(Counter(labels[0].name for labels in want))
    assert list(summary["seen"].values()) == sorted(summary["seen"].values(), reverse=True)
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(rows) == len(want)
    for row, labels in zip(rows, want, strict=True):
        assert [(lab["id"], lab["name"]) for lab in row["labels"]] == [(lab.id, lab.name) for lab in labels]
        assert [lab["score"] for lab in row["labels"]] == pytest.approx(
            [lab.score for lab in labels], abs=1e-5
        )
        assert row["detections"] == []


def test_the_human_summary_and_plain_lines_say_what_was_seen(
    detector_bundle: Path, frames: Path, keys: tuple[Path, Path]
) -> None:
    # Replayed at 3 fps the run lasts over 2 s: the plain view prints its once-a-second line.
    out, _ = run(detector_bundle, keys[1], "--source", str(frames), "--realtime", "--fps", "3")
    assert "edgekit pipeline summary" in out
    squares = sum(c is not None for c in PATH)
    assert "What the model saw (7 frames; detections by class):" in out
    assert re.search(rf"square +{squares} in {squares} frames \(max score 1\.00\)", out), out
    lines = [line for line in out.splitlines() if line.startswith("frame=")]
    assert lines and all("detections=" in line and "top=" not in line for line in lines)


def test_the_live_panel_shows_a_detectors_count_and_boxes(
    detector_bundle: Path, frames: Path, keys: tuple[Path, Path]
) -> None:
    with (
        edgekit.load(detector_bundle, device="x86_64-cpu", trusted_keys=[keys[1]]) as model,
        edgekit.Pipeline(model, str(frames), frames=2) as p,
    ):
        view = LiveView(p)
        for result in p:
            view.update(result)
    console = Console(record=True, width=120)
    console.print(view)
    text = console.export_text()
    x0, y0, x1, y1 = td.cell_box(0, 1)  # the second frame's square
    assert "1 detections" in text and "square" in text and f"({x0:.0f},{y0:.0f},{x1:.0f},{y1:.0f})" in text


def _record(
    index: int, labels: tuple[Label, ...] = (), detections: tuple[Detection, ...] = ()
) -> FrameRecord:
    return FrameRecord(
        index, 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True, 0, "x", labels=labels, detections=detections
    )


def test_seen_counts_frames_once_per_class_and_keeps_the_best_score() -> None:
    def det(name: str, score: float) -> Detection:
        return Detection(0 if name == "face" else 1, name, score, (0.0, 0.0, 1.0, 1.0))

    seen = Seen("detection")
    for i, dets in enumerate(
        [(det("face", 0.9), det("face", 0.6), det("hand", 0.7)), (), (det("face", 0.95),)]
    ):
        seen.observe(_record(i, detections=dets))
    assert seen.to_dict() == {
        "face": {"frames": 2, "objects": 3, "max_score": 0.95},
        "hand": {"frames": 1, "objects": 1, "max_score": 0.7},
    }
    top = Seen("classification")
    for name in ["cat", "dog", "cat"]:
        top.observe(_record(0, labels=(Label(1, name, 0.8), Label(2, "other", 0.1))))
    top.observe(_record(3))  # a frame without labels counts as a frame, not as a label
    assert top.to_dict() == {"cat": 2, "dog": 1} and top.frames == 4
    assert "cat" in top.render() and "50%" in top.render()


def test_run_with_preview_serves_what_the_loop_saw(
    detector_bundle: Path, frames: Path, keys: tuple[Path, Path]
) -> None:
    # Replayed at 2 fps (3.5 s): time to ask the preview, which the run names on stderr, what it shows.
    args = ["run", str(detector_bundle), "--key", str(keys[1]), "--device", "x86_64-cpu"]
    args += ["--source", str(frames), "--realtime", "--fps", "2", "--preview", ":0", "--json"]
    proc = subprocess.Popen([*EDGEKIT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            if line.startswith("preview: "):
                url = line.split()[1]
                break
        assert url is not None and url.startswith("http://127.0.0.1:"), "no preview line on stderr"
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
        shown: list[dict[str, Any]] = []
        while proc.poll() is None and not any(d["detections"] for d in shown):
            with urllib.request.urlopen(url + "detections", timeout=10) as r:
                shown.append(json.loads(r.read()))
            time.sleep(0.1)
        boxes = [d["detections"][0]["box"] for d in shown if d["detections"]]
        assert boxes and boxes[0] in [list(td.cell_box(*c)) for c in PATH if c]
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and json.loads(out)["frames"] == len(PATH)  # stdout stays one JSON document
    with pytest.raises(OSError):  # the preview stopped with the run
        urllib.request.urlopen(url, timeout=5)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_that_labels_nothing_fails_in_both_forms(
    tmp_path: Path, classifier_bundle: Path, keys: tuple[Path, Path], as_json: bool
) -> None:
    folder = tmp_path / "unreadable"
    folder.mkdir()
    (folder / "000.png").write_bytes(b"not a picture")  # skipped: the run labels no frame
    args = ["run", str(classifier_bundle), "--key", str(keys[1]), "--device", "x86_64-cpu"]
    r = run_cli(dict(os.environ), *args, "--source", str(folder), *(["--json"] if as_json else []))
    assert r.returncode != 0
    assert "no frame was labelled" in r.stderr
    if as_json:  # the document still says what happened
        assert json.loads(r.stdout)["frames"] == 0
