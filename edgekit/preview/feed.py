"""The frames the preview shows: the newest result, turned into JPEGs only while someone watches.

The frame loop hands each result to :meth:`PreviewFeed.offer`, which only swaps a
reference: drawing and JPEG encoding happen on the feed's own thread, at most ``max_fps``
times a second, and not at all while no viewer is connected.  Each viewer has a queue of
``queue_frames`` JPEGs; when it is full the oldest is dropped, so a slow viewer sees fewer,
fresh frames and never holds back the loop, the encoder or the other viewers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.detection.draw import draw_detections

if TYPE_CHECKING:
    from edgekit.pipeline.records import FrameResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Jpeg:
    """One encoded frame: which frame it is (the source's index) and its bytes."""

    index: int
    data: bytes


class Viewer:
    """One connected stream: a bounded queue of JPEGs, newest last; the oldest goes when it is full."""

    def __init__(self, capacity: int) -> None:
        self._frames: deque[Jpeg] = deque(maxlen=capacity)
        self._ready = threading.Condition()
        self._closed = False

    def put(self, jpeg: Jpeg) -> bool:
        """Queue ``jpeg``; ``True`` when the oldest queued frame had to go to make room."""
        with self._ready:
            full = len(self._frames) == self._frames.maxlen
            self._frames.append(jpeg)
            self._ready.notify()
            return full

    def get(self, timeout: float) -> Jpeg | None:
        """The oldest queued frame, waiting up to ``timeout`` s; ``None`` if none came or the feed closed."""
        with self._ready:
            if not self._frames and not self._closed:
                self._ready.wait(timeout)
            return self._frames.popleft() if self._frames and not self._closed else None

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class PreviewFeed:
    """The newest frame result, and a JPEG of it (boxes drawn) for each viewer, made on one thread."""

    def __init__(
        self, *, max_viewers: int = 4, max_fps: float = 15.0, quality: int = 80, queue_frames: int = 2
    ) -> None:
        self.max_viewers = max_viewers
        self.min_interval_s = 1.0 / max_fps
        self.quality = quality
        self.queue_frames = queue_frames
        self.encoded = 0  # JPEGs made (only while watched)
        self.dropped = 0  # JPEGs a slow viewer never took (its queue was full)
        self._latest: FrameResult | None = None
        self._last_jpeg: Jpeg | None = None
        self._fresh = threading.Event()  # a result came since the last JPEG
        self._watched = threading.Event()  # at least one viewer is connected
        self._closed = threading.Event()
        self._viewers: list[Viewer] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._encode_loop, name="edgekit-preview-encoder", daemon=True)

    # -- the frame loop's side: a reference swap and an event -----------------------------

    def offer(self, result: FrameResult) -> None:
        """Make ``result`` the newest frame (called on the frame loop's thread: constant time)."""
        self._latest = result
        self._fresh.set()

    @property
    def latest(self) -> FrameResult | None:
        return self._latest

    # -- viewers --------------------------------------------------------------------------

    def subscribe(self) -> Viewer | None:
        """A new viewer, or ``None`` when ``max_viewers`` are already watching or the feed is closed."""
        with self._lock:
            if self._closed.is_set() or len(self._viewers) >= self.max_viewers:
                return None
            viewer = Viewer(self.queue_frames)
            self._viewers.append(viewer)
            self._watched.set()
            if self._last_jpeg is not None:  # a newcomer sees a picture now, not at the next frame
                viewer.put(self._last_jpeg)
            return viewer

    def unsubscribe(self, viewer: Viewer) -> None:
        viewer.close()
        with self._lock:
            if viewer in self._viewers:
                self._viewers.remove(viewer)
            if not self._viewers:
                self._watched.clear()

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    # -- the encoder thread -------------------------------------------------------------------

    def start(self) -> PreviewFeed:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop encoding and end every viewer's stream."""
        self._closed.set()
        self._watched.set()  # wake the encoder so it sees the close
        self._fresh.set()
        with self._lock:
            viewers, self._viewers = self._viewers, []
        for viewer in viewers:
            viewer.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _encode_loop(self) -> None:
        last: FrameResult | None = None
        next_at = 0.0
        while not self._closed.is_set():
            if not self._watched.wait(timeout=1.0):
                continue  # nobody watches: no JPEG is made
            if not self._fresh.wait(timeout=1.0):
                continue
            delay = next_at - time.monotonic()
            if delay > 0 and self._closed.wait(delay):  # at most max_fps JPEGs a second
                break
            self._fresh.clear()
            result = self._latest
            if result is None or result is last or self._closed.is_set():
                continue
            with self._lock:
                viewers = list(self._viewers)
            if not viewers:
                continue
            next_at = time.monotonic() + self.min_interval_s
            try:
                jpeg = Jpeg(result.record.index, self._encode(result))
            except Exception:  # one odd frame must not end the preview
                log.exception("preview: frame %d could not be encoded", result.record.index)
                continue
            last = result
            self.encoded += 1
            with self._lock:
                self._last_jpeg = jpeg
                viewers = list(self._viewers)  # including any that came while this one was encoded
            for viewer in viewers:
                self.dropped += viewer.put(jpeg)

    def _encode(self, result: FrameResult) -> bytes:
        import cv2

        image: Any = draw_detections(result.frame, result.detections)
        ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.quality])
        if not ok:
            raise ValueError(f"OpenCV could not encode a {image.shape} frame as JPEG")
        return bytes(buf.tobytes())
