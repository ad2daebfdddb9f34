"""Where edgekit keeps things on a machine: the one definition of the cache root."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$EDGEKIT_CACHE`` or ``~/.cache/edgekit`` (builds, tuning databases, engines, telemetry spools, demo clips)."""
    root = os.environ.get("EDGEKIT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "edgekit"
