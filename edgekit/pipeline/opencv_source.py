"""Cameras, video files and network streams read through OpenCV (``cv2.VideoCapture``).

V4L2 cameras, files through OpenCV's FFmpeg, ``http://`` streams, ``rtsp://`` where GStreamer's
path (``gst_source``) is not installed, and GStreamer pipeline strings where OpenCV was built
with GStreamer.  A live source that drops is reopened with back-off; a network stream's read
timeout is the stall watchdog (``stall_timeout_s``); a stream read late starts at the present.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from edgekit.core.backoff import Backoff
from edgekit.core.redact import redact_source
from edgekit.errors import SourceError
from edgekit.pipeline.source_base import (
    NETWORK_TIMEOUT_MS,
    REOPEN_FIRST_S,
    REOPEN_MAX_S,
    Source,
    SourceInfo,
    stall_timeout_s,
)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

# At most this many frames queued before a stream's first read are skipped (10 s at 30 fps).
STALE_MAX = 300


# OpenCV's FFmpeg reads its demuxer options from this variable at each open (there is no
# per-capture parameter for them): it is set for the open under a lock and put back.
_FFMPEG_OPTIONS_VAR = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_FFMPEG_OPTIONS_LOCK = threading.Lock()


class CaptureSource(Source):
    """A source read through ``cv2.VideoCapture``; live ones reopen with backoff when they drop or stall."""

    def __init__(
        self,
        info: SourceInfo,
        target: str | int,
        api: int,
        params: tuple[int, ...] = (),
        *,
        ffmpeg_options: str | None = None,
        read_timeout_s: float | None = None,
    ) -> None:
        super().__init__(info)
        self._target = target
        self._api = api
        self._params = list(params)
        self._ffmpeg_options = ffmpeg_options
        self._read_timeout_s = read_timeout_s
        self._stalled = False  # a read waited out its timeout but still handed over a held frame
        self._first_read = info.kind == "stream"  # catch up with the stream before the first frame
        self._lock = threading.Lock()
        self._cap: Any = self._open()
        if self._cap is None:
            raise self._open_error()
        if info.fps is None:
            fps = float(self._cap.get(_cv2().CAP_PROP_FPS) or 0.0)
            if 0 < fps < 1000:
                self.info = SourceInfo(info.uri, info.kind, info.live, fps)
                if read_timeout_s is not None:
                    self._follow_rate(fps)

    def _follow_rate(self, fps: float) -> None:
        """The stream's own rate is known now: the stall timeout follows it from the next open on."""
        cv2 = _cv2()
        timeout_s = stall_timeout_s(fps)
        ms = round(timeout_s * 1000)
        params = self._params
        for i in range(0, len(params) - 1, 2):
            if params[i] == cv2.CAP_PROP_READ_TIMEOUT_MSEC:
                params[i + 1] = ms
        # OpenCV's FFmpeg takes the read timeout only when opening (set() answers False): the open
        # capture keeps the one it was opened with, and a stall is judged against that one, or a
        # stream whose rate reads slower than the guess (MJPEG over HTTP says 25 fps) would never
        # count its stalls.  The next open takes the new timeout (see _open).
        if self._cap.set(cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms):
            self._read_timeout_s = timeout_s

    def _open(self) -> Any:
        cv2 = _cv2()
        if self._ffmpeg_options is None:
            cap = cv2.VideoCapture(self._target, self._api, self._params)
        else:
            with _FFMPEG_OPTIONS_LOCK:
                before = os.environ.get(_FFMPEG_OPTIONS_VAR)
                os.environ[_FFMPEG_OPTIONS_VAR] = self._ffmpeg_options
                try:
                    cap = cv2.VideoCapture(self._target, self._api, self._params)
                finally:
                    if before is None:
                        del os.environ[_FFMPEG_OPTIONS_VAR]
                    else:
                        os.environ[_FFMPEG_OPTIONS_VAR] = before
        if not cap.isOpened():
            cap.release()
            return None
        params = self._params
        for i in range(0, len(params) - 1, 2):
            if params[i] == cv2.CAP_PROP_READ_TIMEOUT_MSEC:
                self._read_timeout_s = params[i + 1] / 1000  # the timeout this capture reads with
        if self.info.kind == "camera":
            # One driver buffer: a camera must hand over the newest frame, not a queued stale one.
            cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)
        return cap

    def _open_error(self) -> SourceError:
        uri, kind = redact_source(self.info.uri), self.info.kind
        if kind == "camera":
            return SourceError(
                f"cannot open camera {uri!r} (V4L2)",
                "check that the device exists (v4l2-ctl --list-devices) and that this user may read it "
                "(the video group)",
            )
        if kind == "stream" and str(self._target).lower().startswith(("rtsp://", "http://")):
            from edgekit.pipeline.camera_probe import diagnose

            return diagnose(str(self._target), NETWORK_TIMEOUT_MS / 1000)
        if kind == "stream":
            return SourceError(
                f"cannot open stream {uri!r} (OpenCV FFmpeg, {NETWORK_TIMEOUT_MS // 1000} s timeout)",
                "check the URL in a player (ffplay URL) and that the camera is reachable from this host",
            )
        if kind == "gstreamer":
            return SourceError(
                f"GStreamer could not start the pipeline {uri!r}",
                "try it with gst-launch-1.0 first; the pipeline must end in appsink",
            )
        return SourceError(
            f"cannot read video file {uri!r}: OpenCV's FFmpeg could not open it",
            "check that it is a video (ffprobe FILE); convert it with ffmpeg -i FILE out.mp4",
        )

    def _read(self) -> np.ndarray | None:
        while not self.closed:
            if self._stalled:
                self._stalled = False
                self._reconnect(stalled=True)
                continue
            started = time.monotonic()
            with self._lock:
                cap = self._cap
                if self._first_read and cap is not None:
                    self._first_read = False
                    ok, image, started = self._catch_up(cap)
                else:
                    ok, image = cap.read() if cap is not None else (False, None)
            # A read that took the whole timeout ran out of packets: FFmpeg's interrupt ended it.
            # It may still hand over a frame its decoder held back; that frame is real, but the
            # stream has stalled, so it is reopened before the next read, not after more timeouts.
            timeout = self._read_timeout_s
            stalled = timeout is not None and time.monotonic() - started >= 0.9 * timeout
            if ok and image is not None:
                self._stalled = stalled and self.info.live
                frame: np.ndarray = image
                return frame
            if not self.info.live:
                return None  # a file ends
            self._reconnect(stalled=stalled)
        return None

    def _catch_up(self, cap: Any) -> tuple[bool, Any, float]:
        """The present frame of a stream read for the first time, past what it queued since opening.

        A pipeline opens its cameras, then loads and warms its model: seconds in which a network
        camera's frames queue in the socket and the demuxer.  Handing those over would start the
        run seconds in the past (and under ``block``, stay there).  Frames that come without
        waiting are the queue (counted as ``stale``); the first one that had to wait is the present.
        Returns the frame and when the last grab began (what the stall rule measures from).
        """
        period = 1.0 / (self.info.fps or 30.0)
        started = time.monotonic()
        for _ in range(STALE_MAX):
            started = time.monotonic()
            if not cap.grab():
                return False, None, started
            if time.monotonic() - started > period / 2:
                break
            self.counters.stale += 1
        ok, image = cap.retrieve()
        return bool(ok), image, started

    def _reconnect(self, *, stalled: bool = False) -> None:
        self._outage(stalled=stalled)
        where = redact_source(self.info.uri)
        if stalled:
            log.warning(
                "source %s sent no frame for %.1f s with its connection open; reopening",
                where,
                self._read_timeout_s or 0.0,
            )
        else:
            log.warning("source %s stopped delivering frames; reopening", where)
        with self._lock:
            if self._cap is not None:
                self._cap.release()
                self._cap = None
        backoff = Backoff(REOPEN_FIRST_S, cap_s=REOPEN_MAX_S)
        while not self.closed:
            cap = self._open()
            if cap is not None:
                with self._lock:
                    if self._closed.is_set():  # closed while opening: do not keep the device claimed
                        cap.release()
                        return
                    self._cap = cap
                self._reopened()
                return
            # Wait on the close event: close() ends the back-off at once, never a hang.
            backoff.wait(self._closed)

    def close(self) -> None:
        super().close()
        with self._lock:
            if self._cap is not None:
                self._cap.release()
                self._cap = None


def _cv2() -> Any:
    import cv2

    return cv2


def gstreamer_available() -> bool:
    """Whether the installed OpenCV was built with GStreamer."""
    info = _cv2().getBuildInformation()
    match = re.search(r"GStreamer:\s*(\S+)", info)
    return bool(match and match.group(1).upper() not in ("NO", "OFF"))


#: Asked in turn before OpenCV's FFmpeg opens a stream URL: each returns a Source, or None to pass
#: (``gst_source`` adds GStreamer's for RTSP when it is imported, as ``edgekit.pipeline`` does).
