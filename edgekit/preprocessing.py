"""How an image becomes a model input: the model's preprocessing, as data, and one vectorized function.

The spec travels in the model card and in the bundle's manifest, so the build host (for
calibration and evaluation) and the device (for every frame) prepare pixels identically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    import numpy as np

RESIZE_MODES = ("squash", "center-crop", "letterbox")
LAYOUTS = ("NCHW", "NHWC")
COLORS = ("RGB", "BGR")


@dataclass(frozen=True)
class PreprocessSpec:
    """Resize to ``size`` (H, W) by ``resize``, order channels as ``color``, ``(x - mean) / std``, lay out as ``layout``."""

    size: tuple[int, int]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    layout: str = "NCHW"
    color: str = "RGB"
    resize: str = "center-crop"

    def __post_init__(self) -> None:
        problems = []
        if self.layout not in LAYOUTS:
            problems.append(f"layout {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.color not in COLORS:
            problems.append(f"color {self.color!r} is not one of {', '.join(COLORS)}")
        if self.resize not in RESIZE_MODES:
            problems.append(f"resize {self.resize!r} is not one of {', '.join(RESIZE_MODES)}")
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
        }

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
        )


def preprocess(image: np.ndarray, spec: PreprocessSpec, image_color: str = "RGB") -> np.ndarray:
    """One HxWx3 uint8 image (``image_color`` order) -> a float32 batch of one, per ``spec``."""
    import cv2
    import numpy as np

    h, w = image.shape[:2]
    th, tw = spec.size
    if spec.resize == "center-crop":
        # Crop the largest centred region with the target's aspect ratio, then resize.
        scale = min(h / th, w / tw)
        ch, cw = round(th * scale), round(tw * scale)
        top, left = (h - ch) // 2, (w - cw) // 2
        image = image[top : top + ch, left : left + cw]
    elif spec.resize == "letterbox":
        scale = min(th / h, tw / w)
        nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
        canvas = np.full((th, tw, 3), 114, dtype=np.uint8)  # the grey YOLO-style letterbox fill
        top, left = (th - nh) // 2, (tw - nw) // 2
        canvas[top : top + nh, left : left + nw] = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_AREA)
        image = canvas
    if image.shape[:2] != (th, tw):
        shrinking = image.shape[0] > th or image.shape[1] > tw
        image = cv2.resize(image, (tw, th), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
    if image_color != spec.color:
        image = image[..., ::-1]
    x = (image.astype(np.float32) - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    x = x.transpose(2, 0, 1) if spec.layout == "NCHW" else x
    return np.ascontiguousarray(x[None])
