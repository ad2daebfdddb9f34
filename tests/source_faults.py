"""Faults done to a real camera while a source reads it, and what the source made of each.

Shared by tests/test_sources_rtsp.py and tests/test_source_kinds.py (which assert on each cell)
and benchmarks/source_matrix.py (which prints the matrix): one cell is a kind of source, a codec,
a transport and a fault, run against a camera on loopback.  The kinds (``KINDS``):

- ``rtsp``: ``RtspCamera`` (gst-rtsp-server) read as ``open_source`` reads it (GStreamer's
  appsink when PyGObject is here);
- ``rtsp-ffmpeg``: the same camera read through OpenCV's FFmpeg, the path taken without PyGObject;
- ``http-mjpeg``: ``MjpegCamera`` (Motion JPEG over HTTP), read through OpenCV's FFmpeg.

A reader thread takes frames as a pipeline's capture thread does; the fault happens on the
camera's side; the cell records the frames before, during and after it, the source's counters,
and how long frames took to come back.  A fault that cannot happen to a kind is a cell marked
``na`` with the reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from mjpeg_server import MjpegCamera
from rtsp_server import RtspCamera

from edgekit.errors import SourceError
from edgekit.pipeline import sources
from edgekit.pipeline.sources import Source, open_source

FAULTS = (
    "none",
    "server killed",
    "stream paused",
    "packets dropped",
    "resolution change",
    "wrong credentials",
)
PAUSE_S = 4.0  # the stream sends nothing this long, its connection open
DOWN_S = 3.0  # the server is gone this long
LOSS = 0.1  # the share of encoded frames dropped during "packets dropped"
LOSS_S = 3.0
KINDS = ("rtsp", "rtsp-ffmpeg", "http-mjpeg")
# What each kind's camera serves, and over what: (codecs, transports).
KIND_AXES = {
    "rtsp": (("h264", "h265"), ("tcp", "udp")),
    "rtsp-ffmpeg": (("h264", "h265"), ("tcp", "udp")),
    "http-mjpeg": (("mjpeg",), ("http",)),
}
# Faults that cannot happen to a kind, and why.
NOT_APPLICABLE = {
    (
        "http-mjpeg",
        "packets dropped",
    ): "MJPEG over HTTP runs on TCP: a lost packet is resent, never a damaged frame",
}
USER, PASSWORD = "viewer", "s3cret:p@ss"


def open_with_ffmpeg(uri: str) -> Source:
    """``open_source`` with no stream opener but OpenCV's FFmpeg (the path taken without PyGObject)."""
    saved = list(sources.STREAM_OPENERS)
    sources.STREAM_OPENERS.clear()
    try:
        return open_source(uri)
    finally:
        sources.STREAM_OPENERS[:] = saved


def _pattern(width: int = 640, height: int = 480, n: int = 15) -> list[np.ndarray]:
    """A moving pattern for the MJPEG camera (frames that differ, as a scene's do)."""
    ramp = np.tile(np.linspace(0, 255, width, dtype=np.uint8), (height, 1))
    return [
        np.dstack([np.roll(ramp, 16 * i, axis=1), ramp[:, ::-1], np.full_like(ramp, 17 * i)])
        for i in range(n)
    ]


@dataclass
class Cell:
    kind: str
    codec: str
    transport: str
    fault: str
    frames: int = 0  # frames read in the whole cell
    frames_after: int = 0  # frames read after the fault ended
    outages: int = 0
    reopens: int = 0
    stalls: int = 0
    corrupt: int = 0
    down_s: float = 0.0
    detect_s: float | None = None  # from the fault to the outage being counted
    recover_s: float | None = None  # from the fault's end to the next frame
    sizes: list[tuple[int, int]] = field(default_factory=list)  # frame sizes seen, in order
    error: str = ""  # what the user sees when the source cannot open
    sees: str = ""  # what the user sees, in words
    na: str = ""  # why the fault cannot happen to this kind (the cell is not run)

    def row(self) -> dict[str, Any]:
        return asdict(self)


class Reader(threading.Thread):
    """Reads a source until stopped, keeping each frame's arrival time and size."""

    def __init__(self, source: Source) -> None:
        super().__init__(daemon=True)
        self.source = source
        self.arrivals: list[float] = []
        self.sizes: list[tuple[int, int]] = []
        self.outage_at: float | None = None

    def run(self) -> None:
        while True:
            image = self.source.read()
            if image is None:
                return
            self.arrivals.append(time.monotonic())
            size = (image.shape[1], image.shape[0])
            if not self.sizes or self.sizes[-1] != size:
                self.sizes.append(size)

    def wait_frames(self, n: int, after: float = 0.0, timeout: float = 30.0) -> float | None:
        """Wait for ``n`` frames that arrived after ``after``; the first one's time, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [t for t in self.arrivals if t > after]
            if len(later) >= n:
                return later[0]
            if self.outage_at is None and self.source.counters.outages:
                self.outage_at = time.monotonic()
            time.sleep(0.01)
        return None

    def watch_outage(self, seconds: float) -> None:
        """Sleep ``seconds``, noting when the source first counts an outage."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.outage_at is None and self.source.counters.outages:
                self.outage_at = time.monotonic()
            time.sleep(0.01)


