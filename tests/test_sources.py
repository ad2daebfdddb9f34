"""Frame sources on real inputs: a video written with cv2.VideoWriter, image folders, an MJPEG network camera."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from mjpeg_server import MjpegCamera

from edgekit.errors import SourceError
from edgekit.pipeline.capture import CaptureThread, Frame, FrameSlot
from edgekit.pipeline.policy import Policy
from edgekit.pipeline.sources import as_bgr, gstreamer_available, open_source, parse_source


def write_video(path: Path, frames: list[np.ndarray], fps: float = 30.0) -> Path:
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (w, h))
    assert writer.isOpened()
    for f in frames:
        writer.write(f)
    writer.release()
    return path


def colours(n: int, size: tuple[int, int] = (240, 320)) -> list[np.ndarray]:
    return [np.full((*size, 3), (i * 23) % 256, np.uint8) for i in range(n)]


@pytest.mark.parametrize(
    ("text", "kind", "target"),
    [
        ("0", "camera", 0),
        ("/dev/video2", "camera", "/dev/video2"),
        ("rtsp://10.0.0.5:554/stream1", "stream", "rtsp://10.0.0.5:554/stream1"),
        ("HTTP://cam.local/mjpg", "stream", "HTTP://cam.local/mjpg"),
        ("v4l2src ! videoconvert ! appsink", "gstreamer", "v4l2src ! videoconvert ! appsink"),
        ("gst:videotestsrc ! appsink", "gstreamer", "videotestsrc ! appsink"),
        ("synthetic:", "synthetic", "synthetic:"),
    ],
)
def test_source_strings_say_what_they_are(text: str, kind: str, target: object) -> None:
    spec = parse_source(text)
    assert (spec.kind, spec.target) == (kind, target)


def test_synthetic_parameters_and_bad_strings() -> None:
    assert parse_source("synthetic:320x200@15").params == {"width": 320, "height": 200, "fps": 15.0}
    for bad in ("synthetic:320", "", "/no/such/clip.mp4"):
        with pytest.raises(SourceError) as err:
            parse_source(bad)
        assert err.value.hint


def test_a_video_file_plays_every_frame_then_ends(tmp_path: Path) -> None:
    frames = colours(12)
    video = write_video(tmp_path / "clip.avi", frames, fps=24)
    src = open_source(str(video))
    assert (src.info.kind, src.info.live, src.info.fps) == ("file", False, 24.0)
    got = []
    while (f := src.read()) is not None:
        got.append(f)
    assert len(got) == 12 and got[0].shape == (240, 320, 3) and got[0].dtype == np.uint8
    # MJPEG is lossy; the grey levels survive.
    assert [round(g.mean()) for g in got] == pytest.approx([int(f.mean()) for f in frames], abs=2)
    assert src.read() is None


def test_realtime_replay_paces_a_file_at_its_frame_rate(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", colours(10), fps=20)
    slot = FrameSlot(Policy.BLOCK)
    capture = CaptureThread(open_source(str(video)), slot, pace_fps=20)
    capture.start()
    stamps = []
    while (frame := slot.take(timeout=5)) is not None:
        stamps.append(frame.captured_ns)
    capture.stop()
    assert len(stamps) == 10
    # 10 frames at 20 fps span 9 intervals of 50 ms; unpaced they would arrive in a few ms.
    assert (stamps[-1] - stamps[0]) / 1e9 >= 0.4


def test_a_folder_reads_in_order_converts_grey_and_skips_what_is_not_an_image(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "a.png"), np.full((40, 60, 3), 10, np.uint8))
    cv2.imwrite(str(tmp_path / "b.png"), np.full((40, 60), 200, np.uint8))  # grayscale
    (tmp_path / "c.jpg").write_bytes(b"not a jpeg at all")
    cv2.imwrite(str(tmp_path / "d.png"), np.full((40, 60, 4), 90, np.uint8))  # BGRA
    (tmp_path / "notes.txt").write_text("ignored")
    src = open_source(str(tmp_path))
    got = []
    while (f := src.read()) is not None:
        got.append(f)
    assert [f.shape for f in got] == [(40, 60, 3)] * 3
    assert [int(f[0, 0, 0]) for f in got] == [10, 200, 90]
    assert (src.counters.converted, src.counters.unreadable, src.counters.frames) == (2, 1, 3)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda d: d, "no images"),
        (lambda d: (d / "x.mp4").write_bytes(b"\0" * 4096) and d / "x.mp4", "cannot read video file"),
        (
            lambda d: cv2.imwrite(str(d / "one.png"), np.zeros((8, 8, 3), np.uint8)) and d / "one.png",
            "single image",
        ),
    ],
)
def test_unreadable_sources_fail_at_open_with_a_hint(tmp_path: Path, make: object, needle: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(SourceError) as err:
        open_source(str(target))
    assert needle in err.value.message and err.value.hint


def test_a_camera_that_is_not_there_fails_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(SourceError) as err:
        open_source("/dev/video63")
    assert "cannot open camera" in err.value.message and "v4l2-ctl" in err.value.hint
    assert time.monotonic() - start < 30  # an error, not a retry loop


@pytest.mark.skipif(gstreamer_available(), reason="this OpenCV has GStreamer; the error path cannot happen")
def test_a_gstreamer_pipeline_without_gstreamer_says_which_opencv_to_use() -> None:
    with pytest.raises(SourceError) as err:
        open_source("videotestsrc ! videoconvert ! appsink")
    assert "without GStreamer" in err.value.message
    assert "python3-opencv" in err.value.hint and "JetPack" in err.value.hint


def test_frames_are_made_bgr_uint8_or_refused() -> None:
    grey = np.zeros((4, 5), np.uint8)
    assert as_bgr(grey)[0].shape == (4, 5, 3) and as_bgr(grey)[1]
    deep = np.full((4, 5, 3), 65535, np.uint16)
    assert as_bgr(deep)[0].max() == 255
    with pytest.raises(SourceError, match="dtype float32"):
        as_bgr(np.zeros((4, 5, 3), np.float32))
    with pytest.raises(SourceError, match="shape"):
        as_bgr(np.zeros((4, 5, 2), np.uint8))


def test_drop_oldest_keeps_the_newest_frame_and_counts_the_rest() -> None:
    slot = FrameSlot(Policy.DROP_OLDEST)
    img = np.zeros((2, 2, 3), np.uint8)
    for i in range(5):
        assert slot.put(Frame(img, i, i, 0.0, 0))
    got = slot.take(timeout=0)
    assert got is not None and got.index == 4 and got.dropped_before == 4 and slot.dropped == 4
    assert slot.take(timeout=0.01) is None  # nothing queued behind it
    slot.put(Frame(img, 5, 5, 0.0, 0))
    nxt = slot.take(timeout=0)
    assert nxt is not None and nxt.dropped_before == 0 and slot.dropped == 4


def test_block_makes_the_capture_thread_wait_and_loses_nothing() -> None:
    slot = FrameSlot(Policy.BLOCK)
    img = np.zeros((2, 2, 3), np.uint8)
    done = []

    def producer() -> None:
        for i in range(3):
            slot.put(Frame(img, i, i, 0.0, 0))
            done.append(i)
        slot.finish()

    t = threading.Thread(target=producer)
    t.start()
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:  # the first put returns, however busy the machine
        time.sleep(0.01)
    time.sleep(0.2)
    assert done == [0]  # the second put waits for the first frame to be taken
    got = []
    while (f := slot.take(timeout=2)) is not None:
        got.append(f.index)
    t.join(2)
    assert got == [0, 1, 2] and slot.dropped == 0


def test_an_error_on_the_capture_thread_reaches_the_loop() -> None:
    slot = FrameSlot(Policy.BLOCK)
    slot.finish(SourceError("camera unplugged", "plug it in"))
    with pytest.raises(SourceError, match="unplugged"):
        slot.take(timeout=1)


def test_a_network_camera_that_goes_away_is_reopened_and_counted() -> None:
    camera = MjpegCamera(colours(6), fps=30)
    camera.start()
    src = open_source(camera.url)
    try:
        assert src.info.kind == "stream" and src.info.live
        before = [src.read() for _ in range(10)]
        assert all(f is not None and f.shape == (240, 320, 3) for f in before)

        def away_and_back() -> None:
            camera.stop()
            time.sleep(1.0)
            camera.start()

        threading.Thread(target=away_and_back).start()
        # Read on (blocking through the outage, never raising) until the source has reopened and at
        # least 30 frames came: counted in frames and reopens, not in this machine's seconds.
        after = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (src.counters.reopens < 1 or len(after) < 30):
            after.append(src.read())
        assert all(f is not None for f in after)
        assert src.counters.outages >= 1 and src.counters.reopens >= 1
    finally:
        src.close()
        camera.stop()


def test_closing_a_source_ends_a_reconnect_wait() -> None:
    camera = MjpegCamera(colours(2), fps=30)
    camera.start()
    src = open_source(camera.url)
    assert src.read() is not None
    camera.stop()
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(src.read() for _ in range(200)))
    reader.start()
    time.sleep(1.0)
    src.close()
    reader.join(10)
    assert not reader.is_alive() and got and got[-1] is None
