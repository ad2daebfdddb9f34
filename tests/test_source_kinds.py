"""Sources other than RTSP-through-GStreamer, each against a real server or file made here.

- RTSP through OpenCV's FFmpeg (the path without PyGObject) and Motion JPEG over HTTP: the
  cells of ``benchmarks/source_matrix.py`` that matter for each (tests/source_faults.py), on
  gst-rtsp-server and ``MjpegCamera`` on loopback;
- files of the common containers, made by ``gst-launch-1.0``: every frame read, then the end;
- a V4L2 capture device (``pytest -m v4l2``; v4l2loopback gives one), skipped without one.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import source_faults
from rtsp_server import rtsp_server_missing

from edgekit.pipeline.sources import open_source, stall_timeout_s

_MISSING = rtsp_server_missing()
needs_server = pytest.mark.skipif(_MISSING is not None, reason=f"no RTSP server here: {_MISSING}")

# The faults that differ between kinds: a stall with the connection open (FFmpeg's read timeout
# is the watchdog on both), the camera gone, a new size, wrong credentials (a 401 / RTSP 401).
MJPEG_CELLS = ["server killed", "stream paused", "resolution change", "wrong credentials"]
FFMPEG_CELLS = ["stream paused", "resolution change", "wrong credentials"]


def _check(cell: source_faults.Cell) -> None:
    if cell.fault == "wrong credentials":
        assert "refused the user and password" in cell.error, cell
        assert "s3cret" not in cell.error and "not-it" not in cell.error, cell  # never shown
        return
    assert cell.frames_after >= 30, cell  # frames came back after the fault, and kept coming
    if cell.fault == "server killed":
        assert cell.outages >= 1 and cell.reopens >= 1 and cell.stalls == 0, cell
    elif cell.fault == "stream paused":
        # Found by the read timeout while the connection was still open, before the stream resumed.
        assert cell.stalls >= 1 and cell.reopens >= 1, cell
        assert cell.detect_s is not None and cell.detect_s < source_faults.PAUSE_S, cell
        assert cell.down_s >= stall_timeout_s(30) * 0.9, cell
    elif cell.fault == "resolution change":
        assert cell.outages == 0, cell


@pytest.mark.parametrize("fault", MJPEG_CELLS, ids=lambda v: v.replace(" ", "-"))
def test_http_mjpeg_source_survives(fault: str) -> None:
    _check(source_faults.run_cell("mjpeg", "http", fault, kind="http-mjpeg"))


def test_packet_loss_does_not_apply_to_mjpeg_over_http() -> None:
    cell = source_faults.run_cell("mjpeg", "http", "packets dropped", kind="http-mjpeg")
    assert cell.na.startswith("n/a") and "TCP" in cell.na and cell.frames == 0


@needs_server
@pytest.mark.parametrize("fault", FFMPEG_CELLS, ids=lambda v: v.replace(" ", "-"))
def test_rtsp_through_ffmpeg_survives(fault: str) -> None:
    _check(source_faults.run_cell("h264", "tcp", fault, kind="rtsp-ffmpeg"))


@needs_server
def test_the_ffmpeg_path_is_the_one_taken() -> None:
    from rtsp_server import RtspCamera

    from edgekit.pipeline import sources

    before = list(sources.STREAM_OPENERS)
    with RtspCamera() as cam:
        src = source_faults.open_with_ffmpeg(cam.url)
        try:
            assert type(src) is sources.CaptureSource and src.read() is not None
        finally:
            src.close()
    assert before == sources.STREAM_OPENERS  # the other openers are put back


# (name, encoder, muxer): the containers and codecs cameras and phones write.
CONTAINERS = [
    ("h264.mp4", "x264enc", "mp4mux"),
    ("h264.mkv", "x264enc", "matroskamux"),
    ("h264.mov", "x264enc", "qtmux"),
    ("h264.avi", "x264enc", "avimux"),
    ("vp8.webm", "vp8enc", "webmmux"),
    ("h265.mkv", "x265enc", "matroskamux"),
    ("mjpeg.avi", "jpegenc", "avimux"),
]
CLIP_FRAMES, CLIP_SIZE = 24, (176, 144)


def _gst_missing(*elements: str) -> str | None:
    if shutil.which("gst-launch-1.0") is None or shutil.which("gst-inspect-1.0") is None:
        return "gst-launch-1.0 is missing (tools/setup.sh installs GStreamer)"
    missing = [e for e in elements if subprocess.run(["gst-inspect-1.0", e], capture_output=True).returncode]
    return f"GStreamer elements missing: {' '.join(missing)}" if missing else None


@pytest.mark.parametrize(("name", "encoder", "muxer"), CONTAINERS, ids=[c[0] for c in CONTAINERS])
def test_a_file_of_each_container_reads_every_frame_then_ends(
    tmp_path: Path, name: str, encoder: str, muxer: str
) -> None:
    if (why := _gst_missing(encoder, muxer)) is not None:
        pytest.skip(why)
    w, h = CLIP_SIZE
    clip = tmp_path / name
    # x265enc's byte-stream needs h265parse before matroskamux takes it.
    options = {
        "x264enc": ["key-int-max=8"],
        "x265enc": ["key-int-max=8", "!", "h265parse"],
        "vp8enc": ["deadline=1"],
    }
    launch = ["gst-launch-1.0", "-q", "videotestsrc", f"num-buffers={CLIP_FRAMES}", "pattern=ball", "!"]
    launch += [f"video/x-raw,format=I420,width={w},height={h},framerate=30/1", "!", encoder]
    launch += [*options.get(encoder, []), "!", muxer, "!", "filesink", f"location={clip}"]
    subprocess.run(launch, check=True, capture_output=True, timeout=60)
    src = open_source(str(clip))
    try:
        assert src.info.kind == "file" and not src.info.live
        frames = []
        while (frame := src.read()) is not None:
            frames.append(frame)
            assert len(frames) <= CLIP_FRAMES, "more frames than the clip holds"
        assert src.read() is None  # and stays ended
    finally:
        src.close()
    assert len(frames) == CLIP_FRAMES
    assert {f.shape for f in frames} == {(h, w, 3)}
    assert src.counters.outages == 0 and src.counters.reopens == 0


def _video_devices() -> list[Path]:
    return sorted(Path("/dev").glob("video[0-9]*"))


@pytest.mark.v4l2
@pytest.mark.skipif(
    not _video_devices(),
    reason="no /dev/videoN here (in a container without kernel modules, v4l2loopback cannot be loaded)",
)
def test_a_v4l2_device_gives_frames() -> None:
    device = _video_devices()[0]
    src = open_source(str(device))
    try:
        assert src.info.kind == "camera" and src.info.live
        frames = [src.read() for _ in range(10)]
    finally:
        src.close()
    assert all(f is not None and f.ndim == 3 and f.shape[2] == 3 for f in frames)
