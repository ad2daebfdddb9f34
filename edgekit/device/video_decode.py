"""Video decode paths: which GStreamer decoder a device's profile asks for, and what this host has.

A profile names its decode path (``decoder`` in ``devices/*.toml``):

============  ==========================================================  ===================
path          elements, in order of preference (H.264; H.265 alike)       where
============  ==========================================================  ===================
``nvv4l2``    ``nvv4l2decoder``, then ``nvvidconv`` to BGRx               NVIDIA Jetson
``v4l2``      ``v4l2slh264dec`` (stateless), ``v4l2h264dec`` (stateful)   Raspberry Pi
``vaapi``     ``vah264dec`` (the va plugin), ``vaapih264dec``             Intel iGPU
``software``  ``avdec_h264`` (FFmpeg's libavcodec through gst-libav)      everywhere else
============  ==========================================================  ===================

``plan_decoders(path)`` checks each element with ``Gst.ElementFactory.find``: a hardware
decoder missing at run time falls back to software, and the plan says so (``edgekit doctor``
prints it; ``GstSource`` logs it).  PyGObject and GStreamer are imported lazily: without
them ``gstreamer()`` says what to install, and sources read through OpenCV's FFmpeg instead.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from edgekit.device.profiles import DECODER_PATHS

log = logging.getLogger(__name__)

CODECS = ("h264", "h265")

# The elements each path may use, best first, per codec.
_ELEMENTS: dict[str, dict[str, tuple[str, ...]]] = {
    "software": {"h264": ("avdec_h264",), "h265": ("avdec_h265",)},
    "nvv4l2": {"h264": ("nvv4l2decoder",), "h265": ("nvv4l2decoder",)},
    # Pi 5 decodes HEVC only through the stateless (v4l2sl*) API; the Pi 4 has a stateful H.264 decoder.
    "v4l2": {"h264": ("v4l2slh264dec", "v4l2h264dec"), "h265": ("v4l2slh265dec", "v4l2h265dec")},
    "vaapi": {"h264": ("vah264dec", "vaapih264dec"), "h265": ("vah265dec", "vaapih265dec")},
}

#: What each path needs on the device, for ``doctor`` and the docs.
NEEDS: dict[str, str] = {
    "software": "gstreamer1.0-libav (avdec_h264, avdec_h265); CPU time per frame, see docs/measurements",
    "nvv4l2": "JetPack's GStreamer plugins (nvidia-l4t-gstreamer: nvv4l2decoder, nvvidconv) and a user "
    "in the video group; the NVDEC engine, not the CPU, decodes",
    "v4l2": "gstreamer1.0-plugins-good (v4l2h264dec, stateful: Pi 4 H.264) and gstreamer1.0-plugins-bad "
    "(v4l2slh265dec, stateless: Pi 5 HEVC; Pi 5 has no H.264 decoder block, so H.264 falls back to "
    "software), /dev/video1x and the video group",
    "vaapi": "gstreamer1.0-plugins-bad's va plugin (vah264dec, GStreamer >= 1.22) or gstreamer1.0-vaapi, "
    "intel-media-va-driver (iHD), /dev/dri/renderD128 and the render group",
}

#: What goes between the decoder and ``videoconvert``: nvv4l2decoder hands over NVMM memory,
#: which only nvvidconv copies out of (to BGRx; videoconvert makes it BGR).
CONVERT: dict[str, str] = {"nvv4l2": "nvvidconv ! video/x-raw,format=BGRx"}

GSTREAMER_HINT = (
    'pip install "edgekit[gstreamer]" (PyGObject) with the system\'s GStreamer: '
    "apt install gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-libav "
    "gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 (to build PyGObject: libgirepository1.0-dev "
    "libcairo2-dev pkg-config)"
)


@dataclass(frozen=True)
class GstStatus:
    """Whether PyGObject and GStreamer can be used here; ``reason`` and ``hint`` when not."""

    ok: bool
    version: str | None = None
    reason: str = ""
    hint: str = ""


_lock = threading.Lock()
_state: dict[str, Any] = {}


def gstreamer() -> Any:
    """The initialised ``Gst`` module, or ``None`` when PyGObject or GStreamer is missing (see ``gst_status``)."""
    with _lock:
        if "status" not in _state:
            _state["gst"], _state["status"] = _import_gst()
        return _state["gst"]


def gst_status() -> GstStatus:
    """Whether ``gstreamer()`` works here, and why not."""
    gstreamer()
    status: GstStatus = _state["status"]
    return status


def _import_gst() -> tuple[Any, GstStatus]:
    try:
        import gi
    except ImportError as err:
        return None, GstStatus(False, None, f"PyGObject is not installed ({err})", GSTREAMER_HINT)
    try:
        gi.require_version("Gst", "1.0")
        gi.require_version("GstApp", "1.0")  # appsink's pull methods
        gi.require_version("GstVideo", "1.0")  # the frames' strides (video meta, caps)
        from gi.repository import Gst, GstApp, GstVideo  # noqa: F401
    except (ImportError, ValueError) as err:  # ValueError: no Gst typelib of that version
        return None, GstStatus(
            False, None, f"GStreamer's introspection data is missing ({err})", GSTREAMER_HINT
        )
    Gst.init(None)
    return Gst, GstStatus(True, Gst.version_string())


@dataclass(frozen=True)
class DecoderChoice:
    """How one codec is decoded here: the path asked for, the path taken, its element and why."""

    codec: str
    wanted: str  # the profile's path
    path: str  # the path taken (software when the hardware one is missing)
    element: str | None  # the decoder element, None when not even software decode is installed
    note: str = ""  # why the path taken is not the one asked for

    @property
    def convert(self) -> str:
        """The elements between the decoder and videoconvert ('' for most paths)."""
        return CONVERT.get(self.path, "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "codec": self.codec,
            "wanted": self.wanted,
            "path": self.path,
            "element": self.element,
            "note": self.note,
        }


def _find(gst: Any, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if gst.ElementFactory.find(n) is not None), None)


def plan_decoders(path: str) -> dict[str, DecoderChoice]:
    """For each codec, the decoder this host uses for ``path`` (a profile's ``decoder``)."""
    if path not in DECODER_PATHS:
        raise ValueError(f"unknown decoder path {path!r}; known: {', '.join(DECODER_PATHS)}")
    gst = gstreamer()
    plan: dict[str, DecoderChoice] = {}
    for codec in CODECS:
        if gst is None:
            plan[codec] = DecoderChoice(codec, path, path, None, gst_status().reason)
            continue
        element = _find(gst, _ELEMENTS[path][codec])
        if element is not None:
            plan[codec] = DecoderChoice(codec, path, path, element)
            continue
        soft = _find(gst, _ELEMENTS["software"][codec])
        note = (
            ""
            if path == "software"
            else f"no {' or '.join(_ELEMENTS[path][codec])} here: decoding in software"
        )
        if soft is None:
            note = f"no {codec} decoder: install gstreamer1.0-libav"
        plan[codec] = DecoderChoice(codec, path, "software", soft, note)
    return plan


def prefer_decoders(plan: dict[str, DecoderChoice]) -> None:
    """Make decodebin pick the planned decoders: raise their rank above every other decoder's.

    decodebin chooses among the decoders that fit the stream by rank; hardware decoders
    ship at ranks that differ between GStreamer releases (the va plugin's were NONE before
    1.24), so the plan's choice is made explicit.  Ranks are per process, like the profile.
    """
    gst = gstreamer()
    if gst is None:
        return
    for choice in plan.values():
        if choice.element is not None:
            factory = gst.ElementFactory.find(choice.element)
            if factory is not None:
                factory.set_rank(int(gst.Rank.PRIMARY) + 100)


def decode_report(path: str) -> dict[str, Any]:
    """What ``edgekit doctor`` says about video decode for a profile's ``decoder`` path, as plain data."""
    status = gst_status()
    plan = plan_decoders(path)
    if status.ok:
        rtsp = "GStreamer (" + ", ".join(f"{c}: {d.element or 'none'}" for c, d in plan.items()) + ")"
    else:
        rtsp = "OpenCV's FFmpeg (software; no GStreamer here)"
    return {
        "gstreamer": {
            "available": status.ok,
            "version": status.version,
            "reason": status.reason,
            "hint": status.hint,
        },
        "profile_decoder": path,
        "codecs": {codec: choice.to_dict() for codec, choice in plan.items()},
        # Which path each kind of source takes (files, HTTP and V4L2 cameras stay on OpenCV).
        "sources": {"rtsp": rtsp, "file, http, camera": "OpenCV (FFmpeg, V4L2)"},
        "needs": dict(NEEDS),
    }
