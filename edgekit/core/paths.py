"""Where edgekit keeps things on a machine: the one cache root and the one state root.

The cache holds what can be made again (builds, tuning databases, engines, demo clips):
deleting it costs time, never data.  The state root holds what cannot: telemetry that was
measured but not yet delivered.  The deploy agent keeps its own state (slots, deploy
records, its pipeline's spool) under its ``--root``, ``/var/lib/edgekit`` by default.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$EDGEKIT_CACHE`` or ``~/.cache/edgekit`` (builds, tuning databases, engines, demo clips)."""
    root = os.environ.get("EDGEKIT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "edgekit"


def config_root() -> Path:
    """``$XDG_CONFIG_HOME/edgekit``, else ``~/.config/edgekit``: what is this user's and not to be shared (keys)."""
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".config") / "edgekit"


def state_root() -> Path:
    """``$EDGEKIT_STATE``, else ``$XDG_STATE_HOME/edgekit``, else ``~/.local/state/edgekit`` (telemetry spools)."""
    root = os.environ.get("EDGEKIT_STATE")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "edgekit"
