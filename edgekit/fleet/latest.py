"""A device's row in the large-fleet device list (``device_latest``): its birth's facts as columns, and its
newest window's figures (``edgekit.fleet.board`` reads them; the store writes them)."""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Any

QUANTILES = (0.5, 0.95, 0.99)


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
    """A window's latency p50, p95 and p99 (ms), ``None`` each without frames.

    The store does this once per device per batch of windows, on the collector's path, so it works
    on the (already checked) sketch dict with C-level list operations: cumulative counts, then a
    binary search per quantile, picking what ``LatencySketch.quantile`` picks (~3 us a window
    instead of ~16 us for a per-bucket loop, and ~25 us for building the sketch and asking it).
    """
    data = window["latency_ms"]
    count = int(data["count"])
    if not count:
        return None, None, None
    gamma_log = math.log((1 + float(data["accuracy"])) / (1 - float(data["accuracy"])))
    low, high = float(data["min"]), float(data["max"])
    buckets = data["buckets"]
    keys = list(map(int, buckets))
    counts = list(buckets.values())
    if keys != sorted(keys):  # a device's ``to_dict`` lists them in key order; another may not
        order = sorted(range(len(keys)), key=keys.__getitem__)
        keys, counts = [keys[i] for i in order], [counts[i] for i in order]
    cumulative = list(itertools.accumulate(counts, initial=int(data["zero"])))
    out: list[float] = []
    for q in QUANTILES:
        at = bisect.bisect_right(cumulative, q * (count - 1))  # the first position past the rank
        if at == 0:
            out.append(0.0)  # the rank falls among the zeros
        elif at > len(keys):
            out.append(high)
        else:
            value = 2 * math.exp(keys[at - 1] * gamma_log) / (1 + math.exp(gamma_log))
            out.append(min(max(value, low), high))
    return round(out[0], 3), round(out[1], 3), round(out[2], 3)
