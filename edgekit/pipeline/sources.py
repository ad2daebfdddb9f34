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
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.core.redact import redact_source
from edgekit.errors import SourceError
from edgekit.pipeline.opencv_source import STALE_MAX, CaptureSource, _cv2, gstreamer_available
from edgekit.pipeline.source_base import (
    NETWORK_TIMEOUT_MS,
    REOPEN_FIRST_S,
    REOPEN_MAX_S,
    STALL_MAX_S,
    STALL_MIN_S,
    STALL_PERIODS,
    Source,
    SourceCounters,
    SourceInfo,
    stall_timeout_s,
)
from edgekit.processing.preprocessing import as_bgr

# The names a source's user imports from here, wherever they are defined.
__all__ = [
    "IMAGE_SUFFIXES",
    "NETWORK_TIMEOUT_MS",
    "REOPEN_FIRST_S",
    "REOPEN_MAX_S",
    "STALE_MAX",
    "STALL_MAX_S",
    "STALL_MIN_S",
    "STALL_PERIODS",
    "STREAM_OPENERS",
    "STREAM_OPTIONS",
    "CaptureSource",
    "FolderSource",
    "Source",
    "SourceCounters",
    "SourceInfo",
    "SourceSpec",
    "SyntheticSource",
    "as_bgr",
    "gstreamer_available",
    "open_source",
    "parse_source",
    "stall_timeout_s",
]

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"})
STREAM_SCHEMES = ("http://", "https://", "rtsp://", "rtsps://", "rtmp://", "udp://", "tcp://", "srt://")
# What may follow "#" in a stream's URI, and the values each option takes (the first is the default).
STREAM_OPTIONS: dict[str, tuple[str, ...]] = {"transport": ("tcp", "udp")}


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
        self._name = ""

    def frame_name(self) -> str:
        return self._name  # the image just read

    def _read(self) -> np.ndarray | None:
        cv2 = _cv2()
        while self._next < len(self.files):
            path = self.files[self._next]
            self._next += 1
            image: np.ndarray | None = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if image is not None:
                self._name = path.name
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
        return CaptureSource(SourceInfo(uri, "file", False, fps), str(path), cv2.CAP_FFMPEG)
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
        return CaptureSource(
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
        return CaptureSource(SourceInfo(uri, "gstreamer", True, fps), str(spec.target), cv2.CAP_GSTREAMER)
    return CaptureSource(SourceInfo(uri, "camera", True, fps), spec.target, cv2.CAP_V4L2)
