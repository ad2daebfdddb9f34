"""GStreamer buffers to BGR frames with one copy: the colour conversion writes the frame.

The appsink takes what the decoder gives where it can (I420 from libavcodec, NV12 from the
V4L2 and VA-API decoders, BGRx from Jetson's nvvidconv; videoconvert only when it must), and
the buffer is mapped in place and wrapped by numpy where it lies, planes at the offsets and
strides of its video meta or caps.  OpenCV's conversion (``cvtColor``: 0.05 ms for a 640x480
I420 frame here, where videoconvert to BGR took 1.4 ms) then writes the BGR frame handed over.
That is the one copy; only an I420 frame whose planes are padded (a width not a multiple of
8) is first gathered into one block, as OpenCV's I420 conversion wants.

PyGObject's ``Gst.Buffer.map()`` copies the data into ``bytes``; the buffer is mapped through
``gst_buffer_map`` with ctypes instead, checked once on a known buffer (else the bytes copy is
used, logged).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from edgekit.device.video_decode import gstreamer

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

#: What the appsink accepts, best first (the decoder's own format where it is one of these).
FORMATS = ("I420", "NV12", "BGRx", "BGR")
APPSINK_CAPS = "video/x-raw,format={" + ",".join(FORMATS) + "}"


@dataclass(frozen=True)
class Layout:
    """Where a frame's planes lie in its buffer."""

    format: str
    width: int
    height: int
    offsets: tuple[int, ...]
    strides: tuple[int, ...]


def layout(buffer: Any, caps: Any) -> Layout:
    """The buffer's layout: its video meta (a decoder's padded planes) or else what its caps imply."""
    from gi.repository import GstVideo  # loaded with Gst by gstreamer()

    meta = GstVideo.buffer_get_video_meta(buffer)
    if meta is None:
        return _caps_layout(caps.to_string())
    planes = meta.n_planes
    return Layout(
        format=GstVideo.VideoFormat.to_string(meta.format),
        width=meta.width,
        height=meta.height,
        offsets=tuple(int(meta.offset[i]) for i in range(planes)),
        strides=tuple(int(meta.stride[i]) for i in range(planes)),
    )


@lru_cache(maxsize=16)
def _caps_layout(caps: str) -> Layout:
    # Read once per caps (they change only with the stream's size or format), not once a frame.
    from gi.repository import Gst, GstVideo

    info = GstVideo.VideoInfo.new_from_caps(Gst.Caps.from_string(caps))
    planes = info.finfo.n_planes
    return Layout(
        format=info.finfo.name,
        width=info.width,
        height=info.height,
        offsets=tuple(int(info.offset[i]) for i in range(planes)),
        strides=tuple(int(info.stride[i]) for i in range(planes)),
    )


