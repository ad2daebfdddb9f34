"""Faults done to a real RTSP camera while a source reads it, and what the source made of each.

Shared by tests/test_sources_rtsp.py (which asserts on each cell) and
benchmarks/source_matrix.py (which prints the matrix): one cell is a codec, a transport and a
fault, run against ``RtspCamera`` on loopback.  A reader thread takes frames as a pipeline's
capture thread does; the fault happens on the camera's side; the cell records the frames before,
during and after it, the source's counters, and how long frames took to come back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rtsp_server import RtspCamera

from edgekit.errors import SourceError
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


@dataclass
class Cell:
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


def run_cell(codec: str, transport: str, fault: str, opener: Callable[[str], Source] = open_source) -> Cell:
    """Run one cell of the matrix against a fresh camera."""
    cell = Cell(codec, transport, fault)
    creds = {"user": "viewer", "password": "s3cret:p@ss"} if fault == "wrong credentials" else {}
    with RtspCamera(codec=codec, **creds) as cam:  # type: ignore[arg-type]
        if fault == "wrong credentials":
            url = cam.url_as("viewer", "not-it") + f"#transport={transport}"
            try:
                opener(url).close()
            except SourceError as err:
                cell.error = f"{err.message} | {err.hint}"
                cell.sees = "a clear error at start; the password is not shown"
            else:
                cell.sees = "opened (the camera did not check the password)"
            return cell
        source = opener(cam.url + f"#transport={transport}")
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


def _fault(cam: RtspCamera, reader: Reader, cell: Cell) -> float:
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
    if cell.outages:
        parts.append(f"{cell.outages} outage(s) in the log and counters, reopened {cell.reopens}x")
    if cell.corrupt:
        parts.append(f"{cell.corrupt} damaged frames skipped")
    if cell.fault == "packets dropped" and not cell.outages:
        parts.append("frames go on" + ("" if cell.corrupt else " (the decoder conceals the losses)"))
    return "; ".join(parts) or "nothing"
