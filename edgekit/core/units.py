"""Quantities typed on a command line: durations like ``90s``, ``5m``, ``1h``, ``30d``."""

from __future__ import annotations

from edgekit.errors import EdgekitError


def parse_seconds(text: str, what: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h``, ``30d`` -> seconds; ``EdgekitError`` naming the option ``what`` otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1.0
    if not value > 0:  # also refuses NaN
        raise EdgekitError(f"{what} {text!r} is not a duration", "write e.g. 90s, 5m, 1h or 30d")
    return value
