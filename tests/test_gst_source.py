"""GStreamer sources against a real RTSP server on loopback, real files, and this host's decoders.

The cameras are gst-rtsp-server (tests/rtsp_server.py) encoding with x264/x265; the source
decodes through PyGObject's appsink.  Counts are asserted in frames and events, not seconds.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import cv2
import numpy as np
import pytest
from rtsp_server import RtspCamera, rtsp_server_missing

from edgekit.device.video_decode import gst_status, plan_decoders
from edgekit.errors import SourceError
from edgekit.pipeline.gst_frames import Layout, frame_converter, to_bgr
from edgekit.pipeline.gst_source import GstSource, open_file, pipeline_description
from edgekit.pipeline.sources import Source, SourceInfo, open_source

pytestmark = pytest.mark.skipif(not gst_status().ok, reason=f"no GStreamer here: {gst_status().reason}")

_MISSING = rtsp_server_missing()
needs_rtsp = pytest.mark.skipif(_MISSING is not None, reason=f"no RTSP server here: {_MISSING}")


Frames = list[np.ndarray | None]


def read_until(src: Source, done: Callable[[Frames], bool], limit_s: float = 60) -> Frames:
    """Read frames until ``done(frames so far)`` holds (bounded by a generous limit for a loaded machine)."""
    got: Frames = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not done(got):
        got.append(src.read())
    return got


def encode(path: Path, codec: str, width: int, height: int, frames: int = 30) -> Path:
    enc = {"h264": "x264enc ! h264parse", "h265": "x265enc ! h265parse"}[codec]
    subprocess.run(
        [
            "gst-launch-1.0",
            "-q",
            "videotestsrc",
            f"num-buffers={frames}",
            "!",
            f"video/x-raw,format=I420,width={width},height={height},framerate=30/1",
            "!",
            *enc.split(),
            "!",
            "mp4mux",
            "!",
            "filesink",
            f"location={path}",
        ],
        check=True,
        timeout=120,
    )
    return path


@needs_rtsp
@pytest.mark.parametrize("codec", ["h264", "h265"])
def test_rtsp_frames_are_bgr_of_the_camera_size(codec: str) -> None:
    with RtspCamera(codec=codec, width=640, height=480, fps=30) as camera:
        src = open_source(camera.url)
        try:
            assert isinstance(src, GstSource), "RTSP goes through GStreamer where PyGObject is installed"
            frames = [src.read() for _ in range(15)]
            assert all(f is not None and f.shape == (480, 640, 3) and f.dtype == np.uint8 for f in frames)
            assert src.decoders == [f"avdec_{codec}"]  # software here, as doctor says
            assert src.info.fps == pytest.approx(30)
        finally:
            src.close()


@needs_rtsp
@pytest.mark.parametrize("transport", ["tcp", "udp"])
def test_rtsp_over_tcp_and_udp(transport: str) -> None:
    with RtspCamera(codec="h264", width=320, height=240, fps=30) as camera:
        src = GstSource(SourceInfo(camera.url, "stream", True), transport=transport)
        try:
            assert src.transport == transport
            frames = [src.read() for _ in range(10)]
            assert all(f is not None and f.shape == (240, 320, 3) for f in frames)
        finally:
            src.close()


@needs_rtsp
def test_a_paused_camera_is_a_stall_detected_and_recovered() -> None:
    with RtspCamera(codec="h264", width=320, height=240, fps=30) as camera:
        src = open_source(camera.url)
        try:
            assert src.read() is not None
            camera.pause()  # the connection stays open, no frame comes
            timer = threading.Timer(3.0, camera.resume)
            timer.start()
            got = read_until(src, lambda _: src.counters.reopens >= 1 and src.counters.frames >= 20)
            timer.join()
            assert all(f is not None for f in got)
            assert src.counters.stalls >= 1 and src.counters.outages >= src.counters.stalls
            assert src.counters.reopens >= 1 and src.counters.down_s > 0
        finally:
            src.close()


@needs_rtsp
def test_a_camera_that_goes_away_is_rebuilt_when_it_is_back() -> None:
    with RtspCamera(codec="h264", width=320, height=240, fps=30) as camera:
        src = open_source(camera.url)
        try:
            assert src.read() is not None
            camera.stop()
            timer = threading.Timer(2.0, camera.start)
            timer.start()
            got = read_until(src, lambda got: src.counters.reopens >= 1 and len(got) >= 10)
            timer.join()
            assert all(f is not None for f in got)
            assert src.counters.outages >= 1 and src.counters.reopens >= 1
        finally:
            src.close()


@needs_rtsp
def test_a_resolution_change_is_followed() -> None:
    with RtspCamera(codec="h264", width=640, height=480, fps=30) as camera:
        src = open_source(camera.url)
        try:
            assert src.read().shape == (480, 640, 3)  # type: ignore[union-attr]
            camera.resize(320, 240)
            got = read_until(
                src, lambda got: bool(got) and got[-1] is not None and got[-1].shape == (240, 320, 3)
            )
            assert got and got[-1] is not None and got[-1].shape == (240, 320, 3)
        finally:
            src.close()


@needs_rtsp
def test_a_rate_change_is_counted_and_the_stall_rule_follows_it() -> None:
    with RtspCamera(codec="h264", fps=30) as camera:
        src = open_source(camera.url)
        try:
            assert src.read() is not None and src.info.fps == 30
            camera.set_rate(5)
            read_until(src, lambda _: src.counters.rate_changes > 0)
            # At 5 fps a frame comes every 200 ms: 30 periods would be 6 s, so the rule's 2 s cap
            # holds, and the camera's own slower pace is not taken for a stall.
            for _ in range(10):
                assert src.read() is not None
            assert src.info.fps == 5 and src.counters.rate_changes == 1
            assert (src.counters.stalls, src.counters.outages) == (0, 0)
        finally:
            src.close()


@needs_rtsp
def test_frames_a_late_reader_misses_are_counted_and_keep_their_place() -> None:
    from edgekit.pipeline.capture import CaptureThread, FrameSlot
    from edgekit.pipeline.policy import Policy

    with RtspCamera(codec="h264", fps=30) as camera:
        src = open_source(camera.url)
        slot = FrameSlot(Policy.BLOCK)  # the capture thread waits for the loop: the appsink fills
        thread = CaptureThread(src, slot)
        thread.start()
        try:
            first = slot.take(timeout=30)
            assert first is not None
            time.sleep(1.0)  # a loop busy for 30 frame periods: the camera's queue overflows
            # The frames already read before the overflow come first, then the step over it.
            frames = [slot.take(timeout=30) for _ in range(4)]
        finally:
            thread.stop()
    indices = [first.index] + [f.index for f in frames if f is not None]
    steps = [b - a - 1 for a, b in pairwise(indices)]
    # Most of that second's frames went while the queue was full, each counted, and each frame
    # kept its place in the source: the indices step over the frames dropped unseen.  (More may
    # go after the last frame was read, while the test ends.)
    assert 10 <= max(steps) <= src.counters.skipped, (indices, src.counters.skipped)


@needs_rtsp
def test_a_reader_back_on_time_after_an_overflow_sees_every_frame_again() -> None:
    from edgekit.pipeline.capture import CaptureThread, FrameSlot
    from edgekit.pipeline.policy import Policy

    with RtspCamera(codec="h264", fps=30) as camera:
        src = open_source(camera.url)
        slot = FrameSlot(Policy.BLOCK)
        thread = CaptureThread(src, slot)
        thread.start()
        try:
            assert slot.take(timeout=30) is not None
            time.sleep(1.0)  # the queue overflows once
            frames = [slot.take(timeout=30) for _ in range(90)]  # then the loop keeps up: 3 s
            skipped = src.counters.skipped
        finally:
            thread.stop()
    indices = [f.index for f in frames if f is not None]
    assert len(indices) == 90
    steps = [b - a - 1 for a, b in pairwise(indices)]
    # The overflow's frames are counted once, at the step over them; the frames after it arrive
    # one by one and are taken, so neither the count nor the indices go on stepping.  (Counting a
    # dropped frame as still queued made every later frame look dropped: index and ``skipped``
    # then ran at twice the camera's rate.)  A loaded machine may drop a few more, genuinely.
    late = steps[30:]
    assert sum(1 for s in late if s) <= 5, (steps, skipped)
    assert skipped <= sum(steps) + 10, (steps, skipped)


@needs_rtsp
def test_closing_ends_a_rebuild_wait_at_once() -> None:
    with RtspCamera(codec="h264", width=320, height=240, fps=30) as camera:
        src = open_source(camera.url)
        assert src.read() is not None
        camera.stop()
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.extend(src.read() for _ in range(500)))
    reader.start()
    time.sleep(2.0)
    src.close()
    reader.join(15)
    assert not reader.is_alive() and got and got[-1] is None


def test_a_file_plays_every_frame_then_ends(tmp_path: Path) -> None:
    # 322 pixels: I420 rows of 322 and 161 bytes, padded to 324 and 164 in the buffer; the copy skips it.
    video = encode(tmp_path / "odd.mp4", "h264", 322, 242, frames=30)
    src = open_file(video)
    frames = []
    while (f := src.read()) is not None:
        frames.append(f)
    assert len(frames) == 30 and all(f.shape == (242, 322, 3) for f in frames)
    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    ok, first = cap.read()
    cap.release()
    assert ok
    # Same decoder (libavcodec), OpenCV's conversion against FFmpeg's swscale: close, not bit-exact.
    assert np.abs(first.astype(int) - frames[0].astype(int)).mean() < 2


def test_a_missing_file_or_server_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as err:
        open_file(tmp_path / "none.mp4")
    assert err.value.hint
    with pytest.raises(SourceError, match="cannot open"):
        GstSource(SourceInfo("rtsp://127.0.0.1:9/none", "stream", True))


def test_the_pipeline_follows_the_decode_path() -> None:
    software = pipeline_description("stream", plan_decoders("software"), live=True)
    assert software.startswith("rtspsrc name=src ! decodebin") and "drop=true" in software
    assert "nvvidconv" not in software
    assert "drop=false" in pipeline_description("file", plan_decoders("software"), live=False)


def test_a_missing_hardware_decoder_falls_back_to_software() -> None:
    for path, element in (("nvv4l2", "nvv4l2decoder"), ("vaapi", "vah264dec"), ("v4l2", "v4l2h264dec")):
        choice = plan_decoders(path)["h264"]
        if choice.path == path:
            continue  # this host has it (then the hardware tests below run)
        assert (choice.wanted, choice.element) == (path, "avdec_h264") and element in choice.note


def test_without_pygobject_rtsp_falls_back_to_opencv_and_doctor_says_why() -> None:
    code = (
        "import sys, logging; sys.modules['gi'] = None; logging.basicConfig(level=logging.WARNING)\n"
        "from edgekit.device.video_decode import decode_report\n"
        "r = decode_report('software'); print(r['gstreamer']['available'], r['sources']['rtsp'])\n"
        "from edgekit.pipeline import open_source\n"
        "try:\n    open_source('rtsp://127.0.0.1:9/none')\nexcept Exception as e:\n    print(type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "False OpenCV's FFmpeg" in out.stdout
    assert "SourceError" in out.stdout  # OpenCV tried it (and found nothing on port 9)
    assert "edgekit[gstreamer]" in out.stderr  # the note says what to install


@needs_rtsp
@pytest.mark.jetson
@pytest.mark.skipif(plan_decoders("nvv4l2")["h264"].path != "nvv4l2", reason="needs JetPack's nvv4l2decoder")
def test_jetson_decodes_in_nvdec() -> None:
    with RtspCamera(codec="h264") as camera:
        src = GstSource(SourceInfo(camera.url, "stream", True), decoder="nvv4l2")
        try:
            assert src.read() is not None and src.decoders == ["nvv4l2decoder"]
        finally:
            src.close()


@pytest.mark.rpi
@pytest.mark.skipif(
    plan_decoders("v4l2")["h265"].path != "v4l2", reason="needs a Raspberry Pi's V4L2 decoder"
)
@needs_rtsp
def test_raspberry_pi_decodes_hevc_in_its_v4l2_decoder() -> None:
    with RtspCamera(codec="h265") as camera:
        src = GstSource(SourceInfo(camera.url, "stream", True), decoder="v4l2")
        try:
            assert src.read() is not None and src.decoders[0].startswith("v4l2")
        finally:
            src.close()


@needs_rtsp
@pytest.mark.vaapi
@pytest.mark.skipif(plan_decoders("vaapi")["h264"].path != "vaapi", reason="needs VA-API (an Intel iGPU)")
def test_intel_decodes_through_vaapi() -> None:
    with RtspCamera(codec="h264") as camera:
        src = GstSource(SourceInfo(camera.url, "stream", True), decoder="vaapi")
        try:
            assert src.read() is not None and src.decoders[0].startswith("va")
        finally:
            src.close()


@pytest.mark.parametrize("pad", [0, 12])
def test_every_appsink_format_converts_to_the_same_bgr(pad: int) -> None:
    rng = np.random.default_rng(0)
    w, h = 64, 48
    bgr = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (9, 9), 3)
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420).reshape(-1)
    want = cv2.cvtColor(i420.reshape(h * 3 // 2, w), cv2.COLOR_YUV2BGR_I420)
    y, u, v = i420[: w * h], i420[w * h : w * h * 5 // 4], i420[w * h * 5 // 4 :]

    def planes(*rows: tuple[np.ndarray, int]) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]:
        """Lay the planes out as a decoder does: each row ``pad`` bytes longer than its pixels."""
        chunks, offsets, strides, at = [], [], [], 0
        for plane, width in rows:
            grid = plane.reshape(-1, width)
            padded = np.zeros((grid.shape[0], width + pad), np.uint8)
            padded[:, :width] = grid
            chunks.append(padded.reshape(-1))
            offsets.append(at)
            strides.append(width + pad)
            at += padded.size
        return np.concatenate(chunks), tuple(offsets), tuple(strides)

    data, o, s = planes((y, w), (u, w // 2), (v, w // 2))
    assert np.array_equal(to_bgr(data, Layout("I420", w, h, o, s)), want)
    uv = np.stack([u, v], axis=1).reshape(-1)
    data, o, s = planes((y, w), (uv, w))
    assert np.array_equal(to_bgr(data, Layout("NV12", w, h, o, s)), want)
    data, o, s = planes((cv2.cvtColor(want, cv2.COLOR_BGR2BGRA).reshape(-1), w * 4))
    assert np.array_equal(to_bgr(data, Layout("BGRx", w, h, o, s)), want)
    data, o, s = planes((want.reshape(-1), w * 3))
    assert np.array_equal(to_bgr(data, Layout("BGR", w, h, o, s)), want)


def test_buffers_are_mapped_in_place_here() -> None:
    # The one-copy path (ctypes on gst_buffer_map); the bytes fallback would copy each frame twice.
    assert frame_converter().__name__ == "_convert_mapped"