def to_bgr(data: np.ndarray, lay: Layout) -> np.ndarray:
    """The BGR frame of the mapped bytes ``data`` (not copied before the conversion writes the frame)."""
    import cv2
    import numpy as np

    w, h, o, s = lay.width, lay.height, lay.offsets, lay.strides

    def plane(i: int, rows: int, cols: int, channels: int) -> np.ndarray:
        shape = (rows, cols, channels) if channels > 1 else (rows, cols)
        strides = (s[i], channels, 1) if channels > 1 else (s[i], 1)
        view: np.ndarray = np.lib.stride_tricks.as_strided(data[o[i] :], shape, strides, writeable=False)
        return view

    if lay.format == "BGR":
        frame = np.empty((h, w, 3), np.uint8)
        frame[...] = plane(0, h, w, 3)
        return frame
    if lay.format == "BGRx":
        bgr: np.ndarray = cv2.cvtColor(plane(0, h, w, 4), cv2.COLOR_BGRA2BGR)
        return bgr
    ch, cw = (h + 1) // 2, (w + 1) // 2
    if lay.format == "NV12":
        bgr = cv2.cvtColorTwoPlane(plane(0, h, w, 1), plane(1, ch, cw, 2), cv2.COLOR_YUV2BGR_NV12)
        return bgr
    if lay.format != "I420":
        raise ValueError(f"cannot convert {lay.format} frames (the appsink asks for {', '.join(FORMATS)})")
    packed = w % 2 == 0 and h % 2 == 0 and s == (w, w // 2, w // 2)
    if packed and o == (0, w * h, w * h + ch * cw):
        block = data[: w * h * 3 // 2].reshape(h * 3 // 2, w)
    else:  # padded planes, or an odd size: gather them into the one block OpenCV reads
        even_w, even_h = w + w % 2, h + h % 2
        block = np.empty((even_h * 3 // 2, even_w), np.uint8)
        block[:h, :w] = plane(0, h, w, 1)
        chroma = block[even_h:].reshape(2, -1)
        chroma[0, : ch * cw] = plane(1, ch, cw, 1).reshape(-1)
        chroma[1, : ch * cw] = plane(2, ch, cw, 1).reshape(-1)
        bgr = cv2.cvtColor(block, cv2.COLOR_YUV2BGR_I420)
        return np.ascontiguousarray(bgr[:h, :w]) if (w % 2 or h % 2) else bgr
    bgr = cv2.cvtColor(block, cv2.COLOR_YUV2BGR_I420)
    return bgr


class _MapInfo(ctypes.Structure):
    # GstMapInfo (gst/gstmemory.h, stable ABI since 1.0).
    _fields_ = (
        ("memory", ctypes.c_void_p),
        ("flags", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
        ("maxsize", ctypes.c_size_t),
        ("user_data", ctypes.c_void_p * 4),
        ("_gst_reserved", ctypes.c_void_p * 4),
    )


_GST_MAP_READ = 1


class _Memory:
    """Mapped bytes as numpy sees them, without a copy (faster than a ctypes array's buffer)."""

    def __init__(self, address: int, size: int) -> None:
        self.__array_interface__ = {"data": (address, True), "shape": (size,), "typestr": "|u1", "version": 3}


@cache
def _libgst() -> Any:
    name = ctypes.util.find_library("gstreamer-1.0") or "libgstreamer-1.0.so.0"
    lib = ctypes.CDLL(name)
    lib.gst_buffer_map.argtypes = (ctypes.c_void_p, ctypes.POINTER(_MapInfo), ctypes.c_int)
    lib.gst_buffer_map.restype = ctypes.c_int
    lib.gst_buffer_unmap.argtypes = (ctypes.c_void_p, ctypes.POINTER(_MapInfo))
    lib.gst_buffer_unmap.restype = None
    return lib


def _convert_mapped(buffer: Any, lay: Layout) -> np.ndarray | None:
    """Map the buffer in place, convert (the one copy), unmap."""
    import numpy as np

    lib = _libgst()
    info = _MapInfo()
    pointer = hash(buffer)  # PyGObject hashes a boxed value by its C pointer: the GstBuffer*
    if not lib.gst_buffer_map(pointer, ctypes.byref(info), _GST_MAP_READ):
        return None
    try:
        if not info.data:
            return None
        return to_bgr(np.asarray(_Memory(info.data, info.size)), lay)
    finally:
        lib.gst_buffer_unmap(pointer, ctypes.byref(info))


def _convert_bytes(buffer: Any, lay: Layout) -> np.ndarray | None:
    """The fallback: PyGObject's ``map()`` copies into bytes, then the conversion copies again."""
    import numpy as np

    ok, info = buffer.map(gstreamer().MapFlags.READ)
    if not ok:
        return None
    try:
        return to_bgr(np.frombuffer(info.data, np.uint8), lay)
    finally:
        buffer.unmap(info)


@cache
def frame_converter() -> Any:
    """``convert(buffer, layout)``: in place when mapping a known buffer reads it right, else through bytes."""
    gst = gstreamer()
    probe = bytes(range(48))
    buffer = gst.Buffer.new_wrapped(probe)
    try:
        got = _convert_mapped(buffer, Layout("BGR", 4, 2, (0,), (24,)))
        if got is not None and got.tobytes() == probe[:12] + probe[24:36]:  # 4-pixel rows 24 bytes apart
            return _convert_mapped
    except (OSError, AttributeError, ValueError) as err:
        log.debug("mapping buffers in place failed: %s", err)
    log.warning("GStreamer buffers cannot be mapped in place here: each frame is copied twice")
    return _convert_bytes
