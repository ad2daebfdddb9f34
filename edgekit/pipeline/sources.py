"""Frame sources: one URI-like string opens a camera, a file, a stream, a folder or a test pattern.

As in jetson-inference's ``videoSource``, the string says what it is:

========================  ===========================================================
``0``, ``/dev/video0``    a V4L2 camera (live)
``clip.mp4``              a video file (ends; ``realtime`` replays it at its own rate)
``http://…``, ``rtsp://…``  a network camera or stream (live; how it is decoded: below)
``rtsp://…#transport=udp``  the same, with options after ``#`` (see ``STREAM_OPTIONS``)
``v4l2src ! … ! appsink``  a GStreamer pipeline (needs an OpenCV built with GStreamer)
``photos/``               an image folder, in name order (ends)
``synthetic:640x480@30``  a generated moving test pattern (live, paced at its rate)
========================  ===========================================================

``rtsp://`` goes through GStreamer when PyGObject is present (``gst_source``, with the device
profile's decoder); without it, and ``http://`` always, through OpenCV's FFmpeg.

Every source hands over BGR ``uint8`` HxWx3 frames: grayscale, BGRA and 16-bit frames are
converted (and counted).  A live source that stops delivering is reopened with
exponential backoff until it comes back or the source is closed; each outage and each
reopen is counted.  A file or a folder ends cleanly: ``read()`` returns ``None``.

A stream that stays connected but sends nothing is a *stall*: no frame for
``stall_timeout_s(fps)`` (``STALL_PERIODS`` frame periods, within 0.5..2 s) ends the read,
counts a stall and an outage, and the stream is reopened like one that dropped.  The time
without frames is kept (``SourceCounters.down_s``, ``Source.down_now_s()``).

Options of a stream follow ``#`` (a fragment is never sent to the camera): ``transport=tcp``
(the default: RTP interleaved in the RTSP connection, so a lost packet is resent, not a
damaged frame) or ``transport=udp`` (lower latency on a clean network; losses show as
damaged frames).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.backoff import Backoff
from edgekit.core.redact import redact_source
from edgekit.errors import SourceError
from edgekit.processing.preprocessing import as_bgr

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
STREAM_SCHEMES = ("http://", "https://", "rtsp://", "rtsps://", "rtmp://", "udp://", "tcp://", "srt://")
# How long OpenCV's FFmpeg may wait to open a network stream before giving up.
NETWORK_TIMEOUT_MS = 5000
# A live stream that sends no frame for this many frame periods has stalled (see stall_timeout_s).
STALL_PERIODS = 30
STALL_MIN_S, STALL_MAX_S = 0.5, 2.0
# At most this many frames queued before a stream's first read are skipped (10 s at 30 fps).
STALE_MAX = 300
# What may follow "#" in a stream's URI, and the values each option takes (the first is the default).
STREAM_OPTIONS: dict[str, tuple[str, ...]] = {"transport": ("tcp", "udp")}
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


# OpenCV's FFmpeg reads its demuxer options from this variable at each open (there is no
# per-capture parameter for them): it is set for the open under a lock and put back.
_FFMPEG_OPTIONS_VAR = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_FFMPEG_OPTIONS_LOCK = threading.Lock()


class _CaptureSource(Source):
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
                self.counters.reopens += 1
                log.warning(
                    "source %s reopened (outage %d)", redact_source(self.info.uri), self.counters.outages
                )
                return
            # Wait on the close event: close() ends the back-off at once, never a hang.
            backoff.wait(self._closed)

    def close(self) -> None:
        super().close()
        with self._lock:
            if self._cap is not None:
                self._cap.release()
                self._cap = None


class FolderSource(Source):
    """Images of a folder in name order; an image that cannot be decoded is skipped and counted."""

    def __init__(self, info: SourceInfo, folder: Path) -> None:
        super().__init__(info)
        self.files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not self.files:
            raise SourceError(
                f"no images in {folder} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})",
                "give a folder of image files, a video file, a camera or a URL",
            )
        self._next = 0

    def _read(self) -> np.ndarray | None:
        cv2 = _cv2()
        while self._next < len(self.files):
            path = self.files[self._next]
            self._next += 1
            image: np.ndarray | None = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if image is not None:
                return image
            self.counters.unreadable += 1
            log.warning("skipping %s: not a readable image", path)
        return None


class SyntheticSource(Source):
    """A generated camera: colour bars and a gradient sliding sideways, paced at ``fps`` (0: unpaced)."""

    def __init__(self, info: SourceInfo, width: int, height: int) -> None:
        import numpy as np

        super().__init__(info)
        self.size = (width, height)
        x = np.linspace(0, 255, 2 * width, dtype=np.float32)
        y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
        bars = np.array(
            [
                [255, 255, 255],
                [0, 255, 255],
                [255, 255, 0],
                [0, 255, 0],
                [255, 0, 255],
                [0, 0, 255],
                [255, 0, 0],
            ],
            np.float32,
        )
        stripe = bars[(np.arange(2 * width) * 14 // (2 * width)) % 7]
        canvas = 0.6 * stripe[None, :, :] + 0.4 * ((x[None, :] + y) / 2)[:, :, None]
        self._canvas = np.clip(canvas, 0, 255).astype(np.uint8)
        self._index = 0
        # The pattern's clock starts at the first read, not at opening: a pipeline that loads and
        # warms up between the two would otherwise get its first frames late and then in a burst.
        self._t0: float | None = None

    def _read(self) -> np.ndarray | None:
        import numpy as np

        fps = self.info.fps or 0.0
        if self._t0 is None:
            self._t0 = time.monotonic()
        if fps > 0:
            due = self._t0 + self._index / fps
            delay = due - time.monotonic()
            if delay > 0 and self._closed.wait(delay):
                return None
            if delay < -1 / fps:
                self._t0 -= delay  # late by more than a frame (a slow reader): no catch-up burst
        w = self.size[0]
        offset = (self._index * 8) % w
        self._index += 1
        return np.ascontiguousarray(self._canvas[:, offset : offset + w])


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
STREAM_OPENERS: list[Callable[[str, float | None], Source | None]] = []

_SYNTHETIC = re.compile(r"^synthetic:(?:(\d+)x(\d+))?(?:@(\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source string (no I/O yet)."""

    kind: str
    target: str | int
    params: dict[str, Any] = field(default_factory=dict)


