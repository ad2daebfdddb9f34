"""``LatencySketch``: a DDSketch of latencies, mergeable, with a guaranteed relative error.

A device runs for weeks at 30 fps; keeping every latency is not an option, and averaging
percentiles across devices is wrong.  A DDSketch (Masson, Rim & Lee, VLDB 2019) keeps a
count per logarithmic bucket: any quantile it reports is within ``relative_accuracy`` of
the true value, and two sketches with the same accuracy merge exactly by adding counts —
so a fleet's p99 is the p99 of the merged sketches.  Count, sum, min and max are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_ACCURACY = 0.01
# Values at or below this (ms) share one bucket: a nanosecond is not a latency worth resolving.
MIN_VALUE = 1e-6
MAX_BUCKETS = 4096


class LatencySketch:
    """Quantiles of non-negative values (milliseconds) within ``relative_accuracy``; mergeable."""

    __slots__ = ("_gamma_log", "_max", "_min", "accuracy", "buckets", "count", "sum", "zero")

    def __init__(self, relative_accuracy: float = DEFAULT_ACCURACY) -> None:
        if not 0 < relative_accuracy < 1:
            raise ValueError("relative_accuracy must be in (0, 1)")
        self.accuracy = relative_accuracy
        self._gamma_log = math.log((1 + relative_accuracy) / (1 - relative_accuracy))
        self.buckets: dict[int, int] = {}
        self.zero = 0
        self.count = 0
        self.sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    def add(self, value: float, n: int = 1) -> None:
        """Record ``value`` ``n`` times (negative values are clamped to 0)."""
        v = max(0.0, float(value))
        self.count += n
        self.sum += v * n
        self._min = min(self._min, v)
        self._max = max(self._max, v)
        if v <= MIN_VALUE:
            self.zero += n
            return
        key = math.ceil(math.log(v) / self._gamma_log)
        self.buckets[key] = self.buckets.get(key, 0) + n
        if len(self.buckets) > MAX_BUCKETS:  # collapse the lowest buckets: the tail stays exact
            low = sorted(self.buckets)[: len(self.buckets) - MAX_BUCKETS + 1]
            self.buckets[low[-1]] += sum(self.buckets.pop(k) for k in low[:-1])

    def extend(self, values: Iterable[float]) -> None:
        for v in values:
            self.add(v)

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s counts to this sketch (same accuracy only: then the merge is exact)."""
        if not math.isclose(other.accuracy, self.accuracy):
            raise ValueError(f"cannot merge sketches of accuracy {other.accuracy} and {self.accuracy}")
        for k, c in other.buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + c
        self.zero += other.zero
        self.count += other.count
        self.sum += other.sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def merge_dict(self, data: Mapping[str, Any]) -> None:
        """``merge(from_dict(data))`` without building a sketch, for data already checked (the collector's).

        Folding a window into a dashboard's buckets is one of these per stage; building and
        validating a ``LatencySketch`` each time cost five times as much.
        """
        if data["accuracy"] != self.accuracy and not math.isclose(float(data["accuracy"]), self.accuracy):
            raise ValueError(f"cannot merge sketches of accuracy {data['accuracy']} and {self.accuracy}")
        count = int(data["count"])
        if not count:
            return
        buckets = self.buckets
        for k, c in data["buckets"].items():
            key = int(k)
            buckets[key] = buckets.get(key, 0) + c
        self.zero += int(data["zero"])
        self.count += count
        self.sum += float(data["sum"])
        self._min = min(self._min, float(data["min"]))
        self._max = max(self._max, float(data["max"]))

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1), within the relative accuracy; NaN when empty."""
        if self.count == 0:
            return math.nan
        if q <= 0:
            return self._min
        if q >= 1:
            return self._max
        rank = q * (self.count - 1)
        seen = self.zero
        if seen > rank:
            return 0.0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen > rank:
                # The bucket's midpoint in relative terms: within ``accuracy`` of any value in it.
                value = 2 * math.exp(key * self._gamma_log) / (1 + math.exp(self._gamma_log))
                return min(max(value, self._min), self._max)
        return self._max

    @property
    def min(self) -> float:
        return self._min if self.count else math.nan

    @property
    def max(self) -> float:
        return self._max if self.count else math.nan

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; ``from_dict`` reads it back (the wire format of telemetry)."""
        return {
            "accuracy": self.accuracy,
            "count": self.count,
            "sum": self.sum,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
            "zero": self.zero,
            "buckets": {str(k): c for k, c in sorted(self.buckets.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencySketch:
        """Read ``to_dict`` output; raises ``ValueError`` on anything malformed (input from the network)."""
        try:
            sketch = cls(float(data["accuracy"]))
            buckets = {int(k): int(c) for k, c in dict(data["buckets"]).items()}
            zero, count = int(data["zero"]), int(data["count"])
            if any(c < 0 for c in buckets.values()) or zero < 0 or count != zero + sum(buckets.values()):
                raise ValueError("counts do not add up")
            sketch.buckets, sketch.zero, sketch.count = buckets, zero, count
            sketch.sum = float(data["sum"])
            if count:
                sketch._min, sketch._max = float(data["min"]), float(data["max"])
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a latency sketch: {err}") from err
        return sketch

    def __repr__(self) -> str:
        return f"<LatencySketch n={self.count} p50={self.quantile(0.5):.3g} p99={self.quantile(0.99):.3g}>"
