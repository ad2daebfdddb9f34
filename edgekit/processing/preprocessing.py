"""How an image becomes a model input: the model's preprocessing, as data, and one vectorized function.

The spec travels in the model card and in the bundle's manifest, so the build host (for
calibration and evaluation) and the device (for every frame) prepare pixels identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from edgekit.backends.base import TensorSpec
from edgekit.bundle.manifest import LETTERBOX_FILL
from edgekit.errors import EdgekitError, InputError, SourceError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.bundle.manifest import Manifest
    from edgekit.processing.area_resize import AreaResizer

RESIZE_MODES = ("squash", "center-crop", "letterbox")
# How a shrinking resize filters.  "area": OpenCV's INTER_AREA (the exact area average; 1.6 ms
# for 480x480 -> 224x224 here).  "box2-linear": halve with an exact 2x2 box (OpenCV's integer
# fast path) while the image is at least twice the target, then bilinear (0.25 ms).  A bundle
# records which one it was calibrated and gated with; a device never swaps one for the other.
# "linear": OpenCV's INTER_LINEAR for every resize, shrinking too, as Ultralytics' LetterBox
# (cv2.resize, then the bars): the pixels a YOLO model was trained and validated on.
INTERPOLATIONS = ("area", "box2-linear", "linear")
LAYOUTS = ("NCHW", "NHWC")
COLORS = ("RGB", "BGR")


@dataclass(frozen=True)
class PreprocessSpec:
    """Resize to ``size`` (H, W) by ``resize``, order channels as ``color``, ``(x - mean) / std``, lay out as ``layout``.

    ``interpolation`` says how a shrinking resize filters (see ``INTERPOLATIONS``).
    """

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    layout: str = "NCHW"
    color: str = "RGB"
    resize: str = "center-crop"
    interpolation: str = "area"
    #: The pixel value (0-255, every channel) a letterbox pads with: YOLO's grey 114 by default;
    #: MediaPipe pads with black (0), which its face detectors were trained on.
    letterbox_fill: int = LETTERBOX_FILL

    def __post_init__(self) -> None:
        problems = []
        if self.layout not in LAYOUTS:
            problems.append(f"layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.color not in COLORS:
            problems.append(f"color {self.color!r} is not one of {', '.join(COLORS)}")
        if self.resize not in RESIZE_MODES:
            problems.append(f"resize {self.resize!r} is not one of {', '.join(RESIZE_MODES)}")
        if self.interpolation not in INTERPOLATIONS:
            problems.append(f"interpolation {self.interpolation!r} is not one of {', '.join(INTERPOLATIONS)}")
        if not 0 <= self.letterbox_fill <= 255:
            problems.append(f"letterbox_fill {self.letterbox_fill} is not a pixel value 0-255")
        if len(self.size) != 2 or min(self.size) <= 0:
            problems.append(f"size {self.size} is not (height, width) > 0")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s == 0 for s in self.std):
            problems.append("mean and std need three values each, std non-zero")
        if problems:
            raise EdgekitError(
                "bad preprocessing: " + "; ".join(problems),
                "fix the model card or the --mean/--std/--layout flags",
            )

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        h, w = self.size
        return (1, 3, h, w) if self.layout == "NCHW" else (1, h, w, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": list(self.size),
            "mean": list(self.mean),
            "std": list(self.std),
            "layout": self.layout,
            "color": self.color,
            "resize": self.resize,
            # Written only when not the default, so that a bundle without it stays readable
            # by devices that predate the field.
            **({"interpolation": self.interpolation} if self.interpolation != "area" else {}),
            **({"letterbox_fill": self.letterbox_fill} if self.letterbox_fill != LETTERBOX_FILL else {}),
        }

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> PreprocessSpec:
        """What a bundle's manifest says about preprocessing."""
        return cls.from_dict(manifest.preprocess.model_dump())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreprocessSpec:
        def three(v: Sequence[float] | float) -> tuple[float, float, float]:
            vals = [float(v)] * 3 if isinstance(v, int | float) else [float(x) for x in v]
            return (vals[0], vals[1], vals[2]) if len(vals) == 3 else (float("nan"),) * 3

        size = data["size"]
        return cls(
            size=(int(size[0]), int(size[1])),
            mean=three(data["mean"]),
            std=three(data["std"]),
            layout=str(data.get("layout", "NCHW")),
            color=str(data.get("color", "RGB")),
            resize=str(data.get("resize", "center-crop")),
            interpolation=str(data.get("interpolation", "area")),
            letterbox_fill=int(data.get("letterbox_fill", LETTERBOX_FILL)),
        )