def parse_source(uri: str) -> SourceSpec:
    """Say what a source string names, without opening it."""
    text = uri.strip()
    if not text:
        raise SourceError(
            "the source is empty", "give a camera index (0), a file, a folder, a URL or synthetic:"
        )
    if text.startswith("synthetic:") or text == "synthetic":
        m = _SYNTHETIC.match(text if text != "synthetic" else "synthetic:")
        if m is None:
            raise SourceError(
                f"cannot read the synthetic source {uri!r}",
                "write it as synthetic:WIDTHxHEIGHT@FPS, e.g. synthetic:640x480@30",
            )
        w, h, fps = m.groups()
        return SourceSpec(
            "synthetic", text, {"width": int(w or 640), "height": int(h or 480), "fps": float(fps or 30)}
        )
    if text.isdigit():
        return SourceSpec("camera", int(text))
    if text.startswith("/dev/video"):
        return SourceSpec("camera", text)
    if text.lower().startswith(STREAM_SCHEMES):
        url, _, fragment = text.partition("#")
        return SourceSpec("stream", url, _stream_options(url, fragment, uri))
    if text.startswith("gst:") or " ! " in text or text.rstrip().endswith("appsink"):
        return SourceSpec("gstreamer", text.removeprefix("gst:").strip())
    path = Path(text).expanduser()
    if path.is_dir():
        return SourceSpec("folder", str(path))
    if path.is_file():
        return SourceSpec("file", str(path))
    raise SourceError(
        f"source {redact_source(uri)!r} is not a camera, a URL, a pipeline, or an existing file or folder",
        "give a camera index (0), /dev/videoN, a video file, an image folder, an http(s)/rtsp URL "
        "or synthetic:640x480@30",
    )