def run_cell(
    codec: str,
    transport: str,
    fault: str,
    opener: Callable[[str], Source] | None = None,
    *,
    kind: str = "rtsp",
) -> Cell:
    """Run one cell of the matrix against a fresh camera of ``kind``."""
    cell = Cell(kind, codec, transport, fault)
    if (why := NOT_APPLICABLE.get((kind, fault))) is not None:
        cell.na = cell.sees = f"n/a: {why}"
        return cell
    opener = opener or (open_with_ffmpeg if kind == "rtsp-ffmpeg" else open_source)
    creds = {"user": USER, "password": PASSWORD} if fault == "wrong credentials" else {}
    cam: RtspCamera | MjpegCamera
    if kind == "http-mjpeg":
        cam = MjpegCamera(_pattern(), fps=30, **creds)  # type: ignore[arg-type]
        suffix = ""
    else:
        cam = RtspCamera(codec=codec, **creds)  # type: ignore[arg-type]
        suffix = f"#transport={transport}"
    with cam:
        if fault == "wrong credentials":
            url = cam.url_as(USER, "not-it") + suffix
            try:
                opener(url).close()
            except SourceError as err:
                cell.error = f"{err.message} | {err.hint}"
                cell.sees = "a clear error at start; the password is not shown"
            else:
                cell.sees = "opened (the camera did not check the password)"
            return cell
        source = opener(cam.url + suffix)
        reader = Reader(source)
        reader.start()
        try:
            if reader.wait_frames(30) is None:
                raise AssertionError("no frames from the camera")
            end = _fault(cam, reader, cell)
            cell.frames_after = len([t for t in reader.arrivals if t > end])
        finally:
            source.close()
            reader.join(10)
        c = source.counters
        cell.frames, cell.outages, cell.reopens = len(reader.arrivals), c.outages, c.reopens
        cell.stalls, cell.corrupt, cell.down_s = c.stalls, c.corrupt, round(c.down_s, 2)
        cell.sizes = reader.sizes
        cell.sees = _sees(cell)
    return cell


def _fault(cam: RtspCamera | MjpegCamera, reader: Reader, cell: Cell) -> float:
    """Do the cell's fault to the camera; when it ended."""
    start = time.monotonic()
    if cell.fault == "none":
        end = time.monotonic()
    elif cell.fault == "server killed":
        cam.stop()
        reader.watch_outage(DOWN_S)
        cam.start()
        end = time.monotonic()
    elif cell.fault == "stream paused":
        cam.pause()
        reader.watch_outage(PAUSE_S)
        cam.resume()
        end = time.monotonic()
    elif cell.fault == "packets dropped":
        assert isinstance(cam, RtspCamera)
        cam.set_drop(LOSS)
        reader.watch_outage(LOSS_S)
        cam.set_drop(0.0)
        end = time.monotonic()
    elif cell.fault == "resolution change":
        cam.resize(320, 240)
        end = time.monotonic()
    else:
        raise ValueError(cell.fault)
    first = reader.wait_frames(30, after=end)
    cell.recover_s = None if first is None else round(max(0.0, first - end), 2)
    if reader.outage_at is not None:
        cell.detect_s = round(reader.outage_at - start, 2)
    return end


def _sees(cell: Cell) -> str:
    if cell.fault == "none":
        return "frames"
    if cell.fault == "resolution change":
        if cell.sizes and cell.sizes[-1] == (320, 240):
            return "frames at the new size from the next frames on"
        return "frames scaled to the first size (OpenCV's FFmpeg hides the change)"
    parts = []
    if cell.stalls:
        parts.append(f"a stall found by the watchdog ({cell.stalls}), reopened {cell.reopens}x")
    elif cell.outages:
        parts.append(f"{cell.outages} outage(s) in the log and counters, reopened {cell.reopens}x")
    if cell.corrupt:
        parts.append(f"{cell.corrupt} damaged frames skipped")
    if cell.fault == "packets dropped" and not cell.outages:
        parts.append("frames go on" + ("" if cell.corrupt else " (the decoder conceals the losses)"))
    return "; ".join(parts) or "nothing"
