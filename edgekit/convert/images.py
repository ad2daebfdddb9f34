"""Images for calibration and evaluation: a user's directory, or the built-in smoke set.

The smoke set is made from the photographs that ship inside scikit-image, plus
deterministic crops and flips of them.  It exercises the numerics of a quantized model;
it is not an accuracy benchmark, and the build says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.errors import BuildError
from edgekit.processing.preprocessing import PreprocessSpec, preprocess

if TYPE_CHECKING:
    import numpy as np

SMOKE_SOURCES = (
    "chelsea",
    "coffee",
    "astronaut",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "camera",
    "coins",
    "moon",
    "brick",
    "grass",
)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


@dataclass(frozen=True)
class ImageSet:
    """RGB uint8 images with names; ``smoke`` is True for the built-in set."""

    names: tuple[str, ...]
    images: tuple[np.ndarray, ...]
    smoke: bool

    def batch(self, spec: PreprocessSpec) -> np.ndarray:
        """All images preprocessed into one float32 batch (N, ...)."""
        import numpy as np

        return np.concatenate([preprocess(img, spec) for img in self.images])


def smoke_set() -> ImageSet:
    """scikit-image's photographs plus a crop and a mirror of each (deterministic)."""
    try:
        import skimage.data as data
    except ImportError as err:
        raise BuildError(
            "scikit-image is not installed, and no --calibration/--eval directory was given",
            'pip install "edgekit[build]", or pass image directories',
        ) from err
    import numpy as np

    names: list[str] = []
    images: list[np.ndarray] = []
    for name in SMOKE_SOURCES:
        img = np.asarray(getattr(data, name)())
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=2)
        img = np.ascontiguousarray(img[..., :3]).astype(np.uint8)
        h, w = img.shape[:2]
        names += [name, f"{name}-crop", f"{name}-mirror"]
        images += [
            img,
            np.ascontiguousarray(img[h // 8 : h - h // 8, w // 8 : w - w // 8]),
            np.ascontiguousarray(img[:, ::-1]),
        ]
    return ImageSet(tuple(names), tuple(images), smoke=True)


def load_dir(directory: Path, limit: int | None = None) -> ImageSet:
    """Every image file in ``directory`` (sorted by name), decoded to RGB."""
    import cv2

    if not directory.is_dir():
        raise BuildError(f"image directory {directory} does not exist", "pass a directory of .jpg/.png files")
    files: Sequence[Path] = sorted(p for p in directory.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[
        :limit
    ]
    if not files:
        raise BuildError(
            f"{directory} holds no images ({', '.join(IMAGE_SUFFIXES)})",
            "add images, or leave the flag out to use the smoke set",
        )
    images = []
    for f in files:
        bgr = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if bgr is None:
            raise BuildError(f"{f} cannot be decoded as an image", "remove it or replace it")
        images.append(bgr[..., ::-1].copy())
    return ImageSet(tuple(f.name for f in files), tuple(images), smoke=False)