def _stream_options(url: str, fragment: str, uri: str) -> dict[str, Any]:
    """The ``#key=value&...`` options of a stream, checked against ``STREAM_OPTIONS``; defaults filled."""
    rtsp = url.lower().startswith(("rtsp://", "rtsps://"))
    options: dict[str, Any] = {name: values[0] for name, values in STREAM_OPTIONS.items()} if rtsp else {}
    for item in filter(None, fragment.split("&")):
        name, eq, value = item.partition("=")
        allowed = STREAM_OPTIONS.get(name)
        if allowed is None or not eq:
            known = ", ".join(f"{k}={'|'.join(v)}" for k, v in STREAM_OPTIONS.items())
            raise SourceError(
                f"unknown stream option {item!r} in {redact_source(uri)!r}",
                f"options follow '#' as name=value joined by '&'; known: {known}",
            )
        if not rtsp:
            raise SourceError(
                f"{name}= applies to rtsp:// streams, not to {redact_source(url)!r}",
                "drop the option, or give the camera's rtsp:// URL",
            )
        if value not in allowed:
            raise SourceError(
                f"stream option {name}={value!r} is not one of {', '.join(allowed)}",
                f"write #{name}={allowed[0]} (the default) or #{name}={allowed[-1]}",
            )
        options[name] = value
    return options


def open_source(uri: str, *, fps: float | None = None) -> Source:
    """Open the source ``uri`` names (see the module docstring).  ``fps`` overrides its frame rate."""
    spec = parse_source(uri)
    cv2 = _cv2()
    if spec.kind == "synthetic":
        p = spec.params
        rate = fps if fps is not None else p["fps"]
        if p["width"] < 8 or p["height"] < 8:
            raise SourceError(
                f"synthetic frames of {p['width']}x{p['height']} are too small", "use at least 8x8"
            )
        return SyntheticSource(SourceInfo(uri, "synthetic", rate > 0, rate), p["width"], p["height"])
    if spec.kind == "folder":
        return FolderSource(SourceInfo(uri, "folder", False, fps), Path(str(spec.target)))
    if spec.kind == "file":
        path = Path(str(spec.target))
        if path.suffix.lower() in IMAGE_SUFFIXES:
            raise SourceError(
                f"{path} is a single image, not a video",
                "put it in a folder and give the folder, or use edgekit's Python API: model.classify(image)",
            )
        return _CaptureSource(SourceInfo(uri, "file", False, fps), str(path), cv2.CAP_FFMPEG)
    if spec.kind == "stream":
        for opener in STREAM_OPENERS:
            if (found := opener(uri, fps)) is not None:
                return found
        # The read timeout is the stall watchdog: FFmpeg's interrupt ends a read that gets no
        # packet for that long.  The rate is not known before opening: 30 fps until it is.
        stall_s = stall_timeout_s(fps or 30.0)
        params = (
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            NETWORK_TIMEOUT_MS,
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            round(stall_s * 1000),
        )
        transport = spec.params.get("transport")
        return _CaptureSource(
            SourceInfo(uri, "stream", True, fps),
            str(spec.target),
            cv2.CAP_FFMPEG,
            params,
            ffmpeg_options=f"rtsp_transport;{transport}" if transport else None,
            read_timeout_s=stall_s,
        )
    if spec.kind == "gstreamer":
        if not gstreamer_available():
            raise SourceError(
                f"this OpenCV ({cv2.__version__}) was built without GStreamer, so it cannot run {redact_source(uri)!r}",
                "opencv-python-headless from PyPI has no GStreamer: use the distribution's OpenCV "
                "(apt install python3-opencv; on Jetson, JetPack's OpenCV) in a venv made with "
                "--system-site-packages, or give the camera (/dev/video0) or stream URL directly",
            )
        return _CaptureSource(SourceInfo(uri, "gstreamer", True, fps), str(spec.target), cv2.CAP_GSTREAMER)
    return _CaptureSource(SourceInfo(uri, "camera", True, fps), spec.target, cv2.CAP_V4L2)
