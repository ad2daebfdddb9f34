"""Sources other than RTSP-through-GStreamer, each against a real server made here.

RTSP through OpenCV's FFmpeg (the path without PyGObject) and Motion JPEG over HTTP: the
cells of ``benchmarks/source_matrix.py`` that matter for each (tests/source_faults.py), on
gst-rtsp-server and ``MjpegCamera`` on loopback.
"""

from __future__ import annotations

import pytest
import source_faults
from rtsp_server import rtsp_server_missing

from edgekit.pipeline.sources import stall_timeout_s

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
            assert type(src) is sources._CaptureSource and src.read() is not None
        finally:
            src.close()
    assert before == sources.STREAM_OPENERS  # the other openers are put back
