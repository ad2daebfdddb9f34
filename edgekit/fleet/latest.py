"""A device's row in the large-fleet device list (``device_latest``): its birth's facts as columns, and its
newest window's figures (``edgekit.fleet.board`` reads them; the store writes them)."""

from __future__ import annotations

import math
from typing import Any

from edgekit.core.sketch import LatencySketch


def _text(value: Any) -> str | None:
    return None if value is None or isinstance(value, (dict, list)) else str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def facts(birth: dict[str, Any]) -> tuple[str | None, ...]:
    """``(site, profile, backend, model, version)`` of a birth; a model is ``{"name", "version"}``.

    ``site`` is the birth's own ``site``, else its ``labels.site`` (devices name their site either way).
    """
    model = birth.get("model")
    model = model if isinstance(model, dict) else {}
    labels = birth.get("labels")
    site = birth.get("site")
    if site is None and isinstance(labels, dict):
        site = labels.get("site")
    return (
        _text(site),
        _text(birth.get("profile")),
        _text(birth.get("backend")),
        _text(model.get("name")),
        _text(model.get("version")),
    )


def budget_ms(birth: dict[str, Any]) -> float | None:
    """The birth's latency budget in ms, or ``None`` (not given, not a number)."""
    return _number(birth.get("budget_ms"))


def figures(window: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """A window's latency p50, p95 and p99 (ms), ``None`` each without frames."""
    sketch = LatencySketch.from_dict(window["latency_ms"])
    if not sketch.count:
        return None, None, None
    return tuple(round(sketch.quantile(q), 3) for q in (0.5, 0.95, 0.99))  # type: ignore[return-value]
