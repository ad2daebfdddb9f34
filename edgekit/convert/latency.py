"""Build-host latency of an artifact: p50 and p99 of single-image runs after a warm-up.

These numbers go into the manifest as what the build host saw; they say nothing about
the device.  ``edgekit bench`` is the full, MLPerf-shaped measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgekit.backends.base import Session
from edgekit.core.stats import percentile
from edgekit.processing.tensors import to_input

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class MeasuredLatency:
    p50_ms: float
    p99_ms: float
    runs: int


def measure(
    session: Session, sample_nchw: np.ndarray, runs: int = 50, warmup: int = 5, max_seconds: float = 5.0
) -> MeasuredLatency:
    """Time ``runs`` single-image inferences (fewer if ``max_seconds`` runs out, at least 5)."""
    x = to_input(sample_nchw[:1], session.inputs[0])
    for _ in range(warmup):
        session.run(x)
    times: list[float] = []
    deadline = time.perf_counter() + max_seconds
    while len(times) < runs and (len(times) < 5 or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        session.run(x)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return MeasuredLatency(percentile(times, 50), percentile(times, 99), len(times))
