"""The capture thread and the one-frame slot it hands frames over in.

Reading a camera blocks until the sensor delivers; decoding a file takes milliseconds.
Both happen on this thread, so the frame loop only ever waits for a frame that exists.
The slot holds at most one frame: under ``drop-oldest`` a new frame replaces an untaken
one (counted as dropped, never queued); under ``block`` the capture thread waits.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.core.redact import redact_source
from edgekit.errors import EdgekitError, SourceError, first_line
from edgekit.pipeline.policy import Policy

if TYPE_CHECKING:
    import numpy as np

    from edgekit.pipeline.sources import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Frame:
    """One captured frame: the image, its position in the source, when it was captured, drops before it."""

    image: np.ndarray
    index: int  # 0-based position in the source, dropped frames included
    captured_ns: int  # time.perf_counter_ns() when the source handed it over
    captured_at: float  # time.time() at the same moment, for people and other machines
    dropped_before: int  # frames dropped by the slot since the previous frame was taken
    camera: str = ""  # which camera it came from (a pipeline of many; "" for a single source)
    name: str = ""  # which frame it is to people: the image file's name, a video file's name, a camera's URI


class FrameSlot:
    """A one-frame hand-over between the capture thread and the frame loop."""

    def __init__(self, policy: Policy, cond: threading.Condition | None = None, camera: str = "") -> None:
        self.policy = policy
        self.camera = camera
        self.dropped = 0  # only goes up
        self._frame: Frame | None = None
        self._dropped_since_take = 0
        self._done = False
        self._error: BaseException | None = None
        # Many cameras' slots share one condition (``cameras.CameraGroup``): the loop waits on all at once.
        self._cond = cond or threading.Condition()

    def put(self, frame: Frame) -> bool:
        """Offer a frame; ``False`` once the slot is closed (the capture thread then stops)."""
        with self._cond:
            if self.policy is Policy.BLOCK:
                while self._frame is not None and not self._done:
                    self._cond.wait()
            if self._done:
                return False
            if self._frame is not None:
                self.dropped += 1
                self._dropped_since_take += 1
            self._frame = frame
            self._cond.notify_all()
            return True

    def take(self, timeout: float | None = None) -> Frame | None:
        """The newest frame, waiting up to ``timeout`` s; ``None`` when the source ended or on timeout.

        An error raised by the source on the capture thread is raised here, in the loop.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._frame is not None or self._done, timeout):
                return None
            frame = self._frame
            if frame is None:
                if self._error is not None:
                    raise self._error
                return None
            self._frame = None
            if self._dropped_since_take:
                from dataclasses import replace

                frame = replace(frame, dropped_before=self._dropped_since_take)
                self._dropped_since_take = 0
            self._cond.notify_all()
            return frame

    def finish(self, error: BaseException | None = None) -> None:
        """No more frames will come (after the one in the slot, if any)."""
        with self._cond:
            self._done = True
            self._error = self._error or error
            self._cond.notify_all()

    @property
    def finished(self) -> bool:
        with self._cond:
            return self._done and self._frame is None

    @property
    def has_frame(self) -> bool:
        with self._cond:
            return self._frame is not None

    def peek_captured_ns(self) -> int:
        """The waiting frame's capture time (call with a frame waiting, under the shared condition)."""
        with self._cond:
            assert self._frame is not None
            return self._frame.captured_ns

    @property
    def error(self) -> BaseException | None:
        """What ended the source on the capture thread, if it failed."""
        with self._cond:
            return self._error


class CaptureThread(threading.Thread):
    """Reads ``source`` into ``slot`` until the source ends or ``stop()``; ``pace_fps`` replays files in real time."""

    def __init__(
        self, source: Source, slot: FrameSlot, pace_fps: float | None = None, camera: str = ""
    ) -> None:
        super().__init__(name=f"edgekit-capture[{redact_source(source.info.uri)}]", daemon=True)
        self.camera = camera
        self.source = source
        self.slot = slot
        self.pace_fps = pace_fps if pace_fps and pace_fps > 0 else None
        self._halt = threading.Event()

    def run(self) -> None:
        index = 0
        skipped = 0  # the source's own count of frames it dropped before we read them
        t0 = time.monotonic()
        try:
            while not self._halt.is_set():
                if self.pace_fps is not None:
                    # Replay at the source's rate: frame i is due at t0 + i/fps, like a camera.
                    # A late frame is not followed by a catch-up burst of old ones.
                    delay = t0 + index / self.pace_fps - time.monotonic()
                    if delay > 0 and self._halt.wait(delay):
                        break
                    if delay < -1 / self.pace_fps:
                        t0 -= delay  # re-anchor: late by more than a frame
                image = self.source.read()
                if image is None:
                    break
                now_ns, now = time.perf_counter_ns(), time.time()
                name = self.source.frame_name()
                if not self.slot.put(Frame(image, index, now_ns, now, 0, self.camera, name)):
                    break
                # A frame's index is its position in the source: frames the source itself
                # dropped for a late reader count, as the slot's drops do.
                now_skipped = self.source.counters.skipped
                index += 1 + now_skipped - skipped
                skipped = now_skipped
        except EdgekitError as err:
            self.slot.finish(err)
        except Exception as err:  # a runtime's error on the capture thread must reach the loop
            log.debug("capture failed", exc_info=True)
            where = redact_source(self.source.info.uri)
            self.slot.finish(SourceError(f"reading {where!r} failed: {first_line(err)}", ""))
        finally:
            self.slot.finish()  # whatever happened, the loop learns that no more frames come

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading and close the source; waits up to ``timeout`` s for the thread to end."""
        self._halt.set()
        self.slot.finish()
        self.source.close()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
