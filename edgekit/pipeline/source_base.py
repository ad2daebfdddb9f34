"""What every frame source is, and the rules every live source shares.

``Source`` hands over BGR frames (``read``), keeps its ``SourceCounters`` and the time without
frames of its outages, and is closed once (``close``).  ``stall_timeout_s`` says when a live
stream that sends nothing has stalled; ``REOPEN_FIRST_S``/``REOPEN_MAX_S`` how reopening backs
off.  The kinds of source live beside it: ``sources`` (the URI grammar, folders, the test
pattern), ``opencv_source`` (cameras, files and streams through OpenCV) and ``gst_source``
(streams through GStreamer).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.core.heap import give_back
from edgekit.core.redact import redact_source
from edgekit.processing.preprocessing import as_bgr

if TYPE_CHECKING:
    import numpy as np

# How long a network stream may take to open before giving up.
NETWORK_TIMEOUT_MS = 5000
# A live stream that sends no frame for this many frame periods has stalled (see stall_timeout_s).
STALL_PERIODS = 30
STALL_MIN_S, STALL_MAX_S = 0.5, 2.0
# Back-off between reopen attempts of a live source: the first wait, doubling up to the cap.
REOPEN_FIRST_S, REOPEN_MAX_S = 0.1, 4.0


@dataclass(frozen=True)
class SourceInfo:
    """What a source is: its URI, its kind, whether it is live, and its frame rate when known."""

    uri: str
    kind: str  # camera | file | stream | gstreamer | folder | synthetic
    live: bool
    fps: float | None = None


@dataclass
class SourceCounters:
    """Counters kept by a source (they only go up)."""

    frames: int = 0
    outages: int = 0  # times a live source stopped delivering (stalls included)
    reopens: int = 0  # times it was opened again successfully
    stalls: int = 0  # outages where the connection stayed open but no frame came (the watchdog's)
    corrupt: int = 0  # frames the decoder reported damaged, skipped
    converted: int = 0  # frames converted to BGR uint8 (grayscale, BGRA, 16-bit)
    unreadable: int = 0  # folder images that could not be decoded (skipped)
    stale: int = 0  # frames a network stream queued between opening and the first read (skipped)
    skipped: int = 0  # frames decoded that a late reader never took (a live queue's oldest, dropped)
    rate_changes: int = 0  # times the stream's frame rate changed mid-stream (the stall rule follows)
    down_s: float = 0.0  # seconds without frames in outages that ended (see ``Source.down_now_s``)


def stall_timeout_s(fps: float | None) -> float:
    """How long a live stream may send nothing before it counts as stalled and is reopened.

    ``STALL_PERIODS`` frame periods, within ``STALL_MIN_S``..``STALL_MAX_S`` (1 s at 30 fps): long
    enough for a key frame's burst or a late frame, short enough that a stalled camera is back in
    about two seconds.  Never under three frame periods (a 1 fps camera waits 3 s).  1 s when the
    rate is not known.
    """
    if not fps or fps <= 0:
        return 1.0
    return max(STALL_MIN_S, min(STALL_MAX_S, STALL_PERIODS / fps), 3 / fps)


class Source(ABC):
    """A stream of BGR frames.  ``read()`` blocks for the next one; ``None`` means the source ended."""

    def __init__(self, info: SourceInfo) -> None:
        self.info = info
        self.counters = SourceCounters()
        self._closed = threading.Event()
        self._last_frame_t = time.monotonic()  # the last frame's arrival (or the opening)
        self._down_from: float | None = None  # when the outage in progress began (its last frame)

    @abstractmethod
    def _read(self) -> np.ndarray | None: ...

    def read(self) -> np.ndarray | None:
        """The next frame (BGR uint8 HxWx3), or ``None`` when the source has ended or was closed."""
        if self._closed.is_set():
            return None
        image = self._read()
        if image is None:
            return None
        now = time.monotonic()
        if self._down_from is not None:
            self.counters.down_s += now - self._down_from
            self._down_from = None
        self._last_frame_t = now
        image, converted = as_bgr(image)
        self.counters.frames += 1
        if converted:
            self.counters.converted += 1
        return image

    def frame_name(self) -> str:
        """What the frame ``read()`` just returned is called (the records' ``source_name``): a file's or a
        stream's name here; a folder's source says which image.  A password in a URI never shows."""
        uri = self.info.uri
        if self.info.live or "://" in uri or not uri:
            return redact_source(uri)
        return Path(uri).name or uri

    def down_now_s(self) -> float:
        """Seconds without frames in the outage in progress; 0.0 while the source delivers."""
        start = self._down_from
        return 0.0 if start is None else max(0.0, time.monotonic() - start)

    def _outage(self, *, stalled: bool = False) -> None:
        """Count an outage (a stall if the connection stayed open); its time runs from the last frame."""
        self.counters.outages += 1
        if stalled:
            self.counters.stalls += 1
        if self._down_from is None:
            self._down_from = self._last_frame_t

    def _reopened(self) -> None:
        """Count a reopen and say so; give the torn-down decoder's memory back (``core.heap``)."""
        self.counters.reopens += 1
        give_back()
        logging.getLogger(type(self).__module__).warning(  # the source's own logger, as before
            "source %s reopened (outage %d)", redact_source(self.info.uri), self.counters.outages
        )

    def close(self) -> None:
        """Stop: a ``read()`` waiting on a reconnect returns ``None``; resources are released."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact_source(self.info.uri)!r}>"
