"""Where a built TensorRT engine is cached, and how it is written there.

An engine only runs on the TensorRT version and the GPU it was built for, and its numerics
depend on the precision flags and DLA core, so the cache file is keyed by all of them:
``<sha256(onnx)[:16]>-trt<version>-<gpu>-<flags>.engine``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from edgekit._core.io import write_atomic
from edgekit.backends.tensorrt.options import _Settings

log = logging.getLogger(__name__)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def _cache_path(s: _Settings, onnx: bytes, trt_version: str, gpu: str) -> Path:
    flags = []
    if s.fp16:
        flags.append("fp16")
    if s.int8 and s.calibration_cache is not None:
        # The calibration scales are baked into the engine: another cache means another engine.
        flags.append("int8c" + hashlib.sha256(s.calibration_cache.read_bytes()).hexdigest()[:8])
    if s.dla_core is not None:
        flags.append(f"dla{s.dla_core}")
    digest = hashlib.sha256(onnx).hexdigest()[:16]
    return s.cache_dir / f"{digest}-trt{trt_version}-{_slug(gpu)}-{'-'.join(flags) or 'fp32'}.engine"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash never leaves a half-written engine under the final name."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("tensorrt: not caching the engine: cannot write to %s (%s)", path.parent, err)
        return
    try:
        write_atomic(path, data, mode=0o600)  # private, as the mkstemp it used to be
    except OSError as err:
        log.warning("tensorrt: not caching the engine at %s (%s)", path, err)