def as_bgr(image: np.ndarray) -> tuple[np.ndarray, bool]:
    """``image`` as BGR uint8 HxWx3, and whether it had to be converted."""
    import cv2
    import numpy as np

    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
        converted = True
    elif image.dtype != np.uint8:
        raise SourceError(
            f"frames must be 8- or 16-bit images, got dtype {image.dtype}",
            "convert the frame to uint8 (0-255) before passing it",
        )
    else:
        converted = False
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1):
        return cv2.cvtColor(image, cv2.COLOR_GRAY2BGR), True
    if image.ndim == 3 and image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2BGR), True
    if image.ndim != 3 or image.shape[2] != 3:
        raise SourceError(
            f"frames must be HxW (gray), HxWx3 (BGR) or HxWx4 (BGRA), got shape {tuple(image.shape)}",
            "pass one image at a time, channels last",
        )
    return image, converted


class Placement(NamedTuple):
    """Where a frame's pixels land in the model input: ``src`` (x, y, w, h) of the frame is resized onto ``dst`` of the input.

    center-crop: ``src`` is the centred crop, ``dst`` the whole input; letterbox: ``src`` is
    the whole frame, ``dst`` the region inside the grey bars; squash: both whole.  Coordinates
    are pixel edges, so a point maps as ``frame = src + (input - dst) * src_size / dst_size``.
    """

    src: tuple[int, int, int, int]
    dst: tuple[int, int, int, int]

    def scale_offset(self) -> tuple[float, float, float, float]:
        """``(scale_x, scale_y, offset_x, offset_y)`` with ``frame = input * scale + offset``."""
        (sx, sy, sw, sh), (dx, dy, dw, dh) = self.src, self.dst
        scale_x, scale_y = sw / dw, sh / dh
        return scale_x, scale_y, sx - dx * scale_x, sy - dy * scale_y


