"""RTSP cameras and video files read through GStreamer, decoded where the device's profile says.

opencv-python-headless has no GStreamer, so the pipeline is run through PyGObject and its
frames are taken from an ``appsink``::

    rtspsrc protocols=tcp latency=200 ! decodebin ! [nvvidconv ! video/x-raw,format=BGRx !]
        videoconvert ! video/x-raw,format={I420,NV12,BGRx,BGR} ! appsink max-buffers=4 drop=true sync=false

decodebin picks the decoder the profile's ``decoder`` path names (``edgekit.device.video_decode``
raises its rank; a hardware decoder missing here falls back to ``avdec_h264``/``avdec_h265``,
logged).  videoconvert passes the decoder's own format through where the appsink takes it;
each frame is then copied once, by OpenCV's colour conversion into the BGR frame handed over
(``gst_frames``), its layout read from every sample so a resolution change is followed.

A live source is watched: no frame for ``stall_timeout_s(fps)`` while the pipeline runs is
a stall (``stalls`` and ``outages``); an error on the bus or an end of stream is an outage.
The pipeline is then torn down (state NULL) and built again with back-off until a frame
comes, or the source is closed (``close()`` ends every wait at once).  Decoder errors and
warnings (a damaged frame) are counted in ``corrupt``.  A file ends with ``None``.

Without PyGObject or GStreamer, ``open_source`` reads RTSP through OpenCV's FFmpeg instead
and logs what to install (``edgekit doctor`` says it too).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from edgekit.core.backoff import Backoff
from edgekit.core.redact import redact_source
from edgekit.device.host import match_profile
from edgekit.device.video_decode import (
    DecoderChoice,
    gst_status,
    gstreamer,
    plan_decoders,
    prefer_decoders,
)
from edgekit.errors import EdgekitError, SourceError
from edgekit.pipeline import sources
from edgekit.pipeline.camera_probe import RTSP_PORT, diagnose
from edgekit.pipeline.gst_frames import APPSINK_CAPS, frame_converter, layout
from edgekit.pipeline.sources import (
    REOPEN_FIRST_S,
    REOPEN_MAX_S,
    Source,
    SourceInfo,
    parse_source,
    stall_timeout_s,
)

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

TRANSPORTS = ("tcp", "udp")
#: rtspsrc's jitter buffer: enough to reorder UDP packets, small enough for a live camera.
DEFAULT_LATENCY_MS = 200
# Frames a live camera's appsink holds for a capture thread that is late (133 ms at 30 fps); past
# that the oldest is dropped and counted (SourceCounters.skipped).  One would lose a frame at
# every hiccup of a busy CPU without a trace; more would only add latency.
LIVE_QUEUE = 4
#: How long opening (or reopening) may wait for the first frame.
OPEN_TIMEOUT_S = sources.NETWORK_TIMEOUT_MS / 1000
# The slice a pull waits before it looks at the bus and the close event again.
_PULL_SLICE_S = 0.05


def pipeline_description(kind: str, plan: dict[str, DecoderChoice], live: bool) -> str:
    """The gst-launch description of a source's pipeline; ``src`` and ``sink`` name its ends.

    The location, transport and latency are set as properties on ``src`` (never quoted into
    the string: a URL with credentials or a path with spaces stays what it is).
    """
    front = "rtspsrc name=src" if kind == "stream" else "filesrc name=src"
    convert = next((c.convert for c in plan.values() if c.convert), "")
    # A live camera's frames wait in a short queue for a capture thread that is late for a moment
    # (a busy CPU), and the oldest is dropped, counted, past that; a file waits for the reader.
    queue, drop = (LIVE_QUEUE, "true") if live else (1, "false")
    sink = f"appsink name=sink max-buffers={queue} drop={drop} sync=false"
    return " ! ".join(
        x for x in (front, "decodebin name=dec", convert, "videoconvert", APPSINK_CAPS, sink) if x
    )


class GstSource(Source):
    """An RTSP camera (live) or a video file (ends) decoded by GStreamer; BGR frames from its appsink."""

    def __init__(
        self,
        info: SourceInfo,
        *,
        decoder: str = "software",
        transport: str = "tcp",
        latency_ms: int = DEFAULT_LATENCY_MS,
        location: str | None = None,
    ) -> None:
        super().__init__(info)
        #: What rtspsrc or filesrc opens: the URI without its ``#`` options.
        self.location = location or info.uri
        gst = gstreamer()
        if gst is None:
            status = gst_status()
            raise SourceError(
                f"cannot read {redact_source(info.uri)!r} through GStreamer: {status.reason}", status.hint
            )
        if transport not in TRANSPORTS:
            raise SourceError(f"unknown RTSP transport {transport!r}", f"use one of {', '.join(TRANSPORTS)}")
        self._gst = gst
        self.plan = plan_decoders(decoder)
        for choice in self.plan.values():
            if choice.note:
                log.warning("source %s, %s: %s", redact_source(info.uri), choice.codec, choice.note)
        prefer_decoders(self.plan)
        self.transport, self.latency_ms = transport, latency_ms
        self.description = pipeline_description(info.kind, self.plan, info.live)
        #: The decoder elements decodebin really put in (what ``doctor`` predicts, seen).
        self.decoders: list[str] = []
        self._lock = threading.Lock()
        self._pipeline: Any = None
        self._sink: Any = None
        self._pending: Any = None  # the first sample, pulled while opening
        # This pipeline's frames into the appsink, pulled out of it, and dropped from it unseen;
        # each written by one thread only (streaming, reader, streaming), so no update is lost.
        self._arrivals = self._taken = self._dropped = 0
        self._convert = frame_converter()
        if not self._start():
            reason = self._last_error or "no frame came"
            self._stop()
            if info.kind == "stream":  # ask the camera why: nothing listens, credentials, path
                raise diagnose(self.location, OPEN_TIMEOUT_S)
            raise SourceError(
                f"cannot open {redact_source(info.uri)!r} through GStreamer: {reason}",
                "check the URL in a player (gst-play-1.0 URL); " + "GST_DEBUG=3 shows GStreamer's view",
            )

    # --- building and tearing down --------------------------------------------------------

    _last_error: str = ""

    def _build(self) -> Any:
        gst = self._gst
        pipeline = gst.parse_launch(self.description)
        src = pipeline.get_by_name("src")
        src.set_property("location", self.location)
        if self.info.kind == "stream":
            src.set_property("protocols", "tcp" if self.transport == "tcp" else "udp")
            src.set_property("latency", self.latency_ms)
            # Video only: an audio track left unlinked would stop the whole session.
            src.connect("select-stream", _video_only)
        pipeline.get_by_name("dec").connect("deep-element-added", self._element_added)
        if self.info.live:
            sink_pad = pipeline.get_by_name("sink").get_static_pad("sink")
            sink_pad.add_probe(self._gst.PadProbeType.BUFFER, self._arrived)
        return pipeline

    def _arrived(self, _pad: Any, _info: Any) -> Any:
        """A decoded frame reaches the appsink (its streaming thread): if its queue is full, the oldest
        goes, unseen, so it is counted here.  (GStreamer 1.22's appsink counts none of its drops.)"""
        if self._arrivals - self._taken - self._dropped >= LIVE_QUEUE:
            # The oldest leaves the queue unseen: it will never be pulled, so it no longer counts
            # as held.  (Counting it as held made every later arrival look like a drop.)
            self._dropped += 1
            self.counters.skipped += 1
        self._arrivals += 1
        return self._gst.PadProbeReturn.OK

    def _element_added(self, _bin: Any, _sub: Any, element: Any) -> None:
        factory = element.get_factory()
        if factory is not None and "Decoder" in (factory.get_metadata("klass") or ""):
            name = factory.get_name()
            if name not in self.decoders:
                self.decoders.append(name)
                log.info("source %s decodes with %s", redact_source(self.info.uri), name)

    def _start(self) -> bool:
        """Build the pipeline and wait for its first frame (kept for the next read); False if none came."""
        self._last_error = ""
        from gi.repository import GLib

        try:
            pipeline = self._build()
        except GLib.Error as err:  # parse_launch: an element that is not installed
            self._last_error = str(err)
            return False
        with self._lock:
            if self.closed:
                return False
            self._pipeline, self._sink = pipeline, pipeline.get_by_name("sink")
            self._arrivals = self._taken = self._dropped = 0
        if pipeline.set_state(self._gst.State.PLAYING) == self._gst.StateChangeReturn.FAILURE:
            self._drain_bus()
            self._last_error = self._last_error or "the pipeline would not start"
            return False
        sample, why = self._pull(OPEN_TIMEOUT_S)
        if sample is None:
            self._last_error = self._last_error or why
            return False
        self._pending = sample
        return True

    def _stop(self) -> None:
        with self._lock:
            pipeline, self._pipeline, self._sink, self._pending = self._pipeline, None, None, None
        if pipeline is not None:
            pipeline.set_state(self._gst.State.NULL)

    # --- reading ----------------------------------------------------------------------------

    def _pull(self, timeout_s: float) -> tuple[Any, str]:
        """The next sample, or ``(None, why)``: ``eos``, ``error``, ``stall`` or ``closed``."""
        gst = self._gst
        deadline = time.monotonic() + timeout_s
        while not self.closed:
            with self._lock:
                sink = self._sink
            if sink is None:
                return None, "closed"
            sample = sink.try_pull_sample(int(_PULL_SLICE_S * gst.SECOND))
            if sample is not None:
                self._taken += 1
                return sample, ""
            why = self._drain_bus()
            if why:
                return None, why
            if sink.is_eos():
                return None, "eos"
            if time.monotonic() >= deadline:
                return None, "stall"
        return None, "closed"

    def _drain_bus(self) -> str:
        """Handle what the pipeline said: ``eos`` or ``error`` ends the stream; damage is counted."""
        gst = self._gst
        with self._lock:
            pipeline = self._pipeline
        if pipeline is None:
            return "closed"
        bus = pipeline.get_bus()
        kinds = gst.MessageType.ERROR | gst.MessageType.WARNING | gst.MessageType.EOS
        while (msg := bus.pop_filtered(kinds)) is not None:
            if msg.type == gst.MessageType.EOS:
                return "eos"
            err, _debug = msg.parse_error() if msg.type == gst.MessageType.ERROR else msg.parse_warning()
            if _from_decoder(msg.src) or err.matches(gst.StreamError.quark(), int(gst.StreamError.DECODE)):
                self.counters.corrupt += 1  # a damaged frame: the decoder goes on with the next one
                log.debug("source %s: decoder says %s", redact_source(self.info.uri), err.message)
                continue
            if msg.type == gst.MessageType.ERROR:
                self._last_error = err.message
                return "error"
            log.debug("source %s: %s", redact_source(self.info.uri), err.message)
        return ""

    def _read(self) -> np.ndarray | None:
        while not self.closed:
            sample, self._pending = self._pending, None
            why = ""
            if sample is None:
                sample, why = self._pull(stall_timeout_s(self.info.fps) if self.info.live else 3600.0)
            if sample is not None:
                frame = self._frame(sample)
                if frame is not None:
                    return frame
                continue
            if why == "closed" or (why == "eos" and not self.info.live):
                return None
            if not self.info.live:  # a file that fails is over, not reopened
                raise SourceError(
                    f"GStreamer stopped reading {redact_source(self.info.uri)!r}: {self._last_error or why}",
                    "check the file with gst-discoverer-1.0 FILE",
                )
            self._reconnect(why)
        return None

    def _frame(self, sample: Any) -> np.ndarray | None:
        caps = sample.get_caps()
        buffer = sample.get_buffer()
        if caps is None or buffer is None:
            return None
        s = caps.get_structure(0)
        if s.has_field("framerate"):
            ok, num, den = s.get_fraction("framerate")
            if ok and num > 0 and den > 0:
                self._follow_rate(num / den)
        frame: np.ndarray | None = self._convert(buffer, layout(buffer, caps))
        return frame

    def _follow_rate(self, fps: float) -> None:
        """The caps say the stream's rate: the first time it is learnt; a change is counted and followed.

        The stall rule is a number of frame periods, so a camera that drops from 30 to 5 fps must
        not look stalled between its frames.
        """
        was = self.info.fps
        if was is not None and abs(fps - was) <= 0.01 * was:
            return
        self.info = SourceInfo(self.info.uri, self.info.kind, self.info.live, fps)
        if was is not None:
            self.counters.rate_changes += 1
            log.warning(
                "source %s: the frame rate changed from %.3g to %.3g fps (stall after %.1f s now)",
                redact_source(self.info.uri),
                was,
                fps,
                stall_timeout_s(fps),
            )

    def _reconnect(self, why: str) -> None:
        """Tear the pipeline down and build it again, with back-off, until a frame comes or close()."""
        if why == "stall" and self.info.kind == "stream" and _gone(self.location):
            why = "gone"  # no frame because the camera went away: an outage, not a stall
        self._outage(stalled=why == "stall")
        log.warning(
            "source %s: %s; rebuilding the pipeline",
            redact_source(self.info.uri),
            {
                "stall": f"no frame for {stall_timeout_s(self.info.fps):.1f} s with the camera there (stall)",
                "gone": "no frame, and the camera does not answer",
                "eos": "the stream ended",
                "error": self._last_error,
            }.get(why, why),
        )
        self._stop()
        backoff = Backoff(REOPEN_FIRST_S, cap_s=REOPEN_MAX_S)
        while not self.closed:
            if self._start():
                self._reopened()
                return
            self._stop()
            backoff.wait(self._closed)

    def close(self) -> None:
        super().close()
        self._stop()


def _gone(url: str, timeout_s: float = 0.5) -> bool:
    """Whether nothing accepts a connection at the camera's RTSP port (it went away, not stalled)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or RTSP_PORT), timeout=timeout_s):
            return False
    except OSError:
        return True


def _video_only(_src: Any, _num: int, caps: Any) -> bool:
    s = caps.get_structure(0)
    return bool(s.get_string("media") == "video")


def _from_decoder(element: Any) -> bool:
    factory = element.get_factory() if hasattr(element, "get_factory") else None
    return factory is not None and "Decoder" in (factory.get_metadata("klass") or "")


# --- the hook open_source asks ---------------------------------------------------------------

RTSP_SCHEMES = ("rtsp://", "rtsps://")


@cache
def host_decoder() -> str:
    """The decoder path of the profile this host matches (``software`` when none does)."""
    try:
        return match_profile().decoder
    except EdgekitError:
        return "software"


@cache
def _note_fallback() -> None:
    status = gst_status()
    log.warning(
        "RTSP through OpenCV's FFmpeg, not GStreamer (%s): no hardware decode, no stall watchdog; %s",
        status.reason,
        status.hint,
    )


def open_rtsp(uri: str, fps: float | None) -> Source | None:
    """A ``GstSource`` for an RTSP URL, or ``None`` (OpenCV's FFmpeg reads it) without PyGObject/GStreamer."""
    if not uri.strip().lower().startswith(RTSP_SCHEMES):
        return None
    if gstreamer() is None:
        _note_fallback()
        return None
    spec = parse_source(uri)  # the URL without its "#" options, and the options
    return GstSource(
        SourceInfo(uri, "stream", True, fps),
        decoder=host_decoder(),
        transport=spec.params.get("transport", "tcp"),
        location=str(spec.target),
    )


sources.STREAM_OPENERS.append(open_rtsp)


def open_file(path: str | Path, *, fps: float | None = None, decoder: str | None = None) -> GstSource:
    """A video file decoded by GStreamer (``open_source`` reads files through OpenCV's FFmpeg)."""
    return GstSource(SourceInfo(str(path), "file", False, fps), decoder=decoder or host_decoder())
