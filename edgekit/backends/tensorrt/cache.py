"""Where a built TensorRT engine is cached, and how it is written there.

An engine only runs on the TensorRT version and the GPU it was built for, and its numerics
depend on the precision flags and DLA core, so the cache file is keyed by all of them:
``<sha256(onnx)[:16]>-trt<version>-<gpu>-<flags>.engine``.

Deserializing an engine runs what it holds, so each one is checked before it is loaded:
when an engine is written, the SHA-256 of its bytes is written beside it
(``<engine>.sha256``, atomically, after the engine); ``_read_cached`` returns the bytes only
when they match, and otherwise (a torn write, a disk error, a changed file, no sidecar)
logs why, removes both files and returns None, so the engine is built again.  This catches
damage, not an attacker who can write the cache folder: keep that folder private to the
device's user (it is created 0700 under the cache root).
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from edgekit.backends.tensorrt.options import _Settings
from edgekit.core.io import write_atomic

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


def _sidecar(path: Path) -> Path:
    """Where the SHA-256 of the engine at ``path`` is kept: ``<engine>.sha256``."""
    return path.with_name(path.name + ".sha256")


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a crash never leaves a half-written engine under the final name,
    then its SHA-256 beside it (``_sidecar``): an engine without a matching one is never loaded."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        log.warning("tensorrt: not caching the engine: cannot write to %s (%s)", path.parent, err)
        return
    try:
        _sidecar(path).unlink(missing_ok=True)  # the old hash must not vouch for the new bytes
        write_atomic(path, data, mode=0o600)  # private, as the mkstemp it used to be
        digest = hashlib.sha256(data).hexdigest()
        write_atomic(_sidecar(path), f"{digest}  {path.name}\n".encode(), mode=0o600)
    except OSError as err:
        log.warning("tensorrt: not caching the engine at %s (%s)", path, err)


def _read_cached(path: Path) -> bytes | None:
    """The engine at ``path`` if its SHA-256 matches its sidecar; else None (both removed, logged)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("tensorrt: cannot read the cached engine %s (%s); rebuilding", path, err)
        return None
    try:
        recorded = _sidecar(path).read_text().split()[0].lower()
    except (OSError, UnicodeDecodeError, IndexError):
        recorded = None
    actual = hashlib.sha256(data).hexdigest()
    if recorded == actual:
        return data
    why = (
        "has no recorded SHA-256" if recorded is None else f"has SHA-256 {actual[:12]}…, not {recorded[:12]}…"
    )
    log.warning("tensorrt: the cached engine %s %s; not loading it, rebuilding", path, why)
    for stale in (path, _sidecar(path)):
        stale.unlink(missing_ok=True)
    return None