def placement(spec: PreprocessSpec, frame_h: int, frame_w: int) -> Placement:
    """How ``fit`` places a ``frame_h`` x ``frame_w`` frame in the model input (the one place this is decided)."""
    th, tw = spec.size
    if spec.resize == "center-crop":
        # The largest centred region with the target's aspect ratio, resized to the whole input.
        scale = min(frame_h / th, frame_w / tw)
        ch, cw = round(th * scale), round(tw * scale)
        return Placement(((frame_w - cw) // 2, (frame_h - ch) // 2, cw, ch), (0, 0, tw, th))
    if spec.resize == "letterbox":
        # The whole frame, resized to fit, centred between bars: Ultralytics' LetterBox places it
        # alike (its left = round((tw - nw) / 2 - 0.1) is this floor; right and bottom take the rest).
        scale = min(th / frame_h, tw / frame_w)
        nh, nw = max(1, round(frame_h * scale)), max(1, round(frame_w * scale))
        return Placement((0, 0, frame_w, frame_h), ((tw - nw) // 2, (th - nh) // 2, nw, nh))
    return Placement((0, 0, frame_w, frame_h), (0, 0, tw, th))


def to_frame(points: np.ndarray, spec: PreprocessSpec, frame_hw: tuple[int, int]) -> np.ndarray:
    """Model-input pixel coordinates back to the frame's: ``points``' last axis alternates x, y.

    Boxes ``(N, 4)`` as x0, y0, x1, y1 and keypoints ``(N, K, 2)`` both map; not clipped.
    """
    import numpy as np

    scale_x, scale_y, offset_x, offset_y = placement(spec, *frame_hw).scale_offset()
    out = np.array(points, dtype=np.float64)
    out[..., 0::2] = out[..., 0::2] * scale_x + offset_x
    out[..., 1::2] = out[..., 1::2] * scale_y + offset_y
    return out


def fit(image: np.ndarray, spec: PreprocessSpec, out: np.ndarray | None = None) -> np.ndarray:
    """Resize an HxWxC uint8 image to ``spec.size`` by ``spec.resize`` (crop is a view; one resize).

    ``out`` (``spec.size`` x C uint8), when given, receives the resized image whenever a
    resize is needed (the frame loop reuses one); the result may still be ``image`` itself
    (or a view of it) when it already has the size.
    """
    import cv2
    import numpy as np

    th, tw = spec.size
    if spec.resize != "squash":
        (left, top, cw, ch), (x, y, nw, nh) = placement(spec, image.shape[0], image.shape[1])
        if spec.resize == "center-crop":
            image = image[top : top + ch, left : left + cw]
        else:
            canvas = np.full((th, tw, 3), spec.letterbox_fill, dtype=np.uint8)
            canvas[y : y + nh, x : x + nw] = _shrink(image, (nh, nw), spec.interpolation)
            image = canvas
    if image.shape[:2] != (th, tw):
        # INTER_AREA when shrinking: what the build calibrated and gated on.  It is most of a
        # frame's preprocessing (1.6 ms for 480x480 -> 224x224 here, one core: ~20% of an
        # EfficientNet-Lite0 run, which is what keeps the pipeline's efficiency near 0.8).
        # Measured and not taken: box-by-2 then bilinear (0.25 ms) moved enough pixels to
        # flip an int8 artifact's gate; INTER_AREA in exact row bands on two cores was 1.6x
        # faster alone but slower inside the frame loop (thread wake-ups on cold caches); the
        # same area weights as a bit-exact ONNX Runtime graph (15/7 periodic MatMuls) took
        # 1.2 ms, no real gain.
        shrinking = image.shape[0] > th or image.shape[1] > tw
        method = cv2.INTER_AREA if shrinking and spec.interpolation != "linear" else cv2.INTER_LINEAR
        if shrinking and spec.interpolation == "box2-linear":
            image = _halve_while_twice(image, (th, tw))
            method = cv2.INTER_LINEAR
        if out is not None and out.shape == (th, tw, *image.shape[2:]) and out.dtype == image.dtype:
            cv2.resize(image, (tw, th), dst=out, interpolation=method)
            return out
        image = cv2.resize(image, (tw, th), interpolation=method)
    return image


def _halve_while_twice(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Exact 2x2 box averages while the image is at least twice ``size`` (an odd last row/column is dropped)."""
    import cv2

    th, tw = size
    while image.shape[0] >= 2 * th and image.shape[1] >= 2 * tw:
        h, w = image.shape[0] // 2 * 2, image.shape[1] // 2 * 2
        # Even sizes keep OpenCV on its integer INTER_AREA path (a 2x2 mean, rounded).
        image = cv2.resize(image[:h, :w], (w // 2, h // 2), interpolation=cv2.INTER_AREA)
    return image


def _shrink(image: np.ndarray, size: tuple[int, int], interpolation: str) -> np.ndarray:
    import cv2

    if interpolation == "box2-linear":
        return cv2.resize(_halve_while_twice(image, size), size[::-1], interpolation=cv2.INTER_LINEAR)
    if interpolation == "linear":
        # Ultralytics resizes only when the size changes; cv2 copies an unchanged size bit for bit anyway.
        return cv2.resize(image, size[::-1], interpolation=cv2.INTER_LINEAR)
    return cv2.resize(image, size[::-1], interpolation=cv2.INTER_AREA)


def preprocess(image: np.ndarray, spec: PreprocessSpec, image_color: str = "RGB") -> np.ndarray:
    """One HxWx3 uint8 image (``image_color`` order) -> a float32 NCHW/NHWC batch of one, per ``spec``.

    The reference implementation (build-time calibration and evaluation); the frame loop
    uses ``Preprocessor``, which gives the same numbers straight in the session's dtype.
    """
    import numpy as np

    image = fit(image, spec)
    if image_color != spec.color:
        image = image[..., ::-1]
    x = (image.astype(np.float32) - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    x = x.transpose(2, 0, 1) if spec.layout == "NCHW" else x
    return np.ascontiguousarray(x[None])


class Preprocessor:
    """``spec`` compiled for one session input: frame in, the exact tensor the session takes, out.

    Normalisation and quantisation are folded into one 256-entry lookup table per channel
    (``cv2.LUT``: one pass over the resized pixels, whatever the output dtype).  For NCHW
    the resized image is split into its three planes and each plane's table writes straight
    into its channel of the input buffer, so the channel swap and the layout change cost
    nothing (0.11 ms a 224x224 frame here, against 0.24 ms for one interleaved LUT and a
    transposing copy).  Every buffer is allocated once and reused for every frame: the
    returned array is the input buffer, so use it before the next call.

    The resize itself, for ``interpolation="area"`` shrinks, is ``area_resize.AreaResizer``
    when numba is installed (``edgekit[fast]``): the same bytes as ``fit()``'s ``cv2.resize``
    (each resizer proves it against ``cv2.resize`` on this machine when it is built for a frame
    size, else ``fit()`` runs), 3.3x faster for 640x480 -> 224x224 center-crop here (0.23 ms
    against 0.77 ms, one core), which takes this whole call from 0.85 ms to 0.29 ms.
    """

    def __init__(self, spec: PreprocessSpec, input: TensorSpec, image_color: str = "BGR") -> None:
        import numpy as np

        self.spec = spec
        self.image_color = image_color
        self.layout = input.layout or spec.layout
        dtype = np.dtype(input.dtype)
        th, tw = spec.size
        shape = (1, 3, th, tw) if self.layout == "NCHW" else (1, th, tw, 3)
        if not input.accepts(shape):
            raise InputError(
                f"preprocessing makes {shape} ({self.layout}) but the model takes {input.describe()}",
                "the bundle's preprocess section does not match its artifact: rebuild the bundle",
            )
        # Source channel c feeds model channel perm[c]; the LUT of channel c uses that channel's mean/std.
        swap = image_color != spec.color
        model_channel = [2, 1, 0] if swap else [0, 1, 2]
        pixels = np.arange(256, dtype=np.float64)
        table = np.empty((256, 3), np.float64)
        for c in range(3):
            m = model_channel[c]
            table[:, c] = (pixels - spec.mean[m]) / spec.std[m]
        if input.quantization is not None:
            q = input.quantization
            info = np.iinfo(dtype)
            table = np.clip(np.rint(table / q.scale + q.zero_point), info.min, info.max)
        elif dtype.kind != "f":
            raise InputError(
                f"the model takes {dtype} input without quantization parameters",
                "rebuild the artifact with a float input or a quantized one (scale, zero point)",
            )
        lut = table.astype(dtype)
        self._swap = swap
        self._out = np.empty(shape, dtype)
        self._resized = np.empty((th, tw, 3), np.uint8)
        self._luts: list[np.ndarray]
        self._targets: list[np.ndarray]
        if self.layout == "NCHW":
            self._planes = [np.empty((th, tw), np.uint8) for _ in range(3)]
            self._luts = [np.ascontiguousarray(lut[:, c]).reshape(256, 1) for c in range(3)]
            # Source plane c lands in model channel model_channel[c]: contiguous views of the buffer.
            self._targets = [self._out[0, model_channel[c]] for c in range(3)]
        else:
            # Channels stay interleaved: swap them in the uint8 image, then one LUT in model order.
            self._swapped = np.empty((th, tw, 3), np.uint8)
            self._luts = [lut[:, model_channel].reshape(256, 1, 3) if swap else lut.reshape(256, 1, 3)]
            self._targets = [self._out[0]]
        # cv2 writes into ``dst`` only when it fits exactly, and otherwise returns a new array
        # without a word: check once that every target is written in place.
        import cv2

        probe = np.zeros(self._targets[0].shape, np.uint8)
        got = cv2.LUT(probe, self._luts[0], dst=self._targets[0])
        self._in_place = got.__array_interface__["data"][0] == self._targets[0].__array_interface__["data"][0]
        # The fast resize: compiled here (once a process, ~1 s), never on a frame; built per frame
        # size on the first frame of that size (tables and its check against cv2.resize, ~ms).
        self._area = spec.interpolation == "area" and _area_kernel_ready()
        self._area_hw: tuple[int, int] | None = None
        self._area_resizer: AreaResizer | None = None
        self._resizers: dict[tuple[int, int], AreaResizer | None] = {}
        self._area_src = (0, 0, 0, 0)
        self._area_dst = self._resized

    def __call__(self, image: np.ndarray) -> np.ndarray:
        import cv2
        import numpy as np

        v = self._fit(image)
        if self.layout == "NCHW":
            sources = cv2.split(v, self._planes)
        else:
            sources = (cv2.cvtColor(v, cv2.COLOR_BGR2RGB, dst=self._swapped) if self._swap else v,)
        for src, lut, target in zip(sources, self._luts, self._targets, strict=True):
            got = cv2.LUT(src, lut, dst=target)
            if not self._in_place:
                np.copyto(target, got)
        return self._out

    def _fit(self, image: np.ndarray) -> np.ndarray:
        """``fit(image, spec)``: by the fast resizer where there is one for this frame size, else by ``fit``."""
        import numpy as np

        if self._area and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3:
            hw = (int(image.shape[0]), int(image.shape[1]))
            if hw != self._area_hw:
                self._area_hw = hw
                self._area_resizer = self._build_area(hw)
            if self._area_resizer is not None:
                x, y, w, h = self._area_src
                self._area_resizer(image[y : y + h, x : x + w], self._area_dst)
                return self._resized
        return fit(image, self.spec, self._resized)

    def _build_area(self, frame_hw: tuple[int, int]) -> AreaResizer | None:
        """The resizer for frames of this size (where ``fit`` would run OpenCV's generic area path), or None."""
        from edgekit.processing import area_resize

        (sx, sy, sw, sh), (dx, dy, dw, dh) = placement(self.spec, *frame_hw)
        # Upscales, same sizes and integer ratios are not the generic area path: fit() stays.
        if not area_resize.opencv_takes_generic_area((sh, sw), (dh, dw)):
            return None
        # Kept per size: a pipeline of many cameras alternates between their frame sizes, and a
        # resizer proves itself against cv2 when built (milliseconds).  Not shared between
        # Preprocessors: it holds scratch buffers, and another pipeline may run on another thread.
        if (sh, sw) not in self._resizers:
            self._resizers[(sh, sw)] = area_resize.area_resizer((sh, sw), (dh, dw))
        resizer = self._resizers[(sh, sw)]
        if resizer is None:
            return None
        if self.spec.resize == "letterbox":
            # fit() pads a fresh canvas; here the bars are painted once and only the inside is rewritten.
            self._resized.fill(self.spec.letterbox_fill)
        self._area_src = (sx, sy, sw, sh)
        self._area_dst = self._resized[dy : dy + dh, dx : dx + dw]
        return resizer


def _area_kernel_ready() -> bool:
    """Whether the fast INTER_AREA kernel compiles here (numba installed); why not is logged once."""
    from edgekit.processing import area_resize

    reason = area_resize.available()
    if reason is not None:
        area_resize.log_once(reason)
    return reason is None
