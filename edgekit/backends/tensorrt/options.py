"""The TensorRT backend's options: their names, the install hints, and the validated settings.

Options may come from YAML, a CLI flag or Python; :func:`_settings` checks them once and
fills in the defaults (among them where built engines are cached), so the rest of the
backend reads a typed :class:`_Settings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.backends.base import Options, known_options
from edgekit.core.paths import cache_root
from edgekit.errors import BackendError

NAME = "tensorrt"
OPTIONS = frozenset(
    {"fp16", "int8", "int8_calibration_cache", "workspace_mb", "cache_dir", "device_id", "dla_core"}
)
INSTALL_HINT = (
    "TensorRT comes with JetPack on a Jetson; elsewhere pip install tensorrt cuda-python (NVIDIA GPU)"
)
CUDA_HINT = "pip install cuda-python (its major version must match the CUDA the driver supports)"
ENGINE_SUFFIXES = (".engine", ".plan")


@dataclass(frozen=True)
class _Settings:
    """The backend's options, validated and with their defaults filled in."""

    fp16: bool
    int8: bool
    calibration_cache: Path | None
    workspace_mb: int
    cache_dir: Path
    device_id: int
    dla_core: int | None


def _as_bool(key: str, value: Any) -> bool:
    # Options may come from YAML, a CLI flag or Python; accept the usual spellings, refuse the rest.
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    }:
        return value.strip().lower() in {"1", "true", "yes", "on"}
    raise BackendError(f"{NAME}: option {key}={value!r} is not a boolean", f"pass {key}=true or {key}=false")


def _as_int(key: str, value: Any, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = minimum - 1
    if isinstance(value, bool) or number < minimum:
        raise BackendError(
            f"{NAME}: option {key}={value!r} is not an integer >= {minimum}", f"pass {key}=<integer>"
        )
    return number


def default_cache_dir() -> Path:
    """Where built engines are cached: ``$EDGEKIT_CACHE/tensorrt``, else ``~/.cache/edgekit/tensorrt``."""
    return cache_root() / "tensorrt"


def _settings(options: Options | None) -> _Settings:
    opts = known_options(NAME, options, OPTIONS)
    int8 = _as_bool("int8", opts.get("int8", False))
    calibration: Path | None = None
    if opts.get("int8_calibration_cache") is not None:
        calibration = Path(opts["int8_calibration_cache"]).expanduser()
    if int8 and calibration is None:
        # TensorRT calibrates from sample data; edgekit does that offline, at build time.
        raise BackendError(
            f"{NAME}: int8=true needs a calibration cache produced by edgekit build",
            "run edgekit build with int8 calibration data, then pass int8_calibration_cache=<path to the .cache file>",
        )
    if int8 and calibration is not None and not calibration.is_file():
        raise BackendError(
            f"{NAME}: int8 calibration cache {calibration} does not exist",
            "produce it with edgekit build (int8 calibration), or fix the path",
        )
    dla = opts.get("dla_core")
    return _Settings(
        fp16=_as_bool("fp16", opts.get("fp16", False)),
        int8=int8,
        calibration_cache=calibration if int8 else None,
        workspace_mb=_as_int("workspace_mb", opts.get("workspace_mb", 1024), 1),
        cache_dir=Path(opts["cache_dir"]).expanduser() if opts.get("cache_dir") else default_cache_dir(),
        device_id=_as_int("device_id", opts.get("device_id", 0), 0),
        dla_core=None if dla is None else _as_int("dla_core", dla, 0),
    )
