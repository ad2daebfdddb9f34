"""edgekit: take a trained vision model to edge devices and keep it within its frame budget there.

``import edgekit`` is cheap: it imports no runtime (and not numpy).  Runtimes are imported
when a backend is probed or loads a model.
"""

from __future__ import annotations

from edgekit._version import __version__
from edgekit.errors import EdgekitError

__all__ = ["EdgekitError", "__version__"]
